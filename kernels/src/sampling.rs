//! Drawing the next token of every row of a batch from its logits, each row with its own
//! temperature, top-k, top-p and uniform draw: on a GPU one block per row, so the logits
//! (`[rows, vocab]`, 150k columns for Qwen3) never leave the device; the CPU [`reference`]
//! defines the result.
//!
//! The rule, per row (the same on every device):
//! * temperature 0 or top-k 1: the first index of the largest logit (greedy);
//! * otherwise weights `wᵢ = exp((lᵢ − max)/T)`; top-k keeps the logits at least the `k`-th
//!   largest (ties at the threshold kept together), top-p then keeps the largest logits whose
//!   weight reaches `p` of what top-k kept (again whole ties);
//! * the draw `u ∈ [0, 1)` picks the first kept index, in vocabulary order, whose running sum
//!   of kept weights exceeds `u · Σ kept`.
//!
//! Thresholds on values rather than a sorted order make the GPU kernel a few reductions per
//! row (a bisection over the float bits finds the `k`-th value), with no sort.
//! The log-probability returned is the chosen token's under the untempered distribution. A row
//! with no finite logit (NaN or −∞ throughout: a model whose weights diverged) draws token 0, and
//! any NaN in a row makes the log-probability NaN: that is how a caller tells a broken row.

use candle_core::{DType, Result, Tensor};

/// One row's settings and its uniform draw.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RowSampling {
    /// 0 is greedy.
    pub temperature: f32,
    /// In (0, 1]; 1 keeps everything.
    pub top_p: f32,
    /// 0 keeps everything.
    pub top_k: u32,
    /// In [0, 1).
    pub uniform: f32,
}

impl RowSampling {
    pub const GREEDY: RowSampling = RowSampling { temperature: 0.0, top_p: 1.0, top_k: 0, uniform: 0.0 };

    fn greedy(&self) -> bool {
        self.temperature <= 0.0 || self.top_k == 1
    }
}

/// `logits` `[rows, vocab]` → per row, the token drawn and its log-probability.
pub fn sample(logits: &Tensor, rows: &[RowSampling]) -> Result<Vec<(u32, f32)>> {
    launch(logits, rows)?.read()
}

/// Draws launched on the logits' device: the ids stay there for a step that decodes them
/// ([`Draws::ids`]) while they travel to the host ([`Draws::read`]). On a GPU nothing here waits
/// for the device, so the host can queue the next step before reading this one's tokens.
pub fn launch(logits: &Tensor, rows: &[RowSampling]) -> Result<Draws> {
    let _profile = crate::profile::scope("sampling", logits.device());
    let (n, vocab) = logits.dims2()?;
    if n != rows.len() || vocab == 0 {
        candle_core::bail!("sampling: {} rows of settings for logits {:?}", rows.len(), logits.dims());
    }
    #[cfg(feature = "cuda")]
    if logits.device().is_cuda() {
        return Ok(Draws(Drawn::Device(crate::gpu::sampling::queue(logits, rows)?)));
    }
    let drawn = reference::sample(logits, rows)?;
    let ids = Tensor::new(drawn.iter().map(|d| d.0).collect::<Vec<u32>>().as_slice(), logits.device())?;
    Ok(Draws(Drawn::Host { drawn, ids }))
}

/// One batch of draws, on the device and on its way to the host.
pub struct Draws(Drawn);

enum Drawn {
    Host {
        drawn: Vec<(u32, f32)>,
        ids: Tensor,
    },
    #[cfg(feature = "cuda")]
    Device(crate::gpu::sampling::Pending),
}

impl Draws {
    /// The drawn ids, `[rows]` u32 on the logits' device.
    pub fn ids(&self) -> &Tensor {
        match &self.0 {
            Drawn::Host { ids, .. } => ids,
            #[cfg(feature = "cuda")]
            Drawn::Device(p) => p.ids(),
        }
    }

    /// Per row, the token drawn and its log-probability (waits for the device's copy).
    pub fn read(self) -> Result<Vec<(u32, f32)>> {
        match self.0 {
            Drawn::Host { drawn, .. } => Ok(drawn),
            #[cfg(feature = "cuda")]
            Drawn::Device(p) => p.read(),
        }
    }
}

/// The rule on the host, in f64.
pub mod reference {
    use super::*;

    pub fn sample(logits: &Tensor, rows: &[RowSampling]) -> Result<Vec<(u32, f32)>> {
        let all = logits.to_dtype(DType::F32)?.to_vec2::<f32>()?;
        Ok(all.iter().zip(rows).map(|(l, r)| row(l, r)).collect())
    }

    /// One row.
    pub fn row(logits: &[f32], s: &RowSampling) -> (u32, f32) {
        let l: Vec<f64> = logits.iter().map(|&x| f64::from(x)).collect();
        let max = l.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        if max == f64::NEG_INFINITY {
            // NaN or −∞ throughout (`f64::max` passes over NaN): nothing to draw from.
            return (0, f32::NAN);
        }
        let lse = max + l.iter().map(|x| (x - max).exp()).sum::<f64>().ln();
        let pick = |i: usize| (i as u32, (l[i] - lse) as f32);
        if s.greedy() {
            return pick(l.iter().position(|&x| x == max).unwrap_or(0));
        }
        let t = f64::from(s.temperature);
        let w: Vec<f64> = l.iter().map(|x| ((x - max) / t).exp()).collect();
        let mut sorted = l.clone();
        sorted.sort_by(|a, b| b.total_cmp(a));
        let mut cut = f64::NEG_INFINITY;
        let k = s.top_k as usize;
        if k > 0 && k < l.len() {
            cut = sorted[k - 1];
        }
        if s.top_p < 1.0 {
            let kept: f64 = l.iter().zip(&w).filter(|(x, _)| **x >= cut).map(|(_, w)| w).sum();
            let goal = f64::from(s.top_p) * kept;
            let mut acc = 0.0;
            for &v in sorted.iter().take_while(|&&v| v >= cut) {
                acc += ((v - max) / t).exp();
                if acc >= goal {
                    cut = v;
                    break;
                }
            }
        }
        let mass: f64 = l.iter().zip(&w).filter(|(x, _)| **x >= cut).map(|(_, w)| w).sum();
        let target = f64::from(s.uniform) * mass;
        let mut acc = 0.0;
        let mut last = 0;
        for (i, (&x, &wi)) in l.iter().zip(&w).enumerate() {
            if x >= cut {
                acc += wi;
                last = i;
                if acc > target {
                    return pick(i);
                }
            }
        }
        pick(last)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    fn draw(logits: &[f32], s: RowSampling, draws: usize) -> Vec<u32> {
        (0..draws)
            .map(|i| reference::row(logits, &RowSampling { uniform: (i as f32 + 0.5) / draws as f32, ..s }).0)
            .collect()
    }

    #[test]
    fn greedy_takes_the_first_maximum_and_reports_its_log_probability() {
        let (t, lp) = reference::row(&[0.1, 2.0, 2.0, -1.0], &RowSampling::GREEDY);
        assert_eq!(t, 1);
        let z: f64 = [0.1f64, 2.0, 2.0, -1.0].iter().map(|x| x.exp()).sum();
        assert!((f64::from(lp) - (2.0 - z.ln())).abs() < 1e-6);
        let k1 = RowSampling { temperature: 1.0, top_k: 1, uniform: 0.99, ..RowSampling::GREEDY };
        assert_eq!(reference::row(&[0.0, 3.0, 1.0], &k1).0, 1);
    }

    #[test]
    fn draws_follow_the_distribution_and_top_k_top_p_cut_it() {
        // p = [0.5, 0.3, 0.2]; evenly spread draws land in proportion.
        let l = [0.5f32.ln(), 0.3f32.ln(), 0.2f32.ln()];
        let s = RowSampling { temperature: 1.0, ..RowSampling::GREEDY };
        let d = draw(&l, s, 1000);
        let share = |t| d.iter().filter(|&&x| x == t).count();
        assert_eq!((share(0), share(1), share(2)), (500, 300, 200));
        // top-k 2 renormalises over the first two; top-p 0.6 keeps the same two.
        for cut in [RowSampling { top_k: 2, ..s }, RowSampling { top_p: 0.6, ..s }] {
            let d = draw(&l, cut, 800);
            assert_eq!(d.iter().filter(|&&x| x == 0).count(), 500, "{cut:?}");
            assert!(!d.contains(&2), "{cut:?}");
        }
        // A low temperature sharpens to the mode; ties at the top-k threshold are kept together.
        assert!(draw(&l, RowSampling { temperature: 0.05, ..s }, 100).iter().all(|&t| t == 0));
        let tied = draw(&[1.0, 2.0, 2.0, 0.0], RowSampling { top_k: 2, ..s }, 100);
        assert!(tied.contains(&1) && tied.contains(&2) && !tied.contains(&0));
    }

    #[test]
    fn the_batch_form_runs_each_row_with_its_own_settings() -> Result<()> {
        let logits = Tensor::new(&[[0.0f32, 5.0, 1.0], [3.0, 0.0, 0.0]], &Device::Cpu)?;
        let hot = RowSampling { temperature: 1.0, top_p: 1.0, top_k: 0, uniform: 0.999 };
        let got = sample(&logits, &[hot, RowSampling::GREEDY])?;
        assert_eq!((got[0].0, got[1].0), (2, 0));
        assert!(sample(&logits, &[hot]).is_err());
        Ok(())
    }

    #[test]
    fn rows_without_a_finite_logit_draw_token_0_with_a_nan_log_probability() {
        let hot = RowSampling { temperature: 0.8, top_p: 0.9, top_k: 2, uniform: 0.5 };
        for row in [[f32::NAN; 4], [f32::NEG_INFINITY; 4]] {
            for s in [RowSampling::GREEDY, hot] {
                let (t, lp) = reference::row(&row, &s);
                assert!(t == 0 && lp.is_nan(), "{row:?} {s:?}: {t} {lp}");
            }
        }
        // A finite logit among NaNs is drawn, but its log-probability is NaN (the normaliser sums
        // the NaNs): any NaN in a row shows in what the caller reads.
        let (t, lp) = reference::row(&[f32::NAN, 1.0, f32::NAN], &RowSampling::GREEDY);
        assert!(t == 1 && lp.is_nan(), "{t} {lp}");
    }
}
