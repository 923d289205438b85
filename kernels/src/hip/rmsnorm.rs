//! RMSNorm (`cuda/rmsnorm.cu`) over rows of `w.len()`: one wavefront per row; `rstd` is f32
//! whatever the activations' type. The gain's gradient is summed in fixed blocks of rows, then
//! over the blocks in order (no atomics), as in `gpu/rmsnorm.rs`.

use super::module::{Grid, RMSNORM, args, launch, per_row, per_thread};
use super::{DeviceBuffer, Elem, HipDevice, Result, int, invalid, same_len};

/// Rows per partial sum of the gain's gradient; must equal DW_ROWS in rmsnorm.cu.
const DW_ROWS: usize = 256;

/// Rows of `x` under a gain of `d` elements, checked: `(rows, rows as int, d as int)`.
fn rows_of(op: &'static str, x: usize, d: usize) -> Result<(usize, i32, i32)> {
    if d == 0 || !x.is_multiple_of(d) {
        return Err(invalid(op, format!("{x} elements are not rows of the gain's {d}")));
    }
    Ok((x / d, int(op, x / d)?, int(op, d)?))
}

/// `y = x · rstd · w` with `rstd = 1/√(mean(x²) + eps)` per row: returns `(y, rstd)`.
pub fn forward<T: Elem>(
    dev: &HipDevice,
    x: &DeviceBuffer<T>,
    w: &DeviceBuffer<T>,
    eps: f32,
) -> Result<(DeviceBuffer<T>, DeviceBuffer<f32>)> {
    let (rows, rows_i, d_i) = rows_of("rmsnorm", x.len(), w.len())?;
    let (mut y, mut rstd) = (dev.alloc::<T>(x.len())?, dev.alloc::<f32>(rows)?);
    let grid = per_row(rows, 1, 1);
    launch(dev, &RMSNORM, &T::kernel("rmsnorm_fwd"), grid, &mut args![x, w, &mut y, &mut rstd, rows_i, d_i, eps])?;
    Ok((y, rstd))
}

/// The residual add fused in front of the norm: `s = a + b` (rounded to `T`), then
/// [`forward`] of `s`; returns `(s, y, rstd)`.
pub fn add_forward<T: Elem>(
    dev: &HipDevice,
    a: &DeviceBuffer<T>,
    b: &DeviceBuffer<T>,
    w: &DeviceBuffer<T>,
    eps: f32,
) -> Result<(DeviceBuffer<T>, DeviceBuffer<T>, DeviceBuffer<f32>)> {
    let (rows, rows_i, d_i) = rows_of("rmsnorm add", a.len(), w.len())?;
    same_len("rmsnorm add", "the residual", b.len(), a.len())?;
    let (mut s, mut y, mut rstd) = (dev.alloc::<T>(a.len())?, dev.alloc::<T>(a.len())?, dev.alloc::<f32>(rows)?);
    let mut args = args![a, b, w, &mut s, &mut y, &mut rstd, rows_i, d_i, eps];
    launch(dev, &RMSNORM, &T::kernel("add_rmsnorm_fwd"), per_row(rows, 1, 1), &mut args)?;
    Ok((s, y, rstd))
}

/// `dx = rstd·(g − x̂·mean(g·x̂))` with `g = dy·w`, `x̂ = x·rstd`; with `want_dw` also
/// `dw = Σ dy·x̂` over all rows.
pub fn backward<T: Elem>(
    dev: &HipDevice,
    dy: &DeviceBuffer<T>,
    x: &DeviceBuffer<T>,
    w: &DeviceBuffer<T>,
    rstd: &DeviceBuffer<f32>,
    want_dw: bool,
) -> Result<(DeviceBuffer<T>, Option<DeviceBuffer<T>>)> {
    let op = "rmsnorm backward";
    let (rows, rows_i, d_i) = rows_of(op, x.len(), w.len())?;
    same_len(op, "dy", dy.len(), x.len())?;
    same_len(op, "rstd", rstd.len(), rows)?;
    let mut dx = dev.alloc::<T>(x.len())?;
    let grid = per_row(rows, 1, 1);
    launch(dev, &RMSNORM, &T::kernel("rmsnorm_bwd"), grid, &mut args![dy, x, w, rstd, &mut dx, rows_i, d_i])?;
    if !want_dw {
        return Ok((dx, None));
    }
    let d = w.len();
    let blocks = rows.div_ceil(DW_ROWS).max(1);
    let mut partial = dev.alloc::<f32>(blocks * d)?;
    let mut dw = dev.alloc::<T>(d)?;
    let cols = per_thread(d);
    let mut args = args![dy, x, rstd, &mut partial, rows_i, d_i];
    launch(dev, &RMSNORM, &T::kernel("rmsnorm_dw_partial"), Grid(cols, blocks as u32, 1), &mut args)?;
    let mut args = args![&partial, &mut dw, int(op, blocks)?, d_i];
    launch(dev, &RMSNORM, &T::kernel("sum_blocks"), Grid(cols, 1, 1), &mut args)?;
    Ok((dx, Some(dw)))
}
