//! Benchmark tasks (a recipe's `eval.tasks`) scored in-process, as lm-evaluation-harness 0.4
//! scores them: the same prompts, few-shot contexts, targets, answer extraction and metrics,
//! from task data on disk (the datasets the harness names, as the Hugging Face cache holds
//! them; nothing is fetched).
//!
//! * [`registry`]: the built-in tasks, their datasets, and the tasks refused by name.
//! * [`docs`]: a task's rows as documents (prompt, choices or reference), few-shot contexts.
//! * [`loglik`]: multiple choice by each choice's log-likelihood (the trainer's forward).
//! * [`generation`]: greedy generation until a stop string (the dense decoder).
//! * [`ifeval`]: IFEval's instruction checks, strict and loose, and its task.
//! * [`metrics`]: answer extraction, exact match, means and their standard errors.
//! * [`report`]: what `eval.json` records per task, and the regression comparison.

pub mod docs;
pub mod generation;
pub mod ifeval;
pub mod loglik;
pub mod metrics;
pub mod registry;
pub mod report;

pub use registry::{TaskId, refusal};
pub use report::{TaskOutcome, TaskScore, TasksReport};

use crate::data::{DataError, Tokenizer};
use crate::hub::{HubCache, HubError};
use crate::model::{Adapters, CausalLm, ModelError};

#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// The task's dataset is not in the cache: the error names where it looked and the fetch
    /// command that fills it.
    #[error("eval task {task}: {source}")]
    Missing { task: &'static str, source: HubError },
    #[error("eval task {task}: {source}")]
    Data { task: &'static str, source: DataError },
    #[error("eval task {task}: {message}")]
    Task { task: &'static str, message: String },
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error("{0:?} is not a benchmark task this build runs: {1}")]
    Unsupported(String, String),
}

/// The model a task is scored with.
pub struct Scorer<'a> {
    pub model: &'a CausalLm,
    pub adapters: Option<&'a Adapters>,
    pub tokenizer: &'a Tokenizer,
}

/// Runs every task of `names` with `fewshot` examples each; `progress` hears a line now and
/// then (a task started, every few hundred requests, a task done).
pub fn run_tasks(
    scorer: &Scorer<'_>,
    names: &[String],
    fewshot: usize,
    cache: &HubCache,
    progress: &mut dyn FnMut(&str),
) -> Result<TasksReport, BenchError> {
    let mut report = TasksReport { fewshot: fewshot as u32, ..TasksReport::default() };
    for name in names {
        let task = TaskId::parse(name)?;
        let shots = if task.kind() == registry::Kind::Instructions { 0 } else { fewshot };
        let set = docs::load(task, shots, cache)?;
        progress(&format!("eval task {}: {} documents, {shots}-shot", task.name(), set.docs.len()));
        let outcome = match task.kind() {
            registry::Kind::Choice => loglik::run(scorer, task, &set.docs, progress)?,
            registry::Kind::Generate => generation::run(scorer, task, &set.docs, progress)?,
            registry::Kind::Instructions => ifeval::task::run(scorer, task, &set.docs, progress)?,
        };
        for s in &outcome.scores {
            progress(&format!("eval task {}: {} ({}) {:.4}", task.name(), s.metric, s.filter, s.value));
        }
        report.data.insert(task.name().to_owned(), set.source);
        report.scores.extend(outcome.scores);
    }
    Ok(report)
}

#[cfg(test)]
mod tests;
