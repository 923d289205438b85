//! The clipped policy-gradient loss of GRPO (token-level ratios) and GSPO (sequence-level),
//! with GRPO's KL term to the reference, on the host in f64: log-probs in, the loss and its
//! derivative per token out ([`crate::model::CausalLm::forward_backward_logps`] does the rest).
//!
//! For a completion `o` of `n` tokens with advantage `A`, log-probs `lp` under the policy,
//! `old` under the policy that sampled it and `ref` under the reference:
//!
//! * GRPO (`Ratio::Token`): `L = (1/n) Σ_t [ −min(r_t A, clip(r_t, 1−ε, 1+ε) A) + β k3_t ]`
//!   with `r_t = exp(lp_t − old_t)`;
//! * GSPO (`Ratio::Sequence`, Zheng et al. 2025, eq. 5–7): one ratio per completion,
//!   `s = exp((1/n) Σ_t (lp_t − old_t))`, and `L = −min(s A, clip(s, 1−ε, 1+ε) A) + β (1/n) Σ_t k3_t`;
//! * `k3_t = exp(ref_t − lp_t) − (ref_t − lp_t) − 1`, the unbiased, non-negative KL estimator
//!   GRPO uses (Schulman's k3).
//!
//! A step's loss is the mean of `L` over its completions. A ratio is *clipped* where the
//! clipped branch wins (`A > 0` above `1+ε`, `A < 0` below `1−ε`): there the gradient is 0.

/// Where the importance ratio is taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ratio {
    /// One ratio per token (GRPO).
    Token,
    /// One length-normalised ratio per completion (GSPO).
    Sequence,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PolicyLoss {
    pub ratio: Ratio,
    pub clip_epsilon: f64,
    pub kl_coef: f64,
}

/// One completion's tokens: log-probs under the policy, the sampling policy and (when the KL
/// term is on) the reference.
#[derive(Debug, Clone, Copy)]
pub struct Completion<'a> {
    pub logp: &'a [f64],
    pub old: &'a [f64],
    pub reference: Option<&'a [f64]>,
    pub advantage: f64,
}

/// One completion's loss, its derivative per token, and what the step reports.
#[derive(Debug, Clone, PartialEq)]
pub struct Terms {
    pub loss: f64,
    pub d_logp: Vec<f64>,
    /// Clipped ratios, and ratios in all (tokens for GRPO, 1 for GSPO).
    pub clipped: usize,
    pub ratios: usize,
    /// Sum of `k3` over the tokens (0 without a reference).
    pub kl_sum: f64,
}

impl PolicyLoss {
    pub fn completion(&self, c: &Completion<'_>) -> Terms {
        let n = c.logp.len();
        if n == 0 {
            return Terms { loss: 0.0, d_logp: Vec::new(), clipped: 0, ratios: 0, kl_sum: 0.0 };
        }
        let inv_n = 1.0 / n as f64;
        let (lo, hi) = (1.0 - self.clip_epsilon, 1.0 + self.clip_epsilon);
        let a = c.advantage;
        let clipped_at = |r: f64| (a > 0.0 && r > hi) || (a < 0.0 && r < lo);
        let mut d_logp = vec![0.0; n];
        let mut loss = 0.0;
        let mut clipped = 0;
        let ratios = match self.ratio {
            Ratio::Token => {
                for ((d, lp), old) in d_logp.iter_mut().zip(c.logp).zip(c.old) {
                    let r = (lp - old).exp();
                    if clipped_at(r) {
                        clipped += 1;
                        loss -= r.clamp(lo, hi) * a * inv_n;
                    } else {
                        loss -= r * a * inv_n;
                        *d = -a * r * inv_n;
                    }
                }
                n
            }
            Ratio::Sequence => {
                let log_s = (0..n).map(|t| c.logp[t] - c.old[t]).sum::<f64>() * inv_n;
                let s = log_s.exp();
                if clipped_at(s) {
                    clipped = 1;
                    loss -= s.clamp(lo, hi) * a;
                } else {
                    loss -= s * a;
                    d_logp.iter_mut().for_each(|d| *d = -a * s * inv_n);
                }
                1
            }
        };
        let mut kl_sum = 0.0;
        if let Some(reference) = c.reference {
            for ((d, lp), rf) in d_logp.iter_mut().zip(c.logp).zip(reference) {
                let diff = rf - lp;
                kl_sum += diff.exp() - diff - 1.0;
                *d += self.kl_coef * inv_n * (1.0 - diff.exp());
            }
            loss += self.kl_coef * inv_n * kl_sum;
        }
        Terms { loss, d_logp, clipped, ratios, kl_sum }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::rng::SplitMix64;

    fn check_fd(loss: PolicyLoss, c: &Completion<'_>) {
        let terms = loss.completion(c);
        let h = 1e-6;
        for t in 0..c.logp.len() {
            let at = |delta: f64| {
                let mut lp = c.logp.to_vec();
                lp[t] += delta;
                loss.completion(&Completion { logp: &lp, ..*c }).loss
            };
            let fd = (at(h) - at(-h)) / (2.0 * h);
            assert!(
                (fd - terms.d_logp[t]).abs() < 1e-6 * (1.0 + fd.abs()),
                "{loss:?} token {t}: fd {fd} vs {}",
                terms.d_logp[t]
            );
        }
    }

    #[test]
    fn derivatives_match_finite_differences_on_both_sides_of_the_clip() {
        let mut rng = SplitMix64::new(5);
        for ratio in [Ratio::Token, Ratio::Sequence] {
            for advantage in [1.3, -0.7] {
                for _ in 0..20 {
                    // Policy and sampler apart by up to ±0.3 nats a token: many ratios clip at ε 0.1.
                    let n = 1 + (rng.next_u64() % 6) as usize;
                    let logp: Vec<f64> = (0..n).map(|_| -3.0 * rng.unit()).collect();
                    let old: Vec<f64> = logp.iter().map(|l| l + 0.6 * (rng.unit() - 0.5)).collect();
                    let reference: Vec<f64> = logp.iter().map(|l| l + (rng.unit() - 0.5)).collect();
                    let c = Completion { logp: &logp, old: &old, reference: Some(&reference), advantage };
                    check_fd(PolicyLoss { ratio, clip_epsilon: 0.1, kl_coef: 0.3 }, &c);
                    check_fd(
                        PolicyLoss { ratio, clip_epsilon: 0.1, kl_coef: 0.0 },
                        &Completion { reference: None, ..c },
                    );
                }
            }
        }
    }

    #[test]
    fn on_policy_the_loss_is_minus_the_advantage_and_nothing_clips() {
        let lp = [-1.0, -2.0, -0.5];
        for ratio in [Ratio::Token, Ratio::Sequence] {
            let t = PolicyLoss { ratio, clip_epsilon: 0.2, kl_coef: 0.04 }.completion(&Completion {
                logp: &lp,
                old: &lp,
                reference: Some(&lp),
                advantage: 2.0,
            });
            assert!((t.loss + 2.0).abs() < 1e-12);
            assert_eq!((t.clipped, t.kl_sum), (0, 0.0));
            // The gradient of the policy term alone: −A/n per token.
            assert!(t.d_logp.iter().all(|d| (d + 2.0 / 3.0).abs() < 1e-12), "{:?}", t.d_logp);
        }
    }

    #[test]
    fn clipping_counts_tokens_for_grpo_and_completions_for_gspo() {
        let lp = [-1.0, -1.0];
        let old = [-1.5, -1.0]; // token 0: ratio e^0.5, token 1: ratio 1
        let c = Completion { logp: &lp, old: &old, reference: None, advantage: 1.0 };
        let grpo = PolicyLoss { ratio: Ratio::Token, clip_epsilon: 0.2, kl_coef: 0.0 }.completion(&c);
        assert_eq!((grpo.clipped, grpo.ratios), (1, 2));
        assert_eq!(grpo.d_logp[0], 0.0);
        let gspo = PolicyLoss { ratio: Ratio::Sequence, clip_epsilon: 0.2, kl_coef: 0.0 }.completion(&c);
        assert_eq!((gspo.clipped, gspo.ratios), (1, 1), "s = e^0.25 > 1.2");
        assert_eq!(gspo.d_logp, [0.0, 0.0]);
        // A negative advantage is clipped below 1 − ε only.
        let neg = PolicyLoss { ratio: Ratio::Token, clip_epsilon: 0.2, kl_coef: 0.0 }
            .completion(&Completion { advantage: -1.0, ..c });
        assert_eq!(neg.clipped, 0);
    }
}
