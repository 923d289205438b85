//! What is anchored and what is pending, derived from the log alone (nothing extra to
//! lose): a replay of five event kinds.
//!
//! * items to anchor: every `log.checkpointed` event (its digest is BLAKE3 of the signed
//!   checkpoint body) and every `anchor.requested` event (a digest such as a manifest's);
//! * anchored: the `items` of every `anchor.confirmed` event for a given chain and
//!   registry;
//! * pending = items, in log order without repeats, minus the anchored ones.

use super::{KIND_CONFIRMED, KIND_FAILED, KIND_REQUESTED, KIND_SUBMITTED};
use crate::log::Event;
use crate::log::checkpoint::Checkpoint;
use mindxtrain_chain::batch::{AnchorPlace, Batch, BatchProof, parse_hash};
use mindxtrain_chain::merkle::Hash;
use mindxtrain_chain::{Address, B256};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::HashSet;

/// Kind of the events whose checkpoints are anchored.
pub const KIND_CHECKPOINTED: &str = "log.checkpointed";

/// Every kind the replay reads.
pub const KINDS: [&str; 5] = [KIND_CHECKPOINTED, KIND_REQUESTED, KIND_SUBMITTED, KIND_CONFIRMED, KIND_FAILED];

/// One thing to anchor.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Item {
    #[serde(with = "hex_hash")]
    pub digest: Hash,
    /// `log.checkpoint` or the label of an `anchor.requested` event (e.g. `manifest`).
    pub label: String,
    /// Seq of the event that made it an item.
    pub seq: u64,
}

/// A root confirmed on chain, with the items it commits to (from `anchor.confirmed`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Confirmed {
    pub seq: u64,
    #[serde(with = "hex_hash")]
    pub root: Hash,
    pub items: Vec<String>,
    pub chain_id: u64,
    pub registry: Address,
    pub tx: B256,
    pub block: u64,
    pub timestamp: u64,
}

/// The replayed anchoring history.
#[derive(Debug, Clone, Default)]
pub struct AnchorState {
    pub items: Vec<Item>,
    pub confirmed: Vec<Confirmed>,
    /// (seq, root, tx) of each `anchor.submitted`.
    pub submitted: Vec<(u64, String, String)>,
    /// (seq, root, error) of each `anchor.failed`.
    pub failed: Vec<(u64, String, String)>,
}

impl AnchorState {
    /// Replays events in seq order; events of other kinds are ignored, malformed ones are
    /// skipped with a warning (the log's signatures, not this replay, vouch for them).
    pub fn replay<'a>(events: impl IntoIterator<Item = &'a Event>) -> Self {
        let mut s = Self::default();
        let mut seen = HashSet::new();
        for ev in events {
            let e = &ev.envelope;
            let parsed = match e.kind.as_str() {
                KIND_CHECKPOINTED => checkpoint_digest(&e.subject, &e.data).map(|d| {
                    if seen.insert(d) {
                        s.items.push(Item { digest: d, label: "log.checkpoint".into(), seq: e.seq });
                    }
                }),
                KIND_REQUESTED => parse_hash(&e.subject).map(|d| {
                    if seen.insert(d) {
                        let label = e.data.get("label").and_then(Value::as_str).unwrap_or("digest").to_string();
                        s.items.push(Item { digest: d, label, seq: e.seq });
                    }
                }),
                KIND_CONFIRMED => serde_json::from_value::<ConfirmedData>(e.data.clone())
                    .ok()
                    .and_then(|c| c.into_confirmed(e.seq))
                    .map(|c| s.confirmed.push(c)),
                KIND_SUBMITTED => {
                    let tx = e.data.get("tx").and_then(Value::as_str).unwrap_or_default().to_string();
                    s.submitted.push((e.seq, e.subject.clone(), tx));
                    Some(())
                }
                KIND_FAILED => {
                    let err = e.data.get("error").and_then(Value::as_str).unwrap_or_default().to_string();
                    s.failed.push((e.seq, e.subject.clone(), err));
                    Some(())
                }
                _ => Some(()),
            };
            if parsed.is_none() {
                tracing::warn!(seq = e.seq, kind = %e.kind, "skipping a malformed anchoring event");
            }
        }
        s
    }

    /// Items not yet confirmed on `(chain_id, registry)`, in log order.
    pub fn pending(&self, chain_id: u64, registry: Address) -> Vec<Item> {
        let anchored: HashSet<&str> = self
            .confirmed
            .iter()
            .filter(|c| c.chain_id == chain_id && c.registry == registry)
            .flat_map(|c| c.items.iter().map(String::as_str))
            .collect();
        self.items.iter().filter(|i| !anchored.contains(hex::encode(i.digest).as_str())).cloned().collect()
    }

    /// The latest confirmed batch holding `digest` (on any chain), with its proof.
    pub fn proof_of(&self, digest: &Hash) -> Option<(BatchProof, &Confirmed)> {
        let hexd = hex::encode(digest);
        let c = self.confirmed.iter().rev().find(|c| c.items.contains(&hexd))?;
        let digests: Vec<Hash> = c.items.iter().filter_map(|i| parse_hash(i)).collect();
        let batch = Batch::new(digests).ok()?;
        if batch.root() != c.root {
            tracing::warn!(seq = c.seq, "anchor.confirmed items do not hash to its root");
            return None;
        }
        let at = AnchorPlace {
            chain_id: c.chain_id,
            registry: c.registry,
            tx: c.tx,
            block: c.block,
            timestamp: c.timestamp,
        };
        Some((batch.proof(digest, &at).ok()?, c))
    }
}

/// The item digest of a log checkpoint: BLAKE3 of its signed body
/// (`origin\nsize\nbase64(root)\n`), which binds the log, the size and the root.
pub fn checkpoint_digest(origin: &str, data: &Value) -> Option<Hash> {
    let size = data.get("size")?.as_u64()?;
    let root = parse_hash(data.get("root")?.as_str()?)?;
    let cp = Checkpoint { origin: origin.to_string(), size, root };
    Some(*blake3::hash(cp.body().as_bytes()).as_bytes())
}

/// The data of an `anchor.confirmed` event.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ConfirmedData {
    /// BLAKE3 hex, like every hash in the log.
    pub root: String,
    pub items: Vec<String>,
    pub tree_size: u64,
    pub chain_id: u64,
    pub registry: Address,
    pub tx: B256,
    pub block: u64,
    pub timestamp: u64,
    pub by: Address,
    pub already_anchored: bool,
}

impl ConfirmedData {
    fn into_confirmed(self, seq: u64) -> Option<Confirmed> {
        Some(Confirmed {
            seq,
            root: parse_hash(&self.root)?,
            items: self.items,
            chain_id: self.chain_id,
            registry: self.registry,
            tx: self.tx,
            block: self.block,
            timestamp: self.timestamp,
        })
    }
}

mod hex_hash {
    use serde::{Deserialize, Deserializer, Serializer, de::Error};

    pub fn serialize<S: Serializer>(h: &[u8; 32], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&hex::encode(h))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<[u8; 32], D::Error> {
        let s = String::deserialize(d)?;
        mindxtrain_chain::batch::parse_hash(&s).ok_or_else(|| D::Error::custom("not 64 hex digits"))
    }
}
