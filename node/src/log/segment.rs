//! Segment files and the scan that turns them back into a chain.
//!
//! A segment is named after the seq of its first record (`00000000000000000042.seg`)
//! and holds records, then possibly zeros: the writer pre-writes zeros ahead of the
//! records and overwrites them in place, so that syncing a batch changes no file size.
//! The records end where a record would start and only zero bytes follow (a length of
//! zero is never valid, so no record can be mistaken for the end). Every segment but
//! the last must be whole; the last may end in a torn write, possibly followed by zeros,
//! which is told apart from damage by looking for any valid record after the first bad
//! one: if one exists, acknowledged data was damaged and the scan fails naming segment,
//! offset and seq; if none does, the bytes are a torn tail.

use super::record::{self, DecodeError, Event, HEADER_LEN, Hash, MAX_BODY, MIN_BODY, ZERO_HASH};
use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use thiserror::Error;

pub const SEGMENT_SUFFIX: &str = ".seg";

/// Where one event lies on disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Position {
    pub segment: u32,
    pub offset: u64,
    pub len: u32,
}

/// An open segment: readers `pread` from it, the writer appends to the last one.
#[derive(Debug)]
pub struct ReadSegment {
    pub first_seq: u64,
    pub path: PathBuf,
    pub file: Arc<File>,
}

/// A torn tail found by the scan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TornTail {
    pub segment: PathBuf,
    pub offset: u64,
    /// From `offset` to the last non-zero byte of the segment.
    pub bytes: u64,
    pub reason: String,
}

#[derive(Debug, Error)]
pub enum ScanError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("segment {segment}, offset {offset}, seq {seq}: {reason}")]
    Corrupt { segment: PathBuf, offset: u64, seq: u64, reason: String },
    #[error("segment {segment}: {reason}")]
    BadSegment { segment: PathBuf, reason: String },
}

/// Everything the scan learnt: enough to serve reads, proofs and appends.
#[derive(Debug, Default)]
pub struct Scan {
    pub segments: Vec<Arc<ReadSegment>>,
    /// Bytes of whole records in the last segment: where the next append goes.
    pub last_len: u64,
    pub positions: Vec<Position>,
    pub hashes: Vec<Hash>,
    /// Event id → where it went, for idempotent retries.
    pub ids: HashMap<String, super::IdEntry>,
    pub torn: Option<TornTail>,
    /// Public key declared by the genesis event, if the log has one.
    pub genesis_key: Option<String>,
}

impl Scan {
    pub fn last_hash(&self) -> Hash {
        self.hashes.last().copied().unwrap_or(ZERO_HASH)
    }
}

pub fn segment_name(first_seq: u64) -> String {
    format!("{first_seq:020}{SEGMENT_SUFFIX}")
}

/// Segment files in `dir`, sorted by first seq.
pub fn list_segments(dir: &Path) -> Result<Vec<(u64, PathBuf)>, ScanError> {
    let io = |source| ScanError::Io { path: dir.to_path_buf(), source };
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(io)? {
        let entry = entry.map_err(io)?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        let Some(stem) = name.strip_suffix(SEGMENT_SUFFIX) else { continue };
        let first = stem.parse::<u64>().ok().filter(|_| stem.len() == 20).ok_or_else(|| ScanError::BadSegment {
            segment: entry.path(),
            reason: "name is not a 20-digit first seq".into(),
        })?;
        out.push((first, entry.path()));
    }
    out.sort();
    Ok(out)
}

/// Reads every segment in `dir`, checking framing, crc, seq continuity and the hash
/// chain. Signatures are left to `log verify`, which needs the whole key story.
pub fn scan(dir: &Path, open_for_write: bool) -> Result<Scan, ScanError> {
    let mut scan = Scan::default();
    scan_more(dir, &mut scan, open_for_write)?;
    Ok(scan)
}

/// Continues `scan` with whatever was appended since: new records at the end of the
/// last known segment and any newer segments. Used by `log tail --follow` to read a
/// log that another process is writing.
pub fn scan_more(dir: &Path, scan: &mut Scan, open_for_write: bool) -> Result<(), ScanError> {
    scan.torn = None;
    let listed = list_segments(dir)?;
    let known = scan.segments.len();
    if listed.len() < known {
        return Err(ScanError::BadSegment {
            segment: dir.to_path_buf(),
            reason: "segments disappeared while reading".into(),
        });
    }
    let count = listed.len();
    for (i, (first_seq, path)) in listed.into_iter().enumerate() {
        let is_last = i + 1 == count;
        let io = |source| ScanError::Io { path: path.clone(), source };
        if i + 1 < known {
            continue;
        }
        let (file, start) = if i + 1 == known {
            (scan.segments[i].file.clone(), scan.last_len)
        } else {
            let expected_first = scan.hashes.len() as u64;
            if first_seq != expected_first {
                return Err(ScanError::BadSegment {
                    segment: path,
                    reason: format!(
                        "starts at seq {first_seq} but the segments before it end before seq {expected_first}"
                    ),
                });
            }
            let file = std::fs::OpenOptions::new().read(true).write(open_for_write).open(&path).map_err(io)?;
            scan.segments.push(Arc::new(ReadSegment { first_seq, path: path.clone(), file: Arc::new(file) }));
            (scan.segments[i].file.clone(), 0)
        };
        let mut attempt = 0;
        let good = loop {
            let bytes = read_from(&file, start).map_err(io)?;
            let accepted = scan.hashes.len();
            match scan_segment(&bytes, start, &path, i as u32, is_last, scan) {
                // A reader racing a live writer can copy a later page of a write before
                // the writer has filled an earlier one, and see zeros between records.
                // Only the writer's own scan (which holds the lock) decides at once.
                Err(ScanError::Corrupt { offset, .. })
                    if !open_for_write
                        && is_last
                        && attempt < READ_RETRIES
                        && zero_header_at(&bytes, (offset - start) as usize) =>
                {
                    scan.hashes.truncate(accepted);
                    scan.positions.truncate(accepted);
                    scan.torn = None;
                    attempt += 1;
                    std::thread::sleep(Duration::from_millis(20));
                }
                r => break r?,
            }
        };
        scan.last_len = start + good;
    }
    Ok(())
}

/// Read-only scans re-read a damaged-looking last segment this many times first.
const READ_RETRIES: u32 = 3;

fn read_from(file: &File, start: u64) -> std::io::Result<Vec<u8>> {
    let len = file.metadata()?.len().saturating_sub(start) as usize;
    let mut buf = vec![0u8; len];
    file.read_exact_at(&mut buf, start)?;
    Ok(buf)
}

/// Scans one segment's bytes (read from file offset `base`); returns the length of
/// their valid prefix.
fn scan_segment(
    bytes: &[u8],
    base: u64,
    path: &Path,
    seg: u32,
    is_last: bool,
    scan: &mut Scan,
) -> Result<u64, ScanError> {
    let end = nonzero_end(bytes);
    let mut off = 0usize;
    while off < end {
        let seq = scan.hashes.len() as u64;
        let problem = match frame_at(bytes, off) {
            Ok(body) => match record::decode_body(body, false) {
                Ok(ev) => match link_problem(&ev, seq, &scan.last_hash()) {
                    // A record with a good crc that breaks the chain was written whole:
                    // that is tampering or misplacement, never a torn write.
                    Some(reason) => return Err(corrupt(path, base + off as u64, seq, reason)),
                    None => {
                        accept(scan, ev, seg, base + off as u64, body.len());
                        off += HEADER_LEN + body.len();
                        continue;
                    }
                },
                Err(e) => return Err(corrupt(path, base + off as u64, seq, format!("crc matches but {e}"))),
            },
            Err(p) => p,
        };
        if is_last && !valid_record_after(bytes, off, end) {
            scan.torn = Some(TornTail {
                segment: path.to_path_buf(),
                offset: base + off as u64,
                bytes: (end - off) as u64,
                reason: problem,
            });
            return Ok(off as u64);
        }
        return Err(corrupt(path, base + off as u64, seq, problem));
    }
    Ok(off as u64)
}

/// True if a record header at `off` would be all zeros: where a reader that races the
/// writer can see a hole (see [`scan_more`]).
pub fn zero_header_at(bytes: &[u8], off: usize) -> bool {
    bytes.get(off..off + HEADER_LEN).is_some_and(|h| h.iter().all(|&b| b == 0))
}

/// One past the last non-zero byte: the bytes from there on are pre-written space.
pub fn nonzero_end(bytes: &[u8]) -> usize {
    const STEP: usize = 4096;
    let mut end = bytes.len();
    // Whole zero blocks first (this loop vectorises), then the last non-zero byte.
    while end > 0 {
        let start = end.saturating_sub(STEP);
        if bytes[start..end].iter().fold(0u8, |a, &b| a | b) != 0 {
            break;
        }
        end = start;
    }
    bytes[..end].iter().rposition(|&b| b != 0).map_or(0, |i| i + 1)
}

fn accept(scan: &mut Scan, ev: Event, seg: u32, off: u64, body_len: usize) {
    if ev.envelope.seq == 0 && ev.envelope.kind == super::GENESIS_KIND {
        scan.genesis_key = ev.envelope.data.get("public_key").and_then(|v| v.as_str()).map(str::to_string);
    }
    let data = crate::canonical::to_vec(&ev.envelope.data).unwrap_or_default();
    let fp = record::fingerprint(&ev.envelope.kind, &ev.envelope.subject, &data);
    scan.ids.insert(ev.envelope.id.clone(), super::IdEntry { seq: ev.envelope.seq, fingerprint: fp, hash: ev.hash });
    scan.positions.push(Position { segment: seg, offset: off, len: (HEADER_LEN + body_len) as u32 });
    scan.hashes.push(ev.hash);
}

fn corrupt(path: &Path, offset: u64, seq: u64, reason: String) -> ScanError {
    ScanError::Corrupt { segment: path.to_path_buf(), offset, seq, reason }
}

/// Why `ev` cannot follow an event with hash `prev` at position `seq`, if it cannot.
pub fn link_problem(ev: &Event, seq: u64, prev: &Hash) -> Option<String> {
    if ev.envelope.seq != seq {
        return Some(format!(
            "record carries seq {} where seq {seq} belongs (reordered, duplicated or missing event)",
            ev.envelope.seq
        ));
    }
    if ev.envelope.prev != record::hash_hex(prev) {
        return Some(format!(
            "prev {} does not match the hash {} of the event before it (broken chain)",
            ev.envelope.prev,
            record::hash_hex(prev)
        ));
    }
    None
}

/// The body of the record at `off`, or why there is no whole, crc-valid one there.
pub fn frame_at(bytes: &[u8], off: usize) -> Result<&[u8], String> {
    let rest = &bytes[off..];
    if rest.len() < HEADER_LEN {
        return Err(format!("{} bytes left, too few for a record header", rest.len()));
    }
    let (len, crc) = record::parse_header(rest);
    if !(MIN_BODY..=MAX_BODY).contains(&len) {
        return Err(format!("record length {len} is outside {MIN_BODY}..={MAX_BODY}"));
    }
    if rest.len() < HEADER_LEN + len {
        return Err(format!(
            "record of {len} bytes runs past the end of the file ({} bytes left)",
            rest.len() - HEADER_LEN
        ));
    }
    let body = &rest[HEADER_LEN..HEADER_LEN + len];
    let actual = crc32c::crc32c(body);
    if actual != crc {
        return Err(format!("crc32c mismatch (stored {crc:08x}, computed {actual:08x})"));
    }
    Ok(body)
}

/// True if any offset after `bad` starts a crc-valid record that decodes: proof that
/// the bad bytes sit in the middle of written data rather than at a torn end. Records
/// start before `end`, the end of the non-zero bytes.
fn valid_record_after(bytes: &[u8], bad: usize, end: usize) -> bool {
    (bad + 1..end.min(bytes.len().saturating_sub(HEADER_LEN)))
        .any(|off| frame_at(bytes, off).map(|b| record::decode_body(b, false).is_ok()).unwrap_or(false))
}

/// Reads the record at `pos` from an open segment.
pub fn read_event(file: &File, pos: Position, path: &Path, seq: u64) -> Result<Event, ScanError> {
    let mut buf = vec![0u8; pos.len as usize];
    file.read_exact_at(&mut buf, pos.offset).map_err(|source| ScanError::Io { path: path.to_path_buf(), source })?;
    let body = frame_at(&buf, 0).map_err(|r| corrupt(path, pos.offset, seq, r))?;
    record::decode_body(body, false).map_err(|e: DecodeError| corrupt(path, pos.offset, seq, e.to_string()))
}
