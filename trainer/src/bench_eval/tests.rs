//! Each task on tiny task data in the Hugging Face cache's layout (Parquet written here, a
//! JSONL split too), scored with a seeded micro model: the prompts are the harness's, every
//! choice's log-likelihood equals one computed here from the model's logits, and the metrics
//! are what those imply.

use std::path::Path;
use std::sync::Arc;

use arrow_array::builder::{ListBuilder, StringBuilder};
use arrow_array::{ArrayRef, Int64Array, RecordBatch, StringArray, StructArray};
use arrow_schema::{DataType, Field};
use candle_core::{DType, Device};

use super::docs::{Doc, load};
use super::report::Sample;
use super::*;
use crate::batch::PackedBatch;
use crate::model::LmConfig;

const COMMIT: &str = "0123456789abcdef0123456789abcdef01234567";

fn strings(values: &[&str]) -> ArrayRef {
    Arc::new(StringArray::from(values.to_vec()))
}

fn lists(rows: &[&[&str]]) -> ArrayRef {
    let mut b = ListBuilder::new(StringBuilder::new());
    for row in rows {
        for v in *row {
            b.values().append_value(v);
        }
        b.append(true);
    }
    Arc::new(b.finish())
}

/// Writes `columns` as `<cache>/datasets--owner--name/snapshots/COMMIT/<file>` with `refs/main`.
fn put(cache: &Path, repo: &str, file: &str, columns: Vec<(&str, ArrayRef)>) {
    let repo_dir = cache.join(format!("datasets--{}", repo.replace('/', "--")));
    let path = repo_dir.join("snapshots").join(COMMIT).join(file);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::create_dir_all(repo_dir.join("refs")).unwrap();
    std::fs::write(repo_dir.join("refs/main"), COMMIT).unwrap();
    let batch = RecordBatch::try_from_iter(columns).unwrap();
    let mut writer =
        parquet::arrow::ArrowWriter::try_new(std::fs::File::create(&path).unwrap(), batch.schema(), None).unwrap();
    writer.write(&batch).unwrap();
    writer.close().unwrap();
}

fn fill_cache(cache: &Path) {
    put(
        cache,
        "openai/gsm8k",
        "main/test-00000-of-00001.parquet",
        vec![
            ("question", strings(&["Tom has 3 apples and buys 4. How many?", "What is 10 minus 4?"])),
            ("answer", strings(&["3 + 4 = 7\n#### 7", "10 - 4 = 6\n#### 6"])),
        ],
    );
    put(
        cache,
        "openai/gsm8k",
        "main/train-00000-of-00001.parquet",
        vec![
            ("question", strings(&["What is 1 + 1?", "unused"])),
            ("answer", strings(&["1 + 1 = 2\n#### 2", "x\n#### 0"])),
        ],
    );
    let mmlu = |questions: &[&str], subjects: &[&str], answers: Vec<i64>| {
        let choices: Vec<&[&str]> = questions.iter().map(|_| &["red", "green", "blue", "black"][..]).collect();
        vec![
            ("question", strings(questions)),
            ("subject", strings(subjects)),
            ("choices", lists(&choices)),
            ("answer", Arc::new(Int64Array::from(answers)) as ArrayRef),
        ]
    };
    put(
        cache,
        "cais/mmlu",
        "all/test-00000-of-00001.parquet",
        mmlu(
            &[" What colour is grass? ", "What colour is the sky?", "Which colour is coal?"],
            &["biology", "high_school_physics", "biology"],
            vec![1, 2, 3],
        ),
    );
    put(
        cache,
        "cais/mmlu",
        "all/dev-00000-of-00001.parquet",
        mmlu(&["Blood is?", "Light is?"], &["biology", "high_school_physics"], vec![0, 3]),
    );
    // ARC's choices: a struct of the texts and their labels.
    let arc = |questions: &[&str], texts: &[&[&str]], labels: &[&[&str]], keys: &[&str]| {
        let choices = StructArray::from(vec![
            (Arc::new(Field::new("text", lists(texts).data_type().clone(), true)), lists(texts)),
            (Arc::new(Field::new("label", lists(labels).data_type().clone(), true)), lists(labels)),
        ]);
        vec![("question", strings(questions)), ("choices", Arc::new(choices) as ArrayRef), ("answerKey", strings(keys))]
    };
    put(
        cache,
        "allenai/ai2_arc",
        "ARC-Easy/test-00000-of-00001.parquet",
        arc(
            &["Water freezes at?", "Plants need?", "The moon orbits?"],
            &[&["0 C", "50 C", "100 C"], &["light", "noise", "plastic", "salt"], &["the earth", "mars"]],
            &[&["A", "B", "C"], &["1", "2", "3", "4"], &["A", "B"]],
            &["A", "1", "A"],
        ),
    );
    put(
        cache,
        "allenai/ai2_arc",
        "ARC-Easy/train-00000-of-00001.parquet",
        arc(&["Ice is?"], &[&["cold", "hot"]], &[&["A", "B"]], &["A"]),
    );
    // A Parquet split of hellaswag's columns: `label` is a string there.
    put(
        cache,
        "Rowan/hellaswag",
        "data/validation-00000-of-00001.parquet",
        vec![
            ("activity_label", strings(&["Baking cookies", "Home [title] and Garden"])),
            ("ctx_a", strings(&["A woman mixes dough.", "How to weed."])),
            ("ctx_b", strings(&["SHE then", "you [step] pull"])),
            ("endings", lists(&[&["bakes them.", "eats [x] glue.", "sings."], &["the weeds out.", "a car."]])),
            ("label", strings(&["0", "0"])),
        ],
    );
    assert!(DataType::Utf8 == *strings(&[]).data_type());
}

fn model() -> (CausalLm, Tokenizer) {
    let mut config = LmConfig::timing_shape("tiny").unwrap();
    config.vocab_size = 512;
    (CausalLm::init_random(&config, 11, DType::F32, &Device::Cpu).unwrap(), Tokenizer::byte())
}

/// `ln p(continuation | context)` from the model's logits in f64 (byte tokens).
fn reference_ll(model: &CausalLm, context: &str, continuation: &str) -> f64 {
    let ids: Vec<u32> = format!("{context}{continuation}").bytes().map(u32::from).collect();
    let n = ids.len();
    let batch = PackedBatch::single_row(&ids);
    let logits = model.logits(&batch, None).unwrap().to_dtype(DType::F64).unwrap().to_vec3::<f64>().unwrap();
    let vocab = Tokenizer::byte().vocab_size();
    (context.len()..n)
        .map(|i| {
            let row = &logits[0][i - 1][..vocab];
            let lse = row.iter().map(|v| v.exp()).sum::<f64>().ln();
            row[ids[i] as usize] - lse
        })
        .sum()
}

#[test]
fn prompts_and_few_shot_contexts_are_the_harness_s() {
    let dir = tempfile::tempdir().unwrap();
    fill_cache(dir.path());
    let cache = HubCache::at(dir.path()).unwrap();
    let mmlu = load(TaskId::Mmlu, 1, &cache).unwrap();
    assert_eq!(mmlu.source, format!("hf://datasets/cais/mmlu@{COMMIT}"));
    let Doc::Choice { context, choices, gold } = &mmlu.docs[0] else { panic!() };
    assert_eq!(
        context,
        "The following are multiple choice questions (with answers) about biology.\n\n\
         Blood is?\nA. red\nB. green\nC. blue\nD. black\nAnswer: A\n\n\
         What colour is grass?\nA. red\nB. green\nC. blue\nD. black\nAnswer:"
    );
    assert_eq!((choices.join(""), *gold), ("ABCD".into(), 1));
    let Doc::Choice { context, .. } = &mmlu.docs[1] else { panic!() };
    assert!(
        context.starts_with(
            "The following are multiple choice questions (with answers) about high school physics.\n\nLight is?"
        ),
        "{context}"
    );
    assert!(context.contains("Answer: D\n\nWhat colour is the sky?"), "{context}");

    let gsm = load(TaskId::Gsm8k, 1, &cache).unwrap();
    assert_eq!(
        gsm.docs[1],
        Doc::Generate {
            prompt: "Question: What is 1 + 1?\nAnswer: 1 + 1 = 2\n#### 2\n\nQuestion: What is 10 minus 4?\nAnswer:"
                .into(),
            reference: "10 - 4 = 6\n#### 6".into()
        }
    );
    let arc = load(TaskId::ArcEasy, 0, &cache).unwrap();
    assert_eq!(
        arc.docs[1],
        Doc::Choice {
            context: "Question: Plants need?\nAnswer:".into(),
            choices: ["light", "noise", "plastic", "salt"].map(String::from).to_vec(),
            gold: 0
        }
    );
    let hs = load(TaskId::Hellaswag, 0, &cache).unwrap();
    assert_eq!(
        hs.docs[0],
        Doc::Choice {
            context: "Baking cookies: A woman mixes dough. She then".into(),
            choices: ["bakes them.", "eats glue.", "sings."].map(String::from).to_vec(),
            gold: 0
        }
    );
    let Doc::Choice { context, .. } = &hs.docs[1] else { panic!() };
    assert_eq!(context, "Home. and Garden: How to weed. You pull");
}

#[test]
fn a_task_whose_data_is_missing_names_where_it_looked_and_the_fetch_command() {
    let dir = tempfile::tempdir().unwrap();
    let cache = HubCache::at(dir.path()).unwrap();
    let err = load(TaskId::ArcChallenge, 0, &cache).unwrap_err().to_string();
    assert!(err.contains("arc_challenge") && err.contains("mindxtrain fetch allenai/ai2_arc --dataset"), "{err}");
    assert!(err.contains(&dir.path().join("datasets--allenai--ai2_arc").display().to_string()), "{err}");
    // The snapshot is there but not the configuration's split.
    fill_cache(dir.path());
    let err = load(TaskId::ArcChallenge, 0, &cache).unwrap_err().to_string();
    assert!(err.contains("ARC-Challenge"), "{err}");
}

#[test]
fn multiple_choice_scores_are_the_model_s_log_likelihoods_and_their_argmax() {
    let dir = tempfile::tempdir().unwrap();
    fill_cache(dir.path());
    let cache = HubCache::at(dir.path()).unwrap();
    let (model, tokenizer) = model();
    let scorer = Scorer { model: &model, adapters: None, tokenizer: &tokenizer };
    for (task, fewshot) in [(TaskId::Mmlu, 1), (TaskId::ArcEasy, 0), (TaskId::Hellaswag, 0)] {
        let docs = load(task, fewshot, &cache).unwrap().docs;
        let outcome = loglik::run(&scorer, task, &docs, &mut |_| {}).unwrap();
        let (mut acc, mut acc_norm) = (0.0, 0.0);
        for (doc, sample) in docs.iter().zip(&outcome.samples) {
            let (Doc::Choice { context, choices, gold }, Sample::Choice { loglikelihoods, .. }) = (doc, sample) else {
                panic!()
            };
            let ours: Vec<f64> = choices.iter().map(|c| reference_ll(&model, context, &format!(" {c}"))).collect();
            for (a, b) in loglikelihoods.iter().zip(&ours) {
                assert!((a.0 - b).abs() < 1e-3, "{task:?}: {loglikelihoods:?} vs {ours:?}");
            }
            let best = |v: &[f64]| (0..v.len()).fold(0, |b, i| if v[i] > v[b] { i } else { b });
            acc += f64::from(u8::from(best(&ours) == *gold));
            let norm: Vec<f64> = ours.iter().zip(choices).map(|(l, c)| l / c.len() as f64).collect();
            acc_norm += f64::from(u8::from(best(&norm) == *gold));
        }
        let n = docs.len() as f64;
        let got = |m: &str| outcome.scores.iter().find(|s| s.metric == m).map(|s| (s.value, s.n));
        assert_eq!(got("acc"), Some((acc / n, docs.len())), "{task:?}");
        if task == TaskId::Mmlu {
            assert_eq!(got("acc_norm"), None);
        } else {
            assert_eq!(got("acc_norm"), Some((acc_norm / n, docs.len())), "{task:?}");
        }
    }
}

#[test]
fn generated_answers_are_cut_at_the_stop_strings_and_matched_after_extraction() {
    let dir = tempfile::tempdir().unwrap();
    fill_cache(dir.path());
    let cache = HubCache::at(dir.path()).unwrap();
    let (model, tokenizer) = model();
    let scorer = Scorer { model: &model, adapters: None, tokenizer: &tokenizer };
    let docs = load(TaskId::Gsm8k, 0, &cache).unwrap().docs;
    let outcome = generation::run(&scorer, TaskId::Gsm8k, &docs, &mut |_| {}).unwrap();
    let filters = metrics::Gsm8kFilters::new();
    for (doc, sample) in docs.iter().zip(&outcome.samples) {
        let (Doc::Generate { prompt, .. }, Sample::Generate { output, strict, flexible }) = (doc, sample) else {
            panic!()
        };
        // The same greedy continuation, generated here without stop strings and cut by hand.
        let ids: Vec<u32> = prompt.bytes().map(u32::from).collect();
        let mut out = Vec::new();
        let limits = crate::generate::Limits {
            max_tokens: generation::MAX_GEN_TOKS,
            vocab: tokenizer.vocab_size(),
            stop_ids: &tokenizer.stop_ids(),
        };
        crate::generate::generate(&model, None, &ids, limits, &crate::generate::Sampling::greedy(), |id| {
            out.push(id);
            std::ops::ControlFlow::Continue(())
        })
        .unwrap();
        let full = tokenizer.decode(&out, false).unwrap();
        let cut = generation::UNTIL.iter().filter_map(|u| full.find(u)).min().unwrap_or(full.len());
        assert_eq!(output, &full[..cut]);
        assert_eq!((strict.clone(), flexible.clone()), filters.extract(output));
    }
    let names: Vec<(&str, &str)> = outcome.scores.iter().map(|s| (s.metric.as_str(), s.filter.as_str())).collect();
    assert_eq!(names, [("exact_match", "strict-match"), ("exact_match", "flexible-extract")]);
    assert!(outcome.scores.iter().all(|s| s.n == 2));
}

#[test]
fn run_tasks_reports_every_task_and_its_data() {
    let dir = tempfile::tempdir().unwrap();
    fill_cache(dir.path());
    let cache = HubCache::at(dir.path()).unwrap();
    let (model, tokenizer) = model();
    let scorer = Scorer { model: &model, adapters: None, tokenizer: &tokenizer };
    let mut lines = Vec::new();
    let names = ["arc_easy".to_string(), "mmlu".to_string()];
    let report = run_tasks(&scorer, &names, 1, &cache, &mut |l| lines.push(l.to_owned())).unwrap();
    assert_eq!(report.fewshot, 1);
    let keys: Vec<String> = report.scores.iter().map(|s| format!("{} {}", s.task, s.metric)).collect();
    assert_eq!(keys, ["arc_easy acc", "arc_easy acc_norm", "mmlu acc"]);
    assert_eq!(report.data["mmlu"], format!("hf://datasets/cais/mmlu@{COMMIT}"));
    assert!(lines.iter().any(|l| l.contains("eval task mmlu: 3 documents, 1-shot")), "{lines:?}");
    let arc = load(TaskId::ArcEasy, 1, &cache).unwrap();
    let Doc::Choice { context, .. } = &arc.docs[0] else { panic!() };
    assert_eq!(context, "Question: Ice is?\nAnswer: cold\n\nQuestion: Water freezes at?\nAnswer:");
    let err = run_tasks(&scorer, &["humaneval".to_string()], 0, &cache, &mut |_| {}).unwrap_err();
    assert!(err.to_string().contains("sandbox"), "{err}");
}

/// Writes `rows` as the hub's google/IFEval holds them: one JSON-lines file, no split in its name.
fn put_ifeval_jsonl(cache: &Path, rows: &str) {
    let repo_dir = cache.join("datasets--google--IFEval");
    let path = repo_dir.join("snapshots").join(COMMIT).join("ifeval_input_data.jsonl");
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::create_dir_all(repo_dir.join("refs")).unwrap();
    std::fs::write(repo_dir.join("refs/main"), COMMIT).unwrap();
    std::fs::write(path, rows).unwrap();
}

#[test]
fn ifeval_reads_the_hub_s_single_jsonl_and_names_a_bad_row() {
    let dir = tempfile::tempdir().unwrap();
    put_ifeval_jsonl(
        dir.path(),
        concat!(
            r#"{"key": 7, "prompt": "Write a haiku.", "instruction_id_list": ["punctuation:no_comma", "#,
            r#""length_constraints:number_words"], "kwargs": [{}, {"num_words": 20, "relation": "less than"}]}"#,
            "\n",
        ),
    );
    let cache = HubCache::at(dir.path()).unwrap();
    let set = load(TaskId::Ifeval, 3, &cache).unwrap();
    assert_eq!(set.source, format!("hf://datasets/google/IFEval@{COMMIT}"));
    let [Doc::Instructions(p)] = set.docs.as_slice() else { panic!("{:?}", set.docs) };
    assert_eq!((p.key, p.prompt.as_str(), p.instructions.len()), (7, "Write a haiku.", 2));
    assert_eq!(p.build().unwrap().len(), 2);

    put_ifeval_jsonl(
        dir.path(),
        r#"{"key": 8, "prompt": "x", "instruction_id_list": ["keywords:frequency"], "kwargs": [{"keyword": "a"}]}"#,
    );
    let err = load(TaskId::Ifeval, 0, &cache).unwrap_err().to_string();
    assert!(
        err.contains("ifeval_input_data.jsonl row 0") && err.contains("key 8") && err.contains("frequency"),
        "{err}"
    );
}
