//! Causal GQA attention with the packing mask on the CPU.
//!
//! Per (batch, kv head) task, the `g` query heads that share the kv head are one `[g·T, hd]`
//! block, so scores, outputs and every gradient are single GEMMs of that block against the
//! unrepeated k and v; only the softmax is row by row, over each row's allowed keys
//! (`starts[row] ..= row`, the rest of the row is zero). The forward keeps the row
//! log-sum-exp; the backward recomputes the probabilities from it.
//!
//! A task owns `dk`, `dv` of its kv head and `dq`/`out` of its query heads, so nothing is
//! written twice and every sum runs in a fixed order whatever the thread count. Its score
//! buffers are `g·T×T`: fine at CPU sequence lengths (32 MiB at T = 2048, g = 2).

use super::{MatRef, Real, dot, matmul, matmul_ld, max, sum, tensor, wide, with_slices};
use candle_core::{Result, Tensor};
use rayon::prelude::*;

/// Shapes of one call: q `[B, heads, T, hd]`, k and v `[B, kv, T, hd]`.
#[derive(Clone, Copy)]
struct Dims {
    b: usize,
    heads: usize,
    kv: usize,
    t: usize,
    hd: usize,
}

impl Dims {
    fn of(q: &Tensor, k: &Tensor) -> Result<Dims> {
        let (b, heads, t, hd) = q.dims4()?;
        let kv = k.dim(1)?;
        Ok(Dims { b, heads, kv, t, hd })
    }
    fn group(&self) -> usize {
        self.heads / self.kv
    }
}

/// Query rows per tile: a tile's rows need keys only up to its last row, so the causal
/// upper triangle is skipped tile by tile (about 40% of the score work at T = 128).
const TILE: usize = 32;

/// The query tiles of one head of a `T`-row block: `(first row, rows, keys)` with `keys`
/// the number of keys the tile's last row may see.
fn tiles(t: usize) -> impl Iterator<Item = (usize, usize, usize)> {
    (0..t).step_by(TILE).map(move |i0| {
        let rows = TILE.min(t - i0);
        (i0, rows, i0 + rows)
    })
}

/// For the tile rows `r0..r0 + rows` of the task's `[g·T, hd]` query block (one head, its
/// rows `i0..`), `p[r][..keys] = scale·q_r·kᵀ`, then each row turned into probabilities over
/// its allowed keys (zero elsewhere; `p` has row stride `t`). With `lse` given they come
/// from it (backward); otherwise rows are normalised and their log-sum-exp written.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn probabilities<T: Real>(
    p: &mut [T],
    q: &[T],
    k: &[T],
    starts: &[u32],
    (t, hd): (usize, usize),
    (r0, rows, keys): (usize, usize, usize),
    scale: T,
    lse: &mut [T],
    given_lse: bool,
) {
    let i0 = r0 % t;
    let p = &mut p[r0 * t..(r0 + rows) * t];
    let tile_q = &q[r0 * hd..(r0 + rows) * hd];
    matmul_ld(p, t, rows, keys, hd, MatRef::rows(tile_q, hd), MatRef::transposed(&k[..keys * hd], hd), scale, false);
    for (ri, row) in p.chunks_exact_mut(t).enumerate() {
        let i = i0 + ri;
        let j0 = starts[i] as usize;
        row[..j0].fill(T::ZERO);
        row[i + 1..].fill(T::ZERO);
        let s = &mut row[j0..=i];
        let shift = if given_lse { lse[r0 + ri] } else { max(s) };
        s.iter_mut().for_each(|x| *x -= shift);
        T::exp_in_place(s);
        if !given_lse {
            let total = sum(s);
            let inv = T::ONE / total;
            s.iter_mut().for_each(|x| *x *= inv);
            lse[r0 + ri] = shift + total.ln();
        }
    }
}

pub(crate) fn forward<T: Real>(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    starts: &[u32],
    scale: f64,
) -> Result<(Tensor, Tensor)> {
    let d = Dims::of(q, k)?;
    let (t, hd, g) = (d.t, d.hd, d.group());
    let scale = T::of(scale);
    let mut out = vec![T::ZERO; d.b * d.heads * t * hd];
    let mut lse = vec![T::ZERO; d.b * d.heads * t];
    with_slices::<T, _, 3>([q, k, v], |[q, k, v]| {
        let tasks = out.par_chunks_mut(g * t * hd).zip(lse.par_chunks_mut(g * t));
        tasks.enumerate().for_each(|(bkv, (out, lse))| {
            wide(|| {
                let (qs, kv_rows) = (bkv * g * t * hd..(bkv + 1) * g * t * hd, bkv * t * hd..(bkv + 1) * t * hd);
                let starts = &starts[bkv / d.kv * t..(bkv / d.kv + 1) * t];
                let (q, k, v) = (&q[qs], &k[kv_rows.clone()], &v[kv_rows]);
                let mut p = vec![T::ZERO; g * t * t];
                for h in 0..g {
                    for (i0, rows, keys) in tiles(t) {
                        let r0 = h * t + i0;
                        probabilities(&mut p, q, k, starts, (t, hd), (r0, rows, keys), scale, lse, false);
                        let (o, pt) = (&mut out[r0 * hd..(r0 + rows) * hd], &p[r0 * t..(r0 + rows) * t]);
                        matmul(
                            o,
                            rows,
                            hd,
                            keys,
                            MatRef::rows(pt, t),
                            MatRef::rows(&v[..keys * hd], hd),
                            T::ONE,
                            false,
                        );
                    }
                }
            })
        });
        Ok(())
    })?;
    Ok((tensor(out, (d.b, d.heads, t, hd))?, tensor(lse, (d.b, d.heads, t))?))
}

pub(crate) fn backward<T: Real>(
    dout: &Tensor,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    lse: &Tensor,
    starts: &[u32],
    scale: f64,
) -> Result<(Tensor, Tensor, Tensor)> {
    let d = Dims::of(q, k)?;
    let (t, hd, g) = (d.t, d.hd, d.group());
    let scale = T::of(scale);
    let mut dq = vec![T::ZERO; d.b * d.heads * t * hd];
    let mut dk = vec![T::ZERO; d.b * d.kv * t * hd];
    let mut dv = vec![T::ZERO; d.b * d.kv * t * hd];
    with_slices::<T, _, 5>([dout, q, k, v, lse], |[dout, q, k, v, lse]| {
        let tasks = dq.par_chunks_mut(g * t * hd).zip(dk.par_chunks_mut(t * hd)).zip(dv.par_chunks_mut(t * hd));
        tasks.enumerate().for_each(|(bkv, ((dq, dk), dv))| {
            wide(|| {
                let (qs, kv_rows) = (bkv * g * t * hd..(bkv + 1) * g * t * hd, bkv * t * hd..(bkv + 1) * t * hd);
                let (q, dout, k, v) = (&q[qs.clone()], &dout[qs], &k[kv_rows.clone()], &v[kv_rows]);
                let starts = &starts[bkv / d.kv * t..(bkv / d.kv + 1) * t];
                let lse = &lse[bkv * g * t..(bkv + 1) * g * t];
                let mut lse = lse.to_vec();
                let (mut p, mut ds) = (vec![T::ZERO; g * t * t], vec![T::ZERO; g * t * t]);
                for h in 0..g {
                    for (i0, rows, keys) in tiles(t) {
                        let r0 = h * t + i0;
                        probabilities(&mut p, q, k, starts, (t, hd), (r0, rows, keys), scale, &mut lse, true);
                        let tile = r0 * t..(r0 + rows) * t;
                        let (pt, dst, dot_) = (&p[tile.clone()], &mut ds[tile], &dout[r0 * hd..(r0 + rows) * hd]);
                        // dp = do·vᵀ, then ds = p∘(dp − rowdot)·scale, rowdot = Σ_j p·dp = do·o.
                        let (vk, kk) = (&v[..keys * hd], &k[..keys * hd]);
                        let (dout_t, vk_t) = (MatRef::rows(dot_, hd), MatRef::transposed(vk, hd));
                        matmul_ld(dst, t, rows, keys, hd, dout_t, vk_t, T::ONE, false);
                        for (dsr, pr) in dst.chunks_exact_mut(t).zip(pt.chunks_exact(t)) {
                            let (dsr, pr) = (&mut dsr[..keys], &pr[..keys]);
                            let row_dot = dot(pr, dsr);
                            dsr.iter_mut().zip(pr).for_each(|(x, &pj)| *x = pj * (*x - row_dot) * scale);
                        }
                        let (dst, qt) = (&ds[r0 * t..(r0 + rows) * t], &q[r0 * hd..(r0 + rows) * hd]);
                        let dv = &mut dv[..keys * hd];
                        let pt_t = MatRef { data: pt, rs: 1, cs: t };
                        matmul(dv, keys, hd, rows, pt_t, MatRef::rows(dot_, hd), T::ONE, true);
                        let dqt = &mut dq[r0 * hd..(r0 + rows) * hd];
                        matmul(dqt, rows, hd, keys, MatRef::rows(dst, t), MatRef::rows(kk, hd), T::ONE, false);
                        let dst_t = MatRef { data: dst, rs: 1, cs: t };
                        matmul(&mut dk[..keys * hd], keys, hd, rows, dst_t, MatRef::rows(qt, hd), T::ONE, true);
                    }
                }
            })
        });
        Ok(())
    })?;
    let kv_shape = (d.b, d.kv, t, hd);
    Ok((tensor(dq, (d.b, d.heads, t, hd))?, tensor(dk, kv_shape)?, tensor(dv, kv_shape)?))
}
