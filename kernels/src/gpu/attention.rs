//! Causal GQA attention on the GPU (`cuda/attention.cu`): one warp per row, no T×T matrix.
//! Head sizes that are not a multiple of the warp (or over 256) take the composed reference.

use super::{
    Elem, Kernel, LaunchConfig, Module, PushKernelArg, alloc, device, int, launch, module, tensor, with_views,
};
use crate::attention::{Mask, reference};
use candle_core::{DType, Result, Tensor};

const MODULE: Module = module!("attention");
/// Warps (rows) per block.
const ROWS: usize = 8;
/// `MAXC` in attention.cu: register chunks of 32 per row.
const MAX_HD: usize = 8 * 32;

fn served(hd: usize) -> bool {
    hd.is_multiple_of(32) && hd <= MAX_HD
}

fn config(t: usize, heads: usize, b: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (t.div_ceil(ROWS) as u32, heads as u32, b as u32),
        block_dim: ((ROWS * 32) as u32, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// The mask's per-token first visible key, on the device.
fn starts(mask: &Mask, q: &Tensor) -> Result<Tensor> {
    Tensor::new(mask.starts(), q.device())
}

pub(crate) fn forward<T: Elem>(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    mask: &Mask,
    scale: f64,
) -> Result<(Tensor, Tensor)> {
    let (b, heads, t, hd) = q.dims4()?;
    if !served(hd) {
        return reference::forward(q, k, v, mask, scale);
    }
    let kv = k.dim(1)?;
    let dev = device(q)?;
    let starts = starts(mask, q)?;
    let mut out = alloc::<T>(&dev, q.elem_count())?;
    let mut lse = alloc::<f32>(&dev, b * heads * t)?;
    let kernel = Kernel::new::<T>(&dev, &MODULE, "attn_fwd")?;
    with_views::<T, _, 3>([q, k, v], |[qv, kv_, vv]| {
        with_views::<u32, _, 1>([&starts], |[st]| {
            let mut a = kernel.builder();
            let (h, kvh, tt, hd, scale) = (int(heads)?, int(kv)?, int(t)?, int(hd)?, scale as f32);
            a.arg(&qv).arg(&kv_).arg(&vv).arg(&st).arg(&mut out).arg(&mut lse);
            a.arg(&h).arg(&kvh).arg(&tt).arg(&hd).arg(&scale);
            launch(a, config(t, heads, b))
        })
    })?;
    Ok((tensor(out, &dev, q.shape().clone()), tensor(lse, &dev, (b, heads, t))))
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn backward<T: Elem>(
    dout: &Tensor,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    lse: &Tensor,
    mask: &Mask,
    scale: f64,
) -> Result<(Tensor, Tensor, Tensor)> {
    let (b, heads, t, hd) = q.dims4()?;
    if !served(hd) {
        return reference::backward(dout, q, k, v, &lse.to_dtype(q.dtype())?, mask, scale);
    }
    let kv = k.dim(1)?;
    let dev = device(q)?;
    let starts = starts(mask, q)?;
    let lse = lse.to_dtype(DType::F32)?;
    let mut dq = alloc::<T>(&dev, q.elem_count())?;
    let mut delta = alloc::<f32>(&dev, b * heads * t)?;
    let (mut dk, mut dv) = (alloc::<T>(&dev, k.elem_count())?, alloc::<T>(&dev, v.elem_count())?);
    let (h, kvh, tt, hd_i, scale) = (int(heads)?, int(kv)?, int(t)?, int(hd)?, scale as f32);
    let dq_kernel = Kernel::new::<T>(&dev, &MODULE, "attn_bwd_dq")?;
    let dkdv_kernel = Kernel::new::<T>(&dev, &MODULE, "attn_bwd_dkdv")?;
    with_views::<T, _, 4>([dout, q, k, v], |[dov, qv, kv_, vv]| {
        with_views::<u32, _, 1>([&starts], |[st]| {
            with_views::<f32, _, 1>([&lse], |[l]| {
                let mut a = dq_kernel.builder();
                a.arg(&dov).arg(&qv).arg(&kv_).arg(&vv).arg(&st).arg(&l).arg(&mut dq).arg(&mut delta);
                a.arg(&h).arg(&kvh).arg(&tt).arg(&hd_i).arg(&scale);
                launch(a, config(t, heads, b))?;
                let mut a = dkdv_kernel.builder();
                a.arg(&dov).arg(&qv).arg(&kv_).arg(&vv).arg(&st).arg(&l).arg(&delta).arg(&mut dk).arg(&mut dv);
                a.arg(&h).arg(&kvh).arg(&tt).arg(&hd_i).arg(&scale);
                launch(a, config(t, kv, b))
            })
        })
    })?;
    Ok((tensor(dq, &dev, q.shape().clone()), tensor(dk, &dev, k.shape().clone()), tensor(dv, &dev, v.shape().clone())))
}
