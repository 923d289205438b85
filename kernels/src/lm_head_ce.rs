//! Cross-entropy fused with the lm_head, in vocabulary chunks: per-token losses of
//! `logits = h·Wᵀ` without ever holding the `[tokens × vocab]` logits (151,936 columns for
//! Qwen3: 4.6 GiB in bf16 at 8×2048 tokens, more than the whole LoRA step should use).
//!
//! Forward: each chunk's logits `[N, C]` are made, reduced to their row log-sum-exp and
//! dropped; the chunks' statistics merge by log-add-exp. The target logit is `h·W[target]`.
//! Backward: each chunk's logits are made again and turned into their gradient
//! `w·(softmax − onehot)` with the full row log-sum-exp, which feeds `dh += g·W_c` and
//! `dW_c = gᵀ·h` before the next chunk. Peak extra memory is one chunk, twice.
//!
//! Statistics (log-sum-exp, losses, per-row weights) are f32 (f64 for f64 inputs); the GEMMs
//! run in the inputs' dtype. The two chunk passes are fused kernels on the GPU and composed
//! candle ops elsewhere; the referee is [`crate::cross_entropy`] on the full logits.

use crate::KernelConfig;
use crate::cross_entropy::Labels;
use crate::on_gpu_or;
use candle_core::{D, DType, Result, Tensor};

/// The dtype of the row statistics for activations of `dtype`.
fn stat_dtype(dtype: DType) -> DType {
    if dtype == DType::F64 { DType::F64 } else { DType::F32 }
}

fn check(h: &Tensor, w: &Tensor, labels: &Labels, chunk: usize) -> Result<(usize, usize)> {
    let (n, d) = h.dims2()?;
    let (v, dw) = w.dims2()?;
    if d != dw || labels.targets.dim(0)? != n || chunk == 0 {
        candle_core::bail!(
            "lm_head cross-entropy: h {:?}, lm_head {:?}, {} labels, chunk {chunk}",
            h.dims(),
            w.dims(),
            labels.targets.dim(0)?
        );
    }
    Ok((n, v))
}

/// `h` `[N, D]`, lm_head `w` `[V, D]` → per-token losses `[N]` (0 where ignored) and the row
/// log-sum-exp `[N, 1]` (statistics dtype), which the backward needs.
pub fn forward(cfg: &KernelConfig, h: &Tensor, w: &Tensor, labels: &Labels, chunk: usize) -> Result<(Tensor, Tensor)> {
    let _profile = crate::profile::scope("lm_head CE fwd", h.device());
    let (_, v) = check(h, w, labels, chunk)?;
    let stat = stat_dtype(h.dtype());
    let mut lse: Option<Tensor> = None;
    for v0 in (0..v).step_by(chunk) {
        let logits = chunk_logits(cfg, h, &w.narrow(0, v0, chunk.min(v - v0))?)?;
        let part = row_lse(&logits)?;
        lse = Some(match lse {
            None => part,
            Some(acc) => log_add_exp(&acc, &part)?,
        });
    }
    let lse = lse.ok_or_else(|| candle_core::Error::Msg("lm_head cross-entropy: empty vocabulary".into()))?;
    let picked_w = w.index_select(&labels.targets.squeeze(1)?, 0)?;
    let picked = (h.to_dtype(stat)? * picked_w.to_dtype(stat)?)?.sum_keepdim(D::Minus1)?;
    let losses = ((&lse - picked)? * labels.valid.to_dtype(stat)?)?.squeeze(1)?;
    Ok((losses, lse))
}

/// Gradients of `Σ d_losses·losses`: `dh` `[N, D]` in `h`'s dtype and, with `want_dw`, the
/// lm_head's `[V, D]`.
#[allow(clippy::too_many_arguments)]
pub fn backward(
    cfg: &KernelConfig,
    d_losses: &Tensor,
    h: &Tensor,
    w: &Tensor,
    lse: &Tensor,
    labels: &Labels,
    chunk: usize,
    want_dw: bool,
) -> Result<(Tensor, Option<Tensor>)> {
    let _profile = crate::profile::scope("lm_head CE bwd", h.device());
    let (_, v) = check(h, w, labels, chunk)?;
    let stat = stat_dtype(h.dtype());
    let weight = (d_losses.to_dtype(stat)?.unsqueeze(1)? * labels.valid.to_dtype(stat)?)?;
    let lse = lse.to_dtype(stat)?;
    let mut dh = h.zeros_like()?.to_dtype(stat)?;
    let mut dws = Vec::new();
    for v0 in (0..v).step_by(chunk) {
        let wc = w.narrow(0, v0, chunk.min(v - v0))?;
        let logits = chunk_logits(cfg, h, &wc)?;
        let g = chunk_grad(&logits, &lse, &weight, &labels.targets, v0)?;
        let (dh_part, dw_part) = if h.device().is_cuda() {
            let dw = if want_dw { Some(crate::linear::weight_grad(cfg, &g, h)?) } else { None };
            (crate::linear::input_grad_sum(cfg, &[(&g, &wc)])?, dw)
        } else {
            (g.matmul(&wc)?, if want_dw { Some(g.t()?.matmul(h)?) } else { None })
        };
        // Summed in the statistics dtype: dozens of bf16 partial sums would lose bits.
        dh = (dh + dh_part.to_dtype(stat)?)?;
        dws.extend(dw_part);
    }
    let dw = if want_dw { Some(Tensor::cat(&dws, 0)?) } else { None };
    Ok((dh.to_dtype(h.dtype())?, dw))
}

/// A chunk's logits `h·W_cᵀ`. On a GPU they go through the linear ops' planned GEMM path, like
/// every projection (so the probe times their shapes too); elsewhere candle's matmul.
fn chunk_logits(cfg: &KernelConfig, h: &Tensor, wc: &Tensor) -> Result<Tensor> {
    if h.device().is_cuda() { crate::linear::forward(cfg, h, wc) } else { h.matmul(&wc.t()?) }
}

/// `log(eᵃ + eᵇ)` elementwise, stable.
fn log_add_exp(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    let m = a.maximum(b)?;
    ((a - &m)?.exp()? + (b - &m)?.exp()?)?.log()? + m
}

/// The row log-sum-exp `[N, 1]` of a chunk of logits, in the statistics dtype.
fn row_lse(logits: &Tensor) -> Result<Tensor> {
    #[cfg(feature = "cuda")]
    use crate::gpu::cross_entropy::row_lse as gpu;
    on_gpu_or!([logits], gpu(logits), reference::row_lse(logits))
}

/// `weight·(exp(logits − lse) − onehot(target − v0))` in the logits' dtype.
fn chunk_grad(logits: &Tensor, lse: &Tensor, weight: &Tensor, targets: &Tensor, v0: usize) -> Result<Tensor> {
    #[cfg(feature = "cuda")]
    use crate::gpu::cross_entropy::chunk_grad as gpu;
    on_gpu_or!([logits], gpu(logits, lse, weight, targets, v0), reference::chunk_grad(logits, lse, weight, targets, v0))
}

/// The composed chunk passes, on any candle device.
pub mod reference {
    use super::*;

    pub fn row_lse(logits: &Tensor) -> Result<Tensor> {
        let x = logits.to_dtype(stat_dtype(logits.dtype()))?;
        let max = x.max_keepdim(D::Minus1)?;
        x.broadcast_sub(&max)?.exp()?.sum_keepdim(D::Minus1)?.log()? + max
    }

    pub fn chunk_grad(logits: &Tensor, lse: &Tensor, weight: &Tensor, targets: &Tensor, v0: usize) -> Result<Tensor> {
        let (n, c) = logits.dims2()?;
        let x = logits.to_dtype(lse.dtype())?;
        let probs = x.broadcast_sub(lse)?.exp()?.broadcast_mul(weight)?;
        // The one-hot part: a target inside this chunk lands at column target − v0.
        let ids = targets.flatten_all()?.to_vec1::<u32>()?;
        let mut onehot = vec![0f64; n * c];
        for (r, &t) in ids.iter().enumerate() {
            if let Some(j) = (t as usize).checked_sub(v0).filter(|&j| j < c) {
                onehot[r * c + j] = 1.0;
            }
        }
        let onehot = Tensor::from_vec(onehot, (n, c), logits.device())?.to_dtype(lse.dtype())?;
        (probs - onehot.broadcast_mul(weight)?)?.to_dtype(logits.dtype())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cross_entropy;
    use crate::gradcheck::{assert_close, random};
    use candle_core::Device;

    /// Chunked (a chunk that does not divide the vocabulary) against the full-logit
    /// cross-entropy, in f64, with ignored tokens.
    #[test]
    fn chunked_equals_full_logits() -> Result<()> {
        let dev = Device::Cpu;
        let (n, d, v) = (30, 16, 301);
        let h = random(&[n, d], 1, &dev)?;
        let w = (random(&[v, d], 2, &dev)? * 2.0)?;
        let ids: Vec<i64> = (0..n as i64).map(|i| if i % 5 == 2 { -100 } else { i * 41 % v as i64 }).collect();
        let labels = Labels::new(&ids, v, DType::F64, &dev)?;
        let dl = random(&[n], 3, &dev)?;
        let logits = h.matmul(&w.t()?)?;
        let cfg = KernelConfig::default();
        let (l_ref, lse_ref) = cross_entropy::forward(&logits, &labels)?;
        let g_ref = cross_entropy::backward(&dl, &logits, &lse_ref, &labels)?;
        let (dh_ref, dw_ref) = (g_ref.matmul(&w)?, g_ref.t()?.matmul(&h)?);
        for chunk in [64, 301, 1000] {
            let (l, lse) = forward(&cfg, &h, &w, &labels, chunk)?;
            assert_close(&l, &l_ref, 1e-12)?;
            assert_close(&lse, &lse_ref, 1e-12)?;
            let (dh, dw) = backward(&cfg, &dl, &h, &w, &lse, &labels, chunk, true)?;
            assert_close(&dh, &dh_ref, 1e-12)?;
            assert_close(&dw.unwrap(), &dw_ref, 1e-12)?;
        }
        assert!(forward(&cfg, &h, &w, &labels, 0).is_err());
        assert!(backward(&cfg, &dl, &h, &w, &lse_ref, &labels, 64, false)?.1.is_none());
        Ok(())
    }
}
