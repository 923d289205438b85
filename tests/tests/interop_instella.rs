//! Interop with the Python ecosystem for AMD's Instella (the checks: `mindxtrain_tests::interop`)
//! against our PyTorch reference of its published architecture (tests/python/instella/, checked
//! on its own by `instella_reference.rs`): weights saved by transformers load by name with the
//! same logits, our saves and PEFT adapters load there with ours, one LoRA step equals PEFT's.
//!
//! Needs the CPU torch venv of `scripts/setup-torch`. Without it the tests skip, unless
//! MINDXTRAIN_REQUIRE_TORCH is set (CI sets it): then they install it, and fail if they cannot.

use std::sync::OnceLock;

use mindxtrain_tests::interop::{self, Family, Fixture};
use mindxtrain_trainer::recipe::TargetModule;

/// Whole-projection q/k norms over GQA (4 heads of 8 on 2 KV heads), an untied head, and a
/// RoPE base and norm epsilon of Instella's published kind; `head_dim` is derived, as there.
const INSTELLA: Family = Family {
    script: "instella_tiny.py",
    config: r#"{"vocab_size": 96, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
  "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64,
  "rope_theta": 10000.0, "rms_norm_eps": 1e-5, "tie_word_embeddings": false, "attention_bias": false,
  "rope_scaling": null}"#,
    targets: TargetModule::all,
    step_tolerance: 1e-5,
};

fn fixture() -> Option<&'static Fixture> {
    static FIXTURE: OnceLock<Option<Fixture>> = OnceLock::new();
    FIXTURE.get_or_init(|| interop::build_fixture(&INSTELLA)).as_ref()
}

#[test]
fn instella_weights_saved_by_transformers_load_by_name_shape_and_value() {
    fixture().map(interop::transformers_weights_load_by_name_shape_and_value);
}

#[test]
fn instella_logits_match_the_reference() {
    fixture().map(interop::logits_match_transformers);
}

#[test]
fn our_saved_instella_loads_in_transformers_with_its_code() {
    fixture().map(interop::our_saved_model_loads_in_transformers);
}

#[test]
fn our_instella_adapter_gives_peft_the_same_logits() {
    fixture().map(interop::our_adapter_gives_peft_the_same_logits);
}

#[test]
fn one_instella_lora_step_matches_peft_and_torch_adamw() {
    fixture().map(interop::one_lora_step_matches_peft_and_torch_adamw);
}
