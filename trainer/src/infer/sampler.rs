//! The next token of every sampling row of a step, in one batched call on the model's device
//! (`mindxtrain_kernels::sampling`), each row seeded by its own request.
//!
//! A request's `n`-th generated token draws its uniform from `(seed, n)` alone, so what it
//! samples does not depend on which other requests share the batch, on preemption, or on how
//! its prompt was chunked: interleaved requests give the tokens one-at-a-time generation gives.

use candle_core::Tensor;
use mindxtrain_kernels::sampling::{self, Draws, RowSampling};

use super::request::SamplingParams;
use crate::model::rng::SplitMix64;

/// Row settings for a request about to draw its `index`-th generated token (0-based).
pub fn row(params: &SamplingParams, index: usize) -> RowSampling {
    let uniform = SplitMix64::derive(params.seed, &[0x5a3b, index as u64]).unit() as f32;
    RowSampling {
        temperature: params.temperature as f32,
        top_p: params.top_p as f32,
        top_k: params.top_k,
        // The f32 rounding of a draw just under 1 could reach 1: keep it inside [0, 1).
        uniform: uniform.min(1.0 - f32::EPSILON),
    }
}

/// `logits` `[rows, model vocabulary]` → per row `(token, log-probability)`, drawing only among
/// the first `vocab` ids (a model's embedding table is often padded past what its tokenizer
/// can decode).
pub fn sample(logits: &Tensor, rows: &[RowSampling], vocab: usize) -> candle_core::Result<Vec<(u32, f32)>> {
    launch(logits, rows, vocab)?.read()
}

/// [`sample`] launched, not waited for: the ids stay on the device for a step that decodes them.
pub fn launch(logits: &Tensor, rows: &[RowSampling], vocab: usize) -> candle_core::Result<Draws> {
    let width = logits.dim(1)?;
    let logits = if vocab > 0 && vocab < width { logits.narrow(1, 0, vocab)? } else { logits.clone() };
    sampling::launch(&logits.contiguous()?, rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draws_depend_on_the_seed_and_the_token_index_only() {
        let p = SamplingParams { temperature: 1.0, top_p: 1.0, top_k: 0, seed: 9 };
        assert_eq!(row(&p, 3), row(&p, 3));
        assert_ne!(row(&p, 3).uniform, row(&p, 4).uniform);
        assert_ne!(row(&p, 3).uniform, row(&SamplingParams { seed: 10, ..p }, 3).uniform);
        assert!((0..1000).all(|i| (0.0..1.0).contains(&row(&p, i).uniform)));
    }

    #[test]
    fn padded_vocabulary_columns_are_never_drawn() -> candle_core::Result<()> {
        let logits = Tensor::new(&[[0.0f32, 1.0, 50.0]], &candle_core::Device::Cpu)?;
        assert_eq!(sample(&logits, &[RowSampling::GREEDY], 2)?[0].0, 1);
        assert_eq!(sample(&logits, &[RowSampling::GREEDY], 3)?[0].0, 2);
        Ok(())
    }
}
