//! Group commit: many appenders, one fdatasync.
//!
//! Two threads form a pipeline. The *sequencer* drains every waiting request, checks
//! ids and expected seqs, builds and signs the envelopes (in parallel), and writes
//! the whole batch with one `write`. The *syncer* takes every written batch, calls
//! `fdatasync` once for all of them, and only then publishes the events to readers and
//! answers the appenders. While one batch syncs, the next is being prepared, so the
//! disk and the CPUs work at the same time.
//!
//! An fsync error stops the writer for good: after a failed fsync the kernel may have
//! dropped dirty pages, so nothing written since the last good sync can be vouched for.

use super::record::{self, EncodeError, EnvelopeParts, Hash};
use super::segment::{self, Position};
use super::{AppendError, AppendRequest, Appended, IdEntry, IndexEntry, ReadSegment, Shared};
use crate::fsutil;
use crate::identity::Identity;
use rand_chacha::ChaCha12Rng;
use rand_chacha::rand_core::{RngCore, SeedableRng};
use rayon::prelude::*;
use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::mpsc::{Receiver, Sender};
use tokio::sync::oneshot;

/// Most requests folded into one batch; bounds latency and memory per sync.
const MAX_BATCH: usize = 8192;
/// Below this many records, signing on the calling thread beats a rayon hand-off.
const PARALLEL_SIGN_MIN: usize = 16;

pub(crate) type Reply = oneshot::Sender<Result<Appended, AppendError>>;

pub(crate) struct Request {
    pub req: Encoded,
    pub reply: Reply,
}

/// An append request checked and encoded on the appender's own thread, so that the
/// single sequencer thread only assigns seqs, chains hashes and writes.
pub(crate) struct Encoded {
    kind: String,
    subject: String,
    data: Vec<u8>,
    fingerprint: Hash,
    run: Option<String>,
    id: Option<String>,
    expected_seq: Option<u64>,
}

impl Encoded {
    pub fn new(req: AppendRequest) -> Result<Encoded, AppendError> {
        record::validate_kind(&req.kind)?;
        if req.subject.len() > 256 {
            return Err(EncodeError::SubjectTooLong(req.subject.len()).into());
        }
        if let Some(id) = &req.id {
            record::validate_id(id)?;
        }
        let data = record::canonical_data(&req.data)?;
        let fingerprint = record::fingerprint(&req.kind, &req.subject, &data);
        let run = req.data.get("run_id").and_then(|v| v.as_str()).map(str::to_string);
        Ok(Encoded {
            kind: req.kind,
            subject: req.subject,
            data,
            fingerprint,
            run,
            id: req.id,
            expected_seq: req.expected_seq,
        })
    }
}

/// Written, not yet synced.
pub(crate) struct Batch {
    file: Arc<File>,
    new_segment: Option<Arc<ReadSegment>>,
    events: Vec<(Hash, Position)>,
    index: Vec<IndexEntry>,
    replies: Vec<(Reply, Result<Appended, AppendError>)>,
}

pub(crate) struct Sequencer {
    pub key: Identity,
    pub next_seq: u64,
    pub prev: Hash,
    pub ids: HashMap<String, IdEntry>,
    pub file: Arc<File>,
    pub seg_index: u32,
    pub seg_len: u64,
    pub max_segment: u64,
    pub dir: PathBuf,
    pub shared: Arc<Shared>,
    pub ids_rng: IdRng,
}

/// Random 128-bit ids for appends that bring none: a CSPRNG seeded once from the OS,
/// instead of a system call per event.
pub(crate) struct IdRng(ChaCha12Rng);

impl IdRng {
    pub fn from_os() -> IdRng {
        let mut seed = [0u8; 32];
        // An OS without randomness cannot run a node; fall back to time-derived bytes
        // rather than panic, since ids only need to be unique per log.
        if getrandom::fill(&mut seed).is_err() {
            let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
            seed[..16].copy_from_slice(&t.as_nanos().to_le_bytes());
        }
        IdRng(ChaCha12Rng::from_seed(seed))
    }

    fn next_id(&mut self) -> String {
        let mut b = [0u8; 16];
        self.0.fill_bytes(&mut b);
        hex::encode(b)
    }
}

/// A request that passed validation and got its seq, waiting to be signed.
struct Sequenced {
    seq: u64,
    envelope: Vec<u8>,
    hash: Hash,
    index: IndexEntry,
    id: String,
}

struct Pending {
    ev: Sequenced,
    reply: Reply,
}

enum Outcome {
    New(Sequenced),
    Duplicate(Appended),
}

impl Sequencer {
    pub fn run(mut self, rx: Receiver<Request>, to_syncer: Sender<Batch>) {
        while let Ok(first) = rx.recv() {
            let mut reqs = vec![first];
            while reqs.len() < MAX_BATCH {
                match rx.try_recv() {
                    Ok(r) => reqs.push(r),
                    Err(_) => break,
                }
            }
            if let Some(reason) = self.shared.stopped() {
                for r in reqs {
                    let _ = r.reply.send(Err(AppendError::Stopped(reason.clone())));
                }
                continue;
            }
            if let Some(batch) = self.prepare(reqs)
                && to_syncer.send(batch).is_err()
            {
                return;
            }
        }
    }

    /// Sequences, seals and writes one batch; `None` if nothing needs a sync.
    fn prepare(&mut self, reqs: Vec<Request>) -> Option<Batch> {
        let time = humantime::format_rfc3339_micros(std::time::SystemTime::now()).to_string();
        let mut pending: Vec<Pending> = Vec::with_capacity(reqs.len());
        let mut replies: Vec<(Reply, Result<Appended, AppendError>)> = Vec::new();
        let (start_seq, start_prev) = (self.next_seq, self.prev);
        for Request { req, reply } in reqs {
            match self.sequence(req, &time) {
                Ok(Outcome::New(ev)) => pending.push(Pending { ev, reply }),
                // A duplicate is answered only after this batch's sync, which also
                // covers its original if that is still in flight.
                Ok(Outcome::Duplicate(a)) => replies.push((reply, Ok(a))),
                Err(e) => {
                    let _ = reply.send(Err(e));
                }
            }
        }
        if pending.is_empty() && replies.is_empty() {
            return None;
        }
        let seal = |p: &Pending| record::frame(&p.ev.envelope, &self.key.sign(&record::signing_message(&p.ev.hash)));
        let framed: Vec<Vec<u8>> = if pending.len() >= PARALLEL_SIGN_MIN {
            pending.par_iter().map(seal).collect()
        } else {
            pending.iter().map(seal).collect()
        };
        let new_segment = match self.rotate_if_full(start_seq, !pending.is_empty()) {
            Ok(s) => s,
            Err(e) => {
                self.rollback(&pending, start_seq, start_prev);
                return Some(self.fail_batch(pending, replies, format!("cannot start a new segment: {e}")));
            }
        };
        let mut buf = Vec::with_capacity(framed.iter().map(Vec::len).sum());
        let mut events = Vec::with_capacity(pending.len());
        for (p, record) in pending.iter().zip(&framed) {
            let offset = self.seg_len + buf.len() as u64;
            events.push((p.ev.hash, Position { segment: self.seg_index, offset, len: record.len() as u32 }));
            buf.extend_from_slice(record);
        }
        if let Err(e) = (&*self.file).write_all(&buf) {
            // Undo a partial write so the file ends on a record boundary again; if even
            // that fails the tail is unknown and the writer must stop.
            if let Err(t) = self.file.set_len(self.seg_len) {
                self.shared.stop(format!("write failed ({e}) and truncating back failed ({t})"));
            }
            self.rollback(&pending, start_seq, start_prev);
            return Some(self.fail_batch(pending, replies, format!("write failed, nothing stored: {e}")));
        }
        self.seg_len += buf.len() as u64;
        let mut index = Vec::with_capacity(pending.len());
        for Pending { ev, reply } in pending {
            index.push(ev.index);
            replies.push((reply, Ok(Appended { seq: ev.seq, hash: ev.hash, duplicate: false })));
        }
        Some(Batch { file: self.file.clone(), new_segment, events, index, replies })
    }

    fn sequence(&mut self, req: Encoded, time: &str) -> Result<Outcome, AppendError> {
        let fp = req.fingerprint;
        let id = match req.id {
            Some(id) => {
                if let Some(orig) = self.ids.get(&id) {
                    if orig.fingerprint != fp {
                        return Err(AppendError::IdConflict { id, seq: orig.seq });
                    }
                    return Ok(Outcome::Duplicate(Appended { seq: orig.seq, hash: orig.hash, duplicate: true }));
                }
                id
            }
            None => self.ids_rng.next_id(),
        };
        if let Some(expected) = req.expected_seq
            && expected != self.next_seq
        {
            return Err(AppendError::SeqMismatch { expected, next: self.next_seq });
        }
        let seq = self.next_seq;
        let envelope = record::canonical_envelope(
            &EnvelopeParts { seq, prev: &self.prev, time, kind: &req.kind, subject: &req.subject, id: &id },
            &req.data,
        );
        let hash = *blake3::hash(&envelope).as_bytes();
        self.ids.insert(id.clone(), IdEntry { seq, fingerprint: fp, hash });
        self.prev = hash;
        self.next_seq += 1;
        let index = IndexEntry { seq, hash, kind: req.kind, subject: req.subject, run: req.run };
        Ok(Outcome::New(Sequenced { seq, envelope, hash, index, id }))
    }

    fn rollback(&mut self, pending: &[Pending], seq: u64, prev: Hash) {
        for p in pending {
            self.ids.remove(&p.ev.id);
        }
        self.next_seq = seq;
        self.prev = prev;
    }

    fn fail_batch(
        &self,
        pending: Vec<Pending>,
        mut replies: Vec<(Reply, Result<Appended, AppendError>)>,
        reason: String,
    ) -> Batch {
        for p in pending {
            replies.push((p.reply, Err(AppendError::Io(reason.clone()))));
        }
        Batch { file: self.file.clone(), new_segment: None, events: vec![], index: vec![], replies }
    }

    /// Starts a new segment once the current one is full. The old segment is synced
    /// first: only the last segment may ever end torn.
    fn rotate_if_full(&mut self, first_seq: u64, has_records: bool) -> std::io::Result<Option<Arc<ReadSegment>>> {
        if self.seg_len < self.max_segment || !has_records {
            return Ok(None);
        }
        self.file.sync_data()?;
        let path = self.dir.join(segment::segment_name(first_seq));
        let file = OpenOptions::new().create_new(true).read(true).append(true).open(&path)?;
        fsutil::sync_dir(&self.dir)?;
        let file = Arc::new(file);
        self.file = file.clone();
        self.seg_index += 1;
        self.seg_len = 0;
        Ok(Some(Arc::new(ReadSegment { first_seq, path, file })))
    }
}

/// Syncs written batches and answers their appenders.
pub(crate) fn run_syncer(rx: Receiver<Batch>, shared: Arc<Shared>, to_indexer: Sender<Vec<IndexEntry>>) {
    while let Ok(first) = rx.recv() {
        let mut batches = vec![first];
        while let Ok(b) = rx.try_recv() {
            batches.push(b);
        }
        let mut result = Ok(());
        let mut synced: Vec<*const File> = Vec::new();
        for b in &batches {
            let ptr = Arc::as_ptr(&b.file);
            // Batches without new records need no sync of their own: a duplicate's
            // original was written by an earlier batch, synced first.
            if b.events.is_empty() || synced.contains(&ptr) {
                continue;
            }
            #[cfg(test)]
            if let Some(kind) = shared.inject_sync_error.lock().unwrap_or_else(|e| e.into_inner()).take() {
                result = Err(std::io::Error::new(kind, "injected fdatasync failure"));
                break;
            }
            if let Err(e) = b.file.sync_data() {
                result = Err(e);
                break;
            }
            synced.push(ptr);
        }
        shared.count_sync();
        match result {
            Ok(()) => {
                for b in batches {
                    shared.publish(b.new_segment, &b.events);
                    if !b.index.is_empty() {
                        let _ = to_indexer.send(b.index);
                    }
                    for (reply, r) in b.replies {
                        let _ = reply.send(r);
                    }
                }
            }
            Err(e) => {
                let reason = format!("fdatasync failed: {e}; the writer stopped and acknowledges nothing more");
                tracing::error!("{reason}");
                shared.stop(reason.clone());
                for b in batches {
                    for (reply, _) in b.replies {
                        let _ = reply.send(Err(AppendError::Stopped(reason.clone())));
                    }
                }
            }
        }
    }
}
