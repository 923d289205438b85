//! Multiple-choice tasks by log-likelihood: each choice's `ln p(" " + choice | context)` from
//! the trainer's forward over context and choice (the log-softmax the server's `/v1/completions`
//! scores with), the highest one picked (`acc`), and per character of the choice (`acc_norm`).

use super::docs::Doc;
use super::metrics::{argmax, mean_stderr};
use super::registry::TaskId;
use super::report::{Sample, TaskOutcome, TaskScore};
use super::{BenchError, Scorer};
use crate::infer::score::score;

/// Requests between two progress lines.
const PROGRESS_EVERY: usize = 500;

/// `ln p(continuation | context)` and whether every continuation token is the most likely
/// one there. Tokenised as the harness does: trailing spaces of the context move to the
/// continuation, the whole is encoded once and the continuation is what follows the context's
/// own tokens in it.
pub fn loglikelihood(
    scorer: &Scorer<'_>,
    task: TaskId,
    context: &str,
    continuation: &str,
) -> Result<(f64, bool), BenchError> {
    let kept = context.trim_end_matches(' ');
    let moved = &context[kept.len()..];
    let encode = |text: &str| {
        scorer.tokenizer.encode_as_hf(text, false).map_err(|source| BenchError::Data { task: task.name(), source })
    };
    let whole = encode(&format!("{kept}{moved}{continuation}"))?;
    let head = encode(kept)?.len();
    if head == 0 || head >= whole.len() {
        return Err(BenchError::Task {
            task: task.name(),
            message: format!(
                "nothing to score: context {kept:?} and continuation {continuation:?} tokenise to {} and {} tokens",
                head,
                whole.len().saturating_sub(head)
            ),
        });
    }
    let scored = score(scorer.model, scorer.adapters, &whole, scorer.tokenizer.vocab_size(), 1)?;
    // `scored[i]` scores `whole[i + 1]`: the continuation's tokens are `scored[head - 1..]`.
    let tail = &scored[head - 1..];
    let ll = tail.iter().map(|t| f64::from(t.logprob)).sum();
    let greedy = tail.iter().all(|t| t.top.first().is_some_and(|&(id, _)| id == t.id));
    Ok((ll, greedy))
}

/// Scores every document of a multiple-choice task.
pub fn run(
    scorer: &Scorer<'_>,
    task: TaskId,
    docs: &[Doc],
    progress: &mut dyn FnMut(&str),
) -> Result<TaskOutcome, BenchError> {
    let total: usize = docs.iter().map(|d| if let Doc::Choice { choices, .. } = d { choices.len() } else { 0 }).sum();
    let (mut done, mut samples, mut acc, mut acc_norm) = (0, Vec::new(), Vec::new(), Vec::new());
    for doc in docs {
        let Doc::Choice { context, choices, gold } = doc else {
            return Err(BenchError::Task {
                task: task.name(),
                message: "a generation document in a multiple-choice task".into(),
            });
        };
        let mut lls = Vec::with_capacity(choices.len());
        for choice in choices {
            lls.push(loglikelihood(scorer, task, context, &format!(" {choice}"))?);
            done += 1;
            if done % PROGRESS_EVERY == 0 {
                progress(&format!("eval task {}: {done}/{total} choices scored", task.name()));
            }
        }
        let plain: Vec<f64> = lls.iter().map(|l| l.0).collect();
        // The harness divides by the choice's length in characters (without the space).
        let per_char: Vec<f64> =
            plain.iter().zip(choices).map(|(ll, c)| ll / c.chars().count().max(1) as f64).collect();
        acc.push(f64::from(u8::from(argmax(&plain) == *gold)));
        acc_norm.push(f64::from(u8::from(argmax(&per_char) == *gold)));
        samples.push(Sample::Choice { loglikelihoods: lls, gold: *gold });
    }
    let mut scores = vec![metric(task, "acc", &acc)];
    // MMLU's choices are letters: the harness reports acc alone.
    if task != TaskId::Mmlu {
        scores.push(metric(task, "acc_norm", &acc_norm));
    }
    Ok(TaskOutcome { scores, samples })
}

pub(super) fn metric(task: TaskId, name: &str, values: &[f64]) -> TaskScore {
    metric_filtered(task, name, "none", values)
}

pub(super) fn metric_filtered(task: TaskId, name: &str, filter: &str, values: &[f64]) -> TaskScore {
    let (value, stderr) = mean_stderr(values);
    TaskScore { task: task.name().into(), metric: name.into(), filter: filter.into(), value, stderr, n: values.len() }
}
