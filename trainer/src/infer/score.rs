//! Log-probabilities of a given token sequence under the served model: what an evaluation
//! harness reads back (OpenAI completions' `echo` with `logprobs`): for every token after the
//! first, its own log-probability given the tokens before it and the `top` most likely tokens
//! at that position.
//!
//! One forward over the whole sequence ([`CausalLm::logits`], the trainer's unpaged forward),
//! not the engine's paged prefill: prefill skips positions the prefix cache already holds and
//! keeps only the logits of the rows that sample, while a score needs every position's.

use candle_core::{DType, Tensor};

use crate::batch::PackedBatch;
use crate::model::{Adapters, CausalLm, ModelError};

/// One scored position: the token there, its log-probability given what precedes it, and the
/// most likely tokens there (most likely first).
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprob {
    pub id: u32,
    pub logprob: f32,
    pub top: Vec<(u32, f32)>,
}

/// The scores of `ids[1..]` (the first token has no context to be predicted from), with the
/// `top` most likely tokens per position, over the first `vocab` ids (those the tokenizer can
/// decode; the sampler draws among the same). Log-softmax in f32 whatever the model's dtype.
pub fn score(
    model: &CausalLm,
    adapters: Option<&Adapters>,
    ids: &[u32],
    vocab: usize,
    top: usize,
) -> Result<Vec<TokenLogprob>, ModelError> {
    let n = ids.len();
    if n < 2 {
        return Ok(Vec::new());
    }
    let batch = PackedBatch::single_row(ids);
    let logits = model.logits(&batch, adapters)?.squeeze(0)?;
    // Position t predicts token t + 1: the last position predicts nothing here.
    let width = logits.dim(1)?.min(vocab.max(1));
    let rows = logits.narrow(0, 0, n - 1)?.narrow(1, 0, width)?.to_dtype(DType::F32)?;
    let logprobs: Vec<Vec<f32>> = log_softmax(&rows)?.to_vec2()?;
    Ok(logprobs
        .iter()
        .zip(&ids[1..])
        .map(|(row, &id)| TokenLogprob {
            id,
            logprob: row.get(id as usize).copied().unwrap_or(f32::NEG_INFINITY),
            top: most_likely(row, top),
        })
        .collect())
}

/// Row-wise log-softmax of `[rows, vocab]` f32 logits, shifted by each row's maximum.
fn log_softmax(x: &Tensor) -> candle_core::Result<Tensor> {
    let shifted = x.broadcast_sub(&x.max_keepdim(1)?)?;
    shifted.broadcast_sub(&shifted.exp()?.sum_keepdim(1)?.log()?)
}

/// The `k` highest entries of `row` as `(id, value)`, highest first (lower id first on a tie).
fn most_likely(row: &[f32], k: usize) -> Vec<(u32, f32)> {
    let mut order: Vec<u32> = (0..row.len() as u32).collect();
    order.sort_by(|&a, &b| row[b as usize].total_cmp(&row[a as usize]).then(a.cmp(&b)));
    order.into_iter().take(k).map(|i| (i, row[i as usize])).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::LmConfig;
    use candle_core::Device;

    #[test]
    fn scores_are_the_log_softmax_of_each_next_token_and_the_top_is_sorted() {
        let config = LmConfig::timing_shape("tiny").unwrap();
        let model = CausalLm::init_random(&config, 7, DType::F32, &Device::Cpu).unwrap();
        let ids = [1u32, 5, 9, 2];
        let scored = score(&model, None, &ids, config.vocab_size, 3).unwrap();
        assert_eq!(scored.iter().map(|s| s.id).collect::<Vec<_>>(), [5, 9, 2]);
        let batch = PackedBatch::single_row(&ids);
        let logits = model.logits(&batch, None).unwrap().to_dtype(DType::F64).unwrap().to_vec3::<f64>().unwrap();
        for (t, s) in scored.iter().enumerate() {
            let row = &logits[0][t];
            let lse = row.iter().map(|v| v.exp()).sum::<f64>().ln();
            assert!((s.logprob as f64 - (row[s.id as usize] - lse)).abs() < 1e-4);
            assert_eq!(s.top.len(), 3);
            assert!(s.top.windows(2).all(|w| w[0].1 >= w[1].1));
            let best = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            assert!((s.top[0].1 as f64 - (best - lse)).abs() < 1e-4);
        }
    }
}
