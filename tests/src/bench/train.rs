//! `mindxtrain-bench train`: CPU training steps per second of our engine against PyTorch +
//! transformers + PEFT on the same tiny Qwen3 shape and thread count, in one run.
//!
//! One step on each side is the same work: forward, backward and an AdamW update of the
//! trainable tensors (LoRA A/B on all seven projections, or every weight with `--full`),
//! batch × seq random tokens, f32.

use anyhow::{Context, Result, bail};
use candle_core::{DType, Device};
use mindxtrain_trainer::batch::{IGNORE, PackedBatch};
use mindxtrain_trainer::model::{Adapters, CausalLm, LmConfig, LoraConfig, StepOptions, Trainable};
use mindxtrain_trainer::optim::Optimizer;
use mindxtrain_trainer::recipe::{Optimizer as OptimizerRecipe, OptimizerName, Recipe, TargetModule};
use mindxtrain_trainer::run::thread_pool;
use serde_json::{Value, json};
use std::path::Path;
use std::process::Command;
use std::time::Instant;

pub struct TrainBench<'a> {
    pub threads: &'a [usize],
    pub steps: usize,
    pub warmup: usize,
    pub batch: usize,
    pub seq: usize,
    pub full: bool,
    pub python: &'a Path,
    /// tests/python/qwen3_tiny.py.
    pub script: &'a Path,
}

/// The model of `recipes/tiny_cpu_lora.yaml` (as embedded in the node).
fn tiny() -> Result<LmConfig> {
    const NAME: &str = "tiny_cpu_lora.yaml";
    let src = mindxtrain_node::recipes::EMBEDDED_RECIPES
        .iter()
        .find(|(n, _)| *n == NAME)
        .map(|(_, s)| *s)
        .with_context(|| format!("embedded recipe {NAME} missing"))?;
    let loaded = Recipe::check_str(src, NAME).map_err(|e| anyhow::anyhow!("{NAME}: {e}"))?;
    let config = loaded.recipe.model.config.as_ref().with_context(|| format!("{NAME} has no model.config"))?;
    LmConfig::from_recipe(config, loaded.recipe.model.family)
        .with_context(|| format!("{NAME}: a family the engine runs"))
}

const LORA_R: usize = 16;
const LORA_ALPHA: f64 = 32.0;

fn batch(b: usize, t: usize, vocab: usize) -> PackedBatch {
    // A fixed LCG: the bench needs tokens, not a particular distribution.
    let mut x = 0x2545_f491_4f6c_dd1d_u64;
    let ids: Vec<u32> = (0..b * t)
        .map(|_| {
            x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
            ((x >> 33) % vocab as u64) as u32
        })
        .collect();
    let labels = (0..b * t).map(|i| if (i + 1) % t == 0 { IGNORE } else { ids[i + 1] as i64 }).collect();
    PackedBatch {
        batch: b,
        seq_len: t,
        input_ids: ids,
        position_ids: (0..b * t).map(|i| (i % t) as u32).collect(),
        segment_ids: vec![1; b * t],
        labels,
    }
}

/// Our steps/s at `threads`.
fn ours(cfg: &TrainBench, threads: usize) -> Result<f64> {
    let config = tiny()?;
    let pool = thread_pool(threads)?;
    pool.install(|| -> Result<f64> {
        let mut model = CausalLm::init_random(&config, 1, DType::F32, &Device::Cpu)?;
        let lora = LoraConfig {
            r: LORA_R,
            alpha: LORA_ALPHA,
            dropout: 0.0,
            target_modules: TargetModule::all(),
            rslora: false,
        };
        let mut adapters = Adapters::init(&config, &lora, 2, DType::F32, &Device::Cpu)?;
        // The trainer's optimizer as a recipe builds it, set as the peer's torch AdamW.
        let mut adam = Optimizer::from_recipe(&OptimizerRecipe {
            name: OptimizerName::AdamW,
            betas: [0.9, 0.999],
            eps: 1e-8,
            weight_decay: 0.01,
            ..OptimizerRecipe::default()
        })?;
        let b = batch(cfg.batch, cfg.seq, config.vocab_size);
        let opts = StepOptions::default();
        let mut step = || -> Result<()> {
            if cfg.full {
                let out = model.forward_backward(&b, Trainable::Full, None, &opts)?;
                adam.step(model.params_mut(), &out.grads, 1e-4)?;
            } else {
                let out = model.forward_backward(&b, Trainable::Adapters, Some(&adapters), &opts)?;
                adam.step(&mut adapters.tensors, &out.grads, 1e-4)?;
            }
            Ok(())
        };
        for _ in 0..cfg.warmup {
            step()?;
        }
        let start = Instant::now();
        for _ in 0..cfg.steps {
            step()?;
        }
        Ok(cfg.steps as f64 / start.elapsed().as_secs_f64())
    })
}

/// The peer's steps/s at `threads` (tests/python/qwen3_tiny.py bench).
fn peer(cfg: &TrainBench, threads: usize, config_path: &Path) -> Result<(f64, Value)> {
    let mut c = Command::new(cfg.python);
    c.arg(cfg.script).arg("bench").arg("--config").arg(config_path);
    for (k, v) in [
        ("--batch", cfg.batch),
        ("--seq", cfg.seq),
        ("--threads", threads),
        ("--steps", cfg.steps),
        ("--warmup", cfg.warmup),
        ("--r", LORA_R),
    ] {
        c.arg(k).arg(v.to_string());
    }
    c.arg("--alpha").arg(LORA_ALPHA.to_string());
    if cfg.full {
        c.arg("--full");
    }
    let out =
        c.output().with_context(|| format!("running {} (set it up with scripts/setup-torch)", cfg.python.display()))?;
    if !out.status.success() {
        bail!("peer failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    let v: Value = serde_json::from_slice(&out.stdout).context("peer output")?;
    let steps_s = v["steps"].as_f64().unwrap_or(0.0) / v["seconds"].as_f64().unwrap_or(f64::INFINITY);
    Ok((steps_s, v))
}

pub fn run(cfg: &TrainBench, as_json: bool) -> Result<()> {
    let dir = tempfile::tempdir()?;
    let config_path = dir.path().join("config.json");
    std::fs::write(&config_path, tiny()?.to_hf_json("float32"))?;
    let tokens = (cfg.batch * cfg.seq) as f64;
    let what = if cfg.full { "full" } else { "LoRA r16 all seven projections" };
    println!(
        "CPU training step, tiny Qwen3 (hidden 64, 2 layers, vocab 512), {what}, batch {}×{}, f32, {} timed steps",
        cfg.batch, cfg.seq, cfg.steps
    );
    println!(
        "{:>8} {:>14} {:>14} {:>12} {:>12} {:>8}",
        "threads", "ours ms/step", "peer ms/step", "ours tok/s", "peer tok/s", "ratio"
    );
    let mut rows = Vec::new();
    for &threads in cfg.threads {
        let ours = ours(cfg, threads)?;
        let (peer, meta) = peer(cfg, threads, &config_path)?;
        println!(
            "{threads:>8} {:>14.2} {:>14.2} {:>12.0} {:>12.0} {:>7.2}×",
            1e3 / ours,
            1e3 / peer,
            ours * tokens,
            peer * tokens,
            ours / peer
        );
        rows.push(json!({"threads": threads, "ours_steps_s": ours, "peer_steps_s": peer, "ratio": ours / peer,
            "ours_tok_s": ours * tokens, "peer_tok_s": peer * tokens, "peer": meta}));
    }
    if as_json {
        println!(
            "{}",
            serde_json::to_string_pretty(&json!({"full": cfg.full, "batch": cfg.batch, "seq": cfg.seq, "rows": rows}))?
        );
    }
    Ok(())
}
