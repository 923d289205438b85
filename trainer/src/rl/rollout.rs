//! Rollouts: every prompt's completions, sampled through the serving engine
//! ([`crate::infer::Engine`]) in one continuous batch on the model's own device, with the
//! paged key/value cache and its prefix cache (a prompt's `num_generations` copies compute its
//! whole blocks once). Each completion draws from its own seeded stream, so a rollout is the
//! same whatever else shares the batch.

use std::collections::HashMap;
use std::time::Instant;

use crate::infer::{Engine, EngineError, Event, FinishReason, Request, RequestId, SamplingParams};
use crate::model::rng::SplitMix64;

/// What to sample.
#[derive(Debug, Clone, Copy)]
pub struct RolloutSpec<'a> {
    pub per_prompt: usize,
    pub max_new_tokens: usize,
    /// 0 is greedy.
    pub temperature: f64,
    /// Completion `j` of prompt `i` draws from `(seed, i, j)`.
    pub seed: u64,
    /// The served adapter that answers (`None`: the engine's base weights).
    pub adapter: Option<&'a str>,
}

/// One completion.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Generation {
    /// Index of its prompt.
    pub prompt: usize,
    /// The generated tokens, ending with the stop token when one ended it (what is learned).
    pub tokens: Vec<u32>,
    pub text: String,
    /// Generated tokens without the stop token.
    pub completion_tokens: usize,
    /// The length limit (or the context) ended it.
    pub truncated: bool,
}

/// What a rollout cost.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct RolloutStats {
    pub seconds: f64,
    /// Tokens sampled (stop tokens included).
    pub tokens: usize,
    pub prompt_tokens: usize,
    /// Prompt tokens found in the prefix cache.
    pub cached_tokens: usize,
    pub engine_steps: usize,
}

impl RolloutStats {
    pub fn tokens_per_s(&self) -> f64 {
        self.tokens as f64 / self.seconds.max(1e-9)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum RolloutError {
    #[error("rollout: {0}")]
    Engine(#[from] EngineError),
    #[error("rollout of prompt {prompt}: {message}")]
    Failed { prompt: usize, message: String },
}

/// Samples `spec.per_prompt` completions of every prompt, all in one batch; returns them
/// grouped by prompt (prompt 0's first, in order).
pub fn rollout(
    engine: &mut Engine,
    prompts: &[Vec<u32>],
    spec: &RolloutSpec<'_>,
) -> Result<(Vec<Generation>, RolloutStats), RolloutError> {
    let started = Instant::now();
    let mut slots: HashMap<RequestId, usize> = HashMap::new();
    let mut out: Vec<Generation> = Vec::with_capacity(prompts.len() * spec.per_prompt);
    for (i, prompt) in prompts.iter().enumerate() {
        for j in 0..spec.per_prompt {
            let seed = SplitMix64::derive(spec.seed, &[i as u64, j as u64]).next_u64();
            let req = Request {
                prompt: prompt.clone(),
                max_tokens: spec.max_new_tokens,
                sampling: SamplingParams { temperature: spec.temperature, top_p: 1.0, top_k: 0, seed },
                adapter: spec.adapter.map(str::to_string),
                stop: Vec::new(),
            };
            let id = match engine.add(req) {
                Ok(id) => id,
                Err(e) => {
                    // Nothing of this rollout may stay queued for the next one.
                    for id in slots.keys() {
                        engine.abort(*id);
                    }
                    return Err(e.into());
                }
            };
            slots.insert(id, out.len());
            out.push(Generation {
                prompt: i,
                tokens: Vec::new(),
                text: String::new(),
                completion_tokens: 0,
                truncated: false,
            });
        }
    }
    let mut stats = RolloutStats::default();
    let mut left = out.len();
    while left > 0 {
        if engine.is_idle() {
            return Err(RolloutError::Failed {
                prompt: 0,
                message: "the engine went idle before every completion ended".into(),
            });
        }
        stats.engine_steps += 1;
        for (id, event) in engine.step() {
            let Some(&k) = slots.get(&id) else { continue };
            let g = &mut out[k];
            match event {
                Event::Token { id, text, .. } => {
                    g.tokens.push(id);
                    g.text.push_str(&text);
                }
                Event::Finished { reason, text, usage, stop_token } => {
                    g.text.push_str(&text);
                    g.completion_tokens = usage.completion_tokens;
                    g.truncated = reason == FinishReason::Length;
                    g.tokens.extend(stop_token);
                    stats.prompt_tokens += usage.prompt_tokens;
                    stats.cached_tokens += usage.cached_tokens;
                    left -= 1;
                }
                Event::Failed(message) => {
                    let prompt = g.prompt;
                    for id in slots.keys() {
                        engine.abort(*id);
                    }
                    return Err(RolloutError::Failed { prompt, message });
                }
            }
        }
    }
    stats.tokens = out.iter().map(|g| g.tokens.len()).sum();
    stats.seconds = started.elapsed().as_secs_f64();
    Ok((out, stats))
}
