//! Qwen3.5 / Qwen3.6 text models (transformers' `Qwen3_5ForCausalLM`, `model_type:
//! qwen3_5_text`, and `Qwen3_5MoeForCausalLM`, `qwen3_5_moe_text`): a hybrid of Gated DeltaNet
//! layers ([`super::linear_attention`]) and gated full attention, 3:1 by default.
//!
//! What sets it apart, as transformers 5.17's `modeling_qwen3_5.py` has it:
//! * every RMSNorm but the DeltaNet's gated one is zero-centred: `x̂·(1 + w)`, `w` stored as
//!   saved (initialised to 0); the engine computes with `1 + w` and hands the gradient to `w`;
//! * attention's `q_proj` is doubled: per head `[query (head_dim) | gate (head_dim)]`, the gate
//!   multiplying the attention output through a sigmoid before `o_proj`; q/k norms per head;
//! * RoPE (half-split `rotate_half`) on the first `head_dim · partial_rotary_factor` dims only.
//!   The text config's M-RoPE sections split the rotary dims over three position streams (time,
//!   height, width); for text all three are the token's position, so it is plain RoPE;
//! * the linear-attention layers' names: `linear_attn.{in_proj_qkv, in_proj_z, in_proj_b,
//!   in_proj_a, conv1d, A_log, dt_bias, norm, out_proj}`;
//! * the MoE variant's every layer is sparse: the router (`mlp.gate`, softmax, top-k always
//!   renormalised), the routed experts ([`super::moe`]) and a shared expert, a SwiGLU of
//!   `shared_expert_intermediate_size` (held as the config's `intermediate_size`: the model has no
//!   dense MLP) gated by `σ(mlp.shared_expert_gate · h)` ([`super::mlp`]).

use serde_json::{Map, Value, json};

use super::ModelError;
use super::config::{HybridShape, LayerKind, LmConfig, MoeShape};

/// HF's defaults for the fields a `Qwen3_5TextConfig` may leave out.
const DEFAULTS: [(&str, f64); 9] = [
    ("head_dim", 256.0),
    ("max_position_embeddings", 32_768.0),
    ("rms_norm_eps", 1e-6),
    ("linear_conv_kernel_dim", 4.0),
    ("linear_key_head_dim", 128.0),
    ("linear_value_head_dim", 128.0),
    ("linear_num_key_heads", 16.0),
    ("linear_num_value_heads", 32.0),
    ("full_attention_interval", 4.0),
];

/// HF's defaults for the experts' fields a `Qwen3_5MoeTextConfig` may leave out.
const MOE_DEFAULTS: [(&str, f64); 5] = [
    ("num_experts", 256.0),
    ("num_experts_per_tok", 8.0),
    ("moe_intermediate_size", 512.0),
    ("shared_expert_intermediate_size", 512.0),
    ("router_aux_loss_coef", 0.001),
];

/// A `qwen3_5_text` or `qwen3_5_moe_text` config, or the `text_config` of a `qwen3_5` or
/// `qwen3_5_moe` one (the released checkpoints, `Qwen3_5[Moe]ForConditionalGeneration`): its
/// `vision_config` and image/video token ids are ignored (the engine trains the text decoder;
/// `model.visual.*` and the multi-token-prediction head's `mtp.*` weights are left unread, as
/// `Qwen3_5[Moe]ForCausalLM` leaves them).
pub(super) fn read_config(raw: &Value) -> Result<LmConfig, ModelError> {
    let err = |m: String| ModelError::Config(format!("qwen3_5: {m}"));
    let outer = raw.get("model_type").and_then(Value::as_str).unwrap_or_default();
    let nested = matches!(outer, "qwen3_5" | "qwen3_5_moe");
    let text = match raw.get("text_config") {
        Some(t) if nested => t,
        _ if nested => return Err(err(format!("a {outer} config without text_config"))),
        _ => raw,
    };
    let moe = outer == "qwen3_5_moe" || text.get("model_type").and_then(Value::as_str) == Some("qwen3_5_moe_text");
    let mut fields: Map<String, Value> = text.as_object().cloned().unwrap_or_default();
    let moe_defaults: &[(&str, f64)] = if moe { &MOE_DEFAULTS } else { &[] };
    for &(name, value) in DEFAULTS.iter().chain(moe_defaults) {
        fields.entry(name).or_insert_with(|| json!(value));
    }
    if moe {
        // No dense MLP: the shared expert is the SwiGLU of the engine's intermediate_size.
        let shared = fields.get("shared_expert_intermediate_size").cloned().unwrap_or(Value::Null);
        fields.insert("intermediate_size".into(), shared);
    }
    // The outer config's tie_word_embeddings is the one transformers ties the head by.
    if let Some(tie) = raw.get("tie_word_embeddings").filter(|_| nested) {
        fields.insert("tie_word_embeddings".into(), tie.clone());
    }
    let rope = text.get("rope_parameters").cloned().unwrap_or(Value::Null);
    if let Some(kind) = rope.get("rope_type").and_then(Value::as_str).filter(|k| *k != "default") {
        return Err(err(format!("rope_type {kind:?}: the engine runs the default RoPE")));
    }
    if let Some(theta) = rope.get("rope_theta") {
        fields.insert("rope_theta".into(), theta.clone());
    }
    if fields.get("attention_bias").and_then(Value::as_bool).unwrap_or(false) {
        return Err(err("attention_bias is true; the engine runs bias-free projections".into()));
    }
    if let Some(act) = fields.get("hidden_act").and_then(Value::as_str).filter(|a| *a != "silu") {
        return Err(err(format!("hidden_act {act:?}: the engine runs SiLU")));
    }
    let mut config: LmConfig = serde_json::from_value(Value::Object(fields.clone())).map_err(|e| err(e.to_string()))?;
    config.arch = super::Arch::Qwen3_5;
    let usize_of = |name: &str| fields.get(name).and_then(Value::as_u64).unwrap_or(0) as usize;
    let layer_types = match fields.get("layer_types") {
        Some(Value::Null) | None => {
            let every = usize_of("full_attention_interval").max(1);
            (0..config.num_hidden_layers)
                .map(|i| if (i + 1) % every == 0 { LayerKind::Attention } else { LayerKind::LinearAttention })
                .collect()
        }
        Some(types) => serde_json::from_value(types.clone()).map_err(|e| err(format!("layer_types: {e}")))?,
    };
    let partial = rope
        .get("partial_rotary_factor")
        .or_else(|| fields.get("partial_rotary_factor"))
        .and_then(Value::as_f64)
        .unwrap_or(0.25);
    if moe {
        let mut shape = MoeShape::from_hf(&Value::Object(fields.clone())).map_err(|e| err(e.to_string()))?;
        // Qwen3_5MoeTopKRouter always renormalises the top-k, and every layer is sparse (the
        // config's norm_topk_prob, decoder_sparse_step and mlp_only_layers, if any, are unread).
        shape.norm_topk_prob = true;
        shape.decoder_sparse_step = 1;
        shape.mlp_only_layers.clear();
        config.moe = Some(shape);
    }
    config.hybrid = Some(HybridShape {
        layer_types,
        linear_conv_kernel_dim: usize_of("linear_conv_kernel_dim"),
        linear_key_head_dim: usize_of("linear_key_head_dim"),
        linear_value_head_dim: usize_of("linear_value_head_dim"),
        linear_num_key_heads: usize_of("linear_num_key_heads"),
        linear_num_value_heads: usize_of("linear_num_value_heads"),
        partial_rotary_factor: partial,
    });
    Ok(config)
}

/// `config.json` as transformers writes it for `Qwen3_5ForCausalLM` or `Qwen3_5MoeForCausalLM`
/// (the text model alone).
pub(super) fn write_config(c: &LmConfig, torch_dtype: &str) -> Value {
    let mut fields = super::config::decoder_fields(c, torch_dtype);
    // Qwen3_5TextConfig keeps RoPE in rope_parameters only.
    fields.remove("rope_theta");
    fields.remove("rope_scaling");
    fields.insert("architectures".into(), json!(["Qwen3_5ForCausalLM"]));
    fields.insert("model_type".into(), "qwen3_5_text".into());
    fields.insert("head_dim".into(), c.head_dim.into());
    if let Some(moe) = &c.moe {
        fields.insert("architectures".into(), json!(["Qwen3_5MoeForCausalLM"]));
        fields.insert("model_type".into(), "qwen3_5_moe_text".into());
        fields.remove("intermediate_size");
        fields.insert("shared_expert_intermediate_size".into(), c.intermediate_size.into());
        fields.insert("num_experts".into(), moe.num_experts.into());
        fields.insert("num_experts_per_tok".into(), moe.num_experts_per_tok.into());
        fields.insert("moe_intermediate_size".into(), moe.moe_intermediate_size.into());
        fields.insert("router_aux_loss_coef".into(), moe.router_aux_loss_coef.into());
        fields.insert("output_router_logits".into(), (moe.router_aux_loss_coef > 0.0).into());
    }
    if let Some(h) = &c.hybrid {
        fields.insert(
            "rope_parameters".into(),
            json!({"rope_type": "default", "rope_theta": c.rope_theta, "partial_rotary_factor": h.partial_rotary_factor}),
        );
        if let Ok(Value::Object(shape)) = serde_json::to_value(h) {
            fields.extend(shape.into_iter().filter(|(k, _)| k != "partial_rotary_factor"));
        }
    }
    Value::Object(fields)
}

/// What the hybrid's layers need of its shape.
pub(super) fn validate(c: &LmConfig) -> Result<(), ModelError> {
    let err = |m: String| Err(ModelError::Config(format!("qwen3_5: {m}")));
    let Some(h) = &c.hybrid else { return err("no layer_types / linear-attention shape".into()) };
    if let Some(m) = &c.moe {
        if !m.norm_topk_prob {
            return err("norm_topk_prob is false: a Qwen3.5-MoE router always renormalises its top-k".into());
        }
        if m.decoder_sparse_step != 1 || !m.mlp_only_layers.is_empty() {
            return err("every layer of a Qwen3.5-MoE is sparse (decoder_sparse_step 1, no mlp_only_layers)".into());
        }
    }
    if h.layer_types.len() != c.num_hidden_layers {
        return err(format!("{} layer_types for {} layers", h.layer_types.len(), c.num_hidden_layers));
    }
    let sizes = [
        ("linear_conv_kernel_dim", h.linear_conv_kernel_dim),
        ("linear_key_head_dim", h.linear_key_head_dim),
        ("linear_value_head_dim", h.linear_value_head_dim),
        ("linear_num_key_heads", h.linear_num_key_heads),
        ("linear_num_value_heads", h.linear_num_value_heads),
    ];
    if let Some((name, _)) = sizes.iter().find(|(_, v)| *v == 0) {
        return err(format!("{name} is 0"));
    }
    if !h.linear_num_value_heads.is_multiple_of(h.linear_num_key_heads) {
        return err(format!(
            "linear_num_value_heads {} is not a multiple of linear_num_key_heads {}",
            h.linear_num_value_heads, h.linear_num_key_heads
        ));
    }
    let rotary = c.rotary_dim();
    if !(h.partial_rotary_factor > 0.0 && rotary > 0 && rotary <= c.head_dim && rotary.is_multiple_of(2)) {
        return err(format!(
            "partial_rotary_factor {} of head_dim {} rotates {rotary} dims: RoPE needs an even number in 2..=head_dim",
            h.partial_rotary_factor, c.head_dim
        ));
    }
    Ok(())
}

/// How [`super::params::init_random`] draws a Qwen3.5 parameter, as `Qwen3_5PreTrainedModel`
/// initialises it: zero-centred norms 0, the gated norm and `dt_bias` 1, `A_log` the log of a
/// uniform draw in [0.01, 16], everything else the shared `N(0, 0.02²)`.
pub(super) fn init_of(name: &str) -> super::params::Init {
    use super::params::Init;
    if name.ends_with("linear_attn.norm.weight") || name.ends_with("dt_bias") {
        Init::Ones
    } else if name.ends_with("norm.weight") || name.ends_with("layernorm.weight") {
        Init::Zeros
    } else if name.ends_with("A_log") {
        Init::LogUniform(0.01, 16.0)
    } else {
        Init::Normal
    }
}

#[cfg(test)]
pub(crate) mod moe_tests;
#[cfg(test)]
mod qlora_tests;
#[cfg(test)]
pub(crate) mod tests;
