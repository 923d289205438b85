//! The recipe's sections other than `train` and `publish`.
//!
//! Every struct denies unknown fields; defaults are the values a careful operator would pick
//! and are spelled out in docs/recipes.md. Ranges and cross-field rules live in `validate.rs`, so
//! that all of them can be reported at once.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::publish::Publish;
use super::train::Train;

/// A whole recipe. See docs/recipes.md for every field, its type, default and range.
///
/// Load it with [`Recipe::from_path`] or [`Recipe::from_str`]: they check the rules the type
/// cannot express and read `train.method` by its `kind` tag. Deserializing `Recipe` through
/// another serde format skips both. Serializing it (`recipe show --json`) gives a document
/// with every default filled in that loads back to the same value.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Recipe {
    pub meta: Meta,
    pub hardware: Hardware,
    #[serde(default)]
    pub autotune: Autotune,
    pub model: Model,
    pub data: Data,
    pub train: Train,
    #[serde(default)]
    pub eval: Eval,
    #[serde(default)]
    pub quantize: Quantize,
    #[serde(default)]
    pub serve: Serve,
    #[serde(default)]
    pub publish: Publish,
    #[serde(default)]
    pub receipt: Receipt,
}

pub(crate) fn yes() -> bool {
    true
}

// ---- meta ----

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Meta {
    pub project: String,
    /// Names the run's directory, so limited to `[A-Za-z0-9._-]`.
    pub run_name: String,
    #[serde(default = "Meta::default_seed")]
    pub seed: u64,
    #[serde(default = "Meta::default_license")]
    pub license: String,
    #[serde(default)]
    pub description: String,
}

impl Meta {
    fn default_seed() -> u64 {
        2048
    }
    fn default_license() -> String {
        "apache-2.0".into()
    }
}

// ---- hardware ----

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Hardware {
    pub name: HardwareName,
    /// Accelerators used; 0 runs on the host CPU.
    pub gpus: u32,
    /// Compiler target (`gfx942`, `sm_90`, ...). Left empty in the file, it is filled from
    /// `name` at load time, so a loaded recipe always carries it.
    #[serde(default)]
    pub arch: String,
    /// Memory per accelerator the recipe was sized for; the plan warns when it differs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_gb: Option<u32>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HardwareName {
    Cpu,
    H100,
    H200,
    B200,
    Mi300x,
    Mi325x,
    Mi350x,
    Mi355x,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Vendor {
    Cpu,
    Nvidia,
    Amd,
}

impl HardwareName {
    pub fn vendor(self) -> Vendor {
        match self {
            HardwareName::Cpu => Vendor::Cpu,
            HardwareName::H100 | HardwareName::H200 | HardwareName::B200 => Vendor::Nvidia,
            HardwareName::Mi300x | HardwareName::Mi325x | HardwareName::Mi350x | HardwareName::Mi355x => Vendor::Amd,
        }
    }

    /// The one arch each name runs; `cpu` means the build host's own.
    pub fn default_arch(self) -> &'static str {
        match self {
            HardwareName::Cpu => "native",
            HardwareName::H100 | HardwareName::H200 => "sm_90",
            HardwareName::B200 => "sm_100",
            HardwareName::Mi300x | HardwareName::Mi325x => "gfx942",
            HardwareName::Mi350x | HardwareName::Mi355x => "gfx950",
        }
    }

    /// MI300-class Instinct boards: eight OAM GPUs on an xGMI mesh, where a 2- or 4-GPU group
    /// gets asymmetric link bandwidth, and ROCm needs the mandatory env keys.
    pub fn is_mi300_class(self) -> bool {
        self.vendor() == Vendor::Amd
    }
}

// ---- autotune ----

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Autotune {
    #[serde(default = "yes")]
    pub enabled: bool,
    #[serde(default)]
    pub policy: AutotunePolicy,
    #[serde(default = "Autotune::default_budget")]
    pub budget_seconds: u32,
    /// Where the ahead-of-time plan is read from or written to; the node picks when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plan: Option<String>,
    /// Bitwise-reproducible runs: the probe only considers deterministic kernels (no atomic
    /// accumulation). `false` lets it pick faster atomic ones when they win.
    #[serde(default = "yes")]
    pub deterministic: bool,
}

impl Autotune {
    fn default_budget() -> u32 {
        60
    }
}

impl Default for Autotune {
    fn default() -> Self {
        Autotune { enabled: true, policy: AutotunePolicy::AotOnly, budget_seconds: 60, plan: None, deterministic: true }
    }
}

/// Only ahead-of-time tuning: a run replays a recorded plan, so two runs of one recipe and
/// plan pick the same kernels. The enum has one value on purpose.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum AutotunePolicy {
    #[default]
    AotOnly,
}

impl<'de> Deserialize<'de> for AutotunePolicy {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        match s.as_str() {
            "aot_only" => Ok(AutotunePolicy::AotOnly),
            other => Err(serde::de::Error::custom(format_args!(
                "policy `{other}` is not allowed: only `aot_only` (tuning at run time would make \
                 kernel choice, and so results, differ between runs of the same recipe)"
            ))),
        }
    }
}

// ---- model ----

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Model {
    /// Hub id (`Qwen/Qwen3-8B`) or a local label; recorded in the receipt either way.
    pub name: String,
    #[serde(default)]
    pub family: ModelFamily,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<String>,
    /// Local directory with weights; the node never downloads at run time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// `byte` for the built-in byte tokenizer, or a path to a `tokenizer.json`; unset means the
    /// tokenizer stored beside the weights.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokenizer: Option<String>,
    #[serde(default)]
    pub dtype: Dtype,
    /// An inline shape; without `path`, weights are initialised from `meta.seed`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config: Option<ModelConfig>,
    /// Says that the run starts from weights drawn from `meta.seed` (`config` without
    /// `path`). Full training from scratch needs no word; an adapter (LoRA, QLoRA) on random
    /// weights learns nothing useful, so it is refused unless this is `true` or the run is
    /// given a base (`--init-from`).
    #[serde(default, skip_serializing_if = "is_false")]
    pub random_init: bool,
    /// A chat template (`.jinja` file, or a `tokenizer_config.json`) replacing the one the
    /// tokenizer ships; unset: the tokenizer's own, else the built-in ChatML.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chat_template: Option<String>,
    /// The chat template's `enable_thinking` (Qwen3: `false` makes the empty think block part
    /// of the prompt, so the model is not trained to write it).
    #[serde(default, skip_serializing_if = "is_false")]
    pub enable_thinking: bool,
}

fn is_false(b: &bool) -> bool {
    !*b
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ModelFamily {
    #[default]
    Qwen3,
    Qwen3Moe,
    /// Qwen3.5 / 3.6: gated DeltaNet layers mixed with full attention, dense or MoE.
    Qwen3Hybrid,
    Qwen3Vl,
    /// AMD Instella, an OLMo-style decoder.
    Instella,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Dtype {
    #[default]
    Bf16,
    Fp16,
    Fp32,
}

impl Dtype {
    /// The `train.precision` that computes in this dtype.
    pub fn precision(self) -> super::train::Precision {
        use super::train::Precision;
        match self {
            Dtype::Bf16 => Precision::Bf16,
            Dtype::Fp16 => Precision::Fp16,
            Dtype::Fp32 => Precision::Fp32,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelConfig {
    pub hidden_size: u32,
    pub num_layers: u32,
    pub num_heads: u32,
    pub num_kv_heads: u32,
    pub head_dim: u32,
    pub intermediate_size: u32,
    pub vocab_size: u32,
    #[serde(default = "ModelConfig::default_max_pos")]
    pub max_position_embeddings: u32,
    #[serde(default = "ModelConfig::default_rope_theta")]
    pub rope_theta: f64,
    #[serde(default = "ModelConfig::default_eps")]
    pub rms_norm_eps: f64,
    #[serde(default)]
    pub tie_word_embeddings: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub moe: Option<MoeConfig>,
    /// The Gated DeltaNet layers of a `qwen3_hybrid` model (Qwen3.5/3.6).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub linear_attention: Option<LinearAttentionConfig>,
}

impl ModelConfig {
    fn default_max_pos() -> u32 {
        40_960
    }
    fn default_rope_theta() -> f64 {
        1_000_000.0
    }
    fn default_eps() -> f64 {
        1e-6
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MoeConfig {
    pub num_experts: u32,
    pub experts_per_token: u32,
    pub expert_intermediate_size: u32,
    /// Renormalise the chosen experts' probabilities to sum to one (HF `norm_topk_prob`).
    #[serde(default = "MoeConfig::default_norm_topk_prob")]
    pub norm_topk_prob: bool,
    /// Weight of the load-balancing loss added to the training loss; 0 leaves it out (HF adds
    /// it only with `output_router_logits`).
    #[serde(default)]
    pub router_aux_loss_coef: f64,
}

impl MoeConfig {
    fn default_norm_topk_prob() -> bool {
        true
    }
}

/// A Qwen3.5/3.6 hybrid's Gated DeltaNet layers (HF `Qwen3_5TextConfig`'s `linear_*` fields).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LinearAttentionConfig {
    /// Every `full_attention_interval`-th layer attends, the others are linear (HF's default 4:
    /// three Gated DeltaNet layers, then one attention layer).
    #[serde(default = "LinearAttentionConfig::default_interval")]
    pub full_attention_interval: u32,
    pub num_key_heads: u32,
    pub num_value_heads: u32,
    pub key_head_dim: u32,
    pub value_head_dim: u32,
    /// Taps of the causal conv over the q/k/v projection.
    #[serde(default = "LinearAttentionConfig::default_conv")]
    pub conv_kernel: u32,
    /// The share of an attention head's dims RoPE rotates.
    #[serde(default = "LinearAttentionConfig::default_rotary")]
    pub partial_rotary_factor: f64,
}

impl LinearAttentionConfig {
    fn default_interval() -> u32 {
        4
    }
    fn default_conv() -> u32 {
        4
    }
    fn default_rotary() -> f64 {
        0.25
    }

    /// HF's `layer_types` for `layers` layers: layer `i` attends when `(i + 1) % interval == 0`.
    pub fn attends(&self, layer: u32) -> bool {
        (layer + 1).is_multiple_of(self.full_attention_interval.max(1))
    }
}

// ---- data ----

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Data {
    pub source: DataSource,
    #[serde(default)]
    pub format: DataFormat,
    /// JSONL files (`jsonl`), or a pre-materialised local copy (`hf`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub paths: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hf_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<String>,
    #[serde(default = "Data::default_split")]
    pub split: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generator: Option<Generator>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_samples: Option<u64>,
    #[serde(default = "Data::default_seq_len")]
    pub seq_len: u32,
    #[serde(default = "yes")]
    pub packing: bool,
    #[serde(default = "yes")]
    pub shuffle: bool,
    #[serde(default)]
    pub dedupe: Dedupe,
    /// Record field → the table column holding it, for Parquet/Arrow files whose columns are
    /// named otherwise (`messages: conversations`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub columns: BTreeMap<String, String>,
}

impl Data {
    fn default_split() -> String {
        "train".into()
    }
    fn default_seq_len() -> u32 {
        4096
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DataSource {
    /// Local JSONL files listed in `data.paths`.
    Jsonl,
    /// Built by a seeded generator; the same seed gives the same bytes.
    Generated,
    /// A hub dataset id, recorded for provenance; must already be on disk.
    Hf,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DataFormat {
    /// `{"messages": [{"role", "content"}...]}`
    #[default]
    Chat,
    /// `{"instruction", "input"?, "output"}`
    Instruction,
    /// `{"text"}`
    Text,
    /// `{"prompt", "chosen", "rejected"}`
    Preference,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Generator {
    pub kind: GeneratorKind,
    pub seed: u64,
    pub count: u32,
    /// The task families drawn (the others skipped); every family when empty.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub families: Vec<crate::data::TaskFamily>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GeneratorKind {
    /// Small verifiable tasks (parity, word questions, reviews, tool calls) with reference answers.
    Tasks,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Dedupe {
    #[serde(default = "yes")]
    pub exact: bool,
    /// MinHash Jaccard threshold for near-duplicates; unset turns near-dedupe off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub near_threshold: Option<f64>,
}

impl Default for Dedupe {
    fn default() -> Self {
        Dedupe { exact: true, near_threshold: None }
    }
}

// ---- eval ----

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Eval {
    #[serde(default = "yes")]
    pub enabled: bool,
    #[serde(default)]
    pub holdout: Holdout,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub every_steps: Option<u64>,
    #[serde(default)]
    pub tasks: Vec<String>,
    #[serde(default)]
    pub fewshot: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub regression: Option<Regression>,
}

impl Default for Eval {
    fn default() -> Self {
        Eval {
            enabled: true,
            holdout: Holdout::default(),
            every_steps: None,
            tasks: Vec::new(),
            fewshot: 0,
            regression: None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Holdout {
    #[serde(default = "Holdout::default_fraction")]
    pub fraction: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_samples: Option<u32>,
}

impl Holdout {
    fn default_fraction() -> f64 {
        0.02
    }
}

impl Default for Holdout {
    fn default() -> Self {
        Holdout { fraction: Holdout::default_fraction(), max_samples: None }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Regression {
    /// The model to compare against; usually the base `model.name`.
    pub baseline: String,
    /// Largest allowed drop on any task, in percent of the baseline's score.
    pub threshold_pct: f64,
}

// ---- quantize ----

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Quantize {
    #[serde(default)]
    pub enabled: bool,
    #[serde(default)]
    pub scheme: QuantScheme,
    /// Per-channel scales (per-tensor when false).
    #[serde(default = "yes")]
    pub per_channel: bool,
    #[serde(default = "Quantize::default_calibration")]
    pub calibration_samples: u32,
}

impl Quantize {
    fn default_calibration() -> u32 {
        512
    }
}

impl Default for Quantize {
    fn default() -> Self {
        Quantize { enabled: false, scheme: QuantScheme::Fp8, per_channel: true, calibration_samples: 512 }
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum QuantScheme {
    #[default]
    Fp8,
    Mxfp4,
    Int8,
    Int4,
}

// ---- serve ----

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Serve {
    #[serde(default = "yes")]
    pub enabled: bool,
    #[serde(default = "Serve::default_host")]
    pub host: String,
    #[serde(default = "Serve::default_port")]
    pub port: u16,
    #[serde(default = "Serve::default_max_model_len")]
    pub max_model_len: u32,
    #[serde(default = "Serve::default_max_batch")]
    pub max_batch: u32,
    #[serde(default = "Serve::default_tp")]
    pub tensor_parallel: u32,
    /// Split Qwen3 `<think>` blocks out of the answer.
    #[serde(default = "yes")]
    pub reasoning: bool,
    #[serde(default)]
    pub tool_calls: bool,
}

impl Serve {
    fn default_host() -> String {
        "127.0.0.1".into()
    }
    fn default_port() -> u16 {
        8000
    }
    fn default_max_model_len() -> u32 {
        8192
    }
    fn default_max_batch() -> u32 {
        16
    }
    fn default_tp() -> u32 {
        1
    }
}

impl Default for Serve {
    fn default() -> Self {
        Serve {
            enabled: true,
            host: Serve::default_host(),
            port: Serve::default_port(),
            max_model_len: Serve::default_max_model_len(),
            max_batch: Serve::default_max_batch(),
            tensor_parallel: 1,
            reasoning: true,
            tool_calls: false,
        }
    }
}

// ---- receipt ----

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Receipt {
    /// Where the receipt JSON is written; the node picks when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<String>,
    #[serde(default = "ReceiptItem::all")]
    pub include: Vec<ReceiptItem>,
}

impl Default for Receipt {
    fn default() -> Self {
        Receipt { output: None, include: ReceiptItem::all() }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReceiptItem {
    /// BLAKE3 of the recipe bytes; always required.
    RecipeHash,
    DatasetHashes,
    /// Versions of the node, trainer and kernels.
    CodeVersion,
    /// Accelerator model, arch, driver and runtime versions.
    Hardware,
    /// The autotune plan's hash.
    Plan,
    EvalReport,
    EnergyKwh,
    /// Root hash of the signed event log for the run.
    EventLog,
    Checkpoints,
}

impl ReceiptItem {
    pub fn all() -> Vec<ReceiptItem> {
        use ReceiptItem::*;
        vec![RecipeHash, DatasetHashes, CodeVersion, Hardware, Plan, EvalReport, EnergyKwh, EventLog, Checkpoints]
    }
}
