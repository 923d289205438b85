//! AdamW with decoupled weight decay, step for step the arithmetic of `torch.optim.AdamW`
//! (the single-tensor path PyTorch takes on CPU), in f32 like a float32 parameter there.
//!
//! Weight decay rule: only parameters of rank >= 2 (projection matrices, embeddings,
//! `lm_head`, LoRA A/B) decay; rank-0/1 parameters (RMSNorm gains, biases) do not. This is
//! what HF `Trainer` does through `get_decay_parameter_names` (it excludes norms and biases
//! by name); bare `torch.optim.AdamW` decays every parameter it is given, which equals this
//! rule whenever only matrices are trained, as in LoRA. SGD, Lion and Adafactor here follow the
//! same rule.

use candle_core::{DType, Tensor};

use mindxtrain_kernels::adamw::Coefficients;

use super::OptimError;
use super::stateful::{Stateful, UpdateRule};
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

/// AdamW: a [`Stateful`] optimizer with the moments `exp_avg` and `exp_avg_sq` per parameter.
pub type AdamW = Stateful<AdamWConfig>;

impl UpdateRule for AdamWConfig {
    /// Both moments have the parameter's shape.
    fn buffers(&self, dims: &[usize]) -> Vec<(&'static str, Vec<usize>)> {
        vec![("exp_avg", dims.to_vec()), ("exp_avg_sq", dims.to_vec())]
    }

    /// The fused kernel: one pass over device memory on a GPU, torch's arithmetic on the host.
    fn update(
        &self,
        step: u64,
        lr: f64,
        decays: bool,
        p: &Tensor,
        g: &Tensor,
        buffers: &mut [Tensor],
    ) -> Result<Tensor, OptimError> {
        let [exp_avg, exp_avg_sq] = buffers else {
            return Err(OptimError::State(format!("AdamW keeps 2 moments, got {}", buffers.len())));
        };
        let k = Coefficients::new(self.betas, self.eps, self.weight_decay, lr, step);
        let decay = self.weight_decay != 0.0 && decays;
        let (value, m, v) = mindxtrain_kernels::adamw::step(&k, decay, p, g, exp_avg, exp_avg_sq)?;
        (*exp_avg, *exp_avg_sq) = (m, v);
        Ok(value)
    }
}

pub(super) fn to_f32_vec(t: &Tensor) -> Result<Vec<f32>, candle_core::Error> {
    t.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()
}

#[cfg(test)]
mod tests;
