//! The router: softmax over the experts, the top `k` (ties go to the lower expert index, as a
//! stable sort would), and with `norm_topk_prob` the chosen probabilities renormalised to sum to
//! one (HF's `Qwen3MoeTopKRouter`). Probabilities are computed in f32 (f64 for f64 logits), the
//! routing weights are handed back in the logits' dtype, as transformers does.
//!
//! The backward takes, besides the weights' gradient, the two router losses' terms: the
//! load-balancing loss is linear in the probabilities once the (non-differentiable) expert counts
//! are fixed, so it enters as a per-expert constant added to every counted token's probability
//! gradient; the z-loss `(log Σ exp logits)²` as its own coefficient.

use candle_core::{DType, Result, Tensor};

use super::cpu;

/// What the forward decides and what the backward needs.
#[derive(Debug, Clone)]
pub struct Routing {
    /// `[N, E]` softmax probabilities, f32 (f64 for f64 logits).
    pub probs: Tensor,
    /// `[N]` log-sum-exp of each row of logits (same dtype as `probs`).
    pub lse: Tensor,
    /// `[N, k]` u32 chosen experts, most probable first.
    pub experts: Tensor,
    /// `[N, k]` routing weights in the logits' dtype.
    pub weights: Tensor,
    pub norm_topk: bool,
}

impl Routing {
    pub fn tokens(&self) -> usize {
        self.experts.dims()[0]
    }
    pub fn k(&self) -> usize {
        self.experts.dims()[1]
    }
    pub fn num_experts(&self) -> usize {
        self.probs.dims()[1]
    }
    /// The same routing with every tensor on `device`.
    pub fn to_device(&self, device: &candle_core::Device) -> Result<Routing> {
        Ok(Routing {
            probs: self.probs.to_device(device)?,
            lse: self.lse.to_device(device)?,
            experts: self.experts.to_device(device)?,
            weights: self.weights.to_device(device)?,
            norm_topk: self.norm_topk,
        })
    }
}

/// The router losses' share of the backward.
#[derive(Debug, Clone, Default)]
pub struct LossTerms {
    /// `[E]` added to `∂L/∂p[t, e]` of every counted token (the load-balancing loss), in the
    /// probabilities' dtype.
    pub balance: Option<Tensor>,
    /// The z-loss coefficient `c`: `∂L/∂logits[t, e] += c·2·lse[t]·p[t, e]` for counted tokens.
    pub z: f64,
    /// `[N]` 1 for a token the losses count, 0 for one they skip (padding); `None`: all count.
    pub counted: Option<Tensor>,
}

/// The dtype router arithmetic runs in for `logits`.
pub fn compute_dtype(logits: DType) -> DType {
    if logits == DType::F64 { DType::F64 } else { DType::F32 }
}

/// `logits` `[N, E]` → the routing of every token to its `k` experts.
pub fn forward(logits: &Tensor, k: usize, norm_topk: bool) -> Result<Routing> {
    let _profile = crate::profile::scope("moe router fwd", logits.device());
    let (_, e) = logits.dims2()?;
    if k == 0 || k > e {
        candle_core::bail!("moe router: top-{k} of {e} experts");
    }
    if !logits.dtype().is_float() {
        candle_core::bail!("moe router: logits of {:?}", logits.dtype());
    }
    let dev = logits.device();
    if dev.is_cpu() {
        return cpu::router_forward(logits, k, norm_topk);
    }
    // On a GPU: the device kernel (one warp a token) where it serves the logits, else the
    // fused CPU kernel over a host copy, the results put back. The f64 referee GPU runs took
    // before both (single-threaded, a full sort a token) was 49% of a 30B-A3B step on an H200
    // (20 ms a layer at 2,048 tokens).
    #[cfg(feature = "cuda")]
    if let Some(r) = crate::gpu::router::forward(logits, k, norm_topk)? {
        return Ok(r);
    }
    cpu::router_forward(&logits.to_device(&candle_core::Device::Cpu)?, k, norm_topk)?.to_device(dev)
}

/// `∂L/∂logits` `[N, E]` (logits' dtype) from `∂L/∂weights` `[N, k]` and the losses' terms.
pub fn backward(d_weights: &Tensor, routing: &Routing, terms: &LossTerms) -> Result<Tensor> {
    let _profile = crate::profile::scope("moe router bwd", d_weights.device());
    check_terms(routing, terms)?;
    let dev = d_weights.device();
    if dev.is_cpu() {
        return cpu::router_backward(d_weights, routing, terms);
    }
    // As the forward: the device kernel, else the fused CPU kernel on host copies.
    #[cfg(feature = "cuda")]
    if let Some(d) = crate::gpu::router::backward(d_weights, routing, terms)? {
        return Ok(d);
    }
    let host = |t: &Tensor| t.to_device(&candle_core::Device::Cpu);
    let on_host = routing.to_device(&candle_core::Device::Cpu)?;
    let terms = LossTerms {
        balance: terms.balance.as_ref().map(host).transpose()?,
        z: terms.z,
        counted: terms.counted.as_ref().map(host).transpose()?,
    };
    cpu::router_backward(&host(d_weights)?, &on_host, &terms)?.to_device(dev)
}

fn check_terms(routing: &Routing, terms: &LossTerms) -> Result<()> {
    let (n, e) = (routing.tokens(), routing.num_experts());
    if let Some(b) = &terms.balance
        && b.dims() != [e]
    {
        candle_core::bail!("moe router: balance term {:?} for {e} experts", b.dims());
    }
    if let Some(c) = &terms.counted
        && c.dims() != [n]
    {
        candle_core::bail!("moe router: counted mask {:?} for {n} tokens", c.dims());
    }
    Ok(())
}

/// Per expert, over the counted tokens: how often it was chosen and the sum of its
/// probabilities, plus `Σ lse²` (the z-loss before scaling). All in the probabilities' dtype.
pub fn stats(routing: &Routing, counted: Option<&Tensor>) -> Result<(Tensor, Tensor, Tensor)> {
    let dt = routing.probs.dtype();
    let dev = routing.probs.device();
    let (n, e) = (routing.tokens(), routing.num_experts());
    let mask = match counted {
        Some(m) => m.to_dtype(dt)?,
        None => Tensor::ones(n, dt, dev)?,
    };
    let probs = routing.probs.broadcast_mul(&mask.unsqueeze(1)?)?.sum(0)?;
    let lse2 = (routing.lse.sqr()? * &mask)?.sum_all()?;
    let counts = chosen_counts(routing, &mask, e)?;
    Ok((counts, probs, lse2))
}

/// How many counted (token, slot) pairs chose each expert: a comparison against every expert
/// id, summed (no scatter, so it runs the same on every device).
fn chosen_counts(routing: &Routing, mask: &Tensor, e: usize) -> Result<Tensor> {
    let dt = mask.dtype();
    let ids = Tensor::arange(0u32, e as u32, routing.experts.device())?;
    let (n, k) = routing.experts.dims2()?;
    let flat = routing.experts.reshape((n * k, 1))?;
    let hits = flat.broadcast_eq(&ids.unsqueeze(0)?)?.to_dtype(dt)?;
    let weights = mask.unsqueeze(1)?.broadcast_as((n, k))?.reshape((n * k, 1))?;
    hits.broadcast_mul(&weights)?.sum(0)
}

/// The composed form on the host, in f64 (the referee of the fused kernels).
pub mod reference {
    use super::*;

    fn host(t: &Tensor) -> Result<Vec<f64>> {
        t.to_dtype(DType::F64)?.flatten_all()?.to_vec1::<f64>()
    }

    /// The indices of the `k` largest values, largest first, ties to the lower index.
    pub fn top_k(row: &[f64], k: usize) -> Vec<usize> {
        let mut idx: Vec<usize> = (0..row.len()).collect();
        idx.sort_by(|&a, &b| row[b].total_cmp(&row[a]).then(a.cmp(&b)));
        idx.truncate(k);
        idx
    }

    pub fn forward(logits: &Tensor, k: usize, norm_topk: bool) -> Result<Routing> {
        let (n, e) = logits.dims2()?;
        let l = host(logits)?;
        let (mut probs, mut lse, mut experts, mut weights) = (vec![0.0; n * e], vec![0.0; n], vec![], vec![]);
        for t in 0..n {
            let row = &l[t * e..(t + 1) * e];
            let m = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let s: f64 = row.iter().map(|x| (x - m).exp()).sum();
            lse[t] = m + s.ln();
            for (j, x) in row.iter().enumerate() {
                probs[t * e + j] = (x - m).exp() / s;
            }
            let p = &probs[t * e..(t + 1) * e];
            let top = top_k(p, k);
            let total: f64 = top.iter().map(|&i| p[i]).sum();
            for &i in &top {
                experts.push(i as u32);
                weights.push(if norm_topk { p[i] / total } else { p[i] });
            }
        }
        let dev = logits.device();
        let cdt = compute_dtype(logits.dtype());
        Ok(Routing {
            probs: Tensor::from_vec(probs, (n, e), dev)?.to_dtype(cdt)?,
            lse: Tensor::from_vec(lse, n, dev)?.to_dtype(cdt)?,
            experts: Tensor::from_vec(experts, (n, k), dev)?,
            weights: Tensor::from_vec(weights, (n, k), dev)?.to_dtype(logits.dtype())?,
            norm_topk,
        })
    }

    pub fn backward(d_weights: &Tensor, routing: &Routing, terms: &LossTerms) -> Result<Tensor> {
        let (n, e, k) = (routing.tokens(), routing.num_experts(), routing.k());
        let (dw, p, lse) = (host(d_weights)?, host(&routing.probs)?, host(&routing.lse)?);
        let experts = routing.experts.flatten_all()?.to_vec1::<u32>()?;
        let balance = match &terms.balance {
            Some(b) => host(b)?,
            None => vec![0.0; e],
        };
        let counted = match &terms.counted {
            Some(c) => host(c)?,
            None => vec![1.0; n],
        };
        let mut out = vec![0.0; n * e];
        for t in 0..n {
            let p = &p[t * e..(t + 1) * e];
            let mut dp: Vec<f64> = balance.iter().map(|b| b * counted[t]).collect();
            let chosen = &experts[t * k..(t + 1) * k];
            let dwt = &dw[t * k..(t + 1) * k];
            if routing.norm_topk {
                let s: f64 = chosen.iter().map(|&i| p[i as usize]).sum();
                let dot: f64 = chosen.iter().zip(dwt).map(|(&i, d)| d * p[i as usize] / s).sum();
                for (&i, d) in chosen.iter().zip(dwt) {
                    dp[i as usize] += (d - dot) / s;
                }
            } else {
                for (&i, d) in chosen.iter().zip(dwt) {
                    dp[i as usize] += d;
                }
            }
            let inner: f64 = p.iter().zip(&dp).map(|(a, b)| a * b).sum();
            for ((o, &pj), &dpj) in out[t * e..(t + 1) * e].iter_mut().zip(p).zip(&dp) {
                *o = pj * (dpj - inner) + terms.z * counted[t] * 2.0 * lse[t] * pj;
            }
        }
        Tensor::from_vec(out, (n, e), d_weights.device())?.to_dtype(d_weights.dtype())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gradcheck::{Tolerance, assert_close, check_scalar_at, random};
    use candle_core::Device;

    fn logits(n: usize, e: usize, seed: u64) -> Result<Tensor> {
        random(&[n, e], seed, &Device::Cpu)? * 3.0
    }

    #[test]
    fn weights_sum_to_one_and_the_chosen_are_the_most_probable() -> Result<()> {
        let (n, e, k) = (37, 8, 3);
        let r = forward(&logits(n, e, 1)?, k, true)?;
        assert_eq!(r.num_experts(), e);
        let w = r.weights.to_vec2::<f64>()?;
        let p = r.probs.to_vec2::<f64>()?;
        let chosen = r.experts.to_vec2::<u32>()?;
        for t in 0..n {
            assert!((w[t].iter().sum::<f64>() - 1.0).abs() < 1e-12, "token {t}");
            let least_chosen = chosen[t].iter().map(|&i| p[t][i as usize]).fold(f64::INFINITY, f64::min);
            for (j, &pj) in p[t].iter().enumerate() {
                if !chosen[t].contains(&(j as u32)) {
                    assert!(pj <= least_chosen);
                }
            }
            // Most probable first, no expert twice.
            assert!(chosen[t].windows(2).all(|c| p[t][c[0] as usize] >= p[t][c[1] as usize] && c[0] != c[1]));
        }
        // Without norm_topk_prob the weights are the probabilities themselves.
        let raw = forward(&logits(n, e, 1)?, k, false)?;
        for t in 0..n {
            for (j, &i) in chosen[t].iter().enumerate() {
                assert!((raw.weights.to_vec2::<f64>()?[t][j] - p[t][i as usize]).abs() < 1e-15);
            }
        }
        Ok(())
    }

    #[test]
    fn ties_go_to_the_lower_expert() -> Result<()> {
        let l = Tensor::new(&[[0.5f32, 1.0, 1.0, 0.0, 1.0]], &Device::Cpu)?;
        for r in [forward(&l, 2, true)?, reference::forward(&l, 2, true)?] {
            assert_eq!(r.experts.to_vec2::<u32>()?, [[1, 2]]);
        }
        Ok(())
    }

    #[test]
    fn fused_kernels_match_the_reference_in_f64_and_f32() -> Result<()> {
        let (n, e, k) = (300, 16, 4);
        let l = logits(n, e, 3)?;
        let dw = random(&[n, k], 4, &Device::Cpu)?;
        let balance = random(&[e], 5, &Device::Cpu)?;
        let mask: Vec<f64> = (0..n).map(|t| if t % 7 == 3 { 0.0 } else { 1.0 }).collect();
        let counted = Tensor::from_vec(mask, n, &Device::Cpu)?;
        for norm in [true, false] {
            let want = reference::forward(&l, k, norm)?;
            let terms = LossTerms { balance: Some(balance.clone()), z: 0.3, counted: Some(counted.clone()) };
            let dwant = reference::backward(&dw, &want, &terms)?;
            for (dt, tol) in [(DType::F64, 1e-12), (DType::F32, 3e-6)] {
                let got = forward(&l.to_dtype(dt)?, k, norm)?;
                assert_eq!(got.experts.to_vec2::<u32>()?, want.experts.to_vec2::<u32>()?);
                assert_eq!(got.probs.dtype(), compute_dtype(dt));
                assert_close(&got.probs, &want.probs, tol)?;
                assert_close(&got.lse, &want.lse, tol)?;
                assert_close(&got.weights, &want.weights, tol)?;
                let t = LossTerms {
                    balance: Some(balance.to_dtype(compute_dtype(dt))?),
                    z: 0.3,
                    counted: Some(counted.to_dtype(compute_dtype(dt))?),
                };
                assert_close(&backward(&dw.to_dtype(dt)?, &got, &t)?, &dwant, tol * 10.0)?;
            }
        }
        Ok(())
    }

    /// The backward against finite differences of the whole router objective: a weighted sum of
    /// the routing weights, the balance term's `Σ c_e·p_e` and the z-loss.
    #[test]
    fn gradients_match_finite_differences() -> Result<()> {
        let (n, e, k) = (5, 6, 2);
        let l = logits(n, e, 7)?;
        let dw = random(&[n, k], 8, &Device::Cpu)?;
        let balance = random(&[e], 9, &Device::Cpu)?;
        let counted = Tensor::new(&[1.0f64, 0.0, 1.0, 1.0, 1.0], &Device::Cpu)?;
        let z = 0.2;
        for norm in [true, false] {
            let fixed = forward(&l, k, norm)?;
            let objective = |t: &[Tensor]| -> Result<f64> {
                let r = forward(&t[0], k, norm)?;
                // Away from ties the chosen set is locally constant; the test logits have none.
                if r.experts.to_vec2::<u32>()? != fixed.experts.to_vec2::<u32>()? {
                    candle_core::bail!("the top-k changed under the probe");
                }
                let mw = (&r.weights * &dw)?.sum_all()?.to_scalar::<f64>()?;
                let mb = r.probs.broadcast_mul(&balance)?.sum(1)?.mul(&counted)?.sum_all()?.to_scalar::<f64>()?;
                let mz = (r.lse.sqr()? * &counted)?.sum_all()?.to_scalar::<f64>()? * z;
                Ok(mw + mb + mz)
            };
            let terms = LossTerms { balance: Some(balance.clone()), z, counted: Some(counted.clone()) };
            let analytic = backward(&dw, &fixed, &terms)?;
            let probes: Vec<(usize, usize)> = (0..n * e).map(|j| (0, j)).collect();
            check_scalar_at(objective, std::slice::from_ref(&l), &[analytic], &probes, Tolerance::default())?;
        }
        Ok(())
    }

    #[test]
    fn stats_count_the_chosen_and_skip_uncounted_tokens() -> Result<()> {
        let (n, e, k) = (9, 4, 2);
        let r = forward(&logits(n, e, 11)?, k, false)?;
        let counted: Vec<f64> = (0..n).map(|t| if t == 4 { 0.0 } else { 1.0 }).collect();
        let (counts, probs, lse2) = stats(&r, Some(&Tensor::from_vec(counted, n, &Device::Cpu)?))?;
        let counts = counts.to_vec1::<f64>()?;
        assert_eq!(counts.iter().sum::<f64>(), ((n - 1) * k) as f64);
        let chosen = r.experts.to_vec2::<u32>()?;
        for (x, c) in counts.iter().enumerate() {
            let want =
                (0..n).filter(|&t| t != 4).map(|t| chosen[t].iter().filter(|&&i| i == x as u32).count()).sum::<usize>();
            assert_eq!(*c, want as f64);
        }
        assert!((probs.to_vec1::<f64>()?.iter().sum::<f64>() - (n - 1) as f64).abs() < 1e-12);
        let lse = r.lse.to_vec1::<f64>()?;
        let want: f64 = (0..n).filter(|&t| t != 4).map(|t| lse[t] * lse[t]).sum();
        assert!((lse2.to_scalar::<f64>()? - want).abs() < 1e-12);
        Ok(())
    }

    #[test]
    fn bad_k_and_term_shapes_are_refused() -> Result<()> {
        let l = logits(3, 4, 1)?;
        assert!(forward(&l, 0, true).is_err() && forward(&l, 5, true).is_err());
        let r = forward(&l, 2, true)?;
        let bad = LossTerms { balance: Some(Tensor::zeros(3, DType::F64, &Device::Cpu)?), ..Default::default() };
        assert!(backward(&Tensor::zeros((3, 2), DType::F64, &Device::Cpu)?, &r, &bad).is_err());
        Ok(())
    }
}
