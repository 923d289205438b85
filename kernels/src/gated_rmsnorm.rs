//! Gated DeltaNet's output norm, transformers' `Qwen3_5RMSNormGated`: over each head's `d_v`
//! values, `y = w · x·rstd · silu(z)` with `rstd = 1/√(mean(x²) + eps)` (eps: the config's
//! `rms_norm_eps`, 1e-6) and `z` the layer's gate projection. The gain is applied as is, ones
//! at init; it is not zero-centred as the model's other norms (`Qwen3_5RMSNorm`, `1 + w`) are.
//!
//! transformers takes the statistics in f32, casts `x·rstd` back to the input dtype, multiplies
//! by `w` there, then by `silu(z)` computed in f32, and casts the product to the input dtype;
//! in f32 (the CPU kernels) every step is f32, and bf16 GPU kernels round once, at the end.
//!
//! Composed of two fused kernels, each dispatching to CPU or GPU: [`rmsnorm`] gives
//! `n = w·x·rstd`, then SwiGLU's gate with `z` as the gate gives `silu(z)·n`.

use crate::{rmsnorm, swiglu};
use candle_core::{Result, Tensor};

/// `x`, `z`: `[.., d_v]`, `w`: `[d_v]`. Returns `y` and `rstd` (`[.., 1]`); the backward needs
/// them with `x`, `z` and `w`, which the caller keeps.
pub fn forward(x: &Tensor, z: &Tensor, w: &Tensor, eps: f64) -> Result<(Tensor, Tensor)> {
    check(x, z)?;
    let (n, rstd) = rmsnorm::forward(x, w, eps)?;
    Ok((swiglu::forward(z, &n)?, rstd))
}

/// `(dx, dz, dw)`, `dw` when `want_dw` (a frozen gain skips its reduction). `n = w·x·rstd` is
/// recomputed, one elementwise pass, rather than kept beside `y` through the step.
pub fn backward(
    dy: &Tensor,
    x: &Tensor,
    z: &Tensor,
    w: &Tensor,
    rstd: &Tensor,
    want_dw: bool,
) -> Result<(Tensor, Tensor, Option<Tensor>)> {
    check(x, z)?;
    // In the statistic's dtype (f32 on the GPU whatever x's), rounded once to x's, as the
    // forward's kernel rounds its product.
    let wide = rstd.dtype();
    let n = x.to_dtype(wide)?.broadcast_mul(rstd)?.broadcast_mul(&w.to_dtype(wide)?)?.to_dtype(x.dtype())?;
    let (dz, dn) = swiglu::backward(dy, z, &n)?;
    let (dx, dw) = rmsnorm::backward(&dn, x, w, rstd, want_dw)?;
    Ok((dx, dz, dw))
}

fn check(x: &Tensor, z: &Tensor) -> Result<()> {
    if x.dims() != z.dims() {
        candle_core::bail!("gated rmsnorm: gate of shape {:?} for input {:?}", z.dims(), x.dims());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gradcheck::{assert_close, check, fresh_seed, random};
    use candle_core::{D, DType, Device};

    /// The definition, written out in f64.
    fn by_definition(x: &Tensor, z: &Tensor, w: &Tensor, eps: f64) -> Result<Tensor> {
        let rstd = (x.sqr()?.mean_keepdim(D::Minus1)? + eps)?.sqrt()?.recip()?;
        let silu = (z / (z.neg()?.exp()? + 1.0)?)?;
        x.broadcast_mul(&rstd)?.broadcast_mul(w)? * silu
    }

    fn inputs(shape: &[usize]) -> Result<(u64, [Tensor; 4])> {
        let seed = fresh_seed();
        let r = |s: &[usize], i: u64| random(s, seed.wrapping_add(i), &Device::Cpu);
        let d = shape[shape.len() - 1];
        Ok((seed, [r(shape, 0)?, (r(shape, 1)? * 4.0)?, r(&[d], 2)?, r(shape, 3)?]))
    }

    #[test]
    fn matches_the_definition_in_f64_and_f32() -> Result<()> {
        // Rows of one head's d_v; small rows too, where eps matters.
        let (seed, [x, z, w, _]) = inputs(&[3, 70, 12])?;
        let x = Tensor::cat(&[&x, &(x.narrow(0, 0, 1)? * 1e-3)?], 0)?;
        let z = Tensor::cat(&[&z, &z.narrow(0, 0, 1)?], 0)?;
        let want = by_definition(&x, &z, &w, 1e-6)?;
        for (dtype, tol) in [(DType::F64, 1e-12), (DType::F32, 1e-5)] {
            let c = |t: &Tensor| t.to_dtype(dtype);
            let (y, _) = forward(&c(&x)?, &c(&z)?, &c(&w)?, 1e-6)?;
            assert_close(&y, &want, tol)
                .map_err(|e| candle_core::Error::Msg(format!("{dtype:?} (seed {seed}): {e}")))?;
        }
        assert!(forward(&x, &z.narrow(1, 0, 69)?, &w, 1e-6).is_err());
        Ok(())
    }

    #[test]
    fn gradients_match_finite_differences() -> Result<()> {
        let (seed, [x, z, w, dy]) = inputs(&[2, 3, 5])?;
        let (_, rstd) = forward(&x, &z, &w, 1e-6)?;
        let (dx, dz, dw) = backward(&dy, &x, &z, &w, &rstd, true)?;
        assert!(backward(&dy, &x, &z, &w, &rstd, false)?.2.is_none());
        let f = |t: &[Tensor]| Ok(forward(&t[0], &t[1], &t[2], 1e-6)?.0);
        check(f, &[x, z, w], &dy, &[dx, dz, dw.expect("asked for dw")])
            .map_err(|e| candle_core::Error::Msg(format!("seed {seed}: {e}")))
    }
}
