//! Parameter names (exactly HF's), their shapes, and the seeded random init.

use std::collections::BTreeMap;

use candle_core::{DType, Device, Tensor};
use mindxtrain_kernels::seeded;

use super::rng::{SplitMix64, name_id};
use super::{LayerKind, LmConfig, ModelError, QkNorm};
use crate::recipe::TargetModule;

/// Parameters by HF tensor name.
pub type Params = BTreeMap<String, Tensor>;

pub const EMBED: &str = "model.embed_tokens.weight";
pub const FINAL_NORM: &str = "model.norm.weight";
pub const LM_HEAD: &str = "lm_head.weight";

/// The linear projections of a block, the units LoRA adapts and NF4 stores: the token mixer's
/// (an attention layer's four, or a Gated DeltaNet layer's five) and the MLP's (a dense SwiGLU's
/// three; none on a Qwen3-MoE sparse layer, whose MLP is the experts' stacked weights; a
/// Qwen3.5-MoE sparse layer's gated shared expert's four).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Proj {
    Q,
    K,
    V,
    O,
    Gate,
    Up,
    Down,
    /// Gated DeltaNet: `[q | k | v]` before the conv.
    InProjQkv,
    /// Gated DeltaNet: the output gate of its gated norm.
    InProjZ,
    /// Gated DeltaNet: `β`'s logits, one per value head.
    InProjB,
    /// Gated DeltaNet: the decay's input, one per value head.
    InProjA,
    /// Gated DeltaNet's output projection.
    OutProj,
    /// Qwen3.5-MoE: the shared expert's SwiGLU, beside the routed experts.
    SharedGate,
    SharedUp,
    SharedDown,
    /// Qwen3.5-MoE: the shared expert's output gate's logit, `[1, H]`.
    SharedExpertGate,
}

impl Proj {
    pub const ALL: [Proj; 7] = [Proj::Q, Proj::K, Proj::V, Proj::O, Proj::Gate, Proj::Up, Proj::Down];
    /// An attention layer's token mixer.
    pub const ATTENTION: [Proj; 4] = [Proj::Q, Proj::K, Proj::V, Proj::O];
    /// A Gated DeltaNet layer's token mixer.
    pub const LINEAR: [Proj; 5] = [Proj::InProjQkv, Proj::InProjZ, Proj::InProjB, Proj::InProjA, Proj::OutProj];
    /// A dense SwiGLU MLP.
    pub const MLP: [Proj; 3] = [Proj::Gate, Proj::Up, Proj::Down];
    /// A Qwen3.5-MoE sparse layer's gated shared expert.
    pub const SHARED_EXPERT: [Proj; 4] = [Proj::SharedGate, Proj::SharedUp, Proj::SharedDown, Proj::SharedExpertGate];

    /// The projections layer `layer` of `c` has: its token mixer's, then its MLP's.
    pub fn of_layer(c: &LmConfig, layer: usize) -> Vec<Proj> {
        let mixer: &[Proj] = match c.layer_kind(layer) {
            LayerKind::LinearAttention => &Proj::LINEAR,
            LayerKind::Attention => &Proj::ATTENTION,
        };
        let mlp: &[Proj] = match c.moe.as_ref().filter(|m| m.is_sparse(layer)) {
            None => &Proj::MLP,
            Some(_) if c.arch.shared_expert() => &Proj::SHARED_EXPERT,
            Some(_) => &[],
        };
        mixer.iter().chain(mlp).copied().collect()
    }

    /// The module path inside a layer, as HF and PEFT name it.
    pub fn path(self) -> &'static str {
        match self {
            Proj::Q => "self_attn.q_proj",
            Proj::K => "self_attn.k_proj",
            Proj::V => "self_attn.v_proj",
            Proj::O => "self_attn.o_proj",
            Proj::Gate => "mlp.gate_proj",
            Proj::Up => "mlp.up_proj",
            Proj::Down => "mlp.down_proj",
            Proj::InProjQkv => "linear_attn.in_proj_qkv",
            Proj::InProjZ => "linear_attn.in_proj_z",
            Proj::InProjB => "linear_attn.in_proj_b",
            Proj::InProjA => "linear_attn.in_proj_a",
            Proj::OutProj => "linear_attn.out_proj",
            Proj::SharedGate => "mlp.shared_expert.gate_proj",
            Proj::SharedUp => "mlp.shared_expert.up_proj",
            Proj::SharedDown => "mlp.shared_expert.down_proj",
            Proj::SharedExpertGate => "mlp.shared_expert_gate",
        }
    }

    /// The recipe's (and PEFT's) target name: PEFT matches names by their last part, so
    /// `gate_proj` reaches a shared expert's `mlp.shared_expert.gate_proj` too.
    pub fn target_module(self) -> TargetModule {
        match self {
            Proj::Q => TargetModule::QProj,
            Proj::K => TargetModule::KProj,
            Proj::V => TargetModule::VProj,
            Proj::O => TargetModule::OProj,
            Proj::Gate | Proj::SharedGate => TargetModule::GateProj,
            Proj::Up | Proj::SharedUp => TargetModule::UpProj,
            Proj::Down | Proj::SharedDown => TargetModule::DownProj,
            Proj::InProjQkv => TargetModule::InProjQkv,
            Proj::InProjZ => TargetModule::InProjZ,
            Proj::InProjB => TargetModule::InProjB,
            Proj::InProjA => TargetModule::InProjA,
            Proj::OutProj => TargetModule::OutProj,
            Proj::SharedExpertGate => TargetModule::SharedExpertGate,
        }
    }

    /// `(out, in)` of the weight. A gated attention's `q_proj` (Qwen3.5) also makes the output
    /// gate: twice the query's width. A shared expert is `intermediate_size` wide (a Qwen3.5-MoE
    /// has no dense MLP: its config's `shared_expert_intermediate_size` is read there).
    pub fn shape(self, c: &LmConfig) -> (usize, usize) {
        let (h, q, kv, f) = (
            c.hidden_size,
            c.num_attention_heads * c.head_dim,
            c.num_key_value_heads * c.head_dim,
            c.intermediate_size,
        );
        let (conv, value, value_heads) =
            c.hybrid.as_ref().map_or((0, 0, 0), |s| (s.conv_dim(), s.value_dim(), s.linear_num_value_heads));
        match self {
            Proj::Q if c.arch.gated_attention() => (2 * q, h),
            Proj::Q => (q, h),
            Proj::K | Proj::V => (kv, h),
            Proj::O => (h, q),
            Proj::Gate | Proj::Up | Proj::SharedGate | Proj::SharedUp => (f, h),
            Proj::Down | Proj::SharedDown => (h, f),
            Proj::SharedExpertGate => (1, h),
            Proj::InProjQkv => (conv, h),
            Proj::InProjZ => (value, h),
            Proj::InProjB | Proj::InProjA => (value_heads, h),
            Proj::OutProj => (h, value),
        }
    }
}

pub fn base_weight_name(layer: usize, proj: Proj) -> String {
    format!("model.layers.{layer}.{}.weight", proj.path())
}

/// The per-layer norms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Norm {
    Input,
    PostAttention,
    Q,
    K,
}

/// A layer's norm as `c`'s architecture names it (`input_layernorm`, `pre_attention_layernorm`, …).
pub fn norm_name(c: &LmConfig, layer: usize, norm: Norm) -> String {
    format!("model.layers.{layer}.{}.weight", c.arch.norm_path(norm))
}

/// The gain widths of a layer's q and k norms: one head's, or the whole projection's.
pub fn qk_norm_widths(c: &LmConfig) -> (usize, usize) {
    match c.arch.qk_norm() {
        QkNorm::PerHead => (c.head_dim, c.head_dim),
        QkNorm::Projection => (c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim),
    }
}

/// Every parameter name with its shape; `lm_head.weight` only when the head is untied.
pub fn expected_shapes(c: &LmConfig) -> BTreeMap<String, Vec<usize>> {
    let mut m = BTreeMap::new();
    m.insert(EMBED.to_string(), vec![c.vocab_size, c.hidden_size]);
    m.insert(FINAL_NORM.to_string(), vec![c.hidden_size]);
    if !c.tie_word_embeddings {
        m.insert(LM_HEAD.to_string(), vec![c.vocab_size, c.hidden_size]);
    }
    for layer in 0..c.num_hidden_layers {
        for proj in Proj::of_layer(c, layer) {
            let (o, i) = proj.shape(c);
            m.insert(base_weight_name(layer, proj), vec![o, i]);
        }
        if let Some(moe) = c.moe.as_ref().filter(|m| m.is_sparse(layer)) {
            super::moe::expected_shapes(c, moe, layer, &mut m);
        }
        m.insert(norm_name(c, layer, Norm::Input), vec![c.hidden_size]);
        m.insert(norm_name(c, layer, Norm::PostAttention), vec![c.hidden_size]);
        match (c.layer_kind(layer), &c.hybrid) {
            (LayerKind::LinearAttention, Some(shape)) => super::linear_attention::expected_shapes(shape, layer, &mut m),
            _ => {
                let (q, k) = qk_norm_widths(c);
                m.insert(norm_name(c, layer, Norm::Q), vec![q]);
                m.insert(norm_name(c, layer, Norm::K), vec![k]);
            }
        }
    }
    m
}

/// Every expected name present with its shape, nothing else, one dtype throughout.
pub fn check_names_and_shapes(
    expected: &BTreeMap<String, Vec<usize>>,
    got: &BTreeMap<String, Tensor>,
) -> Result<(), ModelError> {
    if let Some(name) = expected.keys().find(|n| !got.contains_key(*n)) {
        return Err(ModelError::MissingParam(name.clone()));
    }
    if let Some(name) = got.keys().find(|n| !expected.contains_key(*n)) {
        return Err(ModelError::UnexpectedParam(name.clone()));
    }
    let mut dtype = None;
    for (name, t) in got {
        let want = &expected[name];
        if t.dims() != want.as_slice() {
            return Err(ModelError::Shape { name: name.clone(), expected: want.clone(), got: t.dims().to_vec() });
        }
        match dtype {
            None => dtype = Some(t.dtype()),
            Some(d) if d != t.dtype() => {
                return Err(ModelError::DType { name: name.clone(), expected: d, got: t.dtype() });
            }
            Some(_) => {}
        }
    }
    Ok(())
}

/// HF's `_init_weights` for Qwen3: linear and embedding weights `N(0, 0.02²)`, norms 1.
/// Each tensor draws from its own streams of `seed`, so adding layers never shifts others.
/// Tensors, and blocks of large ones, are drawn on every core, a batch of tensors at a time
/// (the host holds one batch), and uploaded in `dtype`: an 8B base is minutes of serial f64
/// draws otherwise.
pub fn init_random(c: &LmConfig, seed: u64, dtype: DType, device: &Device) -> Result<Params, ModelError> {
    use rayon::prelude::*;
    let shapes: Vec<(String, Vec<usize>)> = expected_shapes(c).into_iter().collect();
    let mut params = Params::new();
    if device.is_cuda() {
        // Drawn where they live: one launch per tensor, nothing crosses the bus.
        for (name, shape) in shapes {
            let t = draw(c, seed, &name, &shape, dtype, device)?;
            params.insert(name, t);
        }
        return Ok(params);
    }
    for batch in shapes.chunks(rayon::current_num_threads().max(1)) {
        let drawn =
            batch.par_iter().map(|(name, shape)| draw(c, seed, name, shape, dtype, &Device::Cpu)).collect::<Vec<_>>();
        for ((name, _), t) in batch.iter().zip(drawn) {
            params.insert(name.clone(), t?.to_device(device)?);
        }
    }
    Ok(params)
}

/// Values per stream within one tensor. The first block of a tensor draws from the tensor's own
/// stream, so tensors up to this size hold what they always held; later blocks draw from streams
/// derived from the tensor's and the block's index, so one large tensor (an 8B model's 622M-value
/// embedding) fills on every core (or GPU thread) instead of one.
const DRAW_BLOCK: usize = 1 << 22;

/// How a parameter starts, by its architecture's init ([`super::Arch::init_of`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Init {
    /// `N(0, 0.02²)`, the linear and embedding weights.
    Normal,
    /// A norm's gain.
    Ones,
    /// A zero-centred norm's offset (Qwen3.5: the gain is `1 + w`).
    Zeros,
    /// `ln u`, `u` uniform in `[lo, hi)` (Qwen3.5's `A_log`).
    LogUniform(f64, f64),
}

/// One parameter of [`init_random`], drawn on `device` (`mindxtrain_kernels::seeded`: on a GPU by
/// its own kernel, the same function as the host's up to the last bit of `log`/`cos`).
fn draw(
    c: &LmConfig,
    seed: u64,
    name: &str,
    shape: &[usize],
    dtype: DType,
    device: &Device,
) -> candle_core::Result<Tensor> {
    let n: usize = shape.iter().product();
    match c.arch.init_of(name) {
        Init::Normal => {}
        Init::Ones => return Tensor::ones(shape, dtype, device),
        Init::Zeros => return Tensor::zeros(shape, dtype, device),
        Init::LogUniform(lo, hi) => {
            // A handful of values (one per head): drawn on the host from the tensor's stream.
            let mut rng = SplitMix64::derive(seed, &[name_id(name)]);
            let v: Vec<f64> = (0..n).map(|_| (lo + (hi - lo) * rng.unit()).ln()).collect();
            return Tensor::from_vec(v, shape, &Device::Cpu)?.to_dtype(dtype)?.to_device(device);
        }
    }
    let states: Vec<u64> = (0..n.div_ceil(DRAW_BLOCK))
        .map(|block| match block {
            0 => SplitMix64::derive(seed, &[name_id(name)]).state(),
            b => SplitMix64::derive(seed, &[name_id(name), b as u64]).state(),
        })
        .collect();
    seeded::normal(&states, DRAW_BLOCK, n, 0.02, device)?.reshape(shape)?.to_dtype(dtype)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_large_tensor_keeps_its_first_block_and_draws_the_same_on_any_thread_count() {
        let shape = [DRAW_BLOCK + 1000];
        let values = |threads: usize| {
            let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
            let c = super::super::tests::tiny(false);
            pool.install(|| draw(&c, 3, "model.embed_tokens.weight", &shape, DType::F64, &Device::Cpu))
                .unwrap()
                .to_vec1::<f64>()
                .unwrap()
        };
        let (one, many) = (values(1), values(4));
        assert_eq!(one, many);
        // The first block is the tensor's own stream, as before blocks existed.
        let mut rng = SplitMix64::derive(3, &[name_id("model.embed_tokens.weight")]);
        let serial: Vec<f64> = (0..DRAW_BLOCK + 1000).map(|_| 0.02 * rng.normal()).collect();
        assert_eq!(one[..DRAW_BLOCK], serial[..DRAW_BLOCK]);
        // The second block has its own stream.
        assert_ne!(one[DRAW_BLOCK..], serial[DRAW_BLOCK..]);
    }
}
