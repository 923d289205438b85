//! `log verify`: a strict, read-only audit of every byte of the log.
//!
//! Unlike the open-time scan, which stops at the first problem, the audit keeps
//! going and lists every problem it can locate: bad framing or crc, non-canonical
//! envelopes, seq gaps and reorderings, broken `prev` links, and signatures that do
//! not verify under the log's key. After damaged bytes it resynchronises on the next
//! crc-valid record so one flipped byte does not hide the rest of the log. Zeros after
//! the last record of a segment are pre-written space, not a problem.

use super::record::{self, Event, HEADER_LEN, Hash, ZERO_HASH};
use super::segment::{self, ScanError};
use super::{GENESIS_KIND, LOG_DIR};
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
}

impl Report {
    pub fn ok(&self) -> bool {
        self.problems.is_empty()
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
    let listed = segment::list_segments(&dir)?;
    let mut problems = Vec::new();
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
    problems.sort_by_key(|p| (p.seq, p.offset));
    let leaves: Vec<Hash> = events.iter().map(|(_, _, e)| merkle::leaf_hash(&e.hash)).collect();
    Ok(Report {
        events: events.len() as u64,
        segments: listed.len(),
        root: hex::encode(merkle::root(&leaves)),
        key: key.map(|k| hex::encode(k.to_bytes())),
        key_source,
        problems,
    })
}

const READ_RETRIES: u32 = 3;

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
