//! The Qwen3 model: parameters, the training step (forward with a tape, explicit backward),
//! logits for evaluation (generation: [`super::KvCache`], [`crate::generate`]).

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};

use candle_core::{DType, Device, Tensor};
use mindxtrain_kernels::cross_entropy::{self, Labels};
use mindxtrain_kernels::{KernelConfig, attention, embedding, linear, lm_head_ce, rmsnorm, rope};

use super::block::{BlockTape, Grads, StepCtx, accumulate};
use super::hooks::{NoHooks, Stage, StepHooks};
use super::lora::Adapters;
use super::moe::{self, RouterStats};
use super::nf4::{Nf4Experts, Nf4Projection};
use super::params::{self, EMBED, FINAL_NORM, LM_HEAD, Params, Proj, base_weight_name};
use super::{LmConfig, ModelError};
use crate::batch::{IGNORE, PackedBatch};

/// Which weights a step computes gradients for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trainable {
    /// Every base parameter (full fine-tuning, pretraining). Adapters, if passed, are applied
    /// but frozen.
    Full,
    /// Only the adapters; the base is frozen and no base gradient is computed.
    Adapters,
}

/// Switches of one training step.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepOptions {
    /// Keep only each block's input in the forward and recompute the block in the backward.
    pub activation_checkpointing: bool,
    /// Seed of this step's LoRA dropout masks (derive it from the run seed and step).
    pub dropout_seed: u64,
    /// Multiplies the loss before differentiation: gradients are those of
    /// `loss_scale · loss_sum`. Pass `1 / total target tokens of the optimizer step` to get
    /// the per-token mean's gradient accumulated across micro-batches directly; `loss_sum`
    /// itself is reported unscaled.
    pub loss_scale: f64,
}

impl Default for StepOptions {
    fn default() -> Self {
        StepOptions { activation_checkpointing: false, dropout_seed: 0, loss_scale: 1.0 }
    }
}

/// The result of one forward/backward on a micro-batch.
#[derive(Debug, Clone)]
pub struct StepOutput {
    /// Sum of the token losses (natural log), unscaled.
    pub loss_sum: f64,
    /// Tokens that carried a loss.
    pub target_tokens: usize,
    /// Gradients of `loss_scale · loss_sum` by parameter (HF or PEFT name), plus, for a
    /// Qwen3-MoE model with `router_aux_loss_coef > 0`, of `loss_scale · target_tokens ·
    /// coef · aux_loss` (with `loss_scale = 1 / target_tokens`: HF's `loss + coef · aux_loss`).
    pub grads: BTreeMap<String, Tensor>,
    /// Qwen3-MoE's load-balancing loss over this micro-batch's sparse layers (HF's
    /// `aux_loss`, unweighted; 1 is perfect balance); 0 for a dense model.
    pub aux_loss: f64,
}

/// Qwen3 dense decoder with HF-named parameters.
#[derive(Debug, Clone)]
pub struct CausalLm {
    pub(super) config: LmConfig,
    pub(super) params: Params,
    /// Linear weights held in NF4 (QLoRA); absent from `params` then.
    quantized: BTreeMap<String, Nf4Projection>,
    /// Sparse layers' stacked expert weights held in NF4 (QLoRA), by name; absent from
    /// `params` then.
    quantized_experts: BTreeMap<String, Nf4Experts>,
    /// Serving's packed projection groups, by layer ([`super::packed`]); the grouped
    /// parameters in `params` are then views of these.
    pub(super) packed: BTreeMap<(usize, super::Packing), Tensor>,
    device: Device,
    dtype: DType,
    /// The plan's kernel choices this model runs with (the default until a runner sets them).
    kernels: KernelConfig,
}

/// A block's saved state: the full tape, or only its input when checkpointing.
enum Saved {
    Tape(Box<BlockTape>),
    Input(Tensor),
}

/// What the forward keeps for the backward, beyond the blocks.
pub(super) struct Tape {
    ids: Tensor,
    blocks: Vec<Saved>,
    x_last: Tensor,
    rstd_f: Tensor,
    xf: Tensor,
    head: HeadTape,
    pub(super) labels: Labels,
    checkpointing: bool,
    /// Each sparse layer's routing statistics (Qwen3-MoE).
    router_stats: Vec<RouterStats>,
}

/// What the loss head keeps for its backward. On the CPU, the logits (small at CPU shapes, and
/// the fused cross-entropy kernel over them is the fastest path there); on a GPU only the row
/// log-sum-exp: `[tokens × vocab]` logits would be most of a LoRA step's memory there (5 GB in
/// bf16 at 8×2048 tokens, twice with their gradient), so `lm_head_ce` makes them again chunk
/// by chunk in the backward.
enum HeadTape {
    Logits { logits: Tensor, lse: Tensor },
    Chunked { lse: Tensor },
}

/// Every weight of `config` drawn on `device` for timing (norms 1, the rest N(0, 0.02)); those
/// named in `to_host` are moved to the host as soon as each is drawn.
fn draw_for_timing(
    config: &LmConfig,
    dtype: DType,
    device: &Device,
    to_host: &BTreeSet<String>,
) -> Result<Params, ModelError> {
    let mut p = Params::new();
    for (name, shape) in params::expected_shapes(config) {
        let t = if name.ends_with("norm.weight") {
            Tensor::ones(shape.as_slice(), dtype, device)?
        } else {
            Tensor::randn(0f32, 0.02, shape.as_slice(), device)?.to_dtype(dtype)?
        };
        let t = if to_host.contains(&name) { t.to_device(&Device::Cpu)? } else { t };
        p.insert(name, t);
    }
    Ok(p)
}

/// The weights QLoRA holds in NF4 ([`CausalLm::quantize_nf4`]): every projection of each layer's
/// kind (attention's four or a Gated DeltaNet's five, and a dense MLP's three), and on a sparse
/// layer the two stacked expert weights. A Qwen3.5-MoE shared expert's gate logit (`[1, H]`) stays
/// dense, as the router does: it scales the shared expert's whole output. Expert names a dense
/// layer lacks are simply absent.
fn nf4_targets(config: &LmConfig) -> Vec<String> {
    let mut names = Vec::new();
    for layer in 0..config.num_hidden_layers {
        let projs = Proj::of_layer(config, layer).into_iter().filter(|p| *p != Proj::SharedExpertGate);
        names.extend(projs.map(|proj| base_weight_name(layer, proj)));
        names.extend([moe::gate_up_name(layer), moe::down_name(layer)]);
    }
    names
}

/// Vocabulary columns per `lm_head_ce` chunk: 1 GiB of bf16 logits at 8×2048 tokens, and
/// within 1.3–1.7× of the GEMM floor on an H100 (docs/benchmarks.md).
const HEAD_CHUNK: usize = 32_768;

impl CausalLm {
    /// A model from named parameters; every HF name must be present with its shape, one
    /// floating dtype throughout, nothing extra.
    /// Qwen3-MoE experts may come one tensor per expert (the Hub's files): they are stacked.
    pub fn new(config: LmConfig, mut params: Params, device: &Device) -> Result<CausalLm, ModelError> {
        config.validate()?;
        moe::fuse_experts(&config, &mut params)?;
        params::check_names_and_shapes(&params::expected_shapes(&config), &params)?;
        let dtype = params.get(EMBED).map(|t| t.dtype()).ok_or_else(|| ModelError::MissingParam(EMBED.into()))?;
        if !matches!(dtype, DType::F16 | DType::BF16 | DType::F32 | DType::F64) {
            return Err(ModelError::DType { name: EMBED.into(), expected: DType::F32, got: dtype });
        }
        let params =
            params.into_iter().map(|(k, v)| Ok((k, v.to_device(device)?))).collect::<Result<_, ModelError>>()?;
        Ok(CausalLm {
            config,
            params,
            quantized: BTreeMap::new(),
            quantized_experts: BTreeMap::new(),
            packed: BTreeMap::new(),
            device: device.clone(),
            dtype,
            kernels: KernelConfig::default(),
        })
    }

    /// Weights of the right shapes and scale drawn by the device's own generator (curand on a
    /// GPU): for timing, where values do not matter and an 8B host-side seeded draw would take
    /// most of a probe's budget. Not reproducible; train from [`CausalLm::init_random`].
    pub fn init_for_timing(config: &LmConfig, dtype: DType, device: &Device) -> Result<CausalLm, ModelError> {
        config.validate()?;
        CausalLm::new(config.clone(), draw_for_timing(config, dtype, device, &BTreeSet::new())?, device)
    }

    /// [`CausalLm::init_for_timing`] with QLoRA's base: each weight that [`CausalLm::quantize_nf4`]
    /// holds in NF4 is drawn on the device and moved to the host at once (the device holds one
    /// of them dense at a time), then all are quantised onto the device, so the probe of a QLoRA
    /// recipe times the NF4 base the run trains on, on a card the dense base overflows.
    pub fn init_for_timing_nf4(config: &LmConfig, dtype: DType, device: &Device) -> Result<CausalLm, ModelError> {
        config.validate()?;
        let targets: BTreeSet<String> = nf4_targets(config).into_iter().collect();
        let drawn = draw_for_timing(config, dtype, device, &targets)?;
        // `new` puts every tensor on the device it is given: the host, then quantised onto `device`.
        let mut m = CausalLm::new(config.clone(), drawn, &Device::Cpu)?;
        m.quantize_nf4_onto(device)?;
        Ok(m)
    }

    /// Seeded HF-like init (std 0.02, norms 1): same seed, same weights.
    pub fn init_random(config: &LmConfig, seed: u64, dtype: DType, device: &Device) -> Result<CausalLm, ModelError> {
        config.validate()?;
        CausalLm::new(config.clone(), params::init_random(config, seed, dtype, device)?, device)
    }

    pub fn config(&self) -> &LmConfig {
        &self.config
    }

    pub fn dtype(&self) -> DType {
        self.dtype
    }

    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The kernel choices every op of this model runs with.
    pub fn kernels(&self) -> &KernelConfig {
        &self.kernels
    }

    /// Runs every later op with `kernels` (the plan's choices; the session or runner that
    /// owns the model sets them once).
    pub fn set_kernels(&mut self, kernels: KernelConfig) {
        self.kernels = kernels;
    }

    /// The dense parameters (without NF4-quantised weights).
    pub fn params(&self) -> &Params {
        &self.params
    }

    /// For the optimizer's in-place updates; replacing a tensor with another shape or dtype
    /// breaks the model (the next step errors).
    /// Unpacks the projections ([`CausalLm::pack_projections`]): what the caller puts in the map
    /// is what the model reads.
    pub fn params_mut(&mut self) -> &mut Params {
        self.packed.clear();
        &mut self.params
    }

    /// QLoRA storage: moves every block projection into NF4, and on a Qwen3-MoE model every
    /// sparse layer's stacked expert weights (`gate_up_proj`, `down_proj`); they are dequantised
    /// when used. Embeddings, norms and the head stay dense, as in QLoRA, and so does the MoE
    /// router (`mlp.gate`): it is small (`[E, H]`), and its logits pick each token's experts, a
    /// discrete choice that 4-bit rounding would move. Each weight's dense copy is dropped as its
    /// NF4 copy is made, so at most one is held twice.
    pub fn quantize_nf4(&mut self) -> Result<(), ModelError> {
        let device = self.device.clone();
        self.quantize_nf4_onto(&device)
    }

    /// [`CausalLm::quantize_nf4`] on a model loaded on the host, leaving it on `device`: the NF4
    /// codes and the weights that stay dense go there, so a base that fits the device only in
    /// NF4 never sits there whole (QLoRA's point: a 4-bit base on a card its bf16 base overflows).
    pub fn quantize_nf4_onto(&mut self, device: &Device) -> Result<(), ModelError> {
        self.packed.clear();
        for name in nf4_targets(&self.config) {
            if let Some(w) = self.params.remove(&name) {
                self.insert_nf4(name, &w, device)?;
            }
        }
        if !self.device.same_device(device) {
            let params = std::mem::take(&mut self.params);
            self.params =
                params.into_iter().map(|(k, v)| Ok((k, v.to_device(device)?))).collect::<Result<_, ModelError>>()?;
            self.device = device.clone();
        }
        Ok(())
    }

    /// `w` (named `name`, one of [`nf4_targets`]) into the NF4 store on `device`.
    fn insert_nf4(&mut self, name: String, w: &Tensor, device: &Device) -> Result<(), ModelError> {
        if w.rank() == 3 {
            self.quantized_experts.insert(name, Nf4Experts::quantize(w, device)?);
        } else {
            self.quantized.insert(name, Nf4Projection::quantize(w, device)?);
        }
        Ok(())
    }

    pub fn is_quantized(&self) -> bool {
        !self.quantized.is_empty() || !self.quantized_experts.is_empty()
    }

    /// A sparse layer's stacked expert weight, if it is held in NF4.
    pub(super) fn nf4_experts(&self, name: &str) -> Option<&Nf4Experts> {
        self.quantized_experts.get(name)
    }

    /// A sparse layer's stacked expert weight as held: NF4 (expanded by each product that reads
    /// it) or dense.
    pub(super) fn expert_weight(&self, name: &str) -> Result<moe::ExpertWeight<'_>, ModelError> {
        Ok(match self.quantized_experts.get(name) {
            Some(q) => moe::ExpertWeight::Nf4(q),
            None => moe::ExpertWeight::Dense(self.weight(name)?),
        })
    }

    /// Bytes the NF4 base holds (codes and scales of every quantised weight).
    pub fn nf4_bytes(&self) -> usize {
        let dense: usize = self.quantized.values().map(Nf4Projection::storage_bytes).sum();
        dense + self.quantized_experts.values().map(Nf4Experts::storage_bytes).sum::<usize>()
    }

    pub(super) fn weight(&self, name: &str) -> Result<Cow<'_, Tensor>, ModelError> {
        if let Some(t) = self.params.get(name) {
            return Ok(Cow::Borrowed(t));
        }
        if let Some(q) = self.quantized_experts.get(name) {
            return Ok(Cow::Owned(q.dequantize(self.dtype)?));
        }
        match self.quantized.get(name) {
            Some(q) => Ok(Cow::Owned(q.dequantize(self.dtype)?)),
            None => Err(ModelError::MissingParam(name.to_string())),
        }
    }

    pub(super) fn head_name(&self) -> &'static str {
        if self.config.tie_word_embeddings { EMBED } else { LM_HEAD }
    }

    /// One micro-batch: the summed token loss, its token count and the gradients of
    /// `opts.loss_scale · loss_sum` for the trainable weights.
    pub fn forward_backward(
        &self,
        batch: &PackedBatch,
        trainable: Trainable,
        adapters: Option<&Adapters>,
        opts: &StepOptions,
    ) -> Result<StepOutput, ModelError> {
        self.forward_backward_with(batch, trainable, adapters, opts, &NoHooks)
    }

    /// [`CausalLm::forward_backward`] with a distributed run's `hooks` around every stage: the
    /// gradients they take are not in the returned map.
    pub fn forward_backward_with(
        &self,
        batch: &PackedBatch,
        trainable: Trainable,
        adapters: Option<&Adapters>,
        opts: &StepOptions,
        hooks: &dyn StepHooks,
    ) -> Result<StepOutput, ModelError> {
        let _profile = mindxtrain_kernels::profile::scope("step (glue)", &self.device);
        let mut ctx = self.step_ctx(batch, trainable, adapters, Some(opts.dropout_seed), hooks)?;
        let (tape, losses) = self.forward_tape(&ctx, batch, opts.activation_checkpointing)?;
        let loss_sum = losses.to_dtype(DType::F64)?.sum_all()?.to_scalar::<f64>()?;
        let coef = self.config.moe.as_ref().map_or(0.0, |m| m.router_aux_loss_coef);
        let aux_weight = coef * opts.loss_scale * tape.labels.count as f64;
        let aux = moe::balance_terms(&tape.router_stats, ctx.real_tokens, aux_weight)?;
        let aux_loss = aux.as_ref().map_or(0.0, |(loss, _)| *loss);
        if coef > 0.0 {
            ctx.balance = aux.map(|(_, grad)| grad);
        }
        let d_losses = Tensor::full(opts.loss_scale, losses.shape(), &self.device)?.to_dtype(self.dtype)?;
        let grads = self.backward_tape(&ctx, &tape, &d_losses)?;
        Ok(StepOutput { loss_sum, target_tokens: tape.labels.count, grads, aux_loss })
    }

    /// Logits `[B, T, vocab]` (no dropout, nothing saved).
    pub fn logits(&self, batch: &PackedBatch, adapters: Option<&Adapters>) -> Result<Tensor, ModelError> {
        let ctx = self.step_ctx(batch, Trainable::Adapters, adapters, None, &NoHooks)?;
        let xf = self.final_hidden(&ctx, batch)?;
        let logits = linear::forward(&self.kernels, &xf, &*self.weight(self.head_name())?)?;
        Ok(logits.reshape((batch.batch, batch.seq_len, self.config.vocab_size))?)
    }

    /// Per-token losses `[B, T]` (0 where the label is ignored), without gradients.
    pub fn token_losses(&self, batch: &PackedBatch, adapters: Option<&Adapters>) -> Result<Tensor, ModelError> {
        let ctx = self.step_ctx(batch, Trainable::Adapters, adapters, None, &NoHooks)?;
        let xf = self.final_hidden(&ctx, batch)?;
        let w = self.weight(self.head_name())?;
        let labels = Labels::new(&batch.labels, self.config.vocab_size, self.dtype, &self.device)?;
        // As in the training forward: on a GPU the `[tokens × vocab]` logits are never whole.
        let losses = if self.device.is_cuda() {
            lm_head_ce::forward(&self.kernels, &xf, &w, &labels, HEAD_CHUNK)?.0
        } else {
            cross_entropy::forward(&linear::forward(&self.kernels, &xf, &w)?, &labels)?.0
        };
        Ok(losses.reshape((batch.batch, batch.seq_len))?)
    }

    pub(super) fn step_ctx<'a>(
        &'a self,
        batch: &PackedBatch,
        trainable: Trainable,
        adapters: Option<&'a Adapters>,
        dropout_seed: Option<u64>,
        hooks: &'a dyn StepHooks,
    ) -> Result<StepCtx<'a>, ModelError> {
        self.check_batch(batch)?;
        if trainable == Trainable::Adapters && dropout_seed.is_some() && adapters.is_none() {
            return Err(ModelError::Lora("training adapters needs adapters".into()));
        }
        if trainable == Trainable::Full && dropout_seed.is_some() && self.is_quantized() {
            return Err(ModelError::Lora("an NF4-quantised base is frozen: train adapters (qlora)".into()));
        }
        let c = &self.config;
        let (b, t) = (batch.batch, batch.seq_len);
        // Tables over the rotated dims only (a hybrid rotates the first `rotary_dim` of a head).
        let rd = c.rotary_dim();
        let (cos, sin) = rope::tables(&batch.position_ids, rd, c.rope_theta, self.dtype, &self.device)?;
        let real_tokens = batch.segment_ids.iter().filter(|&&s| s != 0).count();
        let counted = if c.moe.is_some() && real_tokens < batch.segment_ids.len() {
            let real: Vec<f32> = batch.segment_ids.iter().map(|&s| if s == 0 { 0.0 } else { 1.0 }).collect();
            Some(Tensor::from_vec(real, b * t, &self.device)?)
        } else {
            None
        };
        Ok(StepCtx {
            model: self,
            adapters,
            base_grads: trainable == Trainable::Full,
            adapter_grads: trainable == Trainable::Adapters && adapters.is_some(),
            dropout_seed,
            batch: b,
            seq: t,
            cos: cos.reshape((b, t, 1, rd))?,
            sin: sin.reshape((b, t, 1, rd))?,
            mask: attention::Mask::new(&batch.segment_ids, b, t)?,
            counted,
            real_tokens,
            hooks,
            balance: None,
        })
    }

    fn check_batch(&self, batch: &PackedBatch) -> Result<(), ModelError> {
        let n = batch.batch * batch.seq_len;
        if n == 0 {
            return Err(ModelError::Batch("empty batch".into()));
        }
        let lens = [batch.input_ids.len(), batch.position_ids.len(), batch.segment_ids.len(), batch.labels.len()];
        if lens.iter().any(|&l| l != n) {
            return Err(ModelError::Batch(format!(
                "{}×{} batch with ids/positions/segments/labels of lengths {lens:?}",
                batch.batch, batch.seq_len
            )));
        }
        let vocab = self.config.vocab_size;
        if let Some((i, id)) = batch.input_ids.iter().enumerate().find(|&(_, &id)| id as usize >= vocab) {
            return Err(ModelError::Batch(format!("token {i}: id {id} is outside the vocabulary of {vocab}")));
        }
        if let Some((i, l)) =
            batch.labels.iter().enumerate().find(|&(_, &l)| l != IGNORE && (l < 0 || l as usize >= vocab))
        {
            return Err(ModelError::Batch(format!("token {i}: label {l} is neither {IGNORE} nor in the vocabulary")));
        }
        Ok(())
    }

    fn final_hidden(&self, ctx: &StepCtx<'_>, batch: &PackedBatch) -> Result<Tensor, ModelError> {
        let ids = Tensor::new(batch.input_ids.as_slice(), &self.device)?;
        let mut x = embedding::forward(&ids, &*self.weight(EMBED)?)?;
        for layer in 0..self.config.num_hidden_layers {
            x = ctx.block_forward(layer, &x, false)?.0;
        }
        Ok(rmsnorm::forward(&x, &*ctx.norm_gain(FINAL_NORM)?, self.config.rms_norm_eps)?.0)
    }

    /// Forward keeping what the backward needs; returns per-token losses `[N]`.
    pub(super) fn forward_tape(
        &self,
        ctx: &StepCtx<'_>,
        batch: &PackedBatch,
        checkpointing: bool,
    ) -> Result<(Tape, Tensor), ModelError> {
        let ids = Tensor::new(batch.input_ids.as_slice(), &self.device)?;
        let labels = Labels::new(&batch.labels, self.config.vocab_size, self.dtype, &self.device)?;
        let hooks = ctx.hooks;
        hooks.enter(Stage::Embedding, false)?;
        let mut x = embedding::forward(&ids, &*ctx.weight(EMBED)?)?;
        hooks.leave(Stage::Embedding, false)?;
        let mut blocks = Vec::with_capacity(self.config.num_hidden_layers);
        let mut router_stats = Vec::new();
        for layer in 0..self.config.num_hidden_layers {
            hooks.enter(Stage::Block(layer), false)?;
            let (y, tape, stats) = ctx.block_forward(layer, &x, !checkpointing)?;
            hooks.leave(Stage::Block(layer), false)?;
            router_stats.extend(stats);
            blocks.push(match tape {
                Some(t) => Saved::Tape(Box::new(t)),
                None => Saved::Input(x),
            });
            x = y;
        }
        hooks.enter(Stage::Head, false)?;
        let (xf, rstd_f) = rmsnorm::forward(&x, &*ctx.norm_gain(FINAL_NORM)?, self.config.rms_norm_eps)?;
        let w = ctx.weight(self.head_name())?;
        let (losses, head) = if self.device.is_cuda() {
            let (losses, lse) = lm_head_ce::forward(&self.kernels, &xf, &w, &labels, HEAD_CHUNK)?;
            (losses, HeadTape::Chunked { lse })
        } else {
            let logits = linear::forward(&self.kernels, &xf, &w)?;
            let (losses, lse) = cross_entropy::forward(&logits, &labels)?;
            (losses, HeadTape::Logits { logits, lse })
        };
        drop(w);
        hooks.leave(Stage::Head, false)?;
        let tape = Tape { ids, blocks, x_last: x, rstd_f, xf, head, labels, checkpointing, router_stats };
        Ok((tape, losses))
    }

    /// Backward from per-token loss weights `d_losses` (`[N]`).
    pub(super) fn backward_tape(&self, ctx: &StepCtx<'_>, tape: &Tape, d_losses: &Tensor) -> Result<Grads, ModelError> {
        let mut grads = Grads::new();
        let base = ctx.base_grads;
        let hooks = ctx.hooks;
        hooks.enter(Stage::Head, true)?;
        let head = ctx.weight(self.head_name())?;
        let (dxf, dhead) = match &tape.head {
            HeadTape::Logits { logits, lse } => {
                let dlogits = cross_entropy::backward(d_losses, logits, lse, &tape.labels)?;
                linear::backward(&self.kernels, &dlogits, &tape.xf, &head, base)?
            }
            HeadTape::Chunked { lse } => {
                lm_head_ce::backward(&self.kernels, d_losses, &tape.xf, &head, lse, &tape.labels, HEAD_CHUNK, base)?
            }
        };
        if let Some(g) = dhead {
            accumulate(&mut grads, self.head_name().to_string(), g)?;
        }
        let norm = ctx.norm_gain(FINAL_NORM)?;
        let (mut dx, dnorm) = rmsnorm::backward(&dxf, &tape.x_last, &norm, &tape.rstd_f, base)?;
        if let Some(g) = dnorm {
            accumulate(&mut grads, FINAL_NORM.to_string(), g)?;
        }
        drop((head, norm));
        hooks.leave(Stage::Head, true)?;
        hooks.grads_ready(Stage::Head, &mut grads)?;
        let mut reached_embedding = base;
        for layer in (0..self.config.num_hidden_layers).rev() {
            hooks.enter(Stage::Block(layer), true)?;
            let recomputed;
            let block_tape = match &tape.blocks[layer] {
                Saved::Tape(t) => &**t,
                Saved::Input(x) => {
                    recomputed = ctx.block_forward(layer, x, true)?.1;
                    recomputed.as_ref().ok_or_else(|| ModelError::Batch("block tape missing".into()))?
                }
            };
            let want_dx = layer > 0 || base;
            let next = ctx.block_backward(layer, &dx, block_tape, &mut grads, want_dx)?;
            hooks.leave(Stage::Block(layer), true)?;
            hooks.grads_ready(Stage::Block(layer), &mut grads)?;
            match next {
                Some(d) => dx = d,
                None => {
                    reached_embedding = false;
                    break;
                }
            }
        }
        debug_assert!(tape.checkpointing || tape.blocks.iter().all(|b| matches!(b, Saved::Tape(_))));
        hooks.enter(Stage::Embedding, true)?;
        if reached_embedding {
            let (v, h) = (self.config.vocab_size, self.config.hidden_size);
            accumulate(&mut grads, EMBED.to_string(), embedding::backward(&dx, &tape.ids, (v, h))?)?;
        }
        hooks.leave(Stage::Embedding, true)?;
        hooks.grads_ready(Stage::Embedding, &mut grads)?;
        Ok(grads)
    }
}
