//! The depthwise causal conv1d with SiLU on the CPU. Every input row (a token's `C` channels,
//! or a state column) is read whole against the weight transposed to `[W, C]`, so each tap is
//! one vectorised multiply-add over the channels. The forward and the input gradient run in
//! parallel over blocks of tokens; the weight and bias gradients over fixed blocks of rows,
//! summed in block order, so no result depends on the thread count.

use super::elementwise::sigmoid;
use super::{REDUCE_ROWS, Real, tensor, wide, with_slices};
use crate::causal_conv1d::{Dims, visible};
use candle_core::{Result, Tensor};
use rayon::prelude::*;

/// Tokens per parallel task.
const ROWS: usize = 16;

/// The inputs a token may read: `x` `[B, T, C]` and the state as rows `[B, W−1, C]`.
struct Inputs<'a, T> {
    d: Dims,
    x: &'a [T],
    state: Vec<T>,
    starts: Option<&'a [u32]>,
}

impl<'a, T: Real> Inputs<'a, T> {
    /// `s0` is `[B, C, W−1]`; it is transposed once so its columns read as rows.
    fn new(d: Dims, x: &'a [T], s0: &[T], starts: Option<&'a [u32]>) -> Self {
        let (c, k) = (d.c, d.w - 1);
        let mut state = vec![T::ZERO; d.b * k * c];
        for b in 0..d.b {
            for ch in 0..c {
                for m in 0..k {
                    state[(b * k + m) * c + ch] = s0[(b * c + ch) * k + m];
                }
            }
        }
        Inputs { d, x, state, starts }
    }

    /// Row `b`'s input at position `p` (a state column when negative), or `None` where its token
    /// `t` may not read it.
    fn at(&self, b: usize, t: usize, p: isize) -> Option<&[T]> {
        if !visible(self.starts, &self.d, b, t, p) {
            return None;
        }
        let (c, k) = (self.d.c, self.d.w - 1);
        let row = if p >= 0 { b * self.d.t + p as usize } else { b * k + (p + k as isize) as usize };
        let src = if p >= 0 { self.x } else { &self.state };
        Some(&src[row * c..(row + 1) * c])
    }

    /// The position tap `j` of token `t` reads.
    fn tap(&self, t: usize, j: usize) -> isize {
        t as isize + j as isize - (self.d.w as isize - 1)
    }
}

/// The weight `[C, W]` as `[W, C]`.
fn transposed<T: Real>(w: &[T], d: &Dims) -> Vec<T> {
    (0..d.w).flat_map(|j| (0..d.c).map(move |ch| w[ch * d.w + j])).collect()
}

/// `u = bias + Σ_j w_j·x_{t+j−(W−1)}` of token `t` of row `b`, into `u`.
#[inline(always)]
fn pre_activation<T: Real>(x: &Inputs<T>, wt: &[T], bias: &[T], (b, t): (usize, usize), u: &mut [T]) {
    let c = x.d.c;
    u.copy_from_slice(bias);
    for j in 0..x.d.w {
        if let Some(xr) = x.at(b, t, x.tap(t, j)) {
            for ((u, &xv), &w) in u.iter_mut().zip(xr).zip(&wt[j * c..(j + 1) * c]) {
                *u += w * xv;
            }
        }
    }
}

/// `(y, final state)`.
pub(crate) fn forward<T: Real>(
    x: &Tensor,
    w: &Tensor,
    bias: &Tensor,
    s0: &Tensor,
    starts: Option<&[u32]>,
) -> Result<(Tensor, Tensor)> {
    let d = Dims::of(x, w)?;
    let (c, k) = (d.c, d.w - 1);
    let mut y = vec![T::ZERO; d.b * d.t * c];
    let mut last = vec![T::ZERO; d.b * c * k];
    with_slices::<T, _, 4>([x, w, bias, s0], |[x, w, bias, s0]| {
        let inputs = Inputs::new(d, x, s0, starts);
        let wt = transposed(w, &d);
        y.par_chunks_mut(ROWS * c).enumerate().for_each(|(blk, y)| {
            wide(|| {
                let mut sig = vec![T::ZERO; c];
                for (i, y) in y.chunks_exact_mut(c).enumerate() {
                    let r = blk * ROWS + i;
                    pre_activation(&inputs, &wt, bias, (r / d.t, r % d.t), y);
                    sigmoid(y, &mut sig);
                    y.iter_mut().zip(&sig).for_each(|(y, &s)| *y *= s);
                }
            })
        });
        // Column m of the final state is position T + m − (W−1), as the last token sees it.
        for b in 0..d.b {
            for m in 0..k {
                if let Some(src) = inputs.at(b, d.t - 1, inputs.tap(d.t, m)) {
                    for (ch, &v) in src.iter().enumerate() {
                        last[(b * c + ch) * k + m] = v;
                    }
                }
            }
        }
        Ok(())
    })?;
    Ok((tensor(y, (d.b, d.t, c))?, tensor(last, (d.b, c, k))?))
}

/// `[dx, dw, dbias, d initial state]`; `dstate` is the final state's gradient.
#[allow(clippy::too_many_arguments)]
pub(crate) fn backward<T: Real>(
    dy: &Tensor,
    x: &Tensor,
    w: &Tensor,
    bias: &Tensor,
    s0: &Tensor,
    starts: &[u32],
    dstate: &Tensor,
) -> Result<[Tensor; 4]> {
    let d = Dims::of(x, w)?;
    let (c, k, n) = (d.c, d.w - 1, d.b * d.t);
    let mut du = vec![T::ZERO; n * c];
    let mut dx = vec![T::ZERO; n * c];
    let blocks = n.div_ceil(REDUCE_ROWS);
    let mut partial = vec![T::ZERO; blocks * (d.w + 1) * c];
    let mut ds0 = vec![T::ZERO; d.b * c * k];
    with_slices::<T, _, 6>([dy, x, w, bias, s0, dstate], |[dy, x, w, bias, s0, dstate]| {
        let inputs = Inputs::new(d, x, s0, Some(starts));
        let wt = transposed(w, &d);
        // du = dy·silu'(u), u recomputed; silu' = σ + silu·(1 − σ).
        du.par_chunks_mut(ROWS * c).enumerate().for_each(|(blk, du)| {
            wide(|| {
                let mut sig = vec![T::ZERO; c];
                for (i, du) in du.chunks_exact_mut(c).enumerate() {
                    let r = blk * ROWS + i;
                    pre_activation(&inputs, &wt, bias, (r / d.t, r % d.t), du);
                    sigmoid(du, &mut sig);
                    for ((g, &s), &dy) in du.iter_mut().zip(&sig).zip(&dy[r * c..(r + 1) * c]) {
                        let u = *g;
                        *g = dy * (s + u * s * (T::ONE - s));
                    }
                }
            })
        });
        let du = &du;
        let dlast = |b: usize, ch: usize, m: usize| dstate[(b * c + ch) * k + m];
        // Position p gets tap j of token t = p + (W−1) − j, where that token may read it, and
        // the final state's copy of it.
        dx.par_chunks_mut(ROWS * c).enumerate().for_each(|(blk, dx)| {
            wide(|| {
                for (i, dx) in dx.chunks_exact_mut(c).enumerate() {
                    let r = blk * ROWS + i;
                    let (b, p) = (r / d.t, r % d.t);
                    for j in 0..d.w {
                        let t = p + k - j;
                        if t < d.t && visible(Some(starts), &d, b, t, p as isize) {
                            let g = &du[(b * d.t + t) * c..(b * d.t + t + 1) * c];
                            for ((dx, &g), &w) in dx.iter_mut().zip(g).zip(&wt[j * c..(j + 1) * c]) {
                                *dx += w * g;
                            }
                        }
                    }
                    if p + k >= d.t && inputs.at(b, d.t - 1, p as isize).is_some() {
                        let m = p + k - d.t;
                        dx.iter_mut().enumerate().for_each(|(ch, dx)| *dx += dlast(b, ch, m));
                    }
                }
            })
        });
        // dw[j] = Σ du·x_{t+j−(W−1)} and dbias = Σ du, over fixed blocks of rows.
        partial.par_chunks_mut((d.w + 1) * c).enumerate().for_each(|(blk, part)| {
            wide(|| {
                let (pw, pb) = part.split_at_mut(d.w * c);
                for r in blk * REDUCE_ROWS..((blk + 1) * REDUCE_ROWS).min(n) {
                    let (b, t, g) = (r / d.t, r % d.t, &du[r * c..(r + 1) * c]);
                    pb.iter_mut().zip(g).for_each(|(a, &g)| *a += g);
                    for (j, pw) in pw.chunks_exact_mut(c).enumerate() {
                        if let Some(xr) = inputs.at(b, t, inputs.tap(t, j)) {
                            for ((a, &g), &xv) in pw.iter_mut().zip(g).zip(xr) {
                                *a += g * xv;
                            }
                        }
                    }
                }
            })
        });
        // The initial state's column m is position m − (W−1), read by tap j of token m − j.
        for b in 0..d.b {
            for m in 0..k {
                let p = m as isize - k as isize;
                for (j, t) in (0..d.w).filter_map(|j| m.checked_sub(j).map(|t| (j, t))).filter(|&(_, t)| t < d.t) {
                    if visible(Some(starts), &d, b, t, p) {
                        for ch in 0..c {
                            ds0[(b * c + ch) * k + m] += w[ch * d.w + j] * du[(b * d.t + t) * c + ch];
                        }
                    }
                }
                // Final state column m − T holds the same position when the row is that short.
                if let Some(m_last) = m.checked_sub(d.t).filter(|_| inputs.at(b, d.t - 1, p).is_some()) {
                    for ch in 0..c {
                        ds0[(b * c + ch) * k + m] += dlast(b, ch, m_last);
                    }
                }
            }
        }
        Ok(())
    })?;
    let (mut dwt, mut dbias) = (vec![T::ZERO; d.w * c], vec![T::ZERO; c]);
    for part in partial.chunks_exact((d.w + 1) * c) {
        let (pw, pb) = part.split_at(d.w * c);
        dwt.iter_mut().zip(pw).for_each(|(a, &v)| *a += v);
        dbias.iter_mut().zip(pb).for_each(|(a, &v)| *a += v);
    }
    let dwt = &dwt;
    let dw: Vec<T> = (0..c).flat_map(|ch| (0..d.w).map(move |j| dwt[j * c + ch])).collect();
    Ok([tensor(dx, (d.b, d.t, c))?, tensor(dw, (c, d.w))?, tensor(dbias, c)?, tensor(ds0, (d.b, c, k))?])
}
