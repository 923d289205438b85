//! Incremental decoding: a key/value cache and the forward of new tokens over it.
//!
//! Generation runs the prompt once (prefill), then one token per step, each step reading
//! what every earlier token left in the [`KvCache`] instead of recomputing the prefix: an
//! attention layer's keys and values, a Gated DeltaNet layer's recurrent state (its conv's last
//! inputs and the delta rule's state, advanced by the kernels' `step`). Blocks share their
//! projections, norms, output gate and MLP with training ([`StepCtx::attention_inputs`],
//! [`StepCtx::block_tail`]); only the mixer's pass over the past differs
//! (`mindxtrain_kernels::attention::cached`, [`CausalLm::linear_step`]).

use std::collections::BTreeMap;

use candle_core::Tensor;
use mindxtrain_kernels::attention::cached;
use mindxtrain_kernels::{embedding, linear, rmsnorm};

use super::attention_parts::{gated, sigmoid};
use super::block::StepCtx;
use super::causal_lm::{CausalLm, Trainable};
use super::linear_attention::LinearInputs;
use super::lora::Adapters;
use super::params::{EMBED, FINAL_NORM};
use super::recurrent::RecurrentState;
use super::{LayerKind, ModelError, Proj};
use crate::batch::{IGNORE, PackedBatch};

/// What every layer keeps of the tokens decoded so far, up to a fixed capacity (the context
/// length a request may reach).
#[derive(Debug, Clone)]
pub struct KvCache {
    layers: Vec<Option<Past>>,
    len: usize,
    capacity: usize,
}

/// One layer's past: keys and values `[1, kv_heads, len, head_dim]`, or a recurrent state.
#[derive(Debug, Clone)]
enum Past {
    Kv(Tensor, Tensor),
    Recurrent(RecurrentState),
}

impl KvCache {
    /// Tokens already in the cache (the position of the next one).
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }
}

impl CausalLm {
    /// An empty cache for up to `capacity` tokens (prompt and generation together), at most
    /// the model's `max_position_embeddings`.
    pub fn new_cache(&self, capacity: usize) -> KvCache {
        let capacity = capacity.min(self.config().max_position_embeddings);
        KvCache { layers: vec![None; self.config().num_hidden_layers], len: 0, capacity }
    }

    /// Runs `tokens` after the ones `cache` holds, appends their keys and values, and returns
    /// the logits `[vocab]` that follow the last of them. On error the cache is unchanged.
    pub fn decode(
        &self,
        tokens: &[u32],
        cache: &mut KvCache,
        adapters: Option<&Adapters>,
    ) -> Result<Tensor, ModelError> {
        self.check_servable()?;
        let t = tokens.len();
        if t == 0 {
            return Err(ModelError::Batch("decoding needs at least one token".into()));
        }
        if cache.len + t > cache.capacity {
            return Err(ModelError::Batch(format!(
                "{} cached + {t} new tokens exceed the context of {} tokens",
                cache.len, cache.capacity
            )));
        }
        let start = cache.len as u32;
        let batch = PackedBatch {
            batch: 1,
            seq_len: t,
            input_ids: tokens.to_vec(),
            position_ids: (start..start + t as u32).collect(),
            segment_ids: vec![1; t],
            labels: vec![IGNORE; t],
        };
        let ctx = self.step_ctx(&batch, Trainable::Adapters, adapters, None, &super::NoHooks)?;
        let ids = Tensor::new(tokens, self.device())?;
        let mut x = embedding::forward(&ids, &*self.weight(EMBED)?)?;
        let mut updated = Vec::with_capacity(cache.layers.len());
        for (layer, past) in cache.layers.iter().enumerate() {
            let (out, kept) = decode_block(&ctx, layer, &x, past.as_ref())?;
            updated.push(Some(kept));
            x = out;
        }
        let last = x.narrow(0, t - 1, 1)?;
        let (h, _) = rmsnorm::forward(&last, &*ctx.norm_gain(FINAL_NORM)?, self.config().rms_norm_eps)?;
        let logits = linear::forward(self.kernels(), &h, &*self.weight(self.head_name())?)?.flatten_all()?;
        cache.layers = updated;
        cache.len += t;
        Ok(logits)
    }
}

/// One block over new tokens `x` (`[T, hidden]`) given what the layer kept of the past;
/// returns the block output and what it keeps now (the new tokens included).
fn decode_block(
    ctx: &StepCtx<'_>,
    layer: usize,
    x: &Tensor,
    past: Option<&Past>,
) -> Result<(Tensor, Past), ModelError> {
    let mut lora = BTreeMap::new();
    let (h1, _) = ctx.input_norm(layer, x)?;
    let (mixed, kept, out_proj) = match (ctx.model.config().layer_kind(layer), past) {
        (LayerKind::Attention, None | Some(Past::Kv(..))) => {
            let qkv = ctx.attention_inputs(layer, &h1, &mut lora)?;
            let (k, v) = match past {
                Some(Past::Kv(pk, pv)) => (Tensor::cat(&[pk, &qkv.k], 2)?, Tensor::cat(&[pv, &qkv.v], 2)?),
                _ => (qkv.k, qkv.v),
            };
            let scale = 1.0 / (ctx.model.config().head_dim as f64).sqrt();
            let o = cached::forward(&qkv.q, &k, &v, scale)?;
            let attn = o.transpose(1, 2)?.reshape((x.dim(0)?, ()))?;
            let gate = qkv.gate.as_ref().map(sigmoid).transpose()?;
            (gated(&attn, gate.as_ref())?, Past::Kv(k, v), Proj::O)
        }
        (LayerKind::LinearAttention, None | Some(Past::Recurrent(_))) => {
            let inputs = LinearInputs::project(&h1, |p, h| ctx.proj_forward(layer, p, h, None))?;
            let state = match past {
                Some(Past::Recurrent(s)) => Some(s),
                _ => None,
            };
            let (mixed, state) = ctx.model.linear_step(layer, &inputs, (1, x.dim(0)?), state)?;
            (mixed, Past::Recurrent(state), Proj::OutProj)
        }
        (kind, Some(_)) => {
            return Err(ModelError::Batch(format!("layer {layer} ({kind:?}) holds another kind's cache")));
        }
    };
    let out = ctx.block_tail(layer, x, &mixed, out_proj, &mut lora)?.out;
    Ok((out, kept))
}
