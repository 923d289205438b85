//! The gated delta rule on the CPU, one task per (batch row, value head): the task's state
//! `[d_k, d_v]` stays in its cache while it walks the tokens. The backward walks the chunks last
//! to first, recomputes each chunk's per-token states from the one the forward kept at its
//! start, then goes back through the chunk's tokens.
//!
//! A task owns one head's rows of every output, so nothing is written twice; the q/k gradients,
//! shared by the value heads of a group, are summed over them in head order after the tasks, so
//! results do not depend on the thread count.

use super::{Real, dot, tensor, wide, with_slices};
use crate::delta_rule::{CHUNK, Dims, Operands};
use candle_core::{Result, Tensor};
use rayon::prelude::*;
use std::ops::Range;

/// One (batch row, value head)'s view of the operands.
struct Head<'a, T> {
    d: Dims,
    b: usize,
    h: usize,
    q: &'a [T],
    k: &'a [T],
    v: &'a [T],
    beta: &'a [T],
    /// `exp(g)` per token.
    alpha: Vec<T>,
    starts: Option<&'a [u32]>,
}

impl<'a, T: Real> Head<'a, T> {
    fn new(d: Dims, task: usize, [q, k, v, beta, g]: [&'a [T]; 5], starts: Option<&'a [u32]>) -> Self {
        let (b, h) = (task / d.h, task % d.h);
        let mut alpha: Vec<T> = (0..d.t).map(|t| g[(b * d.t + t) * d.h + h]).collect();
        T::exp_in_place(&mut alpha);
        Head { d, b, h, q, k, v, beta, alpha, starts }
    }

    /// Token `t`'s q/k row: this head reads key head `h / rep`.
    fn qk(&self, t: usize) -> Range<usize> {
        let at = ((self.b * self.d.t + t) * self.d.hk + self.h / self.d.rep()) * self.d.dk;
        at..at + self.d.dk
    }

    fn q(&self, t: usize) -> &'a [T] {
        &self.q[self.qk(t)]
    }

    fn k(&self, t: usize) -> &'a [T] {
        &self.k[self.qk(t)]
    }

    /// Token `t`'s index in `[B, T, H]`.
    fn at(&self, t: usize) -> usize {
        (self.b * self.d.t + t) * self.d.h + self.h
    }

    fn v(&self, t: usize) -> &'a [T] {
        &self.v[self.at(t) * self.d.dv..(self.at(t) + 1) * self.d.dv]
    }

    /// Whether a document starts at `t` (the row's first token continues the initial state).
    fn restarts(&self, t: usize) -> bool {
        self.starts.is_some_and(|s| t > 0 && s[self.b * self.d.t + t] as usize == t)
    }
}

/// Token `t` on `s`, which holds the previous state (zeroed where a document starts) on entry
/// and `S_t` on exit: `S' = αP`, `u = S'ᵀk`, `δ = β(v − u)`, `S_t = S' + kδᵀ`. Writes `u`, `δ`.
#[inline(always)]
fn advance<T: Real>(s: &mut [T], head: &Head<T>, t: usize, u: &mut [T], delta: &mut [T]) {
    let (k, v, beta, alpha) = (head.k(t), head.v(t), head.beta[head.at(t)], head.alpha[t]);
    let dv = u.len();
    u.fill(T::ZERO);
    for (row, &ki) in s.chunks_exact_mut(dv).zip(k) {
        for (sj, uj) in row.iter_mut().zip(u.iter_mut()) {
            *sj *= alpha;
            *uj += ki * *sj;
        }
    }
    for ((dj, &vj), &uj) in delta.iter_mut().zip(v).zip(u.iter()) {
        *dj = beta * (vj - uj);
    }
    for (row, &ki) in s.chunks_exact_mut(dv).zip(k) {
        for (sj, &dj) in row.iter_mut().zip(delta.iter()) {
            *sj += ki * dj;
        }
    }
}

/// `o = Sᵀ(scale·q)`.
#[inline(always)]
fn read<T: Real>(s: &[T], q: &[T], scale: T, o: &mut [T]) {
    o.fill(T::ZERO);
    for (row, &qi) in s.chunks_exact(o.len()).zip(q) {
        let c = scale * qi;
        for (oj, &sj) in o.iter_mut().zip(row) {
            *oj += c * sj;
        }
    }
}

/// Per-head rows `[T, width]` (tasks in (b, h) order) laid out as `[B, T, H/group, width]`, the
/// `group` consecutive value heads that share an output head summed in head order.
fn interleave<T: Real>(d: &Dims, rows: &[&[T]], width: usize, group: usize) -> Vec<T> {
    let heads = d.h / group;
    let mut y = vec![T::ZERO; d.b * d.t * heads * width];
    y.par_chunks_mut(heads * width).enumerate().for_each(|(bt, y)| {
        let (b, t) = (bt / d.t, bt % d.t);
        for (h, src) in rows[b * d.h..(b + 1) * d.h].iter().enumerate() {
            let dst = &mut y[h / group * width..(h / group + 1) * width];
            for (y, &x) in dst.iter_mut().zip(&src[t * width..(t + 1) * width]) {
                *y += x;
            }
        }
    });
    y
}

/// `(out, final state, checkpoints)`: the state entering every [`CHUNK`]th token when `keep`.
pub(crate) fn forward<T: Real>(
    x: &Operands,
    s0: &Tensor,
    starts: Option<&[u32]>,
    keep: bool,
) -> Result<(Tensor, Tensor, Tensor)> {
    let d = Dims::of(x)?;
    let (sz, chunks) = (d.dk * d.dv, if keep { d.chunks() } else { 0 });
    let scale = T::of(x.scale);
    let mut state = vec![T::ZERO; d.b * d.h * sz];
    let per_head = with_slices::<T, _, 6>([x.q, x.k, x.v, x.beta, x.g, s0], |[q, k, v, beta, g, s0]| {
        let tasks = state.par_chunks_mut(sz).enumerate().map(|(task, s)| {
            wide(|| {
                let head = Head::new(d, task, [q, k, v, beta, g], starts);
                s.copy_from_slice(&s0[task * sz..(task + 1) * sz]);
                let (mut out, mut kept) = (vec![T::ZERO; d.t * d.dv], Vec::with_capacity(chunks * sz));
                let (mut u, mut delta) = (vec![T::ZERO; d.dv], vec![T::ZERO; d.dv]);
                for (t, o) in out.chunks_exact_mut(d.dv).enumerate() {
                    if keep && t % CHUNK == 0 {
                        kept.extend_from_slice(s);
                    }
                    if head.restarts(t) {
                        s.fill(T::ZERO);
                    }
                    advance(s, &head, t, &mut u, &mut delta);
                    read(s, head.q(t), scale, o);
                }
                (out, kept)
            })
        });
        Ok(tasks.collect::<Vec<_>>())
    })?;
    let rows: Vec<&[T]> = per_head.iter().map(|(o, _)| o.as_slice()).collect();
    let out = interleave(&d, &rows, d.dv, 1);
    let kept: Vec<T> = per_head.into_iter().flat_map(|(_, k)| k).collect();
    Ok((
        tensor(out, (d.b, d.t, d.h, d.dv))?,
        tensor(state, (d.b, d.h, d.dk, d.dv))?,
        tensor(kept, (d.b, d.h, chunks, d.dk, d.dv))?,
    ))
}

/// One head's gradients, per token.
struct HeadGrads<T> {
    dq: Vec<T>,
    dk: Vec<T>,
    dv: Vec<T>,
    dbeta: Vec<T>,
    dg: Vec<T>,
}

/// `[dq, dk, dv, dβ, dg, d initial state]`; `dstate` is the final state's gradient (zeros when
/// nothing read it).
pub(crate) fn backward<T: Real>(
    x: &Operands,
    starts: &[u32],
    checkpoints: &Tensor,
    dout: &Tensor,
    dstate: &Tensor,
) -> Result<[Tensor; 6]> {
    let d = Dims::of(x)?;
    let (sz, nc, dv) = (d.dk * d.dv, d.chunks(), d.dv);
    let scale = T::of(x.scale);
    let mut ds0 = vec![T::ZERO; d.b * d.h * sz];
    let tensors = [x.q, x.k, x.v, x.beta, x.g, checkpoints, dout, dstate];
    let per_head = with_slices::<T, _, 8>(tensors, |[q, k, v, beta, g, checkpoints, dout, dstate]| {
        let tasks = ds0.par_chunks_mut(sz).enumerate().map(|(task, ds)| {
            wide(|| {
                let head = Head::new(d, task, [q, k, v, beta, g], Some(starts));
                ds.copy_from_slice(&dstate[task * sz..(task + 1) * sz]);
                let z = |n: usize| vec![T::ZERO; n];
                let mut gr =
                    HeadGrads { dq: z(d.t * d.dk), dk: z(d.t * d.dk), dv: z(d.t * dv), dbeta: z(d.t), dg: z(d.t) };
                // The chunk's states (entering its first token, then after each token), u and δ.
                let (mut states, mut us, mut deltas) = (z((CHUNK + 1) * sz), z(CHUNK * dv), z(CHUNK * dv));
                let (mut ddelta, mut du) = (z(dv), z(dv));
                for c in (0..nc).rev() {
                    let (t0, t1) = (c * CHUNK, (c * CHUNK + CHUNK).min(d.t));
                    states[..sz].copy_from_slice(&checkpoints[(task * nc + c) * sz..(task * nc + c + 1) * sz]);
                    for t in t0..t1 {
                        let i = t - t0;
                        let (before, after) = states.split_at_mut((i + 1) * sz);
                        let s = &mut after[..sz];
                        if head.restarts(t) {
                            s.fill(T::ZERO);
                        } else {
                            s.copy_from_slice(&before[i * sz..]);
                        }
                        advance(s, &head, t, &mut us[i * dv..(i + 1) * dv], &mut deltas[i * dv..(i + 1) * dv]);
                    }
                    for t in (t0..t1).rev() {
                        let i = t - t0;
                        let at = head.at(t);
                        let (q, k, v) = (head.q(t), head.k(t), head.v(t));
                        let (beta, alpha) = (head.beta[at], head.alpha[t]);
                        let (u, delta) = (&us[i * dv..(i + 1) * dv], &deltas[i * dv..(i + 1) * dv]);
                        let (p, s) = (&states[i * sz..(i + 1) * sz], &states[(i + 1) * sz..(i + 2) * sz]);
                        let p = (!head.restarts(t)).then_some(p);
                        let dout = &dout[at * dv..(at + 1) * dv];
                        let dq = &mut gr.dq[t * d.dk..(t + 1) * d.dk];
                        let dk = &mut gr.dk[t * d.dk..(t + 1) * d.dk];
                        // o = Sᵀq̃, then S = S' + kδᵀ: one pass over the rows of dS.
                        ddelta.fill(T::ZERO);
                        let rows = ds.chunks_exact_mut(dv).zip(s.chunks_exact(dv));
                        for ((((ds_row, s_row), (&qi, &ki)), dq_i), dk_i) in
                            rows.zip(q.iter().zip(k)).zip(dq.iter_mut()).zip(dk.iter_mut())
                        {
                            *dq_i = scale * dot(s_row, dout);
                            let qs = scale * qi;
                            for (dsj, &doj) in ds_row.iter_mut().zip(dout) {
                                *dsj += qs * doj;
                            }
                            *dk_i = dot(ds_row, delta);
                            for (ddj, &dsj) in ddelta.iter_mut().zip(ds_row.iter()) {
                                *ddj += ki * dsj;
                            }
                        }
                        // δ = β(v − u)
                        let mut dbeta = T::ZERO;
                        let dv_t = &mut gr.dv[t * dv..(t + 1) * dv];
                        for ((((dv_j, du_j), &ddj), &vj), &uj) in
                            dv_t.iter_mut().zip(du.iter_mut()).zip(ddelta.iter()).zip(v).zip(u)
                        {
                            dbeta += ddj * (vj - uj);
                            *dv_j = beta * ddj;
                            *du_j = -*dv_j;
                        }
                        // u = S'ᵀk, S' = αP: dS' = dS + k·duᵀ, dk += S'·du, dg = ⟨dS', S'⟩,
                        // dP = α·dS' (and nothing flows past a document start).
                        let (mut dg, carry) = (T::ZERO, if p.is_some() { alpha } else { T::ZERO });
                        for (i, (ds_row, &ki)) in ds.chunks_exact_mut(dv).zip(k).enumerate() {
                            for (dsj, &duj) in ds_row.iter_mut().zip(du.iter()) {
                                *dsj += ki * duj;
                            }
                            if let Some(p) = p {
                                let p_row = &p[i * dv..(i + 1) * dv];
                                dk[i] += alpha * dot(p_row, &du);
                                dg += dot(ds_row, p_row);
                            }
                            ds_row.iter_mut().for_each(|x| *x *= carry);
                        }
                        gr.dbeta[t] = dbeta;
                        gr.dg[t] = alpha * dg;
                    }
                }
                gr
            })
        });
        Ok(tasks.collect::<Vec<_>>())
    })?;
    let of = |f: fn(&HeadGrads<T>) -> &[T]| per_head.iter().map(f).collect::<Vec<_>>();
    let (qk_shape, v_shape, s_shape) = ((d.b, d.t, d.hk, d.dk), (d.b, d.t, d.h, d.dv), (d.b, d.t, d.h));
    Ok([
        tensor(interleave(&d, &of(|g| &g.dq), d.dk, d.rep()), qk_shape)?,
        tensor(interleave(&d, &of(|g| &g.dk), d.dk, d.rep()), qk_shape)?,
        tensor(interleave(&d, &of(|g| &g.dv), d.dv, 1), v_shape)?,
        tensor(interleave(&d, &of(|g| &g.dbeta), 1, 1), s_shape)?,
        tensor(interleave(&d, &of(|g| &g.dg), 1, 1), s_shape)?,
        tensor(ds0, (d.b, d.h, d.dk, d.dv))?,
    ])
}
