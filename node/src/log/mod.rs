//! The append-only, hash-chained, signed event log.
//!
//! Segment files are the record of truth (see [`record`] for the byte format). An
//! append is acknowledged only after the bytes holding it were `fdatasync`ed; many
//! concurrent appends share one sync ([`writer`]). The sled [`index`] answers
//! queries by kind, run and subject, and is rebuilt from the segments whenever it is
//! missing, stale or damaged: it never decides what was acknowledged.
//!
//! ```no_run
//! use mindxtrain_node::log::{AppendRequest, EventLog, LogOptions};
//! use mindxtrain_node::identity::Identity;
//! # fn main() -> anyhow::Result<()> {
//! let dir = std::path::Path::new("/tmp/node");
//! let (log, _report) = EventLog::open(dir, Identity::load_from(dir)?, LogOptions::default())?;
//! let ack = log.append(AppendRequest::new("run.started", "run-1", serde_json::json!({"run_id": "run-1"})))?;
//! println!("durable at seq {}", ack.seq);
//! # Ok(()) }
//! ```

pub mod checkpoint;
pub mod index;
pub mod proofs;
pub mod record;
pub mod segment;
pub mod verify;
mod view;
pub mod witness;
mod writer;

pub use record::{Envelope, Event, Hash};
pub use view::{LogReader, ReadError, View};

use crate::fsutil;
use crate::identity::Identity;
use record::EncodeError;
use segment::{Position, ReadSegment, ScanError};
use serde_json::Value;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, RwLock, mpsc};
use std::thread::JoinHandle;
use thiserror::Error;
use tokio::sync::{oneshot, watch};

/// Kind of the first event of every log: it declares the signing key.
pub const GENESIS_KIND: &str = "log.genesis";
/// Sub-directory of the node dir holding segments.
pub const LOG_DIR: &str = "log";
pub(crate) const INDEX_DIR: &str = "index";
const TORN_DIR: &str = "torn";
pub(crate) const LOCK_FILE: &str = "LOCK";

/// What to append.
#[derive(Debug, Clone, PartialEq)]
pub struct AppendRequest {
    pub kind: String,
    pub subject: String,
    /// A JSON object; integers beyond ±2^53 must be strings.
    pub data: Value,
    /// Idempotency key: a retry with the same id and content returns the original seq.
    pub id: Option<String>,
    /// Optimistic concurrency: the append fails unless it would get exactly this seq.
    pub expected_seq: Option<u64>,
}

impl AppendRequest {
    pub fn new(kind: impl Into<String>, subject: impl Into<String>, data: Value) -> Self {
        Self { kind: kind.into(), subject: subject.into(), data, id: None, expected_seq: None }
    }

    pub fn with_id(mut self, id: impl Into<String>) -> Self {
        self.id = Some(id.into());
        self
    }

    pub fn expecting_seq(mut self, seq: u64) -> Self {
        self.expected_seq = Some(seq);
        self
    }
}

/// A durable append.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Appended {
    pub seq: u64,
    pub hash: Hash,
    /// True when this was a retry of an id already in the log.
    pub duplicate: bool,
}

#[derive(Debug, Error, Clone, PartialEq)]
pub enum AppendError {
    #[error("invalid event: {0}")]
    Invalid(#[from] EncodeError),
    #[error("expected to append at seq {expected}, but the next seq is {next}")]
    SeqMismatch { expected: u64, next: u64 },
    #[error("event id {id:?} was already used at seq {seq} for different content")]
    IdConflict { id: String, seq: u64 },
    #[error("the log writer has stopped: {0}")]
    Stopped(String),
    #[error("{0}")]
    Io(String),
}

#[derive(Debug, Error)]
pub enum OpenError {
    #[error(transparent)]
    Scan(#[from] ScanError),
    /// The log is gone, empty, or shorter than what the node recorded elsewhere.
    #[error("{0}")]
    Lost(Box<witness::LostLog>),
    #[error(transparent)]
    Witness(#[from] witness::WitnessError),
    #[error("{0} already holds a log; a new one starts only in an empty directory")]
    Exists(PathBuf),
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{0} is locked by another mindxtrain process")]
    Locked(PathBuf),
    #[error("log is signed by key {log_key} but this node's key is {node_key}")]
    KeyMismatch { log_key: String, node_key: String },
    #[error("cannot write the genesis event: {0}")]
    Genesis(AppendError),
    #[error("index: {0}")]
    Index(#[from] index::IndexError),
}

/// What `open` found and did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OpenReport {
    pub events: u64,
    pub segments: usize,
    pub torn: Option<segment::TornTail>,
    /// Where the torn bytes were preserved before truncation.
    pub torn_saved_to: Option<PathBuf>,
    pub index: index::Reconciled,
}

#[derive(Debug, Clone)]
pub struct LogOptions {
    /// A segment is closed once it reaches this size.
    pub max_segment_bytes: u64,
    /// Threads that sign events; 0 means one per CPU the process may use.
    pub signers: usize,
}

impl Default for LogOptions {
    fn default() -> Self {
        Self { max_segment_bytes: 64 << 20, signers: 0 }
    }
}

/// Where an event id went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IdEntry {
    pub seq: u64,
    pub fingerprint: Hash,
    pub hash: Hash,
}

/// What the index records of one event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IndexEntry {
    pub seq: u64,
    pub hash: Hash,
    pub kind: String,
    pub subject: String,
    pub run: Option<String>,
}

/// Counters for metrics and benchmarks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    pub events: u64,
    pub syncs: u64,
    pub times: WriterTimes,
}

/// Where the writer threads spent their time since open, in nanoseconds: the busier of
/// the sequencer (`sequence + sign + write`) and the syncer (`sync + ack`) bounds how
/// many appends per second the log can take, unless the pool cannot sign fast enough.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WriterTimes {
    /// Sequencer: ids, seqs, envelopes and hashes, one request after another.
    pub sequence_ns: u64,
    /// Sequencer: signing a lone append itself (no other batch in flight).
    pub sign_ns: u64,
    /// Signer threads, summed over them (they run in parallel).
    pub signers_ns: u64,
    /// Sequencer: framing and writing the batch (and starting segments).
    pub write_ns: u64,
    /// Syncer: `fdatasync`.
    pub sync_ns: u64,
    /// Syncer: publishing to readers and answering appenders.
    pub ack_ns: u64,
    /// Batches written (one `write` each).
    pub batches: u64,
}

/// State shared by the writer threads and readers.
pub(crate) struct Shared {
    view: RwLock<View>,
    stopped: Mutex<Option<String>>,
    notify: watch::Sender<u64>,
    syncs: AtomicU64,
    clock: writer::Clock,
    indexed: (Mutex<u64>, Condvar),
    /// Test hook: the next fdatasync reports this error instead of syncing.
    #[cfg(test)]
    pub(crate) inject_sync_error: Mutex<Option<std::io::ErrorKind>>,
    /// Test hook: the next write of records fails with this error.
    #[cfg(test)]
    pub(crate) inject_write_error: Mutex<Option<std::io::ErrorKind>>,
}

impl Shared {
    pub(crate) fn stopped(&self) -> Option<String> {
        self.stopped.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    pub(crate) fn stop(&self, reason: String) {
        self.stopped.lock().unwrap_or_else(|e| e.into_inner()).get_or_insert(reason);
    }

    pub(crate) fn count_sync(&self) {
        self.syncs.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn publish(&self, new_segment: Option<Arc<ReadSegment>>, events: &[(Hash, Position)]) {
        let len = {
            let mut v = self.view.write().unwrap_or_else(|e| e.into_inner());
            if let Some(s) = new_segment {
                v.push_segment(s);
            }
            for (h, p) in events {
                v.push(*h, *p);
            }
            v.len()
        };
        self.notify.send_replace(len);
    }

    fn set_indexed(&self, n: u64) {
        let (m, cv) = &self.indexed;
        *m.lock().unwrap_or_else(|e| e.into_inner()) = n;
        cv.notify_all();
    }
}

/// A writable log: one per node directory (guarded by a lock file).
pub struct EventLog {
    shared: Arc<Shared>,
    tx: Option<mpsc::Sender<writer::Input>>,
    threads: Vec<JoinHandle<()>>,
    index: Arc<index::Index>,
    key: Identity,
    node_dir: PathBuf,
    /// One writer of the signed checkpoint file at a time.
    head: Mutex<()>,
    _lock: File,
}

impl EventLog {
    /// Opens the log under `node_dir/log`, recovering a torn tail and reconciling the
    /// index. A log that is gone, empty, or shorter than what the node recorded elsewhere
    /// ([`witness`]: the index, the latest signed checkpoint, the manifests) is refused with
    /// [`OpenError::Lost`], naming what is missing, and nothing is changed: a new log is only
    /// started by [`EventLog::create`].
    pub fn open(node_dir: &Path, key: Identity, opts: LogOptions) -> Result<(Self, OpenReport), OpenError> {
        Self::start(node_dir, key, opts, false)
    }

    /// Creates the log under `node_dir/log` with its genesis event naming the key (what
    /// `init` does); refuses a directory that already holds segments.
    pub fn create(node_dir: &Path, key: Identity, opts: LogOptions) -> Result<(Self, OpenReport), OpenError> {
        Self::start(node_dir, key, opts, true)
    }

    fn start(node_dir: &Path, key: Identity, opts: LogOptions, new: bool) -> Result<(Self, OpenReport), OpenError> {
        let dir = node_dir.join(LOG_DIR);
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |source| OpenError::Io { path, source }
        };
        if new {
            std::fs::create_dir_all(&dir).map_err(io(&dir))?;
            if !segment::list_segments(&dir)?.is_empty() {
                return Err(OpenError::Exists(dir));
            }
        } else if !dir.is_dir() {
            let mut witnesses = witness::gather(node_dir, &key.verifying_key())?;
            let index_dir = node_dir.join(INDEX_DIR);
            if index_dir.is_dir()
                && let Ok(Some((seq, hash))) = index::Index::read_marker(&index_dir)
            {
                witnesses.push(witness::of_index(node_dir, seq, hash));
            }
            let shortfalls = witness::check(&witnesses, &[]);
            return Err(lost(dir, 0, true, shortfalls));
        }
        let lock_path = dir.join(LOCK_FILE);
        let lock = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(io(&lock_path))?;
        if lock.try_lock().is_err() {
            return Err(OpenError::Locked(dir));
        }
        let mut scan = segment::scan(&dir, true)?;
        let public_hex = hex::encode(key.public_bytes());
        if let Some(log_key) = &scan.genesis_key
            && *log_key != public_hex
        {
            return Err(OpenError::KeyMismatch { log_key: log_key.clone(), node_key: public_hex });
        }
        let mut witnesses = if new { Vec::new() } else { witness::gather(node_dir, &key.verifying_key())? };
        let (index, index_damage) = index::Index::load(&node_dir.join(INDEX_DIR))?;
        if let Ok(Some((seq, hash))) = index.marker() {
            witnesses.push(witness::of_index(node_dir, seq, hash));
        }
        // Before anything is repaired: a torn tail that holds an event the node recorded
        // elsewhere is not torn, it is acknowledged data damaged.
        let shortfalls = witness::check(&witnesses, &scan.hashes);
        if !new && (scan.hashes.is_empty() || !shortfalls.is_empty()) {
            return Err(lost(dir, scan.hashes.len() as u64, false, shortfalls));
        }
        let mut report = OpenReport { torn: scan.torn.clone(), ..Default::default() };
        if let Some(torn) = &scan.torn {
            report.torn_saved_to = Some(save_and_truncate(&dir, torn, &scan).map_err(io(&torn.segment))?);
            tracing::warn!(segment = %torn.segment.display(), offset = torn.offset, bytes = torn.bytes, reason = %torn.reason, "truncated a torn tail");
        }
        if scan.segments.is_empty() {
            let path = dir.join(segment::segment_name(0));
            let file =
                std::fs::OpenOptions::new().create_new(true).read(true).write(true).open(&path).map_err(io(&path))?;
            fsutil::sync_dir(&dir).map_err(io(&dir))?;
            scan.segments.push(Arc::new(ReadSegment { first_seq: 0, path, file: Arc::new(file) }));
            scan.last_len = 0;
        }
        let view = View::from_scan(&scan);
        report.index = index.reconcile(&view, index_damage)?;
        let (notify, _) = watch::channel(view.len());
        let shared = Arc::new(Shared {
            view: RwLock::new(view),
            stopped: Mutex::new(None),
            notify,
            syncs: AtomicU64::new(0),
            clock: writer::Clock::default(),
            indexed: (Mutex::new(0), Condvar::new()),
            #[cfg(test)]
            inject_sync_error: Mutex::new(None),
            #[cfg(test)]
            inject_write_error: Mutex::new(None),
        });
        shared.set_indexed(shared.view.read().unwrap_or_else(|e| e.into_inner()).len());
        let last = scan.segments.last().expect("at least one segment");
        let sequencer = writer::Sequencer {
            key: key.clone(),
            next_seq: scan.hashes.len() as u64,
            prev: scan.last_hash(),
            ids: std::mem::take(&mut scan.ids),
            file: last.file.clone(),
            seg_index: (scan.segments.len() - 1) as u32,
            seg_len: scan.last_len,
            seg_alloc: last.file.metadata().map_err(io(&last.path))?.len().max(scan.last_len),
            max_segment: opts.max_segment_bytes.max(1),
            dir: dir.clone(),
            shared: shared.clone(),
            ids_rng: writer::IdRng::from_os(),
        };
        let index = Arc::new(index);
        let (tx, rx) = mpsc::channel();
        let (batch_tx, batch_rx) = mpsc::channel();
        let (index_tx, index_rx) = mpsc::channel::<Vec<IndexEntry>>();
        let mut threads = Vec::new();
        let signer_count = match opts.signers {
            0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
            n => n,
        };
        let (signers, signer_threads) = writer::Signers::start(signer_count, &key, &tx, &shared).map_err(io(&dir))?;
        threads.push(spawn("log-sequencer", move || sequencer.run(rx, signers, batch_tx)));
        let s2 = shared.clone();
        threads.push(spawn("log-syncer", move || writer::run_syncer(batch_rx, s2, index_tx)));
        let (s3, idx) = (shared.clone(), index.clone());
        threads.push(spawn("log-indexer", move || run_indexer(index_rx, s3, idx)));
        // After the sequencer: they stop once it is done with them.
        threads.extend(signer_threads);
        let (node_dir, head) = (node_dir.to_path_buf(), Mutex::new(()));
        let log = Self { shared, tx: Some(tx), threads, index, key, node_dir, head, _lock: lock };
        report.events = log.len();
        report.segments = scan.segments.len();
        if log.is_empty() {
            let data = serde_json::json!({
                "public_key": public_hex,
                "algorithm": "ed25519",
                "software": crate::SOFTWARE,
            });
            log.append(AppendRequest::new(GENESIS_KIND, public_hex, data).with_id("genesis").expecting_seq(0))
                .map_err(OpenError::Genesis)?;
            report.events = 1;
            // The genesis is the first thing the node vouches for: from now on an empty log is lost.
            log.save_head().map_err(io(&log.node_dir.join(witness::CHECKPOINT_FILE)))?;
        }
        Ok((log, report))
    }

    /// Queues an append; the receiver resolves once it is durable (or failed).
    pub fn submit(&self, req: AppendRequest) -> oneshot::Receiver<Result<Appended, AppendError>> {
        let (reply, rx) = oneshot::channel();
        let req = match writer::Encoded::new(req) {
            Ok(r) => r,
            Err(e) => {
                let _ = reply.send(Err(e));
                return rx;
            }
        };
        let request = writer::Request { req, reply };
        if let Some(tx) = &self.tx
            && let Err(mpsc::SendError(writer::Input::Append(r))) = tx.send(writer::Input::Append(request))
        {
            let _ = r.reply.send(Err(AppendError::Stopped("log is closed".into())));
        }
        rx
    }

    /// Appends and blocks until the event is durable.
    pub fn append(&self, req: AppendRequest) -> Result<Appended, AppendError> {
        self.submit(req).blocking_recv().unwrap_or_else(|_| Err(AppendError::Stopped("writer exited".into())))
    }

    /// Appends and waits, without blocking the async runtime.
    pub async fn append_async(&self, req: AppendRequest) -> Result<Appended, AppendError> {
        self.submit(req).await.unwrap_or_else(|_| Err(AppendError::Stopped("writer exited".into())))
    }

    /// Number of durable events.
    pub fn len(&self) -> u64 {
        self.read(|v| v.len())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Runs `f` on a consistent snapshot of the committed log.
    pub fn read<T>(&self, f: impl FnOnce(&View) -> T) -> T {
        f(&self.shared.view.read().unwrap_or_else(|e| e.into_inner()))
    }

    pub fn get(&self, seq: u64) -> Result<Event, ReadError> {
        self.read(|v| v.event(seq))
    }

    /// Fires with the new length after every durable batch.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.shared.notify.subscribe()
    }

    pub fn public_key(&self) -> [u8; 32] {
        self.key.public_bytes()
    }

    /// Signs a checkpoint of the whole log and keeps it as the node's latest
    /// ([`witness::CHECKPOINT_FILE`], outside `log/`), so that a log that later loses
    /// these events is refused. Done when the log closes and when a checkpoint is recorded.
    pub fn save_head(&self) -> std::io::Result<u64> {
        let _one = self.head.lock().unwrap_or_else(|e| e.into_inner());
        let (size, root) = self.read(|v| (v.len(), v.root(v.len())));
        let root = root.map_err(|e| std::io::Error::other(e.to_string()))?;
        if size > 0 {
            witness::save_checkpoint(&self.node_dir, &self.key, size, root)?;
        }
        Ok(size)
    }

    #[cfg(test)]
    pub(crate) fn fail_next_sync(&self, kind: std::io::ErrorKind) {
        *self.shared.inject_sync_error.lock().unwrap() = Some(kind);
    }

    #[cfg(test)]
    pub(crate) fn fail_next_write(&self, kind: std::io::ErrorKind) {
        *self.shared.inject_write_error.lock().unwrap() = Some(kind);
    }

    pub fn stats(&self) -> Stats {
        Stats { events: self.len(), syncs: self.shared.syncs.load(Ordering::Relaxed), times: self.shared.clock.times() }
    }

    /// Why the writer stopped (an fsync or write failure), if it did: no append succeeds
    /// after that, so a node reports itself not ready.
    pub fn stopped(&self) -> Option<String> {
        self.shared.stopped()
    }

    /// Seqs of events matching `q`, in order, once the index has caught up with every
    /// event durable at the time of the call.
    pub fn query(&self, q: &index::Query) -> Result<Vec<u64>, index::IndexError> {
        let target = self.len();
        let (m, cv) = &self.shared.indexed;
        let mut done = m.lock().unwrap_or_else(|e| e.into_inner());
        while *done < target {
            let (g, timeout) =
                cv.wait_timeout(done, std::time::Duration::from_secs(10)).unwrap_or_else(|e| e.into_inner());
            done = g;
            if timeout.timed_out() {
                return Err(index::IndexError::Lagging { indexed: *done, wanted: target });
            }
        }
        drop(done);
        self.index.query(q)
    }
}

impl Drop for EventLog {
    fn drop(&mut self) {
        // Closing lets each thread finish what it holds, in pipeline order, so every
        // queued append is answered before we return.
        if let Some(tx) = self.tx.take() {
            let _ = tx.send(writer::Input::Close);
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        let _ = self.index.flush();
        // Every event in the view is durable: the checkpoint vouches for no more than that.
        if let Err(e) = self.save_head() {
            tracing::warn!("could not keep the log's signed checkpoint in {}: {e}", witness::CHECKPOINT_FILE);
        }
    }
}

/// [`OpenError::Lost`] for the log at `log_dir`.
fn lost(log_dir: PathBuf, events: u64, absent: bool, shortfalls: Vec<witness::Shortfall>) -> OpenError {
    OpenError::Lost(Box::new(witness::LostLog { log_dir, events, absent, shortfalls }))
}

fn spawn(name: &str, f: impl FnOnce() + Send + 'static) -> JoinHandle<()> {
    std::thread::Builder::new().name(name.into()).spawn(f).expect("spawning a log thread")
}

fn run_indexer(rx: mpsc::Receiver<Vec<IndexEntry>>, shared: Arc<Shared>, index: Arc<index::Index>) {
    while let Ok(mut entries) = rx.recv() {
        while let Ok(more) = rx.try_recv() {
            entries.extend(more);
        }
        match index.apply(&entries) {
            Ok(()) => shared.set_indexed(entries.last().map(|e| e.seq + 1).unwrap_or(0)),
            // The index is only an accelerator: on failure it will be rebuilt at the
            // next open; queries report the lag instead of returning partial answers.
            Err(e) => tracing::error!("index update failed: {e}"),
        }
    }
}

/// Copies the torn bytes aside (nothing is dropped unseen), then truncates the segment
/// to its valid prefix (dropping any pre-written zeros after the torn bytes too) and syncs.
fn save_and_truncate(dir: &Path, torn: &segment::TornTail, scan: &segment::Scan) -> std::io::Result<PathBuf> {
    use std::os::unix::fs::FileExt;
    let seg = scan.segments.last().expect("torn tail is in the last segment");
    let mut bytes = vec![0u8; torn.bytes as usize];
    seg.file.read_exact_at(&mut bytes, torn.offset)?;
    let torn_dir = dir.join(TORN_DIR);
    std::fs::create_dir_all(&torn_dir)?;
    let name = format!(
        "{}-{}-{}.bin",
        seg.path.file_stem().and_then(|s| s.to_str()).unwrap_or("segment"),
        torn.offset,
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0)
    );
    let saved = torn_dir.join(name);
    fsutil::write_new_durably(&saved, &bytes, 0o644)?;
    seg.file.set_len(torn.offset)?;
    seg.file.sync_all()?;
    Ok(saved)
}

#[cfg(test)]
mod lost_tests;
#[cfg(test)]
mod tests;
