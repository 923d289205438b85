//! The interop tests' two sides, for any architecture with a tiny PyTorch script in
//! `tests/python/` (`qwen3_tiny.py`, `instella_tiny.py`, both on `hf_tiny.py`): a tiny random
//! model made and saved by transformers loads in our trainer with the same logits; a model and
//! an adapter we save load in transformers/PEFT with the same logits; one LoRA step of ours
//! equals one PEFT + torch AdamW step. `tests/tests/interop*.rs` run these checks per family.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use candle_core::{DType, Device, Tensor};
use mindxtrain_trainer::batch::{IGNORE, PackedBatch};
use mindxtrain_trainer::checkpoint::{
    AdapterConfig, StagedDir, WeightFiles, load_hf_model, load_peft_adapter, save_hf_model, save_peft_adapter,
};
use mindxtrain_trainer::generate::{Limits, Sampling, generate};
use mindxtrain_trainer::model::{Adapters, CausalLm, LmConfig, LoraConfig, StepOptions, Trainable, merge_lora, moe};
use mindxtrain_trainer::optim::{AdamW, AdamWConfig, clip_grad_norm};
use mindxtrain_trainer::recipe::{Lora, TargetModule};
use serde_json::Value;

/// One architecture's side in Python: its script, the `config.json` of its tiny model, and the
/// projections the fixture's adapter targets.
pub struct Family {
    pub script: &'static str,
    pub config: &'static str,
    pub targets: fn() -> Vec<TargetModule>,
    /// How far one LoRA step's adapter may part from PEFT's, per element. AdamW's first step
    /// moves each weight by about `lr·g/(|g| + eps)`, so an element with a small gradient carries
    /// the two sides' f32 rounding of `g` as a visible share of `lr`.
    pub step_tolerance: f32,
}

const IDS: [[u32; 6]; 2] = [[1, 5, 9, 13, 2, 7], [3, 3, 4, 90, 11, 0]];
/// transformers' convention: aligned with the inputs, shifted inside the loss.
const HF_LABELS: [[i64; 6]; 2] = [[-100, 5, 9, 13, 2, 7], [3, 3, 4, 90, -100, -100]];
/// Tokens each row of `IDS` continues by in the generation check.
const GENERATED: usize = 12;
const LR: f64 = 0.01;
const WEIGHT_DECAY: f64 = 0.01;
const MAX_GRAD_NORM: f64 = 0.25;

pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("tests/ is inside the repo").to_path_buf()
}

pub fn run_python(python: &Path, script: &str, jobs: &[Vec<String>], work: &Path) {
    static CALLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let file = work.join(format!("jobs-{n}.json"));
    std::fs::write(&file, serde_json::to_string(jobs).unwrap()).unwrap();
    let script = repo_root().join("tests/python").join(script);
    let out = Command::new(python).arg(script).arg("multi").arg(&file).output().expect("run python");
    assert!(out.status.success(), "python failed:\n{}", String::from_utf8_lossy(&out.stderr));
}

pub fn args(parts: &[&str]) -> Vec<String> {
    parts.iter().map(|s| s.to_string()).collect()
}

pub fn read_json(path: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))).unwrap()
}

pub fn batch() -> PackedBatch {
    let (b, t) = (IDS.len(), IDS[0].len());
    let labels = HF_LABELS.iter().flat_map(|row| (1..=t).map(move |i| if i < t { row[i] } else { IGNORE })).collect();
    PackedBatch {
        batch: b,
        seq_len: t,
        input_ids: IDS.iter().flatten().copied().collect(),
        position_ids: (0..b).flat_map(|_| 0..t as u32).collect(),
        segment_ids: vec![1; b * t],
        labels,
    }
}

fn lora_recipe(family: &Family) -> Lora {
    Lora { r: 4, alpha: 8, dropout: 0.0, target_modules: (family.targets)(), rslora: false }
}

/// Everything both sides produced, made once for all of a family's tests.
pub struct Fixture {
    work: tempfile::TempDir,
    pub config: LmConfig,
    pub params: BTreeMap<String, Tensor>,
    pub adapters: Adapters,
    step_tolerance: f32,
    script: &'static str,
}

impl Fixture {
    pub fn path(&self, rel: &str) -> PathBuf {
        self.work.path().join(rel)
    }
}

/// Both sides' models, adapters, logits and steps; `None` without the torch venv.
pub fn build_fixture(family: &Family) -> Option<Fixture> {
    let python = crate::torch_python()?;
    let work = tempfile::tempdir().unwrap();
    let p = |rel: &str| work.path().join(rel).to_string_lossy().into_owned();
    std::fs::write(p("config.json"), family.config).unwrap();
    std::fs::write(p("ids.json"), serde_json::to_string(&IDS).unwrap()).unwrap();
    std::fs::write(p("batch.json"), serde_json::json!({"input_ids": IDS, "labels": HF_LABELS}).to_string()).unwrap();
    // A small shard limit makes transformers write an index and several shards.
    run_python(
        &python,
        family.script,
        &[
            args(&[
                "make-model",
                "--config",
                &p("config.json"),
                "--seed",
                "7",
                "--out",
                &p("hf"),
                "--max-shard-size",
                "20KB",
            ]),
            args(&["logits", "--model", &p("hf"), "--ids", &p("ids.json"), "--out", &p("logits-hf.json")]),
        ],
        work.path(),
    );

    // Through the import path: a MoE's per-expert tensors (as transformers saves them) are stacked.
    let (model, _) =
        load_hf_model(&work.path().join("hf"), DType::F32, &Device::Cpu).expect("transformers' save loads");
    let (config, params) = (model.config().clone(), model.params().clone());

    // Our adapter, with B non-zero so that it changes the logits.
    let lora = LoraConfig::from(&lora_recipe(family));
    let init = Adapters::init(&config, &lora, 11, DType::F32, &Device::Cpu).unwrap();
    let tensors = init
        .tensors
        .iter()
        .enumerate()
        .map(|(i, (name, t))| {
            let n = t.elem_count();
            let v: Vec<f32> = (0..n).map(|j| ((i * 31 + j) as f32 * 0.7).sin() * 0.05).collect();
            (name.clone(), Tensor::from_vec(v, t.dims(), &Device::Cpu).unwrap())
        })
        .collect();
    let adapters = Adapters::new(&config, lora, tensors).unwrap();
    let mut dir = StagedDir::create(&work.path().join("adapter")).unwrap();
    let adapter_config = AdapterConfig::from_recipe(&lora_recipe(family), Some(p("hf")));
    save_peft_adapter(&mut dir, &adapter_config, &adapters.tensors).unwrap();
    dir.commit().unwrap();

    // Our full model, saved sharded, with the engine's config.json (and, for an architecture
    // transformers loads from the code beside the weights, that code, as `export` carries it).
    let mut dir = StagedDir::create(&work.path().join("ours")).unwrap();
    let config_json: Value = serde_json::from_str(&config.to_hf_json("float32")).unwrap();
    // Experts one tensor per expert, as a run's `final/` and `export` write them.
    let hub_layout = moe::split_experts(&config, &params).unwrap();
    save_hf_model(&mut dir, &config_json, &hub_layout, DType::F32, 16_000).unwrap();
    for code in std::fs::read_dir(work.path().join("hf")).unwrap().flatten() {
        let name = code.file_name().to_string_lossy().into_owned();
        if name.ends_with(".py") {
            dir.write_file(&name, &std::fs::read(code.path()).unwrap()).unwrap();
        }
    }
    dir.commit().unwrap();

    run_python(
        &python,
        family.script,
        &[
            args(&[
                "logits",
                "--model",
                &p("hf"),
                "--ids",
                &p("ids.json"),
                "--adapter",
                &p("adapter"),
                "--out",
                &p("logits-peft.json"),
            ]),
            args(&[
                "logits",
                "--model",
                &p("hf"),
                "--ids",
                &p("ids.json"),
                "--adapter",
                &p("adapter"),
                "--merge",
                "--out",
                &p("logits-peft-merged.json"),
            ]),
            args(&["logits", "--model", &p("ours"), "--ids", &p("ids.json"), "--out", &p("logits-ours-in-hf.json")]),
            args(&[
                "lora-step",
                "--model",
                &p("hf"),
                "--adapter",
                &p("adapter"),
                "--batch",
                &p("batch.json"),
                "--lr",
                &LR.to_string(),
                "--betas",
                "0.9,0.95",
                "--eps",
                "1e-8",
                "--weight-decay",
                &WEIGHT_DECAY.to_string(),
                "--max-grad-norm",
                &MAX_GRAD_NORM.to_string(),
                "--out",
                &p("adapter-stepped"),
            ]),
        ],
        work.path(),
    );
    Some(Fixture { work, config, params, adapters, step_tolerance: family.step_tolerance, script: family.script })
}

pub fn logits_json(path: &Path) -> Vec<f32> {
    let v: Vec<Vec<Vec<f32>>> = serde_json::from_value(read_json(path)).unwrap();
    v.into_iter().flatten().flatten().collect()
}

pub fn flat(t: &Tensor) -> Vec<f32> {
    t.to_dtype(DType::F32).unwrap().flatten_all().unwrap().to_vec1().unwrap()
}

pub fn assert_close(what: &str, got: &[f32], want: &[f32], tol: f32) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    let worst = got.iter().zip(want).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
    assert!(worst <= tol, "{what}: max |diff| {worst} > {tol}");
}

pub fn transformers_weights_load_by_name_shape_and_value(f: &Fixture) {
    let reference = read_json(&f.path("hf/reference.json"));
    let reference = reference.as_object().unwrap();
    assert_eq!(
        f.params.keys().collect::<Vec<_>>(),
        reference.keys().collect::<Vec<_>>(),
        "the HF names we expect are the names transformers saved"
    );
    assert!(WeightFiles::open(&f.path("hf")).unwrap().files().len() > 1, "fixture should be sharded");
    for (name, t) in &f.params {
        let r = &reference[name];
        assert_eq!(r["dtype"], "float32", "{name}");
        let shape: Vec<usize> = serde_json::from_value(r["shape"].clone()).unwrap();
        assert_eq!(t.dims(), shape.as_slice(), "{name}");
        let values: Vec<f32> = serde_json::from_value(r["values"].clone()).unwrap();
        assert_eq!(flat(t), values, "{name}");
    }
}

pub fn logits_match_transformers(f: &Fixture) {
    let model = CausalLm::new(f.config.clone(), f.params.clone(), &Device::Cpu).unwrap();
    let ours = flat(&model.logits(&batch(), None).unwrap());
    assert_close("logits vs transformers", &ours, &logits_json(&f.path("logits-hf.json")), 1e-4);
}

/// Our greedy generation (prefill, then one cached step a token) continues each row of `IDS` as
/// transformers' `generate` with its own cache does.
pub fn greedy_generation_matches_transformers(f: &Fixture) {
    let python = crate::torch_python().expect("the fixture was built with the torch venv");
    let (ids, out) = (f.path("ids.json"), f.path("generated-hf.json"));
    let n = GENERATED.to_string();
    let (model_dir, ids_s, out_s) = (f.path("hf"), ids.to_string_lossy(), out.to_string_lossy());
    let job =
        ["generate", "--model", &model_dir.to_string_lossy(), "--ids", &ids_s, "--max-new-tokens", &n, "--out", &out_s];
    run_python(&python, f.script, &[args(&job)], f.work.path());
    let model = CausalLm::new(f.config.clone(), f.params.clone(), &Device::Cpu).unwrap();
    let theirs: Vec<Vec<u32>> = serde_json::from_value(read_json(&out)).unwrap();
    for (row, want) in IDS.iter().zip(theirs) {
        let mut ours = Vec::new();
        let limits = Limits { max_tokens: GENERATED, vocab: f.config.vocab_size, stop_ids: &[] };
        generate(&model, None, row, limits, &Sampling::greedy(), |t| {
            ours.push(t);
            std::ops::ControlFlow::Continue(())
        })
        .unwrap();
        assert_eq!(ours, want, "greedy continuation of {row:?}");
    }
}

pub fn our_saved_model_loads_in_transformers(f: &Fixture) {
    assert!(f.path("ours/model.safetensors.index.json").exists());
    let theirs = logits_json(&f.path("logits-hf.json"));
    assert_close("transformers on our save", &logits_json(&f.path("logits-ours-in-hf.json")), &theirs, 1e-6);
}

pub fn our_adapter_gives_peft_the_same_logits(f: &Fixture) {
    let model = CausalLm::new(f.config.clone(), f.params.clone(), &Device::Cpu).unwrap();
    let peft = logits_json(&f.path("logits-peft.json"));
    let base = logits_json(&f.path("logits-hf.json"));
    assert!(peft.iter().zip(&base).any(|(a, b)| (a - b).abs() > 1e-3), "the adapter must change the logits");
    let ours = flat(&model.logits(&batch(), Some(&f.adapters)).unwrap());
    assert_close("adapter logits vs PEFT", &ours, &peft, 1e-4);
    let merged_params = merge_lora(&f.params, &f.config, &f.adapters).unwrap();
    let merged = CausalLm::new(f.config.clone(), merged_params, &Device::Cpu).unwrap();
    let ours_merged = flat(&merged.logits(&batch(), None).unwrap());
    assert_close("merged logits vs PEFT", &ours_merged, &peft, 1e-4);
    assert_close("merged logits vs PEFT merged", &ours_merged, &logits_json(&f.path("logits-peft-merged.json")), 1e-4);
}

pub fn one_lora_step_matches_peft_and_torch_adamw(f: &Fixture) {
    let model = CausalLm::new(f.config.clone(), f.params.clone(), &Device::Cpu).unwrap();
    let b = batch();
    let tokens = b.target_tokens();
    let opts = StepOptions { loss_scale: 1.0 / tokens as f64, ..StepOptions::default() };
    let out = model.forward_backward(&b, Trainable::Adapters, Some(&f.adapters), &opts).unwrap();
    let mut grads = out.grads;
    let norm = clip_grad_norm(&mut grads, MAX_GRAD_NORM).unwrap();
    let mut tensors = f.adapters.tensors.clone();
    let mut opt = AdamW::new(AdamWConfig { betas: [0.9, 0.95], eps: 1e-8, weight_decay: WEIGHT_DECAY });
    opt.step(&mut tensors, &grads, LR).unwrap();

    let step = read_json(&f.path("adapter-stepped/step.json"));
    let loss = out.loss_sum / tokens as f64;
    assert!((loss - step["loss"].as_f64().unwrap()).abs() < 1e-5, "loss {loss} vs {}", step["loss"]);
    assert!((norm - step["grad_norm"].as_f64().unwrap()).abs() < 1e-5, "grad norm {norm} vs {}", step["grad_norm"]);
    assert!(norm > MAX_GRAD_NORM, "fixture should exercise clipping (norm {norm})");

    let (_, peft) = load_peft_adapter(&f.path("adapter-stepped"), &Device::Cpu).unwrap();
    assert_eq!(peft.keys().collect::<Vec<_>>(), tensors.keys().collect::<Vec<_>>());
    for (name, t) in &tensors {
        assert_close(name, &flat(t), &flat(&peft[name]), f.step_tolerance);
    }
}
