//! `train.optimizer.name` carried out end to end, on micro recipes: through the binary, each of
//! adamw, sgd, lion and adafactor trains its own adapter from the same start and records its own
//! state in the checkpoint; a lion run stopped and resumed ends on the bytes of an uninterrupted
//! one, and its checkpoint resumed under another optimizer is refused naming both; and ZeRO-1/2/3
//! ranks, each keeping the Adafactor state of the tensors it owns (factored and not), end on the
//! weights and the checkpointed state of unsharded data parallel.

use mindxtrain_tests::micro::{self, Node, ok_json, s};
use mindxtrain_trainer::events::Discard;
use mindxtrain_trainer::plan::{Choices, Plan};
use mindxtrain_trainer::recipe::Recipe;
use mindxtrain_trainer::run::{Observer, Quiet, RunError, RunSpec, RunSummary, StepReport, train};
use serde_json::Value;
use std::path::Path;

const OPTIMIZERS: [&str; 4] = ["adamw", "sgd", "lion", "adafactor"];

/// The micro recipe with `method`, trained with optimizer `name` for `steps` (a checkpoint every
/// `every` steps) on random base weights, its probe held to a second.
fn recipe(run_name: &str, name: &str, method: &str, steps: u64, every: u64) -> String {
    let text = micro::recipe(run_name, 5, method, steps, "  random_init: true\n")
        .replace("    name: adamw\n", &format!("    name: {name}\n"))
        .replace("  budget_seconds: 5\n", "  budget_seconds: 1\n")
        .replace("    every_steps: 10\n", &format!("    every_steps: {every}\n"));
    assert!(text.contains(&format!("name: {name}\n")) && text.contains("budget_seconds: 1"), "micro recipe changed");
    text
}

/// The LoRA adapter of a finished run (`train --json`): its digest.
fn adapter(run: &Value) -> String {
    let files = run["files"].as_array().unwrap();
    let f = files.iter().find(|f| f["path"].as_str().unwrap().ends_with("adapter_model.safetensors")).unwrap();
    f["blake3"].as_str().unwrap().to_string()
}

fn read_json(path: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))).unwrap()
}

/// The names of a checkpoint's optimizer tensors, the parameter left out (`exp_avg.x` → `exp_avg`).
fn state_buffers(checkpoint: &Path) -> Vec<String> {
    let tensors = mindxtrain_trainer::checkpoint::load_training_state(checkpoint).unwrap().optimizer;
    let mut names: Vec<String> = tensors.keys().map(|k| k.split('.').next().unwrap().to_string()).collect();
    names.dedup();
    names
}

#[test]
fn each_optimizer_trains_its_own_adapter_and_checkpoints_its_own_state() {
    let node = Node::new();
    let mut adapters = Vec::new();
    for name in OPTIMIZERS {
        let r = node.recipe(name, &recipe(name, name, micro::LORA, 6, 3));
        let out = node.path(name);
        let run = ok_json(&node.run(&["train", s(&r), "--out", s(&out), "--eval-prompts", "1"]));
        let last = out.join("checkpoints/step-00000006");
        assert_eq!(read_json(&last.join("trainer_state.json"))["optimizer"], name);
        let want: &[&str] = match name {
            "adamw" => &["exp_avg", "exp_avg_sq", "step"],
            "sgd" => &["momentum_buffer", "step"],
            "lion" => &["exp_avg", "step"],
            // LoRA's A and B are matrices: factored second moments.
            _ => &["exp_avg", "exp_avg_sq_col", "exp_avg_sq_row", "step"],
        };
        assert_eq!(state_buffers(&last), want, "{name}'s checkpointed state");
        adapters.push((name, adapter(&run)));
    }
    for (i, (a, da)) in adapters.iter().enumerate() {
        for (b, db) in &adapters[i + 1..] {
            assert_ne!(da, db, "{a} and {b} trained the same adapter");
        }
    }
}

/// Stops a run after `step` (a checkpoint first), as Ctrl-C does.
struct StopAfter(u64);

impl Observer for StopAfter {
    fn step(&mut self, report: &StepReport) {
        if report.step >= self.0 {
            self.0 = 0;
        }
    }
    fn cancelled(&mut self) -> bool {
        self.0 == 0
    }
}

#[test]
fn a_lion_run_stopped_and_resumed_ends_on_the_bytes_of_an_uninterrupted_one() {
    let dir = tempfile::tempdir().unwrap();
    let text = recipe("lion", "lion", micro::LORA, 12, 1);
    let loaded = Recipe::check_str(&text, "lion.yaml").unwrap_or_else(|e| panic!("{e}"));
    let spec = |out: &str| {
        let plan = Plan::new(loaded.bytes_blake3, "cpu", Choices::unmeasured(1), vec![], 0, 0, false);
        RunSpec::new(loaded.clone(), dir.path(), plan, dir.path().join(out))
    };
    let whole = train(&spec("whole"), &mut Discard, &mut Quiet).unwrap_or_else(|e| panic!("{e}"));
    let cut = spec("cut");
    let err = train(&cut, &mut Discard, &mut StopAfter(5)).unwrap_err();
    assert!(matches!(err, RunError::Cancelled { step: 5 }), "{err}");
    let resumed = train(&RunSpec { resume: true, ..cut }, &mut Discard, &mut Quiet).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(resumed.start_step, 5);
    let weights = |r: &RunSummary| r.files.iter().find(|f| f.path.ends_with(".safetensors")).map(|f| f.blake3.clone());
    assert!(weights(&whole).is_some());
    assert_eq!(weights(&whole), weights(&resumed), "stopped at step 5 and resumed, the lion run's adapter differs");

    // The lion run's checkpoint, resumed by the recipe with sgd: refused, naming both (a plan for
    // that recipe: the command line would refuse the changed recipe bytes before this).
    let sgd = Recipe::check_str(&text.replace("name: lion\n", "name: sgd\n"), "sgd.yaml").unwrap();
    let plan = Plan::new(sgd.bytes_blake3, "cpu", Choices::unmeasured(1), vec![], 0, 0, false);
    let other = RunSpec { resume: true, ..RunSpec::new(sgd, dir.path(), plan, dir.path().join("cut")) };
    let err = train(&other, &mut Discard, &mut Quiet).unwrap_err().to_string();
    assert!(
        err.contains("optimizer state of lion")
            && err.contains("train.optimizer.name is sgd")
            && err.contains("--resume"),
        "the refusal names both optimizers: {err}"
    );
}

#[test]
fn zero_1_2_3_keep_each_rank_s_adafactor_state_and_end_on_the_bytes_of_data_parallel() {
    const STEPS: u64 = 6;
    let node = Node::new();
    let mut runs = Vec::new();
    for sharding in ["none", "zero1", "zero2", "zero3"] {
        let name = format!("z-{sharding}");
        // Full training: matrices (factored moments) and norm gains (whole ones), sharded over two
        // ranks of one row each, three batches accumulated per rank.
        let text = recipe(&name, "adafactor", micro::FULL, STEPS, STEPS)
            .replace("    per_device: 2\n    grad_accum: 2", "    per_device: 1\n    grad_accum: 3")
            .replace(
                "  precision: fp32\n",
                &format!("  precision: fp32\n  distributed:\n    sharding: {sharding}\n    bucket_mb: 0.01\n"),
            );
        assert!(text.contains("sharding:") && text.contains("grad_accum: 3"), "micro recipe changed");
        let r = node.recipe(&name, &text);
        let out = node.path(&name);
        let run =
            ok_json(&node.run(&["train", s(&r), "--out", s(&out), "--eval-prompts", "1", "--nproc-per-node", "2"]));
        assert_eq!(run["steps"], STEPS, "{run}");
        // The run really was two ranks with this sharding (else every run is the same one).
        let started = node.events("run.started");
        let ev = started.iter().find(|e| e["data"]["run_id"] == run["run_id"]).expect("the run's run.started");
        let layout = &ev["data"]["parallel"];
        assert_eq!((layout["world_size"].as_u64(), layout["sharding"].as_str()), (Some(2), Some(sharding)), "{layout}");
        let weights: Vec<Value> = run["files"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|f| f["path"].as_str().unwrap().ends_with(".safetensors"))
            .map(|f| f["blake3"].clone())
            .collect();
        let state = std::fs::read(out.join(format!("checkpoints/step-{STEPS:08}/optimizer.safetensors"))).unwrap();
        runs.push((sharding, weights, blake3::hash(&state)));
    }
    let buffers = state_buffers(&node.path(&format!("z-zero2/checkpoints/step-{STEPS:08}")));
    assert_eq!(buffers, ["exp_avg", "exp_avg_sq", "exp_avg_sq_col", "exp_avg_sq_row", "step"]);
    for (sharding, weights, state) in &runs[1..] {
        assert_eq!(weights, &runs[0].1, "{sharding}: the weights differ from unsharded data parallel");
        assert_eq!(state, &runs[0].2, "{sharding}: the gathered optimizer state differs from data parallel's");
    }
}
