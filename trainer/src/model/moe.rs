//! Qwen3-MoE's sparse MLP: the router (`mlp.gate`), top-k of the experts per token, each
//! expert a SwiGLU MLP, their outputs weighted back into token order. Dropless: every token
//! reaches its `k` experts, whatever the load.
//!
//! The experts' weights are held stacked, under transformers 5's names for `Qwen3MoeExperts`:
//! `mlp.experts.gate_up_proj` `[E, 2F, H]` (gate rows, then up rows) and `mlp.experts.down_proj`
//! `[E, H, F]`, so the grouped GEMMs read them in place. Checkpoints with one tensor per expert
//! (`mlp.experts.{e}.{gate,up,down}_proj.weight`, the Hub's Qwen3-MoE files and transformers 4)
//! are stacked on load ([`fuse_experts`]).
//!
//! The load-balancing loss (HF's `load_balancing_loss_func`) is `E · Σ_e f_e · P_e` over every
//! sparse layer's tokens together, `f_e` the share of the (token, slot) choices that went to
//! expert `e` and `P_e` its mean probability. The counts are constants (not differentiable), so
//! its gradient is a per-expert constant on the probabilities, known once the forward has seen
//! every layer: [`balance_terms`].

use std::collections::BTreeMap;

use candle_core::{DType, Result, Tensor};
use mindxtrain_kernels::moe::grouped::{GradTerm, Term};
use mindxtrain_kernels::moe::router::{self, LossTerms, Routing};
use mindxtrain_kernels::moe::{Groups, combine, glu, grouped};
use mindxtrain_kernels::{KernelConfig, linear};

use super::config::MoeShape;
use super::{ModelError, Params, Qwen3Config};

/// The router's weight `[E, H]`.
pub fn router_name(layer: usize) -> String {
    format!("model.layers.{layer}.mlp.gate.weight")
}

/// The stacked gate and up projections of every expert, `[E, 2F, H]`.
pub fn gate_up_name(layer: usize) -> String {
    format!("model.layers.{layer}.mlp.experts.gate_up_proj")
}

/// The stacked down projections, `[E, H, F]`.
pub fn down_name(layer: usize) -> String {
    format!("model.layers.{layer}.mlp.experts.down_proj")
}

/// One expert's own tensor, as the Hub's Qwen3-MoE checkpoints name it.
pub fn expert_name(layer: usize, expert: usize, proj: &str) -> String {
    format!("model.layers.{layer}.mlp.experts.{expert}.{proj}.weight")
}

/// The sparse MLP's parameters of `layer` with their shapes.
pub(super) fn expected_shapes(c: &Qwen3Config, moe: &MoeShape, layer: usize, out: &mut BTreeMap<String, Vec<usize>>) {
    let (e, h, f) = (moe.num_experts, c.hidden_size, moe.moe_intermediate_size);
    out.insert(router_name(layer), vec![e, h]);
    out.insert(gate_up_name(layer), vec![e, 2 * f, h]);
    out.insert(down_name(layer), vec![e, h, f]);
}

/// Replaces per-expert tensors (`mlp.experts.{e}.gate_proj.weight`, …) by the stacked ones.
/// A layer already stacked is left alone; a layer with some experts missing is an error naming
/// the first one.
pub fn fuse_experts(c: &Qwen3Config, params: &mut Params) -> std::result::Result<(), ModelError> {
    let Some(moe) = &c.moe else { return Ok(()) };
    for layer in (0..c.num_hidden_layers).filter(|&l| moe.is_sparse(l)) {
        if !params.contains_key(&expert_name(layer, 0, "gate_proj")) {
            continue;
        }
        let mut take = |e: usize, proj: &str| {
            let name = expert_name(layer, e, proj);
            params.remove(&name).ok_or(ModelError::MissingParam(name))
        };
        let (mut gate_up, mut down) = (Vec::with_capacity(moe.num_experts), Vec::with_capacity(moe.num_experts));
        for e in 0..moe.num_experts {
            let (g, u, d) = (take(e, "gate_proj")?, take(e, "up_proj")?, take(e, "down_proj")?);
            gate_up.push(Tensor::cat(&[g, u], 0)?);
            down.push(d);
        }
        params.insert(gate_up_name(layer), Tensor::stack(&gate_up, 0)?);
        params.insert(down_name(layer), Tensor::stack(&down, 0)?);
    }
    Ok(())
}

/// The inverse of [`fuse_experts`]: one tensor per expert and projection (for checkpoints
/// that transformers 4 and other tools read).
pub fn split_experts(c: &Qwen3Config, params: &Params) -> std::result::Result<Params, ModelError> {
    let Some(moe) = &c.moe else { return Ok(params.clone()) };
    let mut out = params.clone();
    let f = moe.moe_intermediate_size;
    for layer in (0..c.num_hidden_layers).filter(|&l| moe.is_sparse(l)) {
        let (gu, down) = (gate_up_name(layer), down_name(layer));
        let gate_up = out.remove(&gu).ok_or(ModelError::MissingParam(gu))?;
        let down_w = out.remove(&down).ok_or(ModelError::MissingParam(down))?;
        for e in 0..moe.num_experts {
            let g = gate_up.get(e)?;
            out.insert(expert_name(layer, e, "gate_proj"), g.narrow(0, 0, f)?.contiguous()?);
            out.insert(expert_name(layer, e, "up_proj"), g.narrow(0, f, f)?.contiguous()?);
            out.insert(expert_name(layer, e, "down_proj"), down_w.get(e)?.contiguous()?);
        }
    }
    Ok(out)
}

/// The sparse MLP's weights of one layer.
pub(super) struct MoeWeights<'a> {
    pub router: &'a Tensor,
    pub gate_up: &'a Tensor,
    pub down: &'a Tensor,
}

/// What the sparse MLP's backward reads.
pub(super) struct MoeTape {
    routing: Routing,
    groups: Groups,
    /// `[N·k, 2F]` the experts' gate/up outputs, sorted by expert.
    gu: Tensor,
    /// `[N·k, F]` SwiGLU of `gu`.
    m: Tensor,
    /// `[N·k, H]` the experts' outputs before weighting.
    y: Tensor,
    /// `[N]` 1 for the tokens the load-balancing loss counts, 0 for padding (`None`: all).
    counted: Option<Tensor>,
}

/// Per layer: how often each expert was chosen and its summed probability (`[E]` each, in the
/// router's compute dtype), for the load-balancing loss.
#[derive(Debug, Clone)]
pub(super) struct RouterStats {
    pub counts: Tensor,
    pub probs: Tensor,
}

/// `h` `[N, H]` → the sparse MLP's output `[N, H]`, its tape and its routing statistics over
/// the tokens `counted` marks (`[N]`, 1 or 0; `None`: every token). Padding is routed like any
/// token, but as in HF's `load_balancing_loss_func` with an attention mask, it does not count
/// towards the balance.
pub(super) fn forward(
    kernels: &KernelConfig,
    moe: &MoeShape,
    w: &MoeWeights<'_>,
    h: &Tensor,
    counted: Option<&Tensor>,
) -> Result<(Tensor, MoeTape, RouterStats)> {
    let logits = linear::forward(kernels, h, w.router)?;
    let routing = router::forward(&logits, moe.num_experts_per_tok, moe.norm_topk_prob)?;
    let groups = Groups::new(&routing.experts, moe.num_experts)?;
    let width = w.gate_up.dim(1)?;
    let gu = grouped::forward_sum(kernels, &groups, &[Term { x: h, gathered: true, w: w.gate_up, col: 0 }], width)?;
    let m = glu::forward(&gu)?;
    let hidden = w.down.dim(1)?;
    let y = grouped::forward_sum(kernels, &groups, &[Term { x: &m, gathered: false, w: w.down, col: 0 }], hidden)?;
    let out = combine::forward(&y, &routing.weights, &groups)?;
    let counted = counted.map(|c| c.to_dtype(routing.probs.dtype())).transpose()?;
    let (counts, probs, _) = router::stats(&routing, counted.as_ref())?;
    Ok((out, MoeTape { routing, groups, gu, m, y, counted }, RouterStats { counts, probs }))
}

/// The sparse MLP's parameter gradients, when asked for.
pub(super) struct MoeGrads {
    pub router: Tensor,
    pub gate_up: Tensor,
    pub down: Tensor,
}

/// Backward from `dout` `[N, H]`: `dh` `[N, H]` (through the experts and through the routing
/// weights into the router), and the weights' gradients with `base_grads`. `balance` is the
/// load-balancing loss's per-expert term ([`balance_terms`]).
pub(super) fn backward(
    kernels: &KernelConfig,
    w: &MoeWeights<'_>,
    h: &Tensor,
    dout: &Tensor,
    tape: &MoeTape,
    balance: Option<&Tensor>,
    base_grads: bool,
) -> Result<(Tensor, Option<MoeGrads>)> {
    let g = &tape.groups;
    let (dy, dweights) = combine::backward(dout, &tape.y, &tape.routing.weights, g)?;
    let dm = grouped::input_grad_sum(kernels, g, &[GradTerm { dy: &dy, col: 0, w: w.down }])?;
    let dgu = glu::backward(&dm, &tape.gu)?;
    let dxs = grouped::input_grad_sum(kernels, g, &[GradTerm { dy: &dgu, col: 0, w: w.gate_up }])?;
    let terms = LossTerms { balance: balance.cloned(), z: 0.0, counted: tape.counted.clone() };
    let dlogits = router::backward(&dweights, &tape.routing, &terms)?;
    let dh = (combine::scatter_sum(&dxs, g)? + linear::input_grad_sum(kernels, &[(&dlogits, w.router)])?)?;
    let grads = if base_grads {
        let hidden = w.down.dim(1)?;
        Some(MoeGrads {
            router: linear::weight_grad(kernels, &dlogits, h)?,
            gate_up: grouped::weight_grad(kernels, g, &dgu, 0, dgu.dim(1)?, h, true)?,
            down: grouped::weight_grad(kernels, g, &dy, 0, hidden, &tape.m, false)?,
        })
    } else {
        None
    };
    Ok((dh, grads))
}

/// The load-balancing loss over every sparse layer's statistics, and its per-expert gradient
/// on the probabilities scaled by `scale` (the loss's weight in the objective).
/// `tokens` is the tokens each layer counted (the batch's real tokens).
pub(super) fn balance_terms(stats: &[RouterStats], tokens: usize, scale: f64) -> Result<Option<(f64, Tensor)>> {
    let Some(first) = stats.first().filter(|_| tokens > 0) else { return Ok(None) };
    let e = first.counts.dim(0)?;
    let mut counts = first.counts.zeros_like()?;
    let mut probs = first.probs.zeros_like()?;
    for s in stats {
        counts = (counts + &s.counts)?;
        probs = (probs + &s.probs)?;
    }
    let n = (stats.len() * tokens) as f64;
    let share = (counts / n)?;
    let loss = (share.mul(&(probs / n)?)?.sum_all()?.to_dtype(DType::F64)?.to_scalar::<f64>()?) * e as f64;
    let grad = (share * (scale * e as f64 / n))?;
    Ok(Some((loss, grad)))
}
