//! `y = x·Wᵀ` with `W` stored `[out, in]` as in PyTorch/HF. The leading dims of `x` are
//! flattened, so one GEMM serves any batch shape.
//!
//! Every op takes the [`KernelConfig`] of the model it runs for: the CPU kernels' rows per
//! task ("matmul blocking") and, on a GPU, the GEMM algorithm of each shape come from it.

use crate::KernelConfig;
use crate::cpu::{self, dispatch};
use candle_core::{Result, Tensor};

/// Rows of `x` (and of `dy`) per task of the CPU kernels when no plan sets them.
pub const DEFAULT_BLOCK_ROWS: usize = 128;

/// Rows of `x` up to which a bf16 `x·Wᵀ` on a CUDA device runs the bandwidth-bound GEMV
/// (`kernels/cuda/gemv.cu`) instead of cuBLAS: decode steps of up to this many sequences.
pub const DEFAULT_GEMV_ROWS: usize = 8;

/// `x`: `[.., in]`, `w`: `[out, in]` → `[.., out]`. Backward needs `x` and `w`, both owned by
/// the caller already, so nothing extra is saved.
pub fn forward(cfg: &KernelConfig, x: &Tensor, w: &Tensor) -> Result<Tensor> {
    let _profile = crate::profile::scope("linear fwd", x.device());
    let (lead, in_dim) = split_last(x)?;
    let out_dim = w.dim(0)?;
    check(in_dim, w)?;
    let x2 = x.reshape((lead.iter().product::<usize>(), in_dim))?;
    let y = match gpu_sum(cfg, &[(&x2, w)], true)? {
        Some(y) => y,
        None => {
            use cpu::linear::forward as fused;
            dispatch!([&x2, w], fused(&x2, w, cfg.gemm_rows()), x2.matmul(&w.t()?))?
        }
    };
    let mut shape = lead;
    shape.push(out_dim);
    y.reshape(shape)
}

/// Gradients of [`forward`]: `dx = dy·W`, and `dW = dyᵀ·x` when `want_dw` (frozen weights
/// skip that GEMM entirely).
pub fn backward(
    cfg: &KernelConfig,
    dy: &Tensor,
    x: &Tensor,
    w: &Tensor,
    want_dw: bool,
) -> Result<(Tensor, Option<Tensor>)> {
    let _profile = crate::profile::scope("linear bwd", x.device());
    let (lead, in_dim) = split_last(x)?;
    check(in_dim, w)?;
    let n: usize = lead.iter().product();
    let dx = input_grad(cfg, &dy.reshape((n, w.dim(0)?))?, w)?.reshape(x.shape())?;
    let dw = if want_dw { Some(weight_grad(cfg, dy, x)?) } else { None };
    Ok((dx, dw))
}

/// `dW = dyᵀ·x` alone (for a weight whose input gradient is not needed).
pub fn weight_grad(cfg: &KernelConfig, dy: &Tensor, x: &Tensor) -> Result<Tensor> {
    let _profile = crate::profile::scope("linear dW", x.device());
    let (lead, in_dim) = split_last(x)?;
    let n: usize = lead.iter().product();
    let out_dim = dy.dim(dy.rank() - 1)?;
    let (dy2, x2) = (dy.reshape((n, out_dim))?, x.reshape((n, in_dim))?);
    #[cfg(not(feature = "cuda"))]
    let _ = cfg;
    #[cfg(feature = "cuda")]
    if let Some(dw) = crate::gpu::gemm::weight_grad(cfg, &dy2, &x2)? {
        return Ok(dw);
    }
    use cpu::linear::weight_grad as fused;
    dispatch!([&dy2, &x2], fused(&dy2, &x2), dy2.t()?.matmul(&x2))
}

/// `Σᵢ xᵢ·Wᵢᵀ` over `(xᵢ [N, inᵢ], Wᵢ [out, inᵢ])`: a projection and its LoRA branch
/// (`x·Wᵀ + (s·x·Aᵀ)·Bᵀ`) as one output. On the GPU every product accumulates into one buffer
/// (cuBLAS with β = 1), so the branch costs its two thin GEMMs and no pass over `[N, out]`.
pub fn forward_sum(cfg: &KernelConfig, terms: &[(&Tensor, &Tensor)]) -> Result<Tensor> {
    let first = terms.first().ok_or_else(|| candle_core::Error::Msg("linear: no terms to sum".into()))?;
    let _profile = crate::profile::scope("linear fwd", first.0.device());
    for (x, w) in terms {
        check(x.dim(1)?, w)?;
    }
    if let Some(y) = gpu_sum(cfg, terms, true)? {
        return Ok(y);
    }
    sum_of(terms, |x, w| forward(cfg, x, w))
}

/// `Σᵢ dyᵢ·Wᵢ` over `(dyᵢ [N, outᵢ], Wᵢ [outᵢ, in])`: the input gradient of every projection
/// (and LoRA branch) that reads one input, summed as [`forward_sum`] sums.
pub fn input_grad_sum(cfg: &KernelConfig, terms: &[(&Tensor, &Tensor)]) -> Result<Tensor> {
    let first = terms.first().ok_or_else(|| candle_core::Error::Msg("linear: no terms to sum".into()))?;
    let _profile = crate::profile::scope("linear bwd", first.0.device());
    for (dy, w) in terms {
        if dy.dim(1)? != w.dim(0)? {
            candle_core::bail!("linear: output gradient {:?} against weight {:?}", dy.dims(), w.dims());
        }
    }
    if let Some(dx) = gpu_sum(cfg, terms, false)? {
        return Ok(dx);
    }
    sum_of(terms, |dy, w| input_grad(cfg, dy, w))
}

/// The GPU GEMM sum when the `cuda` feature serves these tensors (all on one CUDA device, f32
/// or bf16); `None` sends the caller to the CPU kernels or the composed form.
fn gpu_sum(cfg: &KernelConfig, terms: &[(&Tensor, &Tensor)], transposed: bool) -> Result<Option<Tensor>> {
    #[cfg(feature = "cuda")]
    return crate::gpu::gemm::sum(cfg, terms, transposed);
    #[cfg(not(feature = "cuda"))]
    {
        let _ = (cfg, terms, transposed);
        Ok(None)
    }
}

/// `dy·W` for a 2-D `dy`.
fn input_grad(cfg: &KernelConfig, dy: &Tensor, w: &Tensor) -> Result<Tensor> {
    use cpu::linear::input_grad as fused;
    dispatch!([dy, w], fused(dy, w, cfg.gemm_rows()), dy.matmul(w))
}

/// The sum of `f(a, b)` over the terms, in order.
fn sum_of(terms: &[(&Tensor, &Tensor)], f: impl Fn(&Tensor, &Tensor) -> Result<Tensor>) -> Result<Tensor> {
    let mut acc: Option<Tensor> = None;
    for (a, b) in terms {
        let y = f(a, b)?;
        acc = Some(match acc {
            None => y,
            Some(acc) => (acc + y)?,
        });
    }
    acc.ok_or_else(|| candle_core::Error::Msg("linear: no terms to sum".into()))
}

fn check(in_dim: usize, w: &Tensor) -> Result<()> {
    let (_, w_in) = w.dims2()?;
    if w_in != in_dim {
        candle_core::bail!("linear: input features {in_dim}, weight {:?}", w.dims());
    }
    Ok(())
}

fn split_last(x: &Tensor) -> Result<(Vec<usize>, usize)> {
    let dims = x.dims();
    match dims.split_last() {
        Some((&last, lead)) => Ok((lead.to_vec(), last)),
        None => candle_core::bail!("linear: a scalar has no feature dimension"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gradcheck::{assert_close, check, random};
    use candle_core::{DType, Device};

    #[test]
    fn fused_kernel_matches_candle_matmul_in_f64_and_f32() -> Result<()> {
        let dev = Device::Cpu;
        // More rows than one task and more outputs than one dW block, neither a multiple.
        let (x, w, dy) =
            (random(&[3, 100, 24], 1, &dev)?, random(&[40, 24], 2, &dev)?, random(&[3, 100, 40], 3, &dev)?);
        let (x2, dy2) = (x.reshape((300, 24))?, dy.reshape((300, 40))?);
        let cfg = KernelConfig::default();
        let y_ref = x2.matmul(&w.t()?)?.reshape((3, 100, 40))?;
        let (dx_ref, dw_ref) = (dy2.matmul(&w)?.reshape((3, 100, 24))?, dy2.t()?.matmul(&x2)?);
        for (dtype, tol) in [(DType::F64, 1e-12), (DType::F32, 1e-5)] {
            let c = |t: &Tensor| t.to_dtype(dtype);
            assert_close(&forward(&cfg, &c(&x)?, &c(&w)?)?, &y_ref, tol)?;
            let (dx, dw) = backward(&cfg, &c(&dy)?, &c(&x)?, &c(&w)?, true)?;
            assert_close(&dx, &dx_ref, tol)?;
            assert_close(&dw.unwrap(), &dw_ref, tol)?;
            // A transposed (strided) weight is served too.
            let wt = c(&w)?.t()?.contiguous()?.t()?;
            assert_close(&forward(&cfg, &c(&x)?, &wt)?, &y_ref, tol)?;
        }
        assert!(forward(&cfg, &x, &random(&[40, 23], 4, &dev)?).is_err());
        Ok(())
    }

    #[test]
    fn gradients_match_finite_differences() -> Result<()> {
        let dev = Device::Cpu;
        let x = random(&[2, 3, 4], 1, &dev)?;
        let w = random(&[5, 4], 2, &dev)?;
        let dy = random(&[2, 3, 5], 3, &dev)?;
        let cfg = KernelConfig::default();
        let (dx, dw) = backward(&cfg, &dy, &x, &w, true)?;
        let f = |t: &[Tensor]| forward(&cfg, &t[0], &t[1]);
        check(f, &[x.clone(), w.clone()], &dy, &[dx, dw.expect("dw")])?;
        let whole = backward(&cfg, &dy, &x, &w, true)?.1.unwrap().to_vec2::<f64>()?;
        assert_eq!(weight_grad(&cfg, &dy, &x)?.to_vec2::<f64>()?, whole);
        Ok(())
    }
}
