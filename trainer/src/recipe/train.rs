//! The `train` section: the method (tagged by `kind`), optimizer, schedule, budget, batch,
//! precision and the process environment.

use std::collections::BTreeMap;
use std::fmt;

use serde::de::{EnumAccess, VariantAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize};

use super::de::KIND_TAGGED;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Train {
    pub method: Method,
    #[serde(default)]
    pub optimizer: Optimizer,
    #[serde(default)]
    pub schedule: Schedule,
    #[serde(default)]
    pub budget: Budget,
    #[serde(default)]
    pub batch: Batch,
    /// The dtype the run computes in. Unset: `model.dtype`'s (filled in at load, so a loaded
    /// recipe always has it); set, it must be that dtype (`recipe check`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub precision: Option<Precision>,
    /// Activation checkpointing (recompute each block's activations in the backward) as a
    /// constraint on the plan: `true` always, `false` never; unset lets the probe choose.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gradient_checkpointing: Option<bool>,
    /// Shard parameters, gradients and optimizer state across the ranks: ZeRO-3, FSDP-style
    /// (the same as `distributed.sharding: zero3`).
    #[serde(default)]
    pub fsdp: bool,
    /// How a run on several ranks (GPUs, or CPU processes) shares its work.
    #[serde(default)]
    pub distributed: Distributed,
    #[serde(default)]
    pub checkpoint: Checkpoint,
    #[serde(default = "Train::default_log_every")]
    pub log_every_steps: u32,
    /// Variables set for the training process. MI300-class recipes must carry
    /// [`super::mandatory_rocm_env_keys`]; a plan may change values but never drop them.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
}

impl Train {
    fn default_log_every() -> u32 {
        10
    }
}

/// How the weights are trained; written as a mapping whose `kind` picks the variant.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Method {
    /// Supervised fine-tuning of every weight.
    Full,
    /// Continued pretraining on raw text.
    Cpt,
    Lora(Lora),
    Qlora(Qlora),
    Dpo(Dpo),
    Orpo(Orpo),
    Kto(Kto),
    Grpo(Grpo),
    Gspo(Gspo),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MethodKind {
    Full,
    Cpt,
    Lora,
    Qlora,
    Dpo,
    Orpo,
    Kto,
    Grpo,
    Gspo,
}

const METHOD_KINDS: &[&str] = &["full", "cpt", "lora", "qlora", "dpo", "orpo", "kto", "grpo", "gspo"];

impl Method {
    pub fn kind(&self) -> MethodKind {
        match self {
            Method::Full => MethodKind::Full,
            Method::Cpt => MethodKind::Cpt,
            Method::Lora(_) => MethodKind::Lora,
            Method::Qlora(_) => MethodKind::Qlora,
            Method::Dpo(_) => MethodKind::Dpo,
            Method::Orpo(_) => MethodKind::Orpo,
            Method::Kto(_) => MethodKind::Kto,
            Method::Grpo(_) => MethodKind::Grpo,
            Method::Gspo(_) => MethodKind::Gspo,
        }
    }

    /// The adapter trained, if any: the method's own for `lora`/`qlora`, the optional `lora`
    /// block for preference and RL methods.
    pub fn adapter(&self) -> Option<&Lora> {
        match self {
            Method::Lora(l) => Some(l),
            Method::Qlora(q) => Some(&q.lora),
            Method::Dpo(m) => m.lora.as_ref(),
            Method::Orpo(m) => m.lora.as_ref(),
            Method::Kto(m) => m.lora.as_ref(),
            Method::Grpo(m) => m.lora.as_ref(),
            Method::Gspo(m) => m.lora.as_ref(),
            Method::Full | Method::Cpt => None,
        }
    }
}

impl<'de> Deserialize<'de> for Method {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Method;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a mapping with `kind`")
            }
            fn visit_enum<A: EnumAccess<'de>>(self, a: A) -> Result<Method, A::Error> {
                let (kind, v): (MethodKind, _) = a.variant()?;
                Ok(match kind {
                    MethodKind::Full => v.unit_variant().map(|()| Method::Full)?,
                    MethodKind::Cpt => v.unit_variant().map(|()| Method::Cpt)?,
                    MethodKind::Lora => Method::Lora(v.newtype_variant()?),
                    MethodKind::Qlora => Method::Qlora(v.newtype_variant()?),
                    MethodKind::Dpo => Method::Dpo(v.newtype_variant()?),
                    MethodKind::Orpo => Method::Orpo(v.newtype_variant()?),
                    MethodKind::Kto => Method::Kto(v.newtype_variant()?),
                    MethodKind::Grpo => Method::Grpo(v.newtype_variant()?),
                    MethodKind::Gspo => Method::Gspo(v.newtype_variant()?),
                })
            }
        }
        d.deserialize_enum(KIND_TAGGED, METHOD_KINDS, V)
    }
}

/// The linear projections LoRA may adapt: a Qwen3 block's seven, a Gated DeltaNet layer's five
/// and a Qwen3.5-MoE layer's shared-expert gate (`qwen3_hybrid`). The MoE router (`gate`) is not listed:
/// adapting it destabilises expert routing, so it stays frozen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TargetModule {
    QProj,
    KProj,
    VProj,
    OProj,
    GateProj,
    UpProj,
    DownProj,
    /// A Gated DeltaNet layer's projections (Qwen3.5/3.6 hybrids; PEFT's `all-linear` reaches them).
    InProjQkv,
    InProjZ,
    InProjB,
    InProjA,
    OutProj,
    /// A Qwen3.5-MoE layer's `mlp.shared_expert_gate` (Linear H→1; PEFT's `all-linear` reaches it).
    SharedExpertGate,
}

impl TargetModule {
    /// Every projection any architecture here has (PEFT's `all-linear` on a Qwen3.5-MoE hybrid).
    pub const EVERY: [TargetModule; 13] = {
        use TargetModule::*;
        [
            QProj,
            KProj,
            VProj,
            OProj,
            GateProj,
            UpProj,
            DownProj,
            InProjQkv,
            InProjZ,
            InProjB,
            InProjA,
            OutProj,
            SharedExpertGate,
        ]
    };

    /// The recipe's default: a Qwen3 block's seven (on a hybrid, its attention and MLP ones).
    pub fn all() -> Vec<TargetModule> {
        use TargetModule::*;
        vec![QProj, KProj, VProj, OProj, GateProj, UpProj, DownProj]
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Lora {
    #[serde(default = "Lora::default_r")]
    pub r: u32,
    #[serde(default = "Lora::default_alpha")]
    pub alpha: u32,
    #[serde(default)]
    pub dropout: f64,
    #[serde(default = "TargetModule::all")]
    pub target_modules: Vec<TargetModule>,
    /// Scale by `alpha / sqrt(r)` instead of `alpha / r`.
    #[serde(default)]
    pub rslora: bool,
}

impl Lora {
    fn default_r() -> u32 {
        16
    }
    fn default_alpha() -> u32 {
        32
    }
}

impl Default for Lora {
    fn default() -> Self {
        Lora { r: 16, alpha: 32, dropout: 0.0, target_modules: TargetModule::all(), rslora: false }
    }
}

/// LoRA over a base quantized to `bits`. The fields of [`Lora`] are repeated rather than
/// flattened: serde's flatten buffers input and would lose locations and unknown-field checks.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(from = "QloraFields", into = "QloraFields")]
pub struct Qlora {
    pub lora: Lora,
    pub bits: u8,
}

#[derive(Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct QloraFields {
    #[serde(default = "Lora::default_r")]
    r: u32,
    #[serde(default = "Lora::default_alpha")]
    alpha: u32,
    #[serde(default)]
    dropout: f64,
    #[serde(default = "TargetModule::all")]
    target_modules: Vec<TargetModule>,
    #[serde(default)]
    rslora: bool,
    #[serde(default = "QloraFields::default_bits")]
    bits: u8,
}

impl QloraFields {
    fn default_bits() -> u8 {
        4
    }
}

impl From<QloraFields> for Qlora {
    fn from(f: QloraFields) -> Self {
        let lora =
            Lora { r: f.r, alpha: f.alpha, dropout: f.dropout, target_modules: f.target_modules, rslora: f.rslora };
        Qlora { lora, bits: f.bits }
    }
}

impl From<Qlora> for QloraFields {
    fn from(q: Qlora) -> Self {
        let l = q.lora;
        QloraFields {
            r: l.r,
            alpha: l.alpha,
            dropout: l.dropout,
            target_modules: l.target_modules,
            rslora: l.rslora,
            bits: q.bits,
        }
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DpoLoss {
    #[default]
    Sigmoid,
    Ipo,
    Hinge,
}

fn default_beta() -> f64 {
    0.1
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Dpo {
    #[serde(default = "default_beta")]
    pub beta: f64,
    #[serde(default)]
    pub loss: DpoLoss,
    #[serde(default)]
    pub label_smoothing: f64,
    /// Train an adapter instead of all weights.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lora: Option<Lora>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Orpo {
    #[serde(default = "default_beta")]
    pub beta: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lora: Option<Lora>,
}

fn one() -> f64 {
    1.0
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Kto {
    #[serde(default = "default_beta")]
    pub beta: f64,
    #[serde(default = "one")]
    pub desirable_weight: f64,
    #[serde(default = "one")]
    pub undesirable_weight: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lora: Option<Lora>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Reward {
    /// The completion's final answer equals the reference exactly.
    ExactMatch,
    /// The final answers parse as numbers and are equal.
    NumericMatch,
    /// The completion follows the expected `<think>`/answer layout.
    Format,
    /// Penalises completions near `max_new_tokens`.
    Length,
    /// Tool calls are well-formed JSON (`{"name": …, "arguments": {…}}`) where the reference
    /// calls a tool, and absent where it does not.
    ToolCall,
}

fn default_generations() -> u32 {
    4
}
fn default_new_tokens() -> u32 {
    512
}
fn default_rewards() -> Vec<Reward> {
    vec![Reward::NumericMatch, Reward::Format]
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Grpo {
    #[serde(default = "default_generations")]
    pub num_generations: u32,
    #[serde(default = "Grpo::default_kl")]
    pub kl_coef: f64,
    #[serde(default = "Grpo::default_clip")]
    pub clip_epsilon: f64,
    #[serde(default = "default_new_tokens")]
    pub max_new_tokens: u32,
    #[serde(default = "one")]
    pub temperature: f64,
    #[serde(default = "default_rewards")]
    pub rewards: Vec<Reward>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lora: Option<Lora>,
}

impl Grpo {
    fn default_kl() -> f64 {
        0.04
    }
    fn default_clip() -> f64 {
        0.2
    }
}

/// GSPO clips whole-sequence ratios, so its clip range is orders of magnitude smaller than
/// GRPO's per-token one, and it usually runs without a KL term.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Gspo {
    #[serde(default = "default_generations")]
    pub num_generations: u32,
    #[serde(default)]
    pub kl_coef: f64,
    #[serde(default = "Gspo::default_clip")]
    pub clip_epsilon: f64,
    #[serde(default = "default_new_tokens")]
    pub max_new_tokens: u32,
    #[serde(default = "one")]
    pub temperature: f64,
    #[serde(default = "default_rewards")]
    pub rewards: Vec<Reward>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lora: Option<Lora>,
}

impl Gspo {
    fn default_clip() -> f64 {
        4e-4
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Optimizer {
    #[serde(default)]
    pub name: OptimizerName,
    #[serde(default = "Optimizer::default_lr")]
    pub lr: f64,
    #[serde(default = "Optimizer::default_betas")]
    pub betas: [f64; 2],
    #[serde(default = "Optimizer::default_eps")]
    pub eps: f64,
    #[serde(default = "Optimizer::default_wd")]
    pub weight_decay: f64,
    /// Global gradient-norm clip; 0 turns clipping off.
    #[serde(default = "one")]
    pub grad_clip: f64,
}

impl Optimizer {
    fn default_lr() -> f64 {
        1e-4
    }
    fn default_betas() -> [f64; 2] {
        [0.9, 0.95]
    }
    fn default_eps() -> f64 {
        1e-8
    }
    fn default_wd() -> f64 {
        0.1
    }
}

impl Default for Optimizer {
    fn default() -> Self {
        Optimizer {
            name: OptimizerName::AdamW,
            lr: Self::default_lr(),
            betas: Self::default_betas(),
            eps: Self::default_eps(),
            weight_decay: Self::default_wd(),
            grad_clip: 1.0,
        }
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OptimizerName {
    #[default]
    #[serde(rename = "adamw")]
    AdamW,
    #[serde(rename = "adamw_8bit")]
    AdamW8bit,
    Lion,
    Adafactor,
    Sgd,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Schedule {
    #[serde(default)]
    pub kind: ScheduleKind,
    #[serde(default = "Schedule::default_warmup")]
    pub warmup_ratio: f64,
    /// Final learning rate as a fraction of `optimizer.lr`.
    #[serde(default)]
    pub min_lr_ratio: f64,
    /// `wsd` only: fraction of steps spent in the final decay.
    #[serde(default = "Schedule::default_decay")]
    pub decay_ratio: f64,
}

impl Schedule {
    fn default_warmup() -> f64 {
        0.03
    }
    fn default_decay() -> f64 {
        0.1
    }
}

impl Default for Schedule {
    fn default() -> Self {
        Schedule { kind: ScheduleKind::Cosine, warmup_ratio: 0.03, min_lr_ratio: 0.0, decay_ratio: 0.1 }
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ScheduleKind {
    #[default]
    Cosine,
    Linear,
    Constant,
    /// Warmup, stable, decay.
    Wsd,
}

/// When training stops: after `epochs`, after `max_steps` optimizer steps, whichever first.
/// Fields default to unset so that writing only one of them does not silently keep the other.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Budget {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub epochs: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_steps: Option<u64>,
}

impl Default for Budget {
    fn default() -> Self {
        Budget { epochs: Some(1), max_steps: None }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Batch {
    #[serde(default = "Batch::one")]
    pub per_device: u32,
    #[serde(default = "Batch::one")]
    pub grad_accum: u32,
}

impl Batch {
    fn one() -> u32 {
        1
    }
}

impl Default for Batch {
    fn default() -> Self {
        Batch { per_device: 1, grad_accum: 1 }
    }
}

/// What a run on several ranks keeps on every rank and what it shards (docs/recipes.md).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Sharding {
    /// Plain data parallel: every rank keeps everything; gradients are all-reduced.
    #[default]
    None,
    /// Optimizer state sharded (each tensor's on one rank); updated weights all-gathered.
    Zero1,
    /// ZeRO-1, and each gradient reduced only to the rank that updates it.
    Zero2,
    /// ZeRO-2, and each weight kept only on its rank, gathered block by block (FSDP).
    Zero3,
}

impl Sharding {
    pub fn name(self) -> &'static str {
        match self {
            Sharding::None => "none",
            Sharding::Zero1 => "zero1",
            Sharding::Zero2 => "zero2",
            Sharding::Zero3 => "zero3",
        }
    }
}

/// `train.distributed`: how ranks share a run's work.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Distributed {
    /// Unset: `zero3` when `train.fsdp` is true, else `none`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sharding: Option<Sharding>,
    /// Gradients are reduced in buckets of about this many MiB while the backward pass goes on.
    #[serde(default = "Distributed::default_bucket_mb")]
    pub bucket_mb: f64,
    /// A collective (or a rank joining) that takes longer than this ends the run with an error
    /// naming the rank it waited for.
    #[serde(default = "Distributed::default_timeout")]
    pub timeout_seconds: u32,
}

impl Distributed {
    fn default_bucket_mb() -> f64 {
        25.0
    }
    fn default_timeout() -> u32 {
        1800
    }

    /// The sharding a run uses, with `train.fsdp` read as ZeRO-3.
    pub fn sharding(&self, fsdp: bool) -> Sharding {
        self.sharding.unwrap_or(if fsdp { Sharding::Zero3 } else { Sharding::None })
    }

    pub fn bucket_bytes(&self) -> usize {
        ((self.bucket_mb * (1 << 20) as f64) as usize).max(1)
    }
}

impl Default for Distributed {
    fn default() -> Self {
        Distributed { sharding: None, bucket_mb: Self::default_bucket_mb(), timeout_seconds: Self::default_timeout() }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Precision {
    Bf16,
    Fp16,
    Fp32,
    /// FP8 matmuls with BF16 master weights; accelerators only.
    Fp8,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Checkpoint {
    /// Unset: only at the end of training.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub every_steps: Option<u64>,
    #[serde(default = "Checkpoint::default_keep")]
    pub keep_last: u32,
}

impl Checkpoint {
    fn default_keep() -> u32 {
        2
    }
}

impl Default for Checkpoint {
    fn default() -> Self {
        Checkpoint { every_steps: None, keep_last: 2 }
    }
}
