//! How many blocks the cache gets, from what each layer keeps (the model's
//! [`CacheSpec`](crate::model::CacheSpec)): a share of the device's free memory after the model is
//! loaded (or an exact count), never fewer than one request of `max_model_len` needs. A model with
//! recurrent layers keeps a fixed state per running sequence outside the blocks: those slots come
//! out of the share first.

use candle_core::Device;

use crate::model::CacheSpec;

/// How the cache is sized.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum KvBlocks {
    /// Exactly this many blocks.
    Exact(usize),
    /// This share (0, 1] of the device's free memory, measured when the engine starts.
    FreeMemory(f64),
}

/// The block count for `want` beside `state_slots` recurrent state slots, or why the cache
/// cannot serve `max_model_len`.
pub fn blocks(
    shape: &CacheSpec,
    want: KvBlocks,
    max_model_len: usize,
    state_slots: usize,
    device: &Device,
) -> Result<usize, String> {
    let per = shape.bytes_per_block().max(1);
    let blocks = match want {
        KvBlocks::Exact(n) => n,
        KvBlocks::FreeMemory(share) => {
            if !(share > 0.0 && share <= 1.0) {
                return Err(format!("kv cache: memory share {share} is outside (0, 1]"));
            }
            let free = mindxtrain_kernels::memory::free_bytes(device).map_err(|e| e.to_string())?;
            let budget = (free as f64 * share) as u64;
            let states = shape.state_bytes() * state_slots as u64;
            if states > budget {
                return Err(format!(
                    "kv cache: {state_slots} recurrent state slots ({} MiB each) need more than the {} MiB share: lower serve.max_batch",
                    shape.state_bytes().div_ceil(1 << 20),
                    budget >> 20
                ));
            }
            usize::try_from((budget - states) / per).unwrap_or(usize::MAX)
        }
    };
    let needed = max_model_len.div_ceil(shape.block_size.max(1));
    if blocks < needed {
        return Err(format!(
            "kv cache: {blocks} blocks of {} tokens ({} MiB each) cannot hold one request of max_model_len {max_model_len} ({needed} blocks): lower serve.max_model_len or free memory",
            shape.block_size,
            per.div_ceil(1 << 20)
        ));
    }
    Ok(blocks)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::LayerSpec;
    use candle_core::DType;

    fn attention(layers: usize, kv_heads: usize, head_dim: usize, block_size: usize, dtype: DType) -> CacheSpec {
        CacheSpec { layers: vec![LayerSpec::Attention { kv_heads, head_dim }; layers], block_size, dtype }
    }

    #[test]
    fn the_cache_fits_the_memory_share_and_one_full_request() {
        let shape = attention(36, 8, 128, 16, DType::BF16);
        // Qwen3-8B: 144 KiB per token, 2.25 MiB per 16-token block.
        assert_eq!(shape.bytes_per_block(), 36 * 2 * 8 * 128 * 2 * 16);
        assert_eq!(blocks(&shape, KvBlocks::Exact(300), 4096, 0, &Device::Cpu), Ok(300));
        let err = blocks(&shape, KvBlocks::Exact(10), 4096, 0, &Device::Cpu).unwrap_err();
        assert!(err.contains("256 blocks") && err.contains("max_model_len"), "{err}");
        assert!(blocks(&shape, KvBlocks::FreeMemory(1.5), 16, 0, &Device::Cpu).is_err());
        let tiny = attention(1, 1, 2, 4, DType::F32);
        assert!(blocks(&tiny, KvBlocks::FreeMemory(0.001), 16, 0, &Device::Cpu).unwrap() >= 4);
    }

    #[test]
    fn recurrent_state_slots_come_out_of_the_share_first() {
        let linear = LayerSpec::Recurrent { conv_channels: 64, conv_kernel: 4, heads: 4, key_dim: 16, value_dim: 16 };
        let full = LayerSpec::Attention { kv_heads: 1, head_dim: 2 };
        let spec = CacheSpec { layers: vec![linear, full], block_size: 4, dtype: DType::F32 };
        let free = mindxtrain_kernels::memory::free_bytes(&Device::Cpu).unwrap() as f64;
        // A share of a few states: each slot taken from it is that many blocks fewer.
        let share = (spec.state_bytes() * 100) as f64 / free;
        let none = blocks(&spec, KvBlocks::FreeMemory(share), 16, 0, &Device::Cpu).unwrap();
        let ten = blocks(&spec, KvBlocks::FreeMemory(share), 16, 10, &Device::Cpu).unwrap();
        let per_slot = (spec.state_bytes() / spec.bytes_per_block()) as usize;
        assert!((none - ten).abs_diff(10 * per_slot) <= 1, "{none} blocks, {ten} with 10 slots of {per_slot}");
        let err = blocks(&spec, KvBlocks::FreeMemory(share), 16, 1000, &Device::Cpu).unwrap_err();
        assert!(err.contains("1000 recurrent state slots"), "{err}");
    }
}
