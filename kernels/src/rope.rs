//! Rotary position embedding in HF's `rotate_half` convention:
//! `y = x·cos + rotate_half(x)·sin`, `rotate_half([x₁, x₂]) = [−x₂, x₁]`, with the frequency
//! table `[f, f]` (each half repeats the `head_dim/2` frequencies). Positions come per token,
//! so packed documents can each restart at 0.

use crate::cpu::{self, dispatch};
use crate::on_gpu_or;
use candle_core::{D, DType, Device, Result, Tensor};

/// `cos` and `sin` tables `[positions.len(), head_dim]` for `inv_freq_i = θ^(−2i/head_dim)`.
/// In f64 they are computed in f64 (for gradient checks); otherwise in f32 as HF computes
/// them, then cast, so logits match transformers closely.
pub fn tables(
    positions: &[u32],
    head_dim: usize,
    theta: f64,
    dtype: DType,
    device: &Device,
) -> Result<(Tensor, Tensor)> {
    if !head_dim.is_multiple_of(2) {
        candle_core::bail!("rope: head_dim {head_dim} is odd");
    }
    let half = head_dim / 2;
    // Positions repeat (each row of a batch, each packed document, restarts at 0): where that at
    // least halves the work, every distinct one is computed once and the rows are gathered on the
    // device (a 16,384-token batch has 2,048 distinct positions, so 16× fewer sines and cosines;
    // the values are the same). A decode step's streams mostly differ: computed per token.
    let mut distinct = positions.to_vec();
    distinct.sort_unstable();
    distinct.dedup();
    let gather = 2 * distinct.len() <= positions.len();
    let rows: &[u32] = if gather { &distinct } else { positions };
    let u = rows.len();
    // One body for f64 (gradient checks) and f32 (HF's precision).
    macro_rules! table {
        ($f:ty) => {{
            let theta = theta as $f;
            let inv: Vec<$f> = (0..half).map(|i| 1.0 / theta.powf((2 * i) as $f / head_dim as $f)).collect();
            let (mut cos, mut sin) = (Vec::with_capacity(u * head_dim), Vec::with_capacity(u * head_dim));
            for &p in rows {
                for _ in 0..2 {
                    cos.extend(inv.iter().map(|f| (p as $f * f).cos()));
                    sin.extend(inv.iter().map(|f| (p as $f * f).sin()));
                }
            }
            (Tensor::from_vec(cos, (u, head_dim), device)?, Tensor::from_vec(sin, (u, head_dim), device)?)
        }};
    }
    let (cos, sin) = if dtype == DType::F64 { table!(f64) } else { table!(f32) };
    if !gather {
        return Ok((cos.to_dtype(dtype)?, sin.to_dtype(dtype)?));
    }
    let at: Vec<u32> = positions.iter().map(|p| distinct.partition_point(|d| d < p) as u32).collect();
    let at = Tensor::from_vec(at, positions.len(), device)?;
    Ok((cos.index_select(&at, 0)?.to_dtype(dtype)?, sin.index_select(&at, 0)?.to_dtype(dtype)?))
}

/// `x`: `[.., head_dim]`; `cos`/`sin` broadcastable to it. Nothing is saved: the backward
/// needs only the tables.
pub fn forward(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
    let _profile = crate::profile::scope("rope fwd", x.device());
    if !per_token_tables(x, cos, sin) {
        return reference::forward(x, cos, sin);
    }
    #[cfg(feature = "cuda")]
    use crate::gpu::elementwise::rope as gpu;
    use cpu::elementwise::rope as fused;
    let cpu_or_reference = || dispatch!([x, cos, sin], fused(x, cos, sin, false), reference::forward(x, cos, sin));
    on_gpu_or!([x, cos, sin], gpu(x, cos, sin, false), cpu_or_reference())
}

/// The map is linear and orthogonal per pair: `dx = dy·cos + rotate_halfᵀ(dy·sin)` with
/// `rotate_halfᵀ([g₁, g₂]) = [g₂, −g₁]`.
pub fn backward(dy: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
    let _profile = crate::profile::scope("rope bwd", dy.device());
    if !per_token_tables(dy, cos, sin) {
        return reference::backward(dy, cos, sin);
    }
    #[cfg(feature = "cuda")]
    use crate::gpu::elementwise::rope as gpu;
    use cpu::elementwise::rope as fused;
    let cpu_or_reference = || dispatch!([dy, cos, sin], fused(dy, cos, sin, true), reference::backward(dy, cos, sin));
    on_gpu_or!([dy, cos, sin], gpu(dy, cos, sin, true), cpu_or_reference())
}

/// The fused kernel's case: one table row per token (`x` `[.., heads, hd]` with tables
/// `[.., 1, hd]`, or the same shape as `x`); other broadcasts take the reference.
fn per_token_tables(x: &Tensor, cos: &Tensor, sin: &Tensor) -> bool {
    let (xd, cd) = (x.dims(), cos.dims());
    let r = xd.len();
    let heads_shared =
        r >= 2 && cd.len() == r && cd[r - 2] == 1 && cd[..r - 2] == xd[..r - 2] && cd[r - 1] == xd[r - 1];
    (heads_shared || cd == xd) && sin.dims() == cd && xd.last().is_some_and(|d| d % 2 == 0)
}

/// The composed form, on any candle device: the referee of the fused kernel.
pub mod reference {
    use super::*;

    pub fn forward(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
        x.broadcast_mul(cos)? + rotate_half(x)?.broadcast_mul(sin)?
    }

    pub fn backward(dy: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
        let g = dy.broadcast_mul(sin)?;
        let half = g.dim(D::Minus1)? / 2;
        let rotated =
            Tensor::cat(&[g.narrow(D::Minus1, half, half)?, g.narrow(D::Minus1, 0, half)?.neg()?], D::Minus1)?;
        dy.broadcast_mul(cos)? + rotated
    }

    fn rotate_half(x: &Tensor) -> Result<Tensor> {
        let half = x.dim(D::Minus1)? / 2;
        Tensor::cat(&[x.narrow(D::Minus1, half, half)?.neg()?, x.narrow(D::Minus1, 0, half)?], D::Minus1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gradcheck::{assert_close, check, random};

    #[test]
    fn fused_kernel_matches_the_reference_in_f64_and_f32() -> Result<()> {
        let dev = Device::Cpu;
        let positions: Vec<u32> = (0..2 * 9).map(|i| (i % 9) as u32 * 37).collect();
        let (cos, sin) = tables(&positions, 8, 1e4, DType::F64, &dev)?;
        let (cos, sin) = (cos.reshape((2, 9, 1, 8))?, sin.reshape((2, 9, 1, 8))?);
        let (x, dy) = (random(&[2, 9, 3, 8], 1, &dev)?, random(&[2, 9, 3, 8], 2, &dev)?);
        let (y_ref, dx_ref) = (reference::forward(&x, &cos, &sin)?, reference::backward(&dy, &cos, &sin)?);
        for (dtype, tol) in [(DType::F64, 1e-12), (DType::F32, 1e-6)] {
            let c = |t: &Tensor| t.to_dtype(dtype);
            assert_close(&forward(&c(&x)?, &c(&cos)?, &c(&sin)?)?, &y_ref, tol)?;
            assert_close(&backward(&c(&dy)?, &c(&cos)?, &c(&sin)?)?, &dx_ref, tol)?;
        }
        Ok(())
    }

    #[test]
    fn gradients_match_finite_differences() -> Result<()> {
        let dev = Device::Cpu;
        // [batch 1, tokens 3, heads 2, head_dim 4], positions restart like a packed row.
        let x = random(&[1, 3, 2, 4], 1, &dev)?;
        let dy = random(&[1, 3, 2, 4], 2, &dev)?;
        let (cos, sin) = tables(&[0, 1, 0], 4, 10_000.0, DType::F64, &dev)?;
        let (cos, sin) = (cos.reshape((1, 3, 1, 4))?, sin.reshape((1, 3, 1, 4))?);
        let dx = backward(&dy, &cos, &sin)?;
        check(|t: &[Tensor]| forward(&t[0], &cos, &sin), &[x], &dy, &[dx])
    }

    #[test]
    fn each_tokens_row_is_its_positions_angles() -> Result<()> {
        // Unsorted positions, repeated enough to be gathered (8 tokens, 4 distinct) and not (7 tokens, 4 distinct):
        // every row is computed from its own position.
        for positions in [&[9u32, 0, 3, 9, 0, 4096, 3, 9][..], &[9, 0, 3, 9, 0, 4096, 3]] {
            let (cos, sin) = tables(positions, 8, 1e6, DType::F32, &Device::Cpu)?;
            let (c, s) = (cos.to_vec2::<f32>()?, sin.to_vec2::<f32>()?);
            let inv: Vec<f32> = (0..4).map(|i| 1.0 / 1e6f32.powf((2 * i) as f32 / 8.0)).collect();
            for (row, &p) in positions.iter().enumerate() {
                for col in 0..8 {
                    let a = p as f32 * inv[col % 4];
                    let want = (a.cos().to_bits(), a.sin().to_bits());
                    assert_eq!((c[row][col].to_bits(), s[row][col].to_bits()), want);
                }
            }
        }
        Ok(())
    }

    #[test]
    fn position_zero_is_identity_and_rotation_preserves_norm() -> Result<()> {
        let dev = Device::Cpu;
        let x = random(&[2, 6], 3, &dev)?;
        let (cos, sin) = tables(&[0, 7], 6, 1e6, DType::F64, &dev)?;
        let y = forward(&x, &cos, &sin)?;
        let (x0, y0) = (x.get(0)?.to_vec1::<f64>()?, y.get(0)?.to_vec1::<f64>()?);
        assert_eq!(x0, y0);
        let n = |t: &Tensor| -> Result<f64> { t.get(1)?.sqr()?.sum_all()?.to_scalar::<f64>() };
        assert!((n(&x)? - n(&y)?).abs() < 1e-12);
        // HF pairs element i with i + head_dim/2 and repeats the frequencies: at position 7
        // element 0 and element 3 rotate by the same angle 7·θ⁰ = 7 rad.
        let (c, s) = (cos.to_vec2::<f64>()?, sin.to_vec2::<f64>()?);
        assert!((c[1][0] - 7f64.cos()).abs() < 1e-15 && (c[1][3] - 7f64.cos()).abs() < 1e-15);
        assert!((s[1][1] - (7.0 / 1e6f64.powf(2.0 / 6.0)).sin()).abs() < 1e-15);
        Ok(())
    }
}
