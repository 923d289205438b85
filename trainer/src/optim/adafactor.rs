//! Adafactor (Shazeer & Stern 2018), step for step `transformers.optimization.Adafactor(lr,
//! eps=(eps, 1e-3), clip_threshold=1.0, decay_rate=-0.8, beta1, weight_decay,
//! scale_parameter=False, relative_step=False, warmup_init=False)`, in f32:
//!
//! ```text
//! β2t = 1 − t^−0.8
//! u = g² + eps
//! rank ≥ 2 (factored over the last two dimensions):
//!     row = β2t · row + (1 − β2t) · mean(u, −1);  col = β2t · col + (1 − β2t) · mean(u, −2)
//!     d = g · rsqrt(row / mean(row, −1))[…, :, None] · rsqrt(col)[…, None, :]
//! rank < 2:
//!     v = β2t · v + (1 − β2t) · u;  d = g · rsqrt(v)
//! d = lr · d / max(rms(d) / 1.0, 1)
//! β1 > 0:  m = β1 · m + (1 − β1) · d;  d = m
//! p = p − lr · weight_decay · p − d             (weight decay on parameters that decay)
//! ```
//!
//! With `scale_parameter=False` and `relative_step=False` the step size is the schedule's `lr`
//! and the second `eps` (1e-3) is never read. Recipe fields: `lr`, `betas[0]` as β1 (0: no
//! first moment, transformers' `beta1=None`), `eps` (added to g²) and `weight_decay`; not
//! `betas[1]` (the second-moment decay is `1 − t^−0.8`).

use candle_core::{D, DType, Tensor};

use super::OptimError;
use super::stateful::{Stateful, UpdateRule};
use crate::recipe::Optimizer as OptimizerRecipe;

/// transformers' `clip_threshold`: the largest root-mean-square an update may have.
const CLIP_THRESHOLD: f64 = 1.0;
/// transformers' `decay_rate`: β2 at update t is `1 − t^decay_rate`.
const DECAY_RATE: f64 = -0.8;

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdafactorConfig {
    /// The first moment's decay; `None` keeps no first moment.
    pub beta1: Option<f64>,
    /// Added to the squared gradient (transformers' `eps[0]`).
    pub eps: f64,
    pub weight_decay: f64,
}

impl AdafactorConfig {
    pub fn from_recipe(optimizer: &OptimizerRecipe) -> Self {
        let beta1 = Some(optimizer.betas[0]).filter(|b| *b != 0.0);
        AdafactorConfig { beta1, eps: optimizer.eps, weight_decay: optimizer.weight_decay }
    }
}

/// Adafactor: a [`Stateful`] optimizer with, per parameter, `exp_avg` (with β1), and
/// `exp_avg_sq_row` + `exp_avg_sq_col` (rank ≥ 2) or `exp_avg_sq` (rank < 2).
pub type Adafactor = Stateful<AdafactorConfig>;

/// Whether a parameter of this shape keeps factored second moments (transformers'
/// `len(shape) >= 2`).
fn factored(dims: &[usize]) -> bool {
    dims.len() >= 2
}

impl UpdateRule for AdafactorConfig {
    fn buffers(&self, dims: &[usize]) -> Vec<(&'static str, Vec<usize>)> {
        let mut out = Vec::with_capacity(3);
        if self.beta1.is_some() {
            out.push(("exp_avg", dims.to_vec()));
        }
        if factored(dims) {
            let (rows, last) = dims.split_at(dims.len() - 1);
            let mut cols = dims[..dims.len() - 2].to_vec();
            cols.extend_from_slice(last);
            out.push(("exp_avg_sq_row", rows.to_vec()));
            out.push(("exp_avg_sq_col", cols));
        } else {
            out.push(("exp_avg_sq", dims.to_vec()));
        }
        out
    }

    fn update(
        &self,
        step: u64,
        lr: f64,
        decays: bool,
        p: &Tensor,
        g: &Tensor,
        buffers: &mut [Tensor],
    ) -> Result<Tensor, OptimError> {
        let (exp_avg, second) = match (self.beta1, buffers) {
            (Some(_), [m, rest @ ..]) => (Some(m), rest),
            (None, rest) => (None, rest),
            (Some(_), []) => return Err(OptimError::State("Adafactor with beta1 keeps exp_avg".into())),
        };
        let g = g.to_dtype(DType::F32)?;
        let beta2t = 1.0 - (step as f64).powf(DECAY_RATE);
        // (grad**2) + eps[0]
        let squared = (g.sqr()? + self.eps)?;
        // ema.mul_(beta2t).add_(x, alpha=1.0 - beta2t)
        let decay_into = |ema: &mut Tensor, x: &Tensor| -> Result<(), OptimError> {
            *ema = ((&*ema * beta2t)? + (x * (1.0 - beta2t))?)?;
            Ok(())
        };
        let mut update = match second {
            [row, col] if factored(p.dims()) => {
                decay_into(row, &mean(&squared, D::Minus1)?)?;
                decay_into(col, &mean(&squared, D::Minus2)?)?;
                // _approx_sq_grad: rsqrt(row / row.mean(-1, keepdim)) ⊗ rsqrt(col), times grad.
                let r_factor = rsqrt(&row.broadcast_div(&mean_keepdim(row, D::Minus1)?)?)?.unsqueeze(D::Minus1)?;
                let c_factor = rsqrt(&col.unsqueeze(D::Minus2)?)?;
                r_factor.broadcast_mul(&c_factor)?.mul(&g)?
            }
            [exp_avg_sq] if !factored(p.dims()) => {
                decay_into(exp_avg_sq, &squared)?;
                rsqrt(exp_avg_sq)?.mul(&g)?
            }
            other => {
                return Err(OptimError::State(format!(
                    "Adafactor keeps {} second-moment buffer(s) for shape {:?}, got {}",
                    if factored(p.dims()) { 2 } else { 1 },
                    p.dims(),
                    other.len()
                )));
            }
        };
        // update.div_((self._rms(update) / clip_threshold).clamp_(min=1.0)); update.mul_(lr)
        let clip = div_scalar(&rms(&update)?, CLIP_THRESHOLD)?.maximum(1.0)?;
        update = (update.broadcast_div(&clip)? * lr)?;
        if let (Some(beta1), Some(m)) = (self.beta1, exp_avg) {
            // exp_avg.mul_(beta1).add_(update, alpha=1 - beta1); update = exp_avg
            *m = ((&*m * beta1)? + (update * (1.0 - beta1))?)?;
            update = m.clone();
        }
        let mut value = p.to_dtype(DType::F32)?;
        if decays && self.weight_decay != 0.0 {
            // p.add_(p, alpha=-weight_decay * lr)
            value = (&value + (&value * (-self.weight_decay * lr))?)?;
        }
        // p.add_(-update)
        Ok((value - update)?.to_dtype(p.dtype())?)
    }
}

/// `1 / sqrt(x)`, as torch's `rsqrt` computes it on the host.
fn rsqrt(x: &Tensor) -> candle_core::Result<Tensor> {
    x.sqrt()?.recip()
}

/// `x / s` for an f32 `x` (a true division, as torch divides by a Python number, not a
/// multiplication by `1 / s`).
fn div_scalar(x: &Tensor, s: f64) -> candle_core::Result<Tensor> {
    x.broadcast_div(&Tensor::new(s as f32, x.device())?)
}

/// torch's `mean(dim, keepdim=True)`: the sum, divided by the count.
fn mean_keepdim(x: &Tensor, dim: D) -> candle_core::Result<Tensor> {
    let n = x.dim(dim)?;
    div_scalar(&x.sum_keepdim(dim)?, n as f64)
}

/// torch's `mean(dim)`.
fn mean(x: &Tensor, dim: D) -> candle_core::Result<Tensor> {
    mean_keepdim(x, dim)?.squeeze(dim)
}

/// transformers' `_rms`: `x.norm(2) / numel ** 0.5`, as a scalar tensor on `x`'s device.
fn rms(x: &Tensor) -> candle_core::Result<Tensor> {
    div_scalar(&x.sqr()?.sum_all()?.sqrt()?, (x.elem_count() as f64).sqrt())
}

#[cfg(test)]
mod tests;
