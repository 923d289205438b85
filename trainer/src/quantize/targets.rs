//! Which tensors of a decoder become FP8: every Linear weight of the decoder's layers; the
//! embeddings, `lm_head`, the norms, the convolutions and the MoE routers stay as they are.
//!
//! The directory's `quantization_config` targets `Linear` modules, so every Linear kept in its
//! dtype must be named in `ignore` for a reader to leave it alone: `lm_head` and each router gate.

/// The prefix of the decoder layers' tensors in an HF causal-LM checkpoint.
const LAYERS: &str = "model.layers.";

/// Router gates (`mlp.gate`, the shared expert's `shared_expert_gate`): small Linears whose
/// outputs pick experts; quantizing them changes which experts run, so they are kept.
const KEPT_LINEARS: [&str; 2] = [".mlp.gate", ".shared_expert_gate"];

/// What happens to one tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Treatment {
    /// A Linear weight of the decoder: FP8 codes + `weight_scale`.
    Quantize,
    /// A Linear kept in its dtype, named in the config's `ignore` (its module path given).
    Ignore,
    /// Not a Linear weight (embedding, norm, convolution, bias, other parameter): kept as is.
    Keep,
}

/// The treatment of tensor `name` of shape `dims`.
pub fn treatment(name: &str, dims: &[usize]) -> Treatment {
    let Some(module) = name.strip_suffix(".weight") else { return Treatment::Keep };
    if !name.starts_with(LAYERS) || dims.len() != 2 {
        return Treatment::Keep;
    }
    if KEPT_LINEARS.iter().any(|k| module.ends_with(k)) { Treatment::Ignore } else { Treatment::Quantize }
}

/// Whether `name` is an expert's weight of a mixture-of-experts layer.
pub fn is_expert(name: &str) -> bool {
    name.starts_with(LAYERS) && name.contains(".mlp.experts.")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decoder_linears_are_quantized_and_the_rest_kept() {
        let q = [
            "model.layers.0.self_attn.q_proj.weight",
            "model.layers.3.self_attn.o_proj.weight",
            "model.layers.1.mlp.down_proj.weight",
            "model.layers.2.linear_attn.in_proj_qkv.weight",
            "model.layers.2.linear_attn.out_proj.weight",
            "model.layers.5.mlp.shared_expert.up_proj.weight",
        ];
        for name in q {
            assert_eq!(treatment(name, &[8, 4]), Treatment::Quantize, "{name}");
        }
        for name in ["model.layers.0.mlp.gate.weight", "model.layers.4.mlp.shared_expert_gate.weight"] {
            assert_eq!(treatment(name, &[8, 4]), Treatment::Ignore, "{name}");
        }
        let kept: [(&str, &[usize]); 6] = [
            ("model.embed_tokens.weight", &[16, 4]),
            ("lm_head.weight", &[16, 4]),
            ("model.norm.weight", &[4]),
            ("model.layers.0.input_layernorm.weight", &[4]),
            ("model.layers.2.linear_attn.conv1d.weight", &[8, 1, 4]),
            ("model.layers.0.self_attn.q_proj.bias", &[8]),
        ];
        for (name, dims) in kept {
            assert_eq!(treatment(name, dims), Treatment::Keep, "{name}");
        }
        assert!(is_expert("model.layers.0.mlp.experts.3.up_proj.weight"));
        assert!(!is_expert("model.layers.0.mlp.shared_expert.up_proj.weight"));
    }
}
