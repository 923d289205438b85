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

/// Postings are bitmaps: key `tag ‖ name ‖ 0x00 ‖ bucket` (bucket = seq / 256, big
/// endian) holds 32 bytes with one bit per seq of the bucket. Events cluster by kind,
/// run and subject, so a batch of hundreds of events touches a handful of keys; and
/// merging by OR is idempotent, so replaying entries after a crash is harmless. The
/// `last` marker is written after the postings it covers, and on open the postings of
/// the last indexed event are checked to be present before the index is trusted.
pub struct Index {
    db: sled::Db,
}

const KIND: u8 = b'k';
const RUN: u8 = b'r';
const SUBJECT: u8 = b's';

impl Index {
    /// Opens the index at `dir` and reconciles it with `view`.
    pub fn open(dir: &Path, view: &View) -> Result<(Self, Reconciled), IndexError> {
        let (index, damage) = Self::load(dir)?;
        let reconciled = index.reconcile(view, damage)?;
        Ok((index, reconciled))
    }

    /// Opens the index at `dir` as it is. A directory sled cannot open is not worth saving
    /// (the log rebuilds it): it is wiped and opened empty, and why is returned for
    /// [`Index::reconcile`].
    pub fn load(dir: &Path) -> Result<(Self, Option<String>), IndexError> {
        match Self::open_raw(dir) {
            Ok(i) => Ok((i, None)),
            Err(e) => {
                let _ = std::fs::remove_dir_all(dir);
                Ok((Self::open_raw(dir)?, Some(format!("could not open ({e})"))))
            }
        }
    }

    /// The index at `dir`'s last indexed event, read without changing anything but what
    /// sled's own open does; `Ok(None)` when it holds none. For `log verify`, while no
    /// writer holds the log.
    pub fn read_marker(dir: &Path) -> Result<Option<(u64, Hash)>, IndexError> {
        Self::open_raw(dir)?.marker()
    }

    /// The last indexed event, when the index is of this format: every event it has
    /// indexed was durable, so the log must still hold it.
    pub fn marker(&self) -> Result<Option<(u64, Hash)>, IndexError> {
        match self.db.get(KEY_FORMAT)? {
            Some(f) if f.as_ref() == FORMAT => self.last(),
            _ => Ok(None),
        }
    }

    /// Brings the index in line with `view`: caught up from its marker, or rebuilt when it
    /// is missing, damaged (`damage`) or stale.
    pub fn reconcile(&self, view: &View, damage: Option<String>) -> Result<Reconciled, IndexError> {
        let reason = damage.or_else(|| self.staleness(view));
        let outcome = match reason {
            Some(reason) => {
                self.clear()?;
                let events = self.catch_up(view, 0)?;
                Reconciled::Rebuilt { reason, events }
            }
            None => {
                let from = self.last()?.map(|(s, _)| s + 1).unwrap_or(0);
                match self.catch_up(view, from)? {
                    0 => Reconciled::Current,
                    n => Reconciled::CaughtUp(n),
                }
            }
        };
        self.db.flush()?;
        Ok(outcome)
    }

    fn open_raw(dir: &Path) -> Result<Self, IndexError> {
        // No periodic fsync: the index is rebuilt from the log whenever it is behind,
        // so sled's durability buys nothing and its flushes cost CPU on every batch.
        let db = sled::Config::new().path(dir).mode(sled::Mode::HighThroughput).flush_every_ms(None).open()?;
        db.set_merge_operator(or_bitmaps);
        Ok(Self { db })
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
                Some(_) => self.missing_postings(view, seq),
            },
            Err(e) => Some(format!("unreadable ({e})")),
        }
    }

    /// The marker says `seq` is indexed; check that its postings really are there.
    fn missing_postings(&self, view: &View, seq: u64) -> Option<String> {
        let ev = match view.event(seq) {
            Ok(ev) => ev,
            Err(e) => return Some(format!("cannot read seq {seq} to check the index: {e}")),
        };
        let has = |q: Query| self.query(&q).map(|seqs| seqs.binary_search(&seq).is_ok()).unwrap_or(false);
        if has(Query::Kind(ev.envelope.kind)) && has(Query::Subject(ev.envelope.subject)) {
            None
        } else {
            Some(format!("its marker covers seq {seq} but the postings for it are missing"))
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
            let entries: Vec<IndexEntry> = events
                .into_iter()
                .map(|ev| {
                    let run = ev.envelope.data.get("run_id").and_then(|v| v.as_str()).map(str::to_string);
                    IndexEntry {
                        seq: ev.envelope.seq,
                        hash: ev.hash,
                        kind: ev.envelope.kind,
                        subject: ev.envelope.subject,
                        run,
                    }
                })
                .collect();
            self.apply(&entries)?;
            seq = end;
        }
        Ok(view.len().saturating_sub(from))
    }

    /// Adds entries (in seq order) and moves the `last` marker to the final one.
    pub fn apply(&self, entries: &[IndexEntry]) -> Result<(), IndexError> {
        let mut postings: HashMap<Vec<u8>, [u8; BUCKET_BYTES]> = HashMap::new();
        for e in entries {
            let mut add = |tag, name: &str| {
                let bits = postings.entry(key(tag, name, e.seq)).or_insert([0; BUCKET_BYTES]);
                let bit = (e.seq % BUCKET) as usize;
                bits[bit / 8] |= 1 << (bit % 8);
            };
            add(KIND, &e.kind);
            add(SUBJECT, &e.subject);
            if let Some(run) = &e.run {
                add(RUN, run);
            }
        }
        for (k, bits) in postings {
            self.db.merge(k, bits)?;
        }
        if let Some(last) = entries.last() {
            let mut v = last.seq.to_be_bytes().to_vec();
            v.extend_from_slice(&last.hash);
            let mut batch = sled::Batch::default();
            batch.insert(KEY_FORMAT, FORMAT);
            batch.insert(KEY_LAST, v);
            self.db.apply_batch(batch)?;
        }
        Ok(())
    }

    pub fn query(&self, q: &Query) -> Result<Vec<u64>, IndexError> {
        let (tag, name) = match q {
            Query::Kind(k) => (KIND, k),
            Query::Run(r) => (RUN, r),
            Query::Subject(s) => (SUBJECT, s),
        };
        let mut prefix = key(tag, name, 0);
        prefix.truncate(prefix.len() - 8);
        let mut out = Vec::new();
        for item in self.db.scan_prefix(&prefix) {
            let (k, bits) = item?;
            let Some(bucket) = k.get(prefix.len()..).and_then(|t| <[u8; 8]>::try_from(t).ok()) else { continue };
            let base = u64::from_be_bytes(bucket) * BUCKET;
            for (i, byte) in bits.iter().enumerate().take(BUCKET_BYTES) {
                for b in 0..8 {
                    if byte & (1 << b) != 0 {
                        out.push(base + (i * 8 + b) as u64);
                    }
                }
            }
        }
        Ok(out)
    }

    pub fn flush(&self) -> Result<(), IndexError> {
        self.db.flush()?;
        Ok(())
    }
}

const BUCKET: u64 = 256;
const BUCKET_BYTES: usize = (BUCKET / 8) as usize;

fn or_bitmaps(_key: &[u8], old: Option<&[u8]>, new: &[u8]) -> Option<Vec<u8>> {
    let mut out = old.map(<[u8]>::to_vec).unwrap_or_else(|| vec![0; BUCKET_BYTES]);
    out.resize(BUCKET_BYTES, 0);
    for (o, n) in out.iter_mut().zip(new) {
        *o |= n;
    }
    Some(out)
}

/// `tag ‖ name ‖ 0x00 ‖ bucket (big-endian)`: prefix scans by name come out sorted by
/// seq. The marker keys (`format`, `last`) start with other bytes than the tags.
fn key(tag: u8, name: &str, seq: u64) -> Vec<u8> {
    let mut k = Vec::with_capacity(name.len() + 10);
    k.push(tag);
    k.extend_from_slice(name.as_bytes());
    k.push(0);
    k.extend_from_slice(&(seq / BUCKET).to_be_bytes());
    k
}

#[cfg(test)]
mod tests {
    use super::super::tests::copy_dir;
    use super::super::{AppendRequest, EventLog, GENESIS_KIND, INDEX_DIR, LOG_DIR, LogOptions, OpenError};
    use super::{Query, Reconciled};
    use crate::identity::Identity;
    use serde_json::json;
    use std::path::Path;

    fn open(dir: &Path) -> (EventLog, Reconciled) {
        let (key, opts) = (Identity::from_seed([12; 32]), LogOptions::default());
        let opened =
            if dir.join(LOG_DIR).exists() { EventLog::open(dir, key, opts) } else { EventLog::create(dir, key, opts) };
        let (log, report) = opened.unwrap();
        (log, report.index)
    }

    fn refused(dir: &Path) -> OpenError {
        EventLog::open(dir, Identity::from_seed([12; 32]), LogOptions::default()).err().expect("must refuse")
    }

    /// Appends `n` `train.progress` events for runs `run-0..3` in turn (seqs 1..=n after
    /// the genesis event), with `step` offset by `offset` so two logs can differ in content.
    fn fill(log: &EventLog, n: u64, offset: u64) {
        for i in 0..n {
            let run = format!("run-{}", i % 3);
            let data = json!({"run_id": run, "step": i + offset});
            log.append(AppendRequest::new("train.progress", run.clone(), data)).unwrap();
        }
    }

    fn seqs(log: &EventLog, q: Query) -> Vec<u64> {
        log.query(&q).unwrap()
    }

    fn replace_index(from: &Path, to: &Path) {
        std::fs::remove_dir_all(to.join(INDEX_DIR)).unwrap();
        copy_dir(&from.join(INDEX_DIR), &to.join(INDEX_DIR));
    }

    /// The index only ever covers durable events: one that names an event the log lacks,
    /// or another event at the same seq, says the log lost events or was replaced. The
    /// open is refused, naming it, and changes nothing; an index that is not this log's
    /// is removed by hand (it is rebuilt from the log).
    #[test]
    fn an_index_of_another_or_longer_log_refuses_the_open_until_it_is_removed() {
        let dir = tempfile::tempdir().unwrap();
        let twin = tempfile::tempdir().unwrap();
        let longer = tempfile::tempdir().unwrap();
        {
            let (log, _) = open(dir.path());
            fill(&log, 9, 0);
        }
        {
            // As many events, other contents: the index's last seq exists in `dir`'s log,
            // but with another hash.
            let (log, _) = open(twin.path());
            fill(&log, 9, 100);
        }
        {
            let (log, _) = open(longer.path());
            fill(&log, 9, 100);
            log.append(AppendRequest::new("other.kind", "elsewhere", json!({"run_id": "run-x"}))).unwrap();
        }
        let segment = std::fs::read(dir.path().join(LOG_DIR).join(super::super::segment::segment_name(0))).unwrap();
        replace_index(twin.path(), dir.path());
        let msg = refused(dir.path()).to_string();
        assert!(msg.contains("the index's last indexed event") && msg.contains("replaced or rewritten"), "{msg}");
        replace_index(longer.path(), dir.path());
        let msg = refused(dir.path()).to_string();
        assert!(msg.contains("holds 10 events") && msg.contains("Events 10..=10 are missing"), "{msg}");
        let now = std::fs::read(dir.path().join(LOG_DIR).join(super::super::segment::segment_name(0))).unwrap();
        assert_eq!(now, segment, "nothing was changed");

        // Removed, the index is rebuilt from the log, and none of the other's postings survive.
        std::fs::remove_dir_all(dir.path().join(INDEX_DIR)).unwrap();
        let (log, reconciled) = open(dir.path());
        assert!(matches!(&reconciled, Reconciled::Rebuilt { events: 10, .. }), "{reconciled:?}");
        assert!(seqs(&log, Query::Kind("other.kind".into())).is_empty());
        assert_eq!(seqs(&log, Query::Kind("train.progress".into())), (1..=9).collect::<Vec<_>>());
        assert_eq!(seqs(&log, Query::Kind(GENESIS_KIND.into())), vec![0]);
        assert_eq!(seqs(&log, Query::Run("run-1".into())), vec![2, 5, 8]);
        assert_eq!(seqs(&log, Query::Subject("run-2".into())), vec![3, 6, 9]);
        drop(log);
        let (_, reconciled) = open(dir.path());
        assert_eq!(reconciled, Reconciled::Current);
    }

    #[test]
    fn an_index_behind_the_log_catches_up() {
        let dir = tempfile::tempdir().unwrap();
        let saved = tempfile::tempdir().unwrap();
        {
            let (log, _) = open(dir.path());
            fill(&log, 6, 0);
        }
        copy_dir(&dir.path().join(INDEX_DIR), &saved.path().join(INDEX_DIR));
        {
            let (log, reconciled) = open(dir.path());
            assert_eq!(reconciled, Reconciled::Current);
            fill(&log, 3, 6); // seqs 7..=9, runs 0, 1, 2
            for i in 0..2 {
                let data = json!({"run_id": "run-1", "step": i});
                log.append(AppendRequest::new("checkpoint.saved", format!("ckpt-{i}"), data)).unwrap();
            }
        }
        // The index as it was after seq 6: five events behind.
        replace_index(saved.path(), dir.path());
        let (log, reconciled) = open(dir.path());
        assert_eq!(log.len(), 12);
        assert_eq!(reconciled, Reconciled::CaughtUp(5));
        assert_eq!(seqs(&log, Query::Kind("train.progress".into())), (1..=9).collect::<Vec<_>>());
        assert_eq!(seqs(&log, Query::Kind("checkpoint.saved".into())), vec![10, 11]);
        assert_eq!(seqs(&log, Query::Run("run-1".into())), vec![2, 5, 8, 10, 11]);
        assert_eq!(seqs(&log, Query::Run("run-0".into())), vec![1, 4, 7]);
        assert_eq!(seqs(&log, Query::Subject("ckpt-1".into())), vec![11]);
        assert_eq!(seqs(&log, Query::Subject("run-2".into())), vec![3, 6, 9]);
    }
}
