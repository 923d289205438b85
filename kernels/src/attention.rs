//! Scaled dot-product attention with grouped-query heads and a causal, per-document mask.
//!
//! [`forward`] and [`backward`] run the fused CPU kernel (`crate::cpu::attention`) for f32
//! and f64 CPU tensors and the composed [`reference`] on other devices; tests compare the
//! two and check both against finite differences. [`cached`] is the decode path: new
//! queries over a key/value cache.

pub mod cached;
mod choice;

pub use choice::{AttentionKernels, KEY_TILES, MAX_DQ_SPLITS};

use crate::KernelConfig;
use crate::cpu::{self, dispatch};
use crate::on_gpu_or;
use candle_core::{D, DType, Device, Result, Tensor};

/// Which keys each query may attend: token `i` sees `j` when `starts[i] ≤ j ≤ i` (causal,
/// and within its packed document, whose tokens are contiguous). The diagonal is always
/// open, so no row is empty (padding, segment 0, attends to earlier padding and carries no
/// loss).
#[derive(Debug, Clone)]
pub struct Mask {
    batch: usize,
    seq: usize,
    starts: Vec<u32>,
}

impl Mask {
    pub fn new(segment_ids: &[u32], batch: usize, seq: usize) -> Result<Mask> {
        if segment_ids.len() != batch * seq {
            candle_core::bail!("attention mask: {} segment ids for {batch}×{seq} tokens", segment_ids.len());
        }
        let mut starts = Vec::with_capacity(batch * seq);
        for row in segment_ids.chunks_exact(seq.max(1)) {
            let mut start = 0;
            for (i, s) in row.iter().enumerate() {
                if i > 0 && *s != row[i - 1] {
                    start = i;
                }
                starts.push(start as u32);
            }
        }
        Ok(Mask { batch, seq, starts })
    }

    /// The additive form `[B, 1, T, T]` (0 allowed, −∞ masked) for the composed reference.
    pub fn bias(&self, dtype: DType, device: &Device) -> Result<Tensor> {
        let (b, t) = (self.batch, self.seq);
        let mut bias = vec![f32::NEG_INFINITY; b * t * t];
        for bi in 0..b {
            for i in 0..t {
                let start = self.starts[bi * t + i] as usize;
                bias[(bi * t + i) * t + start..=(bi * t + i) * t + i].fill(0.0);
            }
        }
        Tensor::from_vec(bias, (b, 1, t, t), device)?.to_dtype(dtype)
    }

    /// Per token, the first key it may attend (for the recurrent ops: the first token of its
    /// document, where their state restarts).
    pub(crate) fn starts(&self) -> &[u32] {
        &self.starts
    }

    fn check(&self, q: &Tensor) -> Result<()> {
        let (b, _, t, _) = q.dims4()?;
        self.check_tokens("attention", b, t)
    }

    /// The mask is for `b` rows of `t` tokens (`op` names the caller in the error).
    pub(crate) fn check_tokens(&self, op: &str, b: usize, t: usize) -> Result<()> {
        if (b, t) != (self.batch, self.seq) {
            candle_core::bail!("{op}: mask for {}×{} tokens, the input has {b}×{t}", self.batch, self.seq);
        }
        Ok(())
    }
}

fn check_heads(q: &Tensor, k: &Tensor) -> Result<()> {
    let heads = q.dim(1)?;
    let kv = k.dim(1)?;
    if kv == 0 || !heads.is_multiple_of(kv) {
        candle_core::bail!("attention: {heads} query heads do not group over {kv} kv heads");
    }
    Ok(())
}

/// `q`: `[B, heads, T, hd]`, `k`, `v`: `[B, kv_heads, T, hd]`. Returns the output
/// `[B, heads, T, hd]` and the row log-sum-exp of the scaled, masked scores `[B, heads, T]`,
/// from which the backward recomputes the probabilities (no T×T matrix is kept). On a GPU,
/// `cfg` picks the flash kernel.
pub fn forward(
    cfg: &KernelConfig,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    mask: &Mask,
    scale: f64,
) -> Result<(Tensor, Tensor)> {
    let _profile = crate::profile::scope("attention fwd", q.device());
    mask.check(q)?;
    check_heads(q, k)?;
    #[cfg(feature = "cuda")]
    use crate::gpu::attention::forward as gpu;
    use cpu::attention::forward as fused;
    let cpu_or_reference =
        || dispatch!([q, k, v], fused(q, k, v, &mask.starts, scale), reference::forward(q, k, v, mask, scale));
    #[cfg(not(feature = "cuda"))]
    let _ = cfg;
    on_gpu_or!([q, k, v], gpu(q, k, v, mask, scale, cfg.attention()), cpu_or_reference())
}

/// Gradients `(dq, dk, dv)` of [`forward`]; `dout` is `[B, heads, T, hd]`, `out` and `lse`
/// the forward's outputs. `out` serves the GPU flash kernels, which take the softmax
/// backward's row term D = rowsum(dout∘out) from it instead of another pass over the keys;
/// the CPU kernels compute D with the scores they already have.
#[allow(clippy::too_many_arguments)]
pub fn backward(
    cfg: &KernelConfig,
    dout: &Tensor,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    out: &Tensor,
    lse: &Tensor,
    mask: &Mask,
    scale: f64,
) -> Result<(Tensor, Tensor, Tensor)> {
    let _profile = crate::profile::scope("attention bwd", q.device());
    mask.check(q)?;
    check_heads(q, k)?;
    #[cfg(feature = "cuda")]
    use crate::gpu::attention::backward as gpu;
    use cpu::attention::backward as fused;
    let cpu_or_reference = || {
        dispatch!(
            [dout, q, k, v, lse],
            fused(dout, q, k, v, lse, &mask.starts, scale),
            reference::backward(dout, q, k, v, lse, mask, scale)
        )
    };
    #[cfg(not(feature = "cuda"))]
    let _ = (cfg, out);
    on_gpu_or!([dout, q, k, v], gpu(dout, q, k, v, out, lse, mask, scale, cfg.attention()), cpu_or_reference())
}

/// The composed form, on any candle device: the referee of the fused kernels.
///
/// GQA without copying keys: the `g = heads / kv_heads` query heads that share a kv head
/// are stacked along the token axis (`[B, kv, g·T, hd]`, a free reshape of
/// `[B, heads, T, hd]` because HF orders head `h` under kv head `h / g`), so every product
/// is one batched GEMM against the unrepeated k and v, and `dk`, `dv` sum over the group.
pub mod reference {
    use super::*;

    /// Scaled, masked scores `[B, kv, g, T, T]`.
    fn scores(q: &Tensor, k: &Tensor, mask: &Mask, scale: f64) -> Result<Tensor> {
        // A batched GEMM on the GPU reads one stride pattern per operand: the projections leave
        // k as a transposed view, so it is copied once (a no-op when already contiguous).
        let k = &k.contiguous()?;
        let (b, heads, t, hd) = q.dims4()?;
        let kv = k.dim(1)?;
        let g = heads / kv;
        let qg = (q * scale)?.reshape((b, kv, g * t, hd))?;
        let scores = qg.matmul(&k.t()?)?.reshape((b, kv, g, t, t))?;
        let bias = mask.bias(q.dtype(), q.device())?.reshape((b, 1, 1, t, t))?.broadcast_as((b, kv, g, t, t))?;
        scores.broadcast_add(&bias)
    }

    pub fn forward(q: &Tensor, k: &Tensor, v: &Tensor, mask: &Mask, scale: f64) -> Result<(Tensor, Tensor)> {
        let (b, heads, t, hd) = q.dims4()?;
        let kv = k.dim(1)?;
        let scores = scores(q, k, mask, scale)?;
        let max = scores.max_keepdim(D::Minus1)?;
        let e = scores.broadcast_sub(&max)?.exp()?;
        let sum = e.sum_keepdim(D::Minus1)?;
        let probs = e.broadcast_div(&sum)?.reshape((b, kv, heads / kv * t, t))?;
        let out = probs.matmul(&v.contiguous()?)?.reshape((b, heads, t, hd))?;
        let lse = (sum.log()? + max)?.reshape((b, heads, t))?;
        Ok((out, lse))
    }

    pub fn backward(
        dout: &Tensor,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        lse: &Tensor,
        mask: &Mask,
        scale: f64,
    ) -> Result<(Tensor, Tensor, Tensor)> {
        let (q, k, v) = (&q.contiguous()?, &k.contiguous()?, &v.contiguous()?);
        let (b, heads, t, hd) = q.dims4()?;
        let kv = k.dim(1)?;
        let g = heads / kv;
        let lse = lse.reshape((b, kv, g, t, 1))?;
        let probs = scores(q, k, mask, scale)?.broadcast_sub(&lse)?.exp()?.reshape((b, kv, g * t, t))?;
        let dog = dout.contiguous()?.reshape((b, kv, g * t, hd))?;
        let dv = probs.t()?.matmul(&dog)?;
        let dp = dog.matmul(&v.t()?)?;
        let row_dot = (&dp * &probs)?.sum_keepdim(D::Minus1)?;
        // The softmax-input gradient is left unscaled; the scale lands on the smaller dq and dk.
        let ds = (dp.broadcast_sub(&row_dot)? * probs)?;
        let dq = (ds.matmul(k)? * scale)?.reshape((b, heads, t, hd))?;
        let dk = (ds.t()?.matmul(&q.reshape((b, kv, g * t, hd))?)? * scale)?;
        Ok((dq, dk, dv))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gradcheck::{assert_close, check, random};

    fn inputs(b: usize, h: usize, kv: usize, t: usize, hd: usize, seed: u64) -> Result<[Tensor; 4]> {
        let dev = Device::Cpu;
        Ok([
            random(&[b, h, t, hd], seed, &dev)?,
            random(&[b, kv, t, hd], seed + 1, &dev)?,
            random(&[b, kv, t, hd], seed + 2, &dev)?,
            random(&[b, h, t, hd], seed + 3, &dev)?,
        ])
    }

    #[test]
    fn gradients_match_finite_differences_with_gqa_and_packing() -> Result<()> {
        let (b, h, kv, t, hd) = (2, 4, 2, 5, 3);
        let [q, k, v, dy] = inputs(b, h, kv, t, hd, 1)?;
        let mask = Mask::new(&[1, 1, 2, 2, 2, 1, 1, 1, 0, 0], b, t)?;
        let scale = 1.0 / (hd as f64).sqrt();
        let cfg = KernelConfig::default();
        let (o, lse) = forward(&cfg, &q, &k, &v, &mask, scale)?;
        let (dq, dk, dv) = backward(&cfg, &dy, &q, &k, &v, &o, &lse, &mask, scale)?;
        let f = |x: &[Tensor]| Ok(forward(&cfg, &x[0], &x[1], &x[2], &mask, scale)?.0);
        check(f, &[q, k, v], &dy, &[dq, dk, dv])
    }

    #[test]
    fn fused_kernel_matches_the_reference_in_f64_and_f32() -> Result<()> {
        let (b, h, kv, t, hd) = (2, 6, 2, 33, 8);
        let [q, k, v, dy] = inputs(b, h, kv, t, hd, 11)?;
        let segs: Vec<u32> = (0..b * t).map(|i| ((i % t) / 9) as u32 + (i / t) as u32).collect();
        let mask = Mask::new(&segs, b, t)?;
        let (o_ref, lse_ref) = reference::forward(&q, &k, &v, &mask, 0.3)?;
        let grads_ref = reference::backward(&dy, &q, &k, &v, &lse_ref, &mask, 0.3)?;
        for (dtype, tol) in [(DType::F64, 1e-12), (DType::F32, 2e-5)] {
            let c = |x: &Tensor| x.to_dtype(dtype);
            let cfg = KernelConfig::default();
            let (o, lse) = forward(&cfg, &c(&q)?, &c(&k)?, &c(&v)?, &mask, 0.3)?;
            assert_close(&o, &o_ref, tol)?;
            assert_close(&lse, &lse_ref, tol)?;
            let (dq, dk, dv) = backward(&cfg, &c(&dy)?, &c(&q)?, &c(&k)?, &c(&v)?, &o, &lse, &mask, 0.3)?;
            assert_close(&dq, &grads_ref.0, tol)?;
            assert_close(&dk, &grads_ref.1, tol)?;
            assert_close(&dv, &grads_ref.2, tol)?;
        }
        Ok(())
    }

    #[test]
    fn tokens_see_only_earlier_tokens_of_their_own_document() -> Result<()> {
        // Moving a token that row i must not see changes nothing in row i.
        let (t, hd) = (5, 2);
        let [q, k, v, _] = inputs(1, 2, 1, t, hd, 5)?;
        let mask = Mask::new(&[1, 1, 2, 2, 2], 1, t)?;
        let cfg = KernelConfig::default();
        let (o, _) = forward(&cfg, &q, &k, &v, &mask, 1.0)?;
        let bump = |x: &Tensor, j: usize| -> Result<Tensor> {
            let mut d = vec![0f64; t * hd];
            d[j * hd] = 5.0;
            x.broadcast_add(&Tensor::from_vec(d, (1, 1, t, hd), &Device::Cpu)?)
        };
        for j in 0..t {
            let (o2, _) = forward(&cfg, &q, &bump(&k, j)?, &bump(&v, j)?, &mask, 1.0)?;
            let (a, b) = (o.reshape((2, t, hd))?.to_vec3::<f64>()?, o2.reshape((2, t, hd))?.to_vec3::<f64>()?);
            for head in 0..2 {
                for i in 0..t {
                    let visible = j <= i && (i < 2) == (j < 2);
                    assert_eq!(a[head][i] != b[head][i], visible, "row {i} key {j}");
                }
            }
        }
        Ok(())
    }

    #[test]
    fn bias_opens_exactly_the_allowed_keys() -> Result<()> {
        let mask = Mask::new(&[1, 1, 2, 2, 2], 1, 5)?;
        let b = mask.bias(DType::F64, &Device::Cpu)?.reshape((5, 5))?.to_vec2::<f64>()?;
        for (i, row) in b.iter().enumerate() {
            for (j, &x) in row.iter().enumerate() {
                assert_eq!(x == 0.0, j <= i && (i < 2) == (j < 2), "{i} {j}");
            }
        }
        assert!(Mask::new(&[1, 2], 1, 3).is_err());
        Ok(())
    }
}
