//! A Qwen3.5/3.6-style dense hybrid end to end through the binary on the CPU: the tiny recipe
//! plans and trains from scratch into a `qwen3_5_text` directory under transformers' names (its
//! Gated DeltaNet layers' `linear_attn.*` and the attention layer's doubled `q_proj`); LoRA on
//! every projection PEFT's `all-linear` reaches trains on that base and saves PEFT's names.
//! (Logits, saves, adapters and a LoRA step against transformers and PEFT: interop_qwen3_5.rs.)
//! Generation and serving of hybrids are not built: the recipe check refuses them.

use std::collections::BTreeSet;
use std::path::Path;

use mindxtrain_tests::micro::{self, ok_json, s};
use serde_json::Value;

fn tiny_recipe() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../recipes/tiny_cpu_hybrid.yaml")
}

/// The tensor names of a safetensors file (its JSON header).
fn tensor_names(path: &Path) -> BTreeSet<String> {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let len = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: Value = serde_json::from_slice(&bytes[8..8 + len]).unwrap();
    header.as_object().unwrap().keys().filter(|k| *k != "__metadata__").cloned().collect()
}

#[test]
fn the_tiny_hybrid_recipe_trains_from_scratch_and_tunes_every_projection() {
    let node = micro::Node::new();
    let (plan, out) = (node.path("hybrid.plan.json"), node.path("hybrid-run"));
    ok_json(&node.run(&["bench", s(&tiny_recipe()), "--out", s(&plan)]));
    let run = ok_json(&node.run(&["train", s(&tiny_recipe()), "--plan", s(&plan), "--out", s(&out)]));
    assert_eq!(run["steps"], 40);
    let loss = run["final_loss"].as_f64().unwrap();
    assert!(loss < 4.5, "final loss {loss} after 40 steps (a random start is ln 512 ≈ 6.2)");
    let base = out.join("final");
    let written: Value = serde_json::from_slice(&std::fs::read(base.join("config.json")).unwrap()).unwrap();
    assert_eq!(
        (written["model_type"].as_str(), written["architectures"][0].as_str()),
        (Some("qwen3_5_text"), Some("Qwen3_5ForCausalLM"))
    );
    let kinds = ["linear_attention", "linear_attention", "linear_attention", "full_attention"];
    assert_eq!(written["layer_types"], serde_json::json!(kinds), "{written}");
    let names = tensor_names(&base.join("model.safetensors"));
    for name in [
        "model.layers.0.linear_attn.in_proj_qkv.weight",
        "model.layers.2.linear_attn.A_log",
        "model.layers.3.self_attn.q_proj.weight",
        "model.layers.3.self_attn.q_norm.weight",
    ] {
        assert!(names.contains(name), "{name} missing: {names:?}");
    }

    // LoRA on every projection of both layer kinds, on the trained base.
    let text = std::fs::read_to_string(tiny_recipe()).unwrap();
    let method = "{kind: lora, r: 4, alpha: 8, dropout: 0.0, target_modules: [q_proj, k_proj, v_proj, o_proj, \
                  gate_proj, up_proj, down_proj, in_proj_qkv, in_proj_z, in_proj_b, in_proj_a, out_proj]}";
    let text = text
        .replace("  method:\n    kind: full\n", &format!("  method: {method}\n"))
        .replace("max_steps: 40", "max_steps: 6")
        .replace("run_name: tiny_cpu_hybrid", "run_name: hybrid_lora");
    assert!(text.contains(method), "the tiny recipe's method block moved");
    let recipe = node.recipe("hybrid_lora", &text);
    let tuned = node.path("hybrid_lora");
    let run = ok_json(&node.run(&["train", s(&recipe), "--out", s(&tuned), "--init-from", s(&base)]));
    assert_eq!(run["steps"], 6, "{run}");
    let adapter = tensor_names(&tuned.join("final/adapter_model.safetensors"));
    for name in [
        "base_model.model.model.layers.0.linear_attn.in_proj_qkv.lora_A.weight",
        "base_model.model.model.layers.1.linear_attn.out_proj.lora_B.weight",
        "base_model.model.model.layers.3.self_attn.q_proj.lora_A.weight",
    ] {
        assert!(adapter.contains(name), "{name} missing: {adapter:?}");
    }
}
