//! The two chunk passes of the lm_head cross-entropy (`cuda/cross_entropy.cu`, see
//! `crate::lm_head_ce`) on a chunk of logits `[rows, cols]`.

use super::module::{CROSS_ENTROPY, args, grid_stride, launch, per_row};
use super::{DeviceBuffer, Elem, HipDevice, Result, int, invalid, same_len};

/// Rows of `len` logits in rows of `cols`.
fn rows_of(op: &'static str, len: usize, cols: usize) -> Result<usize> {
    if cols == 0 || !len.is_multiple_of(cols) {
        return Err(invalid(op, format!("{len} logits are not rows of {cols}")));
    }
    Ok(len / cols)
}

/// The row log-sum-exp (f32, one per row): one wavefront per row.
pub fn row_lse<T: Elem>(dev: &HipDevice, logits: &DeviceBuffer<T>, cols: usize) -> Result<DeviceBuffer<f32>> {
    let op = "row_lse";
    let rows = rows_of(op, logits.len(), cols)?;
    let mut lse = dev.alloc::<f32>(rows)?;
    let mut args = args![logits, &mut lse, int(op, rows)?, int(op, cols)?];
    launch(dev, &CROSS_ENTROPY, &T::kernel("row_lse"), per_row(rows, 1, 1), &mut args)?;
    Ok(lse)
}

/// The chunk's logit gradient `weight·(softmax − onehot)`, the chunk holding vocabulary entries
/// `v0..v0 + cols`; `lse` is the full row log-sum-exp, `weight` the per-row loss weights and
/// `targets` the label of each row (any that falls outside the chunk adds no one-hot).
pub fn chunk_grad<T: Elem>(
    dev: &HipDevice,
    logits: &DeviceBuffer<T>,
    cols: usize,
    lse: &DeviceBuffer<f32>,
    weight: &DeviceBuffer<f32>,
    targets: &DeviceBuffer<u32>,
    v0: usize,
) -> Result<DeviceBuffer<T>> {
    let op = "ce_chunk_grad";
    let rows = rows_of(op, logits.len(), cols)?;
    for (what, len) in [("lse", lse.len()), ("weight", weight.len()), ("targets", targets.len())] {
        same_len(op, what, len, rows)?;
    }
    let mut out = dev.alloc::<T>(logits.len())?;
    let mut args = args![logits, lse, weight, targets, int(op, v0)?, int(op, rows)?, int(op, cols)?, &mut out];
    launch(dev, &CROSS_ENTROPY, &T::kernel("ce_chunk_grad"), grid_stride(logits.len()), &mut args)?;
    Ok(out)
}
