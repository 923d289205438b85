//! L2 normalisation over the last dimension, transformers' (and FLA's) `l2norm`:
//! `y = x / √(Σx² + eps)`. Gated DeltaNet applies it per head to q and k, in f32, with
//! eps = 1e-6, before the delta rule (`use_qk_l2norm_in_kernel=True`).
//!
//! It is RMSNorm with a constant gain: `√(Σx² + eps) = √d·√(mean(x²) + eps/d)`, so
//! `y = rmsnorm(x, gain 1/√d, eps/d)`, and the fused RMSNorm kernels run it each way.

use crate::rmsnorm;
use candle_core::{D, Result, Tensor};

/// Returns `y` and RMSNorm's `rstd` (`[.., 1]`, `√d / √(Σx² + eps)`), which the backward needs
/// with `x`.
pub fn forward(x: &Tensor, eps: f64) -> Result<(Tensor, Tensor)> {
    let d = x.dim(D::Minus1)?;
    rmsnorm::forward(x, &gain(x)?, eps / d as f64)
}

/// `dx = (dy − y·⟨dy, y⟩)/√(Σx² + eps)`, exactly, whatever `eps`.
pub fn backward(dy: &Tensor, x: &Tensor, rstd: &Tensor) -> Result<Tensor> {
    if dy.dims() != x.dims() {
        candle_core::bail!("l2norm: gradient of shape {:?} for input {:?}", dy.dims(), x.dims());
    }
    Ok(rmsnorm::backward(dy, x, &gain(x)?, rstd, false)?.0)
}

fn gain(x: &Tensor) -> Result<Tensor> {
    let d = x.dim(D::Minus1)?;
    Tensor::full(1.0 / (d as f64).sqrt(), d, x.device())?.to_dtype(x.dtype())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gradcheck::{assert_close, check, fresh_seed, random};
    use candle_core::{DType, Device};

    #[test]
    fn matches_the_definition_in_f64_and_f32() -> Result<()> {
        let seed = fresh_seed();
        // Rows of a head's d_k, and rows so short that eps moves them off unit length.
        let x = random(&[4, 9, 16], seed, &Device::Cpu)?;
        let x = Tensor::cat(&[&x, &(x.narrow(0, 0, 1)? * 1e-4)?], 0)?;
        let want = x.broadcast_div(&(x.sqr()?.sum_keepdim(D::Minus1)? + 1e-6)?.sqrt()?)?;
        for (dtype, tol) in [(DType::F64, 1e-12), (DType::F32, 1e-6)] {
            let (y, _) = forward(&x.to_dtype(dtype)?, 1e-6)?;
            assert_close(&y, &want, tol)
                .map_err(|e| candle_core::Error::Msg(format!("{dtype:?} (seed {seed}): {e}")))?;
        }
        let (y, _) = forward(&x, 0.0)?;
        for norm in y.sqr()?.sum(D::Minus1)?.flatten_all()?.to_vec1::<f64>()? {
            assert!((norm - 1.0).abs() < 1e-12, "seed {seed}: |y|² = {norm}");
        }
        Ok(())
    }

    #[test]
    fn gradients_match_finite_differences() -> Result<()> {
        let seed = fresh_seed();
        let (x, dy) = (random(&[2, 3, 4], seed, &Device::Cpu)?, random(&[2, 3, 4], seed ^ 1, &Device::Cpu)?);
        let (_, rstd) = forward(&x, 1e-6)?;
        let dx = backward(&dy, &x, &rstd)?;
        assert!(backward(&dy.narrow(2, 0, 3)?, &x, &rstd).is_err());
        check(|t: &[Tensor]| Ok(forward(&t[0], 1e-6)?.0), &[x], &dy, &[dx])
            .map_err(|e| candle_core::Error::Msg(format!("seed {seed}: {e}")))
    }
}
