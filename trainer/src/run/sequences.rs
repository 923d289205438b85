//! Objectives over whole sequences (a prompt and its answer), the shape every RL step has:
//! the sequences are packed ([`crate::rl::pack`]), each one's learned tokens are found again
//! in the packed rows, and a per-sequence objective turns their log-probs into a loss and
//! its derivative per token.

use super::microbatch::accumulate;
use crate::batch::PackedBatch;
use crate::model::{Adapters, CausalLm, ModelError, ObjectiveValue, StepOptions, Trainable};
use crate::rl::pack::MicroBatch;
use candle_core::Tensor;
use std::collections::BTreeMap;

/// Each sequence's log-probs of its learned tokens under `model` (with `adapters`, or the bare
/// weights), without gradients; `n` sequences were packed into `mbs`.
pub fn token_logps(
    model: &CausalLm,
    adapters: Option<&Adapters>,
    mbs: &[MicroBatch],
    n: usize,
) -> Result<Vec<Vec<f64>>, ModelError> {
    let mut out = vec![Vec::new(); n];
    for mb in mbs {
        let lp = model.token_logps(&mb.batch, adapters)?;
        for (i, at) in &mb.seqs {
            out[*i] = at.iter().map(|&p| lp[p]).collect();
        }
    }
    Ok(out)
}

/// One forward and backward per micro-batch; `objective(i, logps)` gives sequence `i`'s loss
/// and `d loss / d logp` per learned token. Returns the summed loss (unscaled), the gradients
/// of `opts.loss_scale ·` it summed over the micro-batches, and the tokens computed.
pub fn forward_backward(
    model: &CausalLm,
    trainable: Trainable,
    adapters: Option<&Adapters>,
    mbs: &[MicroBatch],
    opts: &StepOptions,
    mut objective: impl FnMut(usize, &[f64]) -> (f64, Vec<f64>),
) -> Result<(f64, BTreeMap<String, Tensor>, u64), ModelError> {
    let mut grads = BTreeMap::new();
    let (mut loss, mut tokens) = (0.0, 0u64);
    for mb in mbs {
        let out = model.forward_backward_logps(&mb.batch, trainable, adapters, opts, |lp| {
            let mut value = ObjectiveValue { loss: 0.0, d_logp: vec![0.0; lp.len()] };
            for (i, at) in &mb.seqs {
                let mine: Vec<f64> = at.iter().map(|&p| lp[p]).collect();
                let (l, d) = objective(*i, &mine);
                value.loss += l;
                for (&p, d) in at.iter().zip(d) {
                    value.d_logp[p] = d;
                }
            }
            Ok(value)
        })?;
        loss += out.loss;
        tokens += real_tokens(&mb.batch);
        accumulate(&mut grads, out.grads)?;
    }
    Ok((loss, grads, tokens))
}

/// Tokens of a batch that are not padding.
fn real_tokens(b: &PackedBatch) -> u64 {
    b.segment_ids.iter().filter(|&&s| s != 0).count() as u64
}
