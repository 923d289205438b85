//! A Gated DeltaNet layer's token mixer (Qwen3.5/3.6's `linear_attention` layers), forward
//! and backward, composed from the kernels' ops as transformers 5.17's `Qwen3_5GatedDeltaNet`
//! composes them (checked op by op and as a whole layer in
//! `tests/tests/delta_rule_reference.rs`):
//!
//! `[q|k|v] = silu(conv1d(h·W_qkvᵀ))`, `q, k ← l2norm`, `β = σ(h·W_bᵀ)`,
//! `g = −exp(A_log)·softplus(h·W_aᵀ + dt_bias)`, `o = delta_rule(q/√d_k, k, v, β, g)` (GQA by key
//! head), `mixed = w·rmsnorm(o)·silu(h·W_zᵀ)` per value head. The block then applies
//! `out_proj` to `mixed` like attention's `o_proj` ([`super::block`]). Packed rows: the conv
//! and the rule take the step's mask, so no token reads a state or an input from an earlier
//! document.

use std::collections::BTreeMap;

use candle_core::{Result, Tensor};
use mindxtrain_kernels::{causal_conv1d, delta_gates, delta_rule, gated_rmsnorm, l2norm};

use super::block::{Grads, LoraTape, StepCtx, accumulate};
use super::config::HybridShape;
use super::params::Proj;

/// transformers' l2norm eps for q and k (fixed in its code, not the config's).
const L2NORM_EPS: f64 = 1e-6;

/// The layer's parameters beyond its projections, as transformers names them.
fn name(layer: usize, what: &str) -> String {
    format!("model.layers.{layer}.linear_attn.{what}")
}

/// The depthwise conv's taps: HF's `nn.Conv1d` weight `[conv_dim, 1, W]`.
pub(super) fn conv_name(layer: usize) -> String {
    name(layer, "conv1d.weight")
}

/// Adds a linear-attention layer's own parameters (not its projections) to `m`.
pub(super) fn expected_shapes(h: &HybridShape, layer: usize, m: &mut BTreeMap<String, Vec<usize>>) {
    let heads = h.linear_num_value_heads;
    m.insert(conv_name(layer), vec![h.conv_dim(), 1, h.linear_conv_kernel_dim]);
    m.insert(name(layer, "A_log"), vec![heads]);
    m.insert(name(layer, "dt_bias"), vec![heads]);
    m.insert(name(layer, "norm.weight"), vec![h.linear_value_head_dim]);
}

/// What the layer's backward reads.
pub(super) struct LinearTape {
    /// The conv's input `[B, T, conv_dim]` (the q/k/v projection).
    qkv: Tensor,
    /// q and k before their l2norm `[B, T, Hk, d_k]`, and the norms' reciprocal lengths.
    q: Tensor,
    k: Tensor,
    rq: Tensor,
    rk: Tensor,
    /// The rule's operands after the l2norm.
    qn: Tensor,
    kn: Tensor,
    v: Tensor,
    /// The gates' inputs `[B, T, H]` and their outputs.
    b_logits: Tensor,
    a_in: Tensor,
    beta: Tensor,
    g: Tensor,
    checkpoints: Tensor,
    /// The rule's output `[B, T, H, d_v]`, the gate `z` and the gated norm's reciprocal RMS.
    core: Tensor,
    z: Tensor,
    rstd: Tensor,
}

impl StepCtx<'_> {
    fn shape(&self) -> Result<&HybridShape> {
        self.model.config.hybrid.as_ref().ok_or_else(|| candle_core::Error::Msg("not a hybrid model".into()))
    }

    /// The conv's taps as the kernel takes them, `[conv_dim, W]`.
    fn conv_taps(&self, layer: usize) -> Result<Tensor> {
        let w = self.weight(&conv_name(layer))?;
        let (c, _, width) = w.dims3()?;
        w.reshape((c, width))
    }

    /// `mixed` `[N, value_dim]`, the input of `out_proj`, from the normed hidden states `h1`.
    pub(super) fn linear_forward(
        &self,
        layer: usize,
        h1: &Tensor,
        lora: &mut BTreeMap<Proj, LoraTape>,
    ) -> Result<(Tensor, LinearTape)> {
        let s = self.shape()?;
        let (b, t) = (self.batch, self.seq);
        let (hk, h, dk, dv) =
            (s.linear_num_key_heads, s.linear_num_value_heads, s.linear_key_head_dim, s.linear_value_head_dim);
        let kd = s.key_dim();
        let qkv = self.proj_forward(layer, Proj::InProjQkv, h1, Some(lora))?.reshape((b, t, s.conv_dim()))?;
        let z = self.proj_forward(layer, Proj::InProjZ, h1, Some(lora))?.reshape((b, t, h, dv))?;
        let b_logits = self.proj_forward(layer, Proj::InProjB, h1, Some(lora))?.reshape((b, t, h))?;
        let a_in = self.proj_forward(layer, Proj::InProjA, h1, Some(lora))?.reshape((b, t, h))?;
        let (mixed_qkv, _) = causal_conv1d::forward(&qkv, &self.conv_taps(layer)?, None, None, &self.mask)?;
        let part = |from: usize, len: usize, heads: usize, d: usize| {
            mixed_qkv.narrow(2, from, len)?.contiguous()?.reshape((b, t, heads, d))
        };
        let (q, k, v) = (part(0, kd, hk, dk)?, part(kd, kd, hk, dk)?, part(2 * kd, h * dv, h, dv)?);
        let ((qn, rq), (kn, rk)) = (l2norm::forward(&q, L2NORM_EPS)?, l2norm::forward(&k, L2NORM_EPS)?);
        let (a_log, dt_bias) = (self.weight(&name(layer, "A_log"))?, self.weight(&name(layer, "dt_bias"))?);
        // g stays in f32 (transformers' dtype for it); the rule widens its operands itself.
        let (beta, g) = delta_gates::forward(&b_logits, &a_in, &a_log, &dt_bias)?;
        let x = operands(&qn, &kn, &v, &beta, &g, dk);
        let f = delta_rule::forward(&x, None, &self.mask)?;
        let eps = self.model.config.rms_norm_eps;
        let (normed, rstd) = gated_rmsnorm::forward(&f.out, &z, &*self.weight(&name(layer, "norm.weight"))?, eps)?;
        let mixed = normed.reshape((b * t, h * dv))?;
        let tape = LinearTape {
            qkv,
            q,
            k,
            rq,
            rk,
            qn,
            kn,
            v,
            b_logits,
            a_in,
            beta,
            g,
            checkpoints: f.checkpoints,
            core: f.out,
            z,
            rstd,
        };
        Ok((mixed, tape))
    }

    /// The backward from `dmixed` (the gradient of `out_proj`'s input): the gradients of the
    /// four input projections' outputs, the layer's own parameter gradients accumulated.
    pub(super) fn linear_backward(
        &self,
        layer: usize,
        dmixed: &Tensor,
        tape: &LinearTape,
        grads: &mut Grads,
    ) -> Result<Vec<(Proj, Tensor)>> {
        let s = self.shape()?;
        let (b, t, n) = (self.batch, self.seq, self.batch * self.seq);
        let (h, dk, dv) = (s.linear_num_value_heads, s.linear_key_head_dim, s.linear_value_head_dim);
        let base = self.base_grads;
        let norm_name = name(layer, "norm.weight");
        let dnormed = dmixed.reshape((b, t, h, dv))?;
        let (dcore, dz, dnorm) =
            gated_rmsnorm::backward(&dnormed, &tape.core, &tape.z, &*self.weight(&norm_name)?, &tape.rstd, base)?;
        let x = operands(&tape.qn, &tape.kn, &tape.v, &tape.beta, &tape.g, dk);
        let gr = delta_rule::backward(&x, None, &self.mask, &tape.checkpoints, &dcore, None)?;
        let (a_log_name, dt_name) = (name(layer, "A_log"), name(layer, "dt_bias"));
        let (a_log, dt_bias) = (self.weight(&a_log_name)?, self.weight(&dt_name)?);
        let gates = delta_gates::backward(&gr.dbeta, &gr.dg, &tape.b_logits, &tape.a_in, &a_log, &dt_bias)?;
        let dq = l2norm::backward(&gr.dq, &tape.q, &tape.rq)?;
        let dk_ = l2norm::backward(&gr.dk, &tape.k, &tape.rk)?;
        let flat = |t: &Tensor| t.reshape((b, t.dim(1)?, ()));
        let dmixed_qkv = Tensor::cat(&[flat(&dq)?, flat(&dk_)?, flat(&gr.dv)?], 2)?;
        let taps = self.conv_taps(layer)?;
        let conv = causal_conv1d::backward(&dmixed_qkv, &tape.qkv, &taps, None, None, &self.mask, None)?;
        if base {
            let conv_shape = self.weight(&conv_name(layer))?.dims().to_vec();
            accumulate(grads, conv_name(layer), conv.dw.reshape(conv_shape)?)?;
            accumulate(grads, a_log_name, gates.da_log)?;
            accumulate(grads, dt_name, gates.ddt_bias)?;
        }
        if let Some(g) = dnorm {
            accumulate(grads, norm_name, g)?;
        }
        Ok(vec![
            (Proj::InProjQkv, conv.dx.reshape((n, s.conv_dim()))?),
            (Proj::InProjZ, dz.reshape((n, h * dv))?),
            (Proj::InProjB, gates.db.reshape((n, h))?),
            (Proj::InProjA, gates.da.reshape((n, h))?),
        ])
    }
}

/// The rule's operands: q scaled by `1/√d_k` inside the rule, as transformers scales it.
fn operands<'a>(
    q: &'a Tensor,
    k: &'a Tensor,
    v: &'a Tensor,
    beta: &'a Tensor,
    g: &'a Tensor,
    dk: usize,
) -> delta_rule::Operands<'a> {
    delta_rule::Operands { q, k, v, beta, g, scale: 1.0 / (dk as f64).sqrt() }
}
