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
use super::recurrent::RecurrentState;
use super::{CausalLm, ModelError};

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
        taps(&*self.weight(&conv_name(layer))?)
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
        let p = LinearInputs::project(h1, |proj, x| self.proj_forward(layer, proj, x, Some(&mut *lora)))?;
        let (qkv, z, b_logits, a_in) = p.shaped(s, b, t)?;
        let (mixed_qkv, _) = causal_conv1d::forward(&qkv, &self.conv_taps(layer)?, None, None, &self.mask)?;
        let (a_log, dt_bias) = (self.weight(&name(layer, "A_log"))?, self.weight(&name(layer, "dt_bias"))?);
        let r = RuleInputs::new(s, &mixed_qkv, &b_logits, &a_in, &a_log, &dt_bias)?;
        let f = delta_rule::forward(&r.operands(s), None, &self.mask)?;
        let eps = self.model.config.rms_norm_eps;
        let (normed, rstd) = gated_rmsnorm::forward(&f.out, &z, &*self.weight(&name(layer, "norm.weight"))?, eps)?;
        let mixed = normed.reshape((b * t, s.value_dim()))?;
        let RuleInputs { q, k, rq, rk, qn, kn, v, beta, g } = r;
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

/// A Gated DeltaNet layer's four input projections of `N` rows: `in_proj_qkv` `[N, conv_dim]`,
/// `in_proj_z` `[N, value_dim]`, `in_proj_b` and `in_proj_a` `[N, H]`.
pub(super) struct LinearInputs {
    qkv: Tensor,
    z: Tensor,
    b: Tensor,
    a: Tensor,
}

impl LinearInputs {
    /// The projections of `h1` by `project` (the training step's with its LoRA tape, dense
    /// decoding's, or the serving engine's with each row's adapter).
    pub(super) fn project(h1: &Tensor, mut project: impl FnMut(Proj, &Tensor) -> Result<Tensor>) -> Result<Self> {
        Ok(LinearInputs {
            qkv: project(Proj::InProjQkv, h1)?,
            z: project(Proj::InProjZ, h1)?,
            b: project(Proj::InProjB, h1)?,
            a: project(Proj::InProjA, h1)?,
        })
    }

    /// Rows `from .. from + len` (one sequence of a serving step).
    pub(super) fn rows(&self, from: usize, len: usize) -> Result<Self> {
        let r = |t: &Tensor| t.narrow(0, from, len);
        Ok(LinearInputs { qkv: r(&self.qkv)?, z: r(&self.z)?, b: r(&self.b)?, a: r(&self.a)? })
    }

    /// Rows `rows` (`[k]` u32 on the device): one row of each sequence a decode step advances
    /// together.
    pub(super) fn select(&self, rows: &Tensor) -> Result<Self> {
        let r = |t: &Tensor| t.index_select(rows, 0);
        Ok(LinearInputs { qkv: r(&self.qkv)?, z: r(&self.z)?, b: r(&self.b)?, a: r(&self.a)? })
    }

    /// As `[B, T, ..]`: the conv's input, z per value head, and the gates' inputs.
    fn shaped(&self, s: &HybridShape, b: usize, t: usize) -> Result<(Tensor, Tensor, Tensor, Tensor)> {
        let h = s.linear_num_value_heads;
        Ok((
            self.qkv.reshape((b, t, s.conv_dim()))?,
            self.z.reshape((b, t, h, s.linear_value_head_dim))?,
            self.b.reshape((b, t, h))?,
            self.a.reshape((b, t, h))?,
        ))
    }
}

/// The delta rule's inputs from the conv's output and the gates' inputs (training and
/// inference alike): q, k, v split by head, q and k l2-normalised, `β` and `g`.
struct RuleInputs {
    q: Tensor,
    k: Tensor,
    rq: Tensor,
    rk: Tensor,
    qn: Tensor,
    kn: Tensor,
    v: Tensor,
    beta: Tensor,
    g: Tensor,
}

impl RuleInputs {
    fn new(
        s: &HybridShape,
        mixed_qkv: &Tensor,
        b_logits: &Tensor,
        a_in: &Tensor,
        a_log: &Tensor,
        dt_bias: &Tensor,
    ) -> Result<RuleInputs> {
        let (b, t, _) = mixed_qkv.dims3()?;
        let (hk, h, dk, dv) =
            (s.linear_num_key_heads, s.linear_num_value_heads, s.linear_key_head_dim, s.linear_value_head_dim);
        let kd = s.key_dim();
        let part = |from: usize, len: usize, heads: usize, d: usize| {
            mixed_qkv.narrow(2, from, len)?.contiguous()?.reshape((b, t, heads, d))
        };
        let (q, k, v) = (part(0, kd, hk, dk)?, part(kd, kd, hk, dk)?, part(2 * kd, h * dv, h, dv)?);
        let ((qn, rq), (kn, rk)) = (l2norm::forward(&q, L2NORM_EPS)?, l2norm::forward(&k, L2NORM_EPS)?);
        // g stays in f32 (transformers' dtype for it); the rule widens its operands itself.
        let (beta, g) = delta_gates::forward(b_logits, a_in, a_log, dt_bias)?;
        Ok(RuleInputs { q, k, rq, rk, qn, kn, v, beta, g })
    }

    fn operands(&self, s: &HybridShape) -> delta_rule::Operands<'_> {
        operands(&self.qn, &self.kn, &self.v, &self.beta, &self.g, s.linear_key_head_dim)
    }
}

/// The conv's taps as the kernels take them, `[conv_dim, W]`, from HF's `[conv_dim, 1, W]`.
fn taps(w: &Tensor) -> Result<Tensor> {
    let (c, _, width) = w.dims3()?;
    w.reshape((c, width))
}

impl CausalLm {
    /// Generation's pass of layer `layer`'s mixer over `b` sequences of `t` new tokens each (`x`'s
    /// rows sequence after sequence), continuing `state` (zeros when `None`: the sequences'
    /// first tokens): the one-step conv and delta rule, which take a prefill's many tokens as
    /// well as a decode's one. Returns `mixed` `[b·t, value_dim]` and the state after the last
    /// token.
    pub(super) fn linear_step(
        &self,
        layer: usize,
        x: &LinearInputs,
        (b, t): (usize, usize),
        state: Option<&RecurrentState>,
    ) -> std::result::Result<(Tensor, RecurrentState), ModelError> {
        let c = self.config();
        let s = c
            .hybrid
            .as_ref()
            .ok_or_else(|| ModelError::Config("a linear-attention layer in a model without a hybrid shape".into()))?;
        let zeros;
        let state = match state {
            Some(st) => st,
            None => {
                let spec = self.cache_spec(1).layers[layer];
                zeros = RecurrentState::zeros(&spec, b, self.dtype(), self.device())?;
                &zeros
            }
        };
        let (qkv, z, b_logits, a_in) = x.shaped(s, b, t)?;
        let (mixed_qkv, conv) =
            causal_conv1d::step(&qkv, &taps(&*self.weight(&conv_name(layer))?)?, None, &state.conv)?;
        let (a_log, dt_bias) = (self.weight(&name(layer, "A_log"))?, self.weight(&name(layer, "dt_bias"))?);
        let r = RuleInputs::new(s, &mixed_qkv, &b_logits, &a_in, &a_log, &dt_bias)?;
        let (out, rule) = delta_rule::step(&r.operands(s), &state.rule)?;
        let (normed, _) =
            gated_rmsnorm::forward(&out, &z, &*self.weight(&name(layer, "norm.weight"))?, c.rms_norm_eps)?;
        Ok((normed.reshape((b * t, s.value_dim()))?, RecurrentState { conv, rule }))
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
