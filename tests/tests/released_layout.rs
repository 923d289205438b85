//! The released Qwen3.5/3.6 checkpoint layout (`Qwen3_5ForConditionalGeneration`: the text model
//! under `model.language_model.*` beside the vision tower `model.visual.*` and the MTP layer
//! `mtp.*`, sharded with an index) against transformers and PEFT: we load its text model with
//! transformers' text logits; an adapter we save over it loads in PEFT onto that model with our
//! logits; merged into the weights and written back as released, the directory loads in
//! transformers with the merged logits, and every tensor the merge did not change (vision, MTP,
//! the text tensors no adapter targets) is byte for byte the source's, in its dtype.
//!
//! Needs the CPU torch venv of `scripts/setup-torch`; skips without it as the interop tests do.

use std::collections::BTreeMap;
use std::path::Path;

use candle_core::{DType, Device, Tensor};
use mindxtrain_tests::interop::{args, assert_close, batch, flat, logits_json, run_python};
use mindxtrain_trainer::checkpoint::{
    AdapterConfig, ReleasedLayout, StagedDir, WeightFiles, load_hf_model, released_adapter_names, save_peft_adapter,
};
use mindxtrain_trainer::model::{Adapters, LoraConfig, merge_lora, moe};
use mindxtrain_trainer::recipe::{Lora, TargetModule};

const SCRIPT: &str = "qwen3_5_released.py";
/// The dense interop fixture's text shape (three layers: linear, attention, linear).
const TEXT: &str = r#"{"vocab_size": 96, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 3,
  "layer_types": ["linear_attention", "full_attention", "linear_attention"],
  "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8, "max_position_embeddings": 64,
  "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5,
  "mrope_section": [1, 1, 0]}, "rms_norm_eps": 1e-6, "tie_word_embeddings": false,
  "linear_conv_kernel_dim": 4, "linear_key_head_dim": 8, "linear_value_head_dim": 6,
  "linear_num_key_heads": 2, "linear_num_value_heads": 4}"#;

/// Every tensor of a directory's safetensors files as stored: name -> (dtype, shape, bytes).
fn raw_tensors(dir: &Path) -> BTreeMap<String, (String, Vec<u64>, Vec<u8>)> {
    let mut out = BTreeMap::new();
    for file in WeightFiles::open(dir).unwrap().files() {
        let bytes = std::fs::read(&file).unwrap();
        let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
        let header: BTreeMap<String, serde_json::Value> = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
        for (name, e) in header.into_iter().filter(|(k, _)| k != "__metadata__") {
            let [a, b]: [usize; 2] = serde_json::from_value(e["data_offsets"].clone()).unwrap();
            let shape = serde_json::from_value(e["shape"].clone()).unwrap();
            out.insert(name, (e["dtype"].as_str().unwrap().to_string(), shape, bytes[8 + n + a..8 + n + b].to_vec()));
        }
    }
    out
}

#[test]
fn a_released_checkpoint_trains_and_exports_in_its_own_layout() {
    let Some(python) = mindxtrain_tests::torch_python() else { return };
    let work = tempfile::tempdir().unwrap();
    let p = |rel: &str| work.path().join(rel).to_string_lossy().into_owned();
    std::fs::write(p("text.json"), TEXT).unwrap();
    let b = batch();
    let ids: Vec<Vec<u32>> = b.input_ids.chunks(b.seq_len).map(<[u32]>::to_vec).collect();
    std::fs::write(p("ids.json"), serde_json::to_string(&ids).unwrap()).unwrap();
    run_python(
        &python,
        SCRIPT,
        &[
            args(&["make-released", "--config", &p("text.json"), "--seed", "3", "--out", &p("released")]),
            args(&["logits-released", "--model", &p("released"), "--ids", &p("ids.json"), "--out", &p("hf.json")]),
        ],
        work.path(),
    );
    let src = work.path().join("released");
    let source = raw_tensors(&src);
    assert!(WeightFiles::open(&src).unwrap().files().len() > 1, "the fixture is sharded");
    assert!(source.keys().any(|k| k.starts_with("model.visual.")) && source.contains_key("mtp.fc.weight"));

    // Our load: the text model alone, with transformers' text logits.
    let (model, _) = load_hf_model(&src, DType::F32, &Device::Cpu).unwrap();
    assert!(!model.params().keys().any(|k| k.contains("visual") || k.starts_with("mtp.")));
    assert_close(
        "text logits",
        &flat(&model.logits(&b, None).unwrap()),
        &logits_json(&work.path().join("hf.json")),
        1e-4,
    );

    // An adapter on the Gated DeltaNet's projections and the attention's q (B non-zero).
    let targets = vec![TargetModule::InProjQkv, TargetModule::OutProj, TargetModule::QProj];
    let lora = Lora { r: 2, alpha: 4, dropout: 0.0, target_modules: targets, rslora: false };
    let init = Adapters::init(model.config(), &LoraConfig::from(&lora), 5, DType::F32, &Device::Cpu).unwrap();
    let tensors = init
        .tensors
        .iter()
        .enumerate()
        .map(|(i, (n, t))| {
            let v: Vec<f32> = (0..t.elem_count()).map(|j| ((i * 17 + j) as f32 * 0.3).sin() * 0.2).collect();
            (n.clone(), Tensor::from_vec(v, t.dims(), &Device::Cpu).unwrap())
        })
        .collect();
    let adapters = Adapters::new(model.config(), LoraConfig::from(&lora), tensors).unwrap();
    let mut dir = StagedDir::create(&work.path().join("adapter")).unwrap();
    let names = released_adapter_names(&adapters.tensors);
    assert!(names.keys().all(|k| k.starts_with("base_model.model.model.language_model.layers.")));
    save_peft_adapter(&mut dir, &AdapterConfig::from_recipe(&lora, Some(p("released"))), &names).unwrap();
    dir.commit().unwrap();

    // Merged and written back in the released layout, as `export` and a full run's final/ do.
    let merged = merge_lora(model.params(), model.config(), &adapters).unwrap();
    let layout = ReleasedLayout::detect(&src).unwrap().expect("the released layout");
    let mut dir = StagedDir::create(&work.path().join("exported")).unwrap();
    layout.save(&mut dir, &moe::split_experts(model.config(), &merged).unwrap()).unwrap();
    dir.commit().unwrap();
    run_python(
        &python,
        SCRIPT,
        &[
            args(&[
                "logits-released",
                "--model",
                &p("released"),
                "--ids",
                &p("ids.json"),
                "--adapter",
                &p("adapter"),
                "--out",
                &p("peft.json"),
            ]),
            args(&[
                "logits-released",
                "--model",
                &p("exported"),
                "--ids",
                &p("ids.json"),
                "--out",
                &p("exported.json"),
            ]),
        ],
        work.path(),
    );
    let ours = flat(&model.logits(&b, Some(&adapters)).unwrap());
    let peft = logits_json(&work.path().join("peft.json"));
    assert!(ours.iter().zip(logits_json(&work.path().join("hf.json"))).any(|(a, b)| (a - b).abs() > 1e-3));
    assert_close("our adapter in PEFT over the released model", &peft, &ours, 1e-4);
    assert_close("the exported merge in transformers", &logits_json(&work.path().join("exported.json")), &ours, 1e-4);

    let exported = raw_tensors(&work.path().join("exported"));
    assert_eq!(exported.keys().collect::<Vec<_>>(), source.keys().collect::<Vec<_>>());
    let adapted = ["in_proj_qkv.weight", "out_proj.weight", "q_proj.weight"];
    for (name, (dtype, shape, bytes)) in &source {
        let (d, s, out) = &exported[name];
        assert_eq!((dtype, shape), (d, s), "{name}");
        let trained = name.starts_with("model.language_model.") && adapted.iter().any(|a| name.ends_with(a));
        assert_eq!(out != bytes, trained, "{name}: changed by the merge is {trained}");
    }
    assert_eq!(exported["mtp.fc.weight"].0, "BF16", "the MTP tensors keep their bf16");
    for file in ["config.json", "model.safetensors.index.json"] {
        assert_eq!(
            std::fs::read(src.join(file)).unwrap(),
            std::fs::read(work.path().join("exported").join(file)).unwrap()
        );
    }
}
