//! What each layer keeps for a sequence in the serving engine's cache: the model declares it
//! ([`CausalLm::cache_spec`]) and the engine's block manager, sizing and runner work from it (as
//! vLLM v1's hybrid KV-cache manager does with its per-layer specs).

use candle_core::DType;

use super::CausalLm;

/// What one layer keeps for a sequence. Every layer of today's architectures attends, so each
/// keeps keys and values in the shared blocks; a recurrent layer (a fixed-size state per
/// sequence, Qwen3.6's Gated DeltaNet) will be a variant of its own beside `Attention`, kept
/// outside the blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LayerSpec {
    /// Keys and values of every token, `[kv_heads, head_dim]` each, in the block pool.
    Attention { kv_heads: usize, head_dim: usize },
}

impl LayerSpec {
    /// Bytes this layer adds to one block of `block_size` tokens in `dtype`.
    fn bytes_per_block(&self, block_size: usize, dtype: DType) -> usize {
        match *self {
            LayerSpec::Attention { kv_heads, head_dim } => 2 * block_size * kv_heads * head_dim * dtype.size_in_bytes(),
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
}

impl CausalLm {
    /// Refuses a model the decode and serving paths cannot run yet: one with Gated DeltaNet
    /// layers, whose per-sequence recurrent state (`LayerSpec::Recurrent`) is still to come.
    pub fn check_servable(&self) -> Result<(), super::ModelError> {
        let c = self.config();
        match (0..c.num_hidden_layers).find(|&l| c.layer_kind(l) == super::LayerKind::LinearAttention) {
            Some(layer) => Err(super::ModelError::NotBuilt(format!(
                "generation and serving of qwen3_hybrid (Qwen3.5/3.6) models: layer {layer} is a Gated DeltaNet \
                 layer, and its recurrent state cache is not built yet (training on the CPU is)"
            ))),
            None => Ok(()),
        }
    }

    /// What each of this model's layers keeps per sequence, in blocks of `block_size` tokens.
    pub fn cache_spec(&self, block_size: usize) -> CacheSpec {
        let c = self.config();
        let layer = LayerSpec::Attention { kv_heads: c.num_key_value_heads, head_dim: c.head_dim };
        CacheSpec { layers: vec![layer; c.num_hidden_layers], block_size, dtype: self.dtype() }
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
    }
}
