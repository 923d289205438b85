//! What the node knows of its log from outside `log/`, and the check that the log still
//! holds it.
//!
//! A log whose only segment was zero-filled or deleted, or whose `log/` was removed, reads
//! as a shorter log, or an empty one; nothing in the segments can tell. Other records of
//! the node can:
//!
//! * the sled index's `last (seq, hash)`: the last event it indexed, only ever one that was
//!   durable ([`super::index`]);
//! * the latest signed checkpoint, kept in `node-dir/log-checkpoint.note` ([`CHECKPOINT_FILE`]):
//!   written when the log closes and whenever a checkpoint is recorded (`log.checkpointed`,
//!   which is what `anchor` puts on chain);
//! * every sealed run's manifest (`node-dir/manifests/*.json`): it names the run's events
//!   (`firstSeq..=lastSeq`) and carries a checkpoint signed when it was sealed.
//!
//! Each is a [`Witness`]: a claim that the log holds at least so many events, and what they
//! hash to. [`check`] compares them with the log and returns a [`Shortfall`] for each one
//! the log does not meet: fewer events (events lost), or other ones (the log replaced or
//! rewritten). Opening a log, reading it and `log verify` refuse such a log, naming what
//! is missing; only `init` starts a new one.

use std::path::{Path, PathBuf};

use ed25519_dalek::VerifyingKey;
use mindxtrain_chain::merkle;
use serde::Serialize;

use super::checkpoint::{self, Checkpoint};
use super::record::{Hash, hash_hex};
use crate::fsutil;
use crate::identity::{self, Identity};

/// The latest signed checkpoint of the log, in the node directory (outside `log/`).
pub const CHECKPOINT_FILE: &str = "log-checkpoint.note";

/// What a witness says the log holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    /// The event at `seq` has this hash.
    Event { seq: u64, hash: Hash },
    /// The first `size` events have this Merkle root.
    Tree { size: u64, root: Hash },
}

impl Claim {
    /// Events the log must hold for the claim to be met.
    pub fn size(&self) -> u64 {
        match self {
            Claim::Event { seq, .. } => seq + 1,
            Claim::Tree { size, .. } => *size,
        }
    }
}

/// A record of the node that vouches for some of its log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Witness {
    /// What it is, for messages (`the index`, `the signed checkpoint`, `run r1's manifest`).
    pub source: String,
    pub path: PathBuf,
    pub claim: Claim,
    /// The events it names, inclusive (a run's), when it names some.
    pub events: Option<(u64, u64)>,
}

/// A witness the log does not meet.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Shortfall {
    pub source: String,
    pub path: PathBuf,
    /// Events the witness vouches for that the log lacks (inclusive), if that is the problem.
    pub missing: Option<(u64, u64)>,
    pub what: String,
}

impl std::fmt::Display for Shortfall {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({}) {}", self.source, self.path.display(), self.what)
    }
}

/// Why a witness could not be read.
#[derive(Debug, thiserror::Error)]
pub enum WitnessError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{path} is not a checkpoint signed by this node's key ({reason}); if it is not this node's, move it away")]
    BadNote { path: PathBuf, reason: String },
}

/// The witnesses kept as files in `node_dir` (the signed checkpoint and the manifests),
/// checked against `key`; the index's is added by whoever holds the index. Manifests not
/// signed by `key` vouch for another log and are passed over.
pub fn gather(node_dir: &Path, key: &VerifyingKey) -> Result<Vec<Witness>, WitnessError> {
    let mut found = Vec::new();
    let path = node_dir.join(CHECKPOINT_FILE);
    match std::fs::read_to_string(&path) {
        Ok(note) => {
            let cp = Checkpoint::verify(&note, key)
                .map_err(|e| WitnessError::BadNote { path: path.clone(), reason: e.to_string() })?;
            let claim = Claim::Tree { size: cp.size, root: cp.root };
            found.push(Witness { source: "the latest signed checkpoint".into(), path, claim, events: None });
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(source) => return Err(WitnessError::Io { path, source }),
    }
    found
        .extend(crate::manifest::witnesses(node_dir, key).map_err(|(path, source)| WitnessError::Io { path, source })?);
    Ok(found)
}

/// The index's last indexed event as a witness.
pub fn of_index(node_dir: &Path, seq: u64, hash: Hash) -> Witness {
    Witness {
        source: "the index's last indexed event".into(),
        path: node_dir.join(super::INDEX_DIR),
        claim: Claim::Event { seq, hash },
        events: None,
    }
}

/// The public key in `node-dir/node.pub`, if there is a readable one.
pub fn node_key(node_dir: &Path) -> Option<VerifyingKey> {
    let path = node_dir.join(identity::PUBLIC_FILE);
    path.is_file().then(|| identity::read_public_key(&path.to_string_lossy()).ok()).flatten()
}

/// The witnesses `hashes` (the log's event hashes from seq 0, in order) does not meet.
pub fn check(witnesses: &[Witness], hashes: &[Hash]) -> Vec<Shortfall> {
    let len = hashes.len() as u64;
    let mut sizes: Vec<u64> = witnesses
        .iter()
        .filter_map(|w| match w.claim {
            Claim::Tree { size, .. } if size <= len => Some(size),
            _ => None,
        })
        .collect();
    sizes.sort_unstable();
    sizes.dedup();
    let roots = prefix_roots(hashes, &sizes);
    let root_of = |size: u64| sizes.binary_search(&size).ok().map(|i| roots[i]);
    let mut out = Vec::new();
    for w in witnesses {
        let shortfall =
            |missing, what: String| Shortfall { source: w.source.clone(), path: w.path.clone(), missing, what };
        let need = w.claim.size();
        if need > len {
            let vouches = match (&w.claim, w.events) {
                (_, Some((first, last))) => format!("names events {first}..={last} and was signed at {need} events"),
                (Claim::Event { seq, hash }, None) => format!("names event {seq} (hash {})", &hash_hex(hash)[..16]),
                (Claim::Tree { size, .. }, None) => format!("was signed at {size} events"),
            };
            out.push(shortfall(Some((len, need - 1)), vouches));
            continue;
        }
        let differs = match &w.claim {
            Claim::Event { seq, hash } => {
                let ours = hashes[*seq as usize];
                (ours != *hash).then(|| {
                    format!(
                        "names event {seq} with hash {}, but the log's event {seq} hashes to {}",
                        &hash_hex(hash)[..16],
                        &hash_hex(&ours)[..16]
                    )
                })
            }
            Claim::Tree { size, root } => root_of(*size).filter(|ours| ours != root).map(|ours| {
                format!(
                    "signed root {} over the first {size} events, but the log's first {size} events have root {}",
                    &hex::encode(root)[..16],
                    &hex::encode(ours)[..16]
                )
            }),
        };
        if let Some(what) = differs {
            out.push(shortfall(None, format!("{what}: the log was replaced or rewritten")));
        }
    }
    out
}

/// The Merkle roots of the first `sizes[i]` events (ascending sizes), in one pass over the
/// leaves: the RFC 6962 root of n leaves folds the perfect subtrees n's binary digits name.
fn prefix_roots(hashes: &[Hash], sizes: &[u64]) -> Vec<Hash> {
    let mut stack: Vec<(u32, Hash)> = Vec::new();
    let mut out = Vec::with_capacity(sizes.len());
    let mut wanted = sizes.iter().peekable();
    while wanted.next_if_eq(&&0).is_some() {
        out.push(merkle::empty_root());
    }
    for (i, h) in hashes.iter().enumerate() {
        let mut node = (0u32, merkle::leaf_hash(h));
        while let Some(&(height, left)) = stack.last().filter(|(height, _)| *height == node.0) {
            stack.pop();
            node = (height + 1, merkle::node_hash(&left, &node.1));
        }
        stack.push(node);
        while wanted.next_if_eq(&&(i as u64 + 1)).is_some() {
            let mut it = stack.iter().rev();
            let first = it.next().map(|(_, h)| *h).expect("a leaf was pushed");
            out.push(it.fold(first, |acc, (_, left)| merkle::node_hash(left, &acc)));
        }
    }
    out
}

/// Writes the checkpoint of `size` events with `root`, signed by `key`, as the node's latest
/// (durably: a temporary file, fsync, rename, fsync of the directory).
pub fn save_checkpoint(node_dir: &Path, key: &Identity, size: u64, root: Hash) -> std::io::Result<()> {
    let cp = Checkpoint { origin: checkpoint::origin_for(&key.public_bytes()), size, root };
    fsutil::replace_durably(&node_dir.join(CHECKPOINT_FILE), cp.sign(key).as_bytes(), 0o644)
}

/// Why a log cannot be used: it is gone, empty, or shorter than what the node recorded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LostLog {
    pub log_dir: PathBuf,
    /// Events the log still holds (0 when it is gone).
    pub events: u64,
    pub absent: bool,
    pub shortfalls: Vec<Shortfall>,
}

impl LostLog {
    /// The events that are missing, from the first to the last any witness vouches for.
    pub fn missing(&self) -> Option<(u64, u64)> {
        let last = self.shortfalls.iter().filter_map(|s| s.missing.map(|(_, l)| l)).max()?;
        Some((self.events, last))
    }
}

impl std::fmt::Display for LostLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let dir = self.log_dir.display();
        match (self.absent, self.events) {
            (true, _) => write!(f, "{dir} is missing")?,
            (false, 0) => write!(f, "{dir} holds no events, not even the genesis event every log starts with")?,
            (false, n) => write!(f, "{dir} holds {n} events")?,
        }
        if self.shortfalls.is_empty() {
            f.write_str(", and this node's log was started by `init`: its history is lost")?;
        } else {
            f.write_str(", but the node recorded more: ")?;
            let each: Vec<String> = self.shortfalls.iter().map(Shortfall::to_string).collect();
            f.write_str(&each.join("; "))?;
        }
        if let Some((first, last)) = self.missing() {
            write!(f, ". Events {first}..={last} are missing")?;
        }
        f.write_str(
            ". Restore log/ from a backup; nothing was changed. A new log is only ever started by `mindxtrain \
             init`, in a new node directory",
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_roots_equal_the_merkle_roots_of_each_prefix() {
        let hashes: Vec<Hash> = (0..70u8).map(|i| *blake3::hash(&[i]).as_bytes()).collect();
        let sizes: Vec<u64> = (0..=70).collect();
        let roots = prefix_roots(&hashes, &sizes);
        for (size, root) in sizes.iter().zip(&roots) {
            let leaves: Vec<Hash> = hashes[..*size as usize].iter().map(|h| merkle::leaf_hash(h)).collect();
            assert_eq!(*root, merkle::root(&leaves), "size {size}");
        }
    }

    #[test]
    fn shortfalls_name_missing_and_replaced_events() {
        let hashes: Vec<Hash> = (0..5u8).map(|i| *blake3::hash(&[i]).as_bytes()).collect();
        let leaves: Vec<Hash> = hashes[..3].iter().map(|h| merkle::leaf_hash(h)).collect();
        let w = |claim| Witness { source: "w".into(), path: "p".into(), claim, events: None };
        let met =
            [w(Claim::Event { seq: 4, hash: hashes[4] }), w(Claim::Tree { size: 3, root: merkle::root(&leaves) })];
        assert!(check(&met, &hashes).is_empty());
        let short = check(&[w(Claim::Event { seq: 9, hash: [0; 32] })], &hashes);
        assert_eq!(short[0].missing, Some((5, 9)));
        let other = check(&[w(Claim::Tree { size: 3, root: [7; 32] })], &hashes);
        assert!(other[0].missing.is_none() && other[0].what.contains("replaced"), "{other:?}");
        let other = check(&[w(Claim::Event { seq: 1, hash: [7; 32] })], &hashes);
        assert!(other[0].what.contains("replaced"), "{other:?}");
    }
}
