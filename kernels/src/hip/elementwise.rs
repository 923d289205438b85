//! SwiGLU and RoPE (`cuda/elementwise.cu`): grid-stride loops, one pass each.

use super::module::{ELEMENTWISE, args, grid_stride, launch};
use super::{DeviceBuffer, Elem, HipDevice, Result, int, invalid, same_len};

/// `h = silu(gate) · up`.
pub fn swiglu_forward<T: Elem>(
    dev: &HipDevice,
    gate: &DeviceBuffer<T>,
    up: &DeviceBuffer<T>,
) -> Result<DeviceBuffer<T>> {
    let n = gate.len();
    same_len("swiglu", "up", up.len(), n)?;
    let mut h = dev.alloc::<T>(n)?;
    launch(dev, &ELEMENTWISE, &T::kernel("swiglu_fwd"), grid_stride(n), &mut args![gate, up, &mut h, n])?;
    Ok(h)
}

/// `(d_gate, d_up)` with `d_gate = dh·up·(σ + silu·(1 − σ))`, `d_up = dh·silu`.
pub fn swiglu_backward<T: Elem>(
    dev: &HipDevice,
    dh: &DeviceBuffer<T>,
    gate: &DeviceBuffer<T>,
    up: &DeviceBuffer<T>,
) -> Result<(DeviceBuffer<T>, DeviceBuffer<T>)> {
    let n = gate.len();
    same_len("swiglu backward", "up", up.len(), n)?;
    same_len("swiglu backward", "dh", dh.len(), n)?;
    let (mut dg, mut du) = (dev.alloc::<T>(n)?, dev.alloc::<T>(n)?);
    let mut args = args![dh, gate, up, &mut dg, &mut du, n];
    launch(dev, &ELEMENTWISE, &T::kernel("swiglu_bwd"), grid_stride(n), &mut args)?;
    Ok((dg, du))
}

/// RoPE in HF's `rotate_half` convention on `x` `[tokens, heads, head_dim]` with tables `cos`,
/// `sin` `[tokens, head_dim]` shared by a token's heads (`crate::rope::tables`).
pub fn rope_forward<T: Elem>(
    dev: &HipDevice,
    x: &DeviceBuffer<T>,
    cos: &DeviceBuffer<T>,
    sin: &DeviceBuffer<T>,
    head_dim: usize,
) -> Result<DeviceBuffer<T>> {
    rope(dev, x, cos, sin, head_dim, false)
}

/// The gradient of [`rope_forward`]: the transposed rotation of `dy`.
pub fn rope_backward<T: Elem>(
    dev: &HipDevice,
    dy: &DeviceBuffer<T>,
    cos: &DeviceBuffer<T>,
    sin: &DeviceBuffer<T>,
    head_dim: usize,
) -> Result<DeviceBuffer<T>> {
    rope(dev, dy, cos, sin, head_dim, true)
}

fn rope<T: Elem>(
    dev: &HipDevice,
    x: &DeviceBuffer<T>,
    cos: &DeviceBuffer<T>,
    sin: &DeviceBuffer<T>,
    hd: usize,
    transposed: bool,
) -> Result<DeviceBuffer<T>> {
    let op = "rope";
    same_len(op, "sin", sin.len(), cos.len())?;
    if hd == 0 || !hd.is_multiple_of(2) || !cos.len().is_multiple_of(hd) || cos.is_empty() {
        return Err(invalid(op, format!("tables of {} elements for head_dim {hd}", cos.len())));
    }
    if !x.len().is_multiple_of(cos.len()) {
        return Err(invalid(op, format!("{} elements are not heads over the tables' {}", x.len(), cos.len())));
    }
    let heads = x.len() / cos.len();
    let pairs = x.len() / 2;
    let mut y = dev.alloc::<T>(x.len())?;
    let mut args = args![x, cos, sin, &mut y, pairs, int(op, heads)?, int(op, hd)?, transposed as i32];
    launch(dev, &ELEMENTWISE, &T::kernel("rope"), grid_stride(pairs), &mut args)?;
    Ok(y)
}
