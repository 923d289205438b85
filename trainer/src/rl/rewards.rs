//! The reward functions a recipe lists in `train.method.rewards`, each in its own file with
//! its rule in the module doc: [`exact_match`], [`numeric_match`], [`format`], [`tool_call`]
//! and [`length`]. A function may not apply to a completion (`numeric_match` on a reference
//! with no number): it then adds nothing to the total and is left out of its own mean, as
//! TRL does with a reward that returns `None`. The total reward is the sum of the rest.
//!
//! Each function's definition has a digest, the BLAKE3 of its source files: the run's
//! manifest records it beside the name, so a receipt says exactly which rule scored the
//! completions the model learned from.

pub mod answer;
pub mod exact_match;
pub mod format;
pub mod length;
pub mod numeric_match;
pub mod tool_call;

use serde::{Deserialize, Serialize};

use crate::recipe::Reward;

/// What a reward sees of one completion.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sample<'a> {
    /// The reference answer, as the template writes an assistant turn.
    pub reference: &'a str,
    /// The completion's text (stop tokens not included).
    pub text: &'a str,
    /// Generated tokens, the stop token not counted.
    pub completion_tokens: usize,
    /// The length limit ended it (no stop token).
    pub truncated: bool,
    pub max_new_tokens: usize,
}

/// A reward function as the manifest records it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RewardRecord {
    pub name: String,
    /// BLAKE3 (hex) of the function's source files, in order.
    pub blake3: String,
}

/// The scores of one completion: per function (in the recipe's order), and their total.
#[derive(Debug, Clone, PartialEq)]
pub struct Scores {
    pub values: Vec<Option<f64>>,
    pub total: f64,
}

/// The recipe's reward functions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RewardSet {
    rewards: Vec<Reward>,
}

impl RewardSet {
    pub fn new(rewards: &[Reward]) -> RewardSet {
        RewardSet { rewards: rewards.to_vec() }
    }

    pub fn len(&self) -> usize {
        self.rewards.len()
    }

    pub fn is_empty(&self) -> bool {
        self.rewards.is_empty()
    }

    pub fn names(&self) -> Vec<&'static str> {
        self.rewards.iter().map(|&r| name(r)).collect()
    }

    pub fn score(&self, s: &Sample<'_>) -> Scores {
        let values: Vec<Option<f64>> = self.rewards.iter().map(|&r| function(r)(s)).collect();
        Scores { total: values.iter().flatten().sum(), values }
    }

    /// Names and definition digests, for the manifest.
    pub fn records(&self) -> Vec<RewardRecord> {
        self.rewards
            .iter()
            .map(|&r| {
                let mut h = blake3::Hasher::new();
                for source in sources(r) {
                    h.update(source.as_bytes());
                }
                RewardRecord { name: name(r).to_string(), blake3: h.finalize().to_hex().to_string() }
            })
            .collect()
    }
}

/// The recipe's name of a reward.
pub fn name(r: Reward) -> &'static str {
    match r {
        Reward::ExactMatch => "exact_match",
        Reward::NumericMatch => "numeric_match",
        Reward::Format => "format",
        Reward::Length => "length",
        Reward::ToolCall => "tool_call",
    }
}

fn function(r: Reward) -> fn(&Sample<'_>) -> Option<f64> {
    match r {
        Reward::ExactMatch => exact_match::score,
        Reward::NumericMatch => numeric_match::score,
        Reward::Format => format::score,
        Reward::Length => length::score,
        Reward::ToolCall => tool_call::score,
    }
}

fn sources(r: Reward) -> &'static [&'static str] {
    match r {
        Reward::ExactMatch => exact_match::SOURCES,
        Reward::NumericMatch => numeric_match::SOURCES,
        Reward::Format => format::SOURCES,
        Reward::Length => length::SOURCES,
        Reward::ToolCall => tool_call::SOURCES,
    }
}

/// Per-function means over the completions each applied to (`None` where it applied to none),
/// and the mean and standard deviation of the totals.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RewardStats {
    pub per_function: Vec<(String, Option<f64>)>,
    pub mean: f64,
    pub std: f64,
}

impl RewardStats {
    pub fn of(set: &RewardSet, scores: &[Scores]) -> RewardStats {
        let per_function = set
            .names()
            .into_iter()
            .enumerate()
            .map(|(i, n)| {
                let applied: Vec<f64> = scores.iter().filter_map(|s| s.values[i]).collect();
                (n.to_string(), (!applied.is_empty()).then(|| applied.iter().sum::<f64>() / applied.len() as f64))
            })
            .collect();
        let totals: Vec<f64> = scores.iter().map(|s| s.total).collect();
        let (mean, std) = mean_std(&totals);
        RewardStats { per_function, mean, std }
    }

    /// `{name: mean}` for events.
    pub fn to_json(&self) -> serde_json::Value {
        self.per_function
            .iter()
            .map(|(n, m)| (n.clone(), serde_json::json!(m)))
            .collect::<serde_json::Map<_, _>>()
            .into()
    }
}

/// Mean and population standard deviation (0, 0 for nothing).
pub fn mean_std(xs: &[f64]) -> (f64, f64) {
    if xs.is_empty() {
        return (0.0, 0.0);
    }
    let n = xs.len() as f64;
    let mean = xs.iter().sum::<f64>() / n;
    (mean, (xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n).sqrt())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn totals_skip_rewards_that_do_not_apply() {
        let set = RewardSet::new(&[Reward::NumericMatch, Reward::Format, Reward::ToolCall]);
        let s = Sample { reference: "12", text: "12", completion_tokens: 2, truncated: false, max_new_tokens: 8 };
        let scored = set.score(&s);
        assert_eq!(scored.values, [Some(1.0), Some(1.0), None]);
        assert_eq!(scored.total, 2.0);
        let wrong = set.score(&Sample { text: "13", truncated: true, ..s });
        assert_eq!(wrong.total, 0.0);
        let stats = RewardStats::of(&set, &[scored, wrong]);
        assert_eq!(stats.per_function[0], ("numeric_match".to_string(), Some(0.5)));
        assert_eq!(stats.per_function[2], ("tool_call".to_string(), None));
        assert_eq!((stats.mean, stats.std), (1.0, 1.0));
        assert_eq!(stats.to_json()["format"], 0.5);
    }

    #[test]
    fn every_reward_has_a_distinct_digest_of_its_definition() {
        let all = [Reward::ExactMatch, Reward::NumericMatch, Reward::Format, Reward::Length, Reward::ToolCall];
        let records = RewardSet::new(&all).records();
        let names: Vec<&str> = records.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(names, ["exact_match", "numeric_match", "format", "length", "tool_call"]);
        let digests: std::collections::BTreeSet<&str> = records.iter().map(|r| r.blake3.as_str()).collect();
        assert_eq!(digests.len(), 5);
        assert!(records.iter().all(|r| r.blake3.len() == 64));
        // The recipe spells each reward as its record does.
        for (r, rec) in all.iter().zip(&records) {
            assert_eq!(serde_json::to_value(r).unwrap(), serde_json::json!(rec.name));
        }
    }
}
