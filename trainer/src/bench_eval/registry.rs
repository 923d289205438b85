//! The built-in benchmark tasks: the datasets lm-evaluation-harness reads them from (hub id,
//! configuration folder, splits) and how each is scored; and the tasks refused by name.

use super::BenchError;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TaskId {
    Gsm8k,
    Mmlu,
    Hellaswag,
    ArcEasy,
    ArcChallenge,
    Ifeval,
}

/// How a task is scored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Multiple choice: the choice of highest log-likelihood (acc), also per character (acc_norm).
    Choice,
    /// Greedy generation until a stop string, the answer extracted and matched exactly.
    Generate,
    /// Greedy generation, the response checked against each of the prompt's instructions.
    Instructions,
}

/// Where a task's documents lie in its dataset's snapshot.
#[derive(Debug, Clone, Copy)]
pub struct DatasetRef {
    /// The hub id the harness loads.
    pub repo: &'static str,
    /// The configuration's folder in the snapshot (`None`: the snapshot's root).
    pub config: Option<&'static str>,
    pub test_split: &'static str,
    /// Where few-shot examples come from.
    pub fewshot_split: &'static str,
    /// The columns read.
    pub columns: &'static [&'static str],
    /// The one file a repository without split names holds its data in (Hugging Face datasets
    /// reads it as `train`): read when no file is named for the split.
    pub single_file: Option<&'static str>,
}

/// Tasks named in recipes that this build does not run, with why.
const REFUSED: [(&str, &str); 1] = [(
    "humaneval",
    "it runs generated code, and no sandbox to run it in is built (no network, time and memory limits)",
)];

impl TaskId {
    pub const ALL: [TaskId; 6] =
        [TaskId::Gsm8k, TaskId::Mmlu, TaskId::Hellaswag, TaskId::ArcEasy, TaskId::ArcChallenge, TaskId::Ifeval];

    pub fn name(self) -> &'static str {
        match self {
            TaskId::Gsm8k => "gsm8k",
            TaskId::Mmlu => "mmlu",
            TaskId::Hellaswag => "hellaswag",
            TaskId::ArcEasy => "arc_easy",
            TaskId::ArcChallenge => "arc_challenge",
            TaskId::Ifeval => "ifeval",
        }
    }

    pub fn parse(name: &str) -> Result<TaskId, BenchError> {
        if let Some(task) = TaskId::ALL.into_iter().find(|t| t.name() == name) {
            return Ok(task);
        }
        Err(BenchError::Unsupported(name.to_owned(), refusal(name).unwrap_or_default()))
    }

    pub fn kind(self) -> Kind {
        match self {
            TaskId::Gsm8k => Kind::Generate,
            TaskId::Ifeval => Kind::Instructions,
            _ => Kind::Choice,
        }
    }

    pub fn dataset(self) -> DatasetRef {
        match self {
            TaskId::Gsm8k => DatasetRef {
                repo: "openai/gsm8k",
                config: Some("main"),
                test_split: "test",
                fewshot_split: "train",
                columns: &["question", "answer"],
                single_file: None,
            },
            // The `all` configuration: every subject's questions with their `subject`.
            TaskId::Mmlu => DatasetRef {
                repo: "cais/mmlu",
                config: Some("all"),
                test_split: "test",
                fewshot_split: "dev",
                columns: &["question", "subject", "choices", "answer"],
                single_file: None,
            },
            TaskId::Hellaswag => DatasetRef {
                repo: "Rowan/hellaswag",
                config: None,
                test_split: "validation",
                fewshot_split: "train",
                columns: &["activity_label", "ctx_a", "ctx_b", "endings", "label"],
                single_file: None,
            },
            TaskId::ArcEasy | TaskId::ArcChallenge => DatasetRef {
                repo: "allenai/ai2_arc",
                config: Some(if self == TaskId::ArcEasy { "ARC-Easy" } else { "ARC-Challenge" }),
                test_split: "test",
                fewshot_split: "train",
                columns: &["question", "choices", "answerKey"],
                single_file: None,
            },
            // Zero-shot: the harness's task has no few-shot examples.
            TaskId::Ifeval => DatasetRef {
                repo: "google/IFEval",
                config: None,
                test_split: "train",
                fewshot_split: "train",
                columns: &["key", "prompt", "instruction_id_list", "kwargs"],
                single_file: Some("ifeval_input_data.jsonl"),
            },
        }
    }
}

/// Why `name` cannot be an `eval.tasks` entry of this build (`None`: it is a built-in task).
pub fn refusal(name: &str) -> Option<String> {
    if TaskId::ALL.iter().any(|t| t.name() == name) {
        return None;
    }
    let built: Vec<&str> = TaskId::ALL.iter().map(|t| t.name()).collect();
    Some(match REFUSED.iter().find(|(n, _)| *n == name) {
        Some((_, why)) => format!("{name} is not run by this build: {why}; the tasks it runs: {}", built.join(", ")),
        None => format!("{name} is not a task this build knows; the tasks it runs: {}", built.join(", ")),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn built_in_tasks_parse_and_the_others_are_refused_by_name() {
        for t in TaskId::ALL {
            assert_eq!(TaskId::parse(t.name()).unwrap(), t);
            assert_eq!(refusal(t.name()), None);
        }
        let humaneval = refusal("humaneval").unwrap();
        assert!(humaneval.contains("sandbox") && humaneval.contains("gsm8k"), "{humaneval}");
        assert_eq!(TaskId::parse("ifeval").unwrap().kind(), Kind::Instructions);
        assert!(refusal("truthfulqa").unwrap().contains("not a task this build knows"));
        assert!(TaskId::parse("humaneval").unwrap_err().to_string().contains("humaneval"));
    }
}
