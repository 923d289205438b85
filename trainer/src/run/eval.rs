//! Held-out evaluation: loss, perplexity and exact-match accuracy on generated answers; and the
//! recipe's benchmark tasks (`eval.tasks`, scored by [`crate::bench_eval`]).
//!
//! Written as `eval.json`; a recipe's `eval.regression` compares it with a baseline ([`Baseline`]:
//! the run's own base evaluated before the first step, or an earlier run's `eval.json`) and
//! fails the run when held-out accuracy or any task's metric drops by more than the threshold.

use crate::bench_eval::{self, BenchError, Scorer, TasksReport};
use crate::data::{Dataset, PromptItem, Tokenizer, answers_match};
use crate::generate::{Limits, Sampling, generate};
use crate::model::{Adapters, CausalLm, ModelError};
use candle_core::DType;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::ops::ControlFlow;
use std::path::Path;
use thiserror::Error;

/// Tokens generated at most per answer: the task answers are short.
pub const MAX_ANSWER_TOKENS: usize = 96;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EvalReport {
    pub v: u32,
    /// Training step the weights come from (0 = before training).
    pub step: u64,
    pub holdout_examples: usize,
    pub loss: Option<f64>,
    pub perplexity: Option<f64>,
    pub target_tokens: usize,
    /// Prompts scored by exact match, and how many were right.
    pub exact_match_total: usize,
    pub exact_match_correct: usize,
    pub exact_match: Option<f64>,
    /// Exact match per task family, for data from the task generator (empty otherwise).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub by_family: BTreeMap<String, FamilyScore>,
    /// A few generated answers beside their references, for humans.
    pub samples: Vec<EvalSample>,
    /// GRPO and GSPO: the recipe's rewards of completions sampled for held-out prompts
    /// (`prompts`, `completions`, `mean`, `std`, `per_function`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rewards: Option<serde_json::Value>,
    /// The recipe's `eval.tasks`, scored (absent when it lists none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tasks: Option<TasksReport>,
}

/// Exact match on one task family's held-out prompts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FamilyScore {
    pub total: usize,
    pub correct: usize,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EvalSample {
    pub reference: String,
    pub output: String,
    pub correct: bool,
}

#[derive(Debug, Error)]
pub enum EvalError {
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error(transparent)]
    Data(#[from] crate::data::DataError),
    #[error("tensor: {0}")]
    Tensor(#[from] candle_core::Error),
    #[error("{path}: {message}")]
    Baseline { path: String, message: String },
    #[error(
        "eval regression: exact match {now:.4} vs baseline {baseline:.4} ({path}) is {drop_pct:.2}% lower, over the {threshold_pct}% threshold"
    )]
    Regression { now: f64, baseline: f64, drop_pct: f64, threshold_pct: f64, path: String },
    #[error("{0}")]
    TaskRegression(Box<TaskDrop>),
    #[error(transparent)]
    Bench(Box<BenchError>),
    #[error(transparent)]
    Hub(Box<crate::hub::HubError>),
}

// Boxed: the errors of a run stay small.
impl From<BenchError> for EvalError {
    fn from(e: BenchError) -> EvalError {
        EvalError::Bench(Box::new(e))
    }
}

impl From<crate::hub::HubError> for EvalError {
    fn from(e: crate::hub::HubError) -> EvalError {
        EvalError::Hub(Box::new(e))
    }
}

/// A task metric that fell further below the baseline than the gate allows.
#[derive(Debug, Error)]
#[error(
    "eval regression: task {} {} {:.4} vs baseline {:.4} ({path}) is {:.2}% lower, over the {threshold_pct}% threshold",
    drop.task, drop.metric, drop.now, drop.baseline, drop.drop_pct
)]
pub struct TaskDrop {
    pub drop: bench_eval::report::Drop,
    pub threshold_pct: f64,
    pub path: String,
}

/// Evaluates `model` (with `adapters` when given) on the dataset's holdout. `max_prompts`
/// bounds the generation part, which dominates the time.
pub fn evaluate(
    model: &CausalLm,
    adapters: Option<&Adapters>,
    dataset: &Dataset,
    tokenizer: &Tokenizer,
    per_device: usize,
    max_prompts: usize,
    step: u64,
) -> Result<EvalReport, EvalError> {
    let mut loss_sum = 0.0;
    let mut target_tokens = 0;
    for batch in dataset.holdout_batches(per_device)? {
        let losses = model.token_losses(&batch, adapters)?;
        loss_sum += losses.to_dtype(DType::F64)?.sum_all()?.to_scalar::<f64>()?;
        target_tokens += batch.target_tokens();
    }
    let loss = (target_tokens > 0).then(|| loss_sum / target_tokens as f64);
    let prompts: Vec<PromptItem> = dataset.holdout_prompts_max(tokenizer, max_prompts)?;
    let stop = tokenizer.stop_ids();
    let mut correct = 0;
    let mut samples = Vec::new();
    let mut by_family = BTreeMap::new();
    for item in &prompts {
        let mut ids = Vec::new();
        let greedy = Sampling::greedy();
        let limits = Limits { max_tokens: MAX_ANSWER_TOKENS, vocab: tokenizer.vocab_size(), stop_ids: &stop };
        generate(model, adapters, &item.prompt_ids, limits, &greedy, |id| {
            ids.push(id);
            ControlFlow::Continue(())
        })?;
        let output = tokenizer.decode(&ids, true)?;
        let ok = answers_match(&item.reference, &output);
        correct += usize::from(ok);
        if let Some(family) = item.family {
            let score = by_family.entry(family.name().to_owned()).or_insert_with(FamilyScore::default);
            score.total += 1;
            score.correct += usize::from(ok);
        }
        if samples.len() < 5 {
            samples.push(EvalSample { reference: item.reference.clone(), output, correct: ok });
        }
    }
    Ok(EvalReport {
        v: 1,
        step,
        holdout_examples: dataset.holdout_len(),
        loss,
        perplexity: loss.map(f64::exp),
        target_tokens,
        exact_match_total: prompts.len(),
        exact_match_correct: correct,
        exact_match: (!prompts.is_empty()).then(|| correct as f64 / prompts.len() as f64),
        by_family,
        samples,
        rewards: None,
        tasks: None,
    })
}

/// Scores `eval.tasks` of `recipe` (`None` when it lists none) with the task data of the
/// environment's Hugging Face cache; `note` hears progress lines.
pub fn score_tasks(
    recipe: &crate::recipe::Recipe,
    scorer: &Scorer<'_>,
    note: &mut dyn FnMut(&str),
) -> Result<Option<TasksReport>, EvalError> {
    let eval = &recipe.eval;
    if eval.tasks.is_empty() {
        return Ok(None);
    }
    let cache = crate::hub::HubCache::from_env()?;
    Ok(Some(bench_eval::run_tasks(scorer, &eval.tasks, eval.fewshot as usize, &cache, note)?))
}

/// The file a run keeps its base's evaluation in, when its regression gate compares with it.
pub const BASELINE_FILE: &str = "eval_baseline.json";

/// What a run's `eval.regression.baseline` names.
#[derive(Debug, Clone, PartialEq)]
pub enum Baseline {
    /// The run's own base (`baseline` is its `model.name`), evaluated on the held-out split
    /// before the first step and kept in the run directory as [`BASELINE_FILE`].
    Base,
    /// An earlier run's `eval.json` (a path relative to the recipe), read before the run starts.
    Report { path: String, report: Box<EvalReport> },
}

impl Baseline {
    /// The baseline of `recipe`'s gate, if it has one; a report file is read now, so a missing
    /// or unreadable one stops the run before it trains.
    pub fn of(recipe: &crate::recipe::Recipe, recipe_dir: &Path) -> Result<Option<Baseline>, EvalError> {
        let Some(reg) = &recipe.eval.regression else { return Ok(None) };
        if reg.baseline == recipe.model.name {
            return Ok(Some(Baseline::Base));
        }
        let path = recipe_dir.join(&reg.baseline);
        let report = read_report(&path)?;
        // Every task the run scores must be in the report, or the gate could not compare it.
        let scored = |task: &String| report.tasks.iter().flat_map(|t| &t.scores).any(|s| &s.task == task);
        let missing: Vec<&str> = recipe.eval.tasks.iter().filter(|t| !scored(t)).map(String::as_str).collect();
        if !missing.is_empty() {
            return Err(EvalError::Baseline {
                path: path.display().to_string(),
                message: format!("has no score for eval task {}: the gate could not compare it", missing.join(", ")),
            });
        }
        Ok(Some(Baseline::Report { path: path.display().to_string(), report: Box::new(report) }))
    }
}

/// An `eval.json` (or [`BASELINE_FILE`]) as a run wrote it.
pub fn read_report(path: &Path) -> Result<EvalReport, EvalError> {
    let shown = path.display().to_string();
    let bytes = std::fs::read(path).map_err(|e| EvalError::Baseline { path: shown.clone(), message: e.to_string() })?;
    serde_json::from_slice(&bytes)
        .map_err(|e| EvalError::Baseline { path: shown, message: format!("not an eval.json: {e}") })
}

/// Fails when held-out exact match, or any metric of a benchmark task, fell more than
/// `threshold_pct` percent (relative) below `baseline`'s (named `path` in messages). Every task
/// the report scored must be in the baseline; held-out exact match is compared when both have it.
pub fn check_regression(
    report: &EvalReport,
    baseline: &EvalReport,
    path: &str,
    threshold_pct: f64,
) -> Result<(), EvalError> {
    let path = path.to_string();
    let held_out = report.exact_match.zip(baseline.exact_match);
    if held_out.is_none() && report.tasks.is_none() {
        return Err(EvalError::Baseline {
            path,
            message: "no exact-match score to compare: no held-out prompt was scored (the held-out split is empty, \
                      see eval.holdout, or the run scores none: --eval-prompts)"
                .into(),
        });
    }
    if let Some((now, then)) = held_out {
        let drop_pct = if then > 0.0 { (then - now) / then * 100.0 } else { 0.0 };
        if drop_pct > threshold_pct {
            return Err(EvalError::Regression { now, baseline: then, drop_pct, threshold_pct, path });
        }
    }
    if let Some(tasks) = &report.tasks {
        let empty = TasksReport::default();
        let theirs = baseline.tasks.as_ref().unwrap_or(&empty);
        let missing = tasks.missing_in(theirs);
        if !missing.is_empty() {
            let message =
                format!("the baseline has no score for {}: it was not evaluated on these tasks", missing.join(", "));
            return Err(EvalError::Baseline { path, message });
        }
        if let Some(drop) = tasks.regression(theirs, threshold_pct) {
            return Err(EvalError::TaskRegression(Box::new(TaskDrop { drop, threshold_pct, path })));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(em: Option<f64>) -> EvalReport {
        EvalReport {
            v: 1,
            step: 10,
            holdout_examples: 4,
            loss: Some(1.0),
            perplexity: Some(1.0f64.exp()),
            target_tokens: 10,
            exact_match_total: 4,
            exact_match_correct: 2,
            exact_match: em,
            by_family: BTreeMap::new(),
            samples: vec![],
            rewards: None,
            tasks: None,
        }
    }

    #[test]
    fn regression_threshold_is_relative_to_the_baseline() {
        let base = report(Some(0.5));
        assert!(check_regression(&report(Some(0.48)), &base, "b", 5.0).is_ok());
        let err = check_regression(&report(Some(0.40)), &base, "b", 5.0).unwrap_err();
        assert!(matches!(err, EvalError::Regression { .. }), "{err}");
        assert!(err.to_string().contains("20.00% lower"), "{err}");
        assert!(check_regression(&report(None), &base, "b", 5.0).is_err());
    }

    #[test]
    fn a_task_metric_that_drops_fails_the_gate_naming_task_and_metric() {
        let score = |value| bench_eval::TaskScore {
            task: "mmlu".into(),
            metric: "acc".into(),
            filter: "none".into(),
            value,
            stderr: None,
            n: 4,
        };
        let with = |em, value| EvalReport {
            tasks: Some(TasksReport { scores: vec![score(value)], ..Default::default() }),
            ..report(em)
        };
        assert!(check_regression(&with(None, 0.5), &with(None, 0.5), "b", 0.0).is_ok());
        let err = check_regression(&with(None, 0.25), &with(None, 0.5), "b", 10.0).unwrap_err().to_string();
        assert!(err.contains("task mmlu acc,none") && err.contains("50.00% lower"), "{err}");
        // Held-out exact match is still gated beside the tasks.
        assert!(check_regression(&with(Some(0.1), 0.5), &with(Some(0.5), 0.5), "b", 10.0).is_err());
        let err = check_regression(&with(None, 0.5), &report(None), "b", 10.0).unwrap_err().to_string();
        assert!(err.contains("no score for mmlu acc,none"), "{err}");
    }

    #[test]
    fn a_baseline_report_is_read_before_the_run_and_the_base_named_by_model_name() {
        let dir = tempfile::tempdir().unwrap();
        let src = include_str!("../../../recipes/tiny_cpu_lora.yaml");
        let with = |baseline: &str| {
            let gate = format!("eval:\n  regression:\n    baseline: {baseline}\n    threshold_pct: 5\n  holdout:");
            let text = src.replace("eval:\n  holdout:", &gate);
            crate::recipe::Recipe::from_str(&text, "r.yaml").unwrap_or_else(|e| panic!("{e}")).recipe
        };
        let base = with("mindxtrain/tiny-qwen3");
        assert_eq!(Baseline::of(&base, dir.path()).unwrap(), Some(Baseline::Base));
        let missing = Baseline::of(&with("old/eval.json"), dir.path()).unwrap_err();
        assert!(missing.to_string().contains("old/eval.json"), "{missing}");
        std::fs::create_dir(dir.path().join("old")).unwrap();
        std::fs::write(dir.path().join("old/eval.json"), b"{}").unwrap();
        let bad = Baseline::of(&with("old/eval.json"), dir.path()).unwrap_err();
        assert!(bad.to_string().contains("not an eval.json"), "{bad}");
        std::fs::write(dir.path().join("old/eval.json"), serde_json::to_vec(&report(Some(0.5))).unwrap()).unwrap();
        match Baseline::of(&with("old/eval.json"), dir.path()).unwrap() {
            Some(Baseline::Report { report, .. }) => assert_eq!(report.exact_match, Some(0.5)),
            other => panic!("{other:?}"),
        }
    }
}
