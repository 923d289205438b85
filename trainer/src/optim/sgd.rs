//! SGD with momentum, step for step `torch.optim.SGD(lr, momentum, dampening=0,
//! nesterov=False, weight_decay)` (the single-tensor path PyTorch takes on CPU), in f32:
//!
//! ```text
//! d = g + weight_decay · p          (parameters that decay, see `optim::decays`)
//! buf = momentum · buf + d;  d = buf (momentum > 0; torch's first buf is d itself, which is
//!                                     what momentum · 0 + d gives)
//! p = p − lr · d
//! ```
//!
//! Recipe fields: `lr` (the schedule's), `betas[0]` as the momentum (0: no buffer is kept) and
//! `weight_decay`; not `betas[1]` nor `eps`.

use candle_core::{DType, Tensor};

use super::OptimError;
use super::stateful::{Stateful, UpdateRule};
use crate::recipe::Optimizer as OptimizerRecipe;

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SgdConfig {
    pub momentum: f64,
    pub weight_decay: f64,
}

impl SgdConfig {
    pub fn from_recipe(optimizer: &OptimizerRecipe) -> Self {
        SgdConfig { momentum: optimizer.betas[0], weight_decay: optimizer.weight_decay }
    }
}

/// SGD: a [`Stateful`] optimizer with torch's `momentum_buffer` per parameter (none without
/// momentum).
pub type Sgd = Stateful<SgdConfig>;

impl UpdateRule for SgdConfig {
    fn buffers(&self, dims: &[usize]) -> Vec<(&'static str, Vec<usize>)> {
        if self.momentum == 0.0 { Vec::new() } else { vec![("momentum_buffer", dims.to_vec())] }
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
        let value = p.to_dtype(DType::F32)?;
        let mut d = g.to_dtype(DType::F32)?;
        if decays && self.weight_decay != 0.0 {
            // grad.add(param, alpha=weight_decay)
            d = (d + (&value * self.weight_decay)?)?;
        }
        match buffers {
            [] => {}
            [buf] => {
                // buf.mul_(momentum).add_(grad, alpha=1 - dampening)
                *buf = ((&*buf * self.momentum)? + d)?;
                d = buf.clone();
            }
            other => return Err(OptimError::State(format!("SGD keeps at most 1 buffer, got {}", other.len()))),
        }
        // param.add_(grad, alpha=-lr)
        Ok((value + (d * -lr)?)?.to_dtype(p.dtype())?)
    }
}

#[cfg(test)]
mod tests;
