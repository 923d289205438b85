//! GRPO's step benchmark (docs/benchmarks.md, "Reinforcement learning"): a real GRPO run through
//! `run::train` at a model shape (random weights, LoRA on every projection, generated tasks as
//! prompts), reporting per step the rollout's generation tokens/s, the policy step's tokens/s
//! and the whole step's seconds, as the `train.progress` events record them. The first step
//! (engine start, kernel warm-up) is left out of the means.
//!
//! ```text
//! rl_bench device=cuda shape=8B steps=4 prompts=8 generations=8 new_tokens=256 seq_len=2048 r=16 out=FILE
//! rl_bench device=cpu shape=tiny steps=3 prompts=2 generations=4 new_tokens=16 seq_len=128 r=4   (a CPU smoke run)
//! rl_bench device=cuda shape=0.6B method=gspo steps=3     (GSPO; `method=kto`: KTO on generated preference pairs)
//! ```
//! Metrics are named after the method (`grpo_step_s`, `gspo_step_s`, `kto_step_s`, …); KTO has no
//! rollout, so only its step seconds and its first and last loss.
//! Prints one JSON object per metric (`metric`, `ours`, and the settings) and writes them to `out`.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Instant;

use mindxtrain_trainer::events::{EventSink, TrainerEvent};
use mindxtrain_trainer::plan::{Choices, Plan};
use mindxtrain_trainer::recipe::Recipe;
use mindxtrain_trainer::run::{Observer, RunSpec, StepReport, train};
use serde_json::{Value, json};

type Res<T> = Result<T, Box<dyn std::error::Error>>;

/// `(hidden, layers, heads, kv heads, head dim, ffn, vocab, tied)`.
fn shape(name: &str) -> (u32, u32, u32, u32, u32, u32, u32, bool) {
    match name {
        "8B" => (4096, 36, 32, 8, 128, 12_288, 151_936, false),
        "1.7B" => (2048, 28, 16, 8, 128, 6144, 151_936, true),
        "0.6B" => (1024, 28, 16, 8, 128, 3072, 151_936, true),
        _ => (64, 2, 4, 2, 16, 128, 512, true),
    }
}

struct Progress(Vec<Value>);

impl EventSink for Progress {
    type Error = std::convert::Infallible;
    fn emit(&mut self, e: TrainerEvent) -> Result<(), Self::Error> {
        if e.kind == "train.progress" {
            self.0.push(e.data);
        }
        Ok(())
    }
}

/// Wall seconds of each step.
struct StepTimes(Vec<f64>, Instant);

impl Observer for StepTimes {
    fn step(&mut self, _: &StepReport) {
        self.0.push(self.1.elapsed().as_secs_f64());
        self.1 = Instant::now();
    }
}

fn main() -> Res<()> {
    let args: BTreeMap<String, String> =
        std::env::args().skip(1).filter_map(|a| a.split_once('=').map(|(k, v)| (k.into(), v.into()))).collect();
    let get = |k: &str, d: &str| args.get(k).cloned().unwrap_or_else(|| d.into());
    let num = |k: &str, d: u64| args.get(k).and_then(|v| v.parse().ok()).unwrap_or(d);
    let (device, shape_name, method) = (get("device", "cpu"), get("shape", "tiny"), get("method", "grpo"));
    let (steps, prompts, generations) = (num("steps", 3), num("prompts", 2), num("generations", 4));
    let (new_tokens, seq_len, r) = (num("new_tokens", 16), num("seq_len", 128), num("r", 4));
    let (hidden, layers, heads, kv, hd, ffn, vocab, tied) = shape(&shape_name);
    let (hardware, dtype) =
        if device == "cuda" { ("  name: h200\n  gpus: 1", "bf16") } else { ("  name: cpu\n  gpus: 0", "fp32") };
    let (format, method_yaml) = match method.as_str() {
        "grpo" | "gspo" => (
            "instruction",
            format!(
                "    kind: {method}\n    num_generations: {generations}\n    max_new_tokens: {new_tokens}\n    \
                 rewards: [numeric_match, format, exact_match]\n    lora: {{r: {r}, alpha: {alpha}}}",
                alpha = 2 * r
            ),
        ),
        "kto" => {
            ("preference", format!("    kind: kto\n    beta: 0.1\n    lora: {{r: {r}, alpha: {alpha}}}", alpha = 2 * r))
        }
        other => return Err(format!("method={other}: grpo, gspo or kto").into()),
    };
    let yaml = format!(
        r#"meta: {{project: bench, run_name: rl_bench, seed: 1}}
hardware:
{hardware}
model:
  name: bench/qwen3-{shape_name}
  family: qwen3
  tokenizer: byte
  dtype: {dtype}
  random_init: true
  config: {{hidden_size: {hidden}, num_layers: {layers}, num_heads: {heads}, num_kv_heads: {kv}, head_dim: {hd},
           intermediate_size: {ffn}, vocab_size: {vocab}, max_position_embeddings: {seq_len}, tie_word_embeddings: {tied}}}
data:
  source: generated
  format: {format}
  generator: {{kind: tasks, seed: 1, count: 2000}}
  seq_len: {seq_len}
train:
  method:
{method_yaml}
  optimizer: {{lr: 1.0e-5}}
  schedule: {{kind: constant}}
  budget: {{max_steps: {steps}}}
  batch: {{per_device: {prompts}, grad_accum: 1}}
  precision: {dtype}
  log_every_steps: 1
eval:
  enabled: false
serve:
  max_model_len: {seq_len}
"#
    );
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path().to_path_buf();
    let recipe = Recipe::from_str(&yaml, "rl_bench.yaml")?;
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let plan = Plan::new(
        recipe.bytes_blake3,
        if device == "cuda" { "cuda:0" } else { "cpu" },
        Choices::unmeasured(threads),
        vec![],
        0,
        0,
        false,
    );
    let spec = RunSpec::new(recipe, dir.clone(), plan, dir.join("out"));
    let mut sink = Progress(Vec::new());
    let mut times = StepTimes(Vec::new(), Instant::now());
    train(&spec, &mut sink, &mut times)?;
    let warm: Vec<(&Value, f64)> = sink.0.iter().zip(times.0.iter().copied()).skip(1).collect();
    if warm.is_empty() {
        return Err("steps=2 at least: the first step is warm-up".into());
    }
    let mean = |f: &dyn Fn(&Value, f64) -> f64| warm.iter().map(|(v, t)| f(v, *t)).sum::<f64>() / warm.len() as f64;
    let rl = |k: &'static str| move |v: &Value, _: f64| v["rl"][k].as_f64().unwrap_or(f64::NAN);
    let settings = json!({"method": method, "shape": shape_name, "device": device, "prompts": prompts, "generations": generations,
        "new_tokens": new_tokens, "seq_len": seq_len, "lora_r": r, "steps_measured": warm.len()});
    let loss = |v: Option<&Value>| v.and_then(|v| v["loss"].as_f64()).unwrap_or(f64::NAN);
    let mut metrics = vec![("step_s", mean(&|_, t| t))];
    if method == "kto" {
        metrics.extend([("loss_first", loss(sink.0.first())), ("loss_last", loss(sink.0.last()))]);
    } else {
        metrics.extend([
            ("rollout_tokens_per_s", mean(&rl("generation_tokens_per_s"))),
            ("policy_tokens_per_s", mean(&rl("policy_tokens_per_s"))),
            ("rollout_s", mean(&rl("rollout_s"))),
            ("policy_s", mean(&rl("policy_s"))),
        ]);
    }
    let mut lines = String::new();
    for (name, ours) in metrics {
        let mut line = json!({"metric": format!("{method}_{name}"), "ours": ours});
        line["settings"] = settings.clone();
        println!("{line}");
        lines += &format!("{line}\n");
    }
    if let Some(out) = args.get("out") {
        std::fs::write(Path::new(out), lines)?;
    }
    Ok(())
}
