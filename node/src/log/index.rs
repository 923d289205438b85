//! Secondary index over the log in sled 0.34.7: seqs by kind, by run id and by
//! subject.
//!
//! The index stores the last `(seq, hash)` it covered. On open it is compared with
//! the segments: matching → catch up from there; ahead of the log, pointing at a
//! different hash, unreadable or of another format version → wiped and rebuilt from
//! the segments. sled's own durability is not relied on (its 0.34 line lacks crash
//! consistency fixes), which is safe because nothing here is a source of truth.

use super::record::Hash;
use super::{IndexEntry, View};
use std::collections::HashMap;
use std::path::Path;
use thiserror::Error;

const FORMAT: &[u8] = b"mindxtrain-index-v1";
const KEY_FORMAT: &[u8] = b"format";
const KEY_LAST: &[u8] = b"last";

#[derive(Debug, Error)]
pub enum IndexError {
    #[error("sled: {0}")]
    Sled(#[from] sled::Error),
    #[error("cannot rebuild the index: {0}")]
    Rebuild(String),
    #[error("index has covered {indexed} events, waited for {wanted}")]
    Lagging { indexed: u64, wanted: u64 },
}

/// What a query selects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Query {
    Kind(String),
    Run(String),
    Subject(String),
}

/// How the index was brought in line with the log at open.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Reconciled {
    /// It already covered every event.
    #[default]
    Current,
    /// It was behind and indexed this many events.
    CaughtUp(u64),
    /// It was missing, stale or damaged and was rebuilt from the segments.
    Rebuilt { reason: String, events: u64 },
}

pub struct Index {
    db: sled::Db,
    by_kind: sled::Tree,
    by_run: sled::Tree,
    by_subject: sled::Tree,
}

impl Index {
    /// Opens the index at `dir` and reconciles it with `view`.
    pub fn open(dir: &Path, view: &View) -> Result<(Self, Reconciled), IndexError> {
        let (index, damage) = match Self::open_raw(dir) {
            Ok(i) => (i, None),
            Err(e) => {
                // A damaged sled directory is not worth saving: the log rebuilds it.
                let _ = std::fs::remove_dir_all(dir);
                (Self::open_raw(dir)?, Some(format!("could not open ({e})")))
            }
        };
        let reason = damage.or_else(|| index.staleness(view));
        let outcome = match reason {
            Some(reason) => {
                index.clear()?;
                let events = index.catch_up(view, 0)?;
                Reconciled::Rebuilt { reason, events }
            }
            None => {
                let from = index.last()?.map(|(s, _)| s + 1).unwrap_or(0);
                match index.catch_up(view, from)? {
                    0 => Reconciled::Current,
                    n => Reconciled::CaughtUp(n),
                }
            }
        };
        index.db.flush()?;
        Ok((index, outcome))
    }

    fn open_raw(dir: &Path) -> Result<Self, IndexError> {
        let db = sled::Config::new().path(dir).open()?;
        Ok(Self {
            by_kind: db.open_tree("by_kind")?,
            by_run: db.open_tree("by_run")?,
            by_subject: db.open_tree("by_subject")?,
            db,
        })
    }

    /// Why the stored index cannot be trusted to continue from, if it cannot.
    fn staleness(&self, view: &View) -> Option<String> {
        match self.db.get(KEY_FORMAT) {
            Ok(Some(f)) if f.as_ref() == FORMAT => {}
            Ok(None) if self.db.is_empty() => return Some("missing".into()),
            Ok(_) => return Some("written by another format version".into()),
            Err(e) => return Some(format!("unreadable ({e})")),
        }
        match self.last() {
            Ok(None) => None,
            Ok(Some((seq, hash))) => match view.hash(seq) {
                None => Some(format!("covers seq {seq} but the log holds {} events", view.len())),
                Some(h) if h != hash => Some(format!("its hash for seq {seq} differs from the log's")),
                Some(_) => None,
            },
            Err(e) => Some(format!("unreadable ({e})")),
        }
    }

    fn last(&self) -> Result<Option<(u64, Hash)>, IndexError> {
        Ok(self.db.get(KEY_LAST)?.and_then(|v| {
            let seq = u64::from_be_bytes(v.get(..8)?.try_into().ok()?);
            let hash: Hash = v.get(8..40)?.try_into().ok()?;
            Some((seq, hash))
        }))
    }

    fn clear(&self) -> Result<(), IndexError> {
        for t in [&self.by_kind, &self.by_run, &self.by_subject] {
            t.clear()?;
        }
        self.db.clear()?;
        self.db.insert(KEY_FORMAT, FORMAT)?;
        Ok(())
    }

    /// Indexes events `from..` by reading them from the segments.
    fn catch_up(&self, view: &View, from: u64) -> Result<u64, IndexError> {
        const CHUNK: u64 = 4096;
        let mut seq = from;
        while seq < view.len() {
            let end = (seq + CHUNK).min(view.len());
            let events = view.range(seq, end).map_err(|e| IndexError::Rebuild(e.to_string()))?;
            let mut hashes = HashMap::new();
            let entries: Vec<IndexEntry> = events
                .into_iter()
                .map(|ev| {
                    hashes.insert(ev.envelope.seq, ev.hash);
                    let run = ev.envelope.data.get("run_id").and_then(|v| v.as_str()).map(str::to_string);
                    IndexEntry { seq: ev.envelope.seq, kind: ev.envelope.kind, subject: ev.envelope.subject, run }
                })
                .collect();
            self.apply(&entries, &hashes)?;
            seq = end;
        }
        Ok(view.len().saturating_sub(from))
    }

    /// Adds entries (in seq order) and moves the `last` marker to the final one.
    pub fn apply(&self, entries: &[IndexEntry], hashes: &HashMap<u64, Hash>) -> Result<(), IndexError> {
        let (mut kinds, mut runs, mut subjects) = (sled::Batch::default(), sled::Batch::default(), sled::Batch::default());
        for e in entries {
            kinds.insert(key(&e.kind, e.seq), &[]);
            subjects.insert(key(&e.subject, e.seq), &[]);
            if let Some(run) = &e.run {
                runs.insert(key(run, e.seq), &[]);
            }
        }
        self.by_kind.apply_batch(kinds)?;
        self.by_run.apply_batch(runs)?;
        self.by_subject.apply_batch(subjects)?;
        if let Some(last) = entries.last() {
            if let Some(h) = hashes.get(&last.seq) {
                let mut v = last.seq.to_be_bytes().to_vec();
                v.extend_from_slice(h);
                self.db.insert(KEY_FORMAT, FORMAT)?;
                self.db.insert(KEY_LAST, v)?;
            }
        }
        Ok(())
    }

    pub fn query(&self, q: &Query) -> Result<Vec<u64>, IndexError> {
        let (tree, name) = match q {
            Query::Kind(k) => (&self.by_kind, k),
            Query::Run(r) => (&self.by_run, r),
            Query::Subject(s) => (&self.by_subject, s),
        };
        let mut prefix = name.as_bytes().to_vec();
        prefix.push(0);
        let mut out = Vec::new();
        for item in tree.scan_prefix(&prefix) {
            let (k, _) = item?;
            if let Some(tail) = k.get(prefix.len()..).and_then(|t| <[u8; 8]>::try_from(t).ok()) {
                out.push(u64::from_be_bytes(tail));
            }
        }
        Ok(out)
    }

    pub fn flush(&self) -> Result<(), IndexError> {
        self.db.flush()?;
        Ok(())
    }
}

/// `name ‖ 0x00 ‖ seq (big-endian)`: prefix scans by name, sorted by seq.
fn key(name: &str, seq: u64) -> Vec<u8> {
    let mut k = Vec::with_capacity(name.len() + 9);
    k.extend_from_slice(name.as_bytes());
    k.push(0);
    k.extend_from_slice(&seq.to_be_bytes());
    k
}
