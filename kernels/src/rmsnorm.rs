//! RMSNorm over the last dimension, `y = x · rstd · w` with `rstd = 1/√(mean(x²) + eps)`.
//! Qwen3 applies it to the residual stream and, per head, to q and k.

use crate::cpu::{self, dispatch};
use crate::on_gpu_or;
use candle_core::{D, Result, Tensor};

/// Returns `y` and `rstd` (`[.., 1]`), the one statistic the backward needs besides `x`.
/// On the GPU `rstd` is f32 whatever `x`'s dtype (one value per row: precision for free).
pub fn forward(x: &Tensor, w: &Tensor, eps: f64) -> Result<(Tensor, Tensor)> {
    let _profile = crate::profile::scope("rmsnorm fwd", x.device());
    check(x, w)?;
    #[cfg(feature = "cuda")]
    use crate::gpu::rmsnorm::forward as gpu;
    use cpu::rmsnorm::forward as fused;
    on_gpu_or!([x, w], gpu(x, w, eps), dispatch!([x, w], fused(x, w, eps), reference::forward(x, w, eps)))
}

/// The residual add fused in front of the norm: `s = a + b`, `(y, rstd) = forward(s)`; returns
/// `(s, y, rstd)`. The backward is [`backward`] on `s` (the add passes its gradient through).
pub fn add_forward(a: &Tensor, b: &Tensor, w: &Tensor, eps: f64) -> Result<(Tensor, Tensor, Tensor)> {
    let _profile = crate::profile::scope("rmsnorm+residual fwd", a.device());
    check(a, w)?;
    if a.dims() != b.dims() {
        candle_core::bail!("rmsnorm: residual of shape {:?} for input {:?}", b.dims(), a.dims());
    }
    #[cfg(feature = "cuda")]
    use crate::gpu::rmsnorm::add_forward as gpu;
    let unfused = || -> Result<(Tensor, Tensor, Tensor)> {
        let s = (a + b)?;
        let (y, rstd) = forward(&s, w, eps)?;
        Ok((s, y, rstd))
    };
    on_gpu_or!([a, b, w], gpu(a, b, w, eps), unfused())
}

/// `dx = rstd·(g − x̂·mean(g·x̂))` with `g = dy·w`, `x̂ = x·rstd`; `dw = Σ dy·x̂` over all rows.
pub fn backward(dy: &Tensor, x: &Tensor, w: &Tensor, rstd: &Tensor, want_dw: bool) -> Result<(Tensor, Option<Tensor>)> {
    let _profile = crate::profile::scope("rmsnorm bwd", x.device());
    check(x, w)?;
    #[cfg(feature = "cuda")]
    use crate::gpu::rmsnorm::backward as gpu;
    use cpu::rmsnorm::backward as fused;
    let cpu_or_reference =
        || dispatch!([dy, x, w, rstd], fused(dy, x, w, rstd, want_dw), reference::backward(dy, x, w, rstd, want_dw));
    on_gpu_or!([dy, x, w], gpu(dy, x, w, rstd, want_dw), cpu_or_reference())
}

fn check(x: &Tensor, w: &Tensor) -> Result<()> {
    let d = x.dim(D::Minus1)?;
    if w.dims() != [d] {
        candle_core::bail!("rmsnorm: gain of shape {:?} for rows of {d}", w.dims());
    }
    Ok(())
}

/// The composed form, on any candle device: the referee of the fused kernel.
pub mod reference {
    use super::*;

    pub fn forward(x: &Tensor, w: &Tensor, eps: f64) -> Result<(Tensor, Tensor)> {
        let rstd = x.sqr()?.mean_keepdim(D::Minus1)?.affine(1.0, eps)?.sqrt()?.recip()?;
        let y = x.broadcast_mul(&rstd)?.broadcast_mul(w)?;
        Ok((y, rstd))
    }

    pub fn backward(
        dy: &Tensor,
        x: &Tensor,
        w: &Tensor,
        rstd: &Tensor,
        want_dw: bool,
    ) -> Result<(Tensor, Option<Tensor>)> {
        let xhat = x.broadcast_mul(rstd)?;
        let g = dy.broadcast_mul(w)?;
        let proj = (&g * &xhat)?.mean_keepdim(D::Minus1)?;
        let dx = g.sub(&xhat.broadcast_mul(&proj)?)?.broadcast_mul(rstd)?;
        let dw = if want_dw {
            let d = w.dim(0)?;
            Some((dy * &xhat)?.reshape(((), d))?.sum(0)?)
        } else {
            None
        };
        Ok((dx, dw))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gradcheck::{assert_close, check, random};
    use candle_core::{DType, Device};

    #[test]
    fn gradients_match_finite_differences() -> Result<()> {
        let dev = Device::Cpu;
        let x = random(&[2, 3, 5], 1, &dev)?;
        let w = random(&[5], 2, &dev)?;
        let dy = random(&[2, 3, 5], 3, &dev)?;
        let (_, rstd) = forward(&x, &w, 1e-6)?;
        let (dx, dw) = backward(&dy, &x, &w, &rstd, true)?;
        check(|t: &[Tensor]| Ok(forward(&t[0], &t[1], 1e-6)?.0), &[x, w], &dy, &[dx, dw.unwrap()])
    }

    #[test]
    fn fused_kernel_matches_the_reference_in_f64_and_f32() -> Result<()> {
        let dev = Device::Cpu;
        // 150 rows: more than two reduction blocks, the last one partial.
        let (x, w, dy) = (random(&[3, 50, 24], 1, &dev)?, random(&[24], 2, &dev)?, random(&[3, 50, 24], 3, &dev)?);
        let (y_ref, r_ref) = reference::forward(&x, &w, 1e-6)?;
        let (dx_ref, dw_ref) = reference::backward(&dy, &x, &w, &r_ref, true)?;
        for (dtype, tol) in [(DType::F64, 1e-12), (DType::F32, 2e-5)] {
            let c = |t: &Tensor| t.to_dtype(dtype);
            let (y, r) = forward(&c(&x)?, &c(&w)?, 1e-6)?;
            assert_close(&y, &y_ref, tol)?;
            assert_close(&r, &r_ref, tol)?;
            let (dx, dw) = backward(&c(&dy)?, &c(&x)?, &c(&w)?, &r, true)?;
            assert_close(&dx, &dx_ref, tol)?;
            assert_close(&dw.unwrap(), dw_ref.as_ref().unwrap(), tol)?;
            assert!(backward(&c(&dy)?, &c(&x)?, &c(&w)?, &r, false)?.1.is_none());
        }
        assert!(forward(&x, &random(&[5], 4, &dev)?, 1e-6).is_err());
        Ok(())
    }

    #[test]
    fn unit_weight_output_has_unit_rms() -> Result<()> {
        let dev = Device::Cpu;
        let x = random(&[4, 8], 5, &dev)?;
        let (y, _) = forward(&x, &Tensor::ones(8, candle_core::DType::F64, &dev)?, 0.0)?;
        for row in y.sqr()?.mean(1)?.to_vec1::<f64>()? {
            assert!((row - 1.0).abs() < 1e-12);
        }
        Ok(())
    }
}
