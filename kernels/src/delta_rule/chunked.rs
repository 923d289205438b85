//! The chunked form of the gated delta rule (flash-linear-attention's `chunk_gated_delta_rule`,
//! the form a GPU chunked kernel computes), in plain f64: the derivation written once where it
//! can be checked against the token-by-token recurrence without a GPU. (A CUDA-core f32 version
//! of it, three kernels, matched the CPU kernel on the H200 but ran the Qwen3.6-27B layer's
//! forward in 11.2 ms against the fused-recurrent kernel's 7.0: the chunked form pays only with
//! its products on the tensor cores.)
//!
//! Per head and chunk of [`CHUNK`] tokens `c0..c0+n`, with `h` the state entering the chunk,
//! `G_i = Σ_{s≤i} g_{c0+s}` (cumulative log-decay inside the chunk), `γ_i = e^{G_i}`, and
//! `same(i, j)` (`j ≤ i` in token `i`'s document: `c0 + j ≥ start_i`):
//!
//! ```text
//! carry_i = start_i = 0 or start_i < c0          token i's document began before the chunk
//!                                                 (or is the row's first: it reads the
//!                                                 initial state), so h reaches it
//! S_i  = γ_i·carry_i·h + Σ_{j≤i, same(i,j)} e^{G_i−G_j} k_j δ_jᵀ
//! δ_j  = β_j (v_j − S'_jᵀ k_j), S'_j = S_j − k_j δ_jᵀ, which unrolls to
//! (I + A) δ = β v − diag(β γ carry) K h,  A_jm = β_j e^{G_j−G_m} k_j·k_m  (m < j, same(j, m))
//! so δ = U − W h with U = (I + A)⁻¹ (β v), W = (I + A)⁻¹ (β γ carry k)   (the WY/UT form)
//! o_i  = scale·(γ_i carry_i q_iᵀ h + Σ_{j≤i, same(i,j)} e^{G_i−G_j} (q_i·k_j) δ_j)
//! h'   = S_last
//! ```
//!
//! A is strictly lower triangular and zero across documents, so (I + A)⁻¹ is a forward
//! substitution that never mixes documents: a document start inside a chunk needs only the
//! masks and `carry`.

use super::{CHUNK, Dims, Operands};
use candle_core::{Result, Tensor};

/// `(out, final state, checkpoints)` in f64, as [`super::reference::forward`] returns them with
/// `keep`; `starts` per token as [`crate::attention::Mask::starts`] gives them.
pub(super) fn forward(x: &Operands, s0: &Tensor, starts: &[u32]) -> Result<(Tensor, Tensor, Tensor)> {
    let d = Dims::of(x)?;
    let flat = |t: &Tensor| t.to_dtype(candle_core::DType::F64)?.flatten_all()?.to_vec1::<f64>();
    let (q, k, v, beta, g, s0v) = (flat(x.q)?, flat(x.k)?, flat(x.v)?, flat(x.beta)?, flat(x.g)?, flat(s0)?);
    let (dk, dv, sz) = (d.dk, d.dv, d.dk * d.dv);
    let mut out = vec![0.0; d.b * d.t * d.h * dv];
    let mut state = vec![0.0; d.b * d.h * sz];
    let mut kept = vec![0.0; d.b * d.h * d.chunks() * sz];
    for b in 0..d.b {
        for hh in 0..d.h {
            let hq = hh / d.rep();
            let tok = |t: usize| (b * d.t + t) * d.h + hh;
            let qk_row = |t: usize| ((b * d.t + t) * d.hk + hq) * dk;
            let mut h = s0v[(b * d.h + hh) * sz..][..sz].to_vec();
            for c in 0..d.chunks() {
                kept[((b * d.h + hh) * d.chunks() + c) * sz..][..sz].copy_from_slice(&h);
                let (c0, n) = (c * CHUNK, CHUNK.min(d.t - c * CHUNK));
                let start: Vec<usize> = (0..n).map(|i| starts[b * d.t + c0 + i] as usize).collect();
                let same = |i: usize, j: usize| c0 + j >= start[i];
                let carry: Vec<f64> = start.iter().map(|&s| f64::from(s == 0 || s < c0)).collect();
                let mut gc = vec![0.0; n];
                let mut acc = 0.0;
                for (i, gi) in gc.iter_mut().enumerate() {
                    acc += g[tok(c0 + i)];
                    *gi = acc;
                }
                let kr = |i: usize| &k[qk_row(c0 + i)..][..dk];
                let dot = |a: &[f64], b: &[f64]| a.iter().zip(b).map(|(x, y)| x * y).sum::<f64>();
                // A, then U and W by forward substitution over the chunk's rows (each right-hand
                // side column on its own), then δ = U − W h.
                let mut a = vec![0.0; n * n];
                for i in 0..n {
                    for m in (0..i).filter(|&m| same(i, m)) {
                        a[i * n + m] = beta[tok(c0 + i)] * (gc[i] - gc[m]).exp() * dot(kr(i), kr(m));
                    }
                }
                // Rows of [β v | β γ carry k], solved in place.
                let mut uw = vec![0.0; n * (dv + dk)];
                for i in 0..n {
                    let bi = beta[tok(c0 + i)];
                    for col in 0..dv + dk {
                        let rhs = if col < dv {
                            bi * v[tok(c0 + i) * dv + col]
                        } else {
                            bi * gc[i].exp() * carry[i] * kr(i)[col - dv]
                        };
                        let solved: f64 = (0..i).map(|m| a[i * n + m] * uw[m * (dv + dk) + col]).sum();
                        uw[i * (dv + dk) + col] = rhs - solved;
                    }
                }
                let mut delta = vec![0.0; n * dv];
                for i in 0..n {
                    let w = &uw[i * (dv + dk) + dv..][..dk];
                    for col in 0..dv {
                        let wh: f64 = (0..dk).map(|r| w[r] * h[r * dv + col]).sum();
                        delta[i * dv + col] = uw[i * (dv + dk) + col] - wh;
                    }
                }
                for i in 0..n {
                    let qi = &q[qk_row(c0 + i)..][..dk];
                    for col in 0..dv {
                        let qh: f64 = (0..dk).map(|r| qi[r] * h[r * dv + col]).sum();
                        let mut o = gc[i].exp() * carry[i] * qh;
                        for j in (0..=i).filter(|&j| same(i, j)) {
                            o += (gc[i] - gc[j]).exp() * dot(qi, kr(j)) * delta[j * dv + col];
                        }
                        out[tok(c0 + i) * dv + col] = x.scale * o;
                    }
                }
                let last = n - 1;
                let mut next: Vec<f64> = h.iter().map(|s| gc[last].exp() * carry[last] * s).collect();
                for j in (0..n).filter(|&j| same(last, j)) {
                    let w = (gc[last] - gc[j]).exp();
                    for r in 0..dk {
                        for col in 0..dv {
                            next[r * dv + col] += w * kr(j)[r] * delta[j * dv + col];
                        }
                    }
                }
                h = next;
            }
            state[(b * d.h + hh) * sz..][..sz].copy_from_slice(&h);
        }
    }
    let dev = x.q.device();
    Ok((
        Tensor::from_vec(out, (d.b, d.t, d.h, dv), dev)?,
        Tensor::from_vec(state, (d.b, d.h, dk, dv), dev)?,
        Tensor::from_vec(kept, (d.b, d.h, d.chunks(), dk, dv), dev)?,
    ))
}

#[cfg(test)]
mod tests {
    use super::super::case::{Case, beta_of, decay_of};
    use super::super::reference;
    use super::*;
    use crate::attention::Mask;
    use crate::gradcheck::{assert_close, fresh_seed, random};
    use candle_core::Device;

    #[test]
    fn the_chunked_form_equals_the_recurrence() -> Result<()> {
        // T not a multiple of the chunk, documents starting inside chunks, at a chunk's first
        // token and at a chunk's last token, GQA of 3 and 2, with and without an initial state;
        // row 0's document starts beside each case (row 1, if any, is one document).
        let cases: [(Case, &[usize]); 3] = [
            (Case { b: 2, t: 150, hk: 1, h: 3, dk: 6, dv: 5 }, &[0, 40, 64, 127]),
            (Case { b: 1, t: 130, hk: 2, h: 4, dk: 3, dv: 4 }, &[0, 1, 63, 100]),
            (Case { b: 2, t: 64, hk: 2, h: 2, dk: 4, dv: 2 }, &[0]),
        ];
        let dev = Device::Cpu;
        for (c, docs) in cases {
            let Case { b, t, .. } = c;
            let seed = fresh_seed();
            let r = |shape: &[usize], i: u64| random(shape, seed.wrapping_add(i), &dev);
            let beta = beta_of(&(r(&c.gates(), 3)? * 2.2)?)?;
            let x = [r(&c.qk(), 0)?, r(&c.qk(), 1)?, r(&c.v(), 2)?, beta, decay_of(&r(&c.gates(), 4)?)?];
            let ops = Operands::of(&x, c.scale());
            let ids: Vec<u32> =
                (0..b * t).map(|i| if i < t { docs.iter().filter(|&&s| s <= i).count() as u32 } else { 99 }).collect();
            let mask = Mask::new(&ids, b, t)?;
            for s0 in [Tensor::zeros(&c.state(), candle_core::DType::F64, &dev)?, r(&c.state(), 5)?] {
                let want = reference::forward(&ops, &s0, Some(mask.starts()), true)?;
                let got = forward(&ops, &s0, mask.starts())?;
                for (what, g, w) in
                    [("out", &got.0, &want.0), ("state", &got.1, &want.1), ("checkpoints", &got.2, &want.2)]
                {
                    assert_close(g, w, 1e-11).map_err(|e| {
                        candle_core::Error::Msg(format!("{what} t={t} docs {docs:?} (seed {seed}): {e}"))
                    })?;
                }
            }
        }
        Ok(())
    }
}
