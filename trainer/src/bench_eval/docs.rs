//! A task's rows as the documents the harness builds from them (its `doc_to_text`,
//! `doc_to_choice`, `doc_to_target` and hellaswag's preprocessing), with their few-shot
//! contexts.
//!
//! Few-shot examples are the first k documents of the task's few-shot split, in the dataset's
//! order (MMLU's: of the question's own subject). That is the harness's `first_n` sampler,
//! which MMLU uses; for the other tasks the harness draws k examples with Python's `random`
//! seeded 1234, which this reader does not reproduce: with `eval.fewshot` above 0 their
//! contexts (not the zero-shot ones) differ from the harness's.

use std::path::Path;

use super::BenchError;
use super::registry::{DatasetRef, TaskId};
use crate::data::Json;
use crate::data::source::files;
use crate::data::source::rows::read_rows;
use crate::hub::{HubCache, RepoKind};

/// Between a prompt and its target, and after each few-shot example.
const TARGET_DELIMITER: &str = " ";
const FEWSHOT_DELIMITER: &str = "\n\n";

/// One scored document.
#[derive(Debug, Clone, PartialEq)]
pub enum Doc {
    /// `context` then `" " + choice` for each choice; `gold` is the right one.
    Choice { context: String, choices: Vec<String>, gold: usize },
    /// `prompt` is generated after; `reference` is what the answer is matched with.
    Generate { prompt: String, reference: String },
    /// An IFEval prompt and the instructions its response is checked against.
    Instructions(super::ifeval::task::Prompt),
}

/// A task's documents and the snapshot they were read from (`hf://datasets/…@commit`).
#[derive(Debug, Clone)]
pub struct DocSet {
    pub docs: Vec<Doc>,
    pub source: String,
}

/// A row as the harness sees it: the prompt, the choices (none for generation), the target
/// (the right choice's text, or the reference answer) and, for MMLU, the subject.
#[derive(Debug, Clone)]
struct Row {
    text: String,
    choices: Vec<String>,
    gold: usize,
    target: String,
    subject: Option<String>,
}

/// Reads `task`'s test split (and few-shot split when `fewshot` > 0) from the cache.
pub fn load(task: TaskId, fewshot: usize, cache: &HubCache) -> Result<DocSet, BenchError> {
    let ds = task.dataset();
    let snapshot = cache
        .resolve(ds.repo, RepoKind::Dataset, None)
        .map_err(|source| BenchError::Missing { task: task.name(), source })?;
    if task.kind() == super::registry::Kind::Instructions {
        let docs = split_records(task, &ds, &snapshot.dir, ds.test_split, |f| {
            super::ifeval::task::Prompt::from_row(f).map(Doc::Instructions)
        })?;
        return Ok(DocSet { docs, source: snapshot.source.uri(RepoKind::Dataset) });
    }
    let test = split_rows(task, &ds, &snapshot.dir, ds.test_split)?;
    let shots = if fewshot > 0 { split_rows(task, &ds, &snapshot.dir, ds.fewshot_split)? } else { Vec::new() };
    let docs = test
        .iter()
        .map(|row| {
            let mut context = description(row);
            let same_subject = shots.iter().filter(|s| s.subject == row.subject);
            for shot in same_subject.take(fewshot) {
                context.push_str(&format!("{}{TARGET_DELIMITER}{}{FEWSHOT_DELIMITER}", shot.text, shot.target));
            }
            context.push_str(&row.text);
            // (Instructions are read above: the rest are choice or generation tasks.)
            if task.kind() == super::registry::Kind::Choice {
                Doc::Choice { context, choices: row.choices.clone(), gold: row.gold }
            } else {
                Doc::Generate { prompt: context, reference: row.target.clone() }
            }
        })
        .collect();
    Ok(DocSet { docs, source: snapshot.source.uri(RepoKind::Dataset) })
}

/// MMLU's per-subject description; none for the other tasks.
fn description(row: &Row) -> String {
    match &row.subject {
        Some(s) => {
            format!("The following are multiple choice questions (with answers) about {}.\n\n", s.replace('_', " "))
        }
        None => String::new(),
    }
}

fn split_rows(task: TaskId, ds: &DatasetRef, snapshot: &Path, split: &str) -> Result<Vec<Row>, BenchError> {
    split_records(task, ds, snapshot, split, |f| parse(task, f))
}

/// Each record of `split`, read by `parse` (whose error is told with the file and row).
fn split_records<T>(
    task: TaskId,
    ds: &DatasetRef,
    snapshot: &Path,
    split: &str,
    parse: impl Fn(&Fields<'_>) -> Result<T, String>,
) -> Result<Vec<T>, BenchError> {
    let data = |source| BenchError::Data { task: task.name(), source };
    let root = ds.config.unwrap_or(".");
    let inputs = match (files::resolve(&[root.to_owned()], split, snapshot), ds.single_file) {
        (Ok(inputs), _) => inputs,
        (Err(_), Some(file)) if snapshot.join(root).join(file).is_file() => {
            files::resolve(&[format!("{root}/{file}")], split, snapshot).map_err(data)?
        }
        (Err(e), _) => return Err(data(e)),
    };
    let mut rows = Vec::new();
    for input in &inputs {
        for (i, record) in read_rows(input, ds.columns).map_err(data)?.iter().enumerate() {
            let bad = |message: String| BenchError::Task {
                task: task.name(),
                message: format!("{} row {i}: {message}", input.path.display()),
            };
            rows.push(parse(&Fields(record)).map_err(bad)?);
        }
    }
    Ok(rows)
}

fn parse(task: TaskId, f: &Fields<'_>) -> Result<Row, String> {
    match task {
        TaskId::Gsm8k => {
            let answer = f.text("answer")?;
            Ok(Row {
                text: format!("Question: {}\nAnswer:", f.text("question")?),
                choices: Vec::new(),
                gold: 0,
                target: answer,
                subject: None,
            })
        }
        TaskId::Mmlu => {
            let options = f.texts("choices")?;
            let [a, b, c, d] = options.as_slice() else {
                return Err(format!("expected 4 choices, found {}", options.len()));
            };
            let choices: Vec<String> = ["A", "B", "C", "D"].map(String::from).to_vec();
            let gold = f.index("answer", 4)?;
            Ok(Row {
                text: format!("{}\nA. {a}\nB. {b}\nC. {c}\nD. {d}\nAnswer:", f.text("question")?.trim()),
                target: choices[gold].clone(),
                choices,
                gold,
                subject: Some(f.text("subject")?),
            })
        }
        TaskId::Hellaswag => {
            let ctx = format!("{} {}", f.text("ctx_a")?, capitalize(&f.text("ctx_b")?));
            let choices: Vec<String> = f.texts("endings")?.iter().map(|e| preprocess(e)).collect();
            let label = f.text("label")?;
            let gold =
                label.parse::<usize>().ok().filter(|&g| g < choices.len()).ok_or_else(|| {
                    format!("label {label:?} is not the index of one of the {} endings", choices.len())
                })?;
            Ok(Row {
                text: preprocess(&format!("{}: {ctx}", f.text("activity_label")?)),
                target: choices[gold].clone(),
                choices,
                gold,
                subject: None,
            })
        }
        TaskId::Ifeval => Err("ifeval's rows are prompts with instructions, read by its own reader".into()),
        TaskId::ArcEasy | TaskId::ArcChallenge => {
            let choices = f.get("choices")?;
            let sub = Fields(choices);
            let (texts, labels) = (sub.texts("text")?, sub.texts("label")?);
            let key = f.text("answerKey")?;
            let gold = labels
                .iter()
                .position(|l| *l == key)
                .ok_or_else(|| format!("answerKey {key:?} is not among {labels:?}"))?;
            if texts.len() != labels.len() {
                return Err(format!("{} choice texts for {} labels", texts.len(), labels.len()));
            }
            Ok(Row {
                text: format!("Question: {}\nAnswer:", f.text("question")?),
                target: texts[gold].clone(),
                choices: texts,
                gold,
                subject: None,
            })
        }
    }
}

/// Python's `str.capitalize`: the first character upper case, the rest lower case.
fn capitalize(s: &str) -> String {
    let mut chars = s.chars();
    match chars.next() {
        Some(first) => first.to_uppercase().chain(chars.flat_map(char::to_lowercase)).collect(),
        None => String::new(),
    }
}

/// The harness's hellaswag clean-up: WikiHow's bracketed artifacts out, double spaces single.
fn preprocess(text: &str) -> String {
    let text = text.trim().replace(" [title]", ". ");
    let mut out = String::with_capacity(text.len());
    let mut rest = text.as_str();
    // `\[.*?\]`: from a `[` to the first `]` after it; an unclosed `[` stays.
    while let Some(open) = rest.find('[') {
        match rest[open..].find(']') {
            Some(close) => {
                out.push_str(&rest[..open]);
                rest = &rest[open + close + 1..];
            }
            None => break,
        }
    }
    out.push_str(rest);
    out.replace("  ", " ")
}

/// A record's fields, read with errors that name the field.
pub(super) struct Fields<'a>(&'a Json);

impl<'a> Fields<'a> {
    pub(super) fn get(&self, name: &str) -> Result<&'a Json, String> {
        match self.0 {
            Json::Object(fields) => {
                fields.iter().find(|(k, _)| k == name).map(|(_, v)| v).ok_or_else(|| format!("no field `{name}`"))
            }
            _ => Err("not a record".into()),
        }
    }

    pub(super) fn text(&self, name: &str) -> Result<String, String> {
        match self.get(name)? {
            Json::String(s) => Ok(s.clone()),
            Json::Int(i) => Ok(i.to_string()),
            other => Err(format!("`{name}` is not text: {}", other.to_python_json())),
        }
    }

    pub(super) fn texts(&self, name: &str) -> Result<Vec<String>, String> {
        match self.get(name)? {
            Json::Array(items) => items
                .iter()
                .map(|v| match v {
                    Json::String(s) => Ok(s.clone()),
                    other => Err(format!("`{name}` holds a non-text item: {}", other.to_python_json())),
                })
                .collect(),
            other => Err(format!("`{name}` is not a list: {}", other.to_python_json())),
        }
    }

    fn index(&self, name: &str, len: usize) -> Result<usize, String> {
        match self.get(name)? {
            Json::Int(i) if (0..len as i128).contains(i) => Ok(*i as usize),
            other => Err(format!("`{name}` is not an index below {len}: {}", other.to_python_json())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hellaswag_text_is_cleaned_as_the_harness_cleans_it() {
        assert_eq!(capitalize("tHE man"), "The man");
        assert_eq!(
            preprocess(" How to cook [title] Boil water [step] now.  Done "),
            "How to cook. Boil water now. Done"
        );
        assert_eq!(preprocess("a [b"), "a [b");
    }
}
