//! Group-relative advantages: each completion's reward against the other completions of the
//! same prompt, `(r − mean) / (std + 1e-4)`, with the sample standard deviation (n − 1), as
//! GRPO's paper and TRL's `scale_rewards` do. A group whose completions all scored alike
//! teaches nothing: its advantages are 0.

/// Added to the group's standard deviation (TRL's constant).
pub const STD_EPS: f64 = 1e-4;

/// Advantages of `rewards`, laid out as consecutive groups of `group` completions.
pub fn group_advantages(rewards: &[f64], group: usize) -> Vec<f64> {
    let group = group.max(1);
    rewards
        .chunks(group)
        .flat_map(|g| {
            let n = g.len() as f64;
            let mean = g.iter().sum::<f64>() / n;
            let var = if g.len() > 1 { g.iter().map(|r| (r - mean).powi(2)).sum::<f64>() / (n - 1.0) } else { 0.0 };
            let std = var.sqrt();
            g.iter().map(move |r| (r - mean) / (std + STD_EPS))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn advantages_are_normalised_within_each_group() {
        let a = group_advantages(&[1.0, 0.0, 0.0, 1.0, 2.0, 2.0, 2.0, 2.0], 4);
        let s = (1.0f64 / 3.0).sqrt(); // sample std of [1, 0, 0, 1]
        for (got, want) in a[..4].iter().zip([0.5, -0.5, -0.5, 0.5]) {
            assert!((got - want / (s + STD_EPS)).abs() < 1e-12, "{a:?}");
        }
        assert_eq!(&a[4..], &[0.0; 4], "a group that scored alike teaches nothing");
        assert!(a[..4].iter().sum::<f64>().abs() < 1e-12);
    }
}
