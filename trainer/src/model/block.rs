//! One decoder block: explicit forward (saving a [`BlockTape`]) and backward.
//!
//! `x → +mix(norm₁ x) → +mlp(norm₂ ·)`. The token mixer is the layer kind's
//! ([`super::LayerKind`]): attention (q/k/v projections, RMSNorm of q and k, RoPE, GQA
//! attention with the packing mask; on Qwen3.5 a sigmoid output gate from `q_proj`; o
//! projection), or a Gated DeltaNet layer ([`super::linear_attention`]). MLP: SwiGLU, or on a
//! Qwen3-MoE sparse layer the routed experts ([`super::moe`]). Every projection may carry a LoRA
//! adapter (`y = x·Wᵀ + s·(drop(x)·Aᵀ)·Bᵀ`). Qwen3.5's zero-centred norms scale by `1 + w`.

use std::borrow::Cow;
use std::collections::BTreeMap;

use candle_core::{Result, Tensor};
use mindxtrain_kernels::{KernelConfig, attention, linear, profile, rmsnorm, rope};

use super::attention_parts::{gated, rotate, sigmoid};
use super::causal_lm::CausalLm;
use super::hooks::StepHooks;
use super::linear_attention::LinearTape;
use super::lora::{Adapters, adapter_name};
use super::mlp::MlpTape;
use super::moe::RouterStats;
use super::params::{Norm, Proj, base_weight_name, norm_name};
use super::rng::{SplitMix64, name_id};
use super::{LayerKind, QkNorm};

/// Everything one step shares across blocks.
pub(super) struct StepCtx<'a> {
    pub model: &'a CausalLm,
    pub adapters: Option<&'a Adapters>,
    /// Compute gradients of base weights (full fine-tuning).
    pub base_grads: bool,
    /// Compute gradients of adapter weights.
    pub adapter_grads: bool,
    /// Seed of this step's LoRA dropout masks; `None` turns dropout off (evaluation).
    pub dropout_seed: Option<u64>,
    pub batch: usize,
    pub seq: usize,
    /// RoPE tables shaped `[B, T, 1, head_dim]`.
    pub cos: Tensor,
    pub sin: Tensor,
    /// Which keys each token attends (causal, within its packed document).
    pub mask: attention::Mask,
    /// Qwen3-MoE: `[B·T]` 1 for a real token, 0 for padding (segment 0), for the
    /// load-balancing loss; `None` when every token is real or the model is dense.
    pub counted: Option<Tensor>,
    /// The batch's real tokens (not padding).
    pub real_tokens: usize,
    /// A distributed run's part in the step (weights it gathers); [`super::NoHooks`] otherwise.
    pub hooks: &'a dyn StepHooks,
    /// The load-balancing loss's per-expert gradient term (Qwen3-MoE with the loss on), set
    /// by the backward once the forward has counted every layer's routing.
    pub balance: Option<Tensor>,
}

/// Gradients by parameter name, summed where a name is reached twice (tied embeddings).
pub(super) type Grads = super::Grads;

pub(super) fn accumulate(grads: &mut Grads, name: String, g: Tensor) -> Result<()> {
    match grads.remove(&name) {
        Some(prev) => grads.insert(name, (prev + g)?),
        None => grads.insert(name, g),
    };
    Ok(())
}

/// What a LoRA branch keeps for its backward.
pub(super) struct LoraTape {
    /// The dropout mask already divided by the keep probability (absent without dropout).
    mask: Option<Tensor>,
    /// `drop(x)`, the input `A` saw (absent without dropout: it is then `x`).
    dropped: Option<Tensor>,
    /// `s·drop(x)·Aᵀ` (s the LoRA scaling), the input `B` saw.
    xa: Tensor,
}

/// The activations a block's backward reads.
pub(super) struct BlockTape {
    x: Tensor,
    /// `norm₁ x`, the token mixer's input, and its norm's reciprocal RMS.
    pub(super) h1: Tensor,
    rstd1: Tensor,
    mixer: Mixer,
    /// The mixer's output projection's input (`o_proj`'s or `out_proj`'s), `[N, width]`.
    mixed: Tensor,
    tail: BlockTail,
    pub(super) lora: BTreeMap<Proj, LoraTape>,
}

/// What the token mixer keeps for its backward.
enum Mixer {
    Attention {
        inputs: AttentionInputs,
        /// Row log-sum-exp of the attention scores: the backward recomputes the probabilities.
        lse: Tensor,
        /// The attention output `[N, heads·hd]`, before any output gate.
        attn: Tensor,
        /// `σ(gate)` of a gated attention (Qwen3.5), `[N, heads·hd]`.
        gate: Option<Tensor>,
    },
    Linear(Box<LinearTape>),
}

/// One projection's share of its input's gradient: products `dyᵢ·Wᵢ` (the base weight, and
/// the LoRA `A` without dropout) and, with LoRA dropout, the masked branch gradient.
pub(super) struct InputGrad {
    products: Vec<(Tensor, Tensor)>,
    masked: Option<Tensor>,
}

/// The sum of every part: all products in one GEMM sum, then any masked branches.
fn input_grad(kernels: &KernelConfig, parts: &[InputGrad]) -> Result<Tensor> {
    let products: Vec<(&Tensor, &Tensor)> = parts.iter().flat_map(|p| p.products.iter().map(|(d, w)| (d, w))).collect();
    let mut dx = linear::input_grad_sum(kernels, &products)?;
    for m in parts.iter().filter_map(|p| p.masked.as_ref()) {
        dx = (dx + m)?;
    }
    Ok(dx)
}

/// What [`StepCtx::attention_inputs`] computes.
pub(super) struct AttentionInputs {
    q_pre: Tensor,
    /// A gated attention's gate logits `[N, heads·hd]` (the second half of each head's
    /// `q_proj` rows).
    pub gate: Option<Tensor>,
    rstd_q: Tensor,
    k_pre: Tensor,
    rstd_k: Tensor,
    pub q: Tensor,
    pub k: Tensor,
    pub v: Tensor,
}

/// What [`StepCtx::block_tail`] computes.
pub(super) struct BlockTail {
    pub out: Tensor,
    x2: Tensor,
    rstd2: Tensor,
    h2: Tensor,
    mlp: MlpTape,
    /// A sparse layer's routing statistics (the load-balancing loss).
    pub router_stats: Option<RouterStats>,
}

impl StepCtx<'_> {
    pub(super) fn kernels(&self) -> &KernelConfig {
        self.model.kernels()
    }

    /// A weight of the model, or one the hooks gathered for this stage (ZeRO-3).
    pub(super) fn weight(&self, name: &str) -> Result<Cow<'_, Tensor>> {
        match self.model.weight(name) {
            Ok(w) => Ok(w),
            Err(e @ super::ModelError::MissingParam(_)) => {
                self.hooks.weight(name).map(Cow::Owned).ok_or_else(|| candle_core::Error::Msg(e.to_string()))
            }
            Err(e) => Err(candle_core::Error::Msg(e.to_string())),
        }
    }

    fn dropout_mask(&self, layer: usize, proj: Proj, x: &Tensor) -> Result<Option<Tensor>> {
        let (Some(seed), Some(ad)) = (self.dropout_seed, self.adapters) else { return Ok(None) };
        let p = ad.config.dropout;
        if p == 0.0 {
            return Ok(None);
        }
        // Drawn where x lives (one launch on a GPU), the same bits on every device.
        let rng = SplitMix64::derive(seed, &[layer as u64, name_id(proj.path())]);
        Ok(Some(mindxtrain_kernels::seeded::dropout_mask(rng.state(), p, x.dims(), x.dtype(), x.device())?))
    }

    /// A norm's gain: its weight, or `1 + w` for a zero-centred norm (Qwen3.5), whose gradient
    /// is the weight's.
    pub(super) fn norm_gain(&self, name: &str) -> Result<Cow<'_, Tensor>> {
        self.model.config.arch.norm_gain(self.weight(name)?)
    }

    /// `x·Wᵀ` plus the LoRA branch when this projection is adapted.
    pub(super) fn proj_forward(
        &self,
        layer: usize,
        proj: Proj,
        x: &Tensor,
        tape: Option<&mut BTreeMap<Proj, LoraTape>>,
    ) -> Result<Tensor> {
        let w = self.weight(&base_weight_name(layer, proj))?;
        let Some((a, b)) = self.adapters.and_then(|ad| ad.pair(layer, proj)) else {
            return linear::forward(self.kernels(), x, &w);
        };
        let _profile = profile::scope("LoRA fwd (glue)", x.device());
        let scale = self.adapters.map(|ad| ad.config.scaling()).unwrap_or(1.0);
        let mask = self.dropout_mask(layer, proj, x)?;
        let dropped = match &mask {
            Some(m) => Some((x * m)?),
            None => None,
        };
        // The scaling goes on the thin [N, r] product, and the branch lands in the base
        // projection's output buffer.
        let xa = (linear::forward(self.kernels(), dropped.as_ref().unwrap_or(x), a)? * scale)?;
        let y = linear::forward_sum(self.kernels(), &[(x, &w), (&xa, b)])?;
        if let Some(tape) = tape {
            tape.insert(proj, LoraTape { mask, dropped, xa });
        }
        Ok(y)
    }

    /// Accumulates this projection's parameter gradients and returns the parts of its input
    /// gradient, for [`input_grad`] to sum with those of the other projections of the input.
    pub(super) fn proj_backward(
        &self,
        layer: usize,
        proj: Proj,
        dy: &Tensor,
        x: &Tensor,
        tape: &BlockTape,
        grads: &mut Grads,
    ) -> Result<InputGrad> {
        let w = self.weight(&base_weight_name(layer, proj))?.into_owned();
        if self.base_grads {
            accumulate(grads, base_weight_name(layer, proj), linear::weight_grad(self.kernels(), dy, x)?)?;
        }
        let mut part = InputGrad { products: vec![(dy.clone(), w)], masked: None };
        if let (Some(lt), Some((a, b))) = (tape.lora.get(&proj), self.adapters.and_then(|ad| ad.pair(layer, proj))) {
            let _profile = profile::scope("LoRA bwd (glue)", x.device());
            let scale = self.adapters.map(|ad| ad.config.scaling()).unwrap_or(1.0);
            // B saw s·drop(x)·Aᵀ: dB = dyᵀ·that, and A's output gradient is s·dy·B.
            let (dxa, db) = linear::backward(self.kernels(), dy, &lt.xa, b, self.adapter_grads)?;
            let dxa = (dxa * scale)?;
            if let Some(db) = db {
                accumulate(grads, adapter_name(layer, proj, 'B'), db)?;
            }
            if self.adapter_grads {
                let da = linear::weight_grad(self.kernels(), &dxa, lt.dropped.as_ref().unwrap_or(x))?;
                accumulate(grads, adapter_name(layer, proj, 'A'), da)?;
            }
            match &lt.mask {
                None => part.products.push((dxa, a.clone())),
                Some(m) => part.masked = Some((linear::input_grad_sum(self.kernels(), &[(&dxa, a)])? * m)?),
            }
        }
        Ok(part)
    }

    /// Runs block `layer` on `x` (`[N, hidden]`); with `save`, also returns its tape.
    pub fn block_forward(
        &self,
        layer: usize,
        x: &Tensor,
        save: bool,
    ) -> Result<(Tensor, Option<BlockTape>, Option<RouterStats>)> {
        let _profile = profile::scope("block fwd (glue)", x.device());
        let mut lora = BTreeMap::new();
        let (h1, rstd1) = self.input_norm(layer, x)?;
        let (mixer, mixed, out_proj) = match self.model.config.layer_kind(layer) {
            LayerKind::Attention => {
                let qkv = self.attention_inputs(layer, &h1, &mut lora)?;
                let scale = 1.0 / (self.model.config.head_dim as f64).sqrt();
                let (o, lse) = attention::forward(self.kernels(), &qkv.q, &qkv.k, &qkv.v, &self.mask, scale)?;
                let attn = o.transpose(1, 2)?.reshape((self.batch * self.seq, ()))?;
                let gate = qkv.gate.as_ref().map(sigmoid).transpose()?;
                let mixed = gated(&attn, gate.as_ref())?;
                (Mixer::Attention { inputs: qkv, lse, attn, gate }, mixed, Proj::O)
            }
            LayerKind::LinearAttention => {
                let (mixed, tape) = self.linear_forward(layer, &h1, &mut lora)?;
                (Mixer::Linear(Box::new(tape)), mixed, Proj::OutProj)
            }
        };
        let mut tail = self.block_tail(layer, x, &mixed, out_proj, &mut lora)?;
        let out = tail.out.clone();
        let stats = tail.router_stats.take();
        let tape = save.then(|| BlockTape { x: x.clone(), h1, rstd1, mixer, mixed, tail, lora });
        Ok((out, tape, stats))
    }

    /// `norm₁ x`, the token mixer's input, and the norm's reciprocal RMS.
    pub(super) fn input_norm(&self, layer: usize, x: &Tensor) -> Result<(Tensor, Tensor)> {
        let c = &self.model.config;
        rmsnorm::forward(x, &*self.norm_gain(&norm_name(c, layer, Norm::Input))?, c.rms_norm_eps)
    }

    /// Everything between the input norm and attention itself: q/k/v projections (and a gated
    /// attention's gate), q/k norms and RoPE. `q` is `[B, heads, T, hd]`, `k` and `v`
    /// `[B, kv_heads, T, hd]`: transposed views of the projections' `[B, T, heads, hd]`, which
    /// the GPU flash kernels read in place (other kernels copy them).
    pub(super) fn attention_inputs(
        &self,
        layer: usize,
        h1: &Tensor,
        lora: &mut BTreeMap<Proj, LoraTape>,
    ) -> Result<AttentionInputs> {
        let c = &self.model.config;
        let (b, t, nh, nkv, hd) = (self.batch, self.seq, c.num_attention_heads, c.num_key_value_heads, c.head_dim);
        let eps = c.rms_norm_eps;
        let q_out = self.proj_forward(layer, Proj::Q, h1, Some(lora))?;
        let (q_pre, gate) = if c.arch.gated_attention() {
            // transformers views q_proj's output as [.., heads, 2·hd] and chunks each head into
            // query and gate.
            let per_head = q_out.reshape((b, t, nh, 2 * hd))?;
            let gate = per_head.narrow(3, hd, hd)?.contiguous()?.reshape((b * t, nh * hd))?;
            (per_head.narrow(3, 0, hd)?.contiguous()?.reshape(self.qk_norm_shape(nh))?, Some(gate))
        } else {
            (q_out.reshape(self.qk_norm_shape(nh))?, None)
        };
        let k_pre = self.proj_forward(layer, Proj::K, h1, Some(lora))?.reshape(self.qk_norm_shape(nkv))?;
        let v = self.proj_forward(layer, Proj::V, h1, Some(lora))?.reshape((b, t, nkv, hd))?;
        let (qn, rstd_q) = rmsnorm::forward(&q_pre, &*self.norm_gain(&norm_name(c, layer, Norm::Q))?, eps)?;
        let (kn, rstd_k) = rmsnorm::forward(&k_pre, &*self.norm_gain(&norm_name(c, layer, Norm::K))?, eps)?;
        let q = self.rope(&qn.reshape((b, t, nh, hd))?, rope::forward)?.transpose(1, 2)?;
        let k = self.rope(&kn.reshape((b, t, nkv, hd))?, rope::forward)?.transpose(1, 2)?;
        let v = v.transpose(1, 2)?;
        Ok(AttentionInputs { q_pre, gate, rstd_q, k_pre, rstd_k, q, k, v })
    }

    /// RoPE's forward or backward (`op`) on `[B, T, heads, hd]` ([`rotate`]).
    fn rope(&self, x: &Tensor, op: fn(&Tensor, &Tensor, &Tensor) -> Result<Tensor>) -> Result<Tensor> {
        rotate(x, &self.cos, &self.sin, self.model.config.rotary_dim(), op)
    }

    /// The shape a q or k projection of `heads` heads is normalised in: `[B, T, heads, hd]`
    /// for a norm per head (Qwen3), `[B, T, heads·hd]` for one over the whole projection
    /// (Instella).
    fn qk_norm_shape(&self, heads: usize) -> Vec<usize> {
        let (b, t, hd) = (self.batch, self.seq, self.model.config.head_dim);
        match self.model.config.arch.qk_norm() {
            QkNorm::PerHead => vec![b, t, heads, hd],
            QkNorm::Projection => vec![b, t, heads * hd],
        }
    }

    /// Everything after the token mixer: its output projection `out_proj` (`o_proj`, or a Gated
    /// DeltaNet's `out_proj`) on `mixed` and the residual, norm, MLP and residual.
    pub(super) fn block_tail(
        &self,
        layer: usize,
        x: &Tensor,
        mixed: &Tensor,
        out_proj: Proj,
        lora: &mut BTreeMap<Proj, LoraTape>,
    ) -> Result<BlockTail> {
        let eps = self.model.config.rms_norm_eps;
        // The residual add runs inside the norm's kernel on a GPU (same bits as add then norm).
        let o = self.proj_forward(layer, out_proj, mixed, Some(lora))?;
        let post = self.norm_gain(&norm_name(&self.model.config, layer, Norm::PostAttention))?;
        let (x2, h2, rstd2) = rmsnorm::add_forward(x, &o, &post, eps)?;
        let (y, mlp, router_stats) = self.mlp_forward(layer, &h2, lora)?;
        Ok(BlockTail { out: (&x2 + y)?, x2, rstd2, h2, mlp, router_stats })
    }

    /// Backward of block `layer`: accumulates parameter gradients and returns `dx` when
    /// `want_dx` (the first block of a LoRA run has no one to pass it to).
    pub fn block_backward(
        &self,
        layer: usize,
        dout: &Tensor,
        tape: &BlockTape,
        grads: &mut Grads,
        want_dx: bool,
    ) -> Result<Option<Tensor>> {
        let _profile = profile::scope("block bwd (glue)", dout.device());
        let c = &self.model.config;
        let base = self.base_grads;
        let dh2 = self.mlp_backward(layer, dout, &tape.tail.mlp, &tape.tail.h2, tape, grads)?;
        let ln2 = norm_name(c, layer, Norm::PostAttention);
        let (dx2, dln2) = rmsnorm::backward(&dh2, &tape.tail.x2, &*self.norm_gain(&ln2)?, &tape.tail.rstd2, base)?;
        let dx2 = (dout + dx2)?;
        if let Some(g) = dln2 {
            accumulate(grads, ln2, g)?;
        }
        // The token mixer, down to the projections of its input h1.
        let outputs = match &tape.mixer {
            Mixer::Attention { inputs, lse, attn, gate } => {
                let dmixed = self.grad_of(layer, &[(Proj::O, &dx2)], &tape.mixed, tape, grads)?;
                self.attention_backward(layer, &dmixed, inputs, lse, attn, gate.as_ref(), grads)?
            }
            Mixer::Linear(lt) => {
                let dmixed = self.grad_of(layer, &[(Proj::OutProj, &dx2)], &tape.mixed, tape, grads)?;
                self.linear_backward(layer, &dmixed, lt, grads)?
            }
        };
        let projs: Vec<(Proj, &Tensor)> = outputs.iter().map(|(p, dy)| (*p, dy)).collect();
        if !(want_dx || base) {
            // The first block of a LoRA run: parameter gradients only, no one needs dx.
            for (proj, dy) in projs {
                self.proj_backward(layer, proj, dy, &tape.h1, tape, grads)?;
            }
            return Ok(None);
        }
        let dh1 = self.grad_of(layer, &projs, &tape.h1, tape, grads)?;
        let ln1 = norm_name(c, layer, Norm::Input);
        let (dx, dln1) = rmsnorm::backward(&dh1, &tape.x, &*self.norm_gain(&ln1)?, &tape.rstd1, base)?;
        if let Some(g) = dln1 {
            accumulate(grads, ln1, g)?;
        }
        Ok(if want_dx { Some((dx2 + dx)?) } else { None })
    }

    /// Attention's backward from the gradient of its (gated) output `dmixed`: the gradients of
    /// the q/k/v projections' outputs, q/k norm gradients accumulated.
    #[allow(clippy::too_many_arguments)]
    fn attention_backward(
        &self,
        layer: usize,
        dmixed: &Tensor,
        inputs: &AttentionInputs,
        lse: &Tensor,
        attn: &Tensor,
        gate: Option<&Tensor>,
        grads: &mut Grads,
    ) -> Result<Vec<(Proj, Tensor)>> {
        let c = &self.model.config;
        let (b, t, nh, nkv, hd) = (self.batch, self.seq, c.num_attention_heads, c.num_key_value_heads, c.head_dim);
        let (n, base) = (b * t, self.base_grads);
        // mixed = attn·σ(g): dattn = dmixed·σ, dg = dmixed·attn·σ(1 − σ).
        let (dattn, dgate) = match gate {
            Some(s) => {
                let ds = (dmixed * attn)?;
                let dg = (&ds * (s * s.affine(-1.0, 1.0)?)?)?;
                ((dmixed * s)?, Some(dg))
            }
            None => (dmixed.clone(), None),
        };
        let dout_heads = dattn.reshape((b, t, nh, hd))?.transpose(1, 2)?;
        let scale = 1.0 / (hd as f64).sqrt();
        let out_heads = attn.reshape((b, t, nh, hd))?.transpose(1, 2)?;
        let (dq, dk, dv) = attention::backward(
            self.kernels(),
            &dout_heads,
            &inputs.q,
            &inputs.k,
            &inputs.v,
            &out_heads,
            lse,
            &self.mask,
            scale,
        )?;
        let dqn = self.rope(&dq.transpose(1, 2)?, rope::backward)?.reshape(self.qk_norm_shape(nh))?;
        let dkn = self.rope(&dk.transpose(1, 2)?, rope::backward)?.reshape(self.qk_norm_shape(nkv))?;
        let (qn_name, kn_name) = (norm_name(c, layer, Norm::Q), norm_name(c, layer, Norm::K));
        let (dq_pre, dqnorm) =
            rmsnorm::backward(&dqn, &inputs.q_pre, &*self.norm_gain(&qn_name)?, &inputs.rstd_q, base)?;
        let (dk_pre, dknorm) =
            rmsnorm::backward(&dkn, &inputs.k_pre, &*self.norm_gain(&kn_name)?, &inputs.rstd_k, base)?;
        if let (Some(gq), Some(gk)) = (dqnorm, dknorm) {
            accumulate(grads, qn_name, gq)?;
            accumulate(grads, kn_name, gk)?;
        }
        let dv = dv.transpose(1, 2)?.reshape((n, nkv * hd))?;
        let dq_out = match dgate {
            // Back into q_proj's per-head [query | gate] rows.
            Some(dg) => Tensor::cat(&[dq_pre.reshape((b, t, nh, hd))?, dg.reshape((b, t, nh, hd))?], 3)?
                .reshape((n, 2 * nh * hd))?,
            None => dq_pre.reshape((n, nh * hd))?,
        };
        let dk_pre = dk_pre.reshape((n, nkv * hd))?;
        Ok(vec![(Proj::Q, dq_out), (Proj::K, dk_pre), (Proj::V, dv)])
    }

    /// The input gradient of the projections `projs` of one input `x`, each with its output
    /// gradient.
    pub(super) fn grad_of(
        &self,
        layer: usize,
        projs: &[(Proj, &Tensor)],
        x: &Tensor,
        tape: &BlockTape,
        grads: &mut Grads,
    ) -> Result<Tensor> {
        let parts = projs
            .iter()
            .map(|&(proj, dy)| self.proj_backward(layer, proj, dy, x, tape, grads))
            .collect::<Result<Vec<_>>>()?;
        input_grad(self.kernels(), &parts)
    }
}
