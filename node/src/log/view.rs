//! Reading the committed log: events by seq, Merkle roots and proofs.
//!
//! [`View`] is what the writable log shares with its readers; [`LogReader`] is the
//! same view built read-only from the files, for commands that must not take the
//! writer's lock (another process may be serving the node).

use super::LOG_DIR;
use super::record::{Event, Hash};
use super::segment::{self, Position, ReadSegment, Scan, ScanError, TornTail};
use super::witness::{self, LostLog};
use mindxtrain_chain::merkle::{self, ProofError};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use thiserror::Error;

#[derive(Debug, Error)]
pub enum ReadError {
    #[error("seq {seq} is not in the log (it holds {len} events)")]
    NoSuchSeq { seq: u64, len: u64 },
    #[error("tree size {size} is larger than the log ({len} events)")]
    TooLarge { size: u64, len: u64 },
    #[error(transparent)]
    Proof(#[from] ProofError),
    #[error(transparent)]
    Scan(#[from] ScanError),
    #[error("{0}: no event log here; run `mindxtrain init` first")]
    NoLog(PathBuf),
    /// The log is gone, empty, or shorter than what the node recorded elsewhere.
    #[error("{0}")]
    Lost(Box<LostLog>),
    #[error(transparent)]
    Witness(#[from] witness::WitnessError),
}

/// Committed events: where each lies, its hash and its Merkle leaf.
#[derive(Debug, Default)]
pub struct View {
    segments: Vec<Arc<ReadSegment>>,
    positions: Vec<Position>,
    hashes: Vec<Hash>,
    leaves: Vec<Hash>,
}

impl View {
    pub(crate) fn from_scan(scan: &Scan) -> Self {
        let mut v = Self { segments: scan.segments.clone(), ..Default::default() };
        for (h, p) in scan.hashes.iter().zip(&scan.positions) {
            v.push(*h, *p);
        }
        v
    }

    pub(crate) fn push_segment(&mut self, s: Arc<ReadSegment>) {
        self.segments.push(s);
    }

    pub(crate) fn push(&mut self, hash: Hash, pos: Position) {
        self.hashes.push(hash);
        self.leaves.push(merkle::leaf_hash(&hash));
        self.positions.push(pos);
    }

    pub fn len(&self) -> u64 {
        self.hashes.len() as u64
    }

    pub fn is_empty(&self) -> bool {
        self.hashes.is_empty()
    }

    pub fn hash(&self, seq: u64) -> Option<Hash> {
        self.hashes.get(seq as usize).copied()
    }

    pub fn event(&self, seq: u64) -> Result<Event, ReadError> {
        let pos = *self.positions.get(seq as usize).ok_or(ReadError::NoSuchSeq { seq, len: self.len() })?;
        let seg = &self.segments[pos.segment as usize];
        Ok(segment::read_event(&seg.file, pos, &seg.path, seq)?)
    }

    /// Events `from..to` (clamped to the log).
    pub fn range(&self, from: u64, to: u64) -> Result<Vec<Event>, ReadError> {
        (from..to.min(self.len())).map(|s| self.event(s)).collect()
    }

    fn check_size(&self, size: u64) -> Result<usize, ReadError> {
        if size > self.len() {
            return Err(ReadError::TooLarge { size, len: self.len() });
        }
        Ok(size as usize)
    }

    /// Merkle root of the first `size` events.
    pub fn root(&self, size: u64) -> Result<Hash, ReadError> {
        let n = self.check_size(size)?;
        Ok(merkle::root(&self.leaves[..n]))
    }

    /// Leaf hash (`BLAKE3(0x00 ‖ event hash)`) of `seq`.
    pub fn leaf(&self, seq: u64) -> Option<Hash> {
        self.leaves.get(seq as usize).copied()
    }

    pub fn inclusion_proof(&self, seq: u64, size: u64) -> Result<Vec<Hash>, ReadError> {
        let n = self.check_size(size)?;
        Ok(merkle::inclusion_proof(&self.leaves[..n], seq)?)
    }

    #[cfg(test)]
    pub(crate) fn positions_for_test(&self, seq: u64) -> u64 {
        self.positions[seq as usize].offset
    }

    pub fn consistency_proof(&self, old: u64, new: u64) -> Result<Vec<Hash>, ReadError> {
        let n = self.check_size(new)?;
        Ok(merkle::consistency_proof(&self.leaves[..n], old)?)
    }
}

fn lost(log_dir: PathBuf, events: u64, absent: bool, shortfalls: Vec<witness::Shortfall>) -> ReadError {
    ReadError::Lost(Box::new(LostLog { log_dir, events, absent, shortfalls }))
}

/// A read-only view of a node's log that takes no lock and modifies nothing. A torn
/// tail is reported, not repaired: only the writer repairs. Like the writer, it refuses a
/// log that is gone, empty, or shorter than the node's signed checkpoint and manifests say
/// ([`witness`]; the index is the writer's to read).
pub struct LogReader {
    dir: PathBuf,
    scan: Scan,
    view: View,
}

impl LogReader {
    pub fn open(node_dir: &Path) -> Result<Self, ReadError> {
        let dir = node_dir.join(LOG_DIR);
        // Witnesses first: a writer appending meanwhile only makes the log longer than them.
        let witnesses = match witness::node_key(node_dir) {
            Some(key) => witness::gather(node_dir, &key)?,
            None => Vec::new(),
        };
        let initialised = node_dir.join(crate::identity::SECRET_FILE).exists();
        if !dir.is_dir() {
            if witnesses.is_empty() && !initialised {
                return Err(ReadError::NoLog(node_dir.to_path_buf()));
            }
            return Err(lost(dir, 0, true, witness::check(&witnesses, &[])));
        }
        let scan = segment::scan(&dir, false)?;
        let shortfalls = witness::check(&witnesses, &scan.hashes);
        if !shortfalls.is_empty() || (scan.hashes.is_empty() && (initialised || !witnesses.is_empty())) {
            return Err(lost(dir, scan.hashes.len() as u64, false, shortfalls));
        }
        let view = View::from_scan(&scan);
        Ok(Self { dir, scan, view })
    }

    pub fn view(&self) -> &View {
        &self.view
    }

    /// A torn tail the writer will truncate at its next open.
    pub fn torn(&self) -> Option<&TornTail> {
        self.scan.torn.as_ref()
    }

    /// Public key declared by the log's genesis event.
    pub fn genesis_key(&self) -> Option<&str> {
        self.scan.genesis_key.as_deref()
    }

    /// Picks up events appended since the last call; returns how many arrived.
    pub fn refresh(&mut self) -> Result<u64, ReadError> {
        let before = self.view.len();
        let known_segments = self.scan.segments.len();
        segment::scan_more(&self.dir, &mut self.scan, false)?;
        for s in &self.scan.segments[known_segments..] {
            self.view.push_segment(s.clone());
        }
        let now = self.scan.hashes.len();
        for i in before as usize..now {
            self.view.push(self.scan.hashes[i], self.scan.positions[i]);
        }
        Ok(now as u64 - before)
    }
}
