//! Scaled dot-product attention with grouped-query heads and a causal, per-document mask.
//!
//! GQA without copying keys: the `g = heads / kv_heads` query heads that share a kv head are
//! stacked along the token axis (`[B, kv, g·T, hd]`, a free reshape of `[B, heads, T, hd]`
//! because HF orders head `h` under kv head `h / g`), so every product is one batched GEMM
//! against the unrepeated k and v, and the backward's `dk`, `dv` sum over the group for free.

use candle_core::{D, DType, Device, Result, Tensor};

/// Additive mask `[B, 1, T, T]`: 0 where token `i` may attend token `j` (`j ≤ i` and the same
/// segment), −∞ elsewhere. The diagonal is always open, so no row is fully masked (padding,
/// segment 0, attends to earlier padding and carries no loss).
pub fn mask_bias(segment_ids: &[u32], batch: usize, seq: usize, dtype: DType, device: &Device) -> Result<Tensor> {
    if segment_ids.len() != batch * seq {
        candle_core::bail!("attention mask: {} segment ids for {batch}×{seq} tokens", segment_ids.len());
    }
    let mut bias = vec![f32::NEG_INFINITY; batch * seq * seq];
    for b in 0..batch {
        let seg = &segment_ids[b * seq..(b + 1) * seq];
        for i in 0..seq {
            let row = &mut bias[(b * seq + i) * seq..(b * seq + i + 1) * seq];
            for j in (0..=i).rev() {
                if seg[j] != seg[i] {
                    break;
                }
                row[j] = 0.0;
            }
        }
    }
    Tensor::from_vec(bias, (batch, 1, seq, seq), device)?.to_dtype(dtype)
}

/// `q`: `[B, heads, T, hd]`, `k`, `v`: `[B, kv_heads, T, hd]` (contiguous), `bias` from
/// [`mask_bias`]. Returns the output `[B, heads, T, hd]` and the attention probabilities
/// `[B, kv_heads, g·T, T]`, the only activation the backward needs besides q, k, v.
pub fn forward(q: &Tensor, k: &Tensor, v: &Tensor, bias: &Tensor, scale: f64) -> Result<(Tensor, Tensor)> {
    let (b, heads, t, hd) = q.dims4()?;
    let kv = k.dim(1)?;
    if kv == 0 || !heads.is_multiple_of(kv) {
        candle_core::bail!("attention: {heads} query heads do not group over {kv} kv heads");
    }
    let g = heads / kv;
    // Scaling q (T·hd values per head) is cheaper than scaling the T·T scores.
    let qg = (q * scale)?.reshape((b, kv, g * t, hd))?;
    let scores = qg.matmul(&k.t()?)?.reshape((b, kv, g, t, t))?;
    // candle's CPU add is fastest on two contiguous operands, so the mask is expanded once.
    let bias = bias.reshape((b, 1, 1, t, t))?.broadcast_as((b, kv, g, t, t))?.contiguous()?;
    let scores = (scores + bias)?;
    let max = scores.max_keepdim(D::Minus1)?;
    let e = scores.broadcast_sub(&max)?.exp()?;
    let probs = e.broadcast_div(&e.sum_keepdim(D::Minus1)?)?.reshape((b, kv, g * t, t))?;
    let out = probs.matmul(v)?.reshape((b, heads, t, hd))?;
    Ok((out, probs))
}

/// Gradients `(dq, dk, dv)` of [`forward`]; `dout` is `[B, heads, T, hd]`.
pub fn backward(
    dout: &Tensor,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    probs: &Tensor,
    scale: f64,
) -> Result<(Tensor, Tensor, Tensor)> {
    let (b, heads, t, hd) = q.dims4()?;
    let kv = k.dim(1)?;
    let g = heads / kv;
    let dog = dout.contiguous()?.reshape((b, kv, g * t, hd))?;
    let dv = probs.t()?.matmul(&dog)?;
    let dp = dog.matmul(&v.t()?)?;
    let row_dot = (&dp * probs)?.sum_keepdim(D::Minus1)?;
    // The softmax-input gradient is left unscaled; the scale lands on the smaller dq and dk.
    let ds = (dp.broadcast_sub(&row_dot)? * probs)?;
    let dq = (ds.matmul(k)? * scale)?.reshape((b, heads, t, hd))?;
    let dk = (ds.t()?.matmul(&q.reshape((b, kv, g * t, hd))?)? * scale)?;
    Ok((dq, dk, dv))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gradcheck::{check, random};

    #[test]
    fn gradients_match_finite_differences_with_gqa_and_packing() -> Result<()> {
        let dev = Device::Cpu;
        let (b, h, kv, t, hd) = (2, 4, 2, 5, 3);
        let q = random(&[b, h, t, hd], 1, &dev)?;
        let k = random(&[b, kv, t, hd], 2, &dev)?;
        let v = random(&[b, kv, t, hd], 3, &dev)?;
        let dy = random(&[b, h, t, hd], 4, &dev)?;
        let bias = mask_bias(&[1, 1, 2, 2, 2, 1, 1, 1, 0, 0], b, t, DType::F64, &dev)?;
        let scale = 1.0 / (hd as f64).sqrt();
        let (_, probs) = forward(&q, &k, &v, &bias, scale)?;
        let (dq, dk, dv) = backward(&dy, &q, &k, &v, &probs, scale)?;
        let f = |x: &[Tensor]| Ok(forward(&x[0], &x[1], &x[2], &bias, scale)?.0);
        check(f, &[q, k, v], &dy, &[dq, dk, dv])
    }

    #[test]
    fn tokens_see_only_earlier_tokens_of_their_own_document() -> Result<()> {
        let dev = Device::Cpu;
        let (t, hd) = (5, 2);
        let q = random(&[1, 2, t, hd], 5, &dev)?;
        let k = random(&[1, 1, t, hd], 6, &dev)?;
        let v = random(&[1, 1, t, hd], 7, &dev)?;
        let bias = mask_bias(&[1, 1, 2, 2, 2], 1, t, DType::F64, &dev)?;
        let (_, probs) = forward(&q, &k, &v, &bias, 1.0)?;
        let p = probs.reshape((2, t, t))?.to_vec3::<f64>()?;
        for head in &p {
            for (i, row) in head.iter().enumerate() {
                let allowed = |j: usize| j <= i && (i < 2) == (j < 2);
                for (j, &pij) in row.iter().enumerate() {
                    assert_eq!(pij > 0.0, allowed(j), "head row {i} col {j}: {pij}");
                }
                assert!((row.iter().sum::<f64>() - 1.0).abs() < 1e-12);
            }
        }
        Ok(())
    }
}
