//! The micro Qwen3 recipe the training tests share (seconds per run, even in a debug build),
//! and a node to drive the binary in.

use crate::mindxtrain;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Output;

/// A micro Qwen3 on generated tasks: `method` is the YAML of `train.method` (indented four
/// spaces), `extra_model` extra lines of `model:` (indented two).
pub fn recipe(run_name: &str, seed: u64, method: &str, steps: u64, extra_model: &str) -> String {
    recipe_of("qwen3", run_name, seed, method, steps, extra_model)
}

/// [`recipe`] for another `model.family` of the same shape (`instella`: two heads of 16 tile
/// its hidden size of 32, as Instella's attention requires).
pub fn recipe_of(family: &str, run_name: &str, seed: u64, method: &str, steps: u64, extra_model: &str) -> String {
    format!(
        r#"meta:
  project: mindxtrain-tests
  run_name: {run_name}
  seed: {seed}
hardware:
  name: cpu
  gpus: 0
autotune:
  budget_seconds: 5
model:
  name: mindxtrain/micro-{family}
  family: {family}
  tokenizer: byte
  dtype: fp32
{extra_model}  config:
    hidden_size: 32
    num_layers: 1
    num_heads: 2
    num_kv_heads: 1
    head_dim: 16
    intermediate_size: 64
    vocab_size: 512
    max_position_embeddings: 128
    tie_word_embeddings: true
data:
  source: generated
  format: text
  generator:
    kind: tasks
    seed: 5
    count: 300
  seq_len: 64
  packing: true
train:
  method:
{method}
  optimizer:
    name: adamw
    lr: 2.0e-3
    weight_decay: 0.01
  schedule:
    kind: cosine
    warmup_ratio: 0.1
  budget:
    max_steps: {steps}
  batch:
    per_device: 2
    grad_accum: 2
  precision: fp32
  checkpoint:
    every_steps: 10
  log_every_steps: 10
eval:
  holdout:
    fraction: 0.05
    max_samples: 8
serve:
  max_model_len: 128
"#
    )
}

/// Full training: every weight.
pub const FULL: &str = "    kind: full";
/// LoRA with dropout on three projections.
pub const LORA: &str =
    "    kind: lora\n    r: 4\n    alpha: 8\n    dropout: 0.1\n    target_modules: [q_proj, v_proj, down_proj]";

/// A fresh node in a temporary directory.
pub struct Node {
    _tmp: tempfile::TempDir,
    pub dir: PathBuf,
}

impl Default for Node {
    fn default() -> Self {
        Self::new()
    }
}

impl Node {
    pub fn new() -> Node {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("node");
        let o = mindxtrain(&dir, &["init"]).output().unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        Node { _tmp: tmp, dir }
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// `mindxtrain --json ARGS` on this node.
    pub fn run(&self, args: &[&str]) -> Output {
        let mut a = vec!["--json"];
        a.extend_from_slice(args);
        mindxtrain(&self.dir, &a).output().unwrap()
    }

    /// Writes a recipe file beside the node; returns its path.
    pub fn recipe(&self, name: &str, text: &str) -> PathBuf {
        let path = self.path(&format!("{name}.yaml"));
        std::fs::write(&path, text).unwrap();
        path
    }

    /// Events of kinds starting with `kind`, as `log show --json` prints them.
    pub fn events(&self, kind: &str) -> Vec<Value> {
        let o = self.run(&["log", "show", "--kind", kind]);
        serde_json::from_slice::<Value>(&o.stdout).unwrap().as_array().cloned().unwrap_or_default()
    }
}

/// The JSON a command printed; it must have succeeded.
pub fn ok_json(o: &Output) -> Value {
    assert!(o.status.success(), "{}\n{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&o.stdout)))
}

/// A path as a command-line argument.
pub fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// BLAKE3 (hex) of a file.
pub fn b3(path: &Path) -> String {
    blake3::hash(&std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))).to_hex().to_string()
}
