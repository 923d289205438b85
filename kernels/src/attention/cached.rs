//! Attention of new tokens over a key/value cache: the decode path of generation.
//!
//! The `T` queries are the last `T` positions of a sequence whose `S ≥ T` keys and values
//! (earlier tokens first) are all given; query `i` sees keys `0 ..= S − T + i`. Training
//! never takes this path, so it is the composed form only: one batched GEMM per product
//! over the unrepeated kv heads, as in [`super::reference`], and at decode time `T` is one
//! or a prompt's length, so the `[g·T, S]` score block stays small.

use candle_core::{D, Result, Tensor};

/// `q`: `[B, heads, T, hd]`; `k`, `v`: `[B, kv_heads, S, hd]` with `S ≥ T`. Returns the
/// output `[B, heads, T, hd]`.
pub fn forward(q: &Tensor, k: &Tensor, v: &Tensor, scale: f64) -> Result<Tensor> {
    let (b, heads, t, hd) = q.dims4()?;
    let (kb, kv, s, khd) = k.dims4()?;
    if (kb, khd) != (b, hd) || v.dims4()? != (kb, kv, s, khd) {
        candle_core::bail!("cached attention: q {:?}, k {:?}, v {:?} do not agree", q.dims(), k.dims(), v.dims());
    }
    if s < t || kv == 0 || !heads.is_multiple_of(kv) {
        candle_core::bail!("cached attention: {t} queries over {s} keys, {heads} heads over {kv} kv heads");
    }
    let g = heads / kv;
    let qg = (q.contiguous()? * scale)?.reshape((b, kv, g * t, hd))?;
    // A gathered (strided) K: the CUDA matmul wants contiguous batches, the CPU accepts both.
    let scores = qg.matmul(&k.contiguous()?.t()?)?;
    let bias = causal_bias(g, t, s, q)?;
    let scores = scores.broadcast_add(&bias)?;
    let max = scores.max_keepdim(D::Minus1)?;
    let e = scores.broadcast_sub(&max)?.exp()?;
    let probs = e.broadcast_div(&e.sum_keepdim(D::Minus1)?)?;
    probs.matmul(&v.contiguous()?)?.reshape((b, heads, t, hd))
}

/// `[1, 1, g·T, S]`: row `j·T + i` (query `i` of group member `j`) open on keys `0 ..= S−T+i`.
fn causal_bias(g: usize, t: usize, s: usize, like: &Tensor) -> Result<Tensor> {
    let mut bias = vec![0f32; g * t * s];
    for row in 0..g * t {
        let last = s - t + row % t;
        bias[row * s + last + 1..(row + 1) * s].fill(f32::NEG_INFINITY);
    }
    Tensor::from_vec(bias, (1, 1, g * t, s), like.device())?.to_dtype(like.dtype())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attention::{self, Mask};
    use crate::gradcheck::assert_close;
    use candle_core::{DType, Device};

    fn rand(shape: (usize, usize, usize, usize), seed: u64) -> Tensor {
        let n = shape.0 * shape.1 * shape.2 * shape.3;
        let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        let data: Vec<f64> = (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x % 2001) as f64 / 1000.0 - 1.0
            })
            .collect();
        Tensor::from_vec(data, shape, &Device::Cpu).unwrap()
    }

    #[test]
    fn the_last_queries_over_a_cache_equal_full_causal_attention() {
        // Prefill of the whole sequence (T = S), decode of one token and of a few.
        let (b, heads, kv, s, hd) = (2, 4, 2, 9, 8);
        let (q, k, v) = (rand((b, heads, s, hd), 1), rand((b, kv, s, hd), 2), rand((b, kv, s, hd), 3));
        let mask = Mask::new(&vec![1; b * s], b, s).unwrap();
        let (full, _) = attention::reference::forward(&q, &k, &v, &mask, 0.3).unwrap();
        for t in [s, 1, 3] {
            let tail = q.narrow(2, s - t, t).unwrap();
            let got = forward(&tail, &k, &v, 0.3).unwrap();
            assert_close(&got, &full.narrow(2, s - t, t).unwrap(), 1e-12).unwrap_or_else(|e| panic!("T={t}: {e}"));
        }
    }

    #[test]
    fn mismatched_shapes_are_errors() {
        let q = Tensor::zeros((1, 4, 3, 8), DType::F32, &Device::Cpu).unwrap();
        let k = Tensor::zeros((1, 2, 2, 8), DType::F32, &Device::Cpu).unwrap();
        assert!(forward(&q, &k, &k, 1.0).is_err(), "more queries than keys");
        let k3 = Tensor::zeros((1, 3, 5, 8), DType::F32, &Device::Cpu).unwrap();
        assert!(forward(&q, &k3, &k3, 1.0).is_err(), "4 heads over 3 kv heads");
    }
}
