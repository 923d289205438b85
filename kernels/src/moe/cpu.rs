//! The fused CPU kernels of the MoE ops (f32 and f64): tasks over fixed blocks of rows (the
//! plan's tile) handed out in the plan's expert order, each GEMM a single-threaded call on its
//! block, every sum in an order fixed by the routing alone.

use candle_core::{DType, Result, Tensor};
use rayon::prelude::*;

use super::grouped::{GradTerm, Term};
use super::router::{LossTerms, Routing, compute_dtype};
use super::{ExpertOrder, Groups};
use crate::KernelConfig;
use crate::cpu::{MatRef, Real, matmul_ld, tensor, with_slices};

/// Rows of `dW` per weight-gradient task (the sum over an expert's rows stays in one task).
const DW_ROWS: usize = 32;

// ---- router ----

pub(crate) fn router_forward(logits: &Tensor, k: usize, norm_topk: bool) -> Result<Routing> {
    match logits.dtype() {
        DType::F64 => router_forward_typed::<f64>(logits, k, norm_topk),
        _ => router_forward_typed::<f32>(&logits.to_dtype(DType::F32)?, k, norm_topk),
    }
    .and_then(|mut r| {
        r.weights = r.weights.to_dtype(logits.dtype())?;
        Ok(r)
    })
}

fn router_forward_typed<T: Real>(logits: &Tensor, k: usize, norm_topk: bool) -> Result<Routing> {
    let (n, e) = logits.dims2()?;
    let (mut probs, mut lse) = (vec![T::ZERO; n * e], vec![T::ZERO; n]);
    let (mut experts, mut weights) = (vec![0u32; n * k], vec![T::ZERO; n * k]);
    with_slices::<T, _, 1>([logits], |[l]| {
        probs
            .par_chunks_mut(e)
            .zip(lse.par_iter_mut())
            .zip(experts.par_chunks_mut(k).zip(weights.par_chunks_mut(k)))
            .enumerate()
            .for_each(|(t, ((p, lse), (ex, w)))| {
                let row = &l[t * e..(t + 1) * e];
                let m = crate::cpu::max(row);
                for (pi, &x) in p.iter_mut().zip(row) {
                    *pi = x - m;
                }
                T::exp_in_place(p);
                let s = crate::cpu::sum(p);
                let inv = T::ONE / s;
                p.iter_mut().for_each(|v| *v *= inv);
                *lse = m + s.ln();
                top_k(p, ex);
                let mut total = T::ZERO;
                for (wi, &i) in w.iter_mut().zip(ex.iter()) {
                    *wi = p[i as usize];
                    total += *wi;
                }
                if norm_topk {
                    w.iter_mut().for_each(|v| *v = v.div(total));
                }
            });
        Ok(())
    })?;
    Ok(Routing {
        probs: tensor(probs, (n, e))?,
        lse: tensor(lse, n)?,
        experts: Tensor::from_vec(experts, (n, k), &candle_core::Device::Cpu)?,
        weights: tensor(weights, (n, k))?,
        norm_topk,
    })
}

/// The `out.len()` largest of `p`, largest first, ties to the lower index: repeated selection
/// (k is small next to the experts: 8 of 128).
fn top_k<T: Real>(p: &[T], out: &mut [u32]) {
    for slot in 0..out.len() {
        let mut best = usize::MAX;
        for (i, &v) in p.iter().enumerate() {
            if !out[..slot].contains(&(i as u32)) && (best == usize::MAX || v > p[best]) {
                best = i;
            }
        }
        out[slot] = best as u32;
    }
}

pub(crate) fn router_backward(d_weights: &Tensor, routing: &Routing, terms: &LossTerms) -> Result<Tensor> {
    let cdt = compute_dtype(d_weights.dtype());
    let d = match cdt {
        DType::F64 => router_backward_typed::<f64>(d_weights, routing, terms),
        _ => router_backward_typed::<f32>(&d_weights.to_dtype(DType::F32)?, routing, terms),
    }?;
    d.to_dtype(d_weights.dtype())
}

fn router_backward_typed<T: Real>(dw: &Tensor, routing: &Routing, terms: &LossTerms) -> Result<Tensor> {
    let (n, e, k) = (routing.tokens(), routing.num_experts(), routing.k());
    let cdt = T::DTYPE;
    let probs = routing.probs.to_dtype(cdt)?;
    let lse = routing.lse.to_dtype(cdt)?;
    let balance = match &terms.balance {
        Some(b) => b.to_dtype(cdt)?,
        None => Tensor::zeros(e, cdt, &candle_core::Device::Cpu)?,
    };
    let counted = match &terms.counted {
        Some(c) => c.to_dtype(cdt)?,
        None => Tensor::ones(n, cdt, &candle_core::Device::Cpu)?,
    };
    let experts = routing.experts.flatten_all()?.to_vec1::<u32>()?;
    let z = T::of(terms.z);
    let two = T::of(2.0);
    let mut out = vec![T::ZERO; n * e];
    with_slices::<T, _, 5>([dw, &probs, &lse, &balance, &counted], |[dw, p, lse, balance, counted]| {
        out.par_chunks_mut(e).enumerate().for_each(|(t, o)| {
            let p = &p[t * e..(t + 1) * e];
            let c = counted[t];
            // o holds dp first, then the logits' gradient.
            for (oi, &b) in o.iter_mut().zip(balance) {
                *oi = b * c;
            }
            let chosen = &experts[t * k..(t + 1) * k];
            let dwt = &dw[t * k..(t + 1) * k];
            if routing.norm_topk {
                let mut s = T::ZERO;
                for &i in chosen {
                    s += p[i as usize];
                }
                let mut dot = T::ZERO;
                for (&i, &d) in chosen.iter().zip(dwt) {
                    dot += d * (p[i as usize] / s);
                }
                for (&i, &d) in chosen.iter().zip(dwt) {
                    o[i as usize] += (d - dot) / s;
                }
            } else {
                for (&i, &d) in chosen.iter().zip(dwt) {
                    o[i as usize] += d;
                }
            }
            let inner = crate::cpu::dot(p, o);
            let zt = z * c * two * lse[t];
            for (oi, &pi) in o.iter_mut().zip(p) {
                *oi = pi * (*oi - inner) + zt * pi;
            }
        });
        Ok(())
    })?;
    tensor(out, (n, e))
}

// ---- grouped GEMMs ----

/// One task: sorted rows `p0..p1` of expert `e`.
#[derive(Clone, Copy)]
struct Task {
    e: usize,
    p0: usize,
    p1: usize,
}

/// The row blocks of every expert, in the plan's order; returns them with the blocks in row
/// order too (the output is split along those).
fn tasks(cfg: &KernelConfig, groups: &Groups) -> Result<(Vec<Task>, Vec<usize>)> {
    let h = groups.host()?;
    let rows = cfg.moe().tile.dims().0;
    let mut by_row = Vec::new();
    for e in 0..groups.num_experts {
        let mut p = h.offsets[e];
        while p < h.offsets[e + 1] {
            let p1 = (p + rows).min(h.offsets[e + 1]);
            by_row.push(Task { e, p0: p, p1 });
            p = p1;
        }
    }
    let mut order: Vec<usize> = (0..by_row.len()).collect();
    if cfg.moe().order == ExpertOrder::LargestFirst {
        let rank: Vec<usize> = {
            let mut r = vec![0; groups.num_experts];
            for (i, &e) in h.by_size.iter().enumerate() {
                r[e as usize] = i;
            }
            r
        };
        order.sort_by_key(|&i| (rank[by_row[i].e], i));
    }
    Ok((by_row, order))
}

/// Splits `out` (`rows × width`) into the tasks' row blocks and runs `f` on each, in the
/// plan's order.
fn for_each_block<T: Real>(
    out: &mut [T],
    width: usize,
    by_row: &[Task],
    order: &[usize],
    f: impl Fn(Task, &mut [T]) + Sync + Send,
) {
    let mut blocks: Vec<Option<&mut [T]>> = Vec::with_capacity(by_row.len());
    let mut rest = out;
    for t in by_row {
        let (head, tail) = rest.split_at_mut((t.p1 - t.p0) * width);
        blocks.push(Some(head));
        rest = tail;
    }
    let mut work: Vec<(Task, &mut [T])> = Vec::with_capacity(order.len());
    for &i in order {
        if let Some(b) = blocks[i].take() {
            work.push((by_row[i], b));
        }
    }
    work.into_par_iter().for_each(|(t, b)| f(t, b));
}

/// Rows `p0..p1` of an operand: read in place when sorted, gathered into `buf` when not.
fn rows_of<'a, T: Real>(
    x: &'a [T],
    cols: usize,
    gathered: Option<&[u32]>,
    p0: usize,
    p1: usize,
    buf: &'a mut Vec<T>,
) -> &'a [T] {
    match gathered {
        None => &x[p0 * cols..p1 * cols],
        Some(rows) => {
            buf.clear();
            for &r in &rows[p0..p1] {
                buf.extend_from_slice(&x[r as usize * cols..(r as usize + 1) * cols]);
            }
            buf
        }
    }
}

pub(crate) fn grouped_forward<T: Real>(
    cfg: &KernelConfig,
    groups: &Groups,
    terms: &[Term<'_>],
    width: usize,
) -> Result<Tensor> {
    let m = groups.len();
    let h = groups.host()?;
    let (by_row, order) = tasks(cfg, groups)?;
    let pairs: Vec<(&Tensor, &Tensor)> = terms.iter().map(|t| (t.x, t.w)).collect();
    with_pair_slices::<T, _>(&pairs, |slices| {
        let shapes: Vec<(usize, usize, usize, bool)> =
            terms.iter().map(|t| Ok((t.w.dim(1)?, t.w.dim(2)?, t.col, t.gathered))).collect::<Result<_>>()?;
        let mut y = vec![T::ZERO; m * width];
        for_each_block(&mut y, width, &by_row, &order, |task, out| {
            let mut buf = Vec::new();
            for ((x, w), &(o, d_in, col, gathered)) in slices.iter().zip(&shapes) {
                let rows = task.p1 - task.p0;
                let a = rows_of(x, d_in, gathered.then_some(h.rows.as_slice()), task.p0, task.p1, &mut buf);
                let we = &w[task.e * o * d_in..(task.e + 1) * o * d_in];
                // Every term adds into its columns; the first write to a column starts from zero.
                matmul_ld(
                    &mut out[col..],
                    width,
                    rows,
                    o,
                    d_in,
                    MatRef::rows(a, d_in),
                    MatRef::transposed(we, d_in),
                    T::ONE,
                    true,
                );
            }
        });
        tensor(y, (m, width))
    })
}

/// Runs `f` on the slices of each `(a, b)` pair of tensors (made contiguous first).
fn with_pair_slices<T: Real, R>(
    pairs: &[(&Tensor, &Tensor)],
    f: impl FnOnce(&[(&[T], &[T])]) -> Result<R>,
) -> Result<R> {
    use crate::cpu::View;
    let owned: Vec<(Tensor, Tensor)> =
        pairs.iter().map(|(a, b)| Ok((a.contiguous()?, b.contiguous()?))).collect::<Result<_>>()?;
    let views: Vec<(View, View)> =
        owned.iter().map(|(a, b)| Ok((View::of(a)?, View::of(b)?))).collect::<Result<_>>()?;
    let slices: Vec<(&[T], &[T])> =
        views.iter().map(|(a, b)| Ok((a.slice::<T>()?, b.slice::<T>()?))).collect::<Result<_>>()?;
    f(&slices)
}

pub(crate) fn grouped_input_grad<T: Real>(
    cfg: &KernelConfig,
    groups: &Groups,
    terms: &[GradTerm<'_>],
) -> Result<Tensor> {
    let m = groups.len();
    let d_in = terms[0].w.dim(2)?;
    let (by_row, order) = tasks(cfg, groups)?;
    let pairs: Vec<(&Tensor, &Tensor)> = terms.iter().map(|t| (t.dy, t.w)).collect();
    with_pair_slices::<T, _>(&pairs, |slices| {
        let shapes: Vec<(usize, usize, usize)> =
            terms.iter().map(|t| Ok((t.dy.dim(1)?, t.w.dim(1)?, t.col))).collect::<Result<_>>()?;
        let mut dx = vec![T::ZERO; m * d_in];
        for_each_block(&mut dx, d_in, &by_row, &order, |task, out| {
            for (i, ((dy, w), &(dy_w, o, col))) in slices.iter().zip(&shapes).enumerate() {
                let rows = task.p1 - task.p0;
                let a = MatRef { data: &dy[task.p0 * dy_w + col..], rs: dy_w, cs: 1 };
                let we = &w[task.e * o * d_in..(task.e + 1) * o * d_in];
                matmul_ld(out, d_in, rows, d_in, o, a, MatRef::rows(we, d_in), T::ONE, i > 0);
            }
        });
        tensor(dx, (m, d_in))
    })
}

pub(crate) fn grouped_weight_grad<T: Real>(
    cfg: &KernelConfig,
    groups: &Groups,
    dy: &Tensor,
    col: usize,
    out: usize,
    x: &Tensor,
    gathered: bool,
) -> Result<Tensor> {
    let h = groups.host()?;
    let (e_n, d_in, dy_w) = (groups.num_experts, x.dim(1)?, dy.dim(1)?);
    let mut experts: Vec<usize> = (0..e_n).collect();
    if cfg.moe().order == ExpertOrder::LargestFirst {
        experts = h.by_size.iter().map(|&e| e as usize).collect();
    }
    let mut dw = vec![T::ZERO; e_n * out * d_in];
    with_slices::<T, _, 2>([dy, x], |[dy, x]| {
        let mut per: Vec<Option<&mut [T]>> = dw.chunks_mut(out * d_in).map(Some).collect();
        let work: Vec<(usize, &mut [T])> = experts.iter().filter_map(|&e| per[e].take().map(|b| (e, b))).collect();
        work.into_par_iter().for_each(|(e, dwe)| {
            let (p0, p1) = (h.offsets[e], h.offsets[e + 1]);
            if p0 == p1 {
                return;
            }
            let mut buf = Vec::new();
            let xe = rows_of(x, d_in, gathered.then_some(h.rows.as_slice()), p0, p1, &mut buf);
            dwe.par_chunks_mut(DW_ROWS * d_in).enumerate().for_each(|(blk, d)| {
                let o0 = blk * DW_ROWS;
                // Columns col + o0.. of this expert's dy rows, read as the rows of dyᵀ.
                let a = MatRef { data: &dy[p0 * dy_w + col + o0..], rs: 1, cs: dy_w };
                let r = d.len() / d_in;
                matmul_ld(d, d_in, r, d_in, p1 - p0, a, MatRef::rows(xe, d_in), T::ONE, false);
            });
        });
        Ok(())
    })?;
    tensor(dw, (e_n, out, d_in))
}

// ---- SwiGLU on [gate | up] ----

pub(crate) fn glu_forward<T: Real>(gu: &Tensor) -> Result<Tensor> {
    let (m, w) = gu.dims2()?;
    let f = w / 2;
    let mut out = vec![T::ZERO; m * f];
    with_slices::<T, _, 1>([gu], |[gu]| {
        out.par_chunks_mut(f).zip(gu.par_chunks(w)).for_each(|(o, row)| {
            let (g, u) = row.split_at(f);
            o.copy_from_slice(g);
            o.iter_mut().for_each(|v| *v = -*v);
            T::exp_in_place(o);
            for ((oi, &gi), &ui) in o.iter_mut().zip(g).zip(u) {
                *oi = gi / (T::ONE + *oi) * ui;
            }
        });
        Ok(())
    })?;
    tensor(out, (m, f))
}

pub(crate) fn glu_backward<T: Real>(dm: &Tensor, gu: &Tensor) -> Result<Tensor> {
    let (m, w) = gu.dims2()?;
    let f = w / 2;
    let mut out = vec![T::ZERO; m * w];
    with_slices::<T, _, 2>([dm, gu], |[dm, gu]| {
        out.par_chunks_mut(w).zip(gu.par_chunks(w)).zip(dm.par_chunks(f)).for_each(|((o, row), d)| {
            let (g, u) = row.split_at(f);
            let (og, ou) = o.split_at_mut(f);
            og.copy_from_slice(g);
            og.iter_mut().for_each(|v| *v = -*v);
            T::exp_in_place(og);
            for i in 0..f {
                let sig = T::ONE / (T::ONE + og[i]);
                let silu = g[i] * sig;
                ou[i] = d[i] * silu;
                og[i] = d[i] * u[i] * (sig + silu * (T::ONE - sig));
            }
        });
        Ok(())
    })?;
    tensor(out, (m, w))
}

// ---- back to token order ----

pub(crate) fn combine_forward<T: Real>(y: &Tensor, weights: &Tensor, groups: &Groups) -> Result<Tensor> {
    let (k, h) = (groups.k, y.dim(1)?);
    let pos = groups.host()?.positions.clone();
    let mut out = vec![T::ZERO; groups.tokens * h];
    with_slices::<T, _, 2>([y, weights], |[y, w]| {
        out.par_chunks_mut(h.max(1)).enumerate().for_each(|(t, o)| {
            for j in 0..k {
                let (p, wt) = (pos[t * k + j] as usize, w[t * k + j]);
                for (oi, &v) in o.iter_mut().zip(&y[p * h..(p + 1) * h]) {
                    *oi += wt * v;
                }
            }
        });
        Ok(())
    })?;
    tensor(out, (groups.tokens, h))
}

pub(crate) fn combine_backward<T: Real>(
    dout: &Tensor,
    y: &Tensor,
    weights: &Tensor,
    groups: &Groups,
) -> Result<(Tensor, Tensor)> {
    let (k, h) = (groups.k, y.dim(1)?);
    let host = groups.host()?;
    let mut dy = vec![T::ZERO; groups.len() * h];
    let mut dw = vec![T::ZERO; groups.tokens * k];
    with_slices::<T, _, 3>([dout, y, weights], |[dout, y, w]| {
        dy.par_chunks_mut(h.max(1)).enumerate().for_each(|(p, d)| {
            let (t, s) = (host.rows[p] as usize, host.slots[p] as usize);
            for (di, &g) in d.iter_mut().zip(&dout[t * h..(t + 1) * h]) {
                *di = w[s] * g;
            }
        });
        dw.par_chunks_mut(k).enumerate().for_each(|(t, d)| {
            for (j, dj) in d.iter_mut().enumerate() {
                let p = host.positions[t * k + j] as usize;
                *dj = crate::cpu::dot(&dout[t * h..(t + 1) * h], &y[p * h..(p + 1) * h]);
            }
        });
        Ok(())
    })?;
    Ok((tensor(dy, (groups.len(), h))?, tensor(dw, (groups.tokens, k))?))
}

pub(crate) fn scatter_sum<T: Real>(dxs: &Tensor, groups: &Groups) -> Result<Tensor> {
    let (k, d) = (groups.k, dxs.dim(1)?);
    let pos = groups.host()?.positions.clone();
    let mut out = vec![T::ZERO; groups.tokens * d];
    with_slices::<T, _, 1>([dxs], |[x]| {
        out.par_chunks_mut(d.max(1)).enumerate().for_each(|(t, o)| {
            for j in 0..k {
                let p = pos[t * k + j] as usize;
                for (oi, &v) in o.iter_mut().zip(&x[p * d..(p + 1) * d]) {
                    *oi += v;
                }
            }
        });
        Ok(())
    })?;
    tensor(out, (groups.tokens, d))
}
