//! KTO (Ethayarajh et al. 2024), as TRL's `KTOTrainer` computes it. Each example is a prompt
//! with one completion labelled desirable or undesirable; nothing pairs them. With `r` the
//! completion's log-prob ratio to the reference (summed over its tokens) and `z₀` the
//! reference point:
//!
//! * desirable: `w_D · (1 − σ(β (r − z₀)))`, undesirable: `w_U · (1 − σ(β (z₀ − r)))`;
//! * the loss is the mean over the examples;
//! * `z₀ = max(0, mean_j [log π(y'_j | x_j) − log π_ref(y'_j | x_j)])` over *mismatched* pairs,
//!   each prompt with another example's completion (the paper's estimate of
//!   `KL(π ‖ π_ref)`), computed without gradient before the step.

use crate::model::preference::sigmoid;

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct KtoLoss {
    pub beta: f64,
    pub desirable_weight: f64,
    pub undesirable_weight: f64,
}

impl KtoLoss {
    /// One example's loss and its derivative by the policy's sequence log-prob.
    pub fn example(&self, policy: f64, reference: f64, z0: f64, desirable: bool) -> (f64, f64) {
        let r = policy - reference;
        if desirable {
            let s = sigmoid(self.beta * (r - z0));
            (self.desirable_weight * (1.0 - s), -self.desirable_weight * self.beta * s * (1.0 - s))
        } else {
            let s = sigmoid(self.beta * (z0 - r));
            (self.undesirable_weight * (1.0 - s), self.undesirable_weight * self.beta * s * (1.0 - s))
        }
    }
}

/// The reference point from the mismatched pairs' sequence log-probs.
pub fn reference_point(policy: &[f64], reference: &[f64]) -> f64 {
    if policy.is_empty() {
        return 0.0;
    }
    let mean = policy.iter().zip(reference).map(|(p, r)| p - r).sum::<f64>() / policy.len() as f64;
    mean.max(0.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn derivatives_match_finite_differences() {
        let loss = KtoLoss { beta: 0.7, desirable_weight: 1.5, undesirable_weight: 0.8 };
        for desirable in [true, false] {
            for (policy, reference, z0) in [(-3.0, -2.5, 0.1), (-10.0, -14.0, 0.0), (-1.0, -1.0, 2.0)] {
                let (_, d) = loss.example(policy, reference, z0, desirable);
                let h = 1e-6;
                let fd = (loss.example(policy + h, reference, z0, desirable).0
                    - loss.example(policy - h, reference, z0, desirable).0)
                    / (2.0 * h);
                assert!((fd - d).abs() < 1e-8, "{desirable} {policy}: fd {fd} vs {d}");
            }
        }
    }

    #[test]
    fn at_the_reference_the_loss_is_half_the_weight_and_pushes_each_way() {
        let loss = KtoLoss { beta: 0.1, desirable_weight: 1.0, undesirable_weight: 2.0 };
        let (l, d) = loss.example(-4.0, -4.0, 0.0, true);
        assert_eq!((l, d < 0.0), (0.5, true), "raising a desirable completion lowers the loss");
        let (l, d) = loss.example(-4.0, -4.0, 0.0, false);
        assert_eq!((l, d > 0.0), (1.0, true));
    }

    #[test]
    fn the_reference_point_is_a_clamped_mean() {
        assert_eq!(reference_point(&[-1.0, -3.0], &[-2.0, -3.0]), 0.5);
        assert_eq!(reference_point(&[-4.0], &[-2.0]), 0.0, "a KL estimate is never negative");
        assert_eq!(reference_point(&[], &[]), 0.0);
    }
}
