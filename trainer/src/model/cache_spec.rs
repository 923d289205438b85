//! What each layer keeps for a sequence in the serving engine's cache: the model declares it
//! ([`CausalLm::cache_spec`]) and the engine's block manager, sizing and runner work from it (as
//! vLLM v1's hybrid KV-cache manager does with its per-layer specs).

use candle_core::DType;

use super::CausalLm;

/// What one layer keeps for a sequence: an attention layer keys and values of every token in the
/// shared blocks; a recurrent layer (Qwen3.5/3.6's Gated DeltaNet) a fixed-size state, kept
/// outside the blocks in a slot the sequence holds while it runs (vLLM v1's "mamba" state).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LayerSpec {
    /// Keys and values of every token, `[kv_heads, head_dim]` each, in the block pool.
    Attention { kv_heads: usize, head_dim: usize },
    /// The causal conv's last `conv_kernel − 1` inputs of its `conv_channels` (`[conv_channels,
    /// conv_kernel − 1]`, in the model's dtype) and the delta rule's state `[heads, key_dim,
    /// value_dim]` (in [`state_dtype`]): the same bytes at any length.
    Recurrent { conv_channels: usize, conv_kernel: usize, heads: usize, key_dim: usize, value_dim: usize },
}

/// The dtype the delta rule keeps its state in for a model in `dtype`: f32 (transformers' and
/// the kernels' working dtype), f64 for an f64 model.
pub fn state_dtype(dtype: DType) -> DType {
    match dtype {
        DType::F64 => DType::F64,
        _ => DType::F32,
    }
}

impl LayerSpec {
    /// Bytes this layer adds to one block of `block_size` tokens in `dtype`.
    fn bytes_per_block(&self, block_size: usize, dtype: DType) -> usize {
        match *self {
            LayerSpec::Attention { kv_heads, head_dim } => 2 * block_size * kv_heads * head_dim * dtype.size_in_bytes(),
            LayerSpec::Recurrent { .. } => 0,
        }
    }

    /// Bytes this layer keeps for one running sequence outside the blocks.
    fn state_bytes(&self, dtype: DType) -> usize {
        match *self {
            LayerSpec::Attention { .. } => 0,
            LayerSpec::Recurrent { conv_channels, conv_kernel, heads, key_dim, value_dim } => {
                conv_channels * conv_kernel.saturating_sub(1) * dtype.size_in_bytes()
                    + heads * key_dim * value_dim * state_dtype(dtype).size_in_bytes()
            }
        }
    }
}

/// The cache of a model: each layer's spec, in layer order, and the block geometry they share.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheSpec {
    pub layers: Vec<LayerSpec>,
    pub block_size: usize,
    pub dtype: DType,
}

impl CacheSpec {
    /// What every layer keeps for `block_size` tokens.
    pub fn bytes_per_block(&self) -> u64 {
        self.layers.iter().map(|l| l.bytes_per_block(self.block_size, self.dtype) as u64).sum()
    }

    /// What the recurrent layers keep for one running sequence (0 for attention-only models).
    pub fn state_bytes(&self) -> u64 {
        self.layers.iter().map(|l| l.state_bytes(self.dtype) as u64).sum()
    }

    /// Whether some layer keeps a recurrent state: its sequences then hold a state slot each,
    /// and a prefix of cached blocks cannot stand in for the state of the tokens before it.
    pub fn is_recurrent(&self) -> bool {
        self.layers.iter().any(|l| matches!(l, LayerSpec::Recurrent { .. }))
    }
}

impl CausalLm {
    /// Refuses a model the decode and serving paths cannot run yet: Gated DeltaNet layers on a
    /// device other than the CPU and CUDA (the kernels' `step` runs fused on those two only).
    /// Sparse layers, with or without a shared expert, run on both.
    pub fn check_servable(&self) -> Result<(), super::ModelError> {
        let c = self.config();
        let linear = (0..c.num_hidden_layers).find(|&l| c.layer_kind(l) == super::LayerKind::LinearAttention);
        let device = self.device();
        match linear {
            Some(layer) if !device.is_cpu() && !device.is_cuda() => Err(super::ModelError::NotBuilt(format!(
                "generation and serving of qwen3_hybrid (Qwen3.5/3.6) models on {:?}: layer {layer} is a Gated \
                 DeltaNet layer, whose kernels run on the CPU and on CUDA GPUs",
                device.location()
            ))),
            _ => Ok(()),
        }
    }

    /// What each of this model's layers keeps per sequence, in blocks of `block_size` tokens.
    pub fn cache_spec(&self, block_size: usize) -> CacheSpec {
        let c = self.config();
        let layers = (0..c.num_hidden_layers)
            .map(|layer| match (c.layer_kind(layer), &c.hybrid) {
                (super::LayerKind::LinearAttention, Some(h)) => LayerSpec::Recurrent {
                    conv_channels: h.conv_dim(),
                    conv_kernel: h.linear_conv_kernel_dim,
                    heads: h.linear_num_value_heads,
                    key_dim: h.linear_key_head_dim,
                    value_dim: h.linear_value_head_dim,
                },
                _ => LayerSpec::Attention { kv_heads: c.num_key_value_heads, head_dim: c.head_dim },
            })
            .collect();
        CacheSpec { layers, block_size, dtype: self.dtype() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attention(layers: usize, kv_heads: usize, head_dim: usize, block_size: usize, dtype: DType) -> CacheSpec {
        CacheSpec { layers: vec![LayerSpec::Attention { kv_heads, head_dim }; layers], block_size, dtype }
    }

    #[test]
    fn each_layer_adds_its_own_bytes_to_a_block() {
        let a = LayerSpec::Attention { kv_heads: 8, head_dim: 128 };
        let b = LayerSpec::Attention { kv_heads: 2, head_dim: 64 };
        let spec = CacheSpec { layers: vec![a, b, a, a], block_size: 16, dtype: DType::BF16 };
        assert_eq!(spec.bytes_per_block(), (3 * 2 * 16 * 8 * 128 * 2 + 2 * 16 * 2 * 64 * 2) as u64);
        // Qwen3-8B: 144 KiB per token.
        assert_eq!(attention(36, 8, 128, 1, DType::BF16).bytes_per_block(), 36 * 2 * 8 * 128 * 2);
        assert_eq!(spec.state_bytes(), 0);
        assert!(!spec.is_recurrent());
    }

    #[test]
    fn a_recurrent_layer_keeps_a_fixed_state_and_nothing_in_the_blocks() {
        // A Qwen3.6-sized Gated DeltaNet layer: conv over [q | k | v] = 2·16·128 + 48·128
        // channels, 4 taps, 48 value heads of 128×128.
        let linear =
            LayerSpec::Recurrent { conv_channels: 10240, conv_kernel: 4, heads: 48, key_dim: 128, value_dim: 128 };
        let full = LayerSpec::Attention { kv_heads: 4, head_dim: 256 };
        let spec = CacheSpec { layers: vec![linear, linear, linear, full], block_size: 16, dtype: DType::BF16 };
        assert_eq!(spec.bytes_per_block(), (2 * 16 * 4 * 256 * 2) as u64, "only the attention layer fills blocks");
        // The conv's 3 inputs in bf16, the rule's state in f32: about 3 MiB a layer per sequence.
        assert_eq!(spec.state_bytes(), 3 * (10240 * 3 * 2 + 48 * 128 * 128 * 4) as u64);
        assert!(spec.is_recurrent());
        let f64_spec = CacheSpec { dtype: DType::F64, ..spec };
        assert_eq!(f64_spec.state_bytes(), 3 * (10240 * 3 * 8 + 48 * 128 * 128 * 8) as u64);
    }
}
