//! The in-process facilitator: verifies against the chain and settles with a funded key
//! over alloy.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use alloy::network::{EthereumWallet, NetworkTransactionBuilder, TransactionBuilder};
use alloy::primitives::{Address, B256, Bytes, U256, keccak256};
use alloy::providers::{DynProvider, Provider, ProviderBuilder};
use thiserror::Error;

use crate::events::Recorded;
use crate::evidence::{Evidence, Expected, check_receipt};
use crate::exact::{CheckedPayment, check_offline, now_secs};
use crate::facilitator::{BoxFuture, Facilitator, Settled, settle_failed, verify_ok, verify_rejected};
use crate::key::SettlerKey;
use crate::ledger::Landed;
use crate::network::Network;
use crate::reason::RejectReason;
use crate::wire::{
    PaymentPayload, PaymentRequirements, SettlementResponse, SupportedKind, SupportedResponse, VerifyResponse,
};

/// The contract calls the facilitator makes (generated methods take one argument per ABI
/// parameter, hence the lint allowance).
#[allow(clippy::too_many_arguments)]
mod abi {
    alloy::sol! {
        #[sol(rpc)]
        interface IEip3009 {
            function authorizationState(address authorizer, bytes32 nonce) external view returns (bool);
            function balanceOf(address account) external view returns (uint256);
            function transferWithAuthorization(address from, address to, uint256 value, uint256 validAfter, uint256 validBefore, bytes32 nonce, bytes signature) external;
        }

        #[sol(rpc)]
        interface IX402Receiver {
            function settleTransferAndRecord(bytes32 id, address from, uint256 value, uint256 validAfter, uint256 validBefore, bytes32 nonce, bytes signature) external;
        }

        #[sol(rpc)]
        interface IErc1271 {
            function isValidSignature(bytes32 hash, bytes signature) external view returns (bytes4);
        }
    }
}
use abi::{IEip3009, IErc1271, IX402Receiver};

const ERC1271_MAGIC: [u8; 4] = [0x16, 0x26, 0xba, 0x7e];

/// Where settlement transactions go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SettleVia {
    /// `token.transferWithAuthorization(…)`.
    Token,
    /// `X402Receiver.settleTransferAndRecord(id, …)` at this address (which must be the
    /// `payTo`): the payment is recorded on chain in the same transaction.
    Receiver(Address),
}

#[derive(Debug, Clone)]
pub struct LocalFacilitatorConfig {
    pub rpc_url: String,
    pub network: Network,
    pub settle_via: SettleVia,
    /// Simulate the transfer with `eth_call` during verify (what the reference does); off,
    /// the nonce, balance and signature are read one by one. Either way every verify asks
    /// the chain: no earlier answer stands in for it.
    pub simulate: bool,
    /// How long to wait for a settlement's receipt.
    pub receipt_timeout: Duration,
}

impl LocalFacilitatorConfig {
    pub fn new(rpc_url: impl Into<String>, network: Network) -> Self {
        Self {
            rpc_url: rpc_url.into(),
            network,
            settle_via: SettleVia::Token,
            simulate: true,
            receipt_timeout: Duration::from_secs(60),
        }
    }
}

#[derive(Debug, Error)]
pub enum FacilitatorError {
    #[error("bad RPC URL {0}")]
    Url(String),
    #[error("RPC endpoint unreachable: {0}")]
    Rpc(String),
    #[error("RPC endpoint serves chain {actual}, configured for {expected}")]
    WrongChain { expected: u64, actual: u64 },
}

type AuthKey = (Address, Address, B256);

pub struct LocalFacilitator {
    provider: DynProvider,
    wallet: EthereumWallet,
    settler: Address,
    config: LocalFacilitatorConfig,
    /// Authorizations being settled right now: a second settle of one is refused. A settled
    /// one needs no memory here: the token refuses it.
    settling: Mutex<HashSet<AuthKey>>,
    /// One sender at a time: account nonces stay in order without a nonce cache.
    send_lock: tokio::sync::Mutex<()>,
    evidence: Evidence,
}

impl LocalFacilitator {
    /// Connects and checks the endpoint's chain id against the configured network.
    pub async fn connect(config: LocalFacilitatorConfig, key: SettlerKey) -> Result<Self, FacilitatorError> {
        let url = config.rpc_url.parse().map_err(|_| FacilitatorError::Url(config.rpc_url.clone()))?;
        // The default nonce cache takes a nonce before gas estimation, so a settlement that
        // reverts in estimation would leave a gap and strand every later one in the pool;
        // sends are serialized anyway, so the pending count is read for each.
        let wallet = EthereumWallet::from(key.signer().clone());
        let provider = ProviderBuilder::default()
            .with_gas_estimation()
            .with_simple_nonce_management()
            .fetch_chain_id()
            .wallet(wallet.clone())
            .connect_http(url)
            .erased();
        let actual = provider.get_chain_id().await.map_err(|e| FacilitatorError::Rpc(e.to_string()))?;
        if actual != config.network.chain_id {
            return Err(FacilitatorError::WrongChain { expected: config.network.chain_id, actual });
        }
        Ok(Self {
            evidence: Evidence::new(provider.clone()),
            provider,
            wallet,
            settler: key.address(),
            config,
            settling: Mutex::new(HashSet::new()),
            send_lock: tokio::sync::Mutex::new(()),
        })
    }

    pub fn settler(&self) -> Address {
        self.settler
    }

    /// The chain reader settlements are checked with (the same provider).
    pub fn evidence(&self) -> Evidence {
        self.evidence.clone()
    }

    fn check(&self, payload: &PaymentPayload, req: &PaymentRequirements) -> Result<CheckedPayment, RejectReason> {
        if req.network != self.config.network.caip2() || payload.accepted.network != req.network {
            return Err(RejectReason::NetworkMismatch);
        }
        check_offline(&payload.payload, req, now_secs())
    }

    /// The chain checks. With simulation on, the happy path is one `eth_call`: a successful
    /// simulation of the settlement call runs the token's own checks against current state
    /// (authorization unused, signature valid for `from`, balance ≥ value, time window), so
    /// the explicit `authorizationState` / `balanceOf` reads could only agree with it. They
    /// run when the simulation fails, to name the reason precisely (and in the same order as
    /// without simulation), or when simulation is off.
    async fn verify_on_chain(&self, p: &CheckedPayment) -> Result<(), (RejectReason, Option<String>)> {
        if !self.config.simulate {
            return self.explicit_checks(p).await;
        }
        match self.settle_call_data(p).from(self.settler).call().await {
            Ok(_) if p.ecdsa_ok => Ok(()),
            // A signature that is not `from`'s ECDSA one passed the token: ERC-1271 is still
            // checked here rather than left to whatever the token accepts.
            Ok(_) if self.erc1271_accepts(p).await? => Ok(()),
            Ok(_) => Err((RejectReason::InvalidSignature, None)),
            Err(e) => {
                self.explicit_checks(p).await?;
                Err(revert_reason(&e))
            }
        }
    }

    /// Nonce unused, balance ≥ value, signature valid: each read explicitly (the two token
    /// reads concurrently), failing with the first reason in that order.
    async fn explicit_checks(&self, p: &CheckedPayment) -> Result<(), (RejectReason, Option<String>)> {
        let token = IEip3009::new(p.asset.address, &self.provider);
        let m = &p.auth.message;
        let used = token.authorizationState(m.from, m.nonce);
        let balance = token.balanceOf(m.from);
        let (used, balance) = tokio::join!(used.call(), balance.call());
        let rpc = |e: alloy::contract::Error| (RejectReason::FacilitatorUnavailable, Some(e.to_string()));
        if used.map_err(rpc)? {
            return Err((RejectReason::NonceAlreadyUsed, None));
        }
        if balance.map_err(rpc)? < m.value {
            return Err((RejectReason::InsufficientBalance, None));
        }
        if !p.ecdsa_ok && !self.erc1271_accepts(p).await? {
            return Err((RejectReason::InvalidSignature, None));
        }
        Ok(())
    }

    /// A contract wallet `from` accepting the signature through ERC-1271.
    async fn erc1271_accepts(&self, p: &CheckedPayment) -> Result<bool, (RejectReason, Option<String>)> {
        let from = p.from();
        let code = self
            .provider
            .get_code_at(from)
            .await
            .map_err(|e| (RejectReason::FacilitatorUnavailable, Some(e.to_string())))?;
        if code.is_empty() {
            return Ok(false);
        }
        let wallet = IErc1271::new(from, &self.provider);
        Ok(
            matches!(wallet.isValidSignature(p.digest, p.auth.signature.clone()).call().await, Ok(v) if v.0 == ERC1271_MAGIC),
        )
    }

    /// The settlement call (token or receiver), unsent: simulated in verify, sent in settle.
    fn settle_call_data(&self, p: &CheckedPayment) -> alloy::contract::RawCallBuilder<&DynProvider> {
        use alloy::sol_types::SolCall;
        let m = &p.auth.message;
        let signature: Bytes = p.auth.signature.clone();
        let (target, input) = match self.config.settle_via {
            SettleVia::Token => {
                let call = IEip3009::transferWithAuthorizationCall {
                    from: m.from,
                    to: m.to,
                    value: m.value,
                    validAfter: m.validAfter,
                    validBefore: m.validBefore,
                    nonce: m.nonce,
                    signature,
                };
                (p.asset.address, call.abi_encode())
            }
            SettleVia::Receiver(receiver) => {
                let call = IX402Receiver::settleTransferAndRecordCall {
                    id: payment_record_id(p.asset.address, m.from, m.nonce),
                    from: m.from,
                    value: m.value,
                    validAfter: m.validAfter,
                    validBefore: m.validBefore,
                    nonce: m.nonce,
                    signature,
                };
                (receiver, call.abi_encode())
            }
        };
        alloy::contract::RawCallBuilder::new_raw(&self.provider, input.into()).to(target)
    }

    /// Prepares the settlement (gas, nonce and fees read concurrently, then signed) while
    /// `ready` (the caller's durable intent) completes, broadcasts it only then, and waits for
    /// its receipt, which must show the transfer.
    async fn send_and_wait(&self, p: &CheckedPayment, ready: Recorded) -> Result<Landed, (RejectReason, Option<String>)> {
        let pending = {
            // One sender at a time: the pending count is the next nonce.
            let _one_sender = self.send_lock.lock().await;
            let mut tx = self.settle_call_data(p).from(self.settler).into_transaction_request();
            let rpc = |e: alloy::transports::TransportError| (RejectReason::SettlementFailed, Some(e.to_string()));
            let (gas, nonce, fees, ready) = tokio::join!(
                self.provider.estimate_gas(tx.clone()),
                self.provider.get_transaction_count(self.settler).pending(),
                self.provider.estimate_eip1559_fees(),
                ready,
            );
            ready.map_err(|e| {
                (RejectReason::FacilitatorUnavailable, Some(format!("the settlement intent was not recorded: {e}")))
            })?;
            let gas = gas.map_err(|e| revert_reason(&alloy::contract::Error::TransportError(e)))?;
            let fees = fees.map_err(rpc)?;
            tx.set_gas_limit(gas);
            tx.set_nonce(nonce.map_err(rpc)?);
            tx.set_chain_id(self.config.network.chain_id);
            tx.set_max_fee_per_gas(fees.max_fee_per_gas);
            tx.set_max_priority_fee_per_gas(fees.max_priority_fee_per_gas);
            let signed = tx.build(&self.wallet).await.map_err(|e| (RejectReason::SettlementFailed, Some(e.to_string())))?;
            self.provider.send_tx_envelope(signed).await.map_err(rpc)?
        };
        let tx = *pending.tx_hash();
        let m = &p.auth.message;
        let expected = Expected { asset: p.asset.address, from: m.from, to: m.to, value: m.value, nonce: m.nonce };
        let deadline = Instant::now() + self.config.receipt_timeout;
        // A local chain mines at once, a public one in seconds: poll soon, then less often.
        let mut wait = Duration::from_millis(1);
        loop {
            match self.provider.get_transaction_receipt(tx).await {
                Ok(Some(r)) if r.status() => {
                    return check_receipt(&r, &expected).map_err(|m| (RejectReason::SettlementFailed, Some(m)));
                }
                Ok(Some(_)) => {
                    return Err((RejectReason::SettlementFailed, Some(format!("transaction {tx} reverted"))));
                }
                Ok(None) | Err(_) if Instant::now() < deadline => {
                    tokio::time::sleep(wait).await;
                    wait = (wait * 2).min(Duration::from_millis(100));
                }
                Ok(None) => return Err((RejectReason::SettlementPending, Some(format!("no receipt for {tx} yet")))),
                Err(e) => return Err((RejectReason::SettlementPending, Some(e.to_string()))),
            }
        }
    }
}

/// The X402Receiver record id of an authorization: unique per (token, payer, nonce).
pub fn payment_record_id(asset: Address, from: Address, nonce: B256) -> B256 {
    keccak256([asset.as_slice(), from.as_slice(), nonce.as_slice()].concat())
}

/// The reason a token call reverted, from FiatToken's revert strings.
fn revert_reason(e: &alloy::contract::Error) -> (RejectReason, Option<String>) {
    let text = e
        .as_revert_data()
        .and_then(|d| <alloy::sol_types::Revert as alloy::sol_types::SolError>::abi_decode(&d).ok())
        .map(|r| r.reason)
        .unwrap_or_else(|| e.to_string());
    let reason = if text.contains("authorization is used or canceled") {
        RejectReason::NonceAlreadyUsed
    } else if text.contains("exceeds balance") {
        RejectReason::InsufficientBalance
    } else if text.contains("invalid signature") || text.contains("ECRecover") {
        RejectReason::InvalidSignature
    } else if text.contains("not yet valid") {
        RejectReason::ValidAfterInFuture
    } else if text.contains("authorization is expired") {
        RejectReason::ValidBeforeExpired
    } else if e.as_revert_data().is_none() && !text.contains("revert") {
        RejectReason::FacilitatorUnavailable
    } else {
        RejectReason::SimulationFailed
    };
    (reason, Some(text))
}

impl Facilitator for LocalFacilitator {
    fn verify<'a>(
        &'a self,
        payload: &'a PaymentPayload,
        req: &'a PaymentRequirements,
    ) -> BoxFuture<'a, VerifyResponse> {
        Box::pin(async move {
            let payer = Some(payload.payload.authorization.from.clone());
            let checked = match self.check(payload, req) {
                Ok(c) => c,
                Err(r) => return verify_rejected(&r, payer, None),
            };
            match self.verify_on_chain(&checked).await {
                Ok(()) => verify_ok(&checked.from().to_checksum(None)),
                Err((r, msg)) => verify_rejected(&r, payer, msg),
            }
        })
    }

    fn settle<'a>(
        &'a self,
        payload: &'a PaymentPayload,
        req: &'a PaymentRequirements,
    ) -> BoxFuture<'a, SettlementResponse> {
        Box::pin(async move { self.settle_checked(payload, req, crate::events::recorded()).await.response })
    }

    fn settle_checked<'a>(
        &'a self,
        payload: &'a PaymentPayload,
        req: &'a PaymentRequirements,
        ready: Recorded,
    ) -> BoxFuture<'a, Settled> {
        Box::pin(async move {
            let payer = Some(payload.payload.authorization.from.clone());
            let failed = |r: &RejectReason, msg| Settled { response: settle_failed(r, req, payer.clone(), msg), landed: None };
            let checked = match self.check(payload, req) {
                Ok(c) => c,
                Err(r) => return failed(&r, None),
            };
            let key = (checked.asset.address, checked.from(), checked.nonce());
            if !lock(&self.settling).insert(key) {
                return failed(&RejectReason::NonceInFlight, None);
            }
            let outcome = self.send_and_wait(&checked, ready).await;
            lock(&self.settling).remove(&key);
            match outcome {
                Ok(landed) => Settled {
                    response: SettlementResponse {
                        success: true,
                        error_reason: None,
                        error_message: None,
                        payer: Some(checked.from().to_checksum(None)),
                        transaction: landed.tx.to_string(),
                        network: req.network.clone(),
                        amount: Some(checked.value().to_string()),
                    },
                    landed: Some(landed),
                },
                Err((r, msg)) => failed(&r, msg),
            }
        })
    }

    fn evidence(&self) -> Option<Evidence> {
        Some(LocalFacilitator::evidence(self))
    }

    fn supported(&self) -> BoxFuture<'_, SupportedResponse> {
        Box::pin(async move {
            let n = self.config.network;
            let kind = |v: u32, network: String| SupportedKind {
                x402_version: v,
                scheme: "exact".into(),
                network,
                extra: None,
            };
            let mut signers = serde_json::Map::new();
            signers.insert("eip155:*".into(), serde_json::json!([self.settler.to_checksum(None)]));
            SupportedResponse { kinds: vec![kind(2, n.caip2()), kind(1, n.v1_name())], extensions: vec![], signers }
        })
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A value of `U256` as u64 when it fits (amounts in events).
pub fn u256_to_u64(v: U256) -> Option<u64> {
    u64::try_from(v).ok()
}

/// For callers that hold the facilitator behind the trait.
pub type SharedFacilitator = Arc<dyn Facilitator>;
