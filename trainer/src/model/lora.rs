//! LoRA adapters with PEFT's tensor names, init and scaling, and their merge into the base.
//!
//! On a Qwen3.5-MoE sparse layer the `gate_proj`/`up_proj`/`down_proj` targets adapt the shared
//! expert's projections and `shared_expert_gate` its gate, as PEFT matches them there; the routed
//! experts stay frozen under LoRA (PEFT's `all-linear` does not reach them either).
//!
//! On a Qwen3-MoE sparse layer the MLP is the experts' two stacked weights, which PEFT adapts as
//! parameters (`target_parameters`), not modules: one adapter per stacked weight, `lora_A`
//! `[E·r', in]` (expert `e`'s rows `e·r'..(e+1)·r'`) and `lora_B` `[out, r'·E]` (expert `e`'s rank
//! column `j` at `j·E + e`). The targets map as PEFT 0.21 maps them on transformers 5's
//! Qwen3-MoE: `gate_proj` with `up_proj` adapt the fused `gate_up_proj` at rank `r' = 2r` and
//! alpha `2α` (the same scaling; the rank of the two adapters it stands for), `down_proj` adapts
//! `down_proj` at rank `r`; one of `gate_proj`/`up_proj` alone is refused, as PEFT refuses it.

use std::collections::BTreeMap;

use candle_core::{DType, Device, Tensor};

use super::params::{Proj, base_weight_name};
use super::rng::{SplitMix64, name_id};
use super::{LmConfig, ModelError, MoeShape, Params};
use crate::recipe::{Lora, TargetModule};

/// The adapter hyper-parameters (`r`, `alpha`, dropout, targets, rsLoRA scaling).
#[derive(Debug, Clone, PartialEq)]
pub struct LoraConfig {
    pub r: usize,
    pub alpha: f64,
    pub dropout: f64,
    pub target_modules: Vec<TargetModule>,
    pub rslora: bool,
}

impl LoraConfig {
    /// `alpha / r`, or `alpha / √r` with rsLoRA (PEFT's `use_rslora`).
    pub fn scaling(&self) -> f64 {
        scaling(self.alpha, self.r, self.rslora)
    }

    /// The scaling of an expert weight's adapter, whose rank and alpha are `ExpertProj::rank`'s
    /// multiple of the recipe's (PEFT's rank and alpha patterns): the same as [`LoraConfig::scaling`]
    /// but with rsLoRA.
    pub fn expert_scaling(&self, proj: ExpertProj) -> f64 {
        let k = proj.rank(1);
        scaling(self.alpha * k as f64, self.r * k, self.rslora)
    }

    /// Every adapter tensor's PEFT name and shape on `model`.
    pub fn shapes(&self, model: &LmConfig) -> BTreeMap<String, Vec<usize>> {
        let mut out = BTreeMap::new();
        for layer in 0..model.num_hidden_layers {
            for proj in Proj::of_layer(model, layer).into_iter().filter(|&p| self.targets(p)) {
                let (out_dim, in_dim) = proj.shape(model);
                out.insert(adapter_name(layer, proj, 'A'), vec![self.r, in_dim]);
                out.insert(adapter_name(layer, proj, 'B'), vec![out_dim, self.r]);
            }
            if let Some(moe) = expert_adapted(model).filter(|m| m.is_sparse(layer)) {
                let (targets, e) = (self.expert_targets(), moe.num_experts);
                for &proj in &targets {
                    let ((out_dim, in_dim), r) = (proj.shape(model, moe), proj.rank(self.r));
                    out.insert(expert_adapter_name(layer, proj, &targets, 'A'), vec![e * r, in_dim]);
                    out.insert(expert_adapter_name(layer, proj, &targets, 'B'), vec![out_dim, r * e]);
                }
            }
        }
        out
    }

    pub fn targets(&self, proj: Proj) -> bool {
        self.target_modules.contains(&proj.target_module())
    }

    /// The experts' stacked weights this adapter adapts on a sparse layer.
    pub fn expert_targets(&self) -> Vec<ExpertProj> {
        let t = |p: Proj| self.targets(p);
        ExpertProj::ALL
            .into_iter()
            .filter(|e| match e {
                ExpertProj::GateUp => t(Proj::Gate) && t(Proj::Up),
                ExpertProj::Down => t(Proj::Down),
            })
            .collect()
    }

    /// PEFT's `target_parameters` for a model of `model`: the expert weights adapted, when it has
    /// sparse layers (empty otherwise).
    pub fn target_parameters(&self, model: &LmConfig) -> Vec<String> {
        let sparse = expert_adapted(model).is_some_and(|m| (0..model.num_hidden_layers).any(|l| m.is_sparse(l)));
        if !sparse {
            return Vec::new();
        }
        self.expert_targets().into_iter().map(|e| e.parameter().to_string()).collect()
    }

    fn validate(&self) -> Result<(), ModelError> {
        if self.r == 0 {
            return Err(ModelError::Lora("r must be at least 1".into()));
        }
        if !(0.0..1.0).contains(&self.dropout) {
            return Err(ModelError::Lora(format!("dropout {} is outside [0, 1)", self.dropout)));
        }
        if self.target_modules.is_empty() {
            return Err(ModelError::Lora("no target modules".into()));
        }
        Ok(())
    }

    /// [`LoraConfig::validate`], and what adapting `model`'s experts needs: no dropout (an
    /// expert's input rows are gathered per expert; PEFT's `target_parameters` refuses dropout
    /// too, for the same reason).
    fn validate_for(&self, model: &LmConfig) -> Result<(), ModelError> {
        self.validate()?;
        let sparse = expert_adapted(model).is_some_and(|m| (0..model.num_hidden_layers).any(|l| m.is_sparse(l)));
        if sparse && self.targets(Proj::Gate) != self.targets(Proj::Up) {
            return Err(ModelError::Lora(
                "gate_proj and up_proj are one fused weight in a Qwen3-MoE layer's experts \
                 (mlp.experts.gate_up_proj): target both or neither"
                    .into(),
            ));
        }
        if self.dropout > 0.0 && !self.target_parameters(model).is_empty() {
            return Err(ModelError::Lora(format!(
                "dropout {} with targets that adapt the experts of sparse layers (mlp.experts.{}): LoRA on experts \
                 takes no dropout (set lora dropout to 0, or target only attention)",
                self.dropout,
                self.target_parameters(model).join(", mlp.experts.")
            )));
        }
        Ok(())
    }
}

/// The experts' shape of `model` when its targets reach the routed experts (Qwen3-MoE:
/// [`super::Arch::targets_reach_experts`]); `None` for a dense model or a Qwen3.5-MoE.
fn expert_adapted(model: &LmConfig) -> Option<&MoeShape> {
    model.moe.as_ref().filter(|_| model.arch.targets_reach_experts())
}

/// A sparse layer's stacked expert weight, as an adapter target.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ExpertProj {
    /// `mlp.experts.gate_up_proj` `[E, 2F, H]`.
    GateUp,
    /// `mlp.experts.down_proj` `[E, H, F]`.
    Down,
}

impl ExpertProj {
    pub const ALL: [ExpertProj; 2] = [ExpertProj::GateUp, ExpertProj::Down];

    /// PEFT's `target_parameters` entry (the name its conversion of `gate_proj`/`up_proj`/`down_proj`
    /// targets writes; PEFT matches it against the end of a parameter's name).
    pub fn parameter(self) -> &'static str {
        match self {
            ExpertProj::GateUp => "gate_up_proj",
            ExpertProj::Down => "down_proj",
        }
    }

    /// The adapter's rank for the recipe's rank `r`: the fused gate/up weight stands for two
    /// adapters of rank `r` (PEFT's `rank_pattern` for it), `down_proj` for one.
    pub fn rank(self, r: usize) -> usize {
        match self {
            ExpertProj::GateUp => 2 * r,
            ExpertProj::Down => r,
        }
    }

    /// The stacked weight's name in layer `layer`.
    pub fn weight_name(self, layer: usize) -> String {
        match self {
            ExpertProj::GateUp => super::moe::gate_up_name(layer),
            ExpertProj::Down => super::moe::down_name(layer),
        }
    }

    /// `(out, in)` of one expert's weight.
    pub fn shape(self, model: &LmConfig, moe: &MoeShape) -> (usize, usize) {
        let (h, f) = (model.hidden_size, moe.moe_intermediate_size);
        match self {
            ExpertProj::GateUp => (2 * f, h),
            ExpertProj::Down => (h, f),
        }
    }
}

/// The PEFT name of an expert adapter matrix. PEFT wraps the experts module once per targeted
/// parameter, `gate_up_proj` innermost: with both targeted, its adapter sits under
/// `mlp.experts.base_layer` and `down_proj`'s under `mlp.experts`; a lone target is `mlp.experts`'s.
pub fn expert_adapter_name(layer: usize, proj: ExpertProj, targets: &[ExpertProj], matrix: char) -> String {
    let nested = proj == ExpertProj::GateUp && targets.contains(&ExpertProj::Down);
    let path = if nested { "mlp.experts.base_layer" } else { "mlp.experts" };
    format!("base_model.model.model.layers.{layer}.{path}.lora_{matrix}.weight")
}

fn scaling(alpha: f64, r: usize, rslora: bool) -> f64 {
    if rslora { alpha / (r as f64).sqrt() } else { alpha / r as f64 }
}

impl From<&Lora> for LoraConfig {
    fn from(l: &Lora) -> Self {
        LoraConfig {
            r: l.r as usize,
            alpha: l.alpha as f64,
            dropout: l.dropout,
            target_modules: l.target_modules.clone(),
            rslora: l.rslora,
        }
    }
}

/// The PEFT name of an adapter matrix: `base_model.model.model.layers.{i}.self_attn.q_proj.lora_A.weight`.
pub fn adapter_name(layer: usize, proj: Proj, matrix: char) -> String {
    format!("base_model.model.model.layers.{layer}.{}.lora_{matrix}.weight", proj.path())
}

/// A set of adapters: `lora_A` `[r, in]` and `lora_B` `[out, r]` for every targeted projection.
#[derive(Debug, Clone)]
pub struct Adapters {
    pub config: LoraConfig,
    pub tensors: BTreeMap<String, Tensor>,
}

impl Adapters {
    /// PEFT's init: `A` Kaiming-uniform with `a = √5` (uniform in `±1/√in`), `B` zeros, so
    /// the adapted model starts equal to the base. Seeded per tensor name.
    pub fn init(
        model: &LmConfig,
        lora: &LoraConfig,
        seed: u64,
        dtype: DType,
        device: &Device,
    ) -> Result<Adapters, ModelError> {
        lora.validate_for(model)?;
        let mut tensors = BTreeMap::new();
        // A: PEFT's Kaiming-uniform (a = √5) over the input, uniform in ±1/√in; B: zeros.
        for (name, shape) in lora.shapes(model) {
            let t = if name.ends_with(".lora_A.weight") {
                let (rows, in_dim) = (shape[0], shape[1]);
                let mut rng = SplitMix64::derive(seed, &[name_id(&name)]);
                let bound = 1.0 / (in_dim as f64).sqrt();
                let a: Vec<f64> = (0..rows * in_dim).map(|_| bound * (2.0 * rng.unit() - 1.0)).collect();
                Tensor::from_vec(a, (rows, in_dim), device)?.to_dtype(dtype)?
            } else {
                Tensor::zeros(shape, dtype, device)?
            };
            tensors.insert(name, t);
        }
        Ok(Adapters { config: lora.clone(), tensors })
    }

    /// Adapters from stored tensors (a PEFT `adapter_model.safetensors`), every name and shape
    /// checked against the model and config.
    pub fn new(model: &LmConfig, lora: LoraConfig, tensors: BTreeMap<String, Tensor>) -> Result<Adapters, ModelError> {
        lora.validate_for(model)?;
        super::params::check_names_and_shapes(&lora.shapes(model), &tensors)?;
        Ok(Adapters { config: lora, tensors })
    }

    /// `(A [E·r, in], B [out, r·E])` of one stacked expert weight, if it is adapted (PEFT's layout).
    pub fn expert_pair(&self, layer: usize, proj: ExpertProj) -> Option<(&Tensor, &Tensor)> {
        let targets = self.config.expert_targets();
        let a = self.tensors.get(&expert_adapter_name(layer, proj, &targets, 'A'))?;
        let b = self.tensors.get(&expert_adapter_name(layer, proj, &targets, 'B'))?;
        Some((a, b))
    }

    /// Whether any sparse layer's experts are adapted.
    pub fn adapts_experts(&self, model: &LmConfig) -> bool {
        (0..model.num_hidden_layers).any(|l| ExpertProj::ALL.iter().any(|&p| self.expert_pair(l, p).is_some()))
    }

    /// `(A, B)` of one projection, if it is adapted.
    pub fn pair(&self, layer: usize, proj: Proj) -> Option<(&Tensor, &Tensor)> {
        let a = self.tensors.get(&adapter_name(layer, proj, 'A'))?;
        let b = self.tensors.get(&adapter_name(layer, proj, 'B'))?;
        Some((a, b))
    }
}

/// Base weights with every adapter folded in: `W + scaling · B·A`.
pub fn merge_lora(params: &Params, config: &LmConfig, adapters: &Adapters) -> Result<Params, ModelError> {
    let mut merged = params.clone();
    let scale = adapters.config.scaling();
    for layer in 0..config.num_hidden_layers {
        for proj in Proj::of_layer(config, layer) {
            let Some((a, b)) = adapters.pair(layer, proj) else { continue };
            let name = base_weight_name(layer, proj);
            let w = merged.get(&name).ok_or_else(|| ModelError::MissingParam(name.clone()))?;
            let delta = (b.to_dtype(DType::F64)?.matmul(&a.to_dtype(DType::F64)?)? * scale)?;
            let updated = (w.to_dtype(DType::F64)? + delta)?.to_dtype(w.dtype())?;
            merged.insert(name, updated);
        }
        for proj in ExpertProj::ALL {
            let Some((a, b)) = adapters.expert_pair(layer, proj) else { continue };
            let scale = adapters.config.expert_scaling(proj);
            let name = proj.weight_name(layer);
            let w = merged.get(&name).ok_or_else(|| ModelError::MissingParam(name.clone()))?;
            let f64s = |t: &Tensor| t.to_dtype(DType::F64);
            let (a, b) = super::moe::expert_factors(&f64s(a)?, &f64s(b)?, w.dim(0)?)?;
            let delta = (b.matmul(&a)? * scale)?;
            let updated = (w.to_dtype(DType::F64)? + delta)?.to_dtype(w.dtype())?;
            merged.insert(name, updated);
        }
    }
    Ok(merged)
}
