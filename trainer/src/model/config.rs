//! A decoder's shape and architecture, read from and written to HF `config.json` (each
//! architecture's own fields: [`super::arch`]).

use serde::{Deserialize, Serialize};

use super::{Arch, ModelError};
use crate::recipe::{ModelConfig, ModelFamily};

/// A decoder's hyper-parameters, HF field names; `arch` says which architecture's layers and
/// names they are, `moe` gives Qwen3-MoE its experts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LmConfig {
    /// Set by whoever reads the config (from `model_type`, or the recipe's `model.family`).
    #[serde(skip)]
    pub arch: Arch,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    pub head_dim: usize,
    #[serde(default = "default_eps")]
    pub rms_norm_eps: f64,
    #[serde(default = "default_theta")]
    pub rope_theta: f64,
    #[serde(default)]
    pub tie_word_embeddings: bool,
    #[serde(default = "default_max_positions")]
    pub max_position_embeddings: usize,
    /// The sparse MLPs of Qwen3-MoE (`model_type: qwen3_moe`) or Qwen3.5-MoE (`qwen3_5_moe_text`,
    /// whose shared expert is `intermediate_size` wide); `None`: a dense model.
    #[serde(skip)]
    pub moe: Option<MoeShape>,
    /// Qwen3.5/3.6's layer kinds and Gated DeltaNet shape; `None`: every layer attends.
    #[serde(skip)]
    pub hybrid: Option<HybridShape>,
}

/// What a layer mixes tokens with; the training step dispatches on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LayerKind {
    /// Softmax attention over the document (HF `full_attention`).
    #[serde(rename = "full_attention")]
    Attention,
    /// A Gated DeltaNet layer (HF `linear_attention`): [`super::linear_attention`].
    LinearAttention,
}

/// A Qwen3.5/3.6 hybrid's layer kinds and linear-attention shape, HF `Qwen3_5TextConfig` names.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HybridShape {
    /// One kind per layer (`num_hidden_layers` of them).
    pub layer_types: Vec<LayerKind>,
    /// Taps of the depthwise causal conv over the q/k/v projection.
    pub linear_conv_kernel_dim: usize,
    pub linear_key_head_dim: usize,
    pub linear_value_head_dim: usize,
    pub linear_num_key_heads: usize,
    pub linear_num_value_heads: usize,
    /// The share of an attention head's dims RoPE rotates (the first `head_dim·factor`).
    pub partial_rotary_factor: f64,
}

impl HybridShape {
    /// Width of the q/k/v projection the conv runs over: `[q | k | v]`.
    pub fn conv_dim(&self) -> usize {
        2 * self.key_dim() + self.value_dim()
    }

    pub fn key_dim(&self) -> usize {
        self.linear_num_key_heads * self.linear_key_head_dim
    }

    pub fn value_dim(&self) -> usize {
        self.linear_num_value_heads * self.linear_value_head_dim
    }
}

/// The routed experts' layout, HF `Qwen3MoeConfig` field names (Qwen3.5-MoE's too).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MoeShape {
    /// transformers 5 writes it as `num_local_experts`.
    #[serde(alias = "num_local_experts")]
    pub num_experts: usize,
    pub num_experts_per_tok: usize,
    pub moe_intermediate_size: usize,
    #[serde(default)]
    pub norm_topk_prob: bool,
    /// Every `decoder_sparse_step`-th layer is sparse (HF: layer `i` when `(i + 1) % step == 0`).
    #[serde(default = "default_sparse_step")]
    pub decoder_sparse_step: usize,
    /// Layers that keep a dense MLP of `intermediate_size`.
    #[serde(default)]
    pub mlp_only_layers: Vec<usize>,
    /// Weight of the load-balancing loss in training; 0 when HF's `output_router_logits` is off
    /// (transformers then leaves the loss out too).
    #[serde(default)]
    pub router_aux_loss_coef: f64,
}

fn default_sparse_step() -> usize {
    1
}

impl MoeShape {
    /// The experts of an HF config's fields (`Qwen3MoeConfig`'s names, which
    /// `Qwen3_5MoeTextConfig` shares). transformers adds the load-balancing loss only with
    /// `output_router_logits`, so without it the weight is 0 here too.
    pub(super) fn from_hf(fields: &serde_json::Value) -> Result<MoeShape, serde_json::Error> {
        let mut moe: MoeShape = serde_json::from_value(fields.clone())?;
        if !fields.get("output_router_logits").and_then(serde_json::Value::as_bool).unwrap_or(false) {
            moe.router_aux_loss_coef = 0.0;
        }
        Ok(moe)
    }

    /// Whether layer `layer` has the sparse MLP (HF's `Qwen3MoeDecoderLayer` rule).
    pub fn is_sparse(&self, layer: usize) -> bool {
        !self.mlp_only_layers.contains(&layer) && (layer + 1).is_multiple_of(self.decoder_sparse_step)
    }
}

fn default_eps() -> f64 {
    1e-6
}
fn default_theta() -> f64 {
    1_000_000.0
}
fn default_max_positions() -> usize {
    40_960
}

impl LmConfig {
    /// The dense shapes the benchmarks time on random weights, by name: Qwen3 `0.6B`, `1.7B` and
    /// `8B`, AMD `instella-3b` and the Qwen3.6 hybrids `qwen3.6-27b` and `qwen3.6-35b-a3b` (their published
    /// configs),
    /// `tiny` (a 64-wide Qwen3 for smoke runs on the CPU) and `tiny-hybrid` (the same as a hybrid);
    /// `None` for any other name. One table, so that the training and serving benchmarks time the
    /// same models.
    pub fn timing_shape(name: &str) -> Option<LmConfig> {
        match name {
            "qwen3.6-27b" => return Some(qwen3_6_27b()),
            "qwen3.6-35b-a3b" => return Some(qwen3_6_35b_a3b()),
            "tiny-hybrid" => return Some(tiny_hybrid()),
            _ => {}
        }
        let (arch, vocab, hidden, layers, heads, kv, head_dim, ffn) = match name {
            "8B" => (Arch::Qwen3, 151_936, 4096, 36, 32, 8, 128, 12_288),
            "1.7B" => (Arch::Qwen3, 151_936, 2048, 28, 16, 8, 128, 6144),
            "0.6B" => (Arch::Qwen3, 151_936, 1024, 28, 16, 8, 128, 3072),
            "instella-3b" => (Arch::Instella, 50_304, 2560, 36, 32, 32, 80, 6912),
            "tiny" => (Arch::Qwen3, 512, 64, 2, 4, 2, 16, 128),
            _ => return None,
        };
        let instella = arch == Arch::Instella;
        Some(LmConfig {
            arch,
            vocab_size: vocab,
            hidden_size: hidden,
            intermediate_size: ffn,
            num_hidden_layers: layers,
            num_attention_heads: heads,
            num_key_value_heads: kv,
            head_dim,
            rms_norm_eps: if instella { 1e-5 } else { 1e-6 },
            rope_theta: if instella { 10_000.0 } else { 1e6 },
            // Qwen3-8B and Instella untie their heads; the smaller Qwen3s share the embedding.
            tie_word_embeddings: !(name == "8B" || instella),
            max_position_embeddings: if instella { 4096 } else { 40_960 },
            moe: None,
            hybrid: None,
        })
    }

    /// Parses an HF `config.json` of an architecture this engine runs (by its `model_type`) and
    /// checks the shape.
    pub fn from_hf_json(json: &str) -> Result<LmConfig, ModelError> {
        let raw: serde_json::Value = serde_json::from_str(json).map_err(|e| ModelError::Config(e.to_string()))?;
        // A config without `model_type` is read as Qwen3's (the engine's first architecture).
        let model_type = raw.get("model_type").and_then(|v| v.as_str()).unwrap_or("qwen3");
        let arch = Arch::of_model_type(model_type).ok_or_else(|| {
            ModelError::Config(format!(
                "model_type {model_type:?}: the engine runs qwen3, qwen3_moe, instella, qwen3_5 and qwen3_5_moe"
            ))
        })?;
        let mut config = arch.read_config(&raw)?;
        config.arch = arch;
        // Newer transformers write rope_theta under `rope_parameters`.
        if let Some(theta) = raw.pointer("/rope_parameters/rope_theta").and_then(|v| v.as_f64()) {
            config.rope_theta = theta;
        }
        config.validate()?;
        Ok(config)
    }

    /// `config.json` as the architecture's own code writes it. `torch_dtype` names the dtype the
    /// weights are saved in (`float32`, `bfloat16`, `float16`).
    pub fn to_hf_json(&self, torch_dtype: &str) -> String {
        serde_json::to_string_pretty(&self.arch.write_config(self, torch_dtype)).unwrap_or_default()
    }

    /// The recipe family this model is (`qwen3`, `qwen3_moe`, `instella`, `qwen3_hybrid`).
    pub fn family(&self) -> ModelFamily {
        self.arch.family(self.moe.is_some())
    }

    /// Rejects shapes the engine cannot run: zero sizes, heads that do not group, odd head_dim.
    pub fn validate(&self) -> Result<(), ModelError> {
        let sizes = [
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("intermediate_size", self.intermediate_size),
            ("num_hidden_layers", self.num_hidden_layers),
            ("num_attention_heads", self.num_attention_heads),
            ("num_key_value_heads", self.num_key_value_heads),
            ("head_dim", self.head_dim),
        ];
        if let Some((name, _)) = sizes.iter().find(|(_, v)| *v == 0) {
            return Err(ModelError::Config(format!("{name} is 0")));
        }
        if !self.num_attention_heads.is_multiple_of(self.num_key_value_heads) {
            return Err(ModelError::Config(format!(
                "num_attention_heads {} is not a multiple of num_key_value_heads {}",
                self.num_attention_heads, self.num_key_value_heads
            )));
        }
        if !self.head_dim.is_multiple_of(2) {
            return Err(ModelError::Config(format!("head_dim {} is odd (RoPE rotates pairs)", self.head_dim)));
        }
        if !(self.rms_norm_eps >= 0.0 && self.rope_theta > 0.0) {
            return Err(ModelError::Config("rms_norm_eps must be ≥ 0 and rope_theta > 0".into()));
        }
        self.arch.validate(self)?;
        if let Some(m) = &self.moe {
            if m.num_experts == 0 || m.num_experts_per_tok == 0 || m.num_experts_per_tok > m.num_experts {
                return Err(ModelError::Config(format!(
                    "num_experts_per_tok {} of num_experts {}",
                    m.num_experts_per_tok, m.num_experts
                )));
            }
            if m.moe_intermediate_size == 0 || m.decoder_sparse_step == 0 {
                return Err(ModelError::Config("moe_intermediate_size and decoder_sparse_step must be ≥ 1".into()));
            }
            if !(0.0..=1.0).contains(&m.router_aux_loss_coef) {
                return Err(ModelError::Config(format!(
                    "router_aux_loss_coef {} is outside [0, 1]",
                    m.router_aux_loss_coef
                )));
            }
        }
        Ok(())
    }

    pub fn kv_groups(&self) -> usize {
        self.num_attention_heads / self.num_key_value_heads
    }

    /// What layer `layer` mixes tokens with.
    pub fn layer_kind(&self, layer: usize) -> LayerKind {
        match &self.hybrid {
            Some(h) => h.layer_types.get(layer).copied().unwrap_or(LayerKind::Attention),
            None => LayerKind::Attention,
        }
    }

    /// The leading dims of an attention head RoPE rotates (all of them but on a hybrid).
    pub fn rotary_dim(&self) -> usize {
        match &self.hybrid {
            Some(h) => (self.head_dim as f64 * h.partial_rotary_factor) as usize,
            None => self.head_dim,
        }
    }
}

impl LmConfig {
    /// A recipe's inline `model.config` as the shape of `family`'s architecture; `None` for a
    /// family the engine does not run (`recipe check` refuses those).
    pub fn from_recipe(c: &ModelConfig, family: ModelFamily) -> Option<LmConfig> {
        Some(LmConfig {
            arch: Arch::of_family(family)?,
            vocab_size: c.vocab_size as usize,
            hidden_size: c.hidden_size as usize,
            intermediate_size: c.intermediate_size as usize,
            num_hidden_layers: c.num_layers as usize,
            num_attention_heads: c.num_heads as usize,
            num_key_value_heads: c.num_kv_heads as usize,
            head_dim: c.head_dim as usize,
            rms_norm_eps: c.rms_norm_eps,
            rope_theta: c.rope_theta,
            tie_word_embeddings: c.tie_word_embeddings,
            max_position_embeddings: c.max_position_embeddings as usize,
            moe: c.moe.as_ref().map(|m| MoeShape {
                num_experts: m.num_experts as usize,
                num_experts_per_tok: m.experts_per_token as usize,
                moe_intermediate_size: m.expert_intermediate_size as usize,
                norm_topk_prob: m.norm_topk_prob,
                decoder_sparse_step: 1,
                mlp_only_layers: Vec::new(),
                router_aux_loss_coef: m.router_aux_loss_coef,
            }),
            hybrid: c.linear_attention.as_ref().map(|l| HybridShape {
                layer_types: (0..c.num_layers)
                    .map(|i| if l.attends(i) { LayerKind::Attention } else { LayerKind::LinearAttention })
                    .collect(),
                linear_conv_kernel_dim: l.conv_kernel as usize,
                linear_key_head_dim: l.key_head_dim as usize,
                linear_value_head_dim: l.value_head_dim as usize,
                linear_num_key_heads: l.num_key_heads as usize,
                linear_num_value_heads: l.num_value_heads as usize,
                partial_rotary_factor: l.partial_rotary_factor,
            }),
        })
    }
}

/// The `config.json` fields every decoder here writes alike (shape, norms, RoPE, the defaults
/// transformers expects); each architecture adds its own names (`model_type`, `architectures`,
/// `head_dim` where its config has one, `auto_map`, MoE fields).
pub(super) fn decoder_fields(c: &LmConfig, torch_dtype: &str) -> serde_json::Map<String, serde_json::Value> {
    match serde_json::json!({
        "torch_dtype": torch_dtype,
        "vocab_size": c.vocab_size,
        "hidden_size": c.hidden_size,
        "intermediate_size": c.intermediate_size,
        "num_hidden_layers": c.num_hidden_layers,
        "num_attention_heads": c.num_attention_heads,
        "num_key_value_heads": c.num_key_value_heads,
        "rms_norm_eps": c.rms_norm_eps,
        "rope_theta": c.rope_theta,
        "rope_scaling": null,
        "tie_word_embeddings": c.tie_word_embeddings,
        "max_position_embeddings": c.max_position_embeddings,
        "hidden_act": "silu",
        "attention_bias": false,
        "attention_dropout": 0.0,
        "initializer_range": 0.02,
    }) {
        serde_json::Value::Object(fields) => fields,
        _ => serde_json::Map::new(),
    }
}

/// Qwen/Qwen3.6-27B's text model as its model card and `config.json` publish it: 64 layers of
/// three Gated DeltaNet layers (16 q/k heads, 48 v heads, 128 wide, 4-tap conv) then one gated
/// attention layer (24 q / 4 kv heads of 256, RoPE on a quarter, θ 10⁷), hidden 5120, FFN 17408,
/// vocab 248320, untied head.
fn qwen3_6_27b() -> LmConfig {
    let layer_types =
        (0..64).map(|i| if i % 4 == 3 { LayerKind::Attention } else { LayerKind::LinearAttention }).collect();
    LmConfig {
        arch: Arch::Qwen3_5,
        vocab_size: 248_320,
        hidden_size: 5120,
        intermediate_size: 17_408,
        num_hidden_layers: 64,
        num_attention_heads: 24,
        num_key_value_heads: 4,
        head_dim: 256,
        rope_theta: 1e7,
        tie_word_embeddings: false,
        max_position_embeddings: 262_144,
        hybrid: Some(HybridShape {
            layer_types,
            linear_conv_kernel_dim: 4,
            linear_key_head_dim: 128,
            linear_value_head_dim: 128,
            linear_num_key_heads: 16,
            linear_num_value_heads: 48,
            partial_rotary_factor: 0.25,
        }),
        ..LmConfig::timing_shape("8B").expect("the 8B shape")
    }
}

/// Qwen/Qwen3.6-35B-A3B's text model as its `config.json` publishes it (`qwen3_5_moe`): 40 layers
/// of three Gated DeltaNet layers (16 q/k heads, 32 v heads, 128 wide, 4-tap conv) then one gated
/// attention layer (16 q / 2 kv heads of 256, RoPE on a quarter, θ 10⁷), hidden 2048, every MLP
/// sparse: 256 experts of 512, top-8 renormalised (no balance loss: `output_router_logits` off),
/// and the sigmoid-gated shared expert of 512 (the config's `intermediate_size`); vocab 248320,
/// untied head.
fn qwen3_6_35b_a3b() -> LmConfig {
    let base = qwen3_6_27b();
    let layer_types =
        (0..40).map(|i| if i % 4 == 3 { LayerKind::Attention } else { LayerKind::LinearAttention }).collect();
    LmConfig {
        hidden_size: 2048,
        intermediate_size: 512,
        num_hidden_layers: 40,
        num_attention_heads: 16,
        num_key_value_heads: 2,
        moe: Some(MoeShape {
            num_experts: 256,
            num_experts_per_tok: 8,
            moe_intermediate_size: 512,
            norm_topk_prob: true,
            decoder_sparse_step: 1,
            mlp_only_layers: vec![],
            router_aux_loss_coef: 0.0,
        }),
        hybrid: base.hybrid.clone().map(|h| HybridShape { layer_types, linear_num_value_heads: 32, ..h }),
        ..base
    }
}

/// `tiny` as a hybrid: a Gated DeltaNet layer (two key heads of 16, four value heads of 16)
/// then a gated attention layer rotating a quarter of each head.
fn tiny_hybrid() -> LmConfig {
    LmConfig {
        arch: Arch::Qwen3_5,
        hybrid: Some(HybridShape {
            layer_types: vec![LayerKind::LinearAttention, LayerKind::Attention],
            linear_conv_kernel_dim: 4,
            linear_key_head_dim: 16,
            linear_value_head_dim: 16,
            linear_num_key_heads: 2,
            linear_num_value_heads: 4,
            partial_rotary_factor: 0.25,
        }),
        ..LmConfig::timing_shape("tiny").expect("the tiny shape")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_an_hf_config_and_writes_it_back() {
        let hf = r#"{"architectures":["Qwen3ForCausalLM"],"model_type":"qwen3","vocab_size":151936,
            "hidden_size":1024,"intermediate_size":3072,"num_hidden_layers":28,"num_attention_heads":16,
            "num_key_value_heads":8,"head_dim":128,"rms_norm_eps":1e-6,"rope_theta":1000000,
            "tie_word_embeddings":true,"max_position_embeddings":40960,"bos_token_id":151643,"use_cache":true}"#;
        let c = LmConfig::from_hf_json(hf).unwrap();
        assert_eq!((c.hidden_size, c.num_hidden_layers, c.kv_groups(), c.head_dim), (1024, 28, 2, 128));
        assert!(c.tie_word_embeddings);
        let out = c.to_hf_json("bfloat16");
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(v["model_type"], "qwen3");
        assert_eq!(v["architectures"][0], "Qwen3ForCausalLM");
        assert_eq!(v["torch_dtype"], "bfloat16");
        assert_eq!(LmConfig::from_hf_json(&out).unwrap(), c);
    }

    #[test]
    fn reads_and_writes_a_qwen3_moe_config() {
        // Qwen3-30B-A3B's config.json, trimmed.
        let hf = r#"{"architectures":["Qwen3MoeForCausalLM"],"model_type":"qwen3_moe","vocab_size":151936,
            "hidden_size":2048,"intermediate_size":6144,"num_hidden_layers":48,"num_attention_heads":32,
            "num_key_value_heads":4,"head_dim":128,"rms_norm_eps":1e-6,"rope_theta":1000000,
            "tie_word_embeddings":false,"max_position_embeddings":40960,"num_experts":128,
            "num_experts_per_tok":8,"moe_intermediate_size":768,"norm_topk_prob":true,"decoder_sparse_step":1,
            "mlp_only_layers":[],"output_router_logits":false,"router_aux_loss_coef":0.001}"#;
        let c = LmConfig::from_hf_json(hf).unwrap();
        let moe = c.moe.clone().unwrap();
        assert_eq!((moe.num_experts, moe.num_experts_per_tok, moe.moe_intermediate_size), (128, 8, 768));
        assert!(moe.norm_topk_prob && moe.is_sparse(0) && moe.is_sparse(47));
        assert_eq!(moe.router_aux_loss_coef, 0.0, "transformers adds the loss only with output_router_logits");
        let with_aux = hf.replace(r#""output_router_logits":false"#, r#""output_router_logits":true"#);
        assert_eq!(LmConfig::from_hf_json(&with_aux).unwrap().moe.unwrap().router_aux_loss_coef, 0.001);
        let out = c.to_hf_json("bfloat16");
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(
            (v["model_type"].as_str(), v["architectures"][0].as_str()),
            (Some("qwen3_moe"), Some("Qwen3MoeForCausalLM"))
        );
        assert_eq!(LmConfig::from_hf_json(&out).unwrap(), c);
        let every_other = MoeShape { decoder_sparse_step: 2, mlp_only_layers: vec![3], ..moe.clone() };
        assert_eq!(
            (0..6).map(|l| every_other.is_sparse(l)).collect::<Vec<_>>(),
            [false, true, false, false, false, true]
        );
        let too_many = LmConfig { moe: Some(MoeShape { num_experts_per_tok: 129, ..moe }), ..c };
        assert!(too_many.validate().is_err());
    }

    #[test]
    fn rejects_other_models_and_bad_shapes() {
        let c = LmConfig::from_hf_json(&tiny().to_hf_json("float32")).unwrap();
        assert_eq!(c, tiny());
        let llama = tiny().to_hf_json("float32").replace("\"qwen3\"", "\"llama\"");
        assert!(matches!(LmConfig::from_hf_json(&llama), Err(ModelError::Config(_))));
        let bad = LmConfig { num_key_value_heads: 3, ..tiny() };
        assert!(bad.validate().is_err());
        assert!(LmConfig::from_hf_json("{}").is_err());
    }

    #[test]
    fn converts_the_recipe_shape() {
        let m = ModelConfig {
            hidden_size: 64,
            num_layers: 2,
            num_heads: 4,
            num_kv_heads: 2,
            head_dim: 16,
            intermediate_size: 128,
            vocab_size: 512,
            max_position_embeddings: 1024,
            rope_theta: 1e6,
            rms_norm_eps: 1e-6,
            tie_word_embeddings: true,
            moe: None,
            linear_attention: None,
        };
        let c = LmConfig::from_recipe(&m, ModelFamily::Qwen3).unwrap();
        assert_eq!((c.num_hidden_layers, c.num_attention_heads, c.num_key_value_heads), (2, 4, 2));
        assert!(c.tie_word_embeddings && c.validate().is_ok() && c.moe.is_none());
        let moe = crate::recipe::MoeConfig {
            num_experts: 16,
            experts_per_token: 4,
            expert_intermediate_size: 32,
            norm_topk_prob: true,
            router_aux_loss_coef: 0.01,
        };
        let c = LmConfig::from_recipe(&ModelConfig { moe: Some(moe), ..m.clone() }, ModelFamily::Qwen3Moe).unwrap();
        let s = c.moe.as_ref().unwrap();
        assert_eq!((s.num_experts, s.num_experts_per_tok, s.moe_intermediate_size), (16, 4, 32));
        assert!(s.norm_topk_prob && s.router_aux_loss_coef == 0.01 && (0..2).all(|l| s.is_sparse(l)));
        assert!(c.validate().is_ok());
        // A hybrid's Gated DeltaNet layers: every second layer attends at interval 2.
        let linear = crate::recipe::LinearAttentionConfig {
            full_attention_interval: 2,
            num_key_heads: 1,
            num_value_heads: 2,
            key_head_dim: 8,
            value_head_dim: 6,
            conv_kernel: 3,
            partial_rotary_factor: 0.25,
        };
        let recipe = ModelConfig { num_layers: 4, linear_attention: Some(linear), ..m };
        let c = LmConfig::from_recipe(&recipe, ModelFamily::Qwen3Hybrid).unwrap();
        let h = c.hybrid.as_ref().unwrap();
        let (lin, att) = (LayerKind::LinearAttention, LayerKind::Attention);
        assert_eq!(h.layer_types, [lin, att, lin, att]);
        assert_eq!((h.conv_dim(), h.linear_conv_kernel_dim, c.rotary_dim()), (8 + 8 + 12, 3, 4));
        assert!(c.arch == Arch::Qwen3_5 && c.validate().is_ok());
    }

    pub(crate) fn tiny() -> LmConfig {
        LmConfig {
            arch: Arch::Qwen3,
            vocab_size: 11,
            hidden_size: 8,
            intermediate_size: 12,
            num_hidden_layers: 2,
            num_attention_heads: 2,
            num_key_value_heads: 1,
            head_dim: 4,
            rms_norm_eps: 1e-6,
            rope_theta: 10_000.0,
            tie_word_embeddings: false,
            max_position_embeddings: 64,
            moe: None,
            hybrid: None,
        }
    }
}
