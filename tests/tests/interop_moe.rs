//! Qwen3-MoE interop with transformers: a tiny random `Qwen3MoeForCausalLM` saved by
//! transformers (one tensor per expert) loads in our engine with the same logits; trained on the
//! CPU by our engine (full fine-tuning: router and experts move) and saved, it loads back in
//! transformers with our logits.
//!
//! Needs the CPU torch venv of `scripts/setup-torch`; skips without it unless
//! MINDXTRAIN_REQUIRE_TORCH is set.

use std::path::Path;
use std::process::Command;

use candle_core::{DType, Device, Tensor};
use mindxtrain_trainer::batch::{IGNORE, PackedBatch};
use mindxtrain_trainer::checkpoint::{StagedDir, load_hf_model, save_hf_model};
use mindxtrain_trainer::model::{StepOptions, Trainable, moe};
use mindxtrain_trainer::optim::{AdamW, AdamWConfig};
use serde_json::Value;

/// Layer 0 dense (`mlp_only_layers`), layer 1 sparse: 8 experts, 2 per token.
const CONFIG: &str = r#"{"vocab_size": 96, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
  "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8, "max_position_embeddings": 64,
  "rope_theta": 10000.0, "rms_norm_eps": 1e-6, "tie_word_embeddings": false, "attention_bias": false,
  "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 16, "norm_topk_prob": true,
  "decoder_sparse_step": 1, "mlp_only_layers": [0]}"#;
const IDS: [[u32; 6]; 2] = [[1, 5, 9, 13, 2, 7], [3, 3, 4, 90, 11, 0]];

fn run_python(python: &Path, jobs: &[Vec<String>], work: &Path) {
    let file = work.join("jobs.json");
    std::fs::write(&file, serde_json::to_string(jobs).unwrap()).unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("python/qwen3_tiny.py");
    let out = Command::new(python).arg(script).arg("multi").arg(&file).output().expect("run python");
    assert!(out.status.success(), "python failed:\n{}", String::from_utf8_lossy(&out.stderr));
}

/// A temporary directory holding `config.json` (the model's) and `ids.json` (the inputs).
struct Work(tempfile::TempDir);

impl Work {
    fn new(config: &str) -> Work {
        let w = Work(tempfile::tempdir().unwrap());
        std::fs::write(w.p("config.json"), config).unwrap();
        std::fs::write(w.p("ids.json"), serde_json::to_string(&IDS).unwrap()).unwrap();
        w
    }

    fn path(&self) -> &Path {
        self.0.path()
    }

    /// `rel` inside it, as an argument for the Python side.
    fn p(&self, rel: &str) -> String {
        self.path().join(rel).to_string_lossy().into_owned()
    }
}

fn args(parts: &[&str]) -> Vec<String> {
    parts.iter().map(|s| s.to_string()).collect()
}

fn logits_json(path: &Path) -> Vec<f32> {
    let v: Vec<Vec<Vec<f32>>> = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    v.into_iter().flatten().flatten().collect()
}

fn flat(t: &Tensor) -> Vec<f32> {
    t.to_dtype(DType::F32).unwrap().flatten_all().unwrap().to_vec1().unwrap()
}

fn worst(got: &[f32], want: &[f32]) -> f32 {
    assert_eq!(got.len(), want.len());
    got.iter().zip(want).map(|(a, b)| (a - b).abs()).fold(0.0, f32::max)
}

fn batch() -> PackedBatch {
    let (b, t) = (IDS.len(), IDS[0].len());
    let input_ids: Vec<u32> = IDS.iter().flatten().copied().collect();
    let mut labels: Vec<i64> = input_ids.iter().skip(1).map(|&i| i as i64).collect();
    labels.push(IGNORE);
    for r in 0..b {
        labels[r * t + t - 1] = IGNORE;
    }
    PackedBatch {
        batch: b,
        seq_len: t,
        input_ids,
        position_ids: (0..b).flat_map(|_| 0..t as u32).collect(),
        segment_ids: vec![1; b * t],
        labels,
    }
}

#[test]
fn a_transformers_moe_loads_with_its_logits_and_our_trained_one_loads_back_in_transformers() {
    let Some(python) = mindxtrain_tests::torch_python() else { return };
    let work = Work::new(CONFIG);
    let p = |rel: &str| work.p(rel);
    run_python(
        &python,
        &[
            args(&["make-model", "--config", &p("config.json"), "--seed", "7", "--out", &p("hf")]),
            args(&["logits", "--model", &p("hf"), "--ids", &p("ids.json"), "--out", &p("logits-hf.json")]),
        ],
        work.path(),
    );

    // transformers' files: one tensor per expert, stacked by our loader.
    let (mut model, _) = load_hf_model(&work.path().join("hf"), DType::F32, &Device::Cpu).unwrap();
    let moe_shape = model.config().moe.clone().expect("a qwen3_moe config");
    assert_eq!((moe_shape.num_experts, moe_shape.num_experts_per_tok), (8, 2));
    assert_eq!(model.params()[&moe::gate_up_name(1)].dims(), [8, 32, 32]);
    let b = batch();
    let hf = logits_json(&work.path().join("logits-hf.json"));
    let ours = flat(&model.logits(&b, None).unwrap());
    let before = worst(&ours, &hf);
    assert!(before <= 1e-4, "logits vs transformers: max |diff| {before}");

    // Three full fine-tuning steps on the CPU: the router and the experts change.
    let mut opt = AdamW::new(AdamWConfig { betas: [0.9, 0.999], eps: 1e-8, weight_decay: 0.0 });
    let router_before = flat(&model.params()[&moe::router_name(1)]);
    for _ in 0..3 {
        let out = model.forward_backward(&b, Trainable::Full, None, &StepOptions::default()).unwrap();
        opt.step(model.params_mut(), &out.grads, 1e-2).unwrap();
    }
    assert_ne!(flat(&model.params()[&moe::router_name(1)]), router_before, "the router trained");
    let trained = flat(&model.logits(&b, None).unwrap());
    assert!(worst(&trained, &hf) > 1e-2, "training moved the logits");

    let mut dir = StagedDir::create(&work.path().join("ours")).unwrap();
    let config: Value = serde_json::from_str(&model.config().to_hf_json("float32")).unwrap();
    let weights = moe::split_experts(model.config(), model.params()).unwrap();
    save_hf_model(&mut dir, &config, &weights, DType::F32, 1 << 30).unwrap();
    dir.commit().unwrap();
    run_python(
        &python,
        &[args(&["logits", "--model", &p("ours"), "--ids", &p("ids.json"), "--out", &p("logits-ours.json")])],
        work.path(),
    );
    let theirs = logits_json(&work.path().join("logits-ours.json"));
    let after = worst(&theirs, &trained);
    assert!(after <= 1e-4, "transformers on our trained MoE: max |diff| {after}");
    // And it loads back in ours the same.
    let (again, _) = load_hf_model(&work.path().join("ours"), DType::F32, &Device::Cpu).unwrap();
    assert_eq!(flat(&again.logits(&b, None).unwrap()), trained);
}

/// Every layer sparse: PEFT 0.21 maps `gate_proj`/`up_proj`/`down_proj` targets of a Qwen3-MoE
/// model to its experts only (dense layers' MLPs would lose their adapters there).
const ALL_SPARSE: &str = r#"{"vocab_size": 96, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
  "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8, "max_position_embeddings": 64,
  "rope_theta": 10000.0, "rms_norm_eps": 1e-6, "tie_word_embeddings": false, "attention_bias": false,
  "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 16, "norm_topk_prob": true,
  "decoder_sparse_step": 1, "mlp_only_layers": []}"#;

/// LoRA on the experts as PEFT makes it from the seven projection targets (its conversion to
/// `target_parameters`: the fused `gate_up_proj` at rank 2r, `down_proj` at r, beside attention),
/// both ways: PEFT's adapter loads in our engine with PEFT's logits, and ours, saved as a run saves
/// it, loads in PEFT with ours.
#[test]
fn expert_adapters_load_both_ways_with_the_same_logits() {
    use mindxtrain_trainer::checkpoint::{AdapterConfig, load_adapter, save_peft_adapter};
    use mindxtrain_trainer::model::{Adapters, LoraConfig};
    use mindxtrain_trainer::recipe::{Lora, TargetModule};
    let Some(python) = mindxtrain_tests::torch_python() else { return };
    let work = Work::new(ALL_SPARSE);
    let p = |rel: &str| work.p(rel);
    run_python(
        &python,
        &[
            args(&["make-model", "--config", &p("config.json"), "--seed", "3", "--out", &p("hf")]),
            args(&[
                "make-adapter",
                "--model",
                &p("hf"),
                "--seed",
                "4",
                "--r",
                "4",
                "--alpha",
                "8",
                "--out",
                &p("peft"),
            ]),
            args(&[
                "logits",
                "--model",
                &p("hf"),
                "--ids",
                &p("ids.json"),
                "--adapter",
                &p("peft"),
                "--out",
                &p("logits-peft.json"),
            ]),
            args(&["logits", "--model", &p("hf"), "--ids", &p("ids.json"), "--out", &p("logits-base.json")]),
        ],
        work.path(),
    );
    let peft_config: Value =
        serde_json::from_str(&std::fs::read_to_string(work.path().join("peft/adapter_config.json")).unwrap()).unwrap();
    assert_eq!(peft_config["rank_pattern"][r".*\.gate_up_proj"], 8, "PEFT's conversion: {peft_config}");
    let (model, _) = load_hf_model(&work.path().join("hf"), DType::F32, &Device::Cpu).unwrap();
    let b = batch();
    let theirs = load_adapter(&work.path().join("peft"), model.config(), DType::F32, &Device::Cpu).unwrap();
    assert!(theirs.adapts_experts(model.config()), "PEFT's expert adapters were read");
    let (with, base) =
        (logits_json(&work.path().join("logits-peft.json")), logits_json(&work.path().join("logits-base.json")));
    assert!(worst(&with, &base) > 1e-2, "PEFT's adapter changes the logits");
    let gap = worst(&flat(&model.logits(&b, Some(&theirs)).unwrap()), &with);
    assert!(gap <= 1e-4, "PEFT's expert adapter in our engine: max |diff| {gap}");

    // Ours: every B non-zero, saved as a run saves it, read by PEFT.
    let lora = Lora { r: 4, alpha: 8, dropout: 0.0, target_modules: TargetModule::all(), rslora: false };
    let cfg = LoraConfig::from(&lora);
    let mut ours = Adapters::init(model.config(), &cfg, 9, DType::F32, &Device::Cpu).unwrap();
    for (i, (name, t)) in ours.tensors.iter_mut().enumerate() {
        if name.contains("lora_B") {
            let v: Vec<f32> = (0..t.elem_count()).map(|j| ((j * 7 + i * 13) % 17) as f32 * 0.01 - 0.08).collect();
            *t = Tensor::from_vec(v, t.shape(), &Device::Cpu).unwrap();
        }
    }
    let config =
        AdapterConfig::from_recipe(&lora, Some(p("hf"))).with_target_parameters(cfg.target_parameters(model.config()));
    let mut dir = StagedDir::create(&work.path().join("ours")).unwrap();
    save_peft_adapter(&mut dir, &config, &ours.tensors).unwrap();
    dir.commit().unwrap();
    run_python(
        &python,
        &[args(&[
            "logits",
            "--model",
            &p("hf"),
            "--ids",
            &p("ids.json"),
            "--adapter",
            &p("ours"),
            "--out",
            &p("logits-ours.json"),
        ])],
        work.path(),
    );
    let mine = flat(&model.logits(&b, Some(&ours)).unwrap());
    let gap = worst(&logits_json(&work.path().join("logits-ours.json")), &mine);
    assert!(gap <= 1e-4, "PEFT on our expert adapter: max |diff| {gap}");
}
