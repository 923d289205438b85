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
        config.moe = Some(MoeShape::from_hf(raw).map_err(|e| ModelError::Config(format!("qwen3_moe: {e}")))?);
    }
    Ok(config)
}

/// `config.json` as transformers writes it for `Qwen3ForCausalLM` (or `Qwen3MoeForCausalLM`).
pub(super) fn write_config(c: &LmConfig, torch_dtype: &str) -> Value {
    let mut fields = super::config::decoder_fields(c, torch_dtype);
    fields.insert("architectures".into(), json!(["Qwen3ForCausalLM"]));
    fields.insert("model_type".into(), "qwen3".into());
    fields.insert("head_dim".into(), c.head_dim.into());
    fields.insert("use_sliding_window".into(), false.into());
    let mut value = Value::Object(fields);
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
