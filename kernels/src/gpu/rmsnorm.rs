//! RMSNorm on the GPU (`cuda/rmsnorm.cu`): one warp per row; `rstd` is kept in f32 whatever the
//! activations' dtype, since a bf16 statistic would cost the backward precision for no memory
//! worth saving (one value per row).

use super::{
    Elem, Kernel, LaunchConfig, Module, PushKernelArg, alloc, chunked, device, int, launch, module, tensor, with_views,
};
use candle_core::{DType, Result, Tensor};

const MODULE: Module = module!("rmsnorm");
/// Rows per warp-per-row block (8 warps).
const BLOCK: u32 = 256;
/// Rows per partial sum of the gain's gradient; must equal DW_ROWS in rmsnorm.cu.
const DW_ROWS: usize = 256;

/// Below this many rows the forward runs one block of `BLOCK` threads per row (`*_rows`
/// kernels): one warp per row would launch fewer blocks than the GPU has multiprocessors (132
/// on an H100/H200) and leave each lane a long chain of dependent loads.
const FEW_ROWS: usize = 1024;
/// From this width up, many rows run one block per row too, sized so each thread moves two
/// 16-byte chunks of the row: the warp kernel's 2-byte loads (and its second read of the sum)
/// ran at ~0.8 TB/s on an 8B prefill step of 8192 rows (0.33 ms a norm, 24 ms of a 212 ms step).
/// Narrower rows (the per-head q/k norms, 128 wide) keep one warp per row.
const WIDE_ROW_BYTES: usize = 1024;

/// The forward kernel for `rows` rows of `d` elements of `elem` bytes and its launch: `name` or
/// its one-block-per-row twin.
fn forward_kernel(name: &str, rows: usize, d: usize, elem: usize) -> (String, LaunchConfig) {
    let per_row = |threads: u32| LaunchConfig {
        grid_dim: (rows.max(1) as u32, 1, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: 0,
    };
    if rows < FEW_ROWS {
        (format!("{name}_rows"), per_row(BLOCK))
    } else if d * elem >= WIDE_ROW_BYTES && (d * elem).is_multiple_of(16) {
        let chunks = d * elem / 16;
        let threads = (chunks.div_ceil(2).div_ceil(32) * 32).clamp(32, BLOCK as usize) as u32;
        (format!("{name}_rows"), per_row(threads))
    } else {
        (name.to_owned(), rows_config(rows))
    }
}

fn rows_config(rows: usize) -> LaunchConfig {
    let per_block = BLOCK as usize / 32;
    LaunchConfig {
        grid_dim: (rows.div_ceil(per_block).max(1) as u32, 1, 1),
        block_dim: (BLOCK, 1, 1),
        shared_mem_bytes: 0,
    }
}

fn rstd_shape(x: &Tensor) -> Vec<usize> {
    let mut s = x.dims().to_vec();
    if let Some(last) = s.last_mut() {
        *last = 1;
    }
    s
}

pub(crate) fn forward<T: Elem>(x: &Tensor, w: &Tensor, eps: f64) -> Result<(Tensor, Tensor)> {
    let dev = device(x)?;
    let d = w.dim(0)?;
    let rows = x.elem_count() / d.max(1);
    let mut y = alloc::<T>(&dev, rows * d)?;
    let mut rstd = alloc::<f32>(&dev, rows)?;
    let (name, cfg) = forward_kernel("rmsnorm_fwd", rows, d, std::mem::size_of::<T>());
    let k = Kernel::new::<T>(&dev, &MODULE, &name)?;
    with_views::<T, _, 2>([x, w], |[x, w]| {
        let mut b = k.builder();
        let (rows_i, d_i, eps) = (int(rows)?, int(d)?, eps as f32);
        b.arg(&x).arg(&w).arg(&mut y).arg(&mut rstd).arg(&rows_i).arg(&d_i).arg(&eps);
        launch(b, cfg)
    })?;
    Ok((tensor(y, &dev, x.shape().clone()), tensor(rstd, &dev, rstd_shape(x))))
}

/// `s = a + b` and `rmsnorm(s)` in one pass: returns `(s, y, rstd)`.
pub(crate) fn add_forward<T: Elem>(a: &Tensor, b: &Tensor, w: &Tensor, eps: f64) -> Result<(Tensor, Tensor, Tensor)> {
    let dev = device(a)?;
    let d = w.dim(0)?;
    let rows = a.elem_count() / d.max(1);
    let mut s = alloc::<T>(&dev, rows * d)?;
    let mut y = alloc::<T>(&dev, rows * d)?;
    let mut rstd = alloc::<f32>(&dev, rows)?;
    let (name, cfg) = forward_kernel("add_rmsnorm_fwd", rows, d, std::mem::size_of::<T>());
    let k = Kernel::new::<T>(&dev, &MODULE, &name)?;
    with_views::<T, _, 3>([a, b, w], |[a, b, w]| {
        let mut l = k.builder();
        let (rows_i, d_i, eps) = (int(rows)?, int(d)?, eps as f32);
        l.arg(&a).arg(&b).arg(&w).arg(&mut s).arg(&mut y).arg(&mut rstd).arg(&rows_i).arg(&d_i).arg(&eps);
        launch(l, cfg)
    })?;
    Ok((tensor(s, &dev, a.shape().clone()), tensor(y, &dev, a.shape().clone()), tensor(rstd, &dev, rstd_shape(a))))
}

pub(crate) fn backward<T: Elem>(
    dy: &Tensor,
    x: &Tensor,
    w: &Tensor,
    rstd: &Tensor,
    want_dw: bool,
) -> Result<(Tensor, Option<Tensor>)> {
    let dev = device(x)?;
    let d = w.dim(0)?;
    let rows = x.elem_count() / d.max(1);
    let rstd = rstd.to_dtype(DType::F32)?;
    let (rows_i, d_i) = (int(rows)?, int(d)?);
    let mut dx = alloc::<T>(&dev, rows * d)?;
    let (name, _) = chunked::<T>("rmsnorm_bwd", d, &[dy, x, w]);
    let k = Kernel::new::<T>(&dev, &MODULE, &name)?;
    with_views::<T, _, 3>([dy, x, w], |[dy, x, w]| {
        with_views::<f32, _, 1>([&rstd], |[r]| {
            let mut b = k.builder();
            b.arg(&dy).arg(&x).arg(&w).arg(&r).arg(&mut dx).arg(&rows_i).arg(&d_i);
            launch(b, rows_config(rows))
        })
    })?;
    let dx = tensor(dx, &dev, x.shape().clone());
    if !want_dw {
        return Ok((dx, None));
    }
    let blocks = rows.div_ceil(DW_ROWS).max(1);
    let mut partial = alloc::<f32>(&dev, blocks * d)?;
    let mut dw = alloc::<T>(&dev, d)?;
    let cols = (d.div_ceil(256) as u32, 1, 1);
    let k = Kernel::new::<T>(&dev, &MODULE, "rmsnorm_dw_partial")?;
    with_views::<T, _, 2>([dy, x], |[dy, x]| {
        with_views::<f32, _, 1>([&rstd], |[r]| {
            let mut b = k.builder();
            b.arg(&dy).arg(&x).arg(&r).arg(&mut partial).arg(&rows_i).arg(&d_i);
            let grid = (cols.0, blocks as u32, 1);
            launch(b, LaunchConfig { grid_dim: grid, block_dim: (256, 1, 1), shared_mem_bytes: 0 })
        })
    })?;
    let k = Kernel::new::<T>(&dev, &MODULE, "sum_blocks")?;
    let mut b = k.builder();
    let blocks_i = int(blocks)?;
    b.arg(&partial).arg(&mut dw).arg(&blocks_i).arg(&d_i);
    launch(b, LaunchConfig { grid_dim: cols, block_dim: (256, 1, 1), shared_mem_bytes: 0 })?;
    Ok((dx, Some(tensor(dw, &dev, d))))
}
