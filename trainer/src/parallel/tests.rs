//! Ranks as threads on loopback against one process, on the micro model: data parallel and
//! every ZeRO stage end on the bytes of one process at the same global batch (one micro-batch
//! per rank), and every stage on the bytes of plain data parallel.

use super::*;
use crate::collective::rendezvous::RankInfo;
use crate::collective::{Abort, Mesh};
use crate::events::Discard;
use crate::plan::{Choices, Plan};
use crate::recipe::{LoadedRecipe, Recipe};
use crate::run::{Quiet, RunSpec, train, train_rank};
use candle_core::Device;
use std::collections::BTreeMap;
use std::net::{SocketAddr, TcpListener};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

fn recipe(method: &str, per_device: u32, accum: u32, sharding: &str, steps: u32) -> LoadedRecipe {
    let text = format!(
        r#"meta:
  project: t
  run_name: par
  seed: 11
hardware:
  name: cpu
  gpus: 0
model:
  name: micro
  family: qwen3
  tokenizer: byte
  dtype: fp32
  random_init: true
  config:
    hidden_size: 32
    num_layers: 2
    num_heads: 2
    num_kv_heads: 1
    head_dim: 16
    intermediate_size: 64
    vocab_size: 300
    max_position_embeddings: 64
    tie_word_embeddings: true
data:
  source: generated
  format: text
  generator:
    kind: tasks
    seed: 3
    count: 60
  seq_len: 32
  packing: true
train:
  method:
{method}
  optimizer:
    lr: 5.0e-3
    weight_decay: 0.01
    grad_clip: 0.5
  budget:
    max_steps: {steps}
  batch:
    per_device: {per_device}
    grad_accum: {accum}
  precision: fp32
  distributed:
    sharding: {sharding}
    bucket_mb: 0.01
    timeout_seconds: 30
eval:
  enabled: false
serve:
  max_model_len: 64
"#
    );
    Recipe::from_str(&text, "par.yaml").unwrap_or_else(|e| panic!("{e}"))
}

const FULL: &str = "    kind: full";
const LORA: &str = "    kind: lora\n    r: 4\n    alpha: 8\n    dropout: 0.1";

fn spec(recipe: LoadedRecipe, out: &Path, micro: usize) -> RunSpec {
    let mut choices = Choices::unmeasured(1);
    choices.micro_batch = micro;
    let plan = Plan::new(recipe.bytes_blake3, "cpu", choices, vec![], 0, 0, false);
    RunSpec::new(recipe, ".", plan, out)
}

/// Trains `spec` on `world` ranks (threads) over the TCP mesh.
pub(crate) fn train_threads(spec: &RunSpec, world: usize) {
    let listeners: Vec<TcpListener> = (0..world).map(|_| TcpListener::bind("127.0.0.1:0").unwrap()).collect();
    let addrs: Vec<SocketAddr> = listeners.iter().map(|l| l.local_addr().unwrap()).collect();
    let topology = Topology {
        nnodes: 1,
        ranks_per_node: world,
        ranks: (0..world)
            .map(|rank| RankInfo { rank, node_rank: 0, local_rank: rank, host: "test".into(), device: "cpu".into() })
            .collect(),
    };
    std::thread::scope(|s| {
        let handles: Vec<_> = listeners
            .into_iter()
            .enumerate()
            .map(|(rank, l)| {
                let (addrs, topology) = (addrs.clone(), topology.clone());
                s.spawn(move || {
                    let mesh = Mesh::connect(rank, &addrs, l, Duration::from_secs(30), Arc::new(Abort::new())).unwrap();
                    let dist = Distributed { collective: Box::new(mesh), topology };
                    train_rank(spec, dist, Device::Cpu, &mut Discard, &mut Quiet)
                })
            })
            .collect();
        for (rank, h) in handles.into_iter().enumerate() {
            h.join().unwrap().unwrap_or_else(|e| panic!("rank {rank}: {e}"));
        }
    });
}

/// Every file of a run's final weights and last checkpoint, by relative path.
fn outputs(out: &Path) -> BTreeMap<String, Vec<u8>> {
    let mut files = BTreeMap::new();
    let latest = std::fs::read_to_string(out.join("checkpoints/latest")).unwrap();
    for dir in [out.join("final"), out.join("checkpoints").join(latest.trim())] {
        for e in std::fs::read_dir(&dir).unwrap() {
            let p = e.unwrap().path();
            let name =
                format!("{}/{}", dir.file_name().unwrap().to_string_lossy(), p.file_name().unwrap().to_string_lossy());
            // The state names the checkpoint's world size and plan; the weights and moments are compared.
            if !name.ends_with("trainer_state.json") {
                files.insert(name.replace(latest.trim(), "latest"), std::fs::read(&p).unwrap());
            }
        }
    }
    files
}

#[test]
fn ranks_end_on_the_bytes_of_one_process_at_the_same_global_batch() {
    for method in [FULL, LORA] {
        let tmp = tempfile::tempdir().unwrap();
        let one = tmp.path().join("one");
        train(&spec(recipe(method, 2, 3, "none", 4), &one, 2), &mut Discard, &mut Quiet).unwrap();
        let three = tmp.path().join("three");
        train_threads(&spec(recipe(method, 2, 1, "none", 4), &three, 2), 3);
        let (a, b) = (outputs(&one), outputs(&three));
        assert_eq!(a.keys().collect::<Vec<_>>(), b.keys().collect::<Vec<_>>());
        for (k, v) in &a {
            assert!(v == &b[k], "{method}: {k} differs between 1 process and 3 ranks");
        }
    }
}

#[test]
fn every_zero_stage_ends_on_the_bytes_of_data_parallel() {
    let tmp = tempfile::tempdir().unwrap();
    let dp = tmp.path().join("dp");
    train_threads(&spec(recipe(FULL, 2, 2, "none", 3), &dp, 1), 2);
    let want = outputs(&dp);
    for stage in ["zero1", "zero2", "zero3"] {
        let out = tmp.path().join(stage);
        train_threads(&spec(recipe(FULL, 2, 2, stage, 3), &out, 1), 2);
        let got = outputs(&out);
        for (k, v) in &want {
            assert!(v == &got[k], "{stage}: {k} differs from data parallel");
        }
    }
}

#[test]
fn accumulation_keeps_the_global_batch_or_says_which_worlds_fit() {
    assert_eq!(accumulation(12, 2, 3), Ok(2));
    assert_eq!(accumulation(12, 2, 1), Ok(6));
    let e = accumulation(12, 2, 4).unwrap_err();
    assert!(e.contains("global batch is 12 rows") && e.contains("1, 2, 3, 6"), "{e}");
}
