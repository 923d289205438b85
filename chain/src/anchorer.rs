//! The anchorer: puts 32-byte roots into the `Registry` idempotently, and looks them up.
//!
//! `anchor(root)` is safe to call any number of times, from any number of tasks:
//! 1. it checks the endpoint's chain id and that the registry has code;
//! 2. it looks the root up: a root already anchored (by anyone) is success, with its record;
//! 3. otherwise, holding a nonce lock, it sends `anchor(root)` with the account's pending
//!    nonce, so concurrent anchors in this process get consecutive nonces;
//! 4. it waits for the receipt and for N confirmations. A revert caused by a concurrent
//!    anchor of the same root (`AlreadyAnchored`) is also success.
//!
//! Transport failures (endpoint down, timeouts) restart the sequence after a backoff: a
//! transaction still known to the node is waited for rather than sent again, and one the
//! node forgot (a restarted development chain) is sent anew. So "look up before send" makes
//! retries idempotent.

use crate::bindings::Registry;
use crate::error::{ChainError, is_insufficient_funds};
use crate::key::AnchorKey;
use crate::network::ANVIL;
use crate::rpc::{self, RetryPolicy, timed};
use alloy::network::{ReceiptResponse, TransactionBuilder};
use alloy::primitives::{Address, B256, Bytes};
use alloy::providers::{DynProvider, Provider};
use alloy::rpc::types::{Filter, TransactionRequest};
use alloy::sol_types::{SolCall, SolEvent, SolInterface};
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Where and how to anchor.
#[derive(Debug, Clone)]
pub struct AnchorerConfig {
    pub rpc_url: String,
    /// The chain id the endpoint must serve.
    pub chain_id: u64,
    pub registry: Address,
    /// `None`: read-only (lookups only).
    pub key: Option<AnchorKey>,
    /// Blocks that must include or follow the anchoring transaction (at least 1).
    pub confirmations: u64,
    pub retry: RetryPolicy,
    /// How often to ask for a receipt or the head block.
    pub poll_interval: Duration,
    /// How long one sent transaction may take to be mined.
    pub mined_timeout: Duration,
}

impl AnchorerConfig {
    pub fn new(rpc_url: impl Into<String>, chain_id: u64, registry: Address) -> Self {
        let dev = chain_id == ANVIL.chain_id;
        Self {
            rpc_url: rpc_url.into(),
            chain_id,
            registry,
            key: None,
            confirmations: 1,
            retry: RetryPolicy::default(),
            poll_interval: if dev { Duration::from_millis(50) } else { Duration::from_secs(1) },
            mined_timeout: Duration::from_secs(if dev { 30 } else { 300 }),
        }
    }

    pub fn with_key(mut self, key: AnchorKey) -> Self {
        self.key = Some(key);
        self
    }

    pub fn with_confirmations(mut self, n: u64) -> Self {
        self.confirmations = n;
        self
    }

    pub fn with_retry(mut self, retry: RetryPolicy) -> Self {
        self.retry = retry;
        self
    }
}

/// What the registry holds for a root.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AnchorRecord {
    pub root: B256,
    /// Block timestamp (seconds since the epoch) of the anchoring block.
    pub timestamp: u64,
    pub block: u64,
    /// Who sent the anchoring transaction.
    pub by: Address,
    /// The anchoring transaction, found from the `Anchored` event (`None` if the node
    /// no longer serves logs that old).
    pub tx: Option<B256>,
}

/// The outcome of [`Anchorer::anchor`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Anchored {
    pub record: AnchorRecord,
    /// True when the root was already anchored before this call sent anything.
    pub already_anchored: bool,
    /// Gas used by the transaction this call sent, if it sent one that was mined.
    pub gas_used: Option<u64>,
    /// Confirmations seen when the call returned.
    pub confirmations: u64,
}

/// Progress of one anchor, for callers that record every step (the node's log).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AnchorStep {
    /// A transaction was accepted by the endpoint.
    Submitted { root: B256, tx: B256, nonce: u64, from: Address },
    /// A transient failure; the anchor will be retried after a pause.
    Retrying { root: B256, attempt: u32, error: String },
}

/// Hears about each [`AnchorStep`]. Called from the anchoring task: keep it quick.
pub trait AnchorObserver: Send + Sync {
    fn step(&self, step: &AnchorStep);
}

impl<F: Fn(&AnchorStep) + Send + Sync> AnchorObserver for F {
    fn step(&self, step: &AnchorStep) {
        self(step)
    }
}

/// Talks to one registry on one chain. Cheap to clone; clones share the nonce lock.
#[derive(Clone)]
pub struct Anchorer {
    provider: DynProvider,
    cfg: Arc<AnchorerConfig>,
    nonce_lock: Arc<tokio::sync::Mutex<()>>,
}

impl std::fmt::Debug for Anchorer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Anchorer")
            .field("rpc_url", &self.cfg.rpc_url)
            .field("chain_id", &self.cfg.chain_id)
            .field("registry", &self.cfg.registry)
            .field("key", &self.cfg.key)
            .finish()
    }
}

enum Attempt {
    Done(Anchored),
    /// A transaction was sent; remember it in case the wait fails.
    Sent(B256),
    /// Our transaction was mined successfully: the next pass reads the record.
    Mined,
}

impl Anchorer {
    /// Builds the client; nothing is sent until the first call.
    pub fn new(cfg: AnchorerConfig) -> Result<Self, ChainError> {
        let provider = rpc::provider(&cfg.rpc_url, cfg.key.as_ref())?;
        Ok(Self { provider, cfg: Arc::new(cfg), nonce_lock: Arc::new(tokio::sync::Mutex::new(())) })
    }

    pub fn chain_id(&self) -> u64 {
        self.cfg.chain_id
    }

    pub fn registry(&self) -> Address {
        self.cfg.registry
    }

    pub fn rpc_url(&self) -> &str {
        &self.cfg.rpc_url
    }

    /// The paying account, unless read-only.
    pub fn account(&self) -> Option<Address> {
        self.cfg.key.as_ref().map(AnchorKey::address)
    }

    pub fn provider(&self) -> &DynProvider {
        &self.provider
    }

    /// The endpoint's latest block number (with retries).
    pub async fn head_block(&self) -> Result<u64, ChainError> {
        let policy = &self.cfg.retry;
        rpc::with_retry(policy, |_, _| {}, || timed(policy, self.provider.get_block_number())).await
    }

    /// The balance of `who` in wei (with retries).
    pub async fn balance(&self, who: Address) -> Result<alloy::primitives::U256, ChainError> {
        let policy = &self.cfg.retry;
        rpc::with_retry(policy, |_, _| {}, || timed(policy, self.provider.get_balance(who).into_future())).await
    }

    /// Checks the endpoint's chain id and the registry's code (with retries).
    pub async fn preflight(&self) -> Result<(), ChainError> {
        let policy = &self.cfg.retry;
        rpc::with_retry(policy, |_, _| {}, || self.preflight_once()).await
    }

    async fn preflight_once(&self) -> Result<(), ChainError> {
        let policy = &self.cfg.retry;
        let actual = timed(policy, self.provider.get_chain_id()).await?;
        if actual != self.cfg.chain_id {
            return Err(ChainError::WrongChainId { expected: self.cfg.chain_id, actual });
        }
        let code = timed(policy, self.provider.get_code_at(self.cfg.registry).into_future()).await?;
        if code.is_empty() {
            return Err(ChainError::ContractMissing { address: self.cfg.registry });
        }
        Ok(())
    }

    /// The registry's record of `root`, or `None` if it was never anchored.
    pub async fn lookup(&self, root: B256) -> Result<Option<AnchorRecord>, ChainError> {
        let policy = &self.cfg.retry;
        rpc::with_retry(
            policy,
            |_, _| {},
            || async {
                self.preflight_once().await?;
                self.lookup_once(root).await
            },
        )
        .await
    }

    async fn lookup_once(&self, root: B256) -> Result<Option<AnchorRecord>, ChainError> {
        let policy = &self.cfg.retry;
        let call = Registry::anchoredAtCall { root }.abi_encode();
        let req = TransactionRequest::default().with_to(self.cfg.registry).with_input(call);
        let out = timed(policy, self.provider.call(req).into_future()).await?;
        let rec = Registry::anchoredAtCall::abi_decode_returns(&out)
            .map_err(|e| ChainError::Other(format!("registry returned an undecodable record: {e}")))?;
        if rec.timestamp == 0 && rec.by == Address::ZERO {
            return Ok(None);
        }
        let filter = Filter::new()
            .address(self.cfg.registry)
            .event_signature(Registry::Anchored::SIGNATURE_HASH)
            .topic1(root)
            .from_block(rec.blockNumber)
            .to_block(rec.blockNumber);
        let tx = match timed(policy, self.provider.get_logs(&filter)).await {
            Ok(logs) => logs.first().and_then(|l| l.transaction_hash),
            // Some public endpoints refuse log queries; the record itself is what counts.
            Err(ChainError::Rpc(_)) => None,
            Err(e) => return Err(e),
        };
        Ok(Some(AnchorRecord { root, timestamp: rec.timestamp, block: rec.blockNumber, by: rec.by, tx }))
    }

    /// Anchors `root` (see the module docs); a root already anchored is success.
    pub async fn anchor(&self, root: B256) -> Result<Anchored, ChainError> {
        self.anchor_observed(root, &|_: &AnchorStep| {}).await
    }

    /// [`Anchorer::anchor`], reporting each step to `observer`.
    pub async fn anchor_observed(&self, root: B256, observer: &dyn AnchorObserver) -> Result<Anchored, ChainError> {
        if self.cfg.key.is_none() {
            return Err(ChainError::ReadOnly);
        }
        if root == B256::ZERO {
            return Err(ChainError::Other("the zero root cannot be anchored (the registry refuses it)".into()));
        }
        let policy = self.cfg.retry.clone();
        let mut sent: Option<B256> = None;
        let mut attempt = 1u32;
        loop {
            let outcome = match tokio::time::timeout(
                self.cfg.mined_timeout + policy.call_timeout,
                self.attempt(root, sent),
            )
            .await
            {
                Ok(r) => r,
                Err(_) => Err(ChainError::Transport { attempts: attempt, message: "anchoring timed out".into() }),
            };
            match outcome {
                Ok(Attempt::Done(a)) => return Ok(a),
                Ok(Attempt::Sent(tx)) => {
                    let from = self.account().unwrap_or_default();
                    if sent != Some(tx) {
                        sent = Some(tx);
                        let nonce = self.nonce_of(tx).await.unwrap_or_default();
                        observer.step(&AnchorStep::Submitted { root, tx, nonce, from });
                    }
                    // Wait for it in the next round (no pause: nothing failed).
                    continue;
                }
                Ok(Attempt::Mined) => continue,
                Err(e) if e.is_transient() && attempt < policy.attempts.max(1) => {
                    observer.step(&AnchorStep::Retrying { root, attempt, error: e.to_string() });
                    tracing::warn!(%root, attempt, error = %e, "anchoring failed, retrying");
                    attempt += 1;
                    tokio::time::sleep(policy.backoff(attempt)).await;
                }
                Err(ChainError::Transport { message, .. }) => {
                    return Err(ChainError::Transport { attempts: attempt, message });
                }
                Err(e) => return Err(e),
            }
        }
    }

    async fn nonce_of(&self, tx: B256) -> Option<u64> {
        use alloy::consensus::Transaction;
        let found = timed(&self.cfg.retry, self.provider.get_transaction_by_hash(tx).into_future()).await.ok()??;
        Some(found.nonce())
    }

    /// One pass: look up, then wait for our transaction if the node still knows it,
    /// else send a new one.
    async fn attempt(&self, root: B256, sent: Option<B256>) -> Result<Attempt, ChainError> {
        self.preflight_once().await?;
        if let Some(rec) = self.lookup_once(root).await? {
            // Ours if the event names our transaction (or, where the endpoint serves no
            // logs, if our account sent it while we had one in flight).
            let ours = sent.is_some() && (rec.tx == sent || (rec.tx.is_none() && Some(rec.by) == self.account()));
            let confirmations = self.wait_confirmations(rec.block).await?;
            let gas_used = match (ours, sent) {
                (true, Some(tx)) => self.receipt(tx).await?.map(|r| r.gas_used()),
                _ => None,
            };
            return Ok(Attempt::Done(Anchored { record: rec, already_anchored: !ours, gas_used, confirmations }));
        }
        if let Some(tx) = sent {
            let known = timed(&self.cfg.retry, self.provider.get_transaction_by_hash(tx).into_future()).await?;
            if known.is_some() {
                return self.wait_mined(root, tx).await;
            }
            tracing::warn!(%tx, "the endpoint forgot our anchoring transaction; sending it again");
        }
        match self.send(root).await {
            Ok(tx) => Ok(Attempt::Sent(tx)),
            // Gas estimation ran `anchor(root)` and it reverted: if another sender anchored the
            // root since our lookup, that is success; otherwise the revert stands.
            Err(e @ ChainError::Reverted { tx: None, .. }) => match self.lookup_once(root).await? {
                Some(rec) => {
                    let confirmations = self.wait_confirmations(rec.block).await?;
                    Ok(Attempt::Done(Anchored { record: rec, already_anchored: true, gas_used: None, confirmations }))
                }
                None => Err(e),
            },
            Err(e) => Err(e),
        }
    }

    /// Sends `anchor(root)` with the pending nonce, under the nonce lock.
    async fn send(&self, root: B256) -> Result<B256, ChainError> {
        let policy = &self.cfg.retry;
        let from = self.account().ok_or(ChainError::ReadOnly)?;
        let _guard = self.nonce_lock.lock().await;
        let nonce = timed(policy, self.provider.get_transaction_count(from).pending().into_future()).await?;
        let input = Bytes::from(Registry::anchorCall { root }.abi_encode());
        let req = TransactionRequest::default()
            .with_from(from)
            .with_to(self.cfg.registry)
            .with_input(input)
            .with_nonce(nonce);
        match timed(policy, self.provider.send_transaction(req)).await {
            Ok(pending) => Ok(*pending.tx_hash()),
            Err(e) => Err(self.classify_send_error(e, from)),
        }
    }

    fn classify_send_error(&self, e: ChainError, from: Address) -> ChainError {
        match e {
            ChainError::Rpc(msg) if is_insufficient_funds(&msg) => {
                ChainError::InsufficientFunds { address: from, message: msg }
            }
            ChainError::Rpc(msg) if msg.contains("revert") => {
                // Gas estimation ran the call: decode the registry's custom error if present.
                ChainError::Reverted { tx: None, reason: decode_revert(&msg).unwrap_or(msg) }
            }
            other => other,
        }
    }

    async fn receipt(&self, tx: B256) -> Result<Option<alloy::rpc::types::TransactionReceipt>, ChainError> {
        timed(&self.cfg.retry, self.provider.get_transaction_receipt(tx).into_future()).await
    }

    /// Waits for `tx` to be mined; a revert because someone anchored first is success.
    async fn wait_mined(&self, root: B256, tx: B256) -> Result<Attempt, ChainError> {
        let deadline = Instant::now() + self.cfg.mined_timeout;
        loop {
            if let Some(r) = self.receipt(tx).await? {
                if r.status() {
                    return Ok(Attempt::Mined);
                }
                return match self.lookup_once(root).await? {
                    Some(rec) => {
                        let confirmations = self.wait_confirmations(rec.block).await?;
                        Ok(Attempt::Done(Anchored {
                            record: rec,
                            already_anchored: true,
                            gas_used: None,
                            confirmations,
                        }))
                    }
                    None => Err(ChainError::Reverted { tx: Some(tx), reason: "status 0 in the receipt".into() }),
                };
            }
            if Instant::now() > deadline {
                return Err(ChainError::NotMined { tx, seconds: self.cfg.mined_timeout.as_secs() });
            }
            tokio::time::sleep(self.cfg.poll_interval).await;
        }
    }

    /// Waits until `block` has `confirmations` blocks on top of it (counting itself);
    /// returns the confirmations seen. On anvil, whose blocks come only with
    /// transactions, it mines empty blocks instead of waiting forever.
    async fn wait_confirmations(&self, block: u64) -> Result<u64, ChainError> {
        let want = self.cfg.confirmations.max(1);
        let deadline = Instant::now() + self.cfg.mined_timeout;
        loop {
            let head = timed(&self.cfg.retry, self.provider.get_block_number()).await?;
            let seen = head.saturating_sub(block) + 1;
            if seen >= want {
                return Ok(seen);
            }
            if self.cfg.chain_id == ANVIL.chain_id {
                let _: String = timed(&self.cfg.retry, self.provider.raw_request("evm_mine".into(), ())).await?;
                continue;
            }
            if Instant::now() > deadline {
                return Err(ChainError::Other(format!(
                    "block {block} has {seen} of {want} confirmations after {}s",
                    self.cfg.mined_timeout.as_secs()
                )));
            }
            tokio::time::sleep(self.cfg.poll_interval).await;
        }
    }
}

/// The registry's custom error named in a node's revert message, if it carries data.
fn decode_revert(message: &str) -> Option<String> {
    // Nodes word revert messages differently; the revert data is the longest 0x-hex run.
    let longest = message
        .match_indices("0x")
        .map(|(i, _)| message[i + 2..].chars().take_while(char::is_ascii_hexdigit).collect::<String>())
        .max_by_key(String::len)?;
    let data = hex::decode(longest).ok()?;
    Registry::RegistryErrors::abi_decode(&data).ok().map(|e| format!("{e:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registry_errors_are_decoded_from_node_messages() {
        let msg = "error code 3: execution reverted: custom error 0x30d23813: 5cfd1b8e7a6c18aa93e5c7313048eb49e4722f53881456b028294cf6e3d6df2e, data: \"0x30d238135cfd1b8e7a6c18aa93e5c7313048eb49e4722f53881456b028294cf6e3d6df2e\"";
        let decoded = decode_revert(msg).expect("decodes");
        assert!(decoded.contains("AlreadyAnchored"), "{decoded}");
        assert_eq!(decode_revert("execution reverted"), None);
    }
}
