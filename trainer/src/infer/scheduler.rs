//! Which tokens of which sequences run in the next step: plain data, no tensors (vLLM's
//! scheduler, in our terms).
//!
//! Every step has a token budget (`max_batched_tokens`) and a cap on sequences
//! (`max_num_seqs`). Running sequences go first, those with one token left to compute (decodes)
//! before those still prefilling, so a long prompt never stalls streams already running; a
//! prompt is prefilled in chunks of what the budget leaves. Then waiting sequences are admitted
//! in arrival order, each starting after the longest prefix the cache already holds. When a
//! running sequence needs a block and none is free, the sequence that arrived last is preempted:
//! its blocks are freed and it goes back to the front of the queue, to be recomputed (prompt and
//! what it generated so far) when room returns.

use std::collections::{HashMap, VecDeque};

use super::kv::{BlockId, Hit, KvManager, SeqId};

/// The step limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SchedulerConfig {
    pub max_num_seqs: usize,
    pub max_batched_tokens: usize,
}

/// A sequence as the scheduler sees it.
#[derive(Debug, Clone)]
pub struct SeqState {
    /// Prompt, then every generated token.
    pub tokens: Vec<u32>,
    pub prompt_len: usize,
    /// Tokens whose keys and values are in the cache.
    pub computed: usize,
    /// The prefix-cache tag of the adapter that computes it (0: the base).
    pub adapter: u64,
    /// Prompt tokens its last admission found in the prefix cache.
    pub cached: usize,
}

/// One sequence's share of a step: tokens `start .. start + len` run, and with `sample` the
/// step ends with its next token drawn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Scheduled {
    pub seq: SeqId,
    pub start: usize,
    pub len: usize,
    pub sample: bool,
}

/// What the next step runs (vLLM's `SchedulerOutput`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Schedule {
    pub seqs: Vec<Scheduled>,
    /// Sequences sent back to the queue this step (their blocks are free again).
    pub preempted: Vec<SeqId>,
}

impl Schedule {
    pub fn tokens(&self) -> usize {
        self.seqs.iter().map(|s| s.len).sum()
    }
}

#[derive(Debug)]
pub struct Scheduler {
    config: SchedulerConfig,
    kv: KvManager,
    seqs: HashMap<SeqId, SeqState>,
    waiting: VecDeque<SeqId>,
    /// In admission order: the last is preempted first.
    running: Vec<SeqId>,
}

impl Scheduler {
    pub fn new(config: SchedulerConfig, kv: KvManager) -> Scheduler {
        Scheduler { config, kv, seqs: HashMap::new(), waiting: VecDeque::new(), running: Vec::new() }
    }

    /// Queues a new sequence (its id must be new).
    pub fn add(&mut self, seq: SeqId, prompt: Vec<u32>, adapter: u64) {
        let state = SeqState { prompt_len: prompt.len(), tokens: prompt, computed: 0, adapter, cached: 0 };
        self.seqs.insert(seq, state);
        self.waiting.push_back(seq);
    }

    /// Drops a sequence wherever it is (finished, cancelled, or its client left) and frees its
    /// blocks; `false` if it was not here.
    pub fn remove(&mut self, seq: SeqId) -> bool {
        self.kv.free(seq);
        self.waiting.retain(|&s| s != seq);
        self.running.retain(|&s| s != seq);
        self.seqs.remove(&seq).is_some()
    }

    pub fn seq(&self, seq: SeqId) -> Option<&SeqState> {
        self.seqs.get(&seq)
    }

    pub fn table(&self, seq: SeqId) -> &[BlockId] {
        self.kv.table(seq)
    }

    pub fn kv(&self) -> &KvManager {
        &self.kv
    }

    pub fn waiting(&self) -> usize {
        self.waiting.len()
    }

    pub fn running(&self) -> usize {
        self.running.len()
    }

    pub fn is_idle(&self) -> bool {
        self.seqs.is_empty()
    }

    /// Plans the next step.
    pub fn schedule(&mut self) -> Schedule {
        let mut out = Schedule::default();
        // Decodes first, then running prefills, each group in admission order.
        let order: Vec<SeqId> = {
            let left = |s: &SeqId| self.seqs[s].tokens.len() - self.seqs[s].computed;
            let (decodes, prefills): (Vec<SeqId>, Vec<SeqId>) = self.running.iter().partition(|s| left(s) == 1);
            decodes.into_iter().chain(prefills).collect()
        };
        for seq in order {
            // Recounted each time: a preempted sequence gives its share back.
            let budget = self.config.max_batched_tokens - out.tokens();
            if budget == 0 {
                break;
            }
            if !self.running.contains(&seq) {
                continue; // preempted to make room for an earlier one
            }
            let s = &self.seqs[&seq];
            let len = (s.tokens.len() - s.computed).min(budget);
            let start = s.computed;
            if !self.make_room(seq, start + len, &mut out) {
                continue;
            }
            out.seqs.push(Scheduled { seq, start, len, sample: start + len == self.seqs[&seq].tokens.len() });
        }
        if out.preempted.is_empty() {
            let mut budget = self.config.max_batched_tokens - out.tokens();
            self.admit(&mut budget, &mut out);
        }
        out
    }

    /// Grows `seq`'s blocks to `tokens`, preempting the latest-admitted running sequences
    /// (possibly `seq` itself) until they fit. Returns whether `seq` still runs.
    /// The step after `prev`, planned before `prev`'s tokens are known: every sequence of
    /// `prev` decodes the token `prev` draws. Only when that is what [`Scheduler::schedule`]
    /// would plan once they are: `prev` decoded every running sequence, none waits, and each
    /// gets room for one more token without preempting anyone. Its sequences' states are those
    /// before `prev` completes: complete `prev`, then this.
    pub fn schedule_ahead(&mut self, prev: &Schedule) -> Option<Schedule> {
        let decodes_all = !prev.seqs.is_empty()
            && prev.preempted.is_empty()
            && self.waiting.is_empty()
            && prev.seqs.len() == self.running.len()
            && prev.seqs.iter().all(|s| {
                s.len == 1
                    && s.sample
                    && self.running.contains(&s.seq)
                    && self.seqs.get(&s.seq).is_some_and(|st| st.computed == s.start && st.tokens.len() == s.start + 1)
            });
        if !decodes_all {
            return None;
        }
        // Blocks grown for some before another found none stay: they are that sequence's next.
        if !prev.seqs.iter().all(|s| self.kv.grow(s.seq, s.start + 2)) {
            return None;
        }
        let seqs = prev.seqs.iter().map(|s| Scheduled { seq: s.seq, start: s.start + 1, len: 1, sample: true });
        Some(Schedule { seqs: seqs.collect(), preempted: Vec::new() })
    }

    fn make_room(&mut self, seq: SeqId, tokens: usize, out: &mut Schedule) -> bool {
        while !self.kv.grow(seq, tokens) {
            let Some(victim) = self.running.pop() else { return false };
            self.preempt(victim, out);
            if victim == seq {
                return false;
            }
        }
        true
    }

    fn preempt(&mut self, victim: SeqId, out: &mut Schedule) {
        self.kv.free(victim);
        if let Some(s) = self.seqs.get_mut(&victim) {
            s.computed = 0;
        }
        out.seqs.retain(|s| s.seq != victim);
        self.waiting.push_front(victim);
        out.preempted.push(victim);
    }

    /// Admits waiting sequences in order while the budget, the sequence cap and the pool allow.
    fn admit(&mut self, budget: &mut usize, out: &mut Schedule) {
        while *budget > 0 && self.running.len() < self.config.max_num_seqs {
            let Some(&seq) = self.waiting.front() else { break };
            let s = &self.seqs[&seq];
            let hit: Hit = self.kv.cached_prefix(&s.tokens, s.adapter);
            let start = hit.tokens;
            let len = (s.tokens.len() - start).min(*budget);
            let total = s.tokens.len();
            if !self.kv.admit(seq, hit, start + len) {
                break; // first come, first served: nothing overtakes the head of the queue
            }
            self.waiting.pop_front();
            self.running.push(seq);
            let s = self.seqs.get_mut(&seq).expect("waiting sequences are known");
            s.computed = start;
            s.cached = start.min(s.prompt_len);
            out.seqs.push(Scheduled { seq, start, len, sample: start + len == total });
            *budget -= len;
        }
    }

    /// Applies a step's results: the scheduled tokens are computed, and each sampled sequence
    /// gets its new token. Full computed blocks enter the prefix cache.
    pub fn complete(&mut self, schedule: &Schedule, sampled: &[(SeqId, u32)]) {
        for s in &schedule.seqs {
            if let Some(state) = self.seqs.get_mut(&s.seq) {
                state.computed = state.computed.max(s.start + s.len);
            }
        }
        for &(seq, token) in sampled {
            if let Some(state) = self.seqs.get_mut(&seq) {
                state.tokens.push(token);
            }
        }
        for s in &schedule.seqs {
            if let Some(state) = self.seqs.get(&s.seq) {
                self.kv.commit(s.seq, &state.tokens, state.computed, state.adapter);
            }
        }
    }

    /// Invariants for tests: every running sequence holds blocks, no waiting one does, and the
    /// pool's counts match the tables.
    pub fn check(&self) -> Result<(), String> {
        self.kv.check()?;
        for s in &self.running {
            if !self.kv.holds(*s) {
                return Err(format!("running sequence {s} holds no blocks"));
            }
        }
        for s in &self.waiting {
            if self.kv.holds(*s) {
                return Err(format!("waiting sequence {s} holds blocks"));
            }
        }
        if self.running.len() + self.waiting.len() != self.seqs.len() {
            return Err("a sequence is neither running nor waiting".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
