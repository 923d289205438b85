//! The architectures the engine runs, one folder each beside this file (`qwen3/`, `instella/`,
//! `qwen3_5/`).
//!
//! One decoder engine serves them all: the training step ([`super::block`]), dense decoding
//! ([`super::decode`]) and the paged serving step ([`super::paged`]) are written once, and what
//! sets an architecture apart is data they read from the model's [`LmConfig`]: how its
//! `config.json` reads and writes, the names of its norms, where its q/k norms take their
//! statistics, and each layer's kind ([`super::LayerKind`]: attention, or on a Qwen3.5 hybrid
//! a Gated DeltaNet layer; the MLP dense or sparse: Qwen3-MoE's routed experts, or Qwen3.5-MoE's
//! with a gated shared expert). An architecture is an arm of [`Arch`] and a folder; adding one
//! touches those, its kernels if it needs new ones, and its recipe rules
//! (`recipe::validate`), nothing else (docs/architecture.md, "The model seam").

use std::borrow::Cow;

use candle_core::Tensor;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::config::LmConfig;
use super::params::Norm;
use super::{ModelError, instella, qwen3, qwen3_5};
use crate::recipe::ModelFamily;

/// A decoder architecture.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Arch {
    /// Qwen3, dense, or Qwen3-MoE when the config has experts (`qwen3_moe`).
    #[default]
    Qwen3,
    /// AMD Instella (OLMo-derived): q/k norms over the whole projection, `pre_*_layernorm` names.
    Instella,
    /// Qwen3.5/3.6 text: Gated DeltaNet layers mixed with gated attention, zero-centred norms,
    /// partial RoPE; dense, or `qwen3_5_moe` when the config has experts (`qwen3_5/`).
    Qwen3_5,
}

/// Over what a q or k norm takes its root mean square.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QkNorm {
    /// Each head's `head_dim` values (gain `[head_dim]`): Qwen3.
    PerHead,
    /// The whole projection, every head together (gain `[heads·head_dim]`): Instella.
    Projection,
}

impl Arch {
    /// The architecture a `config.json`'s `model_type` names, if the engine runs it.
    pub fn of_model_type(model_type: &str) -> Option<Arch> {
        match model_type {
            "qwen3" | "qwen3_moe" => Some(Arch::Qwen3),
            "instella" => Some(Arch::Instella),
            // `qwen3_5` nests the text model's config under `text_config` (with a vision tower);
            // the `_moe` ones have experts.
            "qwen3_5_text" | "qwen3_5" | "qwen3_5_moe_text" | "qwen3_5_moe" => Some(Arch::Qwen3_5),
            _ => None,
        }
    }

    /// The architecture a recipe's `model.family` names, if the engine runs it.
    pub fn of_family(family: ModelFamily) -> Option<Arch> {
        match family {
            ModelFamily::Qwen3 | ModelFamily::Qwen3Moe => Some(Arch::Qwen3),
            ModelFamily::Instella => Some(Arch::Instella),
            ModelFamily::Qwen3Hybrid => Some(Arch::Qwen3_5),
            ModelFamily::Qwen3Vl => None,
        }
    }

    /// The recipe family of a model of this architecture (`moe`: it has experts).
    pub fn family(self, moe: bool) -> ModelFamily {
        match (self, moe) {
            (Arch::Qwen3, false) => ModelFamily::Qwen3,
            (Arch::Qwen3, true) => ModelFamily::Qwen3Moe,
            (Arch::Instella, _) => ModelFamily::Instella,
            (Arch::Qwen3_5, _) => ModelFamily::Qwen3Hybrid,
        }
    }

    pub fn qk_norm(self) -> QkNorm {
        match self {
            Arch::Qwen3 | Arch::Qwen3_5 => QkNorm::PerHead,
            Arch::Instella => QkNorm::Projection,
        }
    }

    /// The module path of a layer's norm, as the architecture's checkpoints name it.
    pub fn norm_path(self, norm: Norm) -> &'static str {
        match self {
            Arch::Qwen3 | Arch::Qwen3_5 => qwen3::norm_path(norm),
            Arch::Instella => instella::norm_path(norm),
        }
    }

    /// Reads this architecture's `config.json` (parsed as `raw`).
    pub(super) fn read_config(self, raw: &Value) -> Result<LmConfig, ModelError> {
        match self {
            Arch::Qwen3 => qwen3::read_config(raw),
            Arch::Instella => instella::read_config(raw),
            Arch::Qwen3_5 => qwen3_5::read_config(raw),
        }
    }

    /// `config.json` as this architecture's own code writes it.
    pub(super) fn write_config(self, c: &LmConfig, torch_dtype: &str) -> Value {
        match self {
            Arch::Qwen3 => qwen3::write_config(c, torch_dtype),
            Arch::Instella => instella::write_config(c, torch_dtype),
            Arch::Qwen3_5 => qwen3_5::write_config(c, torch_dtype),
        }
    }

    /// What this architecture asks of a shape beyond the shared rules.
    pub(super) fn validate(self, c: &LmConfig) -> Result<(), ModelError> {
        if self != Arch::Qwen3_5 && c.hybrid.is_some() {
            return Err(ModelError::Config("only qwen3_5 models have linear-attention layers".into()));
        }
        match self {
            Arch::Qwen3 => Ok(()),
            Arch::Instella => instella::validate(c),
            Arch::Qwen3_5 => qwen3_5::validate(c),
        }
    }

    /// Whether attention's `q_proj` also makes a sigmoid gate on the attention output (Qwen3.5:
    /// per head `[query | gate]`, each `head_dim` wide).
    pub fn gated_attention(self) -> bool {
        self == Arch::Qwen3_5
    }

    /// Whether a sparse layer also runs a shared expert (a SwiGLU MLP every token takes, scaled
    /// by `σ(shared_expert_gate · x)`) beside its routed experts: Qwen3.5-MoE's.
    pub fn shared_expert(self) -> bool {
        self == Arch::Qwen3_5
    }

    /// Whether LoRA's `gate_proj`/`up_proj`/`down_proj` targets adapt the routed experts' stacked
    /// weights (PEFT's conversion of them to `target_parameters`, which it does for Qwen3-MoE).
    /// On Qwen3.5-MoE PEFT matches them to the shared expert's `nn.Linear`s and leaves the
    /// routed experts (3-D parameters, not modules) alone: so do we.
    pub fn targets_reach_experts(self) -> bool {
        self == Arch::Qwen3
    }

    /// Whether the model's RMSNorms compute `x̂·(1 + w)` (the stored weight is the offset from
    /// one): Qwen3.5's; the others scale by `w`.
    pub fn zero_centred_norms(self) -> bool {
        self == Arch::Qwen3_5
    }

    /// A norm's gain from its stored weight `w`: `w`, or `1 + w` for zero-centred norms. Every
    /// forward path (training, dense decode, paged serving) scales by this.
    pub(super) fn norm_gain(self, w: Cow<'_, Tensor>) -> candle_core::Result<Cow<'_, Tensor>> {
        Ok(match self.zero_centred_norms() {
            true => Cow::Owned((&*w + 1.0)?),
            false => w,
        })
    }

    /// How [`super::params::init_random`] draws parameter `name`.
    pub(super) fn init_of(self, name: &str) -> super::params::Init {
        use super::params::Init;
        match self {
            Arch::Qwen3_5 => qwen3_5::init_of(name),
            Arch::Qwen3 | Arch::Instella if name.ends_with("norm.weight") => Init::Ones,
            Arch::Qwen3 | Arch::Instella => Init::Normal,
        }
    }
}
