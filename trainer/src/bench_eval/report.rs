//! What a benchmark evaluation records (`eval.json`'s `tasks`): per task and metric its
//! value, standard error and number of documents; and the per-document results behind them.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// One metric of one task.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TaskScore {
    pub task: String,
    /// `acc`, `acc_norm`, `exact_match`, ifeval's `prompt_level_strict_acc`, `inst_level_strict_acc`,
    /// `prompt_level_loose_acc`, `inst_level_loose_acc`.
    pub metric: String,
    /// The answer filter the metric is over (gsm8k's `strict-match`, `flexible-extract`), else
    /// `none`: lm-evaluation-harness's `metric,filter` keys.
    pub filter: String,
    pub value: f64,
    /// Standard error of the mean; `null` below two documents.
    pub stderr: Option<f64>,
    /// Documents scored.
    pub n: usize,
}

/// Every task's scores, with the data each was read from.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TasksReport {
    pub fewshot: u32,
    pub scores: Vec<TaskScore>,
    /// Task → the dataset snapshot read (`hf://datasets/owner/name@commit`).
    pub data: BTreeMap<String, String>,
}

/// One document's result.
#[derive(Debug, Clone, PartialEq)]
pub enum Sample {
    /// Each choice's log-likelihood and whether it is the greedy continuation.
    Choice { loglikelihoods: Vec<(f64, bool)>, gold: usize },
    /// The generated answer (cut at the first stop string) and what each filter extracted.
    Generate { output: String, strict: String, flexible: String },
    /// The generated response and its verdict on each instruction.
    Instructions { output: String, verdicts: super::ifeval::Verdicts },
}

/// A task's scores and the per-document results they come from.
#[derive(Debug, Clone, PartialEq)]
pub struct TaskOutcome {
    pub scores: Vec<TaskScore>,
    pub samples: Vec<Sample>,
}

/// A metric whose value fell more than the threshold below the baseline's.
#[derive(Debug, Clone, PartialEq)]
pub struct Drop {
    pub task: String,
    pub metric: String,
    pub now: f64,
    pub baseline: f64,
    pub drop_pct: f64,
}

impl TasksReport {
    /// The first metric (in this report's order) that dropped more than `threshold_pct` percent
    /// (relative) below the same task, metric and filter in `baseline`; metrics the baseline
    /// lacks are not compared. A baseline of 0 cannot drop.
    pub fn regression(&self, baseline: &TasksReport, threshold_pct: f64) -> Option<Drop> {
        self.scores.iter().find_map(|s| {
            let then = baseline
                .scores
                .iter()
                .find(|b| b.task == s.task && b.metric == s.metric && b.filter == s.filter)?
                .value;
            let drop_pct = if then > 0.0 { (then - s.value) / then * 100.0 } else { 0.0 };
            (drop_pct > threshold_pct).then(|| Drop {
                task: s.task.clone(),
                metric: format!("{},{}", s.metric, s.filter),
                now: s.value,
                baseline: then,
                drop_pct,
            })
        })
    }

    /// Whether the baseline scored every metric this report has, so the gate compares them all.
    pub fn missing_in(&self, baseline: &TasksReport) -> Vec<String> {
        self.scores
            .iter()
            .filter(|s| {
                !baseline.scores.iter().any(|b| b.task == s.task && b.metric == s.metric && b.filter == s.filter)
            })
            .map(|s| format!("{} {},{}", s.task, s.metric, s.filter))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn score(task: &str, metric: &str, value: f64) -> TaskScore {
        TaskScore { task: task.into(), metric: metric.into(), filter: "none".into(), value, stderr: None, n: 4 }
    }

    #[test]
    fn a_drop_beyond_the_threshold_names_the_task_and_metric() {
        let base = TasksReport {
            scores: vec![score("mmlu", "acc", 0.5), score("arc_easy", "acc", 0.8)],
            ..Default::default()
        };
        let now = TasksReport {
            scores: vec![score("mmlu", "acc", 0.49), score("arc_easy", "acc", 0.6)],
            ..Default::default()
        };
        let drop = now.regression(&base, 5.0).unwrap();
        assert_eq!((drop.task.as_str(), drop.metric.as_str()), ("arc_easy", "acc,none"));
        assert!((drop.drop_pct - 25.0).abs() < 1e-9, "{drop:?}");
        assert_eq!(now.regression(&base, 30.0), None);
        // A negative threshold fails any score that did not rise.
        assert_eq!(now.regression(&now, -1.0).map(|d| d.task), Some("mmlu".into()));
        let only_mmlu = TasksReport { scores: vec![score("mmlu", "acc", 0.5)], ..Default::default() };
        assert_eq!(now.missing_in(&only_mmlu), vec!["arc_easy acc,none".to_string()]);
    }
}
