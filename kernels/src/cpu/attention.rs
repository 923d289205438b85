//! Causal GQA attention with the packing mask, flash-style: only the allowed keys of each
//! row are touched (`starts[row] ..= row`), the forward keeps the row log-sum-exp instead of
//! the T×T probabilities, and the backward recomputes them.
//!
//! Keys and values are held transposed (`[hd, T]`) per kv head, so every inner loop runs
//! along the keys of one row (up to T long, contiguous) instead of along `hd` (often 16):
//! scores and `dkᵀ`, `dvᵀ` updates are axpys, outputs and `dq` are lane-summed dots.
//!
//! Parallel over (batch, kv head): that task owns `dk`, `dv` of its kv head and `dq`/`out`
//! of the query heads that share it, so nothing is written twice and the sums run in a
//! fixed order.

use super::{Real, axpy, dot, max, sum, tensor, with_slices};
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

/// `[T, hd]` ↔ `[hd, T]` (`rows` × `cols` → `cols` × `rows`).
fn transpose<T: Real>(m: &[T], rows: usize, cols: usize) -> Vec<T> {
    let mut out = vec![T::ZERO; rows * cols];
    for (r, row) in m.chunks_exact(cols).enumerate() {
        for (c, &x) in row.iter().enumerate() {
            out[c * rows + r] = x;
        }
    }
    out
}

/// `s[j − j0] = scale · x·m_j` for the keys `j0..=i` of `mt` (`[hd, T]`).
fn scores<T: Real>(x: &[T], mt: &[T], t: usize, j0: usize, scale: T, s: &mut [T]) {
    s.fill(T::ZERO);
    let n = s.len();
    for (d, &xd) in x.iter().enumerate() {
        axpy(xd * scale, &mt[d * t + j0..d * t + j0 + n], s);
    }
}

/// One row's probabilities over its keys: `p = exp(s − lse)`, with `lse` given or (forward)
/// computed and returned.
fn softmax<T: Real>(p: &mut [T], lse: Option<T>) -> T {
    let shift = lse.unwrap_or_else(|| max(p));
    p.iter_mut().for_each(|x| *x -= shift);
    T::exp_in_place(p);
    if lse.is_some() {
        return shift;
    }
    let total = sum(p);
    let inv = T::ONE / total;
    p.iter_mut().for_each(|x| *x *= inv);
    shift + total.ln()
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
            let kv_rows = bkv * t * hd..(bkv + 1) * t * hd;
            let (kt, vt) = (transpose(&k[kv_rows.clone()], t, hd), transpose(&v[kv_rows], t, hd));
            let bi = bkv / d.kv;
            let mut p = vec![T::ZERO; t];
            for (row, (o, lse)) in out.chunks_exact_mut(hd).zip(lse.iter_mut()).enumerate() {
                let i = row % t;
                let j0 = starts[bi * t + i] as usize;
                let p = &mut p[..i + 1 - j0];
                let qi = &q[(bkv * g * t + row) * hd..(bkv * g * t + row + 1) * hd];
                scores(qi, &kt, t, j0, scale, p);
                *lse = softmax(p, None);
                for (dd, o) in o.iter_mut().enumerate() {
                    *o = dot(p, &vt[dd * t + j0..]);
                }
            }
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
            let bi = bkv / d.kv;
            let kv_rows = bkv * t * hd..(bkv + 1) * t * hd;
            let (kt, vt) = (transpose(&k[kv_rows.clone()], t, hd), transpose(&v[kv_rows], t, hd));
            // dkᵀ and dvᵀ accumulate along keys, then are transposed back once.
            let (mut dkt, mut dvt) = (vec![T::ZERO; t * hd], vec![T::ZERO; t * hd]);
            let (mut p, mut dp) = (vec![T::ZERO; t], vec![T::ZERO; t]);
            for (row, dqi) in dq.chunks_exact_mut(hd).enumerate() {
                let i = row % t;
                let j0 = starts[bi * t + i] as usize;
                let n = i + 1 - j0;
                let (p, ds) = (&mut p[..n], &mut dp[..n]);
                let at = (bkv * g * t + row) * hd..(bkv * g * t + row + 1) * hd;
                let (qi, doi) = (&q[at.clone()], &dout[at]);
                scores(qi, &kt, t, j0, scale, p);
                softmax(p, Some(lse[bkv * g * t + row]));
                // dp_j = do_i·v_j; Σ_j p_j·dp_j = do_i·o_i, so o need not be kept.
                scores(doi, &vt, t, j0, T::ONE, ds);
                let row_dot = dot(p, ds);
                ds.iter_mut().zip(p.iter()).for_each(|(x, &pj)| *x = pj * (*x - row_dot) * scale);
                for dd in 0..hd {
                    let keys = dd * t + j0..dd * t + j0 + n;
                    axpy(doi[dd], p, &mut dvt[keys.clone()]);
                    axpy(qi[dd], ds, &mut dkt[keys]);
                    dqi[dd] = dot(ds, &kt[dd * t + j0..]);
                }
            }
            dk.copy_from_slice(&transpose(&dkt, hd, t));
            dv.copy_from_slice(&transpose(&dvt, hd, t));
        });
        Ok(())
    })?;
    let kv_shape = (d.b, d.kv, t, hd);
    Ok((tensor(dq, (d.b, d.heads, t, hd))?, tensor(dk, kv_shape)?, tensor(dv, kv_shape)?))
}
