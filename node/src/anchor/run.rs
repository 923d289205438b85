//! Anchoring with every step in the log.

use super::deployment::Deployment;
use super::session::{Target, display_url};
use super::state::{AnchorState, ConfirmedData, Item, KINDS};
use super::{AnchorError, KIND_CONFIRMED, KIND_DEPLOYED, KIND_FAILED, KIND_REQUESTED, KIND_SUBMITTED};
use crate::identity::Identity;
use crate::log::checkpoint::{self, Checkpoint};
use crate::log::index::Query;
use crate::log::{AppendError, AppendRequest, Appended, Event, EventLog, LogReader};
use mindxtrain_chain::merkle::Hash;
use mindxtrain_chain::{AnchorObserver, AnchorStep, Anchorer, Batch, ChainError};
use serde::Serialize;
use serde_json::json;
use std::sync::Mutex;
use tokio::sync::oneshot;

/// The replayed anchoring history of a writable log (through its index).
pub fn state_of_log(log: &EventLog) -> Result<AnchorState, AnchorError> {
    let mut seqs = Vec::new();
    for kind in KINDS {
        seqs.extend(log.query(&Query::Kind(kind.into())).map_err(|e| AnchorError::Log(e.to_string()))?);
    }
    seqs.sort_unstable();
    let events: Vec<Event> =
        seqs.into_iter().map(|s| log.get(s)).collect::<Result<_, _>>().map_err(|e| AnchorError::Log(e.to_string()))?;
    Ok(AnchorState::replay(&events))
}

/// The replayed anchoring history from a read-only reader (a full scan).
pub fn state_of_reader(reader: &LogReader) -> Result<AnchorState, AnchorError> {
    let v = reader.view();
    let events = v.range(0, v.len()).map_err(|e| AnchorError::Log(e.to_string()))?;
    Ok(AnchorState::replay(events.iter().filter(|e| KINDS.contains(&e.envelope.kind.as_str()))))
}

/// Asks for `digest` to be anchored with the next batch (idempotent per digest).
pub fn request(log: &EventLog, digest: &Hash, label: &str) -> Result<Appended, AppendError> {
    let hexd = hex::encode(digest);
    log.append(
        AppendRequest::new(KIND_REQUESTED, hexd.clone(), json!({"digest": hexd, "label": label}))
            .with_id(format!("{KIND_REQUESTED}:{hexd}")),
    )
}

/// Signs a checkpoint of the whole log and records it as `log.checkpointed` (which makes
/// it an item to anchor). Blocking: call outside an async runtime.
pub fn checkpoint_log(log: &EventLog, id: &Identity) -> Result<(Checkpoint, String, Appended), AnchorError> {
    let size = log.len();
    let root = log.read(|v| v.root(size)).map_err(|e| AnchorError::Log(e.to_string()))?;
    let cp = Checkpoint { origin: checkpoint::origin_for(&id.public_bytes()), size, root };
    let note = cp.sign(id);
    let a = log.append(AppendRequest::new(
        super::state::KIND_CHECKPOINTED,
        cp.origin.clone(),
        json!({"size": size, "root": hex::encode(root), "note": note}),
    ))?;
    // Kept outside log/ too, so that a log that later loses these events is refused.
    if let Err(e) = log.save_head() {
        tracing::warn!("could not keep the log's signed checkpoint: {e}");
    }
    Ok((cp, note, a))
}

/// Deploys the registry to `target` (an embedded anvil's endpoint is `rpc_url`),
/// records `chain.deployed` and writes chain.json.
pub async fn deploy(
    log: &EventLog,
    node_dir: &std::path::Path,
    target: &Target,
    rpc_url: &str,
    key: &mindxtrain_chain::AnchorKey,
    replace: bool,
) -> Result<Deployment, AnchorError> {
    let path = Deployment::path(node_dir);
    if path.exists() && !replace {
        return Err(super::deployment::DeploymentError::Exists(path).into());
    }
    let d = mindxtrain_chain::deploy::deploy_registry(rpc_url, key, target.chain_id).await?;
    let deployment = Deployment {
        v: 1,
        network: target.network.clone(),
        chain_id: d.chain_id,
        rpc_url: target.rpc_url.clone(),
        registry: d.address,
        deploy_tx: d.tx,
        deploy_block: d.block,
        deployer: d.deployer,
        deployed_at: humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string(),
        test_usdc: None,
    };
    let endpoint = display_url(rpc_url, target.rpc_url.is_none());
    record_deployed(log, ("Registry", "registry"), &deployment.network, &d, endpoint).await?;
    deployment.save(node_dir, replace)?;
    Ok(deployment)
}

/// Records `chain.deployed` for a contract (its name, and the data field naming its address).
async fn record_deployed(
    log: &EventLog,
    (contract, field): (&str, &str),
    network: &str,
    d: &mindxtrain_chain::deploy::Deployment,
    endpoint: String,
) -> Result<(), AnchorError> {
    let mut data = json!({
        "contract": contract, "network": network, "chain_id": d.chain_id, "tx": d.tx, "block": d.block,
        "deployer": d.deployer, "gas_used": d.gas_used, "endpoint": endpoint,
    });
    data[field] = json!(d.address);
    log.append_async(AppendRequest::new(KIND_DEPLOYED, format!("{:#x}", d.address), data)).await?;
    Ok(())
}

/// The EIP-712 name and version of the test token, those of USDC (`x402::Asset::test_usdc`).
pub const TEST_USDC_DOMAIN: (&str, &str) = ("USD Coin", "2");

/// Deploys `TestUSDC` (EIP-3009, open mint: for local and test chains) beside the node's
/// registry, records `chain.deployed` and adds it to chain.json.
pub async fn deploy_test_usdc(
    log: &EventLog,
    node_dir: &std::path::Path,
    rpc_url: &str,
    embedded: bool,
    key: &mindxtrain_chain::AnchorKey,
) -> Result<Deployment, AnchorError> {
    let mut deployment = Deployment::load(node_dir)?;
    let (name, version) = TEST_USDC_DOMAIN;
    let d = mindxtrain_chain::deploy::deploy_test_usdc(rpc_url, key, name, version).await?;
    if d.chain_id != deployment.chain_id {
        return Err(
            mindxtrain_chain::ChainError::WrongChainId { expected: deployment.chain_id, actual: d.chain_id }.into()
        );
    }
    record_deployed(log, ("TestUSDC", "token"), &deployment.network, &d, display_url(rpc_url, embedded)).await?;
    deployment.test_usdc = Some(d.address);
    deployment.save(node_dir, true)?;
    Ok(deployment)
}

/// What one anchored batch became.
#[derive(Debug, Clone, Serialize)]
pub struct BatchOutcome {
    pub root: String,
    pub items: Vec<Item>,
    pub tx: String,
    pub block: u64,
    pub timestamp: u64,
    pub already_anchored: bool,
    pub gas_used: Option<u64>,
    pub confirmations: u64,
    pub confirmed_seq: u64,
}

/// Records `anchor.submitted` as soon as the anchorer reports a sent transaction. The
/// append is queued without blocking the anchoring task; [`EventObserver::finish`]
/// waits until every queued event is durable.
struct EventObserver<'a> {
    log: &'a EventLog,
    items: Vec<String>,
    chain_id: u64,
    registry: String,
    pending: Mutex<Vec<oneshot::Receiver<Result<Appended, AppendError>>>>,
}

impl AnchorObserver for EventObserver<'_> {
    fn step(&self, step: &AnchorStep) {
        if let AnchorStep::Submitted { root, tx, nonce, from } = step {
            let root_hex = hex::encode(root);
            let req = AppendRequest::new(
                KIND_SUBMITTED,
                root_hex.clone(),
                json!({
                    "root": root_hex,
                    "items": self.items,
                    "chain_id": self.chain_id,
                    "registry": self.registry,
                    "tx": tx,
                    "nonce": nonce,
                    "from": from,
                }),
            )
            .with_id(format!("{KIND_SUBMITTED}:{tx:#x}"));
            self.pending.lock().unwrap_or_else(|e| e.into_inner()).push(self.log.submit(req));
        }
    }
}

impl EventObserver<'_> {
    async fn finish(&self) -> Result<(), AnchorError> {
        let pending = std::mem::take(&mut *self.pending.lock().unwrap_or_else(|e| e.into_inner()));
        for rx in pending {
            rx.await.unwrap_or_else(|_| Err(AppendError::Stopped("writer exited".into())))?;
        }
        Ok(())
    }
}

/// Anchors every pending item of `log` on `anchorer`'s registry: all in one batch with
/// `batch`, else one transaction per item. Each step is an event: `anchor.submitted`
/// when a transaction is accepted, `anchor.confirmed` with the batch's items when the
/// root has its confirmations (also when it was already anchored), `anchor.failed` with
/// the error otherwise. Returns the outcomes (empty when nothing was pending).
pub async fn anchor_pending(
    log: &EventLog,
    anchorer: &Anchorer,
    batch: bool,
) -> Result<Vec<BatchOutcome>, AnchorError> {
    let state = state_of_log(log)?;
    let pending = state.pending(anchorer.chain_id(), anchorer.registry());
    let groups: Vec<Vec<Item>> = if batch { vec![pending] } else { pending.into_iter().map(|i| vec![i]).collect() };
    let mut outcomes = Vec::new();
    for items in groups.into_iter().filter(|g| !g.is_empty()) {
        outcomes.push(anchor_items(log, anchorer, items).await?);
    }
    Ok(outcomes)
}

async fn anchor_items(log: &EventLog, anchorer: &Anchorer, items: Vec<Item>) -> Result<BatchOutcome, AnchorError> {
    let batch = Batch::new(items.iter().map(|i| i.digest)).map_err(|e| AnchorError::Other(e.to_string()))?;
    let root = batch.root();
    let root_hex = hex::encode(root);
    let item_hex: Vec<String> = batch.digests().iter().map(hex::encode).collect();
    let registry = format!("{:#x}", anchorer.registry());
    let observer = EventObserver {
        log,
        items: item_hex.clone(),
        chain_id: anchorer.chain_id(),
        registry: registry.clone(),
        pending: Mutex::new(Vec::new()),
    };
    let result = anchorer.anchor_observed(mindxtrain_chain::B256::from(root), &observer).await;
    observer.finish().await?;
    let anchored = match result {
        Ok(a) => a,
        Err(e) => {
            log.append_async(AppendRequest::new(
                KIND_FAILED,
                root_hex.clone(),
                json!({
                    "root": root_hex,
                    "items": item_hex,
                    "chain_id": anchorer.chain_id(),
                    "registry": registry,
                    "error_kind": error_kind(&e),
                    "error": e.to_string(),
                }),
            ))
            .await?;
            return Err(e.into());
        }
    };
    let rec = &anchored.record;
    let tx = rec.tx.ok_or_else(|| {
        AnchorError::Other(format!("root {root_hex} is anchored but the endpoint serves no log naming its transaction"))
    })?;
    let data = ConfirmedData {
        root: root_hex.clone(),
        items: item_hex,
        tree_size: batch.len() as u64,
        chain_id: anchorer.chain_id(),
        registry: anchorer.registry(),
        tx,
        block: rec.block,
        timestamp: rec.timestamp,
        by: rec.by,
        already_anchored: anchored.already_anchored,
    };
    let mut value = serde_json::to_value(&data).expect("confirmed data serialises");
    value["confirmations"] = json!(anchored.confirmations);
    if let Some(g) = anchored.gas_used {
        value["gas_used"] = json!(g);
    }
    let id_material = format!("{}:{registry}:{root_hex}", anchorer.chain_id());
    let id = format!("{KIND_CONFIRMED}:{}", &blake3::hash(id_material.as_bytes()).to_hex()[..32]);
    let seq = match log.append_async(AppendRequest::new(KIND_CONFIRMED, root_hex.clone(), value).with_id(id)).await {
        Ok(a) => a.seq,
        // Already recorded by an earlier run (with other confirmation counts): that record stands.
        Err(AppendError::IdConflict { seq, .. }) => seq,
        Err(e) => return Err(e.into()),
    };
    Ok(BatchOutcome {
        root: root_hex,
        items,
        tx: format!("{tx:#x}"),
        block: rec.block,
        timestamp: rec.timestamp,
        already_anchored: anchored.already_anchored,
        gas_used: anchored.gas_used,
        confirmations: anchored.confirmations,
        confirmed_seq: seq,
    })
}

/// A stable name for each error variant (event data and `--json`).
pub fn error_kind(e: &ChainError) -> &'static str {
    match e {
        ChainError::WrongChainId { .. } => "wrong_chain_id",
        ChainError::ContractMissing { .. } => "contract_missing",
        ChainError::InsufficientFunds { .. } => "insufficient_funds",
        ChainError::Reverted { .. } => "reverted",
        ChainError::Transport { .. } => "transport",
        ChainError::Rpc(_) => "rpc",
        ChainError::NotMined { .. } => "not_mined",
        ChainError::ReadOnly => "read_only",
        ChainError::BadUrl { .. } => "bad_url",
        ChainError::Other(_) => "other",
    }
}
