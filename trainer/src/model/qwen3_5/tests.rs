//! Qwen3.5/3.6 dense hybrids through the shared decoder: whole-model gradients against finite
//! differences with both layer kinds on packed rows (full fine-tuning and LoRA on every
//! projection), the config as transformers writes and nests it, the names and init, and the
//! cached decoding (recurrent state and gated attention) against the full forward.

use candle_core::{DType, Device};
use serde_json::json;

use super::super::tests::{cached_decoding_matches_the_full_forward, gradcheck_full, lora_gradcheck, tiny};
use super::super::{Arch, CausalLm, HybridShape, LayerKind, LmConfig, Norm, expected_shapes, norm_name};

/// The tiny test shape as a hybrid: a Gated DeltaNet layer (one key head of 4 shared by two
/// value heads of 3, a 3-tap conv), then a gated attention layer rotating half of each head.
pub(crate) fn tiny_hybrid(tied: bool) -> LmConfig {
    LmConfig {
        arch: Arch::Qwen3_5,
        hybrid: Some(HybridShape {
            layer_types: vec![LayerKind::LinearAttention, LayerKind::Attention],
            linear_conv_kernel_dim: 3,
            linear_key_head_dim: 4,
            linear_value_head_dim: 3,
            linear_num_key_heads: 1,
            linear_num_value_heads: 2,
            partial_rotary_factor: 0.5,
        }),
        ..tiny(tied)
    }
}

#[test]
fn hybrid_gradients_match_finite_differences() {
    gradcheck_full(&tiny_hybrid(false));
    gradcheck_full(&tiny_hybrid(true));
}

#[test]
fn hybrid_lora_gradients_match_finite_differences() {
    lora_gradcheck(&tiny_hybrid(false));
}

#[test]
fn each_layer_kind_has_transformers_names_and_shapes() {
    let c = tiny_hybrid(false);
    let shapes = expected_shapes(&c);
    let at = |name: &str| shapes.get(name).cloned().unwrap_or_else(|| panic!("no {name}"));
    let la = "model.layers.0.linear_attn";
    // [q | k | v] = 4 + 4 + 2·3 channels.
    assert_eq!(at(&format!("{la}.in_proj_qkv.weight")), [14, 8]);
    assert_eq!(at(&format!("{la}.in_proj_z.weight")), [6, 8]);
    assert_eq!(at(&format!("{la}.in_proj_b.weight")), [2, 8]);
    assert_eq!(at(&format!("{la}.in_proj_a.weight")), [2, 8]);
    assert_eq!(at(&format!("{la}.out_proj.weight")), [8, 6]);
    assert_eq!(at(&format!("{la}.conv1d.weight")), [14, 1, 3]);
    assert_eq!((at(&format!("{la}.A_log")), at(&format!("{la}.dt_bias"))), (vec![2], vec![2]));
    assert_eq!(at(&format!("{la}.norm.weight")), [3]);
    assert!(!shapes.keys().any(|k| k.starts_with("model.layers.0.self_attn")));
    // The gated attention's q_proj makes query and gate: 2 × heads × head_dim rows.
    assert_eq!(at("model.layers.1.self_attn.q_proj.weight"), [2 * 2 * 4, 8]);
    assert_eq!(at(&norm_name(&c, 1, Norm::Q)), [4]);
    assert!(!shapes.keys().any(|k| k.starts_with("model.layers.1.linear_attn")));
    for layer in 0..2 {
        assert!(shapes.contains_key(&format!("model.layers.{layer}.mlp.gate_proj.weight")));
        assert!(shapes.contains_key(&norm_name(&c, layer, Norm::PostAttention)));
    }
}

#[test]
fn init_follows_transformers_zero_centred_norms_and_gates() {
    let m = CausalLm::init_random(&tiny_hybrid(false), 3, DType::F64, &Device::Cpu).unwrap();
    let values = |name: &str| m.params()[name].flatten_all().unwrap().to_vec1::<f64>().unwrap();
    for zero in ["model.norm.weight", "model.layers.0.input_layernorm.weight", "model.layers.1.self_attn.q_norm.weight"]
    {
        assert!(values(zero).iter().all(|&v| v == 0.0), "{zero} is a zero-centred norm: 1 + w with w = 0");
    }
    assert!(values("model.layers.0.linear_attn.norm.weight").iter().all(|&v| v == 1.0));
    assert!(values("model.layers.0.linear_attn.dt_bias").iter().all(|&v| v == 1.0));
    let a_log = values("model.layers.0.linear_attn.A_log");
    assert!(a_log.iter().all(|&v| (0.01f64.ln()..16f64.ln()).contains(&v)) && a_log[0] != a_log[1]);
}

/// Prefill of three tokens, single steps and a two-token chunk through the recurrent state of
/// the Gated DeltaNet layer and the gated attention's keys and values, with LoRA on every
/// projection, give the logits of one full forward.
#[test]
fn hybrid_cached_decoding_matches_the_full_forward() {
    cached_decoding_matches_the_full_forward(&tiny_hybrid(false));
    cached_decoding_matches_the_full_forward(&tiny_hybrid(true));
}

/// The CPU and a CUDA GPU decode and serve the dense hybrids (their conv and delta-rule `step`
/// kernels run on both); the cache spec gives the Gated DeltaNet layer a recurrent state.
#[test]
fn a_dense_hybrid_is_servable_on_the_cpu_and_on_cuda() {
    let m = CausalLm::init_random(&tiny_hybrid(false), 3, DType::F32, &Device::Cpu).unwrap();
    assert!(m.check_servable().is_ok(), "the CPU decodes and serves hybrids");
    let spec = m.cache_spec(4);
    assert!(matches!(spec.layers[0], crate::model::LayerSpec::Recurrent { conv_channels: 14, conv_kernel: 3, .. }));
    assert!(matches!(spec.layers[1], crate::model::LayerSpec::Attention { .. }));
    if let Ok(gpu) = Device::new_cuda(0) {
        let on_gpu = CausalLm::init_random(&tiny_hybrid(false), 3, DType::F32, &gpu).unwrap();
        assert!(on_gpu.check_servable().is_ok(), "a CUDA GPU decodes and serves dense hybrids");
    }
}

/// The `text_config` of a released Qwen3.5 checkpoint's `config.json`
/// (`Qwen3_5ForConditionalGeneration`), shortened to two groups of four layers.
fn released() -> serde_json::Value {
    json!({
        "architectures": ["Qwen3_5ForConditionalGeneration"],
        "model_type": "qwen3_5",
        "image_token_id": 248056,
        "tie_word_embeddings": false,
        "vision_config": {"model_type": "qwen3_5", "depth": 27, "hidden_size": 1152},
        "text_config": {
            "model_type": "qwen3_5_text",
            "vocab_size": 248320,
            "hidden_size": 4096,
            "intermediate_size": 12288,
            "num_hidden_layers": 8,
            "num_attention_heads": 16,
            "num_key_value_heads": 4,
            "head_dim": 256,
            "hidden_act": "silu",
            "rms_norm_eps": 1e-6,
            "max_position_embeddings": 262144,
            "attention_bias": false,
            "full_attention_interval": 4,
            "linear_conv_kernel_dim": 4,
            "linear_key_head_dim": 128,
            "linear_value_head_dim": 128,
            "linear_num_key_heads": 16,
            "linear_num_value_heads": 32,
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000000, "partial_rotary_factor": 0.25,
                "mrope_section": [11, 11, 10], "mrope_interleaved": true},
            "tie_word_embeddings": true
        }
    })
}

#[test]
fn a_released_nested_config_reads_as_the_text_model_and_writes_as_the_causal_lm() {
    let c = LmConfig::from_hf_json(&released().to_string()).unwrap();
    assert_eq!(c.arch, Arch::Qwen3_5);
    assert_eq!((c.hidden_size, c.num_hidden_layers, c.head_dim, c.rotary_dim()), (4096, 8, 256, 64));
    assert_eq!(c.rope_theta, 1e7);
    assert!(!c.tie_word_embeddings, "the outer config's tie_word_embeddings decides");
    let h = c.hybrid.as_ref().unwrap();
    let linear = LayerKind::LinearAttention;
    assert_eq!(h.layer_types[..4], [linear, linear, linear, LayerKind::Attention]);
    assert_eq!((h.conv_dim(), h.value_dim()), (2 * 16 * 128 + 32 * 128, 32 * 128));
    let written: serde_json::Value = serde_json::from_str(&c.to_hf_json("bfloat16")).unwrap();
    assert_eq!(
        (written["model_type"].as_str(), written["architectures"][0].as_str()),
        (Some("qwen3_5_text"), Some("Qwen3_5ForCausalLM"))
    );
    assert_eq!(written["layer_types"][3], "full_attention");
    assert_eq!(written["rope_parameters"]["partial_rotary_factor"], 0.25);
    assert!(written.get("rope_theta").is_none(), "Qwen3_5TextConfig keeps RoPE in rope_parameters");
    assert_eq!(LmConfig::from_hf_json(&written.to_string()).unwrap(), c);
    let tiny = tiny_hybrid(true);
    assert_eq!(LmConfig::from_hf_json(&tiny.to_hf_json("float32")).unwrap(), tiny);
}

#[test]
fn hybrid_configs_the_engine_cannot_run_are_refused_by_name() {
    let with = |field: &str, value: serde_json::Value| {
        let mut v = released();
        v["text_config"][field] = value;
        LmConfig::from_hf_json(&v.to_string()).unwrap_err().to_string()
    };
    assert!(with("attention_bias", json!(true)).contains("attention_bias"));
    assert!(with("layer_types", json!(["linear_attention"])).contains("1 layer_types for 8 layers"));
    assert!(with("linear_num_value_heads", json!(24)).contains("linear_num_value_heads 24"));
    let yarn = json!({"rope_type": "yarn", "rope_theta": 1e7, "factor": 4.0});
    assert!(with("rope_parameters", yarn).contains("rope_type \"yarn\""));
    let mut no_text = released();
    no_text.as_object_mut().unwrap().remove("text_config");
    assert!(LmConfig::from_hf_json(&no_text.to_string()).unwrap_err().to_string().contains("text_config"));
    let moe = json!({"model_type": "qwen3_5_moe"});
    assert!(LmConfig::from_hf_json(&moe.to_string()).unwrap_err().to_string().contains("qwen3_5_moe"));
}
