//! Instella through the shared decoder: its config and names, and the whole-model checks the
//! Qwen3 tests make (gradients against finite differences, cached decoding), now with q/k norms
//! over the whole projection.

use serde_json::json;

use super::super::tests::{cached_decoding_matches_the_full_forward, gradcheck_full, lora_gradcheck, tiny};
use super::super::{Arch, LmConfig, Norm, expected_shapes, norm_name};

/// The tiny test shape as Instella: two heads of 4 over a hidden size of 8, GQA 2 over 1 (the
/// published model has full multi-head attention; the k norm's width must follow the KV heads).
fn tiny_instella(tied: bool) -> LmConfig {
    LmConfig { arch: Arch::Instella, rope_theta: 10_000.0, ..tiny(tied) }
}

#[test]
fn instella_gradients_match_finite_differences() {
    gradcheck_full(&tiny_instella(false));
    gradcheck_full(&tiny_instella(true));
}

#[test]
fn instella_lora_gradients_match_finite_differences() {
    lora_gradcheck(&tiny_instella(false));
}

#[test]
fn instella_cached_decoding_matches_the_full_forward() {
    cached_decoding_matches_the_full_forward(&tiny_instella(false));
}

#[test]
fn q_and_k_norms_span_the_whole_projection_under_instella_s_names() {
    let c = tiny_instella(false);
    let shapes = expected_shapes(&c);
    assert_eq!(shapes[&norm_name(&c, 1, Norm::Q)], vec![2 * 4]);
    assert_eq!(shapes[&norm_name(&c, 1, Norm::K)], vec![4]);
    assert!(shapes.contains_key("model.layers.0.pre_attention_layernorm.weight"));
    assert!(shapes.contains_key("model.layers.0.pre_feedforward_layernorm.weight"));
    assert!(!shapes.keys().any(|k| k.contains("input_layernorm") || k.contains("post_attention_layernorm")));
}

/// A config as Instella-3B's repository publishes it (no `head_dim`: it is hidden / heads).
fn published() -> serde_json::Value {
    json!({
        "architectures": ["InstellaForCausalLM"],
        "auto_map": {
            "AutoConfig": "configuration_instella.InstellaConfig",
            "AutoModelForCausalLM": "modeling_instella.InstellaForCausalLM"
        },
        "model_type": "instella",
        "attention_bias": false,
        "attention_dropout": 0.0,
        "hidden_act": "silu",
        "hidden_size": 2560,
        "intermediate_size": 6912,
        "max_position_embeddings": 4096,
        "num_attention_heads": 32,
        "num_hidden_layers": 36,
        "num_key_value_heads": 32,
        "rms_norm_eps": 1e-5,
        "rope_scaling": null,
        "rope_theta": 10000.0,
        "tie_word_embeddings": false,
        "torch_dtype": "bfloat16",
        "vocab_size": 50304
    })
}

#[test]
fn the_published_config_reads_as_the_3b_shape_and_writes_back() {
    let c = LmConfig::from_hf_json(&published().to_string()).unwrap();
    assert_eq!(c, LmConfig::timing_shape("instella-3b").unwrap());
    let written = c.to_hf_json("bfloat16");
    let parsed: serde_json::Value = serde_json::from_str(&written).unwrap();
    assert_eq!(parsed["model_type"], "instella");
    assert_eq!(parsed["auto_map"], published()["auto_map"]);
    assert_eq!(LmConfig::from_hf_json(&written).unwrap(), c);
}

#[test]
fn instella_configs_the_engine_cannot_run_are_refused_by_name() {
    let with = |field: &str, value: serde_json::Value| {
        let mut v = published();
        v[field] = value;
        LmConfig::from_hf_json(&v.to_string()).unwrap_err().to_string()
    };
    assert!(with("attention_bias", json!(true)).contains("attention_bias"));
    assert!(with("rope_scaling", json!({"type": "linear", "factor": 2.0})).contains("rope_scaling"));
    // Heads that do not tile the hidden size.
    let mut v = published();
    v["head_dim"] = json!(64);
    let err = LmConfig::from_hf_json(&v.to_string()).unwrap_err().to_string();
    assert!(err.contains("head_dim 64"), "{err}");
}
