//! The decoder models (Qwen3, Qwen3-MoE, Instella, the Qwen3.5/3.6 hybrids, dense and MoE) with an
//! explicit forward/backward per layer, LoRA and full fine-tuning.
//!
//! The ops live in `mindxtrain_kernels` (each with its own forward/backward, gradient-checked
//! in f64); this module wires them into one decoder engine with HF/PEFT tensor names, and each
//! architecture is a folder (`qwen3/`, `instella/`, `qwen3_5/`) and an arm of [`Arch`] saying what sets it
//! apart ([`arch`]).
//!
//! * [`LmConfig`]: the shape and [`Arch`], from and to HF `config.json`; with [`MoeShape`]
//!   Qwen3-MoE, whose sparse layers' MLP is [`moe`] (router, top-k experts, load-balancing loss).
//! * [`CausalLm`]: parameters by HF name, [`CausalLm::forward_backward`] (one micro-batch: summed
//!   token loss and gradients), [`CausalLm::logits`];
//!   [`CausalLm::decode`] runs new tokens over a [`KvCache`] (generation: [`crate::generate`]);
//!   [`CausalLm::forward_paged`] runs a serving step (many sequences, a paged cache, an
//!   [`AdapterStack`] mixing adapters row by row: [`crate::infer`]).
//! * [`Adapters`]: LoRA with PEFT names and init; [`merge_lora`].
//! * [`preference`]: DPO and ORPO on a [`crate::batch::PreferenceBatch`];
//!   [`CausalLm::forward_backward_logps`]: any objective of per-token log-probs (they and RL's
//!   losses in [`crate::rl`] are written that way).
//! * [`Nf4Tensor`]: QLoRA's 4-bit quantiser; the base weights it makes (projections, and on a
//!   Qwen3-MoE model the experts' stacked weights) stay in NF4 on the model's device.

mod adapter_stack;
mod arch;
mod attention_parts;
mod block;
mod cache_spec;
mod causal_lm;
mod config;
mod decode;
#[cfg(all(test, feature = "cuda"))]
mod gpu_tests;
mod hooks;
mod instella;
mod linear_attention;
mod lora;
mod mlp;
pub mod moe;
#[cfg(test)]
mod moe_tests;
mod nf4;
mod objective;
mod packed;
mod paged;
mod paged_linear;
mod params;
pub mod preference;
#[cfg(test)]
mod qlora_moe_tests;
mod qwen3;
mod qwen3_5;
mod recurrent;
pub(crate) mod rng;
#[cfg(test)]
mod tests;

pub use adapter_stack::AdapterStack;
pub use arch::{Arch, QkNorm};
pub use cache_spec::{CacheSpec, LayerSpec, state_dtype};
pub use causal_lm::{CausalLm, StepOptions, StepOutput, Trainable};
pub use config::{HybridShape, LayerKind, LmConfig, MoeShape};
pub use decode::KvCache;
pub use hooks::{NoHooks, Stage, StepHooks, stage_of};
pub use lora::{Adapters, ExpertProj, LoraConfig, adapter_name, expert_adapter_name, merge_lora};
pub use nf4::Nf4Tensor;
pub use objective::{ObjectiveOutput, ObjectiveValue};
pub use packed::Packing;
pub use paged::{LayerCache, PagedInputs, RopeTables};
pub use paged_linear::StateSlots;
pub use params::{EMBED, FINAL_NORM, LM_HEAD, Norm, Params, Proj, base_weight_name, expected_shapes, norm_name};
pub use preference::{DpoForm, PreferenceLoss, PreferenceOutput, row_sums};
pub use recurrent::{RecurrentState, StatePool};
/// Gradients (or parameters) by HF or PEFT name.
pub type Grads = std::collections::BTreeMap<String, candle_core::Tensor>;

use candle_core::DType;

/// Why the model could not be built or run.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error("model config: {0}")]
    Config(String),
    #[error("missing parameter {0}")]
    MissingParam(String),
    #[error("unexpected parameter {0}")]
    UnexpectedParam(String),
    #[error("parameter {name}: shape {got:?}, expected {expected:?}")]
    Shape { name: String, expected: Vec<usize>, got: Vec<usize> },
    #[error("parameter {name}: dtype {got:?}, expected {expected:?}")]
    DType { name: String, expected: DType, got: DType },
    #[error("batch: {0}")]
    Batch(String),
    #[error("lora: {0}")]
    Lora(String),
    #[error("tensor op: {0}")]
    Tensor(#[from] candle_core::Error),
    /// A path this build has not built for the model's architecture.
    #[error("not built yet: {0}")]
    NotBuilt(String),
}
