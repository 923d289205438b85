//! Qwen3 and Qwen3-MoE: their `config.json` and their parameter names. The layers themselves are
//! the shared decoder's ([`super::arch`]); Qwen3-MoE's sparse MLP is [`super::moe`].

use serde_json::{Value, json};

use super::ModelError;
use super::config::{LmConfig, MoeShape};
use super::params::Norm;

pub(super) fn norm_path(norm: Norm) -> &'static str {
    match norm {
        Norm::Input => "input_layernorm",
        Norm::PostAttention => "post_attention_layernorm",
        Norm::Q => "self_attn.q_norm",
        Norm::K => "self_attn.k_norm",
    }
}

/// `Qwen3Config` / `Qwen3MoeConfig` (`model_type: qwen3_moe` has experts). Unknown fields
/// (HF writes many: `bos_token_id`, `use_cache`, …) are ignored.
pub(super) fn read_config(raw: &Value) -> Result<LmConfig, ModelError> {
    let mut config: LmConfig = serde_json::from_value(raw.clone()).map_err(|e| ModelError::Config(e.to_string()))?;
    if raw.get("model_type").and_then(Value::as_str) == Some("qwen3_moe") {
        let mut moe: MoeShape =
            serde_json::from_value(raw.clone()).map_err(|e| ModelError::Config(format!("qwen3_moe: {e}")))?;
        if !raw.get("output_router_logits").and_then(Value::as_bool).unwrap_or(false) {
            moe.router_aux_loss_coef = 0.0;
        }
        config.moe = Some(moe);
    }
    Ok(config)
}

/// `config.json` as transformers writes it for `Qwen3ForCausalLM` (or `Qwen3MoeForCausalLM`).
pub(super) fn write_config(c: &LmConfig, torch_dtype: &str) -> Value {
    let mut value = json!({
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "torch_dtype": torch_dtype,
        "vocab_size": c.vocab_size,
        "hidden_size": c.hidden_size,
        "intermediate_size": c.intermediate_size,
        "num_hidden_layers": c.num_hidden_layers,
        "num_attention_heads": c.num_attention_heads,
        "num_key_value_heads": c.num_key_value_heads,
        "head_dim": c.head_dim,
        "rms_norm_eps": c.rms_norm_eps,
        "rope_theta": c.rope_theta,
        "tie_word_embeddings": c.tie_word_embeddings,
        "max_position_embeddings": c.max_position_embeddings,
        "hidden_act": "silu",
        "attention_bias": false,
        "attention_dropout": 0.0,
        "initializer_range": 0.02,
        "use_sliding_window": false,
        "rope_scaling": null,
    });
    if let (Some(moe), Some(obj)) = (&c.moe, value.as_object_mut()) {
        obj.insert("architectures".into(), json!(["Qwen3MoeForCausalLM"]));
        obj.insert("model_type".into(), "qwen3_moe".into());
        if let Ok(Value::Object(fields)) = serde_json::to_value(moe) {
            obj.extend(fields);
        }
        obj.insert("output_router_logits".into(), (moe.router_aux_loss_coef > 0.0).into());
    }
    value
}
