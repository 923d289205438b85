//! Sums of row-major GEMMs on cuBLAS into one output buffer: the first product with β = 0,
//! every later one with β = 1. This is the LoRA-aware linear: `x·Wᵀ + (s·x·Aᵀ)·Bᵀ` (or the
//! input gradient of several projections of one input) is written once, with no pass over the
//! output per term.
//!
//! cuBLAS is column-major: a row-major `[r, c]` matrix is its transpose column-major with
//! leading dimension `c`, so `Y[n, m] = X[n, k]·op(W)` is computed as `Yᵀ = op(W)ᵀ·Xᵀ`.

use super::{alloc, device, dtype_of, int, tensor, with_views};
use candle_core::cuda_backend::WrapErr;
use candle_core::cuda_backend::cudarc::cublas::{CudaBlas, Gemm, GemmConfig, sys::cublasOperation_t};
use candle_core::{DType, Result, Tensor};

/// `Σᵢ xᵢ·op(Wᵢ)` for 2-D `xᵢ [n, kᵢ]`; `op(W) = Wᵀ` for `W [m, kᵢ]` when `transposed`, else
/// `W [kᵢ, m]`. `None` when the tensors are not all f32 or all bf16 on one CUDA device (the
/// caller then takes the composed path).
pub(crate) fn sum(terms: &[(&Tensor, &Tensor)], transposed: bool) -> Result<Option<Tensor>> {
    let all: Vec<&Tensor> = terms.iter().flat_map(|(x, w)| [*x, *w]).collect();
    match dtype_of(&all) {
        Some(DType::F32) => sum_typed::<f32>(terms, transposed, 1.0, 0.0).map(Some),
        Some(DType::BF16) => sum_typed::<half::bf16>(terms, transposed, half::bf16::ONE, half::bf16::ZERO).map(Some),
        _ => Ok(None),
    }
}

fn sum_typed<T: super::Elem>(terms: &[(&Tensor, &Tensor)], transposed: bool, one: T, zero: T) -> Result<Tensor>
where
    CudaBlas: Gemm<T>,
{
    let (x0, w0) = terms[0];
    let n = x0.dim(0)?;
    let m = if transposed { w0.dim(0)? } else { w0.dim(1)? };
    let dev = device(x0)?;
    let blas = dev.cublas_handle();
    let mut y = alloc::<T>(&dev, n * m)?;
    for (i, (x, w)) in terms.iter().enumerate() {
        let k = x.dim(1)?;
        let (wm, wk) = if transposed { (w.dim(0)?, w.dim(1)?) } else { (w.dim(1)?, w.dim(0)?) };
        if x.dim(0)? != n || wm != m || wk != k {
            candle_core::bail!("gemm sum: term {i} is {:?}·{:?}, the sum is [{n}, {m}]", x.dims(), w.dims());
        }
        let cfg = GemmConfig {
            transa: if transposed { cublasOperation_t::CUBLAS_OP_T } else { cublasOperation_t::CUBLAS_OP_N },
            transb: cublasOperation_t::CUBLAS_OP_N,
            m: int(m)?,
            n: int(n)?,
            k: int(k)?,
            alpha: one,
            lda: int(if transposed { k } else { m })?,
            ldb: int(k)?,
            beta: if i == 0 { zero } else { one },
            ldc: int(m)?,
        };
        with_views::<T, _, 2>([x, w], |[xv, wv]| {
            #[cfg(test)]
            super::LAUNCHES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            // SAFETY: the views hold n·k and m·k elements laid out as cfg says (checked above),
            // and y holds n·m; with β = 0 cuBLAS does not read y's (poisoned) contents.
            unsafe { blas.gemm(cfg, &wv, &xv, &mut y) }.w()
        })?;
    }
    Ok(tensor(y, &dev, (n, m)))
}
