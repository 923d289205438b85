//! Interop with transformers' own Qwen3.5/3.6 text models, dense (`Qwen3_5ForCausalLM`) and MoE
//! (`Qwen3_5MoeForCausalLM`), the same checks on each (`mindxtrain_tests::interop`): weights saved
//! by transformers load by name with the same logits through both layer kinds (Gated DeltaNet and
//! gated attention with partial RoPE, zero-centred norms; on the MoE every layer's router, routed
//! experts saved one tensor per expert, and sigmoid-gated shared expert), our saves load in
//! transformers, our adapter on every module PEFT's `all-linear` reaches gives PEFT's logits, and
//! one LoRA step equals PEFT's with torch AdamW, and greedy generation (through the recurrent
//! state, the attention cache and, on the MoE, the routed and shared experts) continues as
//! transformers' cached `generate` does.
//!
//! Needs the CPU torch venv of `scripts/setup-torch`. Without it the tests skip, unless
//! MINDXTRAIN_REQUIRE_TORCH is set (CI sets it): then they install it, and fail if they cannot.

use mindxtrain_tests::interop::{self, Family, Fixture};
use mindxtrain_trainer::recipe::TargetModule;

/// Three layers, linear / attention / linear: GQA on both kinds (4 query heads on 2 KV heads; 4
/// value heads on 2 key heads), head_dim 8 of which RoPE rotates half, an untied head.
const QWEN3_5: Family = Family {
    script: "qwen3_5_tiny.py",
    config: r#"{"vocab_size": 96, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 3,
  "layer_types": ["linear_attention", "full_attention", "linear_attention"],
  "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8, "max_position_embeddings": 64,
  "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5},
  "rms_norm_eps": 1e-6, "tie_word_embeddings": false, "linear_conv_kernel_dim": 4,
  "linear_key_head_dim": 8, "linear_value_head_dim": 6, "linear_num_key_heads": 2,
  "linear_num_value_heads": 4}"#,
    targets: || TargetModule::EVERY.to_vec(),
    // transformers runs the delta rule chunked (triangular solves), we run it token by token: in
    // f32 the layer's gradients part by about 1e-5 of their norm (delta_rule_reference.rs), which
    // AdamW's first step turns into up to ~3e-5 on small-gradient elements (lr 0.01).
    step_tolerance: 1e-4,
};

/// The dense fixture's shape with every MLP sparse: 4 experts of width 16, 2 per token, and a
/// shared expert of 24 (`Qwen3_5MoeTextConfig` has no dense `intermediate_size`).
const QWEN3_5_MOE: Family = Family {
    script: "qwen3_5_tiny.py",
    config: r#"{"vocab_size": 96, "hidden_size": 32, "num_hidden_layers": 3,
  "layer_types": ["linear_attention", "full_attention", "linear_attention"],
  "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8, "max_position_embeddings": 64,
  "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5},
  "rms_norm_eps": 1e-6, "tie_word_embeddings": false, "linear_conv_kernel_dim": 4,
  "linear_key_head_dim": 8, "linear_value_head_dim": 6, "linear_num_key_heads": 2,
  "linear_num_value_heads": 4, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 16,
  "shared_expert_intermediate_size": 24}"#,
    targets: || TargetModule::EVERY.to_vec(),
    step_tolerance: 1e-4,
};

/// The six checks on `$family`'s fixture, built once for them.
macro_rules! interop_tests {
    ($family:expr) => {
        use std::sync::OnceLock;

        use super::*;

        fn fixture() -> Option<&'static Fixture> {
            static FIXTURE: OnceLock<Option<Fixture>> = OnceLock::new();
            FIXTURE.get_or_init(|| interop::build_fixture(&$family)).as_ref()
        }

        #[test]
        fn weights_saved_by_transformers_load_by_name_shape_and_value() {
            fixture().map(interop::transformers_weights_load_by_name_shape_and_value);
        }

        #[test]
        fn logits_match_transformers() {
            fixture().map(interop::logits_match_transformers);
        }

        #[test]
        fn our_save_loads_in_transformers() {
            fixture().map(interop::our_saved_model_loads_in_transformers);
        }

        #[test]
        fn our_adapter_on_every_linear_module_gives_peft_the_same_logits() {
            fixture().map(interop::our_adapter_gives_peft_the_same_logits);
        }

        #[test]
        fn one_lora_step_matches_peft_and_torch_adamw() {
            fixture().map(interop::one_lora_step_matches_peft_and_torch_adamw);
        }

        /// Generation through the Gated DeltaNet layers' recurrent state (conv and delta rule
        /// one step at a time), the gated attention's cache and the layers' MLPs (the routed and
        /// gated shared experts on the MoE), against transformers' own cached `generate`.
        #[test]
        fn greedy_generation_matches_transformers() {
            fixture().map(interop::greedy_generation_matches_transformers);
        }
    };
}

mod dense {
    interop_tests!(QWEN3_5);
}

mod moe {
    interop_tests!(QWEN3_5_MOE);
}
