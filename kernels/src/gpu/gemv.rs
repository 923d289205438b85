//! `y = x·Wᵀ` for the few rows of a decode step (`cuda/gemv.cu`): every weight is read once and
//! the product is bound by that read. cuBLAS reads a layer's 8–32 MB projections at 30–65% of the
//! copy bandwidth (this kernel: 45–74%) and its larger ones about as fast as this kernel; inside a
//! whole decode step the GEMV for every projection made the step 7–9% faster (H200,
//! docs/benchmarks.md). The reference is the composed `x·Wᵀ` of [`crate::linear`].

use super::{Elem, Kernel, LaunchConfig, Module, PushKernelArg, alloc, int, launch, module, with_views};
use candle_core::cuda_backend::CudaDevice;
use candle_core::cuda_backend::cudarc::driver::CudaSlice;
use candle_core::{Result, Tensor};

const MODULE: Module = module!("gemv");
/// Rows of x the kernel serves: the first half of an MMA's 16 (the second half's loads cost more
/// than cuBLAS at 16 rows, measured).
pub(crate) const MAX_ROWS: usize = 8;
/// From this many output columns on, a block takes two tiles of 8 columns (`gemv_bf16_t2`, 8
/// warps): still ≥ 256 blocks, two per multiprocessor of an H100/H200, and x is read half as
/// often. Narrower weights (a layer's k/v projections) take one tile and 16 warps per block
/// (`gemv_bf16_t1`) so that they fill the GPU.
const TWO_TILES_FROM: usize = 4096;

/// `y [rows, out] = x [rows, in] · wᵀ` (`w [out, in]`) into a fresh buffer, or `None` when
/// the kernel does not serve these tensors: not bf16, more than [`MAX_ROWS`] rows, `in` not a
/// multiple of 8 (a lane loads 8 at a time), either operand strided or not 16-byte aligned.
pub(crate) fn forward<T: Elem>(dev: &CudaDevice, x: &Tensor, w: &Tensor) -> Result<Option<CudaSlice<T>>> {
    let ((rows, d_in), (d_out, w_in)) = (x.dims2()?, w.dims2()?);
    let aligned = |t: &Tensor| t.is_contiguous() && t.layout().start_offset().is_multiple_of(8);
    let served = T::SUFFIX == "bf16"
        && (1..=MAX_ROWS).contains(&rows)
        && d_out > 0
        && d_in > 0
        && d_in == w_in
        && d_in.is_multiple_of(8)
        && aligned(x)
        && aligned(w);
    if !served {
        return Ok(None);
    }
    let (tiles, threads) = if d_out >= TWO_TILES_FROM { (2, 256) } else { (1, 512) };
    let kernel = Kernel::named(dev, &MODULE, &format!("gemv_bf16_t{tiles}"))?;
    let cfg = LaunchConfig {
        grid_dim: (int(d_out.div_ceil(8 * tiles))? as u32, 1, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: 0,
    };
    let mut y = alloc::<T>(dev, rows * d_out)?;
    let (m, n, k) = (int(rows)?, int(d_out)?, int(d_in)?);
    with_views::<T, _, 2>([x, w], |[xv, wv]| {
        let mut a = kernel.builder();
        a.arg(&xv).arg(&wv).arg(&mut y).arg(&m).arg(&n).arg(&k);
        launch(a, cfg)
    })?;
    Ok(Some(y))
}
