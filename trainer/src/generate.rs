//! Sampling a continuation from a model: greedy, temperature and nucleus (top-p), seeded.
//!
//! [`generate`] prefills the prompt into a [`KvCache`], then draws one token per step and
//! hands each to a callback, which may stop the generation (a stop sequence found in the
//! decoded text, a client gone). Stop *tokens* (end of turn, end of text) end it without
//! being handed over. The same prompt, [`Sampling`] and seed give the same tokens.

use std::ops::ControlFlow;

use candle_core::DType;

use crate::model::rng::SplitMix64;
use crate::model::{Adapters, CausalLm, KvCache, ModelError};

/// How the next token is chosen.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sampling {
    /// 0 chooses the most likely token (greedy); otherwise logits are divided by it.
    pub temperature: f64,
    /// Keep the smallest set of most likely tokens whose probability reaches `top_p`.
    pub top_p: f64,
    pub seed: u64,
}

impl Sampling {
    pub const fn greedy() -> Sampling {
        Sampling { temperature: 0.0, top_p: 1.0, seed: 0 }
    }

    /// Checks the ranges OpenAI's API accepts: temperature in [0, 2], top_p in (0, 1].
    pub fn validate(&self) -> Result<(), String> {
        if !(0.0..=2.0).contains(&self.temperature) {
            return Err(format!("temperature {} is outside [0, 2]", self.temperature));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(format!("top_p {} is outside (0, 1]", self.top_p));
        }
        Ok(())
    }
}

/// Why generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finish {
    /// A stop token, or the callback asked to stop.
    Stop,
    /// `max_tokens` reached, or the context is full.
    Length,
}

/// What to generate after a prompt.
#[derive(Debug, Clone, Copy)]
pub struct Limits<'a> {
    pub max_tokens: usize,
    /// Ids at or above this are never drawn: a model's embedding table is often padded
    /// beyond what its tokenizer can decode (the byte tokenizer's 266 in a 512 table).
    pub vocab: usize,
    /// End generation without being handed over.
    pub stop_ids: &'a [u32],
}

/// Generates up to `limits.max_tokens` tokens after `prompt`, calling `on_token` with each.
pub fn generate(
    model: &CausalLm,
    adapters: Option<&Adapters>,
    prompt: &[u32],
    limits: Limits<'_>,
    sampling: &Sampling,
    mut on_token: impl FnMut(u32) -> ControlFlow<()>,
) -> Result<Finish, ModelError> {
    let Limits { max_tokens, vocab, stop_ids } = limits;
    let mut cache: KvCache = model.new_cache(prompt.len() + max_tokens);
    if prompt.len() >= cache.capacity() {
        return Err(ModelError::Batch(format!(
            "the prompt has {} tokens; the context holds {}",
            prompt.len(),
            cache.capacity()
        )));
    }
    let mut sampler = Sampler::new(*sampling);
    let mut logits = model.decode(prompt, &mut cache, adapters)?;
    for produced in 1..=max_tokens {
        let row = logits.to_dtype(DType::F64)?.to_vec1::<f64>()?;
        let next = sampler.next(&row[..vocab.clamp(1, row.len())]);
        if stop_ids.contains(&next) || on_token(next).is_break() {
            return Ok(Finish::Stop);
        }
        if produced == max_tokens || cache.len() == cache.capacity() {
            break;
        }
        logits = model.decode(&[next], &mut cache, adapters)?;
    }
    Ok(Finish::Length)
}

/// Draws tokens from logits by a [`Sampling`], from its own seeded stream.
pub struct Sampler {
    sampling: Sampling,
    rng: SplitMix64,
}

impl Sampler {
    pub fn new(sampling: Sampling) -> Sampler {
        Sampler { sampling, rng: SplitMix64::derive(sampling.seed, &[0x5a3b]) }
    }

    pub fn next(&mut self, logits: &[f64]) -> u32 {
        if self.sampling.temperature <= 0.0 {
            return argmax(logits);
        }
        let max = logits.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let mut probs: Vec<(u32, f64)> = logits
            .iter()
            .enumerate()
            .map(|(i, &l)| (i as u32, ((l - max) / self.sampling.temperature).exp()))
            .collect();
        let total: f64 = probs.iter().map(|p| p.1).sum();
        if self.sampling.top_p < 1.0 {
            // Most likely first; ties by id so the order (and the draw) is reproducible.
            probs.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
            let mut kept = 0.0;
            let keep = probs
                .iter()
                .position(|p| {
                    kept += p.1;
                    kept >= self.sampling.top_p * total
                })
                .map_or(probs.len(), |i| i + 1);
            probs.truncate(keep);
        }
        let mass: f64 = probs.iter().map(|p| p.1).sum();
        let mut u = self.rng.unit() * mass;
        for &(id, p) in &probs {
            if u < p {
                return id;
            }
            u -= p;
        }
        probs.last().map_or(0, |p| p.0)
    }
}

/// The first index of the largest logit.
fn argmax(logits: &[f64]) -> u32 {
    let mut best = 0;
    for (i, &l) in logits.iter().enumerate() {
        if l > logits[best] {
            best = i;
        }
    }
    best as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greedy_takes_the_first_maximum() {
        let mut s = Sampler::new(Sampling::greedy());
        assert_eq!(s.next(&[0.1, 2.0, 2.0, -1.0]), 1);
    }

    #[test]
    fn sampling_is_seeded_and_follows_the_distribution() {
        let logits = [0.0, (3f64).ln(), f64::NEG_INFINITY];
        let draw = |seed| {
            let mut s = Sampler::new(Sampling { temperature: 1.0, top_p: 1.0, seed });
            (0..4000).map(|_| s.next(&logits)).collect::<Vec<_>>()
        };
        assert_eq!(draw(5), draw(5));
        assert_ne!(draw(5), draw(6));
        let ones = draw(5).iter().filter(|&&t| t == 1).count() as f64 / 4000.0;
        assert!((ones - 0.75).abs() < 0.03, "p(1) = {ones}, expected 0.75");
        assert!(!draw(5).contains(&2), "a -inf logit is never drawn");
    }

    #[test]
    fn top_p_keeps_only_the_nucleus_and_low_temperature_sharpens() {
        // p = [0.5, 0.3, 0.2]: top_p 0.6 keeps tokens 0 and 1 only.
        let logits = [0.5f64.ln(), 0.3f64.ln(), 0.2f64.ln()];
        let mut s = Sampler::new(Sampling { temperature: 1.0, top_p: 0.6, seed: 1 });
        let draws: Vec<u32> = (0..2000).map(|_| s.next(&logits)).collect();
        assert!(!draws.contains(&2));
        assert!(draws.contains(&1));
        let mut cold = Sampler::new(Sampling { temperature: 0.05, top_p: 1.0, seed: 1 });
        assert!((0..200).all(|_| cold.next(&logits) == 0));
    }

    #[test]
    fn out_of_range_settings_are_named() {
        assert!(Sampling { temperature: 2.5, ..Sampling::greedy() }.validate().unwrap_err().contains("temperature"));
        assert!(Sampling { top_p: 0.0, ..Sampling::greedy() }.validate().unwrap_err().contains("top_p"));
        assert!(Sampling::greedy().validate().is_ok());
    }
}
