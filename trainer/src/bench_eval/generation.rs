//! Generative tasks (gsm8k): the greedy answer from the dense decoder, ended at the first of
//! the task's stop strings (or the model's end token, or the harness's 256-token default), then
//! the task's filters and exact match.

use std::ops::ControlFlow;

use super::docs::Doc;
use super::loglik::metric_filtered;
use super::metrics::Gsm8kFilters;
use super::registry::TaskId;
use super::report::{Sample, TaskOutcome};
use super::{BenchError, Scorer};
use crate::generate::{Limits, Sampling, generate};

/// gsm8k's `until`.
pub const UNTIL: [&str; 3] = ["Question:", "</s>", "<|im_end|>"];
/// The harness's `max_gen_toks` when a task sets none.
pub const MAX_GEN_TOKS: usize = 256;

/// The greedy continuation of `prompt`, cut before the first of `until`.
pub fn generate_until(
    scorer: &Scorer<'_>,
    task: TaskId,
    prompt: &str,
    until: &[&str],
    max_tokens: usize,
) -> Result<String, BenchError> {
    let data = |source| BenchError::Data { task: task.name(), source };
    let ids = scorer.tokenizer.encode_as_hf(prompt, false).map_err(data)?;
    let stop_ids = scorer.tokenizer.stop_ids();
    let limits = Limits { max_tokens, vocab: scorer.tokenizer.vocab_size(), stop_ids: &stop_ids };
    let mut out = Vec::new();
    let mut failed = None;
    generate(scorer.model, scorer.adapters, &ids, limits, &Sampling::greedy(), |id| {
        out.push(id);
        match scorer.tokenizer.decode(&out, false) {
            Ok(text) if until.iter().any(|u| text.contains(u)) => ControlFlow::Break(()),
            Ok(_) => ControlFlow::Continue(()),
            Err(e) => {
                failed = Some(e);
                ControlFlow::Break(())
            }
        }
    })?;
    if let Some(e) = failed {
        return Err(data(e));
    }
    let text = scorer.tokenizer.decode(&out, false).map_err(data)?;
    let cut = until.iter().filter_map(|u| text.find(u)).min().unwrap_or(text.len());
    Ok(text[..cut].to_owned())
}

/// Scores every document of a generative task.
pub fn run(
    scorer: &Scorer<'_>,
    task: TaskId,
    docs: &[Doc],
    progress: &mut dyn FnMut(&str),
) -> Result<TaskOutcome, BenchError> {
    let filters = Gsm8kFilters::new();
    let (mut samples, mut strict_ok, mut flexible_ok) = (Vec::new(), Vec::new(), Vec::new());
    for (i, doc) in docs.iter().enumerate() {
        let Doc::Generate { prompt, reference } = doc else {
            return Err(BenchError::Task {
                task: task.name(),
                message: "a multiple-choice document in a generative task".into(),
            });
        };
        let output = generate_until(scorer, task, prompt, &UNTIL, MAX_GEN_TOKS)?;
        let (strict, flexible) = filters.extract(&output);
        strict_ok.push(f64::from(u8::from(filters.exact_match(&strict, reference))));
        flexible_ok.push(f64::from(u8::from(filters.exact_match(&flexible, reference))));
        samples.push(Sample::Generate { output, strict, flexible });
        if (i + 1) % 50 == 0 {
            progress(&format!("eval task {}: {}/{} answers generated", task.name(), i + 1, docs.len()));
        }
    }
    let scores = vec![
        metric_filtered(task, "exact_match", "strict-match", &strict_ok),
        metric_filtered(task, "exact_match", "flexible-extract", &flexible_ok),
    ];
    Ok(TaskOutcome { scores, samples })
}
