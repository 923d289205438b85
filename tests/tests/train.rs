//! Training runs through the `mindxtrain` binary: determinism across runs and kill -9 +
//! `--resume` continuing bit for bit, for full training (weights, AdamW state, data
//! cursor) and for LoRA with dropout (the dropout RNG stream as well), on Qwen3 and Instella.

use mindxtrain_tests::{micro, mindxtrain};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::time::{Duration, Instant};

const STEPS: u64 = 120;

/// The shared micro model of `family`, run for [`STEPS`].
fn recipe(family: &str, run_name: &str, method: &str) -> String {
    micro::recipe_of(family, run_name, 5, method, STEPS, "")
}

struct Node {
    node: micro::Node,
    dir: PathBuf,
}

impl Node {
    fn new() -> Node {
        let node = micro::Node::new();
        Node { dir: node.dir.clone(), node }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.node.path(name)
    }

    fn run(&self, args: &[&str]) -> Output {
        self.node.run(args)
    }

    /// Writes the recipe and measures its plan once; every run of this node reuses both.
    fn prepare(&self, family: &str, name: &str, method: &str) -> (String, String) {
        let recipe_path = self.path(&format!("{name}.yaml"));
        std::fs::write(&recipe_path, recipe(family, name, method)).unwrap();
        // A bare file name for --out (relative to the working directory) must work too.
        let plan_name = format!("{name}.plan.json");
        let plan_path = self.path(&plan_name);
        let o = mindxtrain(&self.dir, &["--json", "bench", s(&recipe_path), "--out", &plan_name])
            .current_dir(&self.dir)
            .output()
            .unwrap();
        assert!(o.status.success(), "bench: {}", String::from_utf8_lossy(&o.stdout));
        (s(&recipe_path).to_string(), s(&plan_path).to_string())
    }

    fn train_args<'a>(&self, recipe: &'a str, plan: &'a str, out: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
        let mut a = vec!["train", recipe, "--plan", plan, "--out", out, "--eval-prompts", "2"];
        a.extend_from_slice(extra);
        a
    }

    /// Trains to the end; returns the final files' digests.
    fn train(&self, recipe: &str, plan: &str, out: &Path, extra: &[&str]) -> Value {
        let o = self.run(&self.train_args(recipe, plan, s(out), extra));
        assert!(
            o.status.success(),
            "train: {}\n{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
        let v: Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(v["steps"], STEPS);
        assert!(!v["files"].as_array().unwrap().is_empty());
        // Sealed at the end: the exported receipt verifies against the run's files.
        let run_id = v["run_id"].as_str().unwrap();
        let receipt = out.with_extension("receipt.json");
        let e = self.run(&["receipt", "export", run_id, "--out", s(&receipt)]);
        assert!(e.status.success(), "receipt export: {}", String::from_utf8_lossy(&e.stdout));
        let check =
            self.run(&["receipt", "verify", s(&receipt), "--files", s(out), "--config", recipe, "--plan", plan]);
        assert!(check.status.success(), "receipt verify: {}", String::from_utf8_lossy(&check.stdout));
        v["files"].clone()
    }

    /// Starts a run, kills it with SIGKILL once a checkpoint past `after` is published and
    /// training is still going, and returns the step it had checkpointed.
    fn train_and_kill(&self, recipe: &str, plan: &str, out: &Path, extra: &[&str], after: u64) -> u64 {
        let mut child = mindxtrain(&self.dir, &self.train_args(recipe, plan, s(out), extra))
            .arg("--json")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let latest = out.join("checkpoints").join("latest");
        let deadline = Instant::now() + Duration::from_secs(300);
        let step = loop {
            assert!(Instant::now() < deadline, "no checkpoint past step {after} within 300 s");
            if let Some(status) = child.try_wait().unwrap() {
                panic!("the run ended ({status}) before it could be killed; raise STEPS");
            }
            let step = std::fs::read_to_string(&latest)
                .ok()
                .and_then(|t| t.trim().strip_prefix("step-").and_then(|n| n.parse::<u64>().ok()));
            if let Some(step) = step.filter(|&s| s > after) {
                break step;
            }
            std::thread::sleep(Duration::from_millis(5));
        };
        child.kill().unwrap();
        let status = child.wait().unwrap();
        assert!(!status.success(), "killed run reported success");
        assert!(step < STEPS, "killed after the last step; nothing left to resume");
        step
    }
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// Runs the recipe twice from scratch and once killed then resumed; all three must end on
/// the same bytes.
fn deterministic_and_resumable(node: &Node, family: &str, name: &str, method: &str, extra: &[&str]) {
    let (recipe, plan) = node.prepare(family, name, method);
    let a = node.train(&recipe, &plan, &node.path(&format!("{name}-a")), extra);
    let b = node.train(&recipe, &plan, &node.path(&format!("{name}-b")), extra);
    assert_eq!(a, b, "{name}: two runs of one recipe, plan and seed differ");

    // A third party's replay of run a from its receipt reproduces the sealed weights.
    let receipt = node.path(&format!("{name}-a")).with_extension("receipt.json");
    let mut args = vec!["receipt", "verify", s(&receipt), "--config", &recipe, "--plan", &plan, "--replay"];
    if let Some(i) = extra.iter().position(|a| *a == "--init-from") {
        args.extend(["--base", extra[i + 1]]);
    }
    let o = node.run(&args);
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(o.status.success(), "replay: {v}");
    let replay = v["report"]["checks"].as_array().unwrap().iter().find(|c| c["name"] == "replay").cloned();
    assert_eq!(replay.as_ref().map(|c| c["status"].clone()), Some(Value::from("pass")), "{v}");
    if extra.contains(&"--init-from") {
        // Without the base it started from, the adapter cannot be reproduced.
        let o = node.run(&args[..8]);
        let v: Value = serde_json::from_slice(&o.stdout).unwrap();
        assert!(!o.status.success(), "replay without --base passed: {v}");
        let replay = v["report"]["checks"].as_array().unwrap().iter().find(|c| c["name"] == "replay").cloned();
        assert_ne!(replay.map(|c| c["status"].clone()), Some(Value::from("pass")), "{v}");
    }

    let c_dir = node.path(&format!("{name}-c"));
    let killed_at = node.train_and_kill(&recipe, &plan, &c_dir, extra, 20);
    let mut resume = extra.to_vec();
    resume.push("--resume");
    let c = node.train(&recipe, &plan, &c_dir, &resume);
    assert_eq!(a, c, "{name}: killed at step {killed_at} and resumed, the final weights differ");

    // The log records the resume.
    let o = node.run(&["log", "show", "--kind", "run.resumed"]);
    let resumed: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(resumed.as_array().map(Vec::len), Some(1), "{resumed}");
}

#[test]
fn full_training_is_deterministic_and_resumes_bitwise_after_kill_9() {
    let node = Node::new();
    deterministic_and_resumable(&node, "qwen3", "micro_full", micro::FULL, &[]);
}

#[test]
fn lora_with_dropout_is_deterministic_and_resumes_bitwise_after_kill_9() {
    lora_on_a_trained_base("qwen3");
}

/// The same for Instella, through the model seam: another architecture's base, names and norms.
#[test]
fn instella_lora_is_deterministic_and_resumes_bitwise_after_kill_9() {
    lora_on_a_trained_base("instella");
}

/// The base: a short full run, then LoRA with dropout on top of it, twice and killed/resumed.
fn lora_on_a_trained_base(family: &str) {
    let node = Node::new();
    let (recipe, plan) = node.prepare(family, "micro_base", micro::FULL);
    let base = node.path("micro_base-a");
    node.train(&recipe, &plan, &base, &[]);
    let init = base.join("final");
    deterministic_and_resumable(&node, family, "micro_lora", micro::LORA, &["--init-from", s(&init)]);
}

/// The shipped tiny Qwen3-MoE recipe plans and trains on the CPU: `bench` measures a plan for it
/// (the grouped GEMMs' tiles among its choices), the run follows that plan, the model learns (held-out loss far below the ~6.2 of a random
/// start over 512 tokens) and its checkpoint is an HF `qwen3_moe` directory.
#[test]
fn the_tiny_moe_recipe_plans_and_trains_on_the_cpu() {
    let node = Node::new();
    let recipe = Path::new(env!("CARGO_MANIFEST_DIR")).join("../recipes/tiny_cpu_moe.yaml");
    let (plan, out) = (node.path("moe.plan.json"), node.path("moe-run"));
    micro::ok_json(&node.run(&["bench", s(&recipe), "--out", s(&plan)]));
    let measured: Value = serde_json::from_slice(&std::fs::read(&plan).unwrap()).unwrap();
    // The grouped GEMMs' tile and order were timed too (a second stage at the first's winner).
    let tiles: std::collections::BTreeSet<String> = measured["measurements"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["step_us"].is_u64())
        .map(|m| m["choices"]["moe"]["tile"].to_string())
        .collect();
    assert!(tiles.len() > 1, "grouped-GEMM tiles timed: {tiles:?}");
    let run = micro::ok_json(&node.run(&["train", s(&recipe), "--plan", s(&plan), "--out", s(&out)]));
    assert_eq!(run["steps"], 120);
    assert_eq!(run["plan"]["blake3"].as_str().map(str::len), Some(64));
    assert_eq!(run["plan"]["choices"], measured["choices"], "the run followed the measured plan");
    let held_out = run["held_out_loss"].as_f64().unwrap();
    assert!(held_out < 3.0, "held-out loss {held_out} after 120 steps");
    let config: Value = serde_json::from_slice(&std::fs::read(out.join("final/config.json")).unwrap()).unwrap();
    assert_eq!(config["model_type"], "qwen3_moe");
    assert_eq!(config["num_experts"], 4, "{config}");
    assert_eq!(config["num_experts_per_tok"], 2, "{config}");
}
