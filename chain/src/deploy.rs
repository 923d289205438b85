//! Deploying the contracts from the committed artifacts.

use crate::bindings::{Registry, TestUSDC, X402Receiver};
use crate::error::{ChainError, from_transport, is_insufficient_funds};
use crate::key::AnchorKey;
use crate::rpc::{self, RetryPolicy, timed};
use alloy::network::{ReceiptResponse, TransactionBuilder};
use alloy::primitives::{Address, B256, Bytes};
use alloy::providers::{DynProvider, Provider};
use alloy::rpc::types::TransactionRequest;
use alloy::sol_types::SolConstructor;
use serde::{Deserialize, Serialize};
use std::time::{Duration, Instant};

/// A deployed contract.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Deployment {
    pub chain_id: u64,
    pub address: Address,
    pub tx: B256,
    pub block: u64,
    pub deployer: Address,
    pub gas_used: u64,
}

/// Deploys `Registry`. `expected_chain_id`, when given, must match the endpoint's.
pub async fn deploy_registry(
    rpc_url: &str,
    key: &AnchorKey,
    expected_chain_id: Option<u64>,
) -> Result<Deployment, ChainError> {
    deploy(rpc_url, key, expected_chain_id, Registry::BYTECODE.to_vec()).await
}

/// Deploys `TestUSDC` (EIP-3009 token for local chains) with its EIP-712 domain.
pub async fn deploy_test_usdc(
    rpc_url: &str,
    key: &AnchorKey,
    name: &str,
    version: &str,
) -> Result<Deployment, ChainError> {
    let args = TestUSDC::constructorCall { name_: name.into(), version_: version.into() }.abi_encode();
    deploy(rpc_url, key, None, [TestUSDC::BYTECODE.as_ref(), &args].concat()).await
}

/// Deploys `X402Receiver` for `token`, paying out to `beneficiary`, settled by `settler`.
pub async fn deploy_x402_receiver(
    rpc_url: &str,
    key: &AnchorKey,
    token: Address,
    beneficiary: Address,
    settler: Address,
) -> Result<Deployment, ChainError> {
    let args =
        X402Receiver::constructorCall { token_: token, beneficiary_: beneficiary, settler_: settler }.abi_encode();
    deploy(rpc_url, key, None, [X402Receiver::BYTECODE.as_ref(), &args].concat()).await
}

async fn deploy(
    rpc_url: &str,
    key: &AnchorKey,
    expected_chain_id: Option<u64>,
    code: Vec<u8>,
) -> Result<Deployment, ChainError> {
    let policy = RetryPolicy::default();
    let provider = rpc::provider(rpc_url, Some(key))?;
    let chain_id = rpc::chain_id(&provider, &policy).await?;
    if let Some(expected) = expected_chain_id
        && expected != chain_id
    {
        return Err(ChainError::WrongChainId { expected, actual: chain_id });
    }
    let deployer = key.address();
    let req = TransactionRequest::default().with_from(deployer).with_deploy_code(Bytes::from(code));
    let tx = match timed(&policy, provider.send_transaction(req)).await {
        Ok(p) => *p.tx_hash(),
        Err(ChainError::Rpc(m)) if is_insufficient_funds(&m) => {
            return Err(ChainError::InsufficientFunds { address: deployer, message: m });
        }
        Err(e) => return Err(e),
    };
    let receipt = wait_receipt(&provider, tx, &policy).await?;
    if !receipt.status() {
        return Err(ChainError::Reverted { tx: Some(tx), reason: "contract creation failed".into() });
    }
    let address = receipt
        .contract_address()
        .ok_or_else(|| ChainError::Other(format!("receipt of {tx} names no contract address")))?;
    Ok(Deployment {
        chain_id,
        address,
        tx,
        block: receipt.block_number().unwrap_or_default(),
        deployer,
        gas_used: receipt.gas_used(),
    })
}

/// Polls for a receipt (up to five minutes; anvil mines at once).
pub async fn wait_receipt(
    provider: &DynProvider,
    tx: B256,
    policy: &RetryPolicy,
) -> Result<alloy::rpc::types::TransactionReceipt, ChainError> {
    let deadline = Instant::now() + Duration::from_secs(300);
    let mut pause = Duration::from_millis(20);
    loop {
        let r = rpc::with_retry(
            policy,
            |_, _| {},
            || async { provider.get_transaction_receipt(tx).await.map_err(from_transport) },
        )
        .await?;
        if let Some(r) = r {
            return Ok(r);
        }
        if Instant::now() > deadline {
            return Err(ChainError::NotMined { tx, seconds: 300 });
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_secs(2));
    }
}
