//! The engine's core, synchronous and single-threaded: requests in, one step at a time, events
//! out. [`super::EngineHandle`] runs it on a thread of its own; tests drive it directly.

use std::collections::HashMap;

use candle_core::Tensor;

use super::adapters::{AdapterError, AdapterSlots};
use super::kv::{self, KvManager};
use super::output::{Detokenizer, StopText};
use super::request::{Request, RequestId, SamplingParams};
use super::runner::{Launched, Runner, RunnerConfig, StepSeq};
use super::sampler;
use super::scheduler::{Schedule, Scheduler, SchedulerConfig};
use super::score::{self, TokenLogprob};
use crate::data::Tokenizer;
use crate::model::{Adapters, CausalLm, ModelError, Params};

mod config;
mod events;

pub use config::EngineConfig;
pub use events::{Event, FinishReason, Stats, Usage};

/// Why the engine refused or failed something. The first three are the client's doing.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("no adapter {0:?} is served here")]
    UnknownAdapter(String),
    #[error("the prompt has {prompt} tokens; this model's context is {context}")]
    PromptTooLong { prompt: usize, context: usize },
    #[error("{0}")]
    BadRequest(String),
    #[error("engine config: {0}")]
    Config(String),
    #[error(transparent)]
    Adapter(AdapterError),
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error("the engine has stopped")]
    Stopped,
}

impl From<AdapterError> for EngineError {
    fn from(e: AdapterError) -> Self {
        match e {
            AdapterError::Unknown(name) => EngineError::UnknownAdapter(name),
            other => EngineError::Adapter(other),
        }
    }
}

struct Live {
    sampling: SamplingParams,
    max_tokens: usize,
    generated: usize,
    /// The adapter's load id (0: the base).
    adapter: u64,
    detok: Detokenizer,
    stop: StopText,
}

pub struct Engine {
    config: EngineConfig,
    scheduler: Scheduler,
    runner: Runner,
    adapters: AdapterSlots,
    live: HashMap<RequestId, Live>,
    tokenizer: Option<Tokenizer>,
    stop_ids: Vec<u32>,
    /// The ids the tokenizer can decode (the model's vocabulary without its padding).
    vocab: usize,
    /// Where every step is computed (and, on a CUDA device, queued: one thread, so one stream).
    pool: rayon::ThreadPool,
    next_id: RequestId,
    /// A step queued on the device whose tokens are not read yet (`overlap_steps`).
    in_flight: Option<InFlight>,
    steps: usize,
    steps_ahead: usize,
}

impl Drop for Engine {
    /// A step still queued would write into the cache and buffers dropped with the engine
    /// (memory that the pool may already have handed to someone else): wait for it first.
    fn drop(&mut self) {
        if let Some(f) = self.in_flight.take() {
            let _ = f.launched.read();
        }
    }
}

/// A queued step: what was scheduled, and its draws on their way.
struct InFlight {
    plan: Schedule,
    launched: Launched,
}

/// A scheduler over `blocks` cache blocks and, for a model with recurrent layers, `state_slots`
/// state slots (prefix caching then off).
fn scheduler(config: &EngineConfig, blocks: usize, state_slots: usize) -> Scheduler {
    let kv = KvManager::new(blocks, config.block_size, config.prefix_caching);
    Scheduler::new(
        SchedulerConfig { max_num_seqs: config.max_num_seqs, max_batched_tokens: config.max_batched_tokens },
        if state_slots > 0 { kv.with_state_slots(state_slots) } else { kv },
    )
}

impl Engine {
    /// Serves `model` (on its own device, with its own kernel settings). With a tokenizer the
    /// events carry text and requests may have stop strings; its end-of-turn and end-of-text
    /// tokens end a completion. The cache is sized now, after the model took its memory.
    pub fn new(mut model: CausalLm, tokenizer: Option<Tokenizer>, config: EngineConfig) -> Result<Engine, EngineError> {
        config.validate()?;
        // Before the sizing: packing swaps the grouped weights for one copy of each group, and
        // the cache takes what is free after.
        model.pack_projections()?;
        let spec = model.cache_spec(config.block_size);
        // A model with recurrent layers keeps a state slot per running sequence.
        let state_slots = if spec.is_recurrent() { config.max_num_seqs } else { 0 };
        // The runner keeps one slot more, for a padded decode step's padding rows.
        let held_slots = state_slots + usize::from(spec.is_recurrent());
        let blocks = kv::sizing::blocks(&spec, config.kv_blocks, config.max_model_len, held_slots, model.device())
            .map_err(EngineError::Config)?;
        let vocab =
            tokenizer.as_ref().map_or(model.config().vocab_size, |t| t.vocab_size().min(model.config().vocab_size));
        let stop_ids = tokenizer.as_ref().map_or(Vec::new(), |t| t.stop_ids());
        let adapters = AdapterSlots::new(&model, config.max_adapters);
        // candle's CUDA device queues work on the calling thread's stream (the per-thread
        // default stream): a step queued from one pool thread while the step before it runs on
        // another's stream would read its ids, buffers and graphs unordered. One thread keeps
        // every step of a CUDA engine on one stream. (Measured on an H200 with 16 threads:
        // steps queued ahead of graph replays read ids past the vocabulary within seconds.)
        let threads = if model.device().is_cuda() { 1 } else { config.threads.max(1) };
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|i| format!("mindxtrain-infer-{i}"))
            .build()
            .map_err(|e| EngineError::Config(format!("thread pool: {e}")))?;
        let scheduler = scheduler(&config, blocks, state_slots);
        if spec.is_recurrent() && config.prefix_caching {
            tracing::info!("prefix caching is off: the model's recurrent layers keep a state no cached block restores");
        }
        // Every step waits for its sampled tokens; with the pool's default threshold each wait
        // hands the step's freed buffers back to the driver, and the next step maps them again.
        // After the sizing, which reads the free memory the pool would otherwise hold.
        mindxtrain_kernels::cache_freed_memory(model.device()).map_err(ModelError::from)?;
        // The engine runs on one stream: allocations need no cross-stream events.
        mindxtrain_kernels::skip_allocation_events(model.device()).map_err(ModelError::from)?;
        let runner = Runner::new(
            model,
            RunnerConfig {
                block_size: config.block_size,
                blocks,
                state_slots,
                vocab,
                max_model_len: config.max_model_len,
                cuda_graphs: config.cuda_graphs,
            },
        )?;
        // The cache, the packed weights and the RoPE tables were queued on this thread's
        // stream; the pool's thread queues every step on its own.
        mindxtrain_kernels::memory::settle(runner.device()).map_err(ModelError::from)?;
        // Every batch-size bucket the running batch can reach, recorded before the first request
        // (on the steps' thread: the graphs replay on its stream).
        pool.install(|| runner.record_decode_graphs(config.max_num_seqs))?;
        Ok(Engine {
            config,
            scheduler,
            runner,
            adapters,
            live: HashMap::new(),
            tokenizer,
            stop_ids,
            vocab,
            pool,
            next_id: 1,
            in_flight: None,
            steps: 0,
            steps_ahead: 0,
        })
    }

    /// The batch sizes whose decode steps replay a recorded CUDA graph (empty off CUDA).
    pub fn graph_buckets(&self) -> Vec<usize> {
        self.runner.graph_buckets()
    }

    /// Why decode steps stopped replaying CUDA graphs (a recording failed), if they did.
    pub fn graph_refusal(&self) -> Option<String> {
        self.runner.graph_refusal()
    }

    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

    /// Whether cached prompt prefixes are reused: as configured, except for a model with
    /// recurrent layers (Qwen3.5/3.6), whose state at a prefix's end no cached block holds.
    pub fn prefix_caching(&self) -> bool {
        self.scheduler.kv().prefix_caching()
    }

    pub fn model(&self) -> &CausalLm {
        self.runner.model()
    }

    /// Serves `adapters` under `name`, beside the base and the other adapters.
    pub fn load_adapter(&mut self, name: &str, adapters: Adapters) -> Result<(), EngineError> {
        self.change_adapters(|slots| slots.load(name, adapters))
    }

    /// Changes the adapter stack with `change`. The tensors may come from another thread's
    /// copies (kernels::memory::settle), and a step still queued may replay a graph about to be
    /// dropped: both finish first. Then, on the steps' thread (so that its stream orders the new
    /// stack after any step queued later), the change, and the graphs recorded over the old
    /// stack go: they would read freed memory.
    fn change_adapters(
        &mut self,
        change: impl FnOnce(&mut AdapterSlots) -> Result<(), AdapterError> + Send,
    ) -> Result<(), EngineError> {
        mindxtrain_kernels::memory::settle(self.model().device()).map_err(ModelError::from)?;
        let (slots, runner) = (&mut self.adapters, &self.runner);
        self.pool.install(|| {
            change(slots)?;
            runner.clear_graphs();
            Ok(())
        })
    }

    /// Serves `params` as the base weights from the next step on: a trainer's updated policy
    /// (same names, shapes and dtype as the weights served now). Every cached prefix was
    /// computed with the old weights, so the prefix cache is emptied. Refused while requests
    /// run: their cached keys and values would mix two models.
    pub fn set_weights(&mut self, params: Params) -> Result<(), EngineError> {
        if !self.is_idle() {
            return Err(EngineError::BadRequest(
                "new weights while requests run: wait until the engine is idle".into(),
            ));
        }
        mindxtrain_kernels::memory::settle(self.model().device()).map_err(ModelError::from)?;
        let runner = &mut self.runner;
        self.pool.install(|| runner.set_weights(params))?;
        let blocks = self.scheduler.kv().total_blocks();
        let state_slots =
            if self.model().cache_spec(self.config.block_size).is_recurrent() { self.config.max_num_seqs } else { 0 };
        self.scheduler = scheduler(&self.config, blocks, state_slots);
        Ok(())
    }

    /// Stops serving `name`; refused while a request uses it.
    pub fn evict_adapter(&mut self, name: &str) -> Result<(), EngineError> {
        let (_, uid) = self.adapters.find(name)?;
        if self.live.values().any(|l| l.adapter == uid) {
            return Err(EngineError::BadRequest(format!("adapter {name:?} is answering requests; evict it later")));
        }
        self.change_adapters(|slots| slots.evict(name))
    }

    /// The served adapters' names.
    pub fn adapters(&self) -> Vec<String> {
        self.adapters.names()
    }

    /// Checks `req` and queues it.
    pub fn add(&mut self, req: Request) -> Result<RequestId, EngineError> {
        let context = self.config.max_model_len;
        let bad = |m: String| Err(EngineError::BadRequest(m));
        let adapter = match &req.adapter {
            Some(name) => self.adapters.find(name)?.1,
            None => 0,
        };
        if req.prompt.is_empty() {
            return bad("the prompt is empty".into());
        }
        if req.prompt.len() >= context {
            return Err(EngineError::PromptTooLong { prompt: req.prompt.len(), context });
        }
        let vocab = self.runner.model().config().vocab_size;
        if let Some(id) = req.prompt.iter().find(|&&t| t as usize >= vocab) {
            return bad(format!("prompt token {id} is outside the vocabulary of {vocab}"));
        }
        if req.max_tokens == 0 {
            return bad("max_tokens must be at least 1".into());
        }
        req.sampling.validate().map_err(EngineError::BadRequest)?;
        if !req.stop.is_empty() && self.tokenizer.is_none() {
            return bad("stop strings need the engine's tokenizer".into());
        }
        let id = self.next_id;
        self.next_id += 1;
        let max_tokens = req.max_tokens.min(context - req.prompt.len());
        self.live.insert(
            id,
            Live {
                sampling: req.sampling,
                max_tokens,
                generated: 0,
                adapter,
                detok: Detokenizer::default(),
                stop: StopText::new(req.stop),
            },
        );
        self.scheduler.add(id, req.prompt, adapter);
        Ok(id)
    }

    /// The scores of `ids[1..]` under the base model or `adapter`, each with its `top` most
    /// likely tokens ([`score::score`]), computed between steps on the steps' thread.
    pub fn score(&self, ids: &[u32], adapter: Option<&str>, top: usize) -> Result<Vec<TokenLogprob>, EngineError> {
        let context = self.config.max_model_len;
        if ids.len() > context {
            return Err(EngineError::PromptTooLong { prompt: ids.len(), context });
        }
        if let Some(id) = ids.iter().find(|&&t| t as usize >= self.vocab) {
            return Err(EngineError::BadRequest(format!("token {id} is outside the vocabulary of {}", self.vocab)));
        }
        let adapters = adapter.map(|name| self.adapters.adapters(name)).transpose()?;
        let model = self.runner.model();
        Ok(self.pool.install(|| score::score(model, adapters, ids, self.vocab, top))?)
    }

    /// Drops a request (its client left): its blocks are free for the next step.
    pub fn abort(&mut self, id: RequestId) {
        self.live.remove(&id);
        self.scheduler.remove(id);
    }

    pub fn is_idle(&self) -> bool {
        self.live.is_empty()
    }

    /// The scheduler's and cache's invariants (for tests).
    #[cfg(test)]
    pub(super) fn check(&self) -> Result<(), String> {
        self.scheduler.check()
    }

    pub fn stats(&self) -> Stats {
        Stats {
            waiting: self.scheduler.waiting(),
            running: self.scheduler.running(),
            kv_used_blocks: self.scheduler.kv().used_blocks(),
            kv_total_blocks: self.scheduler.kv().total_blocks(),
            block_size: self.config.block_size,
            steps: self.steps,
            steps_ahead: self.steps_ahead,
        }
    }

    /// Runs one step: schedules, runs the model, samples, and returns what each request hears.
    /// With `overlap_steps`, the step after it is queued on the device before this one's tokens
    /// are read, when it can be planned without them ([`Scheduler::schedule_ahead`]).
    pub fn step(&mut self) -> Vec<(RequestId, Event)> {
        let current = match self.in_flight.take() {
            Some(f) if f.plan.seqs.iter().any(|s| self.live.contains_key(&s.seq)) => f,
            stale => {
                // Every request of a queued step has ended: nobody waits for its tokens.
                if let Some(f) = stale {
                    let _ = f.launched.read();
                }
                let plan = self.scheduler.schedule();
                if plan.seqs.is_empty() {
                    return self.fail_stalled();
                }
                match self.launch(&plan, None) {
                    Ok(launched) => InFlight { plan, launched },
                    Err(e) => return self.fail(&plan, &e),
                }
            }
        };
        if self.config.overlap_steps {
            self.in_flight = self.launch_ahead(&current);
            self.steps_ahead += usize::from(self.in_flight.is_some());
        }
        self.steps += 1;
        match current.launched.read() {
            Ok(sampled) => self.finish_step(&current.plan, sampled),
            Err(e) => self.fail(&current.plan, &e.into()),
        }
    }

    /// Ends every live request of `plan` with `e`.
    fn fail(&mut self, plan: &Schedule, e: &EngineError) -> Vec<(RequestId, Event)> {
        let msg = e.to_string();
        let ids: Vec<RequestId> = plan.seqs.iter().map(|s| s.seq).filter(|id| self.live.contains_key(id)).collect();
        ids.into_iter()
            .map(|id| {
                self.abort(id);
                (id, Event::Failed(msg.clone()))
            })
            .collect()
    }

    /// Nothing could be scheduled while requests wait: none fits the cache. Cannot happen with
    /// a cache that holds `max_model_len` (checked at start), but a stalled queue must not spin.
    fn fail_stalled(&mut self) -> Vec<(RequestId, Event)> {
        let ids: Vec<RequestId> = self.live.keys().copied().collect();
        ids.into_iter()
            .map(|id| {
                self.abort(id);
                (id, Event::Failed("the request does not fit the key/value cache".into()))
            })
            .collect()
    }

    /// Queues the step after `current` (every sequence decoding the token `current` draws) when
    /// nothing else could change it: no request waits, no sequence would pass the context, and
    /// at least one would go on past its token limit. `None` otherwise, or when it could not be
    /// queued (the next [`Engine::step`] then schedules afresh and meets any error itself).
    fn launch_ahead(&mut self, current: &InFlight) -> Option<InFlight> {
        let drawn = current.launched.ids()?;
        let mut goes_on = false;
        for s in &current.plan.seqs {
            let live = self.live.get(&s.seq)?;
            // Its token after `current`'s is at position `s.start + 2`.
            if s.start + 2 >= self.config.max_model_len {
                return None;
            }
            goes_on |= live.generated + 1 < live.max_tokens;
        }
        if !goes_on {
            return None;
        }
        let plan = self.scheduler.schedule_ahead(&current.plan)?;
        match self.launch(&plan, Some(drawn)) {
            Ok(launched) => Some(InFlight { plan, launched }),
            Err(e) => {
                tracing::debug!(error = %e, "the next step was not queued ahead");
                None
            }
        }
    }

    /// Queues `plan` on the device. `drawn`: the ids the step before it drew, still on the
    /// device, which its sequences decode (their draws are one token further on).
    fn launch(&self, plan: &Schedule, drawn: Option<&Tensor>) -> Result<Launched, EngineError> {
        // A sequence planned ahead has no token to show yet: the device holds it.
        const AHEAD: [u32; 1] = [0];
        let ahead = drawn.is_some();
        let mut seqs = Vec::with_capacity(plan.seqs.len());
        for s in &plan.seqs {
            let state = self.scheduler.seq(s.seq).ok_or(EngineError::Stopped)?;
            let live = self.live.get(&s.seq).ok_or(EngineError::Stopped)?;
            let adapter = match live.adapter {
                0 => None,
                uid => Some(
                    self.adapters
                        .slot_of(uid)
                        .ok_or_else(|| EngineError::BadRequest("the request's adapter is no longer served".into()))?,
                ),
            };
            seqs.push(StepSeq {
                tokens: if ahead { &AHEAD } else { &state.tokens[s.start..s.start + s.len] },
                start: s.start,
                blocks: self.scheduler.table(s.seq),
                adapter,
                sample: s.sample.then(|| sampler::row(&live.sampling, live.generated + usize::from(ahead))),
                state_slot: self.scheduler.kv().state_slot(s.seq),
            });
        }
        Ok(self.pool.install(|| self.runner.launch(&seqs, self.adapters.stack(), drawn))?)
    }

    fn finish_step(&mut self, plan: &Schedule, sampled: Vec<(u32, f32)>) -> Vec<(RequestId, Event)> {
        let samplers: Vec<RequestId> = plan.seqs.iter().filter(|s| s.sample).map(|s| s.seq).collect();
        let pairs: Vec<(RequestId, u32)> = samplers.iter().zip(&sampled).map(|(&id, &(t, _))| (id, t)).collect();
        self.scheduler.complete(plan, &pairs);
        let mut events = Vec::new();
        for (id, (token, logprob)) in samplers.into_iter().zip(sampled) {
            if let Some(ev) = self.on_token(id, token, logprob, &mut events) {
                events.push((id, ev));
            }
        }
        events
    }

    /// Handles a request's new token; returns its finishing event when it ends.
    fn on_token(
        &mut self,
        id: RequestId,
        token: u32,
        logprob: f32,
        events: &mut Vec<(RequestId, Event)>,
    ) -> Option<Event> {
        if logprob.is_nan() {
            // The sampler's mark of a row whose logits were not all finite: what it drew means
            // nothing, and the next steps would compute from it.
            self.live.get(&id)?;
            self.abort(id);
            return Some(Event::Failed(
                "the model's logits for this request were not finite (NaN): its weights may have diverged".into(),
            ));
        }
        let context_full = self.scheduler.seq(id).is_some_and(|s| s.tokens.len() >= self.config.max_model_len);
        let live = self.live.get_mut(&id)?;
        live.generated += 1;
        let mut reason = None;
        let stop_token = self.stop_ids.contains(&token).then_some(token);
        if stop_token.is_some() {
            reason = Some(FinishReason::Stop);
        } else {
            let mut text = String::new();
            if let Some(tok) = &self.tokenizer {
                match live.detok.push(tok, token) {
                    Ok(delta) => {
                        let released = live.stop.push(&delta);
                        text = released.text;
                        if released.stopped {
                            reason = Some(FinishReason::Stop);
                        }
                    }
                    Err(e) => {
                        self.abort(id);
                        return Some(Event::Failed(format!("decoding the answer: {e}")));
                    }
                }
            }
            events.push((id, Event::Token { id: token, logprob, text }));
            if reason.is_none() && (live.generated >= live.max_tokens || context_full) {
                reason = Some(FinishReason::Length);
            }
        }
        let reason = reason?;
        let live = self.live.get_mut(&id)?;
        let mut tail = String::new();
        if let Some(tok) = &self.tokenizer {
            // A stop string already cut the text; otherwise release what was held back.
            let rest = live.detok.finish(tok).unwrap_or_default();
            tail = live.stop.push(&rest).text + &live.stop.finish();
        }
        let state = self.scheduler.seq(id);
        let usage = Usage {
            prompt_tokens: state.map_or(0, |s| s.prompt_len),
            completion_tokens: live.generated - usize::from(stop_token.is_some()),
            cached_tokens: state.map_or(0, |s| s.cached),
        };
        self.abort(id);
        Some(Event::Finished { reason, text: tail, usage, stop_token })
    }
}
