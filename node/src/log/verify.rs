//! `log verify`: a strict, read-only audit of every byte of the log.
//!
//! Unlike the open-time scan, which stops at the first problem, the audit keeps
//! going and lists every problem it can locate: bad framing or crc, non-canonical
//! envelopes, seq gaps and reorderings, broken `prev` links, and signatures that do
//! not verify under the log's key. After damaged bytes it resynchronises on the next
//! crc-valid record so one flipped byte does not hide the rest of the log. Zeros after
//! the last record of a segment are pre-written space, not a problem.
//!
//! A log can also be intact and still not be the node's whole log: a deleted or
//! zero-filled segment, a removed `log/`. The audit compares the log with what the node
//! recorded elsewhere ([`witness`]: the signed checkpoint, the manifests, and the index's
//! last event when no writer holds the log) and lists each record the log falls short of.

use super::record::{self, Event, HEADER_LEN, Hash, ZERO_HASH};
use super::segment::{self, ScanError};
use super::witness::{self, Shortfall, Witness};
use super::{GENESIS_KIND, INDEX_DIR, LOCK_FILE, LOG_DIR};
use crate::identity;
use ed25519_dalek::VerifyingKey;
use mindxtrain_chain::merkle;
use rayon::prelude::*;
use serde::Serialize;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// One thing wrong, located as precisely as the damage allows.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Problem {
    pub segment: PathBuf,
    pub offset: u64,
    /// The seq the record holds, or the one expected there when it cannot be read.
    pub seq: u64,
    pub what: String,
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "segment {}, offset {}, seq {}: {}", self.segment.display(), self.offset, self.seq, self.what)
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub events: u64,
    pub segments: usize,
    /// Hex Merkle root over the events that were read.
    pub root: String,
    /// Hex public key the signatures were checked against, and where it came from.
    pub key: Option<String>,
    pub key_source: String,
    pub problems: Vec<Problem>,
    /// The node's other records of its log that were compared with it (`source (path)`).
    pub witnesses: Vec<String>,
    /// How the index was consulted (it is locked while a node runs).
    pub index: String,
    /// Records the log falls short of: events lost, or the log replaced.
    pub missing: Vec<Shortfall>,
}

impl Report {
    pub fn ok(&self) -> bool {
        self.problems.is_empty() && self.missing.is_empty()
    }

    /// The events that are missing (from the log's end to the last one a record vouches for).
    pub fn missing_events(&self) -> Option<(u64, u64)> {
        let last = self.missing.iter().filter_map(|s| s.missing.map(|(_, l)| l)).max()?;
        Some((self.events, last))
    }
}

/// Which key the signatures must verify under.
pub enum TrustedKey {
    /// A key pinned by the caller (`--trusted-key`, or the node's `node.pub`).
    Pinned(Box<VerifyingKey>, String),
    /// Whatever the genesis event declares (checks internal consistency only).
    FromGenesis,
}

impl TrustedKey {
    pub fn pinned(key: VerifyingKey, source: impl Into<String>) -> Self {
        Self::Pinned(Box::new(key), source.into())
    }
}

/// Audits the log under `node_dir`.
pub fn verify(node_dir: &Path, trusted: TrustedKey) -> Result<Report, ScanError> {
    let dir = node_dir.join(LOG_DIR);
    // What the node recorded, read before the log: a live writer only gets ahead of it.
    let witness_key = match &trusted {
        TrustedKey::Pinned(k, _) => Some(**k),
        TrustedKey::FromGenesis => witness::node_key(node_dir),
    };
    let mut missing = Vec::new();
    let mut witnesses = match witness_key.map(|k| witness::gather(node_dir, &k)) {
        Some(Ok(w)) => w,
        Some(Err(e)) => {
            missing.push(Shortfall {
                source: "a record of the log".into(),
                path: node_dir.into(),
                missing: None,
                what: e.to_string(),
            });
            Vec::new()
        }
        None => Vec::new(),
    };
    let (index_witness, index) = index_witness(node_dir);
    witnesses.extend(index_witness);
    let mut problems = Vec::new();
    let listed = if dir.is_dir() {
        segment::list_segments(&dir)?
    } else {
        problems.push(Problem { segment: dir.clone(), offset: 0, seq: 0, what: "log/ is missing".into() });
        Vec::new()
    };
    let mut events: Vec<(PathBuf, u64, Event)> = Vec::new();
    let mut expected_seq = 0u64;
    let mut prev: Hash = ZERO_HASH;
    for (first_seq, path) in &listed {
        if *first_seq != expected_seq {
            problems.push(Problem {
                segment: path.clone(),
                offset: 0,
                seq: expected_seq,
                what: format!("segment starts at seq {first_seq}, expected {expected_seq} (missing or extra segment)"),
            });
        }
        let is_last = Some((*first_seq, path)) == listed.last().map(|(f, p)| (*f, p));
        let mut bytes = read(path)?;
        let mut audit = audit_segment(path, &bytes, expected_seq, prev);
        // A live writer can be filling the last segment while it is read: a page seen
        // before the writer filled it reads as zeros between records. Damage stays.
        for _ in 0..READ_RETRIES {
            if !is_last || !audit.problems.iter().any(|p| segment::zero_header_at(&bytes, p.offset as usize)) {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
            bytes = read(path)?;
            audit = audit_segment(path, &bytes, expected_seq, prev);
        }
        problems.extend(audit.problems);
        events.extend(audit.events);
        (expected_seq, prev) = (audit.expected_seq, audit.prev);
    }
    let (key, key_source) = resolve_key(trusted, &events, &mut problems);
    if let Some(key) = &key {
        let bad: Vec<Problem> = events
            .par_iter()
            .filter(|(_, _, ev)| !ev.verify_signature(key))
            .map(|(seg, off, ev)| Problem {
                segment: seg.clone(),
                offset: *off,
                seq: ev.envelope.seq,
                what: "signature does not verify under the log's key (re-signed or forged)".into(),
            })
            .collect();
        problems.extend(bad);
    }
    if events.is_empty() && dir.is_dir() {
        let what = "the log holds no events, not even the genesis event every log starts with".into();
        problems.push(Problem { segment: dir.clone(), offset: 0, seq: 0, what });
    }
    problems.sort_by_key(|p| (p.seq, p.offset));
    // The hashes of seq 0, 1, … as far as they run without a gap.
    let hashes: Vec<Hash> = events
        .iter()
        .enumerate()
        .take_while(|(i, (_, _, e))| e.envelope.seq == *i as u64)
        .map(|(_, (_, _, e))| e.hash)
        .collect();
    missing.extend(witness::check(&witnesses, &hashes));
    let leaves: Vec<Hash> = events.iter().map(|(_, _, e)| merkle::leaf_hash(&e.hash)).collect();
    Ok(Report {
        events: events.len() as u64,
        segments: listed.len(),
        root: hex::encode(merkle::root(&leaves)),
        key: key.map(|k| hex::encode(k.to_bytes())),
        key_source,
        problems,
        witnesses: witnesses.iter().map(|w| format!("{} ({})", w.source, w.path.display())).collect(),
        index,
        missing,
    })
}

const READ_RETRIES: u32 = 3;

/// The index's last event as a witness, and how the index was consulted. A running node
/// holds the index (sled locks it) and checked it when it opened the log; the log's lock
/// is held while the index is read, so no node starts meanwhile.
fn index_witness(node_dir: &Path) -> (Option<Witness>, String) {
    let index_dir = node_dir.join(INDEX_DIR);
    if !index_dir.is_dir() {
        return (None, "none".into());
    }
    let lock = std::fs::File::open(node_dir.join(LOG_DIR).join(LOCK_FILE)).ok();
    if lock.as_ref().is_some_and(|l| l.try_lock().is_err()) {
        return (None, "in use by the running node, which compared it with the log when it opened it".into());
    }
    let read = super::index::Index::read_marker(&index_dir);
    drop(lock);
    match read {
        Ok(Some((seq, hash))) => (Some(witness::of_index(node_dir, seq, hash)), format!("last indexed event {seq}")),
        Ok(None) => (None, "empty".into()),
        Err(e) => (None, format!("unreadable ({e}); not consulted")),
    }
}

struct SegmentAudit {
    events: Vec<(PathBuf, u64, Event)>,
    problems: Vec<Problem>,
    expected_seq: u64,
    prev: Hash,
}

/// Checks one segment's records, continuing the chain from `expected_seq` and `prev`.
/// The records end where only zeros follow (pre-written space).
fn audit_segment(path: &Path, bytes: &[u8], mut expected_seq: u64, mut prev: Hash) -> SegmentAudit {
    let mut problems = Vec::new();
    let mut events = Vec::new();
    let end = segment::nonzero_end(bytes);
    let mut off = 0usize;
    while off < end {
        match segment::frame_at(bytes, off) {
            Ok(body) => {
                let len = HEADER_LEN + body.len();
                match record::decode_body(body, true) {
                    Ok(ev) => {
                        if let Some(what) = segment::link_problem(&ev, expected_seq, &prev) {
                            problems.push(Problem {
                                segment: path.to_path_buf(),
                                offset: off as u64,
                                seq: ev.envelope.seq,
                                what,
                            });
                        }
                        expected_seq = ev.envelope.seq + 1;
                        prev = ev.hash;
                        events.push((path.to_path_buf(), off as u64, ev));
                    }
                    Err(e) => {
                        problems.push(Problem {
                            segment: path.to_path_buf(),
                            offset: off as u64,
                            seq: expected_seq,
                            what: e.to_string(),
                        });
                    }
                }
                off += len;
            }
            Err(what) => {
                problems.push(Problem { segment: path.to_path_buf(), offset: off as u64, seq: expected_seq, what });
                match next_frame(bytes, off + 1, end) {
                    Some(next) => off = next,
                    None => break,
                }
            }
        }
    }
    SegmentAudit { events, problems, expected_seq, prev }
}

fn read(path: &Path) -> Result<Vec<u8>, ScanError> {
    let io = |source| ScanError::Io { path: path.to_path_buf(), source };
    let f = std::fs::File::open(path).map_err(io)?;
    let mut buf = vec![0u8; f.metadata().map_err(io)?.len() as usize];
    f.read_exact_at(&mut buf, 0).map_err(io)?;
    Ok(buf)
}

fn next_frame(bytes: &[u8], from: usize, end: usize) -> Option<usize> {
    (from..end.min(bytes.len().saturating_sub(HEADER_LEN))).find(|&o| segment::frame_at(bytes, o).is_ok())
}

fn resolve_key(
    trusted: TrustedKey,
    events: &[(PathBuf, u64, Event)],
    problems: &mut Vec<Problem>,
) -> (Option<VerifyingKey>, String) {
    let genesis = events.first().filter(|(_, _, e)| e.envelope.seq == 0 && e.envelope.kind == GENESIS_KIND);
    let declared = genesis.and_then(|(_, _, e)| e.envelope.data.get("public_key")?.as_str().map(str::to_string));
    match (trusted, declared) {
        (TrustedKey::Pinned(k, source), declared) => {
            let pinned = hex::encode(k.to_bytes());
            if let (Some(d), Some((seg, off, _))) = (&declared, genesis)
                && *d != pinned
            {
                problems.push(Problem {
                    segment: seg.clone(),
                    offset: *off,
                    seq: 0,
                    what: format!("genesis declares key {d}, but the trusted key ({source}) is {pinned}"),
                });
            }
            (Some(*k), source)
        }
        (TrustedKey::FromGenesis, Some(d)) => match identity::read_public_key(&d) {
            Ok(k) => (Some(k), "genesis event".into()),
            Err(e) => {
                problems.push(genesis_problem(events, format!("genesis key unusable: {e}")));
                (None, "none".into())
            }
        },
        (TrustedKey::FromGenesis, None) => {
            if !events.is_empty() {
                problems.push(genesis_problem(events, "first event is not a genesis event declaring the key".into()));
            }
            (None, "none".into())
        }
    }
}

fn genesis_problem(events: &[(PathBuf, u64, Event)], what: String) -> Problem {
    let (segment, offset) = events.first().map(|(s, o, _)| (s.clone(), *o)).unwrap_or_default();
    Problem { segment, offset, seq: 0, what }
}
