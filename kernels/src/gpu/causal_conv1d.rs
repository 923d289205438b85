//! The causal conv1d with SiLU on the GPU (`cuda/causal_conv1d.cu`): elementwise kernels, every
//! operand and result in `T`, the arithmetic and the backward's `du` in f32.

use super::with_views;
use super::{Elem, Kernel, LaunchConfig, Module, PushKernelArg, alloc, device, grid_for, int, launch, module, tensor};
use crate::causal_conv1d::Dims;
use candle_core::cuda_backend::CudaDevice;
use candle_core::cuda_backend::cudarc::driver::CudaSlice;
use candle_core::{Result, Tensor};

const MODULE: Module = module!("causal_conv1d");
/// Tokens per partial sum of the weight's gradient; must equal CONV_ROWS in causal_conv1d.cu.
const CONV_ROWS: usize = 256;
const BLOCK: u32 = 256;

fn sizes(d: &Dims) -> Result<[i32; 4]> {
    Ok([int(d.b)?, int(d.t)?, int(d.c)?, int(d.w)?])
}

/// A state `[B, C, W−1]` as the kernels take it: with no columns (W = 1, nothing to read or
/// write) a one-element placeholder, since an empty tensor has no storage to view.
fn state_view(s: &Tensor, d: &Dims) -> Result<Tensor> {
    if d.w > 1 { Ok(s.clone()) } else { Tensor::zeros(1, s.dtype(), s.device()) }
}

/// A state the kernels wrote, as `[B, C, W−1]`; with no columns (W = 1) the placeholder buffer
/// is dropped for an empty tensor.
fn state_tensor<T: Elem>(buf: CudaSlice<T>, d: &Dims, like: &Tensor, dev: &CudaDevice) -> Result<Tensor> {
    if d.w > 1 {
        Ok(tensor(buf, dev, (d.b, d.c, d.w - 1)))
    } else {
        Tensor::zeros((d.b, d.c, 0), like.dtype(), like.device())
    }
}

/// `(y, final state)`; `starts` is `None` for rows of one document each.
pub(crate) fn forward<T: Elem>(
    x: &Tensor,
    w: &Tensor,
    bias: &Tensor,
    s0: &Tensor,
    starts: Option<&[u32]>,
) -> Result<(Tensor, Tensor)> {
    let d = Dims::of(x, w)?;
    let dev = device(x)?;
    let st = Tensor::new(starts.unwrap_or(&[0]), x.device())?;
    let (n, ns) = (d.b * d.t * d.c, d.b * d.c * (d.w - 1));
    let mut y = alloc::<T>(&dev, n)?;
    let mut last = alloc::<T>(&dev, ns.max(1))?;
    let kernel = Kernel::new::<T>(&dev, &MODULE, "conv1d_fwd")?;
    let [b, t, c, width] = sizes(&d)?;
    let segmented = i32::from(starts.is_some());
    let s0 = state_view(s0, &d)?;
    with_views::<T, _, 4>([x, w, bias, &s0], |[x, w, bias, s0]| {
        with_views::<u32, _, 1>([&st], |[st]| {
            let mut a = kernel.builder();
            a.arg(&x).arg(&w).arg(&bias).arg(&s0).arg(&st).arg(&mut y).arg(&mut last);
            a.arg(&b).arg(&t).arg(&c).arg(&width).arg(&segmented);
            launch(a, grid_for(n, BLOCK))
        })
    })?;
    Ok((tensor(y, &dev, (d.b, d.t, d.c)), state_tensor(last, &d, x, &dev)?))
}

/// `[dx, dw, dbias, d initial state]`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn backward<T: Elem>(
    dy: &Tensor,
    x: &Tensor,
    w: &Tensor,
    bias: &Tensor,
    s0: &Tensor,
    starts: &[u32],
    dstate: &Tensor,
) -> Result<[Tensor; 4]> {
    let d = Dims::of(x, w)?;
    let dev = device(x)?;
    let st = Tensor::new(starts, x.device())?;
    let (n, ns, rows) = (d.b * d.t * d.c, d.b * d.c * (d.w - 1), d.b * d.t);
    let [b, t, c, width] = sizes(&d)?;
    let (s0, dstate) = (state_view(s0, &d)?, state_view(dstate, &d)?);
    let mut du = alloc::<f32>(&dev, n)?;
    let kernel = Kernel::new::<T>(&dev, &MODULE, "conv1d_du")?;
    with_views::<T, _, 5>([dy, x, w, bias, &s0], |[dy, x, w, bias, s0]| {
        with_views::<u32, _, 1>([&st], |[st]| {
            let mut a = kernel.builder();
            a.arg(&dy).arg(&x).arg(&w).arg(&bias).arg(&s0).arg(&st).arg(&mut du);
            a.arg(&b).arg(&t).arg(&c).arg(&width);
            launch(a, grid_for(n, BLOCK))
        })
    })?;
    let mut dx = alloc::<T>(&dev, n)?;
    let mut ds0 = alloc::<T>(&dev, ns.max(1))?;
    let kernel = Kernel::new::<T>(&dev, &MODULE, "conv1d_dx")?;
    with_views::<T, _, 2>([w, &dstate], |[w, dlast]| {
        with_views::<u32, _, 1>([&st], |[st]| {
            let mut a = kernel.builder();
            a.arg(&du).arg(&w).arg(&dlast).arg(&st).arg(&mut dx).arg(&mut ds0);
            a.arg(&b).arg(&t).arg(&c).arg(&width);
            launch(a, grid_for(n, BLOCK))
        })
    })?;
    let blocks = rows.div_ceil(CONV_ROWS);
    let mut partial = alloc::<f32>(&dev, blocks * (d.w + 1) * d.c)?;
    let kernel = Kernel::new::<T>(&dev, &MODULE, "conv1d_dw_partial")?;
    with_views::<T, _, 2>([x, &s0], |[x, s0]| {
        with_views::<u32, _, 1>([&st], |[st]| {
            let mut a = kernel.builder();
            a.arg(&du).arg(&x).arg(&s0).arg(&st).arg(&mut partial);
            a.arg(&b).arg(&t).arg(&c).arg(&width);
            let grid = (d.c.div_ceil(BLOCK as usize) as u32, blocks as u32, 1);
            launch(a, LaunchConfig { grid_dim: grid, block_dim: (BLOCK, 1, 1), shared_mem_bytes: 0 })
        })
    })?;
    let mut dw = alloc::<T>(&dev, d.c * d.w)?;
    let mut dbias = alloc::<T>(&dev, d.c)?;
    let kernel = Kernel::new::<T>(&dev, &MODULE, "conv1d_dw_sum")?;
    let mut a = kernel.builder();
    let blocks_i = int(blocks)?;
    a.arg(&partial).arg(&mut dw).arg(&mut dbias).arg(&blocks_i).arg(&c).arg(&width);
    launch(a, grid_for(d.c * (d.w + 1), BLOCK))?;
    let ds0 = state_tensor(ds0, &d, x, &dev)?;
    Ok([tensor(dx, &dev, (d.b, d.t, d.c)), tensor(dw, &dev, (d.c, d.w)), tensor(dbias, &dev, d.c), ds0])
}
