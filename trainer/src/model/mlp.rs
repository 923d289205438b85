//! A block's MLP, after the post-attention norm: a dense SwiGLU (`mlp.{gate,up,down}_proj`), or
//! on a sparse layer the routed experts ([`super::moe`]), on Qwen3.5-MoE plus its shared expert:
//! a SwiGLU of `mlp.shared_expert.*` every token takes, scaled by `σ(mlp.shared_expert_gate · h)`
//! (one logit per token) and added to the routed output, as transformers'
//! `Qwen3_5MoeSparseMoeBlock` does. Every projection may carry a LoRA adapter.

use std::borrow::Cow;
use std::collections::BTreeMap;

use candle_core::{D, Result, Tensor};
use mindxtrain_kernels::swiglu;

use super::attention_parts::sigmoid;
use super::block::{BlockTape, Grads, LoraTape, StepCtx, accumulate};
use super::lora::{ExpertProj, expert_adapter_name};
use super::moe::{self, ExpertBranch, ExpertLora, ExpertWeight, MoeTape, MoeWeights, RouterStats};
use super::params::Proj;

/// The MLP's activations: SwiGLU's, or the experts' (and the shared expert's).
pub(super) enum MlpTape {
    Dense(SwigluTape),
    Sparse { experts: Box<MoeTape>, shared: Option<SharedTape> },
}

/// A SwiGLU's activations: its gate and up projections' outputs and their product.
pub(super) struct SwigluTape {
    gate: Tensor,
    up: Tensor,
    m: Tensor,
}

/// What the shared expert's backward reads.
pub(super) struct SharedTape {
    mlp: SwigluTape,
    /// The shared expert's output `[N, H]`, before its gate.
    out: Tensor,
    /// `σ(shared_expert_gate · h)`, `[N, 1]`.
    gate: Tensor,
}

/// A sparse layer's output with its shared expert: the routed experts' `routed` plus the shared
/// expert's `shared` scaled per token by `σ(logit)` (`logit`: `shared_expert_gate · h`, `[N, 1]`);
/// returns it and that gate (what the backward reads). Training, decoding and the paged engine
/// all mix through here.
pub(super) fn with_shared_expert(routed: &Tensor, shared: &Tensor, logit: &Tensor) -> Result<(Tensor, Tensor)> {
    let gate = sigmoid(logit)?;
    Ok(((routed + shared.broadcast_mul(&gate)?)?, gate))
}

impl StepCtx<'_> {
    /// The MLP on `h2` (`[N, H]`): its output, tape and (sparse layers) routing statistics.
    pub(super) fn mlp_forward(
        &self,
        layer: usize,
        h2: &Tensor,
        lora: &mut BTreeMap<Proj, LoraTape>,
    ) -> Result<(Tensor, MlpTape, Option<RouterStats>)> {
        let c = &self.model.config;
        let Some(shape) = c.moe.as_ref().filter(|m| m.is_sparse(layer)) else {
            let (out, tape) = self.swiglu_forward(layer, [Proj::Gate, Proj::Up, Proj::Down], h2, lora)?;
            return Ok((out, MlpTape::Dense(tape), None));
        };
        let (router, gate_up, down) = self.moe_weights(layer)?;
        let adapters = self.expert_lora(layer, shape.num_experts)?;
        let w = MoeWeights { router: &router, gate_up: &gate_up, down: &down, lora: adapters.as_ref() };
        let (mut y, experts, stats) = moe::forward(self.kernels(), shape, &w, h2, self.counted.as_ref())?;
        let shared = match c.arch.shared_expert() {
            true => {
                let [g, u, d, _] = Proj::SHARED_EXPERT;
                let (out, mlp) = self.swiglu_forward(layer, [g, u, d], h2, lora)?;
                let logit = self.proj_forward(layer, Proj::SharedExpertGate, h2, Some(lora))?;
                let (mixed, gate) = with_shared_expert(&y, &out, &logit)?;
                y = mixed;
                Some(SharedTape { mlp, out, gate })
            }
            false => None,
        };
        Ok((y, MlpTape::Sparse { experts: Box::new(experts), shared }, Some(stats)))
    }

    /// `down(swiglu(gate·x, up·x))` through the three projections `[gate, up, down]`.
    fn swiglu_forward(
        &self,
        layer: usize,
        [gate, up, down]: [Proj; 3],
        x: &Tensor,
        lora: &mut BTreeMap<Proj, LoraTape>,
    ) -> Result<(Tensor, SwigluTape)> {
        let g = self.proj_forward(layer, gate, x, Some(lora))?;
        let u = self.proj_forward(layer, up, x, Some(lora))?;
        let m = swiglu::forward(&g, &u)?;
        let out = self.proj_forward(layer, down, &m, Some(lora))?;
        Ok((out, SwigluTape { gate: g, up: u, m }))
    }

    /// The backward of [`StepCtx::swiglu_forward`] from `dout`: the projections' gradients
    /// accumulated; returns the output gradients of the gate and up projections, for the caller to
    /// sum into `x`'s gradient with any other projection of `x`.
    fn swiglu_backward(
        &self,
        layer: usize,
        down: Proj,
        dout: &Tensor,
        t: &SwigluTape,
        tape: &BlockTape,
        grads: &mut Grads,
    ) -> Result<(Tensor, Tensor)> {
        let dm = self.grad_of(layer, &[(down, dout)], &t.m, tape, grads)?;
        swiglu::backward(&dm, &t.gate, &t.up)
    }

    /// A sparse layer's router, stacked gate/up and down weights.
    fn moe_weights(&self, layer: usize) -> Result<(Cow<'_, Tensor>, ExpertWeight<'_>, ExpertWeight<'_>)> {
        Ok((
            self.weight(&moe::router_name(layer))?,
            self.experts(&moe::gate_up_name(layer))?,
            self.experts(&moe::down_name(layer))?,
        ))
    }

    /// A stacked expert weight: NF4 as the model holds it under QLoRA (expanded by each
    /// product that reads it), else dense like any weight (gathered by the hooks under ZeRO-3,
    /// which [`super::CausalLm::expert_weight`] does not know of).
    fn experts(&self, name: &str) -> Result<ExpertWeight<'_>> {
        match self.model.nf4_experts(name) {
            Some(q) => Ok(ExpertWeight::Nf4(q)),
            None => Ok(ExpertWeight::Dense(self.weight(name)?)),
        }
    }

    /// The adapters on a sparse layer's `experts`, per expert, if any.
    fn expert_lora(&self, layer: usize, experts: usize) -> Result<Option<ExpertLora>> {
        let Some(ad) = self.adapters else { return Ok(None) };
        let branch = |p: ExpertProj| -> Result<Option<ExpertBranch>> {
            let Some((a, b)) = ad.expert_pair(layer, p) else { return Ok(None) };
            let (a, b) = moe::expert_factors(a, b, experts)?;
            Ok(Some(ExpertBranch { a, b, scale: ad.config.expert_scaling(p) }))
        };
        let (gate_up, down) = (branch(ExpertProj::GateUp)?, branch(ExpertProj::Down)?);
        Ok((gate_up.is_some() || down.is_some()).then_some(ExpertLora { gate_up, down }))
    }

    /// The MLP's backward: the gradient of its input `h2` from the residual stream's `dout`.
    pub(super) fn mlp_backward(
        &self,
        layer: usize,
        dout: &Tensor,
        mlp: &MlpTape,
        h2: &Tensor,
        tape: &BlockTape,
        grads: &mut Grads,
    ) -> Result<Tensor> {
        let (experts, shared) = match mlp {
            MlpTape::Dense(t) => {
                let (dgate, dup) = self.swiglu_backward(layer, Proj::Down, dout, t, tape, grads)?;
                return self.grad_of(layer, &[(Proj::Gate, &dgate), (Proj::Up, &dup)], h2, tape, grads);
            }
            MlpTape::Sparse { experts, shared } => (experts, shared),
        };
        let dh2 = self.experts_backward(layer, dout, experts, h2, grads)?;
        let Some(s) = shared else { return Ok(dh2) };
        // y += out·σ(g): d(out) = dout·σ, dg = Σ_h(dout·out)·σ(1 − σ).
        let dshared = dout.broadcast_mul(&s.gate)?;
        let dsigma = (dout * &s.out)?.sum_keepdim(D::Minus1)?;
        let dlogit = (dsigma * (&s.gate * s.gate.affine(-1.0, 1.0)?)?)?;
        let (dgate, dup) = self.swiglu_backward(layer, Proj::SharedDown, &dshared, &s.mlp, tape, grads)?;
        let projs = [(Proj::SharedGate, &dgate), (Proj::SharedUp, &dup), (Proj::SharedExpertGate, &dlogit)];
        dh2 + self.grad_of(layer, &projs, h2, tape, grads)?
    }

    /// The routed experts' backward: `dh2` through them and the router, their gradients accumulated.
    fn experts_backward(
        &self,
        layer: usize,
        dout: &Tensor,
        moe_tape: &MoeTape,
        h2: &Tensor,
        grads: &mut Grads,
    ) -> Result<Tensor> {
        let (router, gate_up, down) = self.moe_weights(layer)?;
        let (experts, _, _) = gate_up.dims()?;
        let lora = self.expert_lora(layer, experts)?;
        let w = MoeWeights { router: &router, gate_up: &gate_up, down: &down, lora: lora.as_ref() };
        let (dh2, g) = moe::backward(
            self.kernels(),
            &w,
            h2,
            dout,
            moe_tape,
            self.balance.as_ref(),
            self.base_grads,
            self.adapter_grads,
        )?;
        let weights = [(moe::router_name(layer), g.router), (moe::gate_up_name(layer), g.gate_up)];
        for (name, grad) in weights.into_iter().chain([(moe::down_name(layer), g.down)]) {
            if let Some(grad) = grad {
                accumulate(grads, name, grad)?;
            }
        }
        let targets = self.adapters.map(|ad| ad.config.expert_targets()).unwrap_or_default();
        for (proj, lg) in [(ExpertProj::GateUp, g.lora_gate_up), (ExpertProj::Down, g.lora_down)] {
            if let Some((da, db)) = lg {
                let (da, db) = moe::peft_grads(&da, &db)?;
                accumulate(grads, expert_adapter_name(layer, proj, &targets, 'A'), da)?;
                accumulate(grads, expert_adapter_name(layer, proj, &targets, 'B'), db)?;
            }
        }
        Ok(dh2)
    }
}
