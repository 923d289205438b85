//! RMSNorm over the last dimension, `y = x · rstd · w` with `rstd = 1/√(mean(x²) + eps)`.
//! Qwen3 applies it to the residual stream and, per head, to q and k.

use candle_core::{D, Result, Tensor};

/// Returns `y` and `rstd` (`[.., 1]`), the one statistic the backward needs besides `x`.
pub fn forward(x: &Tensor, w: &Tensor, eps: f64) -> Result<(Tensor, Tensor)> {
    let rstd = x.sqr()?.mean_keepdim(D::Minus1)?.affine(1.0, eps)?.sqrt()?.recip()?;
    let y = x.broadcast_mul(&rstd)?.broadcast_mul(w)?;
    Ok((y, rstd))
}

/// `dx = rstd·(g − x̂·mean(g·x̂))` with `g = dy·w`, `x̂ = x·rstd`; `dw = Σ dy·x̂` over all rows.
pub fn backward(dy: &Tensor, x: &Tensor, w: &Tensor, rstd: &Tensor, want_dw: bool) -> Result<(Tensor, Option<Tensor>)> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gradcheck::{check, random};
    use candle_core::Device;

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
