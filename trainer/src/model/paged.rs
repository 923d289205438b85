//! The serving forward: a flat batch of tokens from many sequences (prefill chunks and decode
//! tokens mixed) over a paged key/value cache, each row with its own position and adapter.
//!
//! Training batches are `[B, T]` rectangles with a packing mask; a serving step is ragged (one
//! row for a sequence that decodes, hundreds for a prompt chunk) and reads keys that earlier
//! steps left in the cache. So the attention metadata here comes from the kernels' own
//! [`PagedMeta`], not from a training batch, and the block is the inference one: projections
//! (with every row's adapter), the fused norm/RoPE/cache write (unfused with partial RoPE),
//! paged attention (gated on Qwen3.5), the MLP (or a sparse layer's routed experts, and on
//! Qwen3.5-MoE its gated shared expert through the helper training uses). A Gated
//! DeltaNet layer advances each sequence's recurrent state in its slot instead
//! ([`super::paged_linear`]).

use std::borrow::Cow;

use candle_core::Tensor;
use mindxtrain_kernels::multi_lora::{self, RowAdapters};
use mindxtrain_kernels::paged_attention::{self, PagedMeta};
use mindxtrain_kernels::{embedding, linear, rmsnorm, rope, swiglu};

use super::adapter_stack::AdapterStack;
use super::attention_parts::{gated, rotate, sigmoid};
use super::mlp::with_shared_expert;
use super::moe::{self, MoeWeights};
use super::packed::Packing;
use super::paged_linear::{StateSlots, StateStep};
use super::params::{EMBED, FINAL_NORM, Norm, Proj, base_weight_name, norm_name};
use super::recurrent::StatePool;
use super::{CausalLm, ModelError, QkNorm};

/// One step's tokens and where they go, all on the model's device (so that a recorded step
/// reads them from buffers it can replay over).
pub struct PagedInputs<'a> {
    /// `[N]` u32 token ids (checked against the vocabulary by the caller), sequence after
    /// sequence in the order of `meta`.
    pub ids: &'a Tensor,
    /// `[N]` u32 positions (each row's place in its sequence), below `rope.positions()`.
    pub positions: &'a Tensor,
    pub rope: &'a RopeTables,
    pub meta: &'a PagedMeta,
    /// `[N]` u32 cache slots of the rows (`meta.slots()` on the model's device).
    pub slots: &'a Tensor,
    /// The stacked adapters and each row's slot in them; `None` runs the base alone.
    pub adapters: Option<(&'a AdapterStack, &'a RowAdapters)>,
    /// `[R]` u32 rows whose logits are wanted (the last row of each sequence that samples).
    pub logit_rows: &'a Tensor,
    /// Each sequence's state slot (in the order of `meta`), for a model with recurrent layers.
    pub state_slots: Option<StateSlots<'a>>,
}

/// RoPE's cosines and sines of every position a served sequence may reach, made once: a
/// step gathers its rows' by position on the device instead of computing them on the host.
#[derive(Debug, Clone)]
pub struct RopeTables {
    cos: Tensor,
    sin: Tensor,
}

impl RopeTables {
    /// Tables for positions `0..positions` of `model` (its head size, theta, dtype, device).
    pub fn new(model: &CausalLm, positions: usize) -> Result<RopeTables, ModelError> {
        let c = model.config();
        let all: Vec<u32> = (0..u32::try_from(positions.max(1)).unwrap_or(u32::MAX)).collect();
        // Over the rotated dims only (a hybrid rotates the first `rotary_dim` of a head).
        let (cos, sin) = rope::tables(&all, c.rotary_dim(), c.rope_theta, model.dtype(), model.device())?;
        Ok(RopeTables { cos, sin })
    }

    pub fn positions(&self) -> usize {
        self.cos.dims()[0]
    }
}

/// What one layer keeps in the serving engine (its [`super::LayerSpec`]).
#[derive(Debug)]
pub enum LayerCache {
    /// Keys and values, `[blocks, block_size, kv_heads, head_dim]` each.
    Attention { k: Tensor, v: Tensor },
    /// A recurrent state per slot ([`PagedInputs::state_slots`]).
    Recurrent(StatePool),
}

impl CausalLm {
    /// Runs the batch, writing every row's keys and values into `cache` (one pair per layer),
    /// and returns the logits `[R, vocab]` of `inputs.logit_rows`.
    pub fn forward_paged(&self, inputs: &PagedInputs<'_>, cache: &[LayerCache]) -> Result<Tensor, ModelError> {
        self.check_servable()?;
        let c = self.config();
        let n = inputs.ids.elem_count();
        if n == 0
            || inputs.positions.elem_count() != n
            || inputs.meta.rows() != n
            || cache.len() != c.num_hidden_layers
            || inputs.rope.cos.dim(1)? != c.rotary_dim()
            || inputs.state_slots.is_some_and(|s| s.len() != inputs.meta.sequences())
        {
            return Err(ModelError::Batch(format!(
                "paged step: {n} ids, {} positions, {} rows in the metadata, {} cached layers of {}, rope tables {:?}",
                inputs.positions.elem_count(),
                inputs.meta.rows(),
                cache.len(),
                c.num_hidden_layers,
                inputs.rope.cos.dims(),
            )));
        }
        let cos = inputs.rope.cos.index_select(inputs.positions, 0)?;
        let sin = inputs.rope.sin.index_select(inputs.positions, 0)?;
        // Where each sequence's recurrent state is read and written, planned once for every
        // recurrent layer.
        let states = inputs.state_slots.map(|slots| StateStep::new(inputs.meta, slots, self.device())).transpose()?;
        let mut stream = Residual { x: embedding::forward(inputs.ids, &*self.weight(EMBED)?)?, pending: None };
        for (layer, kept) in cache.iter().enumerate() {
            stream = self.paged_block(layer, &stream, inputs, (&cos, &sin), kept, states.as_ref())?;
        }
        let rows = Residual {
            x: stream.x.index_select(inputs.logit_rows, 0)?,
            pending: stream.pending.map(|p| p.index_select(inputs.logit_rows, 0)).transpose()?,
        };
        let (_, h) = rows.normed(&*self.gain(FINAL_NORM)?, c.rms_norm_eps)?;
        Ok(linear::forward(self.kernels(), &h, &*self.weight(self.head_name())?)?)
    }

    /// `x·Wᵀ` of projection `proj`, plus each row's adapter branch.
    fn paged_proj(&self, layer: usize, proj: Proj, x: &Tensor, inputs: &PagedInputs<'_>) -> Result<Tensor, ModelError> {
        let w = self.weight(&base_weight_name(layer, proj))?;
        let lora = inputs.adapters.and_then(|(stack, rows)| Some((stack.get(layer, proj)?, rows)));
        project(self, x, &w, lora)
    }

    /// The outputs of a group's projections side by side, `[N, Σ out]`: one product with the
    /// packed weight (and the group's adapter stack) where the model packs the group, else one
    /// per member, concatenated.
    fn paged_group(
        &self,
        layer: usize,
        packing: Packing,
        x: &Tensor,
        inputs: &PagedInputs<'_>,
    ) -> Result<Tensor, ModelError> {
        if let Some(w) = self.packed(layer, packing) {
            let lora = inputs.adapters.and_then(|(stack, rows)| Some((stack.group(layer, packing)?, rows)));
            return project(self, x, w, lora);
        }
        let parts =
            packing.members().iter().map(|&p| self.paged_proj(layer, p, x, inputs)).collect::<Result<Vec<_>, _>>()?;
        Ok(Tensor::cat(&parts, 1)?)
    }

    /// A norm's gain as every forward path scales by it ([`super::Arch::norm_gain`]).
    fn gain(&self, name: &str) -> Result<Cow<'_, Tensor>, ModelError> {
        Ok(self.config().arch.norm_gain(self.weight(name)?)?)
    }

    fn paged_block(
        &self,
        layer: usize,
        stream: &Residual,
        inputs: &PagedInputs<'_>,
        rope: (&Tensor, &Tensor),
        kept: &LayerCache,
        states: Option<&StateStep>,
    ) -> Result<Residual, ModelError> {
        let c = self.config();
        let eps = c.rms_norm_eps;
        let (x, h1) = stream.normed(&*self.gain(&norm_name(c, layer, Norm::Input))?, eps)?;
        let (mixed, out_proj) = match kept {
            LayerCache::Attention { k, v } => (self.paged_attention(layer, &h1, inputs, rope, (k, v))?, Proj::O),
            LayerCache::Recurrent(pool) => {
                let plan = states.ok_or_else(|| {
                    ModelError::Batch(format!("layer {layer} keeps a recurrent state: the step names no state slots"))
                })?;
                let project = |p, x: &Tensor| {
                    self.paged_proj(layer, p, x, inputs).map_err(|e| candle_core::Error::Msg(e.to_string()))
                };
                (self.paged_linear(layer, &h1, project, plan, pool)?, Proj::OutProj)
            }
        };
        let attn = self.paged_proj(layer, out_proj, &mixed, inputs)?;
        let post = self.gain(&norm_name(c, layer, Norm::PostAttention))?;
        let (x2, h2, _) = rmsnorm::add_forward(&x, &attn, &post, eps)?;
        let Some(shape) = c.moe.as_ref().filter(|m| m.is_sparse(layer)) else {
            let down = self.paged_swiglu(layer, Packing::GateUp, Proj::Down, &h2, inputs)?;
            return Ok(Residual { x: x2, pending: Some(down) });
        };
        let router = self.weight(&moe::router_name(layer))?;
        let (gate_up, down) =
            (self.expert_weight(&moe::gate_up_name(layer))?, self.expert_weight(&moe::down_name(layer))?);
        // Adapters on the experts are served merged only (`infer::AdapterSlots::load`).
        let w = MoeWeights { router: &router, gate_up: &gate_up, down: &down, lora: None };
        let routed = moe::forward(self.kernels(), shape, &w, &h2, None)?.0;
        if !c.arch.shared_expert() {
            return Ok(Residual { x: x2, pending: Some(routed) });
        }
        let shared = self.paged_swiglu(layer, Packing::SharedGateUp, Proj::SharedDown, &h2, inputs)?;
        let logit = self.paged_proj(layer, Proj::SharedExpertGate, &h2, inputs)?;
        Ok(Residual { x: x2, pending: Some(with_shared_expert(&routed, &shared, &logit)?.0) })
    }

    /// A SwiGLU from `x`: `down(silu(gate·x) ⊙ up·x)`, its gate and up projections the group
    /// `gate_up` (the dense MLP's, or a sparse layer's shared expert's).
    fn paged_swiglu(
        &self,
        layer: usize,
        gate_up: Packing,
        down: Proj,
        x: &Tensor,
        inputs: &PagedInputs<'_>,
    ) -> Result<Tensor, ModelError> {
        let gate_up = self.paged_group(layer, gate_up, x, inputs)?;
        self.paged_proj(layer, down, &swiglu::forward_packed(&gate_up)?, inputs)
    }

    /// Attention over the paged cache from the normed rows `h1`: the rows' keys and values go
    /// into the cache, and the output `[N, heads·hd]` (gated on Qwen3.5) is what `o_proj` reads.
    fn paged_attention(
        &self,
        layer: usize,
        h1: &Tensor,
        inputs: &PagedInputs<'_>,
        (cos, sin): (&Tensor, &Tensor),
        caches: (&Tensor, &Tensor),
    ) -> Result<Tensor, ModelError> {
        let c = self.config();
        let eps = c.rms_norm_eps;
        let (n, nh, nkv, hd) = (h1.dim(0)?, c.num_attention_heads, c.num_key_value_heads, c.head_dim);
        let packed = self.paged_group(layer, Packing::Qkv, h1, inputs)?;
        // A gated attention's q_proj rows are per head [query | gate]: the gate goes aside, and
        // the kernels see [q | k | v].
        let (qkv, gate) = match c.arch.gated_attention() {
            true => {
                let per_head = packed.narrow(1, 0, 2 * nh * hd)?.reshape((n, nh, 2 * hd))?;
                let gate = per_head.narrow(2, hd, hd)?.reshape((n, nh * hd))?;
                let q = per_head.narrow(2, 0, hd)?.reshape((n, nh * hd))?;
                (Tensor::cat(&[&q, &packed.narrow(1, 2 * nh * hd, 2 * nkv * hd)?], 1)?, Some(sigmoid(&gate)?))
            }
            false => (packed, None),
        };
        let (qn, kn) = (self.gain(&norm_name(c, layer, Norm::Q))?, self.gain(&norm_name(c, layer, Norm::K))?);
        let q = match (c.arch.qk_norm(), c.rotary_dim() == hd) {
            // Per head, every dim rotated: inside the fused kernel.
            (QkNorm::PerHead, true) => {
                paged_attention::prepare(&qkv, nh, Some((&qn, &kn, eps)), cos, sin, caches, inputs.slots)?
            }
            // Per head, partial rotary (Qwen3.5): normalised and rotated here, then cached.
            (QkNorm::PerHead, false) => {
                let part = |first: usize, count: usize| qkv.narrow(1, first * hd, count * hd)?.reshape((n, count, hd));
                let q = rmsnorm::forward(&part(0, nh)?, &qn, eps)?.0;
                let k = rmsnorm::forward(&part(nh, nkv)?, &kn, eps)?.0;
                let (cos, sin) = (cos.unsqueeze(1)?, sin.unsqueeze(1)?);
                let q = rotate(&q, &cos, &sin, c.rotary_dim(), rope::forward)?;
                let k = rotate(&k, &cos, &sin, c.rotary_dim(), rope::forward)?;
                paged_attention::write_kv(caches.0, caches.1, &k, &part(nh + nkv, nkv)?, inputs.slots)?;
                q
            }
            // Over the whole projection: normalised first, then rotated and cached as they are.
            (QkNorm::Projection, _) => {
                let (q_w, kv_w) = (nh * hd, nkv * hd);
                let q_part = rmsnorm::forward(&qkv.narrow(1, 0, q_w)?.contiguous()?, &qn, eps)?.0;
                let k_part = rmsnorm::forward(&qkv.narrow(1, q_w, kv_w)?.contiguous()?, &kn, eps)?.0;
                let normed = Tensor::cat(&[&q_part, &k_part, &qkv.narrow(1, q_w + kv_w, kv_w)?], 1)?;
                paged_attention::prepare(&normed, nh, None, cos, sin, caches, inputs.slots)?
            }
        };
        let scale = 1.0 / (hd as f64).sqrt();
        let o = paged_attention::forward(&q, caches.0, caches.1, inputs.meta, scale)?.reshape((n, nh * hd))?;
        Ok(gated(&o, gate.as_ref())?)
    }
}

/// `x·Wᵀ`, plus each row's adapter branch where a stack is given.
fn project(
    model: &CausalLm,
    x: &Tensor,
    w: &Tensor,
    lora: Option<(&multi_lora::LoraStack, &RowAdapters)>,
) -> Result<Tensor, ModelError> {
    Ok(match lora {
        Some((stack, rows)) => multi_lora::forward(model.kernels(), x, w, stack, rows)?,
        None => linear::forward(model.kernels(), x, w)?,
    })
}

/// The residual stream between blocks: `x`, and the MLP output still to be added to it. The add
/// is left to the next norm, which does both in one kernel (`rmsnorm::add_forward`, the same bits
/// as an add then a norm): a decode step's adds are each a launch of their own otherwise.
struct Residual {
    x: Tensor,
    pending: Option<Tensor>,
}

impl Residual {
    /// The stream with its pending add done, and that normalised by gain `w`.
    fn normed(&self, w: &Tensor, eps: f64) -> Result<(Tensor, Tensor), ModelError> {
        Ok(match &self.pending {
            Some(add) => {
                let (x, h, _) = rmsnorm::add_forward(&self.x, add, w, eps)?;
                (x, h)
            }
            None => (self.x.clone(), rmsnorm::forward(&self.x, w, eps)?.0),
        })
    }
}
