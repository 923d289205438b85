//! A served micro model for the end-to-end tests: a micro Qwen3 trained with LoRA in a fresh
//! node (probe, then train, through the binary), and `mindxtrain serve` on a free loopback
//! port, killed on drop.

use crate::mindxtrain;
use candle_core::{DType, Device};
use mindxtrain_trainer::batch::PackedBatch;
use mindxtrain_trainer::data::tokenizer::{BYTE_VOCAB_SIZE, Tokenizer};
use mindxtrain_trainer::generate::{Limits, Sampling, generate};
use mindxtrain_trainer::model::{Adapters, CausalLm};
use mindxtrain_trainer::recipe::Recipe;
use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::ops::ControlFlow;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};

pub const MODEL: &str = "mindxtrain/micro-qwen3";
/// The recipe's price: 0.01 USDC per call.
pub const PRICE: u64 = 10_000;

/// A micro Qwen3 with a LoRA adapter, sold per call on the local chain.
pub fn recipe_yaml(max_batch: u32) -> String {
    recipe_with_serve(&format!("{{max_model_len: 160, max_batch: {max_batch}, reasoning: false}}"))
}

/// [`recipe_yaml`] with another `serve` section (a flow mapping). The model's positions reach
/// 1024, so a section may give requests more room than the fixture's 160.
pub fn recipe_with_serve(serve: &str) -> String {
    format!(
        r#"meta: {{project: mindxtrain-tests, run_name: serve, seed: 3}}
hardware: {{name: cpu, gpus: 0}}
autotune: {{budget_seconds: 3}}
model:
  name: {MODEL}
  family: qwen3
  tokenizer: byte
  dtype: fp32
  config: {{hidden_size: 32, num_layers: 1, num_heads: 2, num_kv_heads: 1, head_dim: 16, intermediate_size: 64,
            vocab_size: 512, max_position_embeddings: 1024, tie_word_embeddings: true}}
  # A serving fixture: the adapter tunes random weights, on purpose.
  random_init: true
data:
  source: generated
  format: instruction
  generator: {{kind: tasks, seed: 3, count: 200}}
  seq_len: 64
  packing: true
train:
  method: {{kind: lora, r: 4, alpha: 8, dropout: 0.0, target_modules: [q_proj, v_proj]}}
  optimizer: {{name: adamw, lr: 1.0e-3, weight_decay: 0.0}}
  schedule: {{kind: constant}}
  budget: {{max_steps: 4}}
  batch: {{per_device: 4, grad_accum: 1}}
  precision: fp32
eval:
  holdout: {{fraction: 0.05, max_samples: 8}}
serve: {serve}
publish:
  billing:
    x402:
      network: anvil
      asset: USDC
      pricing: {{per_call: "0.01"}}
"#
    )
}

/// A node directory with a trained adapter.
pub struct Trained {
    _tmp: tempfile::TempDir,
    pub root: PathBuf,
    pub recipe: PathBuf,
    pub checkpoint: PathBuf,
}

/// The JSON a successful command printed (it must have succeeded).
pub fn ok(o: std::process::Output) -> Value {
    assert!(o.status.success(), "{}\n{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&o.stdout).unwrap_or(Value::Null)
}

/// A path as a command-line argument.
pub fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// A node directory with a trained adapter (`max_batch` is the recipe's `serve.max_batch`).
pub fn trained(max_batch: u32) -> Trained {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().to_path_buf();
    let node = root.join("trainer-node");
    ok(mindxtrain(&node, &["init"]).output().unwrap());
    let recipe = root.join("serve.yaml");
    std::fs::write(&recipe, recipe_yaml(max_batch)).unwrap();
    let plan = root.join("plan.json");
    ok(mindxtrain(&node, &["--json", "bench", s(&recipe), "--out", s(&plan)]).output().unwrap());
    let out = root.join("run");
    ok(mindxtrain(&node, &["--json", "train", s(&recipe), "--plan", s(&plan), "--out", s(&out)]).output().unwrap());
    Trained { _tmp: tmp, root, recipe, checkpoint: out.join("final") }
}

impl Trained {
    /// The checkpoint loaded in this process as `serve` loads it: the model and its adapters.
    pub fn load(&self) -> (CausalLm, Option<Adapters>) {
        let recipe = Recipe::from_path(&self.recipe).unwrap().recipe;
        let dir = self.recipe.parent().unwrap();
        let base = mindxtrain_trainer::run::adapter_base(&recipe, dir, &self.checkpoint, None, false).unwrap();
        mindxtrain_trainer::checkpoint::load_checkpoint(&recipe, base.as_deref(), &self.checkpoint, &Device::Cpu)
            .unwrap()
    }

    /// Our log-probability of each of `ids[1..]` and the best log-probability at its position,
    /// from the checkpoint loaded in this process, over the byte tokenizer's ids as served.
    pub fn logprobs(&self, ids: &[u32]) -> Vec<(f64, f64)> {
        let (model, adapters) = self.load();
        let n = ids.len();
        let batch = PackedBatch::single_row(ids);
        let logits =
            model.logits(&batch, adapters.as_ref()).unwrap().to_dtype(DType::F64).unwrap().to_vec3::<f64>().unwrap();
        (1..n)
            .map(|i| {
                let row = &logits[0][i - 1][..BYTE_VOCAB_SIZE];
                let lse = row.iter().map(|v| v.exp()).sum::<f64>().ln();
                let best = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                (row[ids[i] as usize] - lse, best - lse)
            })
            .collect()
    }

    /// The greedy continuation of `prompt` in this process (dense decode, not the serving
    /// engine), up to `max_tokens`, ending at the tokens that end an answer as served.
    pub fn greedy(&self, prompt: &[u32], max_tokens: usize) -> Vec<u32> {
        let (model, adapters) = self.load();
        let stop_ids = Tokenizer::byte().stop_ids();
        let limits = Limits { max_tokens, vocab: BYTE_VOCAB_SIZE, stop_ids: &stop_ids };
        let mut out = Vec::new();
        generate(&model, adapters.as_ref(), prompt, limits, &Sampling::greedy(), |id| {
            out.push(id);
            ControlFlow::Continue(())
        })
        .unwrap();
        out
    }

    /// The training recipe with `serve` as its serve section, written beside it as `name`: the
    /// same model, served under other terms.
    pub fn recipe_serving(&self, name: &str, serve: &str) -> PathBuf {
        let path = self.root.join(name);
        std::fs::write(&path, recipe_with_serve(serve)).unwrap();
        path
    }
}

/// A new node (initialised) beside the trained one.
pub fn new_node(t: &Trained, name: &str) -> PathBuf {
    let dir = t.root.join(name);
    ok(mindxtrain(&dir, &["init"]).output().unwrap());
    dir
}

/// A 0600 key file.
pub fn key_file(dir: &Path, name: &str, hex_key: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, hex_key).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
    p
}

/// `mindxtrain serve` on a free loopback port; killed on drop.
pub struct Server {
    pub child: Child,
    pub url: String,
    /// The first line serve printed (`--json`): where it listens, the model, the token file.
    pub started: Value,
}

impl Server {
    /// Serves the trained model from `node`, with `extra` arguments (payment options).
    pub fn start(node: &Path, t: &Trained, extra: &[&str]) -> Server {
        let mut args = vec!["serve", s(&t.recipe), "--checkpoint", s(&t.checkpoint)];
        args.extend_from_slice(extra);
        Server::run(node, &args)
    }

    /// Serves the trained model under `recipe` (another serve section) from `node`.
    pub fn start_as(node: &Path, t: &Trained, recipe: &Path, extra: &[&str]) -> Server {
        let mut args = vec!["serve", s(recipe), "--checkpoint", s(&t.checkpoint)];
        args.extend_from_slice(extra);
        Server::run(node, &args)
    }

    /// `mindxtrain --json <args> --listen 127.0.0.1:0` in `node`, once it listens.
    pub fn run(node: &Path, args: &[&str]) -> Server {
        let mut all = args.to_vec();
        all.extend_from_slice(&["--listen", "127.0.0.1:0"]);
        Server::spawn(node, &all)
    }

    /// `mindxtrain --json <args>` in `node` as given (where it listens is the args' and the
    /// recipe's to say), once it listens.
    pub fn spawn(node: &Path, args: &[&str]) -> Server {
        let mut all = vec!["--json"];
        all.extend_from_slice(args);
        let mut child = mindxtrain(node, &all).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
        if line.is_empty() {
            let out = child.wait_with_output().unwrap();
            panic!("serve exited: {}", String::from_utf8_lossy(&out.stderr));
        }
        let started: Value = serde_json::from_str(&line).unwrap();
        Server { url: started["listening"].as_str().unwrap().to_string(), child, started }
    }

    /// The operator token of the node it serves.
    pub fn token(node: &Path) -> String {
        std::fs::read_to_string(node.join("api.token")).unwrap().trim().to_owned()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// GETs `url` (with `token` as bearer when given), expecting a 200 with a JSON body.
pub async fn get_json(http: &reqwest::Client, url: &str, token: Option<&str>) -> Value {
    let mut req = http.get(url);
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    let r = req.send().await.unwrap_or_else(|e| panic!("GET {url}: {e}"));
    assert_eq!(r.status(), 200, "GET {url}");
    r.json().await.unwrap_or_else(|e| panic!("GET {url}: {e}"))
}

/// POSTs `body` to `url` from a test's synchronous code: the status and the JSON answer.
pub fn post_json_blocking(url: &str, body: &Value) -> (u16, Value) {
    let rt = tokio::runtime::Runtime::new().expect("a tokio runtime");
    rt.block_on(async {
        let r = reqwest::Client::new().post(url).json(body).send().await.unwrap_or_else(|e| panic!("POST {url}: {e}"));
        (r.status().as_u16(), r.json::<Value>().await.unwrap_or_else(|e| panic!("POST {url}: {e}")))
    })
}

/// GETs `url` from a test's synchronous code, expecting a 200 with a JSON body.
pub fn get_blocking(url: &str) -> Value {
    let rt = tokio::runtime::Runtime::new().expect("a tokio runtime");
    rt.block_on(get_json(&reqwest::Client::new(), url, None))
}
