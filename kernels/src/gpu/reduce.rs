//! Sums of squares of many tensors (`sum_squares_*` in `cuda/reduce.cu`): every tensor's block
//! partials land in one f64 buffer, which comes to the host in one copy.

use super::{Elem, Kernel, Module, PushKernelArg, launch, module, with_views};
use candle_core::cuda_backend::CudaDevice;
use candle_core::cuda_backend::cudarc::driver::LaunchConfig;
use candle_core::{DType, Result, Tensor};

const MODULE: Module = module!("reduce");
/// `REDUCE_THREADS` in reduce.cu.
const THREADS: u32 = 256;
/// At most this many blocks a tensor: enough to fill an H100/H200 several times over.
const MAX_BLOCKS: usize = 1024;

/// Blocks and elements per block for `n` elements: a function of `n` alone, so the sum's
/// order (and its bits) is too.
fn split(n: usize) -> (usize, usize) {
    let blocks = n.div_ceil(4 * THREADS as usize).clamp(1, MAX_BLOCKS);
    (blocks, n.div_ceil(blocks).max(1))
}

/// `Σ x²` of each tensor (all on `dev`, f32 or bf16), in f64.
pub(crate) fn sum_squares(dev: &CudaDevice, ts: &[&Tensor]) -> Result<Vec<f64>> {
    let splits: Vec<(usize, usize)> = ts.iter().map(|t| split(t.elem_count())).collect();
    let total: usize = splits.iter().map(|s| s.0).sum();
    let stream = dev.cuda_stream();
    let mut partials = stream.alloc_zeros::<f64>(total.max(1)).map_err(candle_core::Error::wrap)?;
    let mut at = 0;
    for (t, &(blocks, per)) in ts.iter().zip(&splits) {
        let n = t.elem_count();
        let mut out = partials.slice_mut(at..at + blocks);
        let cfg = LaunchConfig { grid_dim: (blocks as u32, 1, 1), block_dim: (THREADS, 1, 1), shared_mem_bytes: 0 };
        match t.dtype() {
            DType::F32 => one::<f32>(dev, t, n, per, &mut out, cfg)?,
            DType::BF16 => one::<half::bf16>(dev, t, n, per, &mut out, cfg)?,
            other => candle_core::bail!("sum of squares: {other:?} has no GPU kernel"),
        }
        at += blocks;
    }
    let host = stream.clone_dtoh(&partials).map_err(candle_core::Error::wrap)?;
    let mut sums = Vec::with_capacity(ts.len());
    let mut at = 0;
    for &(blocks, _) in &splits {
        sums.push(host[at..at + blocks].iter().sum());
        at += blocks;
    }
    Ok(sums)
}

fn one<T: Elem>(
    dev: &CudaDevice,
    t: &Tensor,
    n: usize,
    per: usize,
    out: &mut candle_core::cuda_backend::cudarc::driver::CudaViewMut<'_, f64>,
    cfg: LaunchConfig,
) -> Result<()> {
    let k = Kernel::new::<T>(dev, &MODULE, "sum_squares")?;
    with_views::<T, _, 1>([t], |[x]| {
        let mut b = k.builder();
        b.arg(&x).arg(&n).arg(&per).arg(out);
        launch(b, cfg)
    })
}
