//! Interop with the Python ecosystem: a tiny random Qwen3 made and saved by transformers loads
//! in our trainer with the same logits; a model and an adapter we save load in transformers/PEFT
//! with the same logits; one LoRA step of ours equals one PEFT + torch AdamW step.
//!
//! Needs the CPU torch venv of `scripts/setup-torch`. Without it the tests skip, unless
//! MINDXTRAIN_REQUIRE_TORCH is set (CI sets it): then they install it, and fail if they cannot.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use candle_core::{DType, Device, Tensor};
use mindxtrain_trainer::batch::{IGNORE, PackedBatch};
use mindxtrain_trainer::checkpoint::{
    AdapterConfig, StagedDir, WeightFiles, load_peft_adapter, save_hf_model, save_peft_adapter,
};
use mindxtrain_trainer::model::{
    Adapters, LoraConfig, Qwen3, Qwen3Config, StepOptions, Trainable, expected_shapes, merge_lora,
};
use mindxtrain_trainer::optim::{AdamW, AdamWConfig, clip_grad_norm};
use mindxtrain_trainer::recipe::{Lora, TargetModule};
use serde_json::Value;

const CONFIG: &str = r#"{"vocab_size": 96, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
  "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8, "max_position_embeddings": 64,
  "rope_theta": 10000.0, "rms_norm_eps": 1e-6, "tie_word_embeddings": false, "attention_bias": false}"#;
const IDS: [[u32; 6]; 2] = [[1, 5, 9, 13, 2, 7], [3, 3, 4, 90, 11, 0]];
/// transformers' convention: aligned with the inputs, shifted inside the loss.
const HF_LABELS: [[i64; 6]; 2] = [[-100, 5, 9, 13, 2, 7], [3, 3, 4, 90, -100, -100]];
const LR: f64 = 0.01;
const WEIGHT_DECAY: f64 = 0.01;
const MAX_GRAD_NORM: f64 = 0.25;

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("tests/ is inside the repo").to_path_buf()
}

fn run_python(python: &Path, jobs: &[Vec<String>], work: &Path) {
    static CALLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let file = work.join(format!("jobs-{n}.json"));
    std::fs::write(&file, serde_json::to_string(jobs).unwrap()).unwrap();
    let script = repo_root().join("tests/python/qwen3_tiny.py");
    let out = Command::new(python).arg(script).arg("multi").arg(&file).output().expect("run python");
    assert!(out.status.success(), "python failed:\n{}", String::from_utf8_lossy(&out.stderr));
}

fn args(parts: &[&str]) -> Vec<String> {
    parts.iter().map(|s| s.to_string()).collect()
}

fn read_json(path: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))).unwrap()
}

fn batch() -> PackedBatch {
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

fn lora_recipe() -> Lora {
    Lora { r: 4, alpha: 8, dropout: 0.0, target_modules: TargetModule::all(), rslora: false }
}

/// Everything both sides produced, made once for all tests.
struct Fixture {
    work: tempfile::TempDir,
    config: Qwen3Config,
    params: BTreeMap<String, Tensor>,
    adapters: Adapters,
}

impl Fixture {
    fn path(&self, rel: &str) -> PathBuf {
        self.work.path().join(rel)
    }
}

fn fixture() -> Option<&'static Fixture> {
    static FIXTURE: OnceLock<Option<Fixture>> = OnceLock::new();
    FIXTURE.get_or_init(build_fixture).as_ref()
}

fn build_fixture() -> Option<Fixture> {
    let python = mindxtrain_tests::torch_python()?;
    let work = tempfile::tempdir().unwrap();
    let p = |rel: &str| work.path().join(rel).to_string_lossy().into_owned();
    std::fs::write(p("config.json"), CONFIG).unwrap();
    std::fs::write(p("ids.json"), serde_json::to_string(&IDS).unwrap()).unwrap();
    std::fs::write(p("batch.json"), serde_json::json!({"input_ids": IDS, "labels": HF_LABELS}).to_string()).unwrap();
    // A small shard limit makes transformers write an index and several shards.
    run_python(
        &python,
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

    let text = std::fs::read_to_string(work.path().join("hf/config.json")).unwrap();
    let config = Qwen3Config::from_hf_json(&text).expect("transformers' config.json parses");
    let files = WeightFiles::open(&work.path().join("hf")).expect("transformers' weights open");
    let params = files.load_expected(&expected_shapes(&config), DType::F32, &Device::Cpu).expect("weights load");

    // Our adapter, with B non-zero so that it changes the logits.
    let lora = LoraConfig::from(&lora_recipe());
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
    let adapter_config = AdapterConfig::from_recipe(&lora_recipe(), Some(p("hf")));
    save_peft_adapter(&mut dir, &adapter_config, &adapters.tensors).unwrap();
    dir.commit().unwrap();

    // Our full model, saved sharded, with the engine's config.json.
    let mut dir = StagedDir::create(&work.path().join("ours")).unwrap();
    let config_json: Value = serde_json::from_str(&config.to_hf_json("float32")).unwrap();
    save_hf_model(&mut dir, &config_json, &params, DType::F32, 16_000).unwrap();
    dir.commit().unwrap();

    run_python(
        &python,
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
    Some(Fixture { work, config, params, adapters })
}

fn logits_json(path: &Path) -> Vec<f32> {
    let v: Vec<Vec<Vec<f32>>> = serde_json::from_value(read_json(path)).unwrap();
    v.into_iter().flatten().flatten().collect()
}

fn flat(t: &Tensor) -> Vec<f32> {
    t.to_dtype(DType::F32).unwrap().flatten_all().unwrap().to_vec1().unwrap()
}

fn assert_close(what: &str, got: &[f32], want: &[f32], tol: f32) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    let worst = got.iter().zip(want).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
    assert!(worst <= tol, "{what}: max |diff| {worst} > {tol}");
}

#[test]
fn transformers_weights_load_by_name_shape_and_value() {
    let Some(f) = fixture() else { return };
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

#[test]
fn logits_match_transformers() {
    let Some(f) = fixture() else { return };
    let model = Qwen3::new(f.config.clone(), f.params.clone(), &Device::Cpu).unwrap();
    let ours = flat(&model.logits(&batch(), None).unwrap());
    assert_close("logits vs transformers", &ours, &logits_json(&f.path("logits-hf.json")), 1e-4);
}

#[test]
fn our_saved_model_loads_in_transformers() {
    let Some(f) = fixture() else { return };
    assert!(f.path("ours/model.safetensors.index.json").exists());
    let theirs = logits_json(&f.path("logits-hf.json"));
    assert_close("transformers on our save", &logits_json(&f.path("logits-ours-in-hf.json")), &theirs, 1e-6);
}

#[test]
fn our_adapter_gives_peft_the_same_logits() {
    let Some(f) = fixture() else { return };
    let model = Qwen3::new(f.config.clone(), f.params.clone(), &Device::Cpu).unwrap();
    let peft = logits_json(&f.path("logits-peft.json"));
    let base = logits_json(&f.path("logits-hf.json"));
    assert!(peft.iter().zip(&base).any(|(a, b)| (a - b).abs() > 1e-3), "the adapter must change the logits");
    let ours = flat(&model.logits(&batch(), Some(&f.adapters)).unwrap());
    assert_close("adapter logits vs PEFT", &ours, &peft, 1e-4);
    let merged_params = merge_lora(&f.params, &f.config, &f.adapters).unwrap();
    let merged = Qwen3::new(f.config.clone(), merged_params, &Device::Cpu).unwrap();
    let ours_merged = flat(&merged.logits(&batch(), None).unwrap());
    assert_close("merged logits vs PEFT", &ours_merged, &peft, 1e-4);
    assert_close("merged logits vs PEFT merged", &ours_merged, &logits_json(&f.path("logits-peft-merged.json")), 1e-4);
}

#[test]
fn one_lora_step_matches_peft_and_torch_adamw() {
    let Some(f) = fixture() else { return };
    let model = Qwen3::new(f.config.clone(), f.params.clone(), &Device::Cpu).unwrap();
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
        assert_close(name, &flat(t), &flat(&peft[name]), 1e-5);
    }
}

/// A run as the ecosystem loads it: `train` writes the tokenizer and chat template beside an
/// adapter whose `adapter_config.json` names the base it was trained on, and `export --merge`
/// writes a standalone HF directory. In transformers, the chat template gives our prompt ids,
/// the adapter over its recorded base (AutoPeftModelForCausalLM) and the merged model
/// (AutoModelForCausalLM) give our logits.
#[test]
fn a_trained_adapter_and_its_merged_export_load_in_peft_and_transformers_with_our_logits() {
    use mindxtrain_tests::micro::{self, Node, ok_json, s};
    use mindxtrain_trainer::data::template::encode_pieces;
    use mindxtrain_trainer::data::{ChatTemplate, Message, Role, Tokenizer};
    use mindxtrain_trainer::recipe::Recipe as RecipeFile;

    let Some(python) = mindxtrain_tests::torch_python() else { return };
    let node = Node::new();
    let base_recipe = node.recipe("base", &micro::recipe("base", 5, micro::FULL, 20, ""));
    let base = node.path("base");
    ok_json(&node.run(&["train", s(&base_recipe), "--out", s(&base), "--eval-prompts", "1"]));
    let lora_recipe = node.recipe("lora", &micro::recipe("lora", 5, micro::LORA, 20, ""));
    let lora = node.path("lora");
    let base_final = base.join("final");
    ok_json(&node.run(&[
        "train",
        s(&lora_recipe),
        "--out",
        s(&lora),
        "--init-from",
        s(&base_final),
        "--eval-prompts",
        "1",
    ]));
    let merged = node.path("hf");
    ok_json(&node.run(&[
        "export",
        s(&lora_recipe),
        "--checkpoint",
        s(&lora.join("final")),
        "--merge",
        "--out",
        s(&merged),
    ]));

    let question = "What is 17 + 25?";
    let messages = node.path("messages.json");
    std::fs::write(&messages, serde_json::json!([{"role": "user", "content": question}]).to_string()).unwrap();
    let answer = node.path("transformers.json");
    let script = repo_root().join("tests/python/qwen3_tiny.py");
    let o = Command::new(&python)
        .arg(script)
        .arg("run-output")
        .args(["--adapter", s(&lora.join("final")), "--merged", s(&merged), "--messages", s(&messages)])
        .args(["--out", s(&answer)])
        .output()
        .unwrap();
    assert!(o.status.success(), "transformers could not load the run:\n{}", String::from_utf8_lossy(&o.stderr));
    let theirs = read_json(&answer);

    let loaded = RecipeFile::from_path(&lora_recipe).unwrap();
    let recipe = &loaded.recipe;
    let tokenizer = Tokenizer::from_recipe(&recipe.model, &node.dir, None).unwrap();
    let pieces = ChatTemplate::for_tokenizer(&tokenizer).generation_prompt(&[Message::new(Role::User, question)], &[]);
    let ids = encode_pieces(&tokenizer, &pieces).unwrap().ids;
    for side in ["adapter_ids", "merged_ids"] {
        let got: Vec<u32> = serde_json::from_value(theirs[side].clone()).unwrap();
        assert_eq!(
            got, ids,
            "{side}: the chat template beside the weights gives our prompt ({})",
            theirs["adapter_text"]
        );
    }
    let (model, adapters) = mindxtrain_trainer::checkpoint::load_checkpoint(
        recipe,
        Some(&base_final),
        &lora.join("final"),
        &candle_core::Device::Cpu,
    )
    .unwrap();
    let t = ids.len();
    let prompt = PackedBatch {
        batch: 1,
        seq_len: t,
        input_ids: ids,
        position_ids: (0..t as u32).collect(),
        segment_ids: vec![1; t],
        labels: vec![IGNORE; t],
    };
    let ours = flat(&model.logits(&prompt, adapters.as_ref()).unwrap());
    for side in ["adapter_logits", "merged_logits"] {
        let v: Vec<Vec<f32>> = serde_json::from_value(theirs[side].clone()).unwrap();
        assert_close(side, &ours, &v.into_iter().flatten().collect::<Vec<_>>(), 1e-4);
    }
}
