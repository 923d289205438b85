//! Attention over the paged cache on the CPU, and the cache write.
//!
//! One task per (sequence, kv head): the task gathers that head's context keys and values from
//! the sequence's blocks into two contiguous `[context, hd]` buffers, stacks the `g` query heads
//! of the group into one `[g·T, hd]` block, and runs scores and output as two GEMMs, with a
//! causal softmax per row in between (row `i` of a head sees keys `0 ..= context − T + i`).
//! Each task returns its block; the blocks are scattered into the output in order, so nothing
//! depends on the thread count.

use super::{MatRef, Real, matmul, max, sum, tensor, with_slices};
use crate::paged_attention::PagedMeta;
use candle_core::{Result, Tensor};
use rayon::prelude::*;

/// `cache[slot] = src[i]` for each `(i, slot)`, rows of `row` elements.
pub(crate) fn write_rows<T: Copy>(
    cache: &mut [T],
    src: &[T],
    slots: &[u32],
    row: usize,
    capacity: usize,
) -> Result<()> {
    if src.len() != slots.len() * row || cache.len() != capacity * row {
        candle_core::bail!("kv write: {} source elements for {} slots of {row}", src.len(), slots.len());
    }
    if let Some(bad) = slots.iter().find(|&&s| s as usize >= capacity) {
        candle_core::bail!("kv write: slot {bad} past the cache's {capacity}");
    }
    for (i, &s) in slots.iter().enumerate() {
        let s = s as usize;
        cache[s * row..(s + 1) * row].copy_from_slice(&src[i * row..(i + 1) * row]);
    }
    Ok(())
}

pub(crate) fn forward<T: Real>(
    q: &Tensor,
    k_cache: &Tensor,
    v_cache: &Tensor,
    meta: &PagedMeta,
    scale: f64,
) -> Result<Tensor> {
    let (n, heads, hd) = q.dims3()?;
    let (_, bs, kv, _) = k_cache.dims4()?;
    let g = heads / kv;
    let tasks: Vec<(usize, usize)> = (0..meta.sequences()).flat_map(|s| (0..kv).map(move |h| (s, h))).collect();
    let mut out = vec![T::ZERO; n * heads * hd];
    with_slices::<T, _, 3>([q, k_cache, v_cache], |[q, kc, vc]| {
        let blocks: Vec<Vec<T>> = tasks
            .par_iter()
            .map(|&(s, h)| {
                let (first, t, ctx, table) = meta.seq(s);
                let gather = |cache: &[T]| {
                    let mut buf = Vec::with_capacity(ctx * hd);
                    for p in 0..ctx {
                        let slot = table[p / bs] as usize * bs + p % bs;
                        let at = (slot * kv + h) * hd;
                        buf.extend_from_slice(&cache[at..at + hd]);
                    }
                    buf
                };
                let (k, v) = (gather(kc), gather(vc));
                let mut qb = Vec::with_capacity(g * t * hd);
                for j in 0..g {
                    for i in 0..t {
                        let at = ((first + i) * heads + h * g + j) * hd;
                        qb.extend_from_slice(&q[at..at + hd]);
                    }
                }
                let mut p = vec![T::ZERO; g * t * ctx];
                matmul(&mut p, g * t, ctx, hd, MatRef::rows(&qb, hd), MatRef::transposed(&k, hd), T::of(scale), false);
                for (r, row) in p.chunks_mut(ctx).enumerate() {
                    let seen = ctx - t + r % t + 1;
                    let (open, closed) = row.split_at_mut(seen);
                    let m = max(open);
                    for x in open.iter_mut() {
                        *x -= m;
                    }
                    T::exp_in_place(open);
                    let inv = T::ONE / sum(open);
                    for x in open.iter_mut() {
                        *x *= inv;
                    }
                    closed.fill(T::ZERO);
                }
                let mut o = vec![T::ZERO; g * t * hd];
                matmul(&mut o, g * t, hd, ctx, MatRef::rows(&p, ctx), MatRef::rows(&v, hd), T::ONE, false);
                o
            })
            .collect();
        for (&(s, h), o) in tasks.iter().zip(&blocks) {
            let (first, t, _, _) = meta.seq(s);
            for j in 0..g {
                for i in 0..t {
                    let at = ((first + i) * heads + h * g + j) * hd;
                    out[at..at + hd].copy_from_slice(&o[(j * t + i) * hd..(j * t + i + 1) * hd]);
                }
            }
        }
        Ok(())
    })?;
    tensor(out, (n, heads, hd))
}
