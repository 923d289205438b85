//! Qwen3.5/3.6 MoE hybrids (`qwen3_5_moe`): whole-model gradients against finite differences
//! with the routed experts, the gated shared expert and the balance loss on both layer kinds
//! (full fine-tuning, and LoRA on every projection PEFT's `all-linear` reaches), the names and
//! shapes transformers saves, the config as transformers writes and nests it, and cached decoding.

use candle_core::DType;
use serde_json::json;

use super::super::moe::{down_name, gate_up_name, router_name};
use super::super::moe_tests::{adapter_gradients_match_finite_differences, gradcheck_full, live_adapters_in, model};
use super::super::{LmConfig, LoraConfig, MoeShape, Proj, base_weight_name, expected_shapes, merge_lora};
use super::tests::tiny_hybrid;
use crate::recipe::TargetModule;

/// The tiny hybrid with every layer sparse: 4 routed experts of width 6, 2 per token, and the
/// shared expert of the tiny shape's `intermediate_size` (12); the balance loss on.
pub(crate) fn tiny_hybrid_moe() -> LmConfig {
    LmConfig {
        moe: Some(MoeShape {
            num_experts: 4,
            num_experts_per_tok: 2,
            moe_intermediate_size: 6,
            norm_topk_prob: true,
            decoder_sparse_step: 1,
            mlp_only_layers: Vec::new(),
            router_aux_loss_coef: 0.1,
        }),
        ..tiny_hybrid(false)
    }
}

pub(super) fn every_target() -> LoraConfig {
    LoraConfig { r: 2, alpha: 4.0, dropout: 0.0, target_modules: TargetModule::EVERY.to_vec(), rslora: false }
}

#[test]
fn hybrid_moe_gradients_match_finite_differences_with_the_balance_loss() {
    gradcheck_full(&tiny_hybrid_moe());
}

#[test]
fn hybrid_moe_lora_on_every_linear_module_matches_finite_differences() {
    let c = tiny_hybrid_moe();
    let cfg = every_target();
    let ad = live_adapters_in(&c, &cfg, DType::F64);
    let adapted = |module: &str| ad.tensors.keys().any(|n| n.contains(module));
    for module in
        ["layers.0.linear_attn.in_proj_qkv", "layers.1.self_attn.q_proj", "layers.0.mlp.shared_expert.up_proj"]
    {
        assert!(adapted(module), "{module} has no adapter");
    }
    assert_eq!(ad.tensors["base_model.model.model.layers.1.mlp.shared_expert_gate.lora_B.weight"].dims(), [1, 2]);
    // As PEFT on Qwen3_5Moe: the routed experts (3-D parameters) and the router take none.
    assert!(!adapted("mlp.experts") && !adapted("mlp.gate."), "{:?}", ad.tensors.keys());
    assert!(cfg.target_parameters(&c).is_empty());
    adapter_gradients_match_finite_differences(&c, &model(&c, DType::F64), &ad);
}

#[test]
fn shared_expert_adapters_merge_into_the_weights() {
    let c = tiny_hybrid_moe();
    let m = model(&c, DType::F64);
    let ad = live_adapters_in(&c, &every_target(), DType::F64);
    let b = super::super::tests::packed_batch();
    let adapted = m.logits(&b, Some(&ad)).unwrap();
    let merged = merge_lora(m.params(), &c, &ad).unwrap();
    let changed = base_weight_name(1, Proj::SharedExpertGate);
    assert_ne!(merged[&changed].to_vec2::<f64>().unwrap(), m.params()[&changed].to_vec2::<f64>().unwrap());
    let merged = super::super::CausalLm::new(c, merged, &candle_core::Device::Cpu).unwrap();
    let diff = (merged.logits(&b, None).unwrap() - adapted).unwrap().abs().unwrap();
    assert!(diff.max_all().unwrap().to_scalar::<f64>().unwrap() < 1e-9);
}

#[test]
fn every_hybrid_moe_layer_has_transformers_sparse_names_and_shapes() {
    let c = tiny_hybrid_moe();
    let shapes = expected_shapes(&c);
    for layer in 0..2 {
        let at = |name: String| shapes.get(&name).cloned().unwrap_or_else(|| panic!("no {name}"));
        let mlp = format!("model.layers.{layer}.mlp");
        assert_eq!(at(router_name(layer)), [4, 8]);
        assert_eq!(at(gate_up_name(layer)), [4, 12, 8]);
        assert_eq!(at(down_name(layer)), [4, 8, 6]);
        assert_eq!(at(format!("{mlp}.shared_expert.gate_proj.weight")), [12, 8]);
        assert_eq!(at(format!("{mlp}.shared_expert.down_proj.weight")), [8, 12]);
        assert_eq!(at(format!("{mlp}.shared_expert_gate.weight")), [1, 8]);
        assert!(!shapes.contains_key(&format!("{mlp}.gate_proj.weight")), "no dense MLP");
    }
}

/// The `text_config` of Qwen3.6-35B-A3B's released `config.json`
/// (`Qwen3_5MoeForConditionalGeneration`), shortened to one group of four layers.
fn released_moe() -> serde_json::Value {
    json!({
        "architectures": ["Qwen3_5MoeForConditionalGeneration"],
        "model_type": "qwen3_5_moe",
        "tie_word_embeddings": false,
        "vision_config": {"model_type": "qwen3_5_moe", "depth": 27, "hidden_size": 1152},
        "text_config": {
            "model_type": "qwen3_5_moe_text",
            "vocab_size": 248320,
            "hidden_size": 2048,
            "num_hidden_layers": 4,
            "num_attention_heads": 16,
            "num_key_value_heads": 2,
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
            "num_experts": 256,
            "num_experts_per_tok": 8,
            "moe_intermediate_size": 512,
            "shared_expert_intermediate_size": 512,
            "router_aux_loss_coef": 0.001,
            "output_router_logits": false,
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000000, "partial_rotary_factor": 0.25,
                "mrope_section": [11, 11, 10], "mrope_interleaved": true}
        }
    })
}

#[test]
fn a_released_moe_config_reads_with_its_experts_and_writes_as_the_moe_causal_lm() {
    let c = LmConfig::from_hf_json(&released_moe().to_string()).unwrap();
    let moe = c.moe.clone().expect("experts");
    assert_eq!((moe.num_experts, moe.num_experts_per_tok, moe.moe_intermediate_size), (256, 8, 512));
    assert!(moe.norm_topk_prob && (0..4).all(|l| moe.is_sparse(l)));
    assert_eq!(moe.router_aux_loss_coef, 0.0, "transformers adds the loss only with output_router_logits");
    assert_eq!(c.intermediate_size, 512, "the shared expert's width");
    assert_eq!(c.hybrid.as_ref().unwrap().layer_types.len(), 4);
    let written: serde_json::Value = serde_json::from_str(&c.to_hf_json("bfloat16")).unwrap();
    assert_eq!(
        (written["model_type"].as_str(), written["architectures"][0].as_str()),
        (Some("qwen3_5_moe_text"), Some("Qwen3_5MoeForCausalLM"))
    );
    assert_eq!(written["shared_expert_intermediate_size"], 512);
    assert!(written.get("intermediate_size").is_none(), "Qwen3_5MoeTextConfig has no dense MLP width");
    assert_eq!(LmConfig::from_hf_json(&written.to_string()).unwrap(), c);
    let tiny = tiny_hybrid_moe();
    let json = tiny.to_hf_json("float32");
    assert!(json.contains("\"output_router_logits\": true"), "{json}");
    assert_eq!(LmConfig::from_hf_json(&json).unwrap(), tiny);
    let mut unnormalised = tiny;
    unnormalised.moe.as_mut().unwrap().norm_topk_prob = false;
    assert!(unnormalised.validate().unwrap_err().to_string().contains("renormalises"));
}

/// Prefill, single steps and a two-token chunk through the routed experts and the gated shared
/// expert (LoRA on every module PEFT reaches: the shared expert's projections and its gate) give
/// the logits of one full forward, on both layer kinds.
#[test]
fn hybrid_moe_cached_decoding_matches_the_full_forward() {
    let c = tiny_hybrid_moe();
    assert!(model(&c, DType::F32).check_servable().is_ok(), "the CPU decodes and serves MoE hybrids");
    super::super::tests::cached_decoding_matches_the_full_forward(&c);
}
