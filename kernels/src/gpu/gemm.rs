//! Row-major GEMMs of the linear ops on cuBLAS, each shape with the algorithm the plan chose
//! for it (`gemm_algos`): cuBLAS's default or a cuBLASLt algorithm.
//!
//! Sums go into one output buffer: the first product with β = 0, every later one with β = 1.
//! This is the LoRA-aware linear: `x·Wᵀ + (s·x·Aᵀ)·Bᵀ` (or the input gradient of several
//! projections of one input) is written once, with no pass over the output per term.
//!
//! A single `x·Wᵀ` of at most [`KernelConfig::gemv_rows`] rows (a decode step) in bf16 goes to the
//! bandwidth-bound GEMV of `gemv` instead.
//!
//! cuBLAS is column-major: a row-major `[r, c]` matrix is its transpose column-major with
//! leading dimension `c`, so `Y[n, m] = X[n, k]·op(W)` is computed as `Yᵀ = op(W)ᵀ·Xᵀ`.

use super::{Elem, alloc, device, dtype_of, int, lt, tensor, with_views};
use crate::KernelConfig;
use crate::gemm_algos::{GemmAlgo, GemmShape};
use candle_core::cuda_backend::cudarc::cublas::{CudaBlas, Gemm, GemmConfig, sys::cublasOperation_t};
use candle_core::cuda_backend::cudarc::driver::{CudaSlice, CudaView};
use candle_core::cuda_backend::{CudaDevice, WrapErr};
use candle_core::{DType, Result, Tensor};

/// `Σᵢ xᵢ·op(Wᵢ)` for 2-D `xᵢ [n, kᵢ]`; `op(W) = Wᵀ` for `W [m, kᵢ]` when `transposed`, else
/// `W [kᵢ, m]`. `None` when the tensors are not all f32 or all bf16 on one CUDA device (the
/// caller then takes the composed path).
pub(crate) fn sum(cfg: &KernelConfig, terms: &[(&Tensor, &Tensor)], transposed: bool) -> Result<Option<Tensor>> {
    let all: Vec<&Tensor> = terms.iter().flat_map(|(x, w)| [*x, *w]).collect();
    match dtype_of(&all) {
        Some(DType::F32) => sum_typed::<f32>(cfg, terms, transposed).map(Some),
        Some(DType::BF16) => sum_typed::<half::bf16>(cfg, terms, transposed).map(Some),
        _ => Ok(None),
    }
}

/// `dW = dyᵀ·x` for `dy [n, out]`, `x [n, in]`: `[out, in]`. `None` as for [`sum`].
pub(crate) fn weight_grad(cfg: &KernelConfig, dy: &Tensor, x: &Tensor) -> Result<Option<Tensor>> {
    match dtype_of(&[dy, x]) {
        Some(DType::F32) => weight_grad_typed::<f32>(cfg, dy, x).map(Some),
        Some(DType::BF16) => weight_grad_typed::<half::bf16>(cfg, dy, x).map(Some),
        _ => Ok(None),
    }
}

fn sum_typed<T: Elem>(cfg: &KernelConfig, terms: &[(&Tensor, &Tensor)], transposed: bool) -> Result<Tensor>
where
    CudaBlas: Gemm<T>,
{
    let (y, n, m) = sum_slice::<T>(cfg, terms, transposed)?;
    Ok(tensor(y, &device(terms[0].0)?, (n, m)))
}

/// [`sum`] into a fresh buffer `[n, m]`, for kernels that go on writing into it (the multi-LoRA
/// expand adds each row's adapter branch in place).
pub(crate) fn sum_slice<T: Elem>(
    cfg: &KernelConfig,
    terms: &[(&Tensor, &Tensor)],
    transposed: bool,
) -> Result<(CudaSlice<T>, usize, usize)>
where
    CudaBlas: Gemm<T>,
{
    let (x0, w0) = terms[0];
    let n = x0.dim(0)?;
    let m = if transposed { w0.dim(0)? } else { w0.dim(1)? };
    let dev = device(x0)?;
    // A decode step's few rows: the GEMV streams W once, faster than cuBLAS on a layer's small
    // projections. Its shapes are not noted: no cuBLAS algorithm is chosen for them.
    if terms.len() == 1
        && transposed
        && n <= cfg.gemv_rows()
        && let Some(y) = super::gemv::forward::<T>(&dev, x0, w0)?
    {
        return Ok((y, n, m));
    }
    let mut y = alloc::<T>(&dev, n * m)?;
    for (i, (x, w)) in terms.iter().enumerate() {
        let k = x.dim(1)?;
        let (wm, wk) = if transposed { (w.dim(0)?, w.dim(1)?) } else { (w.dim(1)?, w.dim(0)?) };
        if x.dim(0)? != n || wm != m || wk != k {
            candle_core::bail!("gemm sum: term {i} is {:?}·{:?}, the sum is [{n}, {m}]", x.dims(), w.dims());
        }
        let shape = GemmShape { m, n, k, transa: transposed, transb: false, bf16: T::SUFFIX == "bf16" };
        with_views::<T, _, 2>([w, x], |[wv, xv]| planned(cfg, &dev, &shape, &wv, &xv, &mut y, i > 0))?;
    }
    Ok((y, n, m))
}

fn weight_grad_typed<T: Elem>(cfg: &KernelConfig, dy: &Tensor, x: &Tensor) -> Result<Tensor>
where
    CudaBlas: Gemm<T>,
{
    let ((n, out), (nx, inp)) = (dy.dims2()?, x.dims2()?);
    if n != nx {
        candle_core::bail!("gemm dW: output gradient {:?} against input {:?}", dy.dims(), x.dims());
    }
    let dev = device(x)?;
    let mut dw = alloc::<T>(&dev, out * inp)?;
    // dWᵀ [in, out] (column-major) = xᵀ [in, n] · dy [n, out].
    let shape = GemmShape { m: inp, n: out, k: n, transa: false, transb: true, bf16: T::SUFFIX == "bf16" };
    with_views::<T, _, 2>([x, dy], |[xv, dyv]| planned(cfg, &dev, &shape, &xv, &dyv, &mut dw, false))?;
    Ok(tensor(dw, &dev, (out, inp)))
}

/// `c (+)= op(a)·op(b)` with the algorithm `cfg` holds for this shape (the default if none).
fn planned<T: Elem>(
    cfg: &KernelConfig,
    dev: &CudaDevice,
    shape: &GemmShape,
    a: &CudaView<'_, T>,
    b: &CudaView<'_, T>,
    c: &mut CudaSlice<T>,
    accumulate: bool,
) -> Result<()>
where
    CudaBlas: Gemm<T>,
{
    cfg.note(*shape);
    let algo = cfg.gemm_algo(shape).unwrap_or(&GemmAlgo::Default);
    run(dev, shape, algo, a, b, c, accumulate)
}

/// `c (+)= op(a)·op(b)` with `algo`; `a`, `b` and `c` are dense in `shape`'s column-major terms.
pub(crate) fn run<T: Elem>(
    dev: &CudaDevice,
    s: &GemmShape,
    algo: &GemmAlgo,
    a: &CudaView<'_, T>,
    b: &CudaView<'_, T>,
    c: &mut CudaSlice<T>,
    accumulate: bool,
) -> Result<()>
where
    CudaBlas: Gemm<T>,
{
    #[cfg(test)]
    super::LAUNCHES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    if let Some(bytes) = algo.lt_bytes().map_err(candle_core::Error::Msg)?
        && lt::matmul(dev, s, &bytes, a, b, c, accumulate)?
    {
        return Ok(());
    }
    let op = |t: bool| if t { cublasOperation_t::CUBLAS_OP_T } else { cublasOperation_t::CUBLAS_OP_N };
    let cfg = GemmConfig {
        transa: op(s.transa),
        transb: op(s.transb),
        m: int(s.m)?,
        n: int(s.n)?,
        k: int(s.k)?,
        alpha: T::ONE,
        lda: int(if s.transa { s.k } else { s.m })?,
        ldb: int(if s.transb { s.n } else { s.k })?,
        beta: if accumulate { T::ONE } else { T::ZERO },
        ldc: int(s.m)?,
    };
    // SAFETY: the views hold the shape's element counts, laid out as cfg says; with β = 0
    // cuBLAS does not read c's (poisoned) contents.
    unsafe { dev.cublas_handle().gemm(cfg, a, b, c) }.w()
}
