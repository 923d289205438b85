//! Group commit: many appenders, one fdatasync.
//!
//! Threads form a pipeline. The *sequencer* drains every waiting request, checks ids
//! and expected seqs, and builds and hashes the envelopes, which chains them; the
//! batch's signatures are then made by the *signer* threads while the sequencer goes
//! on with the next batch (signing is most of the CPU an event costs, and it needs only
//! the hash). Signers do nothing else and sleep on their channels when idle: on the
//! rayon pool, shared with other work, signing took more CPU (idle workers spin) and
//! gave fewer appends per second at 256 appenders (docs/benchmarks.md). Batches whose
//! signatures are all back are written in order, as many as are ready with one
//! `write`. The *syncer* takes every written batch, calls `fdatasync` once for all of
//! them, and only then publishes the events to readers and answers the appenders.
//! While one batch syncs, the next ones are being signed and written, so the disk and
//! the CPUs work at the same time.
//!
//! An fsync error stops the writer for good: after a failed fsync the kernel may have
//! dropped dirty pages, so nothing written since the last good sync can be vouched for;
//! batches written meanwhile are refused too. A failed `write` refuses its batch and
//! every batch sequenced after it (their records chain on it), and the next append
//! takes the first refused seq.
//!
//! Records are written in place into space pre-written with zeros ahead of them (see
//! [`segment`]): when a batch runs past that space, zeros are written after it as well, in
//! steps that double from 64 KiB to 4 MiB. The `fdatasync` of a batch that only overwrites
//! allocated blocks has no file size or extent change to journal, which makes it cheaper
//! than the `fdatasync` of an append; only one batch per step pays for the growth.

use super::record::{self, EncodeError, EnvelopeParts, Hash, SIG_LEN};
use super::segment::{self, Position};
use super::{AppendError, AppendRequest, Appended, IdEntry, IndexEntry, ReadSegment, Shared, WriterTimes};
use crate::fsutil;
use crate::identity::Identity;
use rand_chacha::ChaCha12Rng;
use rand_chacha::rand_core::{RngCore, SeedableRng};
use std::collections::{HashMap, VecDeque};
use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, Sender};
use std::thread::JoinHandle;
use std::time::Instant;
use tokio::sync::oneshot;

/// Most requests folded into one batch; bounds latency and memory per sync.
const MAX_BATCH: usize = 8192;
/// Fewest records a signer is handed: one signature takes tens of µs, far more than
/// handing records to another thread.
const SIGN_CHUNK_MIN: usize = 2;
/// Pre-written space grows by the segment's current size, within these bounds.
const GROW_MIN: u64 = 64 << 10;
const GROW_MAX: u64 = 4 << 20;
static ZEROS: [u8; 1 << 20] = [0; 1 << 20];

/// Where the writer threads spend their time (nanoseconds since open).
#[derive(Default)]
pub(crate) struct Clock {
    sequence: AtomicU64,
    sign: AtomicU64,
    signers: AtomicU64,
    write: AtomicU64,
    sync: AtomicU64,
    ack: AtomicU64,
    batches: AtomicU64,
}

impl Clock {
    /// Adds the time since `since` to `stage` and returns now.
    fn lap(stage: &AtomicU64, since: Instant) -> Instant {
        let now = Instant::now();
        stage.fetch_add((now - since).as_nanos() as u64, Ordering::Relaxed);
        now
    }

    pub fn times(&self) -> WriterTimes {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        WriterTimes {
            sequence_ns: get(&self.sequence),
            sign_ns: get(&self.sign),
            signers_ns: get(&self.signers),
            write_ns: get(&self.write),
            sync_ns: get(&self.sync),
            ack_ns: get(&self.ack),
            batches: get(&self.batches),
        }
    }
}

pub(crate) type Reply = oneshot::Sender<Result<Appended, AppendError>>;

pub(crate) struct Request {
    pub req: Encoded,
    pub reply: Reply,
}

/// What the sequencer thread receives.
pub(crate) enum Input {
    Append(Request),
    /// A signer's signatures for records `start..` of batch `batch`, in order.
    Signed {
        batch: u64,
        start: usize,
        sigs: Vec<[u8; SIG_LEN]>,
    },
    /// The log is being closed: finish what is in flight, then stop.
    Close,
}

/// Records of one batch for one signer to sign.
struct SignJob {
    batch: u64,
    start: usize,
    hashes: Vec<Hash>,
}

/// Threads that only sign, each fed its own share of every batch.
pub(crate) struct Signers {
    jobs: Vec<Sender<SignJob>>,
    /// Where the next batch's first share goes, so small batches spread over all signers.
    next: usize,
}

impl Signers {
    /// Starts `count` signer threads (at least one) that answer on `to_sequencer`; each
    /// stops once the sequencer drops its `Signers`.
    pub fn start(
        count: usize,
        key: &Identity,
        to_sequencer: &Sender<Input>,
        shared: &Arc<Shared>,
    ) -> std::io::Result<(Signers, Vec<JoinHandle<()>>)> {
        let key = Arc::new(key.clone());
        let mut jobs = Vec::new();
        let mut threads = Vec::new();
        for i in 0..count.max(1) {
            let (tx, rx) = std::sync::mpsc::channel::<SignJob>();
            let (key, out, shared) = (key.clone(), to_sequencer.clone(), shared.clone());
            let run = move || {
                for job in rx {
                    let t = Instant::now();
                    let sigs = job.hashes.iter().map(|h| key.sign(&record::signing_message(h))).collect();
                    Clock::lap(&shared.clock.signers, t);
                    if out.send(Input::Signed { batch: job.batch, start: job.start, sigs }).is_err() {
                        return;
                    }
                }
            };
            threads.push(std::thread::Builder::new().name(format!("log-signer-{i}")).spawn(run)?);
            jobs.push(tx);
        }
        Ok((Signers { jobs, next: 0 }, threads))
    }

    /// Hands the batch's records to the signers in contiguous shares.
    fn sign(&mut self, b: &InFlight) {
        let n = b.pending.len();
        let shares = (n / SIGN_CHUNK_MIN).clamp(1, self.jobs.len());
        let (base, extra) = (n / shares, n % shares);
        let mut start = 0;
        for i in 0..shares {
            let len = base + usize::from(i < extra);
            let hashes = b.pending[start..start + len].iter().map(|p| p.ev.hash).collect();
            let signer = (self.next + i) % self.jobs.len();
            // A signer only stops when these senders are dropped, so this cannot fail.
            let _ = self.jobs[signer].send(SignJob { batch: b.id, start, hashes });
            start += len;
        }
        self.next = (self.next + shares) % self.jobs.len();
    }
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
    /// Where the next record goes: the end of the last whole record.
    pub seg_len: u64,
    /// Size of the segment file; `seg_len..seg_alloc` holds only zeros.
    pub seg_alloc: u64,
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

/// A sequenced batch on its way to the file: its records chain on the batch before it,
/// so batches are written strictly in order, each once its signatures are back.
struct InFlight {
    id: u64,
    start_seq: u64,
    start_prev: Hash,
    pending: Vec<Pending>,
    /// Duplicates, answered after this batch's sync.
    replies: Vec<(Reply, Result<Appended, AppendError>)>,
    /// One per pending record, filled in as the signers answer.
    sigs: Vec<[u8; SIG_LEN]>,
    unsigned: usize,
}

impl Sequencer {
    /// Takes requests and signatures from `rx` until [`Input::Close`], then finishes
    /// what it holds. `signers` answer on `rx`.
    pub fn run(mut self, rx: Receiver<Input>, mut signers: Signers, to_syncer: Sender<Batch>) {
        let mut inflight: VecDeque<InFlight> = VecDeque::new();
        let mut next_id = 0u64;
        let mut closing = false;
        while !(closing && inflight.is_empty()) {
            let Ok(first) = rx.recv() else { return };
            let mut reqs = Vec::new();
            let mut input = Some(first);
            while let Some(m) = input.take() {
                match m {
                    Input::Append(r) => reqs.push(r),
                    Input::Signed { batch, start, sigs } => {
                        // Batches that failed meanwhile are gone; their signatures are dropped.
                        if let Some(b) = inflight.iter_mut().find(|b| b.id == batch) {
                            b.sigs[start..start + sigs.len()].copy_from_slice(&sigs);
                            b.unsigned -= sigs.len();
                        }
                    }
                    Input::Close => closing = true,
                }
                if reqs.len() < MAX_BATCH {
                    input = rx.try_recv().ok();
                }
            }
            if !reqs.is_empty()
                && let Some(mut b) = self.sequence_batch(reqs, next_id)
            {
                next_id += 1;
                if b.pending.len() == 1 && inflight.is_empty() {
                    // A lone append: handing it to another thread would only add latency.
                    let t = Instant::now();
                    b.sigs[0] = self.key.sign(&record::signing_message(&b.pending[0].ev.hash));
                    b.unsigned = 0;
                    Clock::lap(&self.shared.clock.sign, t);
                } else if b.unsigned > 0 {
                    signers.sign(&b);
                }
                inflight.push_back(b);
            }
            if let Some(batch) = self.write_ready(&mut inflight)
                && to_syncer.send(batch).is_err()
            {
                return;
            }
        }
    }

    /// Checks and sequences requests (ids, seqs, envelopes, hashes); `None` if none is
    /// left to write or to answer after a sync.
    fn sequence_batch(&mut self, reqs: Vec<Request>, id: u64) -> Option<InFlight> {
        if let Some(reason) = self.shared.stopped() {
            for r in reqs {
                let _ = r.reply.send(Err(AppendError::Stopped(reason.clone())));
            }
            return None;
        }
        let t0 = Instant::now();
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
        Clock::lap(&self.shared.clock.sequence, t0);
        if pending.is_empty() && replies.is_empty() {
            return None;
        }
        let n = pending.len();
        Some(InFlight { id, start_seq, start_prev, pending, replies, sigs: vec![[0; SIG_LEN]; n], unsigned: n })
    }

    /// Writes every batch at the front of `inflight` whose signatures are back, with one
    /// `write`, and returns them as one batch for the syncer.
    fn write_ready(&mut self, inflight: &mut VecDeque<InFlight>) -> Option<Batch> {
        let ready = inflight.iter().take_while(|b| b.unsigned == 0).count();
        if ready == 0 {
            return None;
        }
        if let Some(reason) = self.shared.stopped() {
            let group: Vec<InFlight> = inflight.drain(..).collect();
            self.fail(group, AppendError::Stopped(reason));
            return None;
        }
        let t0 = Instant::now();
        let group: Vec<InFlight> = inflight.drain(..ready).collect();
        let records = || group.iter().flat_map(|b| b.pending.iter().zip(&b.sigs));
        let bytes: usize = records().map(|(p, _)| record::framed_len(&p.ev.envelope)).sum();
        let new_segment = match records().next() {
            Some((first, _)) => match self.rotate_if_full(first.ev.seq, bytes as u64) {
                Ok(s) => s,
                Err(e) => {
                    let reason = format!("cannot start a new segment: {e}");
                    self.fail_from(group, inflight, reason);
                    return None;
                }
            },
            None => None,
        };
        let mut buf = Vec::with_capacity(bytes);
        let mut events = Vec::with_capacity(records().count());
        for (p, sig) in records() {
            let offset = self.seg_len + buf.len() as u64;
            let len = record::frame_into(&p.ev.envelope, sig, &mut buf);
            events.push((p.ev.hash, Position { segment: self.seg_index, offset, len: len as u32 }));
        }
        #[cfg(test)]
        let injected = self.shared.inject_write_error.lock().unwrap_or_else(|e| e.into_inner()).take();
        #[cfg(not(test))]
        let injected: Option<std::io::ErrorKind> = None;
        let written = match injected {
            // Half the batch lands before the failure, as a real short write can leave it.
            Some(kind) => self
                .file
                .write_all_at(&buf[..buf.len() / 2], self.seg_len)
                .and(Err(std::io::Error::new(kind, "injected write failure"))),
            None => self.file.write_all_at(&buf, self.seg_len),
        };
        if let Err(e) = written {
            // Undo a partial write so the file ends on a record boundary again; if even
            // that fails the tail is unknown and the writer must stop.
            if let Err(t) = self.file.set_len(self.seg_len) {
                self.shared.stop(format!("write failed ({e}) and truncating back failed ({t})"));
            }
            self.seg_alloc = self.seg_len;
            self.fail_from(group, inflight, format!("write failed, nothing stored: {e}"));
            return None;
        }
        self.seg_len += buf.len() as u64;
        self.grow();
        let mut index = Vec::with_capacity(events.len());
        let mut replies = Vec::with_capacity(events.len());
        for b in group {
            for Pending { ev, reply } in b.pending {
                index.push(ev.index);
                replies.push((reply, Ok(Appended { seq: ev.seq, hash: ev.hash, duplicate: false })));
            }
            replies.extend(b.replies);
        }
        Clock::lap(&self.shared.clock.write, t0);
        Some(Batch { file: self.file.clone(), new_segment, events, index, replies })
    }

    /// A write failed: `group` and every batch sequenced after it (they chain on it)
    /// are refused, and the next append takes the first seq of `group` again.
    fn fail_from(&mut self, mut group: Vec<InFlight>, inflight: &mut VecDeque<InFlight>, reason: String) {
        group.extend(inflight.drain(..));
        let (seq, prev) = (group[0].start_seq, group[0].start_prev);
        for p in group.iter().flat_map(|b| &b.pending) {
            self.ids.remove(&p.ev.id);
        }
        self.next_seq = seq;
        self.prev = prev;
        self.fail(group, AppendError::Io(reason));
    }

    fn fail(&self, group: Vec<InFlight>, err: AppendError) {
        for b in group {
            for p in b.pending {
                let _ = p.reply.send(Err(err.clone()));
            }
            // Even a duplicate's original may be among the refused.
            for (reply, _) in b.replies {
                let _ = reply.send(Err(err.clone()));
            }
        }
    }

    /// Once the records reach the end of the pre-written space, writes zeros after them
    /// (up to the segment size limit). This batch's sync then also syncs the new size
    /// and blocks, so the batches after it overwrite allocated blocks. A failure here
    /// loses nothing: the records are written, and the next batch just extends the file.
    fn grow(&mut self) {
        if self.seg_len < self.seg_alloc {
            return;
        }
        let target = (self.seg_len + self.seg_len.clamp(GROW_MIN, GROW_MAX)).min(self.max_segment);
        let mut at = self.seg_len;
        while at < target {
            let n = (target - at).min(ZEROS.len() as u64);
            if let Err(e) = self.file.write_all_at(&ZEROS[..n as usize], at) {
                tracing::warn!("pre-writing segment space failed: {e}");
                break;
            }
            at += n;
        }
        self.seg_alloc = at;
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

    /// Starts a new segment when the batch would take the current one past its size
    /// limit (a batch larger than a whole segment still gets one of its own). The old
    /// segment is synced first: only the last segment may ever end torn.
    fn rotate_if_full(&mut self, first_seq: u64, batch_bytes: u64) -> std::io::Result<Option<Arc<ReadSegment>>> {
        if self.seg_len == 0 || self.seg_len + batch_bytes <= self.max_segment {
            return Ok(None);
        }
        self.shared.count_sync();
        self.file.sync_data()?;
        let path = self.dir.join(segment::segment_name(first_seq));
        let file = OpenOptions::new().create_new(true).read(true).write(true).open(&path)?;
        fsutil::sync_dir(&self.dir)?;
        let file = Arc::new(file);
        self.file = file.clone();
        self.seg_index += 1;
        self.seg_len = 0;
        self.seg_alloc = 0;
        Ok(Some(Arc::new(ReadSegment { first_seq, path, file })))
    }
}

/// Syncs written batches and answers their appenders.
pub(crate) fn run_syncer(rx: Receiver<Batch>, shared: Arc<Shared>, to_indexer: Sender<Vec<IndexEntry>>) {
    while let Ok(first) = rx.recv() {
        let t0 = Instant::now();
        let mut batches = vec![first];
        while let Ok(b) = rx.try_recv() {
            batches.push(b);
        }
        if let Some(reason) = shared.stopped() {
            // Written after a failed sync, or after a write that could not be undone.
            for b in batches {
                for (reply, _) in b.replies {
                    let _ = reply.send(Err(AppendError::Stopped(reason.clone())));
                }
            }
            continue;
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
            shared.count_sync();
            if let Err(e) = b.file.sync_data() {
                result = Err(e);
                break;
            }
            synced.push(ptr);
        }
        let t1 = Clock::lap(&shared.clock.sync, t0);
        shared.clock.batches.fetch_add(batches.len() as u64, Ordering::Relaxed);
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
        Clock::lap(&shared.clock.ack, t1);
    }
}
