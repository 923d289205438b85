//! RMSNorm over the last dimension, one row at a time; the gain's gradient is summed over
//! fixed blocks of rows, then over the blocks in order.

use super::{REDUCE_ROWS, Real, dot, tensor, with_slices};
use candle_core::{Result, Tensor};
use rayon::prelude::*;

pub(crate) fn forward<T: Real>(x: &Tensor, w: &Tensor, eps: f64) -> Result<(Tensor, Tensor)> {
    let d = w.dim(0)?;
    let rows = x.elem_count() / d.max(1);
    let mut y = vec![T::ZERO; rows * d];
    let mut rstd = vec![T::ZERO; rows];
    let (inv_d, eps) = (T::of(1.0 / d as f64), T::of(eps));
    with_slices::<T, _, 2>([x, w], |[x, w]| {
        y.par_chunks_mut(d).zip(rstd.par_iter_mut()).zip(x.par_chunks(d)).for_each(|((y, r), x)| {
            let ms = dot(x, x) * inv_d;
            *r = T::ONE / (ms + eps).sqrt();
            for ((y, &x), &w) in y.iter_mut().zip(x).zip(w) {
                *y = x * *r * w;
            }
        });
        Ok(())
    })?;
    let mut rstd_shape = x.dims().to_vec();
    if let Some(last) = rstd_shape.last_mut() {
        *last = 1;
    }
    Ok((tensor(y, x.shape().clone())?, tensor(rstd, rstd_shape)?))
}

pub(crate) fn backward<T: Real>(
    dy: &Tensor,
    x: &Tensor,
    w: &Tensor,
    rstd: &Tensor,
    want_dw: bool,
) -> Result<(Tensor, Option<Tensor>)> {
    let d = w.dim(0)?;
    let rows = x.elem_count() / d.max(1);
    let mut dx = vec![T::ZERO; rows * d];
    let blocks = rows.div_ceil(REDUCE_ROWS);
    let mut partial = vec![T::ZERO; if want_dw { blocks * d } else { 0 }];
    let inv_d = T::of(1.0 / d as f64);
    with_slices::<T, _, 4>([dy, x, w, rstd], |[dy, x, w, rstd]| {
        let row = |r: usize, dx: &mut [T], dw: Option<&mut [T]>| {
            let (dy, x, rs) = (&dy[r * d..(r + 1) * d], &x[r * d..(r + 1) * d], rstd[r]);
            // dx = rstd·(g − x̂·mean(g·x̂)), g = dy·w, x̂ = x·rstd
            // dx doubles as the buffer of g = dy·w.
            for ((g, &dy), &w) in dx.iter_mut().zip(dy).zip(w) {
                *g = dy * w;
            }
            let proj = dot(dx, x) * rs * inv_d;
            for (dx, &x) in dx.iter_mut().zip(x) {
                *dx = rs * (*dx - x * rs * proj);
            }
            if let Some(dw) = dw {
                for ((dw, &dy), &x) in dw.iter_mut().zip(dy).zip(x) {
                    *dw += dy * x * rs;
                }
            }
        };
        let per_block = dx.par_chunks_mut(REDUCE_ROWS * d).enumerate();
        if want_dw {
            per_block.zip(partial.par_chunks_mut(d)).for_each(|((blk, dx), dw)| {
                for (i, dx) in dx.chunks_mut(d).enumerate() {
                    row(blk * REDUCE_ROWS + i, dx, Some(&mut *dw));
                }
            });
        } else {
            per_block.for_each(|(blk, dx)| {
                for (i, dx) in dx.chunks_mut(d).enumerate() {
                    row(blk * REDUCE_ROWS + i, dx, None);
                }
            });
        }
        Ok(())
    })?;
    let dw = if want_dw {
        let mut dw = vec![T::ZERO; d];
        for block in partial.chunks(d) {
            for (a, &b) in dw.iter_mut().zip(block) {
                *a += b;
            }
        }
        Some(tensor(dw, d)?)
    } else {
        None
    };
    Ok((tensor(dx, x.shape().clone())?, dw))
}
