//! LoRA adapters with PEFT's tensor names, init and scaling, and their merge into the base.

use std::collections::BTreeMap;

use candle_core::{DType, Device, Tensor};

use super::params::{Proj, base_weight_name};
use super::rng::{SplitMix64, name_id};
use super::{ModelError, Params, Qwen3Config};
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
        if self.rslora { self.alpha / (self.r as f64).sqrt() } else { self.alpha / self.r as f64 }
    }

    /// Every adapter tensor's PEFT name and shape on `model`.
    pub fn shapes(&self, model: &Qwen3Config) -> BTreeMap<String, Vec<usize>> {
        let mut out = BTreeMap::new();
        for layer in 0..model.num_hidden_layers {
            for proj in Proj::of_layer(model, layer).iter().copied().filter(|&p| self.targets(p)) {
                let (out_dim, in_dim) = proj.shape(model);
                out.insert(adapter_name(layer, proj, 'A'), vec![self.r, in_dim]);
                out.insert(adapter_name(layer, proj, 'B'), vec![out_dim, self.r]);
            }
        }
        out
    }

    pub fn targets(&self, proj: Proj) -> bool {
        self.target_modules.contains(&proj.target_module())
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
        model: &Qwen3Config,
        lora: &LoraConfig,
        seed: u64,
        dtype: DType,
        device: &Device,
    ) -> Result<Adapters, ModelError> {
        lora.validate()?;
        let mut tensors = BTreeMap::new();
        for layer in 0..model.num_hidden_layers {
            for &proj in Proj::of_layer(model, layer) {
                if !lora.targets(proj) {
                    continue;
                }
                let (out_dim, in_dim) = proj.shape(model);
                let a_name = adapter_name(layer, proj, 'A');
                let mut rng = SplitMix64::derive(seed, &[name_id(&a_name)]);
                let bound = 1.0 / (in_dim as f64).sqrt();
                let a: Vec<f64> = (0..lora.r * in_dim).map(|_| bound * (2.0 * rng.unit() - 1.0)).collect();
                tensors.insert(a_name, Tensor::from_vec(a, (lora.r, in_dim), device)?.to_dtype(dtype)?);
                tensors.insert(adapter_name(layer, proj, 'B'), Tensor::zeros((out_dim, lora.r), dtype, device)?);
            }
        }
        Ok(Adapters { config: lora.clone(), tensors })
    }

    /// Adapters from stored tensors (a PEFT `adapter_model.safetensors`), every name and shape
    /// checked against the model and config.
    pub fn new(
        model: &Qwen3Config,
        lora: LoraConfig,
        tensors: BTreeMap<String, Tensor>,
    ) -> Result<Adapters, ModelError> {
        lora.validate()?;
        super::params::check_names_and_shapes(&lora.shapes(model), &tensors)?;
        Ok(Adapters { config: lora, tensors })
    }

    /// `(A, B)` of one projection, if it is adapted.
    pub fn pair(&self, layer: usize, proj: Proj) -> Option<(&Tensor, &Tensor)> {
        let a = self.tensors.get(&adapter_name(layer, proj, 'A'))?;
        let b = self.tensors.get(&adapter_name(layer, proj, 'B'))?;
        Some((a, b))
    }
}

/// Base weights with every adapter folded in: `W + scaling · B·A`.
pub fn merge_lora(params: &Params, config: &Qwen3Config, adapters: &Adapters) -> Result<Params, ModelError> {
    let mut merged = params.clone();
    let scale = adapters.config.scaling();
    for layer in 0..config.num_hidden_layers {
        for proj in Proj::ALL {
            let Some((a, b)) = adapters.pair(layer, proj) else { continue };
            let name = base_weight_name(layer, proj);
            let w = merged.get(&name).ok_or_else(|| ModelError::MissingParam(name.clone()))?;
            let delta = (b.to_dtype(DType::F64)?.matmul(&a.to_dtype(DType::F64)?)? * scale)?;
            let updated = (w.to_dtype(DType::F64)? + delta)?.to_dtype(w.dtype())?;
            merged.insert(name, updated);
        }
    }
    Ok(merged)
}
