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
//!
//! Under QLoRA the two stacked weights are NF4 ([`ExpertWeight::Nf4`]): each grouped product
//! that reads one (forward, input gradient) expands it first and drops the dense copy when the
//! product is done; a frozen base has no weight gradient, and the LoRA branch is unchanged.

use std::borrow::Cow;
use std::collections::BTreeMap;

use candle_core::{DType, Result, Tensor};
use mindxtrain_kernels::moe::grouped::{GradTerm, Term};
use mindxtrain_kernels::moe::router::{self, LossTerms, Routing};
use mindxtrain_kernels::moe::{Groups, combine, glu, grouped};
use mindxtrain_kernels::{KernelConfig, linear};

use super::config::MoeShape;
use super::nf4::Nf4Experts;
use super::{LmConfig, ModelError, Params};

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
pub(super) fn expected_shapes(c: &LmConfig, moe: &MoeShape, layer: usize, out: &mut BTreeMap<String, Vec<usize>>) {
    let (e, h, f) = (moe.num_experts, c.hidden_size, moe.moe_intermediate_size);
    out.insert(router_name(layer), vec![e, h]);
    out.insert(gate_up_name(layer), vec![e, 2 * f, h]);
    out.insert(down_name(layer), vec![e, h, f]);
}

/// Replaces per-expert tensors (`mlp.experts.{e}.gate_proj.weight`, …) by the stacked ones.
/// A layer already stacked is left alone; a layer with some experts missing is an error naming
/// the first one.
pub fn fuse_experts(c: &LmConfig, params: &mut Params) -> std::result::Result<(), ModelError> {
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
pub fn split_experts(c: &LmConfig, params: &Params) -> std::result::Result<Params, ModelError> {
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
    pub gate_up: &'a ExpertWeight<'a>,
    pub down: &'a ExpertWeight<'a>,
    /// LoRA on the experts, if adapted.
    pub lora: Option<&'a ExpertLora>,
}

/// A stacked expert weight `[E, out, in]` as the model holds it.
pub(super) enum ExpertWeight<'a> {
    Dense(Cow<'a, Tensor>),
    /// QLoRA's frozen base.
    Nf4(&'a Nf4Experts),
}

impl ExpertWeight<'_> {
    /// `(E, out, in)`.
    pub fn dims(&self) -> Result<(usize, usize, usize)> {
        match self {
            ExpertWeight::Dense(w) => w.dims3(),
            ExpertWeight::Nf4(q) => Ok(q.dims()),
        }
    }

    /// The weight dense in `dtype` for one grouped product. An NF4 weight is expanded into a
    /// new tensor: the caller drops it as soon as its product is done, so one expert weight at
    /// a time is ever dense beside the NF4 base (in bf16, one layer of Qwen3-30B-A3B's experts
    /// is 805 MB of `gate_up_proj` and 403 MB of `down_proj`).
    fn dense(&self, dtype: DType) -> Result<Cow<'_, Tensor>> {
        match self {
            ExpertWeight::Dense(w) => Ok(Cow::Borrowed(w)),
            ExpertWeight::Nf4(q) => Ok(Cow::Owned(q.dequantize(dtype)?)),
        }
    }
}

/// LoRA on a sparse layer's experts, per stacked weight ([`ExpertBranch`]).
pub(super) struct ExpertLora {
    pub gate_up: Option<ExpertBranch>,
    pub down: Option<ExpertBranch>,
}

/// One stacked weight's adapter: every expert's `A` `[E, r, in]` and `B` `[E, out, r]`
/// ([`expert_factors`]) and its scaling `s`. Expert `e`'s rows get `s·(x·A_eᵀ)·B_eᵀ` beside
/// `x·W_eᵀ`, the two in one output.
pub(super) struct ExpertBranch {
    pub a: Tensor,
    pub b: Tensor,
    pub scale: f64,
}

/// PEFT's expert adapter as per-expert factors: `A` `[E·r, in]` as `[E, r, in]`, `B` `[out, r·E]`
/// (expert `e`'s rank column `j` at `j·E + e`) as `[E, out, r]`.
pub fn expert_factors(a: &Tensor, b: &Tensor, experts: usize) -> Result<(Tensor, Tensor)> {
    let (rows, d_in) = a.dims2()?;
    let (out, cols) = b.dims2()?;
    if experts == 0 || rows % experts != 0 || cols != rows {
        candle_core::bail!("expert adapter: A {:?} and B {:?} for {experts} experts", a.dims(), b.dims());
    }
    let r = rows / experts;
    Ok((a.reshape((experts, r, d_in))?, b.reshape((out, r, experts))?.permute((2, 0, 1))?.contiguous()?))
}

/// The gradients of [`expert_factors`]' two outputs as gradients of PEFT's `A` and `B`.
pub fn peft_grads(da: &Tensor, db: &Tensor) -> Result<(Tensor, Tensor)> {
    let (e, r, d_in) = da.dims3()?;
    let out = db.dim(1)?;
    Ok((da.reshape((e * r, d_in))?, db.permute((1, 2, 0))?.contiguous()?.reshape((out, r * e))?))
}

/// Every expert's rows of `x` through its weight `w` `[E, out, in]`, plus its LoRA branch where
/// `lora` is given; also the branch's input `s·x·Aᵀ` (sorted rows), which the backward reads.
fn expert_proj(
    kernels: &KernelConfig,
    groups: &Groups,
    x: &Tensor,
    gathered: bool,
    w: &ExpertWeight<'_>,
    lora: Option<&ExpertBranch>,
) -> Result<(Tensor, Option<Tensor>)> {
    let (_, width, _) = w.dims()?;
    let Some(ExpertBranch { a, b, scale }) = lora else {
        let w = w.dense(x.dtype())?;
        let y = grouped::forward_sum(kernels, groups, &[Term { x, gathered, w: &w, col: 0 }], width)?;
        return Ok((y, None));
    };
    let xa = (grouped::forward_sum(kernels, groups, &[Term { x, gathered, w: a, col: 0 }], a.dim(1)?)? * *scale)?;
    let w = w.dense(x.dtype())?;
    let terms = [Term { x, gathered, w: &w, col: 0 }, Term { x: &xa, gathered: false, w: b, col: 0 }];
    let y = grouped::forward_sum(kernels, groups, &terms, width)?;
    Ok((y, Some(xa)))
}

/// What [`expert_proj_backward`] returns: the input's gradient (sorted rows), the weight's (when
/// asked), and the LoRA factors' `(dA [E, r, in], dB [E, out, r])` (when adapted and asked).
struct ProjGrads {
    dx: Tensor,
    dw: Option<Tensor>,
    lora: Option<(Tensor, Tensor)>,
}

/// The backward of [`expert_proj`] from its output's gradient `dy` (sorted rows).
#[allow(clippy::too_many_arguments)]
fn expert_proj_backward(
    kernels: &KernelConfig,
    groups: &Groups,
    dy: &Tensor,
    (x, gathered): (&Tensor, bool),
    w: &ExpertWeight<'_>,
    lora: Option<(&ExpertBranch, &Tensor)>,
    base_grads: bool,
    adapter_grads: bool,
) -> Result<ProjGrads> {
    let (_, out, _) = w.dims()?;
    if base_grads && matches!(w, ExpertWeight::Nf4(_)) {
        candle_core::bail!("an NF4 expert weight is a frozen QLoRA base: it takes no gradient (train adapters)");
    }
    let dw = if base_grads { Some(grouped::weight_grad(kernels, groups, dy, 0, out, x, gathered)?) } else { None };
    let Some((ExpertBranch { a, b, scale }, xa)) = lora else {
        let w = w.dense(dy.dtype())?;
        let dx = grouped::input_grad_sum(kernels, groups, &[GradTerm { dy, col: 0, w: &w }])?;
        return Ok(ProjGrads { dx, dw, lora: None });
    };
    // The branch saw s·x·Aᵀ: dB = dyᵀ·that, and A's output gradient is s·dy·B.
    let dxa = (grouped::input_grad_sum(kernels, groups, &[GradTerm { dy, col: 0, w: b }])? * *scale)?;
    let dx = {
        // Dense only for this product: dropped before the adapters' weight gradients.
        let w = w.dense(dy.dtype())?;
        let terms = [GradTerm { dy, col: 0, w: &w }, GradTerm { dy: &dxa, col: 0, w: a }];
        grouped::input_grad_sum(kernels, groups, &terms)?
    };
    let lora = if adapter_grads {
        let db = grouped::weight_grad(kernels, groups, dy, 0, out, xa, false)?;
        let da = grouped::weight_grad(kernels, groups, &dxa, 0, a.dim(1)?, x, gathered)?;
        Some((da, db))
    } else {
        None
    };
    Ok(ProjGrads { dx, dw, lora })
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
    /// The expert LoRA branches' inputs `s·x·Aᵀ` (sorted rows), where adapted.
    xa_gate_up: Option<Tensor>,
    xa_down: Option<Tensor>,
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
    let (gu, xa_gate_up) = expert_proj(kernels, &groups, h, true, w.gate_up, w.lora.and_then(|l| l.gate_up.as_ref()))?;
    let m = glu::forward(&gu)?;
    let (y, xa_down) = expert_proj(kernels, &groups, &m, false, w.down, w.lora.and_then(|l| l.down.as_ref()))?;
    let out = combine::forward(&y, &routing.weights, &groups)?;
    let counted = counted.map(|c| c.to_dtype(routing.probs.dtype())).transpose()?;
    let (counts, probs, _) = router::stats(&routing, counted.as_ref())?;
    let tape = MoeTape { routing, groups, gu, m, y, counted, xa_gate_up, xa_down };
    Ok((out, tape, RouterStats { counts, probs }))
}

/// The sparse MLP's parameter gradients: the weights' (full fine-tuning), the expert adapters'
/// as `(dA [E, r, in], dB [E, out, r])` ([`peft_grads`] turns them into PEFT's layout).
#[derive(Default)]
pub(super) struct MoeGrads {
    pub router: Option<Tensor>,
    pub gate_up: Option<Tensor>,
    pub down: Option<Tensor>,
    pub lora_gate_up: Option<(Tensor, Tensor)>,
    pub lora_down: Option<(Tensor, Tensor)>,
}

/// Backward from `dout` `[N, H]`: `dh` `[N, H]` (through the experts and through the routing
/// weights into the router), the weights' gradients with `base_grads` and the expert adapters'
/// with `adapter_grads`. `balance` is the load-balancing loss's per-expert term
/// ([`balance_terms`]).
#[allow(clippy::too_many_arguments)]
pub(super) fn backward(
    kernels: &KernelConfig,
    w: &MoeWeights<'_>,
    h: &Tensor,
    dout: &Tensor,
    tape: &MoeTape,
    balance: Option<&Tensor>,
    base_grads: bool,
    adapter_grads: bool,
) -> Result<(Tensor, MoeGrads)> {
    let g = &tape.groups;
    let (dy, dweights) = combine::backward(dout, &tape.y, &tape.routing.weights, g)?;
    let down = expert_proj_backward(
        kernels,
        g,
        &dy,
        (&tape.m, false),
        w.down,
        w.lora.and_then(|l| l.down.as_ref()).zip(tape.xa_down.as_ref()),
        base_grads,
        adapter_grads,
    )?;
    let dgu = glu::backward(&down.dx, &tape.gu)?;
    let gate_up = expert_proj_backward(
        kernels,
        g,
        &dgu,
        (h, true),
        w.gate_up,
        w.lora.and_then(|l| l.gate_up.as_ref()).zip(tape.xa_gate_up.as_ref()),
        base_grads,
        adapter_grads,
    )?;
    let terms = LossTerms { balance: balance.cloned(), z: 0.0, counted: tape.counted.clone() };
    let dlogits = router::backward(&dweights, &tape.routing, &terms)?;
    let dh = (combine::scatter_sum(&gate_up.dx, g)? + linear::input_grad_sum(kernels, &[(&dlogits, w.router)])?)?;
    let router = if base_grads { Some(linear::weight_grad(kernels, &dlogits, h)?) } else { None };
    let grads =
        MoeGrads { router, gate_up: gate_up.dw, down: down.dw, lora_gate_up: gate_up.lora, lora_down: down.lora };
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
