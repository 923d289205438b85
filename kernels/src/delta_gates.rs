//! Gated DeltaNet's per-token gates, from its projections `b` and `a` (`in_proj_b`, `in_proj_a`,
//! `[B, T, H]`) and two per-head parameters `A_log` and `dt_bias` (`[H]`):
//!
//! ```text
//! β = σ(b)                                  the delta rule's write strength, in (0, 1)
//! g = −exp(A_log)·softplus(a + dt_bias)     its log-decay, < 0
//! ```
//!
//! transformers computes g in f32 (`-A_log.float().exp() * softplus(a.float() + dt_bias)`) and β
//! in the model's dtype; softplus is torch's (`x` itself past 20, where `ln(1 + eˣ)` rounds to
//! it). The tensors are one value per token and head, so these are composed candle ops.

use candle_core::{D, DType, Result, Tensor};

/// What [`backward`] returns, each shaped as its operand.
pub struct Grads {
    pub db: Tensor,
    pub da: Tensor,
    pub da_log: Tensor,
    pub ddt_bias: Tensor,
}

fn check(b: &Tensor, a: &Tensor, a_log: &Tensor, dt_bias: &Tensor) -> Result<()> {
    let h = a.dim(D::Minus1)?;
    if b.dims() != a.dims() || a_log.dims() != [h] || dt_bias.dims() != [h] {
        candle_core::bail!(
            "delta gates: b {:?}, a {:?}, A_log {:?}, dt_bias {:?} (b and a alike, the parameters one per head)",
            b.dims(),
            a.dims(),
            a_log.dims(),
            dt_bias.dims()
        );
    }
    Ok(())
}

/// `exp(A_log)`, g's decay rate per head, in g's dtype (f64 stays f64).
fn rate(a_log: &Tensor, dtype: DType) -> Result<Tensor> {
    a_log.to_dtype(dtype)?.exp()
}

fn g_dtype(a: &Tensor) -> DType {
    if a.dtype() == DType::F64 { DType::F64 } else { DType::F32 }
}

fn sigmoid(x: &Tensor) -> Result<Tensor> {
    (x.neg()?.exp()? + 1.0)?.recip()
}

/// `(β, g)`: β in `b`'s dtype, g in f32 (f64 for f64 inputs). The backward needs only the
/// operands.
pub fn forward(b: &Tensor, a: &Tensor, a_log: &Tensor, dt_bias: &Tensor) -> Result<(Tensor, Tensor)> {
    check(b, a, a_log, dt_bias)?;
    let dtype = g_dtype(a);
    let x = shifted(a, dt_bias, dtype)?;
    // softplus(x) = max(x, 0) + ln(1 + e^−|x|) (no overflow), and x itself past torch's cut-off.
    let smooth = (x.relu()? + (x.abs()?.neg()?.exp()? + 1.0)?.log()?)?;
    let softplus = past_cutoff(&x)?.where_cond(&x, &smooth)?;
    let g = softplus.broadcast_mul(&rate(a_log, dtype)?)?.neg()?;
    Ok((sigmoid(b)?, g))
}

/// `a + dt_bias` in g's dtype.
fn shifted(a: &Tensor, dt_bias: &Tensor, dtype: DType) -> Result<Tensor> {
    a.to_dtype(dtype)?.broadcast_add(&dt_bias.to_dtype(dtype)?)
}

/// Where torch's softplus (threshold 20) returns its input, and its gradient is 1.
fn past_cutoff(x: &Tensor) -> Result<Tensor> {
    x.gt(20.0)
}

/// Gradients for `dbeta` and `dg`: `db = dβ·β(1 − β)`, `da = −dg·exp(A_log)·σ(a + dt_bias)` (1
/// for σ past the cut-off, as torch), `ddt_bias` its sum over the tokens, `dA_log = Σ dg·g`.
pub fn backward(
    dbeta: &Tensor,
    dg: &Tensor,
    b: &Tensor,
    a: &Tensor,
    a_log: &Tensor,
    dt_bias: &Tensor,
) -> Result<Grads> {
    check(b, a, a_log, dt_bias)?;
    if dbeta.dims() != b.dims() || dg.dims() != a.dims() {
        candle_core::bail!("delta gates: gradients {:?} and {:?} for gates {:?}", dbeta.dims(), dg.dims(), b.dims());
    }
    let (beta, g) = forward(b, a, a_log, dt_bias)?;
    let db = (dbeta * (&beta * (1.0 - &beta)?)?)?;
    let dtype = g.dtype();
    let dg = dg.to_dtype(dtype)?;
    let x = shifted(a, dt_bias, dtype)?;
    let dsoftplus = past_cutoff(&x)?.where_cond(&x.ones_like()?, &sigmoid(&x)?)?;
    let dx = (&dg * dsoftplus.broadcast_mul(&rate(a_log, dtype)?)?.neg()?)?;
    let h = a_log.dim(0)?;
    let per_head = |t: &Tensor, like: &Tensor| t.reshape(((), h))?.sum(0)?.to_dtype(like.dtype());
    Ok(Grads {
        db,
        da: dx.to_dtype(a.dtype())?,
        da_log: per_head(&(&dg * &g)?, a_log)?,
        ddt_bias: per_head(&dx, dt_bias)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gradcheck::{check, fresh_seed, random};
    use candle_core::Device;

    fn inputs(seed: u64) -> Result<[Tensor; 6]> {
        let r = |s: &[usize], i: u64| random(s, seed.wrapping_add(i), &Device::Cpu);
        // a + dt_bias over ±25: both sides of softplus's cut-off at 20.
        let a = (r(&[2, 3, 4], 1)? * 25.0)?;
        Ok([(r(&[2, 3, 4], 0)? * 3.0)?, a, r(&[4], 2)?, r(&[4], 3)?, r(&[2, 3, 4], 4)?, r(&[2, 3, 4], 5)?])
    }

    #[test]
    fn gates_are_the_definition() -> Result<()> {
        let seed = fresh_seed();
        let [b, a, a_log, dt_bias, _, _] = inputs(seed)?;
        let (beta, g) = forward(&b, &a, &a_log, &dt_bias)?;
        let (bv, av) = (b.flatten_all()?.to_vec1::<f64>()?, a.flatten_all()?.to_vec1::<f64>()?);
        let (lv, dv) = (a_log.to_vec1::<f64>()?, dt_bias.to_vec1::<f64>()?);
        let (betas, gs) = (beta.flatten_all()?.to_vec1::<f64>()?, g.flatten_all()?.to_vec1::<f64>()?);
        for i in 0..bv.len() {
            let x = av[i] + dv[i % 4];
            let softplus = if x > 20.0 { x } else { x.exp().ln_1p() };
            let want = (1.0 / (1.0 + (-bv[i]).exp()), -lv[i % 4].exp() * softplus);
            assert!((betas[i] - want.0).abs() < 1e-15, "seed {seed}: β[{i}] {} vs {}", betas[i], want.0);
            assert!(
                (gs[i] - want.1).abs() < 1e-12 * (1.0 + want.1.abs()),
                "seed {seed}: g[{i}] {} vs {}",
                gs[i],
                want.1
            );
        }
        // f32 operands: g in f32, as transformers computes it.
        let (_, g32) = forward(&b.to_dtype(DType::F32)?, &a.to_dtype(DType::F32)?, &a_log, &dt_bias)?;
        assert_eq!(g32.dtype(), DType::F32);
        assert!(forward(&b, &a, &a_log.narrow(0, 0, 3)?, &dt_bias).is_err());
        Ok(())
    }

    #[test]
    fn gradients_match_finite_differences() -> Result<()> {
        let seed = fresh_seed();
        let [b, a, a_log, dt_bias, dbeta, dg] = inputs(seed)?;
        let grads = backward(&dbeta, &dg, &b, &a, &a_log, &dt_bias)?;
        // Both gates at once: L = Σ dβ·β + Σ dg·g.
        let f = |t: &[Tensor]| {
            let (beta, g) = forward(&t[0], &t[1], &t[2], &t[3])?;
            Tensor::cat(&[beta, g], 0)
        };
        let dy = Tensor::cat(&[&dbeta, &dg], 0)?;
        let analytic = [grads.db, grads.da, grads.da_log, grads.ddt_bias];
        check(f, &[b, a, a_log, dt_bias], &dy, &analytic)
            .map_err(|e| candle_core::Error::Msg(format!("seed {seed}: {e}")))
    }
}
