//! Lion (Chen et al. 2023, "Symbolic Discovery of Optimization Algorithms"), step for step the
//! update of lion-pytorch, in f32:
//!
//! ```text
//! p = p · (1 − lr · weight_decay)              (parameters that decay, see `optim::decays`)
//! p = p − lr · sign(β1 · m + (1 − β1) · g)
//! m = β2 · m + (1 − β2) · g
//! ```
//!
//! Recipe fields: `lr` (the schedule's), `betas` (β1 interpolates the update's direction, β2
//! the momentum) and `weight_decay`; not `eps` (the sign needs none).

use candle_core::{DType, Tensor};

use super::OptimError;
use super::stateful::{Stateful, UpdateRule};
use crate::recipe::Optimizer as OptimizerRecipe;

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LionConfig {
    pub betas: [f64; 2],
    pub weight_decay: f64,
}

impl LionConfig {
    pub fn from_recipe(optimizer: &OptimizerRecipe) -> Self {
        LionConfig { betas: optimizer.betas, weight_decay: optimizer.weight_decay }
    }
}

/// Lion: a [`Stateful`] optimizer with the momentum `exp_avg` per parameter.
pub type Lion = Stateful<LionConfig>;

impl UpdateRule for LionConfig {
    fn buffers(&self, dims: &[usize]) -> Vec<(&'static str, Vec<usize>)> {
        vec![("exp_avg", dims.to_vec())]
    }

    fn update(
        &self,
        _step: u64,
        lr: f64,
        decays: bool,
        p: &Tensor,
        g: &Tensor,
        buffers: &mut [Tensor],
    ) -> Result<Tensor, OptimError> {
        let [exp_avg] = buffers else {
            return Err(OptimError::State(format!("Lion keeps 1 buffer, got {}", buffers.len())));
        };
        let [beta1, beta2] = self.betas;
        let g = g.to_dtype(DType::F32)?;
        let mut value = p.to_dtype(DType::F32)?;
        if decays && self.weight_decay != 0.0 {
            // p.data.mul_(1. - lr * wd)
            value = (value * (1.0 - lr * self.weight_decay))?;
        }
        // exp_avg.clone().mul_(beta1).add(grad, alpha=1. - beta1).sign_()
        let direction = ((&*exp_avg * beta1)? + (&g * (1.0 - beta1))?)?.sign()?;
        // p.add_(update, alpha=-lr)
        value = (value + (direction * -lr)?)?;
        // exp_avg.mul_(beta2).add_(grad, alpha=1. - beta2)
        *exp_avg = ((&*exp_avg * beta2)? + (g * (1.0 - beta2))?)?;
        Ok(value.to_dtype(p.dtype())?)
    }
}

#[cfg(test)]
mod tests;
