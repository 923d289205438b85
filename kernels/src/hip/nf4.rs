//! NF4 dequantisation (`cuda/nf4.cu`): a range of a weight's elements, expanded into `T`.

use super::module::{NF4, args, grid_stride, launch};
use super::{DeviceBuffer, Elem, HipDevice, Result, invalid};
use crate::nf4::BLOCK;

/// Elements `start..start + n` of an NF4 weight with `codes` (two per byte, low nibble first)
/// and one f32 `scales` entry per block of [`BLOCK`] elements, as `crate::nf4::Nf4Weight`.
pub fn dequantize<T: Elem>(
    dev: &HipDevice,
    codes: &DeviceBuffer<u8>,
    scales: &DeviceBuffer<f32>,
    start: usize,
    n: usize,
) -> Result<DeviceBuffer<T>> {
    let end = start.checked_add(n).ok_or_else(|| invalid("nf4", "range overflows"))?;
    if codes.len() < end.div_ceil(2) || scales.len() < end.div_ceil(BLOCK) {
        return Err(invalid(
            "nf4",
            format!("elements {start}..{end} need more than {} codes and {} scales", codes.len(), scales.len()),
        ));
    }
    let mut out = dev.alloc::<T>(n)?;
    launch(dev, &NF4, &T::kernel("nf4_dequant"), grid_stride(n), &mut args![codes, scales, &mut out, start, n])?;
    Ok(out)
}
