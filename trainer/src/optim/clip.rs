//! Gradient clipping by global L2 norm, as `torch.nn.utils.clip_grad_norm_` does it.

use std::collections::BTreeMap;

use candle_core::{DType, Tensor};

use super::OptimError;
use super::adamw::to_f32_vec;

/// The L2 norm of all gradients together: sqrt of the sum of the per-tensor norms squared.
/// Accumulated in f64 in key order, so it is deterministic and at least as exact as torch's f32.
/// Gradients on a GPU are squared and summed there (f32 products, f64 sums; candle's reduction
/// has a fixed order), with one transfer of the per-tensor sums at the end.
pub fn global_grad_norm(grads: &BTreeMap<String, Tensor>) -> Result<f64, OptimError> {
    Ok(norm_of_sums(grad_sq_sums(grads)?))
}

/// Each gradient's sum of squares, in key order: the parts of [`global_grad_norm`]. A run that
/// shards its gradients computes the parts of the tensors it holds and adds everyone's in key
/// order with [`norm_of_sums`], which gives the same norm as one process holding them all.
pub fn grad_sq_sums(grads: &BTreeMap<String, Tensor>) -> Result<Vec<f64>, OptimError> {
    // The GPU's gradients by one kernel each and one copy back, the rest on the host; both add
    // squares in f64.
    Ok(mindxtrain_kernels::reduce::sum_squares(&grads.values().collect::<Vec<_>>())?)
}

/// The norm of per-tensor sums of squares, added in the order given.
pub fn norm_of_sums(sums: impl IntoIterator<Item = f64>) -> f64 {
    let mut total = 0.0f64;
    for s in sums {
        total += s;
    }
    total.sqrt()
}

/// Scales every gradient by `min(1, max_norm / (norm + 1e-6))` and returns the norm before
/// clipping, like `clip_grad_norm_`. `max_norm <= 0` means no clipping (the recipe's
/// `grad_clip: 0`); the norm is still returned. A non-finite norm is returned as is and the
/// gradients are left untouched: the caller decides whether to skip the step.
pub fn clip_grad_norm(grads: &mut BTreeMap<String, Tensor>, max_norm: f64) -> Result<f64, OptimError> {
    let norm = global_grad_norm(grads)?;
    clip_to_norm(grads, norm, max_norm)?;
    Ok(norm)
}

/// The scaling of [`clip_grad_norm`] for a norm already known (a sharded run's, taken over the
/// gradients of every rank): applied to the gradients given.
pub fn clip_to_norm(grads: &mut BTreeMap<String, Tensor>, norm: f64, max_norm: f64) -> Result<(), OptimError> {
    if max_norm <= 0.0 || !norm.is_finite() {
        return Ok(());
    }
    // torch: clip_coef = max_norm / (total_norm + 1e-6), clamped to 1, in float32 tensors.
    let coef = (max_norm as f32) / (norm as f32 + 1e-6f32);
    if coef >= 1.0 {
        return Ok(()); // torch multiplies by exactly 1.0: no change
    }
    for g in grads.values_mut() {
        *g = if g.device().is_cuda() {
            // One f32 multiply per element, as below, without leaving the device.
            (g.to_dtype(DType::F32)? * f64::from(coef))?.to_dtype(g.dtype())?
        } else {
            let scaled: Vec<f32> = to_f32_vec(g)?.into_iter().map(|x| x * coef).collect();
            Tensor::from_vec(scaled, g.dims(), g.device())?.to_dtype(g.dtype())?
        };
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use candle_core::Device;

    use super::*;

    fn grads(parts: &[(&str, &[f32])]) -> BTreeMap<String, Tensor> {
        parts.iter().map(|(n, v)| (n.to_string(), Tensor::from_slice(v, v.len(), &Device::Cpu).unwrap())).collect()
    }

    #[test]
    fn norm_spans_all_tensors() {
        // 3-4-5 across two tensors, plus 12 in a third: sqrt(9 + 16 + 144) = 13.
        let g = grads(&[("a", &[3.0]), ("b", &[4.0, 0.0]), ("c", &[-12.0])]);
        assert_eq!(global_grad_norm(&g).unwrap(), 13.0);
    }

    #[test]
    fn clips_to_max_norm_and_returns_pre_clip_norm() {
        let mut g = grads(&[("a", &[3.0]), ("b", &[4.0])]);
        let norm = clip_grad_norm(&mut g, 1.0).unwrap();
        assert_eq!(norm, 5.0);
        let coef = 1.0f32 / (5.0 + 1e-6);
        assert_eq!(to_f32_vec(&g["a"]).unwrap(), [3.0 * coef]);
        assert_eq!(to_f32_vec(&g["b"]).unwrap(), [4.0 * coef]);
        assert!((global_grad_norm(&g).unwrap() - 1.0).abs() < 1e-6);
    }

    #[test]
    fn small_gradients_and_disabled_clipping_are_untouched() {
        let mut g = grads(&[("a", &[0.3]), ("b", &[0.4])]);
        assert!((clip_grad_norm(&mut g, 1.0).unwrap() - 0.5).abs() < 1e-7);
        assert_eq!(to_f32_vec(&g["a"]).unwrap(), [0.3]);
        let mut big = grads(&[("a", &[30.0])]);
        assert_eq!(clip_grad_norm(&mut big, 0.0).unwrap(), 30.0);
        assert_eq!(to_f32_vec(&big["a"]).unwrap(), [30.0]);
    }

    #[test]
    fn non_finite_norm_is_reported_not_applied() {
        let mut g = grads(&[("a", &[f32::INFINITY, 1.0])]);
        assert!(clip_grad_norm(&mut g, 1.0).unwrap().is_infinite());
        assert_eq!(to_f32_vec(&g["a"]).unwrap()[1], 1.0);
    }
}
