//! SwiGLU and RoPE on the GPU (`cuda/elementwise.cu`): grid-stride loops, one pass each.

use super::{
    Elem, Kernel, Module, PushKernelArg, aligned16, alloc, chunked, device, grid_for, int, launch, module, tensor,
    with_views,
};
use candle_core::{Result, Tensor};

const MODULE: Module = module!("elementwise");
const BLOCK: u32 = 256;

pub(crate) fn swiglu_forward<T: Elem>(gate: &Tensor, up: &Tensor) -> Result<Tensor> {
    let dev = device(gate)?;
    let n = gate.elem_count();
    let mut h = alloc::<T>(&dev, n)?;
    let (name, count) = chunked::<T>("swiglu_fwd", n, &[gate, up]);
    let k = Kernel::new::<T>(&dev, &MODULE, &name)?;
    with_views::<T, _, 2>([gate, up], |[g, u]| {
        let mut b = k.builder();
        b.arg(&g).arg(&u).arg(&mut h).arg(&count);
        launch(b, grid_for(count, BLOCK))
    })?;
    Ok(tensor(h, &dev, gate.shape().clone()))
}

/// `gu` `[N, 2f]` (gate then up per row) → `[N, f]`.
pub(crate) fn swiglu_packed_forward<T: Elem>(gu: &Tensor) -> Result<Tensor> {
    let dev = device(gu)?;
    let (rows, width) = gu.dims2()?;
    let (f, n) = (width / 2, rows * width / 2);
    let mut h = alloc::<T>(&dev, n)?;
    let per = 16 / std::mem::size_of::<T>();
    let chunks = u32::try_from(n / per).ok().filter(|_| aligned16(gu) && f.is_multiple_of(per));
    let k =
        Kernel::new::<T>(&dev, &MODULE, if chunks.is_some() { "swiglu_packed_fwd_vec" } else { "swiglu_packed_fwd" })?;
    with_views::<T, _, 1>([gu], |[g]| {
        let mut b = k.builder();
        match chunks {
            Some(chunks) => {
                let per_row = (f / per) as u32;
                b.arg(&g).arg(&mut h).arg(&chunks).arg(&per_row);
                launch(b, grid_for(chunks as usize, BLOCK))
            }
            None => {
                b.arg(&g).arg(&mut h).arg(&n).arg(&f);
                launch(b, grid_for(n, BLOCK))
            }
        }
    })?;
    Ok(tensor(h, &dev, (rows, f)))
}

pub(crate) fn swiglu_backward<T: Elem>(dh: &Tensor, gate: &Tensor, up: &Tensor) -> Result<(Tensor, Tensor)> {
    let dev = device(gate)?;
    let n = gate.elem_count();
    let (mut dg, mut du) = (alloc::<T>(&dev, n)?, alloc::<T>(&dev, n)?);
    let (name, count) = chunked::<T>("swiglu_bwd", n, &[dh, gate, up]);
    let k = Kernel::new::<T>(&dev, &MODULE, &name)?;
    with_views::<T, _, 3>([dh, gate, up], |[dh, g, u]| {
        let mut b = k.builder();
        b.arg(&dh).arg(&g).arg(&u).arg(&mut dg).arg(&mut du).arg(&count);
        launch(b, grid_for(count, BLOCK))
    })?;
    Ok((tensor(dg, &dev, gate.shape().clone()), tensor(du, &dev, gate.shape().clone())))
}

/// `dh` `[N, f]`, `gu` `[N, 2f]` → `dgu` `[N, 2f]` (gate's gradient, then up's, per row).
pub(crate) fn swiglu_packed_backward<T: Elem>(dh: &Tensor, gu: &Tensor) -> Result<Tensor> {
    let dev = device(gu)?;
    let (rows, width) = gu.dims2()?;
    let (f, n) = (width / 2, rows * width / 2);
    let mut dgu = alloc::<T>(&dev, rows * width)?;
    let k = Kernel::new::<T>(&dev, &MODULE, "swiglu_packed_bwd")?;
    with_views::<T, _, 2>([dh, gu], |[dh, g]| {
        let mut b = k.builder();
        b.arg(&dh).arg(&g).arg(&mut dgu).arg(&n).arg(&f);
        launch(b, grid_for(n, BLOCK))
    })?;
    Ok(tensor(dgu, &dev, (rows, width)))
}

/// RoPE on `x` `[.., heads, hd]` with per-token tables (`cos.elem_count()` = tokens · hd).
pub(crate) fn rope<T: Elem>(x: &Tensor, cos: &Tensor, sin: &Tensor, transposed: bool) -> Result<Tensor> {
    let dev = device(x)?;
    let hd = x.dim(candle_core::D::Minus1)?;
    let heads = x.elem_count() / cos.elem_count().max(1);
    let pairs = x.elem_count() / 2;
    let mut y = alloc::<T>(&dev, x.elem_count())?;
    let k = Kernel::new::<T>(&dev, &MODULE, "rope")?;
    with_views::<T, _, 3>([x, cos, sin], |[x, c, s]| {
        let mut b = k.builder();
        let (heads, hd, tr) = (int(heads)?, int(hd)?, transposed as i32);
        b.arg(&x).arg(&c).arg(&s).arg(&mut y).arg(&pairs).arg(&heads).arg(&hd).arg(&tr);
        launch(b, grid_for(pairs, BLOCK))
    })?;
    Ok(tensor(y, &dev, x.shape().clone()))
}
