//! What the chain says about an EIP-3009 authorization: whether it was used, which
//! transaction used it, and whether a receipt really shows the transfer it authorized.
//!
//! An authorization can be used once, so `(token, authorizer, nonce)` names at most one
//! transfer on chain, whoever sent the transaction (our settler, a replacement, a third party
//! holding the header). That is what the settlement check and reconciliation rely on: a
//! `payment.settled` is written only for a receipt whose logs include the token's
//! `AuthorizationUsed(from, nonce)` and `Transfer(from, to, value)`.

use alloy::primitives::{Address, B256, U256};
use alloy::providers::{DynProvider, Provider, ProviderBuilder};
use alloy::rpc::types::{Filter, TransactionReceipt};
use alloy::sol_types::SolEvent;

use crate::ledger::{AuthKey, Intent, Landed};

#[allow(clippy::too_many_arguments)]
mod abi {
    alloy::sol! {
        #[sol(rpc)]
        interface IEip3009Events {
            event Transfer(address indexed from, address indexed to, uint256 value);
            event AuthorizationUsed(address indexed authorizer, bytes32 indexed nonce);
            function authorizationState(address authorizer, bytes32 nonce) external view returns (bool);
        }
    }
}
use abi::IEip3009Events::{self, AuthorizationUsed, Transfer};

/// How far back (in blocks) a use of an authorization is looked for, in windows of
/// [`LOG_WINDOW`] (public endpoints cap a `getLogs` range).
pub const LOOKBACK_BLOCKS: u64 = 200_000;
pub const LOG_WINDOW: u64 = 10_000;

/// The transfer an authorization must produce.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Expected {
    pub asset: Address,
    pub from: Address,
    pub to: Address,
    pub value: U256,
    pub nonce: B256,
}

impl Expected {
    pub fn of(key: &AuthKey, intent: &Intent) -> Self {
        Expected { asset: key.0, from: key.1, to: intent.pay_to, value: U256::from(intent.value), nonce: key.2 }
    }
}

/// Reads the chain through one provider.
#[derive(Clone)]
pub struct Evidence {
    provider: DynProvider,
}

impl Evidence {
    pub fn new(provider: DynProvider) -> Self {
        Self { provider }
    }

    /// A reader on `rpc_url` (no wallet: it only reads).
    pub fn connect(rpc_url: &str) -> Result<Self, String> {
        let url = rpc_url.parse().map_err(|_| format!("bad RPC URL {rpc_url}"))?;
        Ok(Self::new(ProviderBuilder::default().connect_http(url).erased()))
    }

    /// The token's `authorizationState(from, nonce)`: used or cancelled.
    pub async fn used(&self, e: &Expected) -> Result<bool, String> {
        let token = IEip3009Events::new(e.asset, &self.provider);
        token.authorizationState(e.from, e.nonce).call().await.map_err(|x| x.to_string())
    }

    /// The transfer that used the authorization, when there is one within
    /// [`LOOKBACK_BLOCKS`] of the head; its receipt is checked with [`check_receipt`].
    pub async fn find(&self, e: &Expected) -> Result<Option<Landed>, String> {
        if !self.used(e).await? {
            return Ok(None);
        }
        let head = self.provider.get_block_number().await.map_err(|x| x.to_string())?;
        let floor = head.saturating_sub(LOOKBACK_BLOCKS);
        let mut to = head;
        loop {
            let from = to.saturating_sub(LOG_WINDOW - 1).max(floor);
            let filter = Filter::new()
                .address(e.asset)
                .event_signature(AuthorizationUsed::SIGNATURE_HASH)
                .topic1(e.from.into_word())
                .topic2(e.nonce)
                .from_block(from)
                .to_block(to);
            let logs = self.provider.get_logs(&filter).await.map_err(|x| x.to_string())?;
            if let Some(tx) = logs.iter().find_map(|l| l.transaction_hash) {
                let receipt = self.provider.get_transaction_receipt(tx).await.map_err(|x| x.to_string())?;
                let receipt = receipt.ok_or_else(|| format!("no receipt for {tx}"))?;
                return check_receipt(&receipt, e).map(Some);
            }
            if from == floor {
                return Err(format!(
                    "the authorization is used, but no AuthorizationUsed log within {LOOKBACK_BLOCKS} blocks"
                ));
            }
            to = from - 1;
        }
    }

    pub fn provider(&self) -> &DynProvider {
        &self.provider
    }
}

/// The receipt's transaction succeeded and its logs show the token using the authorization
/// and moving exactly the authorized value from the payer to the payee.
pub fn check_receipt(receipt: &TransactionReceipt, e: &Expected) -> Result<Landed, String> {
    let tx = receipt.transaction_hash;
    if !receipt.status() {
        return Err(format!("transaction {tx} reverted"));
    }
    let block = receipt.block_number.ok_or_else(|| format!("transaction {tx} has no block"))?;
    let from_token = receipt.logs().iter().filter(|l| l.address() == e.asset);
    let (mut used, mut moved) = (false, false);
    for log in from_token {
        if let Ok(u) = AuthorizationUsed::decode_log_data(log.data()) {
            used |= u.authorizer == e.from && u.nonce == e.nonce;
        } else if let Ok(t) = Transfer::decode_log_data(log.data()) {
            moved |= t.from == e.from && t.to == e.to && t.value == e.value;
        }
    }
    match (used, moved) {
        (true, true) => Ok(Landed { tx, block }),
        (false, _) => Err(format!("transaction {tx} has no AuthorizationUsed log for this authorization")),
        (true, false) => Err(format!("transaction {tx} has no Transfer of {} to {}", e.value, e.to)),
    }
}
