//! The serving engine: many requests over one model, at the speed of the device it sits on.
//!
//! * [`request`]: what a client asks (prompt, sampling, adapter, stop strings);
//! * [`scheduler`]: which tokens run next (continuous batching, chunked prefill beside the
//!   decodes, preemption), plain data over [`kv`], the paged cache's block pool with its
//!   prefix cache;
//! * [`runner`]: the device side (model, cache tensors, one flat batch per step), which
//!   replays pure decode steps as CUDA graphs per batch-size bucket ([`graph`]); [`sampler`]:
//!   per-request seeded draws, batched on the device; [`adapters`]: several LoRA adapters
//!   over one base in one batch; [`output`]: incremental detokenisation and stop strings;
//!   [`score`]: the log-probabilities of a given sequence (prompt scoring for evaluations);
//! * [`Engine`]: all of it, one step at a time; [`EngineHandle`]: the engine on its own thread,
//!   which requests join and leave at every step.
//!
//! ```
//! use candle_core::{DType, Device};
//! use mindxtrain_trainer::infer::{Engine, EngineConfig, EngineHandle, Event, KvBlocks, Request};
//! use mindxtrain_trainer::model::{CausalLm, LmConfig};
//! // A 64-wide, 2-layer Qwen3: the benchmarks' `tiny` shape.
//! let config = LmConfig::timing_shape("tiny").expect("a named shape");
//! let model = CausalLm::init_random(&config, 7, DType::F32, &Device::Cpu)?;
//! let engine = Engine::new(model, None, EngineConfig {
//!     max_model_len: 64, kv_blocks: KvBlocks::Exact(32), threads: 1, ..EngineConfig::default()
//! })?;
//! let handle = EngineHandle::spawn(engine);
//! let stream = handle.stream(Request::greedy(vec![1, 2, 3], 5))?;
//! let events: Vec<Event> = stream.collect();
//! assert!(matches!(events.last(), Some(Event::Finished { .. })));
//! assert_eq!(events.iter().filter(|e| matches!(e, Event::Token { .. })).count(), 5);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! `infer` never imports `run`, `optim` or the training recipe: a recipe becomes an
//! [`EngineConfig`] in the node.

pub mod adapters;
mod engine;
#[cfg(all(test, feature = "cuda"))]
mod gpu_tests;
pub mod graph;
#[cfg(test)]
mod hybrid_moe_tests;
#[cfg(test)]
mod hybrid_tests;
pub mod kv;
pub mod latency;
pub mod output;
pub mod request;
pub mod runner;
pub mod sampler;
pub mod scheduler;
pub mod score;
#[cfg(test)]
mod tests;

pub use engine::{Engine, EngineConfig, EngineError, Event, FinishReason, Stats, Usage};
pub use kv::KvBlocks;
pub use latency::{Histogram, Latencies};
pub use request::{Request, RequestId, SamplingParams};
pub use score::TokenLogprob;

use std::ops::ControlFlow;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;

use crate::model::Adapters;

/// Where a request's events go: return `Break` when nobody listens any more (the client left),
/// and the engine drops the request at its next step.
pub type Sink = Box<dyn FnMut(Event) -> ControlFlow<()> + Send>;

enum Command {
    Submit(Request, Sink, mpsc::Sender<Result<RequestId, EngineError>>),
    Abort(RequestId),
    LoadAdapter(String, Box<Adapters>, mpsc::Sender<Result<(), EngineError>>),
    Score(Score, mpsc::Sender<Result<Vec<TokenLogprob>, EngineError>>),
}

/// A sequence to score ([`Engine::score`]).
struct Score {
    ids: Vec<u32>,
    adapter: Option<String>,
    top: usize,
}

/// The engine running on a thread of its own. Dropping the handle stops it after the current
/// step (requests still running end without a `Finished` event).
pub struct EngineHandle {
    tx: Option<mpsc::Sender<Command>>,
    stats: Arc<Mutex<Stats>>,
    latencies: Arc<Mutex<Latencies>>,
    adapters: Arc<Mutex<Vec<String>>>,
    max_model_len: usize,
    thread: Option<JoinHandle<()>>,
}

impl EngineHandle {
    pub fn spawn(engine: Engine) -> EngineHandle {
        let (tx, rx) = mpsc::channel();
        let stats = Arc::new(Mutex::new(engine.stats()));
        let adapters = Arc::new(Mutex::new(engine.adapters()));
        let max_model_len = engine.config().max_model_len;
        let latencies = Arc::new(Mutex::new(Latencies::default()));
        let shared = Shared { stats: stats.clone(), names: adapters.clone(), latencies: latencies.clone() };
        let thread = std::thread::Builder::new()
            .name("mindxtrain-engine".into())
            .spawn(move || serve(engine, rx, shared))
            .expect("spawning the engine thread");
        EngineHandle { tx: Some(tx), stats, latencies, adapters, max_model_len, thread: Some(thread) }
    }

    fn send(&self, c: Command) -> Result<(), EngineError> {
        self.tx.as_ref().ok_or(EngineError::Stopped)?.send(c).map_err(|_| EngineError::Stopped)
    }

    /// Checks and queues `req`; its events go to `sink` from the engine's thread. A refusal
    /// (unknown adapter, prompt over the context, bad settings) comes back here, at once.
    pub fn submit(
        &self,
        req: Request,
        sink: impl FnMut(Event) -> ControlFlow<()> + Send + 'static,
    ) -> Result<RequestId, EngineError> {
        let (reply, answer) = mpsc::channel();
        self.send(Command::Submit(req, Box::new(sink), reply))?;
        answer.recv().map_err(|_| EngineError::Stopped)?
    }

    /// [`EngineHandle::submit`] with the events as an iterator that ends after the last one;
    /// dropping it early cancels the request.
    pub fn stream(&self, req: Request) -> Result<EventStream, EngineError> {
        let (tx, rx) = mpsc::channel();
        let id =
            self.submit(
                req,
                move |e| if tx.send(e).is_ok() { ControlFlow::Continue(()) } else { ControlFlow::Break(()) },
            )?;
        Ok(EventStream { id, rx, done: false })
    }

    /// Drops a request at the next step.
    pub fn abort(&self, id: RequestId) {
        let _ = self.send(Command::Abort(id));
    }

    /// Serves another adapter over the base.
    pub fn load_adapter(&self, name: &str, adapters: Adapters) -> Result<(), EngineError> {
        let (reply, answer) = mpsc::channel();
        self.send(Command::LoadAdapter(name.to_string(), Box::new(adapters), reply))?;
        answer.recv().map_err(|_| EngineError::Stopped)?
    }

    /// [`Engine::score`] on the engine's thread, between two steps.
    pub fn score(&self, ids: Vec<u32>, adapter: Option<String>, top: usize) -> Result<Vec<TokenLogprob>, EngineError> {
        let (reply, answer) = mpsc::channel();
        self.send(Command::Score(Score { ids, adapter, top }, reply))?;
        answer.recv().map_err(|_| EngineError::Stopped)?
    }

    /// The load after the last step.
    pub fn stats(&self) -> Stats {
        *self.stats.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Time to first token and between tokens of every request so far.
    pub fn latencies(&self) -> Latencies {
        self.latencies.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The served adapters' names.
    pub fn adapters(&self) -> Vec<String> {
        self.adapters.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    pub fn max_model_len(&self) -> usize {
        self.max_model_len
    }
}

impl Drop for EngineHandle {
    fn drop(&mut self) {
        self.tx.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A request's events, in order; the iterator ends after `Finished` or `Failed`.
pub struct EventStream {
    pub id: RequestId,
    rx: mpsc::Receiver<Event>,
    done: bool,
}

impl Iterator for EventStream {
    type Item = Event;

    fn next(&mut self) -> Option<Event> {
        if self.done {
            return None;
        }
        let e = self.rx.recv().ok()?;
        self.done = matches!(e, Event::Finished { .. } | Event::Failed(_));
        Some(e)
    }
}

/// What the engine thread publishes for the handle.
struct Shared {
    stats: Arc<Mutex<Stats>>,
    names: Arc<Mutex<Vec<String>>>,
    latencies: Arc<Mutex<Latencies>>,
}

/// The engine thread: take commands (waiting for one when idle), step, deliver events.
fn serve(mut engine: Engine, rx: mpsc::Receiver<Command>, shared: Shared) {
    // The model and cache were made on the spawning thread: `Engine::new` waited for that
    // thread's CUDA work, and the engine queues every step from its own one pool thread.
    let mut sinks: std::collections::HashMap<RequestId, Sink> = std::collections::HashMap::new();
    // When each request was submitted, then when it last produced a token.
    let mut last: std::collections::HashMap<RequestId, (Instant, bool)> = std::collections::HashMap::new();
    loop {
        let first = if engine.is_idle() {
            match rx.recv() {
                Ok(c) => Some(c),
                Err(_) => return,
            }
        } else {
            None
        };
        let mut disconnected = false;
        let pending = first.into_iter().chain(std::iter::from_fn(|| match rx.try_recv() {
            Ok(c) => Some(c),
            Err(mpsc::TryRecvError::Empty) => None,
            Err(mpsc::TryRecvError::Disconnected) => {
                disconnected = true;
                None
            }
        }));
        for command in pending.collect::<Vec<_>>() {
            match command {
                Command::Submit(req, sink, reply) => {
                    let result = engine.add(req);
                    if let Ok(id) = &result {
                        sinks.insert(*id, sink);
                        last.insert(*id, (Instant::now(), false));
                    }
                    let _ = reply.send(result);
                }
                Command::Abort(id) => {
                    engine.abort(id);
                    sinks.remove(&id);
                    last.remove(&id);
                }
                Command::LoadAdapter(name, adapters, reply) => {
                    let _ = reply.send(engine.load_adapter(&name, *adapters));
                    *shared.names.lock().unwrap_or_else(|e| e.into_inner()) = engine.adapters();
                }
                Command::Score(Score { ids, adapter, top }, reply) => {
                    let _ = reply.send(engine.score(&ids, adapter.as_deref(), top));
                }
            }
        }
        if disconnected {
            return;
        }
        if !engine.is_idle() {
            let events = engine.step();
            // Published before the events go out, so whoever hears a request end sees it gone.
            *shared.stats.lock().unwrap_or_else(|e| e.into_inner()) = engine.stats();
            let now = Instant::now();
            let mut lat = shared.latencies.lock().unwrap_or_else(|e| e.into_inner());
            for (id, event) in events {
                if let (Event::Token { .. }, Some((at, started))) = (&event, last.get_mut(&id)) {
                    let gap = now.duration_since(*at).as_secs_f64();
                    if *started {
                        lat.inter_token.observe(gap)
                    } else {
                        lat.first_token.observe(gap)
                    }
                    (*at, *started) = (now, true);
                }
                let ended = matches!(event, Event::Finished { .. } | Event::Failed(_));
                let Some(sink) = sinks.get_mut(&id) else { continue };
                let gone = sink(event).is_break();
                if gone && !ended {
                    // The client left: its slot and blocks are free for the next step.
                    engine.abort(id);
                }
                if gone || ended {
                    sinks.remove(&id);
                    last.remove(&id);
                }
            }
        }
        *shared.stats.lock().unwrap_or_else(|e| e.into_inner()) = engine.stats();
    }
}
