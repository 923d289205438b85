//! GRPO, GSPO and KTO runs end to end on the CPU: a micro Qwen3 is taught the generated tasks
//! briefly, then RL raises the mean reward of completions sampled for held-out prompts.

use super::*;
use crate::events::TrainerEvent;
use crate::plan::Choices;
use crate::recipe::Recipe;
use serde_json::Value;
use std::path::Path;

use super::tests::Collect;

/// The micro shape on generated tasks; `method` is `train.method`'s YAML (indented four).
fn recipe(method: &str, format: &str, steps: u64, lr: f64, per_device: u32, eval_every: u64) -> LoadedRecipe {
    parse(&recipe_text(method, format, steps, lr, per_device, eval_every))
}

fn parse(text: &str) -> LoadedRecipe {
    Recipe::from_str(text, "rl.yaml").unwrap_or_else(|e| panic!("{e}"))
}

fn recipe_text(method: &str, format: &str, steps: u64, lr: f64, per_device: u32, eval_every: u64) -> String {
    format!(
        r#"meta:
  project: mindxtrain-tests
  run_name: rl
  seed: 5
hardware:
  name: cpu
  gpus: 0
model:
  name: mindxtrain/micro-qwen3
  family: qwen3
  tokenizer: byte
  dtype: fp32
  random_init: true
  config:
    hidden_size: 32
    num_layers: 1
    num_heads: 2
    num_kv_heads: 1
    head_dim: 16
    intermediate_size: 64
    vocab_size: 512
    max_position_embeddings: 160
    tie_word_embeddings: true
data:
  source: generated
  format: {format}
  generator:
    kind: tasks
    seed: 5
    count: 400
  seq_len: 160
  packing: true
train:
  method:
{method}
  optimizer:
    name: adamw
    lr: {lr}
    weight_decay: 0.0
  schedule:
    kind: constant
  budget:
    max_steps: {steps}
  batch:
    per_device: {per_device}
    grad_accum: 1
  precision: fp32
  checkpoint:
    every_steps: 1000
  log_every_steps: 1
eval:
  holdout:
    fraction: 0.1
    max_samples: 16
  every_steps: {eval_every}
serve:
  max_model_len: 160
"#
    )
}

fn spec(recipe: LoadedRecipe, out: &Path, init_from: Option<PathBuf>) -> RunSpec {
    let plan = Plan::new(recipe.bytes_blake3, "cpu", Choices::unmeasured(1), vec![], 0, 0, false);
    RunSpec { init_from, eval_prompts: 16, ..RunSpec::new(recipe, out, plan, out) }
}

fn run(s: &RunSpec) -> (RunSummary, Vec<TrainerEvent>) {
    let mut sink = Collect(Vec::new());
    let summary = train(s, &mut sink, &mut Quiet).unwrap_or_else(|e| panic!("{e}"));
    (summary, sink.0)
}

/// A brief supervised run: the base RL starts from (it answers, sometimes in the right form).
fn base(dir: &Path) -> PathBuf {
    let s = spec(recipe("    kind: full", "instruction", 60, 3e-3, 8, 1000), &dir.join("base"), None);
    run(&s);
    dir.join("base/final")
}

fn evals(events: &[TrainerEvent]) -> Vec<(u64, f64)> {
    events
        .iter()
        .filter(|e| e.kind == "eval.completed")
        .map(|e| (e.data["step"].as_u64().unwrap(), e.data["rewards"]["mean"].as_f64().unwrap()))
        .collect()
}

fn progress(events: &[TrainerEvent]) -> Vec<&Value> {
    events.iter().filter(|e| e.kind == "train.progress").map(|e| &e.data).collect()
}

#[test]
fn grpo_raises_the_mean_reward_on_held_out_prompts() {
    let dir = tempfile::tempdir().unwrap();
    let init = base(dir.path());
    let grpo = "    kind: grpo\n    num_generations: 4\n    max_new_tokens: 16\n    kl_coef: 0.0\n    \
                rewards: [format]\n    lora: {r: 8, alpha: 16}";
    let out = dir.path().join("grpo");
    let (summary, events) = run(&spec(recipe(grpo, "instruction", 40, 3e-3, 4, 20), &out, Some(init)));
    assert_eq!(summary.steps, 40);
    // Held-out rewards before training, in the middle and at the end (the same sampling
    // stream each time, so only the policy differs).
    let evals = evals(&events);
    assert_eq!(evals.iter().map(|e| e.0).collect::<Vec<_>>(), [0, 20, 40], "{evals:?}");
    let (before, after) = (evals[0].1, evals[2].1);
    assert!(after > before + 0.2, "held-out format reward {before} → {after}: GRPO did not raise it");

    // Every step reports its rewards, KL (off here), clipping and rollout speed.
    let steps = progress(&events);
    assert_eq!(steps.len(), 40);
    for p in &steps {
        let rl = &p["rl"];
        assert!(rl["rewards"]["format"].is_f64(), "{rl}");
        assert!(rl["kl"].is_null());
        assert_eq!(rl["completions"], 16);
        assert!(rl["generation_tokens_per_s"].as_f64().unwrap() > 0.0);
        for t in ["rollout_s", "reward_s", "policy_s", "clip_fraction"] {
            assert!(rl[t].as_f64().is_some_and(|v| v >= 0.0), "{t}: {rl}");
        }
    }
    // The run's files name the reward functions with their digests, and the sampling.
    let rl: Value = serde_json::from_slice(&std::fs::read(out.join(session::RL_JSON)).unwrap()).unwrap();
    assert_eq!(rl["rewards"][0]["name"], "format");
    assert_eq!(rl["rewards"][0]["blake3"].as_str().unwrap().len(), 64);
    assert_eq!(rl["sampling"]["num_generations"], 4);
    assert_eq!(rl["loss"]["ratio"], "token");
    let started = events.iter().find(|e| e.kind == "run.started").unwrap();
    assert_eq!(started.data["rl"], rl);
}

#[test]
fn gspo_with_a_kl_term_is_deterministic_and_resumes_bitwise() {
    let dir = tempfile::tempdir().unwrap();
    let init = base(dir.path());
    let gspo = "    kind: gspo\n    num_generations: 4\n    max_new_tokens: 12\n    kl_coef: 0.1\n    \
                clip_epsilon: 0.001\n    rewards: [format, length, exact_match]\n    lora: {r: 4, alpha: 8}";
    let mk =
        |name: &str| spec(recipe(gspo, "instruction", 8, 2e-3, 2, 1000), &dir.path().join(name), Some(init.clone()));
    let (a, events) = run(&mk("a"));
    let (b, _) = run(&mk("b"));
    assert_eq!(a.files, b.files, "two runs of one recipe and seed differ");
    for p in progress(&events) {
        let kl = p["rl"]["kl"].as_f64().unwrap();
        assert!(kl.is_finite() && kl >= 0.0, "{p}");
        assert_eq!(p["rl"]["rewards"].as_object().unwrap().len(), 3);
    }
    assert!(progress(&events).iter().skip(1).any(|p| p["rl"]["kl"].as_f64().unwrap() > 0.0), "the policy moved");

    // Stopped after step 3 (a checkpoint every step), then resumed: the same adapter.
    let mut s = mk("c");
    s.recipe = parse(
        &recipe_text(gspo, "instruction", 8, 2e-3, 2, 1000)
            .replace("every_steps: 1000\n  log", "every_steps: 1\n  log"),
    );
    s.plan = Plan::new(s.recipe.bytes_blake3, "cpu", Choices::unmeasured(1), vec![], 0, 0, false);
    s.plan_blake3 = *blake3::hash(&s.plan.to_bytes()).as_bytes();
    let mut stop = StopAfter(3);
    let err = train(&s, &mut Collect(Vec::new()), &mut stop).unwrap_err();
    assert!(matches!(err, RunError::Cancelled { step: 3 }), "{err}");
    s.resume = true;
    let (c, _) = run(&s);
    assert_eq!(c.start_step, 3);
    let adapter = |r: &RunSummary| r.files.iter().find(|f| f.path.ends_with(".safetensors")).cloned();
    assert_eq!(adapter(&a).map(|f| f.blake3), adapter(&c).map(|f| f.blake3), "resumed GSPO differs");
}

/// GRPO over a Qwen3-MoE with LoRA on its experts: the rollouts sample the policy merged (the
/// engine batches adapters on projections, not on experts) and the step trains the experts'
/// adapters, saved in PEFT's layout.
#[test]
fn grpo_trains_adapters_on_a_moe_model_s_experts() {
    let dir = tempfile::tempdir().unwrap();
    let method = "    kind: grpo\n    num_generations: 4\n    max_new_tokens: 8\n    rewards: [format]\n    lora: {r: 2, alpha: 4}";
    let text = recipe_text(method, "instruction", 2, 1e-2, 2, 1000).replace("  family: qwen3\n", "  family: qwen3_moe\n").replace(
        "    tie_word_embeddings: true\n",
        "    tie_word_embeddings: true\n    moe:\n      num_experts: 4\n      experts_per_token: 2\n      expert_intermediate_size: 16\n",
    );
    let (summary, events) = run(&spec(parse(&text), dir.path(), None));
    assert_eq!(summary.steps, 2);
    for p in progress(&events) {
        assert_eq!(p["rl"]["completions"], 8, "{p}");
    }
    let (config, tensors) =
        crate::checkpoint::load_peft_adapter(&summary.final_dir, &candle_core::Device::Cpu).unwrap();
    assert_eq!(config.target_parameters.as_deref(), Some(&["gate_up_proj".to_string(), "down_proj".to_string()][..]));
    let b = &tensors["base_model.model.model.layers.0.mlp.experts.lora_B.weight"];
    assert!(b.abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap() > 0.0, "the experts' adapter trained");
}

struct StopAfter(u64);

impl Observer for StopAfter {
    fn step(&mut self, report: &StepReport) {
        self.0 = if report.step >= self.0 { 0 } else { self.0 };
    }
    fn cancelled(&mut self) -> bool {
        self.0 == 0
    }
}

#[test]
fn kto_moves_desirable_answers_up_and_undesirable_ones_down() {
    let dir = tempfile::tempdir().unwrap();
    let kto = "    kind: kto\n    beta: 1.0\n    desirable_weight: 1.0\n    undesirable_weight: 1.0";
    let (summary, events) = run(&spec(recipe(kto, "preference", 60, 1e-2, 4, 1000), &dir.path().join("kto"), None));
    assert_eq!(summary.steps, 60);
    let steps = progress(&events);
    assert!(steps.iter().all(|p| p["rl"]["kl"].as_f64().is_some_and(|z| z >= 0.0) && p["rl"]["examples"] == 8));
    // Each step's answers against the reference, desirable minus undesirable: KTO pushes them
    // apart (at the start both are 0: the policy is the reference).
    let margin =
        |p: &Value| p["rl"]["desirable_logratio"].as_f64().unwrap() - p["rl"]["undesirable_logratio"].as_f64().unwrap();
    assert_eq!(margin(steps[0]), 0.0);
    let late: Vec<f64> = steps[20..].iter().map(|p| margin(p)).collect();
    let mean = late.iter().sum::<f64>() / late.len() as f64;
    assert!(mean > 0.3, "desirable minus undesirable log-ratio {mean} over steps 21..60");
    let loss = |r: &[&Value]| r.iter().map(|p| p["loss"].as_f64().unwrap()).sum::<f64>() / r.len() as f64;
    assert!(loss(&steps[40..]) < loss(&steps[..10]), "KTO's loss did not fall");
}

#[test]
fn the_shipped_tiny_grpo_recipe_is_valid_and_trains_grpo() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../recipes/tiny_cpu_grpo.yaml");
    let r = Recipe::from_path(&path).unwrap_or_else(|e| panic!("{e}"));
    match MethodPlan::from_recipe(&r.recipe.train.method).unwrap().rl {
        Some(RlPlan::Policy(p)) => assert_eq!((p.num_generations, p.max_new_tokens), (4, 24)),
        other => panic!("{other:?}"),
    }
}

#[test]
fn rl_sections_are_strict_and_their_errors_name_the_field() {
    let bad = |method: &str| {
        let text = recipe_text(method, "instruction", 1, 1e-3, 1, 1);
        Recipe::from_str(&text, "rl.yaml").map(|_| ()).unwrap_err().to_string()
    };
    let e = bad("    kind: grpo\n    max_new_tokens: 16\n    reward: [format]");
    assert!(e.contains("rl.yaml:") && e.contains("reward"), "{e}");
    let e = bad("    kind: grpo\n    max_new_tokens: 16\n    rewards: [numeric]");
    assert!(e.contains("numeric") && e.contains("numeric_match") && e.contains("tool_call"), "{e}");
    let e = bad("    kind: gspo\n    max_new_tokens: 16\n    num_generations: 1");
    assert!(e.contains("train.method.num_generations"), "{e}");
    let e = bad("    kind: grpo\n    max_new_tokens: 160");
    assert!(e.contains("train.method.max_new_tokens") && e.contains("below data.seq_len"), "{e}");
    let e = Recipe::from_str(&recipe_text("    kind: kto\n    beta: 0", "preference", 1, 1e-3, 1, 1), "rl.yaml")
        .map(|_| ())
        .unwrap_err()
        .to_string();
    assert!(e.contains("train.method.beta"), "{e}");
    // GRPO needs prompts with reference answers.
    let e = Recipe::from_str(&recipe_text("    kind: grpo\n    max_new_tokens: 16", "text", 1, 1e-3, 1, 1), "rl.yaml")
        .map(|_| ())
        .unwrap_err()
        .to_string();
    assert!(e.contains("data.format") && e.contains("RL methods"), "{e}");
}

/// The same runs on a CUDA device (scripts/gpu-test runs this module there).
#[cfg(feature = "cuda")]
mod gpu_tests {
    use super::*;

    /// `text` on the first GPU: its recipe and a plan that names `cuda:0`.
    fn on_gpu(text: &str, out: &Path) -> RunSpec {
        let recipe = parse(&text.replace("  name: cpu\n  gpus: 0", "  name: h200\n  gpus: 1"));
        let plan = Plan::new(recipe.bytes_blake3, "cuda:0", Choices::unmeasured(1), vec![], 0, 0, false);
        RunSpec { eval_prompts: 4, ..RunSpec::new(recipe, out, plan, out) }
    }

    fn losses(events: &[TrainerEvent]) -> Vec<f64> {
        progress(events).iter().map(|p| p["loss"].as_f64().unwrap_or(f64::NAN)).collect()
    }

    /// GRPO and GSPO roll out through the serving engine on the GPU and take their policy steps
    /// there; KTO (no sampling, so no rounding flips between devices) follows the CPU engine's
    /// losses step for step in f32.
    #[test]
    fn grpo_gspo_and_kto_train_on_the_gpu() {
        let dir = tempfile::tempdir().unwrap();
        let lora = "    lora: {r: 8, alpha: 16}";
        for kind in ["grpo", "gspo"] {
            let method = format!(
                "    kind: {kind}\n    num_generations: 4\n    max_new_tokens: 16\n    rewards: [format, numeric_match]\n{lora}"
            );
            let out = dir.path().join(kind);
            let (summary, events) = run(&on_gpu(&recipe_text(&method, "instruction", 4, 1e-3, 4, 1000), &out));
            assert_eq!(summary.steps, 4, "{kind}");
            let steps = progress(&events);
            assert!(losses(&events).iter().all(|l| l.is_finite()), "{kind}: {steps:?}");
            for p in &steps {
                assert_eq!(p["rl"]["completions"], 16, "{kind}: {p}");
                assert!(p["rl"]["generation_tokens_per_s"].as_f64().is_some_and(|t| t > 0.0), "{kind}: {p}");
            }
        }
        let text = recipe_text(&format!("    kind: kto\n    beta: 1.0\n{lora}"), "preference", 4, 1e-2, 4, 1000);
        let (gpu, gpu_events) = run(&on_gpu(&text, &dir.path().join("kto-gpu")));
        let (cpu, cpu_events) = run(&spec(parse(&text), &dir.path().join("kto-cpu"), None));
        assert_eq!((gpu.steps, cpu.steps), (4, 4));
        let (g, c) = (losses(&gpu_events), losses(&cpu_events));
        assert_eq!(g.len(), 4);
        for (step, (g, c)) in g.iter().zip(&c).enumerate() {
            assert!((g - c).abs() < 1e-3 * (1.0 + c.abs()), "KTO step {}: GPU loss {g} vs CPU {c}", step + 1);
        }
    }
}
