//! How many blocks the cache gets, from what each layer keeps (the model's
//! [`CacheSpec`](crate::model::CacheSpec)): a share of the device's free memory after the model is
//! loaded (or an exact count), never fewer than one request of `max_model_len` needs.

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

/// The block count for `want`, or why the cache cannot serve `max_model_len`.
pub fn blocks(shape: &CacheSpec, want: KvBlocks, max_model_len: usize, device: &Device) -> Result<usize, String> {
    let per = shape.bytes_per_block().max(1);
    let blocks = match want {
        KvBlocks::Exact(n) => n,
        KvBlocks::FreeMemory(share) => {
            if !(share > 0.0 && share <= 1.0) {
                return Err(format!("kv cache: memory share {share} is outside (0, 1]"));
            }
            let free = mindxtrain_kernels::memory::free_bytes(device).map_err(|e| e.to_string())?;
            usize::try_from((free as f64 * share) as u64 / per).unwrap_or(usize::MAX)
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
        assert_eq!(blocks(&shape, KvBlocks::Exact(300), 4096, &Device::Cpu), Ok(300));
        let err = blocks(&shape, KvBlocks::Exact(10), 4096, &Device::Cpu).unwrap_err();
        assert!(err.contains("256 blocks") && err.contains("max_model_len"), "{err}");
        assert!(blocks(&shape, KvBlocks::FreeMemory(1.5), 16, &Device::Cpu).is_err());
        let tiny = attention(1, 1, 2, 4, DType::F32);
        assert!(blocks(&tiny, KvBlocks::FreeMemory(0.001), 16, &Device::Cpu).unwrap() >= 4);
    }
}
