//! lm-evaluation-harness (0.4.13, the torch venv) evaluating a served micro model through
//! `POST /v1/completions`, as users compare fine-tunes: its `local-completions` model with the
//! server's own tokenizer (it finds `/tokenize` and `/tokenizer_info` and picks its `remote`
//! tokenizer backend), on two small local tasks: a multiple-choice one (loglikelihood: echoed
//! prompts scored) and a generative one (generate-until with a stop string). Every score
//! lm-eval reports must equal what this process computes from the same checkpoint: each
//! choice's log-likelihood from the trainer's forward, the accuracy they imply, and each greedy
//! answer from the dense decoder (not the serving engine).

use std::path::{Path, PathBuf};
use std::process::Command;

use mindxtrain_tests::hub_cache::MMLU_SUBJECT;
use mindxtrain_tests::served::{MODEL, Server, Trained, new_node, trained};
use mindxtrain_trainer::data::tokenizer::Tokenizer;
use serde_json::{Value, json};

/// Multiple choice: a question, three choices, the right one's index.
const CHOICE: [(&str, [&str; 3], usize); 5] = [
    ("Question: the sky is", ["blue", "loud", "seven"], 0),
    ("Question: two plus two is", ["four", "cat", "green"], 0),
    ("Question: a cat says", ["woof", "meow", "moo"], 1),
    ("Question: ice is", ["hot", "dry", "cold"], 2),
    ("Question: the sun rises in the", ["east", "west", "sea"], 0),
];

/// Generation: a prompt and its expected answer (the micro model will rarely say it: the
/// scores compared are whatever it does say).
const GENERATE: [(&str, &str); 4] =
    [("Q: hello\nA:", " hi"), ("Q: one, two,\nA:", " three"), ("Q: red or blue?\nA:", " red"), ("Q: x\nA:", " y")];

/// Stop string and answer length of the generative task.
const UNTIL: &str = "\n";
const MAX_GEN: usize = 8;

fn write_tasks(dir: &Path) {
    let lines = |rows: Vec<Value>| rows.iter().map(|r| format!("{r}\n")).collect::<String>();
    let choice = dir.join("choice.jsonl");
    std::fs::write(
        &choice,
        lines(CHOICE.iter().map(|(q, c, a)| json!({"question": q, "choices": c, "answer": a})).collect()),
    )
    .unwrap();
    let generate = dir.join("generate.jsonl");
    std::fs::write(&generate, lines(GENERATE.iter().map(|(q, a)| json!({"question": q, "answer": a})).collect()))
        .unwrap();
    let task = |name: &str, data: &Path, body: &str| {
        format!(
            "task: {name}\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {}\ntest_split: test\n{body}",
            data.display()
        )
    };
    std::fs::write(
        dir.join("mx_choice.yaml"),
        task(
            "mx_choice",
            &choice,
            "output_type: multiple_choice\ndoc_to_text: \"{{question}}\"\ndoc_to_choice: \"{{choices}}\"\n\
             doc_to_target: \"{{answer}}\"\nmetric_list:\n  - metric: acc\n",
        ),
    )
    .unwrap();
    std::fs::write(
        dir.join("mx_generate.yaml"),
        task(
            "mx_generate",
            &generate,
            &format!(
                "output_type: generate_until\ndoc_to_text: \"{{{{question}}}}\"\ndoc_to_target: \"{{{{answer}}}}\"\n\
                 generation_kwargs:\n  until: [{until:?}]\n  max_gen_toks: {MAX_GEN}\n  do_sample: false\n  temperature: 0\n\
                 metric_list:\n  - metric: exact_match\n",
                until = UNTIL
            ),
        ),
    )
    .unwrap();
}

/// Runs lm-eval's CLI against `server` on the tasks `names` that `write` puts in a task
/// directory; the directory it wrote its results and samples to.
fn run_lm_eval(python: &Path, server: &Server, root: &Path, write: impl FnOnce(&Path), names: &str) -> PathBuf {
    let (tasks, out) = (root.join(format!("tasks-{names}")), root.join(format!("lm-eval-out-{names}")));
    std::fs::create_dir_all(&tasks).unwrap();
    write(&tasks);
    let model_args = format!(
        "model={MODEL},base_url={}/v1/completions,num_concurrent=1,max_retries=1,tokenized_requests=True",
        server.url
    );
    let output = Command::new(python)
        .args(["-m", "lm_eval", "--model", "local-completions", "--model_args", &model_args])
        .args(["--tasks", names, "--include_path"])
        .arg(&tasks)
        .args(["--batch_size", "3", "--log_samples", "--output_path"])
        .arg(&out)
        // Nothing from the network: the task data are the local files above.
        .env("HF_DATASETS_OFFLINE", "1")
        .env("HF_HUB_OFFLINE", "1")
        .env("HF_HOME", root.join("hf-home"))
        .output()
        .expect("run lm_eval");
    assert!(
        output.status.success(),
        "lm_eval failed:\n{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    out
}

/// Every file under `dir` whose name starts with `prefix`.
fn found(dir: &Path, prefix: &str) -> Vec<PathBuf> {
    let mut hits = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            hits.extend(found(&path, prefix));
        } else if path.file_name().unwrap().to_string_lossy().starts_with(prefix) {
            hits.push(path);
        }
    }
    hits
}

fn samples(out: &Path, task: &str) -> Vec<Value> {
    let files = found(out, &format!("samples_{task}_"));
    assert_eq!(files.len(), 1, "one samples file for {task}: {files:?}");
    let mut rows: Vec<Value> =
        std::fs::read_to_string(&files[0]).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    rows.sort_by_key(|r| r["doc_id"].as_u64());
    rows
}

fn bytes(text: &str) -> Vec<u32> {
    text.bytes().map(u32::from).collect()
}

/// `ln p(continuation | context)` in this process, and whether each of its tokens is the
/// most likely one (lm-eval's `is_greedy`).
fn loglikelihood(t: &Trained, context: &str, continuation: &str) -> (f64, bool) {
    let ids = bytes(&format!("{context}{continuation}"));
    let scored = t.logprobs(&ids);
    let tail = &scored[context.len() - 1..];
    (tail.iter().map(|(lp, _)| lp).sum(), tail.iter().all(|(lp, best)| (lp - best).abs() < 1e-9))
}

#[test]
fn lm_eval_scores_a_served_model_as_this_process_does() {
    let Some(python) = mindxtrain_tests::torch_python() else { return };
    let t = trained(2);
    let node = new_node(&t, "node");
    let server = Server::start(&node, &t, &["--free"]);
    let out = run_lm_eval(&python, &server, &t.root, write_tasks, "mx_choice,mx_generate");

    // Multiple choice: each choice's log-likelihood (lm-eval asks for " " + choice after the
    // question) equals ours, and so the accuracy.
    let rows = samples(&out, "mx_choice");
    assert_eq!(rows.len(), CHOICE.len());
    let mut correct = 0;
    for (row, (question, choices, answer)) in rows.iter().zip(CHOICE) {
        // lm-eval logs each response as strings: ["<log-likelihood>", "True" | "False"].
        let theirs: Vec<(f64, bool)> = row["filtered_resps"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| {
                let ll = r[0].as_str().and_then(|v| v.parse().ok()).unwrap_or_else(|| panic!("{row}"));
                (ll, r[1].as_str() == Some("True"))
            })
            .collect();
        let ours: Vec<(f64, bool)> = choices.iter().map(|c| loglikelihood(&t, question, &format!(" {c}"))).collect();
        for (a, b) in theirs.iter().zip(&ours) {
            assert!((a.0 - b.0).abs() < 1e-3 && a.1 == b.1, "{question}: lm-eval {theirs:?}, ours {ours:?}");
        }
        let ours: Vec<f64> = ours.iter().map(|o| o.0).collect();
        let picked = (0..3).max_by(|&i, &j| ours[i].total_cmp(&ours[j])).unwrap();
        let acc = f64::from(u8::from(picked == answer));
        assert_eq!(row["acc"].as_f64(), Some(acc), "{question}: {row}");
        correct += usize::from(picked == answer);
    }

    // Generation: each answer is our greedy continuation cut at the stop string.
    let rows = samples(&out, "mx_generate");
    assert_eq!(rows.len(), GENERATE.len());
    let mut matched = 0;
    for (row, (question, target)) in rows.iter().zip(GENERATE) {
        let ids = t.greedy(&bytes(question), MAX_GEN);
        let text = Tokenizer::byte().decode(&ids, false).unwrap();
        let ours = text.split(UNTIL).next().unwrap().to_string();
        let theirs = row["filtered_resps"][0].as_str().unwrap_or_else(|| panic!("{row}"));
        assert_eq!(theirs, ours, "{question}: lm-eval's answer vs ours");
        matched += usize::from(ours == target);
    }

    // The aggregate scores in lm-eval's results file.
    let results = found(&out, "results_");
    assert_eq!(results.len(), 1, "{results:?}");
    let results: Value = serde_json::from_str(&std::fs::read_to_string(&results[0]).unwrap()).unwrap();
    let acc = results["results"]["mx_choice"]["acc,none"].as_f64().unwrap();
    assert!((acc - correct as f64 / CHOICE.len() as f64).abs() < 1e-12, "{}", results["results"]);
    let em = results["results"]["mx_generate"]["exact_match,none"].as_f64().unwrap();
    assert!((em - matched as f64 / GENERATE.len() as f64).abs() < 1e-12, "{}", results["results"]);
}

/// lm-eval's own task definitions (`gsm8k.yaml`, MMLU's template) read from the venv and
/// pointed at the tiny gsm8k- and MMLU-shaped Parquet files of `gsm8k`/`mmlu` (snapshots of a
/// hub cache): gsm8k zero-shot (the harness draws its few-shot examples at random), MMLU 1-shot
/// (its `first_n` sampler, as ours).
fn write_hub_tasks(dir: &Path, lm_eval: &Path, gsm8k: &Path, mmlu: &Path) {
    let files = |snapshot: &Path, config: &str, splits: &[&str]| {
        splits
            .iter()
            .map(|split| {
                format!(
                    "    {split}: {}\n",
                    snapshot.join(format!("{config}/{split}-00000-of-00001.parquet")).display()
                )
            })
            .collect::<String>()
    };
    std::fs::write(
        dir.join("mx_gsm8k.yaml"),
        format!(
            "include: {}\ntask: mx_gsm8k\ntag: []\ndataset_path: parquet\ndataset_name: null\ndataset_kwargs:\n  data_files:\n{}num_fewshot: 0\n",
            lm_eval.join("tasks/gsm8k/gsm8k.yaml").display(),
            files(gsm8k, "main", &["test", "train"])
        ),
    )
    .unwrap();
    std::fs::write(
        dir.join("mx_mmlu.yaml"),
        format!(
            "include: {}\ntask: mx_mmlu\ndataset_path: parquet\ndataset_name: null\ndataset_kwargs:\n  data_files:\n{}\
             description: \"The following are multiple choice questions (with answers) about {}.\\n\\n\"\nnum_fewshot: 1\n",
            lm_eval.join("tasks/mmlu/default/_default_template_yaml").display(),
            files(mmlu, "all", &["test", "dev"]),
            MMLU_SUBJECT.replace('_', " ")
        ),
    )
    .unwrap();
}

#[test]
fn lm_eval_and_the_in_process_runner_score_gsm8k_and_mmlu_alike() {
    use mindxtrain_tests::hub_cache::{GSM8K_TEST, HubFixture, MMLU_TEST};
    use mindxtrain_trainer::bench_eval::report::Sample;
    use mindxtrain_trainer::bench_eval::{Scorer, TaskId, docs, generation, loglik, metrics};
    use mindxtrain_trainer::hub::HubCache;

    let Some(python) = mindxtrain_tests::torch_python() else { return };
    let t = trained(2);
    let fixture = HubFixture::new(&t.root.join("hub")).unwrap();
    let (gsm8k, mmlu) = fixture.add_task_datasets().unwrap();
    let found = Command::new(&python)
        .args(["-c", "import lm_eval, os; print(os.path.dirname(lm_eval.__file__))"])
        .output()
        .unwrap();
    let lm_eval = PathBuf::from(String::from_utf8(found.stdout).unwrap().trim());
    let node = new_node(&t, "node");
    // Room for the prompts and gsm8k's 256-token answers.
    let roomy = t.recipe_serving("roomy.yaml", "{max_model_len: 1024, max_batch: 2, reasoning: false}");
    let server = Server::start_as(&node, &t, &roomy, &["--free"]);
    let write = |dir: &Path| write_hub_tasks(dir, &lm_eval, &gsm8k, &mmlu);
    let out = run_lm_eval(&python, &server, &t.root, write, "mx_gsm8k,mx_mmlu");

    let (model, adapters) = t.load();
    let tokenizer = Tokenizer::byte();
    let scorer = Scorer { model: &model, adapters: adapters.as_ref(), tokenizer: &tokenizer };
    let cache = HubCache::at(fixture.root()).unwrap();

    // MMLU: every choice's log-likelihood within 1e-3, the same greedy flags and accuracy.
    let ours = docs::load(TaskId::Mmlu, 1, &cache).unwrap().docs;
    let outcome = loglik::run(&scorer, TaskId::Mmlu, &ours, &mut |_| {}).unwrap();
    let rows = samples(&out, "mx_mmlu");
    assert_eq!(rows.len(), MMLU_TEST.len());
    for (row, sample) in rows.iter().zip(&outcome.samples) {
        let Sample::Choice { loglikelihoods, gold } = sample else { panic!("{sample:?}") };
        let theirs: Vec<(f64, bool)> = row["filtered_resps"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| {
                (
                    r[0].as_str().and_then(|v| v.parse().ok()).unwrap_or_else(|| panic!("{row}")),
                    r[1].as_str() == Some("True"),
                )
            })
            .collect();
        assert_eq!(theirs.len(), loglikelihoods.len(), "{row}");
        for (a, b) in theirs.iter().zip(loglikelihoods) {
            assert!((a.0 - b.0).abs() < 1e-3 && a.1 == b.1, "lm-eval {theirs:?}, ours {loglikelihoods:?}");
        }
        let lls: Vec<f64> = loglikelihoods.iter().map(|l| l.0).collect();
        assert_eq!(row["acc"].as_f64(), Some(f64::from(u8::from(metrics::argmax(&lls) == *gold))), "{row}");
    }
    // The prompt lm-eval built is ours (its description, the dev example, the question).
    let docs::Doc::Choice { context, .. } = &ours[0] else { panic!() };
    assert_eq!(
        rows[0]["arguments"]["gen_args_0"]["arg_0"].as_str(),
        Some(context.as_str()),
        "{}",
        rows[0]["arguments"]
    );

    // gsm8k: the same greedy answers, the same numbers extracted by both filters, the same matches.
    let ours = docs::load(TaskId::Gsm8k, 0, &cache).unwrap().docs;
    let outcome = generation::run(&scorer, TaskId::Gsm8k, &ours, &mut |_| {}).unwrap();
    let rows = samples(&out, "mx_gsm8k");
    for (filter, pick) in [("strict-match", 0), ("flexible-extract", 1)] {
        let rows: Vec<&Value> = rows.iter().filter(|r| r["filter"] == filter).collect();
        assert_eq!(rows.len(), GSM8K_TEST.len(), "{filter}");
        for (row, sample) in rows.iter().zip(&outcome.samples) {
            let Sample::Generate { output, strict, flexible } = sample else { panic!("{sample:?}") };
            assert_eq!(row["resps"][0][0].as_str(), Some(output.as_str()), "{row}");
            let extracted = [strict, flexible][pick];
            assert_eq!(row["filtered_resps"][0].as_str(), Some(extracted.as_str()), "{row}");
        }
        let ours = outcome.scores.iter().find(|s| s.filter == filter).unwrap();
        let theirs: f64 = rows.iter().map(|r| r["exact_match"].as_f64().unwrap()).sum::<f64>() / rows.len() as f64;
        assert!((ours.value - theirs).abs() < 1e-12, "{filter}: ours {ours:?}, lm-eval {theirs}");
    }
}
