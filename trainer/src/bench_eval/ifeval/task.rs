//! The `ifeval` task: `google/IFEval`'s `train` split (`key`, `prompt`, `instruction_id_list`,
//! `kwargs`), zero-shot, the prompt as is (the harness applies no chat template unless asked),
//! a greedy response until the model's end token, [`MAX_GEN_TOKS`] tokens or a full context
//! (the harness has no stop strings for it), each instruction checked strictly and loosely.
//!
//! Metrics, as the harness's `ifeval.yaml`: `prompt_level_{strict,loose}_acc` (all of a prompt's
//! instructions followed; mean and its standard error) and `inst_level_{strict,loose}_acc` (every
//! instruction of every prompt; the harness aggregates them with its own function, for which it
//! reports no standard error: `stderr` is null).

use super::super::docs::{Doc, Fields};
use super::super::generation::generate_until;
use super::super::loglik::metric;
use super::super::registry::TaskId;
use super::super::report::{Sample, TaskOutcome, TaskScore};
use super::super::{BenchError, Scorer};
use super::{IfevalError, Instruction, Verdicts, verdicts};
use crate::data::Json;

/// `ifeval.yaml`'s `max_gen_toks`.
pub const MAX_GEN_TOKS: usize = 1280;

/// One IFEval prompt with its instructions (ids and kwargs as the dataset holds them).
#[derive(Debug, Clone, PartialEq)]
pub struct Prompt {
    pub key: i128,
    pub prompt: String,
    pub instructions: Vec<(String, Json)>,
}

impl Prompt {
    /// A dataset row; its instructions are built once here so that a bad one fails the load.
    pub(in crate::bench_eval) fn from_row(f: &Fields<'_>) -> Result<Prompt, String> {
        let key = match f.get("key")? {
            Json::Int(k) => *k,
            other => return Err(format!("`key` is not an integer: {}", other.to_python_json())),
        };
        let ids = f.texts("instruction_id_list")?;
        let kwargs = match f.get("kwargs")? {
            Json::Array(items) => items.clone(),
            other => return Err(format!("`kwargs` is not a list: {}", other.to_python_json())),
        };
        if ids.len() != kwargs.len() {
            return Err(format!("{} instruction ids for {} kwargs", ids.len(), kwargs.len()));
        }
        let prompt = Prompt { key, prompt: f.text("prompt")?, instructions: ids.into_iter().zip(kwargs).collect() };
        prompt.build().map_err(|e| format!("key {key}: {e}"))?;
        Ok(prompt)
    }

    pub fn build(&self) -> Result<Vec<Instruction>, IfevalError> {
        self.instructions.iter().map(|(id, kwargs)| Instruction::new(id, kwargs)).collect()
    }
}

/// The four metrics over each prompt's verdicts.
pub fn scores(task: TaskId, all: &[Verdicts]) -> Vec<TaskScore> {
    let as_f64 = |b: bool| f64::from(u8::from(b));
    let prompt_level = |pick: fn(&Verdicts) -> &Vec<bool>| -> Vec<f64> {
        all.iter().map(|v| as_f64(pick(v).iter().all(|&b| b))).collect()
    };
    let inst_level = |name: &str, pick: fn(&Verdicts) -> &Vec<bool>| {
        let flat: Vec<f64> = all.iter().flat_map(|v| pick(v).iter().map(|&b| as_f64(b))).collect();
        let value = flat.iter().sum::<f64>() / flat.len() as f64;
        TaskScore { stderr: None, value, n: all.len(), ..metric(task, name, &[]) }
    };
    vec![
        metric(task, "prompt_level_strict_acc", &prompt_level(|v| &v.strict)),
        inst_level("inst_level_strict_acc", |v| &v.strict),
        metric(task, "prompt_level_loose_acc", &prompt_level(|v| &v.loose)),
        inst_level("inst_level_loose_acc", |v| &v.loose),
    ]
}

/// Generates a response to every prompt and scores them.
pub fn run(
    scorer: &Scorer<'_>,
    task: TaskId,
    docs: &[Doc],
    progress: &mut dyn FnMut(&str),
) -> Result<TaskOutcome, BenchError> {
    let bad = |message: String| BenchError::Task { task: task.name(), message };
    let (mut samples, mut all) = (Vec::new(), Vec::new());
    progress(&format!(
        "eval task {}: greedy responses of up to {MAX_GEN_TOKS} tokens (fewer where the context fills first)",
        task.name()
    ));
    for (i, doc) in docs.iter().enumerate() {
        let Doc::Instructions(p) = doc else {
            return Err(bad("a document of another task in ifeval".into()));
        };
        let instructions = p.build().map_err(|e| bad(e.to_string()))?;
        let output = generate_until(scorer, task, &p.prompt, &[], MAX_GEN_TOKS)?;
        let v = verdicts(&instructions, &output);
        samples.push(Sample::Instructions { output, verdicts: v.clone() });
        all.push(v);
        if (i + 1) % 50 == 0 {
            progress(&format!("eval task {}: {}/{} responses generated", task.name(), i + 1, docs.len()));
        }
    }
    Ok(TaskOutcome { scores: scores(task, &all), samples })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_four_metrics_are_the_harness_s_aggregations() {
        let v = |s: &[bool], l: &[bool]| Verdicts { strict: s.to_vec(), loose: l.to_vec() };
        let all =
            [v(&[true, false], &[true, true]), v(&[true], &[true]), v(&[false, false, true], &[false, true, true])];
        let s = scores(TaskId::Ifeval, &all);
        let got: Vec<(&str, f64, Option<f64>, usize)> =
            s.iter().map(|s| (s.metric.as_str(), s.value, s.stderr, s.n)).collect();
        // Prompt level: [0, 1, 0] strict, [1, 1, 0] loose; instruction level: 3/6 and 5/6.
        assert_eq!(got[0].0, "prompt_level_strict_acc");
        assert!((got[0].1 - 1.0 / 3.0).abs() < 1e-12 && (got[0].2.unwrap() - (1.0f64 / 9.0).sqrt()).abs() < 1e-12);
        assert_eq!((got[1].0, got[1].1, got[1].2, got[1].3), ("inst_level_strict_acc", 0.5, None, 3));
        assert!((got[2].1 - 2.0 / 3.0).abs() < 1e-12 && got[2].0 == "prompt_level_loose_acc");
        assert_eq!((got[3].0, got[3].2), ("inst_level_loose_acc", None));
        assert!((got[3].1 - 5.0 / 6.0).abs() < 1e-12);
        assert!(s.iter().all(|s| s.filter == "none" && s.task == "ifeval"));
    }
}
