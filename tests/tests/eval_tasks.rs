//! A training run scores the recipe's benchmark tasks (`eval.tasks`, gsm8k and MMLU on tiny
//! task data in the Hugging Face cache) with its few-shot setting: the base before the first
//! step and the trained model at the end, in `eval.json`, the `eval.completed` events and the
//! model card; `mindxtrain eval` scores the same checkpoint to the same numbers; and the
//! regression gate passes against the base and fails (with `run.failed` naming the task and
//! metric, every output kept) against a baseline report that scored higher.

use mindxtrain_tests::hub_cache::{GSM8K_TEST, HubFixture, MMLU_TEST, commit_id, tiny_config};
use mindxtrain_tests::micro::{Node, ok_json, s};
use mindxtrain_tests::mindxtrain;
use serde_json::Value;
use std::path::Path;
use std::process::Output;

const MODEL: &str = "mindxtrain-tests/tiny-qwen3";
const DATASET: &str = "mindxtrain-tests/tiny-chat";

fn recipe(regression: &str) -> String {
    format!(
        "meta: {{project: mindxtrain-tests, run_name: tasks, seed: 3}}\nhardware: {{name: cpu, gpus: 0}}\n\
         autotune: {{budget_seconds: 2}}\nmodel:\n  family: qwen3\n  dtype: fp32\n  name: {MODEL}\ndata:\n  format: chat\n  \
         seq_len: 64\n  source: hf\n  hf_id: {DATASET}\n  split: train_sft\ntrain:\n  \
         method: {{kind: lora, r: 4, alpha: 8, target_modules: [q_proj, v_proj]}}\n  optimizer: {{lr: 1.0e-2}}\n  \
         budget: {{max_steps: 2}}\n  batch: {{per_device: 2, grad_accum: 1}}\n  precision: fp32\neval:\n  \
         holdout: {{fraction: 0.1, max_samples: 4}}\n  tasks: [gsm8k, mmlu]\n  fewshot: 1\n{regression}serve:\n  max_model_len: 64\n"
    )
}

fn run(node: &Node, cache: &Path, args: &[&str]) -> Output {
    let mut a = vec!["--json"];
    a.extend_from_slice(args);
    mindxtrain(&node.dir, &a).env("HF_HUB_CACHE", cache).output().unwrap()
}

fn read_json(path: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))).unwrap()
}

/// `task metric,filter` → (value, n) of a report's task scores.
fn scores(report: &Value) -> Vec<(String, f64, u64)> {
    report["tasks"]["scores"]
        .as_array()
        .unwrap_or_else(|| panic!("no task scores: {report}"))
        .iter()
        .map(|s| {
            (
                format!(
                    "{} {},{}",
                    s["task"].as_str().unwrap(),
                    s["metric"].as_str().unwrap(),
                    s["filter"].as_str().unwrap()
                ),
                s["value"].as_f64().unwrap(),
                s["n"].as_u64().unwrap(),
            )
        })
        .collect()
}

#[test]
fn eval_tasks_are_scored_with_the_recipe_s_few_shot_and_gated_against_the_base() {
    let tmp = tempfile::tempdir().unwrap();
    let fixture = HubFixture::new(&tmp.path().join("hub")).unwrap();
    fixture.add_model(MODEL, &commit_id("model"), &["main"], &tiny_config(), 1).unwrap();
    fixture.add_chat_dataset(DATASET, &commit_id("data"), &["main"], "train_sft", 40).unwrap();
    fixture.add_task_datasets().unwrap();
    let cache = fixture.root();
    let node = Node::new();

    // Gated against the base (model.name): scored before the first step and at the end.
    let gate = format!("  regression: {{baseline: {MODEL}, threshold_pct: 100}}\n");
    let path = node.recipe("tasks", &recipe(&gate));
    let out = node.path("run");
    ok_json(&run(&node, cache, &["train", s(&path), "--out", s(&out), "--eval-prompts", "1"]));
    let report = read_json(&out.join("eval.json"));
    let base = read_json(&out.join("eval_baseline.json"));
    let names: Vec<String> = scores(&report).into_iter().map(|s| s.0).collect();
    assert_eq!(
        names,
        ["gsm8k exact_match,strict-match", "gsm8k exact_match,flexible-extract", "mmlu acc,none"],
        "{report}"
    );
    let n: Vec<u64> = scores(&report).iter().map(|s| s.2).collect();
    assert_eq!(n, [GSM8K_TEST.len(), GSM8K_TEST.len(), MMLU_TEST.len()].map(|n| n as u64));
    assert_eq!(report["tasks"]["fewshot"], 1);
    assert_eq!(report["tasks"]["data"]["mmlu"], format!("hf://datasets/cais/mmlu@{}", commit_id("mmlu")));
    assert_eq!(scores(&base).len(), 3, "the base's evaluation scored the tasks too: {base}");
    let completed = node.events("eval.completed");
    assert_eq!(completed.len(), 2, "{completed:?}");
    assert_eq!(completed[0]["data"]["step"], 0);
    // (The log writes whole floats as integers: compared as numbers.)
    assert_eq!(scores(&completed[1]["data"]), scores(&report), "the final event carries the scores");
    assert!(completed[1]["data"]["file"].is_object());
    let card = std::fs::read_to_string(out.join("final/README.md")).unwrap();
    assert!(card.contains("\"mmlu\""), "{card}");

    // `mindxtrain eval` on the final checkpoint scores the same numbers.
    let again = node.path("again.json");
    let v = ok_json(&run(&node, cache, &["eval", s(&path), "--checkpoint", s(&out.join("final")), "--out", s(&again)]));
    assert_eq!(scores(&v), scores(&report));
    assert_eq!(read_json(&again)["tasks"], report["tasks"]);

    // Against a report that scored every task higher, the gate fails the run: eval.json and
    // final/ are kept and run.failed names the task and metric.
    let mut higher = report.clone();
    for s in higher["tasks"]["scores"].as_array_mut().unwrap() {
        s["value"] = Value::from(s["value"].as_f64().unwrap() + 0.5);
    }
    std::fs::write(node.path("higher.json"), serde_json::to_vec(&higher).unwrap()).unwrap();
    let path = node.recipe("gated", &recipe("  regression: {baseline: higher.json, threshold_pct: 5}\n"));
    let failed_out = node.path("failed");
    let o = run(&node, cache, &["train", s(&path), "--out", s(&failed_out), "--eval-prompts", "1"]);
    assert!(!o.status.success());
    let failed = node.events("run.failed");
    assert_eq!(failed.len(), 1, "{failed:?}");
    let error = failed[0]["data"]["error"].as_str().unwrap();
    assert!(
        error.contains("eval regression: task gsm8k exact_match,strict-match") && error.contains("higher.json"),
        "{error}"
    );
    assert!(failed_out.join("eval.json").is_file() && failed_out.join("final").is_dir());
    assert_eq!(read_json(&failed_out.join("eval.json"))["tasks"], report["tasks"], "the same run scores the same");
}
