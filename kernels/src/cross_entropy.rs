//! Token cross-entropy over logits with ignored labels.
//!
//! The forward returns per-token losses (zero where ignored) rather than a mean, so callers
//! can form the SUM for a per-token mean across micro-batches, or per-sequence log-probs for
//! preference losses; the backward takes a weight per token to match.

use crate::cpu::{self, dispatch};
use candle_core::{D, DType, Device, Result, Tensor};

/// Labels prepared for the kernels: `targets` u32 `[N, 1]` (ignored → 0) and `valid`
/// `[N, 1]` in the logits' dtype (1 for a target, 0 for ignored).
#[derive(Debug, Clone)]
pub struct Labels {
    pub targets: Tensor,
    pub valid: Tensor,
    pub count: usize,
    /// The same labels for the fused CPU kernel: `None` where ignored.
    ids: Vec<Option<u32>>,
}

impl Labels {
    /// `labels[i] < 0` means ignored (HF's −100 included); others must be `< vocab`.
    pub fn new(labels: &[i64], vocab: usize, dtype: DType, device: &Device) -> Result<Labels> {
        let mut targets = Vec::with_capacity(labels.len());
        let mut valid = Vec::with_capacity(labels.len());
        let mut ids = Vec::with_capacity(labels.len());
        for (i, &l) in labels.iter().enumerate() {
            if l < 0 {
                targets.push(0u32);
                valid.push(0f32);
                ids.push(None);
            } else if (l as u64) < vocab as u64 {
                targets.push(l as u32);
                valid.push(1.0);
                ids.push(Some(l as u32));
            } else {
                candle_core::bail!("cross-entropy: label {l} at token {i} is outside the vocabulary of {vocab}");
            }
        }
        let count = valid.iter().filter(|&&v| v > 0.0).count();
        let n = labels.len();
        Ok(Labels {
            targets: Tensor::from_vec(targets, (n, 1), device)?,
            valid: Tensor::from_vec(valid, (n, 1), device)?.to_dtype(dtype)?,
            count,
            ids,
        })
    }
}

/// `logits` `[N, V]` → per-token losses `[N]` (`lse − logit[target]`, 0 where ignored) and
/// the row log-sum-exp `[N, 1]`, which the backward needs besides the logits.
pub fn forward(logits: &Tensor, labels: &Labels) -> Result<(Tensor, Tensor)> {
    let _profile = crate::profile::scope("cross-entropy fwd", logits.device());
    check(logits, labels)?;
    use cpu::cross_entropy::forward as fused;
    dispatch!([logits], fused(logits, &labels.ids), reference::forward(logits, labels))
}

/// `dlogits = w·(softmax − onehot(target))` with `w = d_losses · valid` per token.
pub fn backward(d_losses: &Tensor, logits: &Tensor, lse: &Tensor, labels: &Labels) -> Result<Tensor> {
    let _profile = crate::profile::scope("cross-entropy bwd", logits.device());
    check(logits, labels)?;
    use cpu::cross_entropy::backward as fused;
    dispatch!(
        [d_losses, logits, lse],
        fused(d_losses, logits, lse, &labels.ids),
        reference::backward(d_losses, logits, lse, labels)
    )
}

fn check(logits: &Tensor, labels: &Labels) -> Result<()> {
    let (n, _) = logits.dims2()?;
    if n != labels.ids.len() {
        candle_core::bail!("cross-entropy: {n} rows of logits for {} labels", labels.ids.len());
    }
    Ok(())
}

/// The composed form, on any candle device: the referee of the fused kernel.
pub mod reference {
    use super::*;

    pub fn forward(logits: &Tensor, labels: &Labels) -> Result<(Tensor, Tensor)> {
        let max = logits.max_keepdim(D::Minus1)?;
        let lse = (logits.broadcast_sub(&max)?.exp()?.sum_keepdim(D::Minus1)?.log()? + max)?;
        let picked = logits.gather(&labels.targets, 1)?;
        let losses = ((lse.clone() - picked)? * &labels.valid)?.squeeze(1)?;
        Ok((losses, lse))
    }

    pub fn backward(d_losses: &Tensor, logits: &Tensor, lse: &Tensor, labels: &Labels) -> Result<Tensor> {
        let w = (d_losses.unsqueeze(1)? * &labels.valid)?;
        let probs = logits.broadcast_sub(lse)?.exp()?;
        let at_target =
            Tensor::zeros(logits.shape(), logits.dtype(), logits.device())?.scatter_add(&labels.targets, &w, 1)?;
        probs.broadcast_mul(&w)? - at_target
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gradcheck::{assert_close, check, random};

    #[test]
    fn fused_kernel_matches_the_reference_in_f64_and_f32() -> Result<()> {
        let dev = Device::Cpu;
        let logits = (random(&[40, 300], 1, &dev)? * 8.0)?;
        let ids: Vec<i64> = (0..40).map(|i| if i % 7 == 3 { -100 } else { (i * 37 % 300) as i64 }).collect();
        let dl = random(&[40], 2, &dev)?;
        let labels = Labels::new(&ids, 300, DType::F64, &dev)?;
        let (l_ref, lse_ref) = reference::forward(&logits, &labels)?;
        let d_ref = reference::backward(&dl, &logits, &lse_ref, &labels)?;
        for (dtype, tol) in [(DType::F64, 1e-12), (DType::F32, 2e-5)] {
            let c = |t: &Tensor| t.to_dtype(dtype);
            let labels = Labels::new(&ids, 300, dtype, &dev)?;
            let (l, lse) = forward(&c(&logits)?, &labels)?;
            assert_close(&l, &l_ref, tol)?;
            assert_close(&lse, &lse_ref, tol)?;
            assert_close(&backward(&c(&dl)?, &c(&logits)?, &lse, &labels)?, &d_ref, tol)?;
        }
        assert!(forward(&logits.narrow(0, 0, 39)?, &labels).is_err());
        Ok(())
    }

    #[test]
    fn gradients_match_finite_differences_with_ignored_tokens() -> Result<()> {
        let dev = Device::Cpu;
        let logits = (random(&[5, 7], 1, &dev)? * 3.0)?;
        let labels = Labels::new(&[3, -100, 0, 6, -100], 7, DType::F64, &dev)?;
        let dy = random(&[5], 2, &dev)?;
        let (_, lse) = forward(&logits, &labels)?;
        let dl = backward(&dy, &logits, &lse, &labels)?;
        check(|t: &[Tensor]| Ok(forward(&t[0], &labels)?.0), &[logits], &dy, &[dl])
    }

    #[test]
    fn losses_are_negative_log_softmax_and_zero_when_ignored() -> Result<()> {
        let dev = Device::Cpu;
        let logits = Tensor::new(&[[1.0f64, 2.0, 3.0], [5.0, 0.0, 0.0]], &dev)?;
        let labels = Labels::new(&[2, -100], 3, DType::F64, &dev)?;
        let l = forward(&logits, &labels)?.0.to_vec1::<f64>()?;
        let want = (1f64.exp() + 2f64.exp() + 3f64.exp()).ln() - 3.0;
        assert!((l[0] - want).abs() < 1e-12);
        assert_eq!(l[1], 0.0);
        assert_eq!(labels.count, 1);
        assert!(Labels::new(&[3], 3, DType::F64, &dev).is_err());
        Ok(())
    }
}
