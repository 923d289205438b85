//! AdamW with decoupled weight decay, step for step the arithmetic of `torch.optim.AdamW`
//! (the single-tensor path PyTorch takes on CPU), in f32 like a float32 parameter there.
//!
//! Weight decay rule: only parameters of rank >= 2 (projection matrices, embeddings,
//! `lm_head`, LoRA A/B) decay; rank-0/1 parameters (RMSNorm gains, biases) do not. This is
//! what HF `Trainer` does through `get_decay_parameter_names` (it excludes norms and biases
//! by name); bare `torch.optim.AdamW` decays every parameter it is given, which equals this
//! rule whenever only matrices are trained, as in LoRA.

use std::collections::BTreeMap;

use candle_core::{DType, Device, Tensor};

use mindxtrain_kernels::adamw::Coefficients;

use super::OptimError;
use crate::recipe::Optimizer;

/// Hyperparameters other than the learning rate, which comes from the schedule per step.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdamWConfig {
    pub betas: [f64; 2],
    pub eps: f64,
    pub weight_decay: f64,
}

impl AdamWConfig {
    pub fn from_recipe(optimizer: &Optimizer) -> Self {
        AdamWConfig { betas: optimizer.betas, eps: optimizer.eps, weight_decay: optimizer.weight_decay }
    }
}

/// Whether weight decay applies to a parameter of this shape (see the module doc).
pub fn decays(shape: &[usize]) -> bool {
    shape.len() >= 2
}

const STEP_KEY: &str = "step";
const EXP_AVG: &str = "exp_avg.";
const EXP_AVG_SQ: &str = "exp_avg_sq.";

/// AdamW state: the number of updates taken and, per parameter, the first and second moments.
#[derive(Debug, Clone)]
pub struct AdamW {
    config: AdamWConfig,
    step: u64,
    moments: BTreeMap<String, Moments>,
}

/// A parameter's moments: f32 tensors of its shape, on its device (a CUDA parameter's update is
/// one fused kernel over device memory; nothing crosses to the host).
#[derive(Debug, Clone)]
struct Moments {
    exp_avg: Tensor,
    exp_avg_sq: Tensor,
}

impl PartialEq for AdamW {
    /// Same configuration, step and moment values (wherever the moments live).
    fn eq(&self, other: &Self) -> bool {
        let values = |m: &Moments| Ok::<_, candle_core::Error>((to_f32_vec(&m.exp_avg)?, to_f32_vec(&m.exp_avg_sq)?));
        self.config == other.config
            && self.step == other.step
            && self.moments.len() == other.moments.len()
            && self.moments.iter().zip(&other.moments).all(|((a, ma), (b, mb))| {
                a == b && ma.exp_avg.dims() == mb.exp_avg.dims() && values(ma).ok() == values(mb).ok()
            })
    }
}

impl AdamW {
    pub fn new(config: AdamWConfig) -> Self {
        AdamW { config, step: 0, moments: BTreeMap::new() }
    }

    pub fn config(&self) -> &AdamWConfig {
        &self.config
    }

    /// Updates taken so far (torch's `state["step"]`).
    pub fn step_count(&self) -> u64 {
        self.step
    }

    /// One update of every parameter in `params` with learning rate `lr`. Each parameter needs a
    /// gradient of its shape; a gradient without a parameter is an error too (a name mismatch
    /// would otherwise silently freeze a weight). Parameters keep their dtype and device; the
    /// arithmetic is f32.
    pub fn step(
        &mut self,
        params: &mut BTreeMap<String, Tensor>,
        grads: &BTreeMap<String, Tensor>,
        lr: f64,
    ) -> Result<(), OptimError> {
        if let Some(name) = grads.keys().find(|n| !params.contains_key(*n)) {
            return Err(OptimError::State(format!("gradient `{name}` has no parameter")));
        }
        for (name, p) in params.iter() {
            let g = grads.get(name).ok_or_else(|| OptimError::MissingGrad(name.clone()))?;
            if g.dims() != p.dims() {
                return Err(OptimError::ShapeMismatch {
                    name: name.clone(),
                    param: p.dims().to_vec(),
                    grad: g.dims().to_vec(),
                });
            }
            if let Some(m) = self.moments.get(name)
                && m.exp_avg.dims() != p.dims()
            {
                return Err(OptimError::State(format!(
                    "moments of `{name}` have shape {:?}, parameter has {:?}",
                    m.exp_avg.dims(),
                    p.dims()
                )));
            }
        }

        self.step += 1;
        let c = &self.config;
        let k = Coefficients::new(c.betas, c.eps, c.weight_decay, lr, self.step);
        for (name, p) in params.iter_mut() {
            let m = match self.moments.remove(name) {
                // Moments restored from a checkpoint are on the host: they move to the
                // parameter's device once.
                Some(m) if m.exp_avg.device().same_device(p.device()) => m,
                Some(m) => Moments {
                    exp_avg: m.exp_avg.to_device(p.device())?,
                    exp_avg_sq: m.exp_avg_sq.to_device(p.device())?,
                },
                None => {
                    let zeros = Tensor::zeros(p.dims(), DType::F32, p.device())?;
                    Moments { exp_avg: zeros.clone(), exp_avg_sq: zeros }
                }
            };
            let decay = self.config.weight_decay != 0.0 && decays(p.dims());
            let (value, exp_avg, exp_avg_sq) =
                mindxtrain_kernels::adamw::step(&k, decay, p, &grads[name], &m.exp_avg, &m.exp_avg_sq)?;
            *p = value;
            self.moments.insert(name.clone(), Moments { exp_avg, exp_avg_sq });
        }
        Ok(())
    }

    /// The state as tensors for a checkpoint: `step` (i64 scalar) and per parameter
    /// `exp_avg.{name}` / `exp_avg_sq.{name}` (f32, the parameter's shape).
    pub fn state_tensors(&self) -> Result<BTreeMap<String, Tensor>, OptimError> {
        let mut out = BTreeMap::new();
        let step = i64::try_from(self.step).map_err(|_| OptimError::State("step overflows i64".into()))?;
        out.insert(STEP_KEY.to_string(), Tensor::new(step, &Device::Cpu)?);
        for (name, m) in &self.moments {
            out.insert(format!("{EXP_AVG}{name}"), m.exp_avg.to_device(&Device::Cpu)?);
            out.insert(format!("{EXP_AVG_SQ}{name}"), m.exp_avg_sq.to_device(&Device::Cpu)?);
        }
        Ok(out)
    }

    /// Rebuilds the optimizer from [`AdamW::state_tensors`] output.
    pub fn from_state_tensors(config: AdamWConfig, state: &BTreeMap<String, Tensor>) -> Result<Self, OptimError> {
        let step_t = state.get(STEP_KEY).ok_or_else(|| OptimError::State("missing `step`".into()))?;
        let step = step_t.to_dtype(DType::I64)?.flatten_all()?.to_vec1::<i64>()?;
        let step = match step.as_slice() {
            [s] if *s >= 0 => *s as u64,
            other => return Err(OptimError::State(format!("`step` must be one non-negative integer, got {other:?}"))),
        };
        let mut moments = BTreeMap::new();
        for (key, t) in state {
            if key == STEP_KEY {
                continue;
            }
            let Some(name) = key.strip_prefix(EXP_AVG_SQ) else {
                if key.strip_prefix(EXP_AVG).is_none() {
                    return Err(OptimError::State(format!("unexpected tensor `{key}`")));
                }
                continue;
            };
            let avg = state
                .get(&format!("{EXP_AVG}{name}"))
                .ok_or_else(|| OptimError::State(format!("`{key}` without `{EXP_AVG}{name}`")))?;
            if avg.dims() != t.dims() {
                return Err(OptimError::State(format!(
                    "moments of `{name}` disagree in shape: {:?} vs {:?}",
                    avg.dims(),
                    t.dims()
                )));
            }
            moments.insert(
                name.to_string(),
                Moments { exp_avg: avg.to_dtype(DType::F32)?, exp_avg_sq: t.to_dtype(DType::F32)? },
            );
        }
        for key in state.keys() {
            if let Some(name) = key.strip_prefix(EXP_AVG)
                && !moments.contains_key(name)
            {
                return Err(OptimError::State(format!("`{key}` without `{EXP_AVG_SQ}{name}`")));
            }
        }
        Ok(AdamW { config, step, moments })
    }
}

pub(super) fn to_f32_vec(t: &Tensor) -> Result<Vec<f32>, candle_core::Error> {
    t.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()
}

#[cfg(test)]
mod tests;
