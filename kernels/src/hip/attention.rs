//! Causal GQA attention with a per-document mask (`cuda/attention.cu`), no T×T matrix: one
//! wavefront per query row (forward, dQ) or key row (dK/dV). The flash kernels the CUDA path
//! takes for bf16 are NVIDIA-only, so every case here runs these.

use super::module::{ATTENTION, WAVE, args, launch, per_row};
use super::{DeviceBuffer, Elem, HipDevice, Result, int, invalid, same_len};
use crate::attention::Mask;

/// `MAXC` in attention.cu: a lane holds up to this many elements of a head vector.
const MAXC: usize = 8;

/// `q`, `dout`, `out` `[batch, heads, tokens, head_dim]`; `k`, `v` `[batch, kv_heads, tokens,
/// head_dim]`; `lse` `[batch, heads, tokens]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    pub batch: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub tokens: usize,
    pub head_dim: usize,
}

/// The kernels' `int` arguments after the buffers: `H, KV, Tn, hd`.
type Ints = (i32, i32, i32, i32);

impl Shape {
    fn check<T: Elem>(
        &self,
        op: &'static str,
        q: &[&DeviceBuffer<T>],
        kv: &[&DeviceBuffer<T>],
        mask: &Mask,
    ) -> Result<Ints> {
        let Shape { batch, heads, kv_heads, tokens, head_dim } = *self;
        // A lane holds head_dim / WAVE elements: the head size must split evenly over a wavefront.
        let wave = WAVE as usize;
        if head_dim == 0 || !head_dim.is_multiple_of(wave) || head_dim > MAXC * wave {
            return Err(invalid(op, format!("head_dim {head_dim} is not a multiple of {wave} up to {}", MAXC * wave)));
        }
        if kv_heads == 0 || !heads.is_multiple_of(kv_heads) {
            return Err(invalid(op, format!("{heads} query heads do not group over {kv_heads} kv heads")));
        }
        // Saturated products cannot equal a real buffer's length.
        let count = |dims: &[usize]| dims.iter().fold(1usize, |a, &d| a.saturating_mul(d));
        same_len(op, "the mask", mask.starts().len(), count(&[batch, tokens]))?;
        for b in q {
            same_len(op, "a query-side buffer", b.len(), count(&[batch, heads, tokens, head_dim]))?;
        }
        for b in kv {
            same_len(op, "a key-side buffer", b.len(), count(&[batch, kv_heads, tokens, head_dim]))?;
        }
        // The batch is a grid dimension: it must fit one as well.
        int(op, batch)?;
        Ok((int(op, heads)?, int(op, kv_heads)?, int(op, tokens)?, int(op, head_dim)?))
    }

    fn rows(&self) -> usize {
        self.batch * self.heads * self.tokens
    }
}

/// Returns the output and the row log-sum-exp (f32) of the scaled, masked scores.
pub fn forward<T: Elem>(
    dev: &HipDevice,
    shape: Shape,
    q: &DeviceBuffer<T>,
    k: &DeviceBuffer<T>,
    v: &DeviceBuffer<T>,
    mask: &Mask,
    scale: f32,
) -> Result<(DeviceBuffer<T>, DeviceBuffer<f32>)> {
    let (h, kvh, t, hd) = shape.check("attention", &[q], &[k, v], mask)?;
    let starts = dev.upload(mask.starts())?;
    let (mut out, mut lse) = (dev.alloc::<T>(q.len())?, dev.alloc::<f32>(shape.rows())?);
    let grid = per_row(shape.tokens, shape.heads, shape.batch);
    let mut args = args![q, k, v, &starts, &mut out, &mut lse, h, kvh, t, hd, scale];
    launch(dev, &ATTENTION, &T::kernel("attn_fwd"), grid, &mut args)?;
    Ok((out, lse))
}

/// Gradients `(dq, dk, dv)` of [`forward`], from its `lse`: dQ first (which leaves the softmax
/// backward's row term D), then dK/dV per key row, summed over the group's query heads.
#[allow(clippy::too_many_arguments)]
pub fn backward<T: Elem>(
    dev: &HipDevice,
    shape: Shape,
    dout: &DeviceBuffer<T>,
    q: &DeviceBuffer<T>,
    k: &DeviceBuffer<T>,
    v: &DeviceBuffer<T>,
    lse: &DeviceBuffer<f32>,
    mask: &Mask,
    scale: f32,
) -> Result<(DeviceBuffer<T>, DeviceBuffer<T>, DeviceBuffer<T>)> {
    let op = "attention backward";
    let (h, kvh, t, hd) = shape.check(op, &[dout, q], &[k, v], mask)?;
    same_len(op, "lse", lse.len(), shape.rows())?;
    let starts = dev.upload(mask.starts())?;
    let (mut dq, mut delta) = (dev.alloc::<T>(q.len())?, dev.alloc::<f32>(shape.rows())?);
    let (mut dk, mut dv) = (dev.alloc::<T>(k.len())?, dev.alloc::<T>(v.len())?);
    let grid = per_row(shape.tokens, shape.heads, shape.batch);
    let mut args = args![dout, q, k, v, &starts, lse, &mut dq, &mut delta, h, kvh, t, hd, scale];
    launch(dev, &ATTENTION, &T::kernel("attn_bwd_dq"), grid, &mut args)?;
    let grid = per_row(shape.tokens, shape.kv_heads, shape.batch);
    let mut args = args![dout, q, k, v, &starts, lse, &delta, &mut dk, &mut dv, h, kvh, t, hd, scale];
    launch(dev, &ATTENTION, &T::kernel("attn_bwd_dkdv"), grid, &mut args)?;
    Ok((dq, dk, dv))
}
