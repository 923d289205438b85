//! Elementwise ops: SwiGLU and RoPE, in parallel over fixed-size chunks.

use super::{Real, tensor, with_slices};
use candle_core::{Result, Tensor};
use rayon::prelude::*;

/// Elements per parallel task: large enough to amortise scheduling, small enough to split.
const CHUNK: usize = 16 * 1024;

/// `σ(g)` into `sig` (through `exp(−g)`, vectorised).
pub(crate) fn sigmoid<T: Real>(g: &[T], sig: &mut [T]) {
    sig.iter_mut().zip(g).for_each(|(s, &g)| *s = -g);
    T::exp_in_place(sig);
    sig.iter_mut().for_each(|s| *s = T::ONE / (T::ONE + *s));
}

pub(crate) fn swiglu_forward<T: Real>(gate: &Tensor, up: &Tensor) -> Result<Tensor> {
    let mut h = vec![T::ZERO; gate.elem_count()];
    with_slices::<T, _, 2>([gate, up], |[g, u]| {
        h.par_chunks_mut(CHUNK).zip(g.par_chunks(CHUNK)).zip(u.par_chunks(CHUNK)).for_each(|((h, g), u)| {
            sigmoid(g, h);
            for ((h, &g), &u) in h.iter_mut().zip(g).zip(u) {
                *h = g * *h * u;
            }
        });
        Ok(())
    })?;
    tensor(h, gate.shape().clone())
}

pub(crate) fn swiglu_backward<T: Real>(dh: &Tensor, gate: &Tensor, up: &Tensor) -> Result<(Tensor, Tensor)> {
    let n = gate.elem_count();
    let (mut dg, mut du) = (vec![T::ZERO; n], vec![T::ZERO; n]);
    with_slices::<T, _, 3>([dh, gate, up], |[dh, g, u]| {
        let out = dg.par_chunks_mut(CHUNK).zip(du.par_chunks_mut(CHUNK));
        out.zip(dh.par_chunks(CHUNK)).zip(g.par_chunks(CHUNK).zip(u.par_chunks(CHUNK))).for_each(
            |(((dg, du), dh), (g, u))| {
                sigmoid(g, dg);
                for ((((dg, du), &dh), &g), &u) in dg.iter_mut().zip(du.iter_mut()).zip(dh).zip(g).zip(u) {
                    let sig = *dg;
                    let silu = g * sig;
                    // d silu/dg = σ + silu·(1 − σ)
                    *dg = dh * u * (sig + silu * (T::ONE - sig));
                    *du = dh * silu;
                }
            },
        );
        Ok(())
    })?;
    Ok((tensor(dg, gate.shape().clone())?, tensor(du, gate.shape().clone())?))
}

/// RoPE on `x` `[N, heads, hd]` with tables `[N, hd]` (one row per token, shared by its
/// heads). `transposed` applies the map's transpose (the backward).
pub(crate) fn rope<T: Real>(x: &Tensor, cos: &Tensor, sin: &Tensor, transposed: bool) -> Result<Tensor> {
    let hd = x.dim(candle_core::D::Minus1)?;
    let half = hd / 2;
    let per_token = x.elem_count() / cos.elem_count().max(1) * hd;
    let mut y = vec![T::ZERO; x.elem_count()];
    with_slices::<T, _, 3>([x, cos, sin], |[x, cos, sin]| {
        y.par_chunks_mut(per_token).zip(x.par_chunks(per_token)).enumerate().for_each(|(n, (y, x))| {
            let (c, s) = (&cos[n * hd..(n + 1) * hd], &sin[n * hd..(n + 1) * hd]);
            for (y, x) in y.chunks_exact_mut(hd).zip(x.chunks_exact(hd)) {
                for i in 0..half {
                    let (a, b) = (x[i], x[i + half]);
                    if transposed {
                        // dx = dy·cos + rotate_halfᵀ(dy·sin), rotate_halfᵀ([g₁, g₂]) = [g₂, −g₁]
                        y[i] = a * c[i] + b * s[i + half];
                        y[i + half] = b * c[i + half] - a * s[i];
                    } else {
                        // y = x·cos + rotate_half(x)·sin, rotate_half([x₁, x₂]) = [−x₂, x₁]
                        y[i] = a * c[i] - b * s[i];
                        y[i + half] = b * c[i + half] + a * s[i + half];
                    }
                }
            }
        });
        Ok(())
    })?;
    tensor(y, x.shape().clone())
}
