//! AMD Instella (OLMo-derived, `model_type: instella`): its `config.json` and parameter names.
//!
//! As published (AMD-AIG-AIMA/Instella, `hf_instella/modeling_instella.py`): a pre-norm decoder,
//! `h = x + attn(pre_attention_layernorm(x))`, `out = h + mlp(pre_feedforward_layernorm(h))`,
//! whose q and k norms are RMSNorms over the whole projection (gains of `heads·head_dim` and
//! `kv_heads·head_dim`, applied before the split into heads), RoPE, SwiGLU, bias-free
//! projections and `head_dim = hidden_size / num_attention_heads`. Everything else is the shared
//! decoder's ([`super::arch`]).

use serde_json::{Value, json};

use super::ModelError;
use super::config::LmConfig;
use super::params::Norm;

pub(super) fn norm_path(norm: Norm) -> &'static str {
    match norm {
        Norm::Input => "pre_attention_layernorm",
        Norm::PostAttention => "pre_feedforward_layernorm",
        Norm::Q => "self_attn.q_norm",
        Norm::K => "self_attn.k_norm",
    }
}

/// `InstellaConfig`: the shared shape fields; `head_dim` is derived (the config has none).
pub(super) fn read_config(raw: &Value) -> Result<LmConfig, ModelError> {
    let mut with_head = raw.clone();
    let heads = raw.get("num_attention_heads").and_then(Value::as_u64).unwrap_or(0);
    let hidden = raw.get("hidden_size").and_then(Value::as_u64).unwrap_or(0);
    if let Some(obj) = with_head.as_object_mut() {
        obj.entry("head_dim").or_insert_with(|| json!(hidden.checked_div(heads).unwrap_or(0)));
        // Instella's defaults where the published config leaves a field out.
        obj.entry("num_key_value_heads").or_insert_with(|| json!(heads));
        obj.entry("rope_theta").or_insert_with(|| json!(10_000.0));
        obj.entry("max_position_embeddings").or_insert_with(|| json!(4096));
    }
    let mut config: LmConfig =
        serde_json::from_value(with_head).map_err(|e| ModelError::Config(format!("instella: {e}")))?;
    config.arch = super::Arch::Instella;
    if raw.get("attention_bias").and_then(Value::as_bool).unwrap_or(false) {
        return Err(ModelError::Config(
            "instella: attention_bias is true; the engine runs bias-free projections".into(),
        ));
    }
    if raw.get("rope_scaling").is_some_and(|v| !v.is_null()) {
        return Err(ModelError::Config("instella: rope_scaling is set; the engine runs plain RoPE".into()));
    }
    Ok(config)
}

/// `config.json` as Instella's code writes it, with the `auto_map` of its hub repository (the
/// model loads with `trust_remote_code` and the repository's own modeling files).
pub(super) fn write_config(c: &LmConfig, torch_dtype: &str) -> Value {
    let mut fields = super::config::decoder_fields(c, torch_dtype);
    fields.insert("architectures".into(), json!(["InstellaForCausalLM"]));
    fields.insert("model_type".into(), "instella".into());
    fields.insert(
        "auto_map".into(),
        json!({
            "AutoConfig": "configuration_instella.InstellaConfig",
            "AutoModelForCausalLM": "modeling_instella.InstellaForCausalLM",
        }),
    );
    Value::Object(fields)
}

/// Instella's heads tile the hidden size exactly (its attention reshapes by it).
pub(super) fn validate(c: &LmConfig) -> Result<(), ModelError> {
    if c.head_dim * c.num_attention_heads != c.hidden_size {
        return Err(ModelError::Config(format!(
            "instella: head_dim {} × num_attention_heads {} is not hidden_size {}",
            c.head_dim, c.num_attention_heads, c.hidden_size
        )));
    }
    if c.moe.is_some() {
        return Err(ModelError::Config("instella has no experts".into()));
    }
    Ok(())
}

#[cfg(test)]
mod tests;
