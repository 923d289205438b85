//! FP8 quantization end to end (issue 50): a tiny run whose recipe sets `quantize.enabled` leaves
//! `quantized/` sealed with it (manifest subjects, receipt, `model.quantized`), transformers with
//! compressed-tensors loads that directory and computes our logits from our dequantized weights,
//! and `mindxtrain quantize` does the same for a model directory on its own.
//!
//! The transformers half needs the CPU torch venv of `scripts/setup-torch` (with compressed-tensors);
//! without it that half skips, unless MINDXTRAIN_REQUIRE_TORCH is set, as the interop tests do.

use std::path::Path;
use std::process::Command;

use candle_core::{DType, Device};
use mindxtrain_tests::interop::{assert_close, flat, read_json, repo_root};
use mindxtrain_tests::micro::{self, Node, ok_json, s};
use mindxtrain_trainer::batch::PackedBatch;
use mindxtrain_trainer::checkpoint::{load_hf_model, read_safetensors};
use mindxtrain_trainer::quantize::Fp8Weight;
use serde_json::Value;

fn quantizing_recipe(node: &Node) -> std::path::PathBuf {
    let text = micro::recipe("fp8", 5, micro::FULL, 10, "") + "quantize:\n  enabled: true\n  scheme: fp8\n";
    node.recipe("fp8", &text)
}

/// Our logits for `ids` from the model in `final_dir` with every FP8 weight of `quantized`
/// replaced by its dequantized value.
fn our_dequantized_logits(final_dir: &Path, quantized: &Path, ids: &[u32]) -> Vec<f32> {
    let (mut model, _) = load_hf_model(final_dir, DType::F32, &Device::Cpu).unwrap();
    let stored = read_safetensors(&quantized.join("model.safetensors"), None, &Device::Cpu).unwrap();
    let mut replaced = 0;
    for (name, codes) in &stored {
        if codes.dtype() == DType::F8E4M3 {
            let scale = stored[&format!("{name}_scale")].clone();
            let w = Fp8Weight { codes: codes.clone(), scale }.dequantize(DType::F32).unwrap();
            assert!(model.params_mut().insert(name.clone(), w).is_some(), "{name} is a weight of the model");
            replaced += 1;
        }
    }
    assert_eq!(replaced, 7, "q, k, v, o, gate, up and down of the one layer");
    let prompt = PackedBatch::single_row(ids);
    flat(&model.logits(&prompt, None).unwrap())
}

#[test]
fn a_tiny_run_with_quantize_writes_a_sealed_fp8_directory_that_transformers_loads() {
    let node = Node::new();
    let recipe = quantizing_recipe(&node);
    let out = node.path("run");
    let trained = ok_json(&node.run(&["train", s(&recipe), "--out", s(&out)]));
    let quantized = out.join("quantized");
    assert_eq!(trained["outputs"]["quantized"], s(&quantized));

    // The event: scheme, strategy and every file's digest, as written.
    let events = node.events("model.quantized");
    assert_eq!(events.len(), 1, "{events:?}");
    let data = &events[0]["data"];
    assert_eq!(events[0]["subject"], trained["run_id"]);
    assert_eq!((data["scheme"].as_str(), data["weights"].as_str()), (Some("fp8"), Some("channel")));
    let files = data["files"].as_array().unwrap();
    for f in files {
        let path = quantized.join(f["path"].as_str().unwrap());
        assert_eq!(f["blake3"].as_str().unwrap(), micro::b3(&path), "{}", path.display());
    }
    assert!(files.iter().any(|f| f["path"] == "model.safetensors") && files.iter().any(|f| f["path"] == "config.json"));

    // Sealed like final/: subjects of the run's manifest, checked by its receipt.
    let manifest = ok_json(&node.run(&["manifest", "show", trained["manifest"]["file"].as_str().unwrap()]));
    let subjects: Vec<&str> =
        manifest["statement"]["subject"].as_array().unwrap().iter().filter_map(|s| s["name"].as_str()).collect();
    assert!(subjects.iter().any(|n| n.ends_with("quantized/model.safetensors")), "{subjects:?}");
    let receipt = trained["outputs"]["receipt"].as_str().unwrap();
    let plan = trained["plan"]["file"].as_str().unwrap();
    let verify = |files: &Path| {
        node.run(&["receipt", "verify", receipt, "--files", s(files), "--config", s(&recipe), "--plan", plan])
    };
    assert!(verify(&out).status.success(), "{}", String::from_utf8_lossy(&verify(&out).stdout));
    let tampered = node.path("tampered");
    copy_dir(&out, &tampered);
    let weights = tampered.join("quantized/model.safetensors");
    let mut bytes = std::fs::read(&weights).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 1;
    std::fs::write(&weights, bytes).unwrap();
    assert!(!verify(&tampered).status.success(), "the receipt covers quantized/");

    // transformers + compressed-tensors load it and compute our dequantized model's logits.
    let Some(python) = mindxtrain_tests::torch_python() else { return };
    let ids: Vec<u32> = "What is 17 + 25?".bytes().map(u32::from).collect();
    let ids_file = node.path("ids.json");
    std::fs::write(&ids_file, serde_json::to_string(&ids).unwrap()).unwrap();
    let answer = node.path("transformers.json");
    let o = Command::new(&python)
        .arg(repo_root().join("tests/python/fp8_check.py"))
        .args([s(&quantized), s(&out.join("final")), s(&ids_file), s(&answer)])
        .output()
        .unwrap();
    assert!(o.status.success(), "transformers could not load quantized/:\n{}", String::from_utf8_lossy(&o.stderr));
    let theirs = read_json(&answer);
    let modules = theirs["modules"].as_object().unwrap();
    assert_eq!(modules.len(), 7, "{modules:?}");
    for (name, m) in modules {
        assert_eq!(m["codes_equal_torch_cast"], true, "{name}: our codes are not torch's E4M3 cast");
        assert_eq!(m["decompressed_max_diff"].as_f64(), Some(0.0), "{name}: decompressed differently");
    }
    let ours = our_dequantized_logits(&out.join("final"), &quantized, &ids);
    let logits = |key: &str| -> Vec<f32> {
        serde_json::from_value::<Vec<Vec<f32>>>(theirs[key].clone()).unwrap().into_iter().flatten().collect()
    };
    assert_close("logits", &ours, &logits("logits"), 1e-4);
    let dynamic = logits("logits_dynamic");
    let off = ours.iter().zip(&dynamic).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
    eprintln!("with compressed-tensors' dynamic FP8 activations on: max |logit difference| {off:.4}");
}

#[test]
fn quantize_command_writes_a_model_directory_per_tensor_and_records_it() {
    let node = Node::new();
    let recipe = quantizing_recipe(&node);
    let out = node.path("run");
    ok_json(&node.run(&["train", s(&recipe), "--out", s(&out)]));
    // The run's own quantized/ is there: a second one is refused, not overwritten.
    let again = node.run(&["quantize", s(&out)]);
    assert_eq!(again.status.code(), Some(4), "{}", String::from_utf8_lossy(&again.stdout));
    let target = node.path("per-tensor");
    let done = ok_json(&node.run(&["quantize", s(&out.join("final")), "--out", s(&target), "--per-tensor"]));
    assert_eq!(done["event"]["weights"], "tensor");
    let config = read_json(&target.join("config.json"));
    let q = &config["quantization_config"];
    assert_eq!(
        (q["quant_method"].as_str(), q["format"].as_str()),
        (Some("compressed-tensors"), Some("float-quantized"))
    );
    assert_eq!(q["config_groups"]["group_0"]["weights"]["strategy"], "tensor");
    let stored = read_safetensors(&target.join("model.safetensors"), None, &Device::Cpu).unwrap();
    assert_eq!(stored["model.layers.0.self_attn.q_proj.weight_scale"].dims(), &[1]);
    let recorded = node.events("model.quantized");
    let last: &Value = recorded.last().unwrap();
    assert_eq!(last["seq"], done["seq"]);
    assert_eq!(last["data"]["files"], done["event"]["files"]);
    // A quantized directory is not quantized twice.
    let twice = node.run(&["quantize", s(&target), "--out", s(&node.path("twice"))]);
    assert_eq!(twice.status.code(), Some(4));
    assert!(String::from_utf8_lossy(&twice.stdout).contains("quantized already"));
}

/// A LoRA run's final/ is an adapter: the step merges it into its base (as `export --merge`
/// does) and quantizes that, so the FP8 weights are the merged ones within E4M3's rounding.
#[test]
fn a_lora_run_quantizes_its_adapter_merged_into_the_base() {
    let node = Node::new();
    let text = micro::recipe("lora-fp8", 5, micro::LORA, 10, "  random_init: true\n")
        + "quantize:\n  enabled: true\n  per_channel: true\n";
    let recipe = node.recipe("lora-fp8", &text);
    let out = node.path("run");
    ok_json(&node.run(&["train", s(&recipe), "--out", s(&out)]));
    assert!(out.join("final/adapter_config.json").is_file(), "final/ holds the adapter");
    assert!(!out.join(".quantize-merged.tmp").exists(), "the merged copy is not left behind");
    let merged = node.path("merged");
    ok_json(&node.run(&["export", s(&recipe), "--checkpoint", s(&out.join("final")), "--merge", "--out", s(&merged)]));
    let want = read_safetensors(&merged.join("model.safetensors"), Some(DType::F32), &Device::Cpu).unwrap();
    let stored = read_safetensors(&out.join("quantized/model.safetensors"), None, &Device::Cpu).unwrap();
    let mut fp8 = 0;
    for (name, t) in &stored {
        if name.ends_with("_scale") {
            continue;
        }
        let w = &want[name];
        if t.dtype() != DType::F8E4M3 {
            assert_eq!(flat(t), flat(w), "{name} is kept as merged");
            continue;
        }
        fp8 += 1;
        let scale = stored[&format!("{name}_scale")].clone();
        let back = flat(&Fp8Weight { codes: t.clone(), scale }.dequantize(DType::F32).unwrap());
        let w = flat(w);
        let top = w.iter().fold(0f32, |m, x| m.max(x.abs()));
        let err = w.iter().zip(&back).fold(0f32, |m, (a, b)| m.max((a - b).abs()));
        assert!(err <= top / 16.0, "{name}: off by {err} (largest weight {top})");
    }
    assert_eq!(fp8, 7);
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            copy_dir(&p, &to.join(e.file_name()));
        } else {
            std::fs::copy(&p, to.join(e.file_name())).unwrap();
        }
    }
}
