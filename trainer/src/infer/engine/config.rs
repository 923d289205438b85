//! How an engine is sized and what it does between steps.

use super::EngineError;
use crate::infer::kv::KvBlocks;

/// How the engine is sized.
#[derive(Debug, Clone, PartialEq)]
pub struct EngineConfig {
    /// Tokens per cache block.
    pub block_size: usize,
    /// Prompt plus completion tokens one request may reach.
    pub max_model_len: usize,
    /// Sequences in one step at most.
    pub max_num_seqs: usize,
    /// Tokens in one step at most (decodes plus prefill chunks).
    pub max_batched_tokens: usize,
    pub kv_blocks: KvBlocks,
    /// Reuse the cached blocks of a shared prompt prefix.
    pub prefix_caching: bool,
    /// Adapters served at once over the base.
    pub max_adapters: usize,
    /// CPU threads the engine computes with on the CPU backend. On a CUDA device every step is
    /// queued from one thread whatever this says: candle queues CUDA work on the calling
    /// thread's own stream, so steps queued from two threads would not be ordered.
    pub threads: usize,
    /// Replay pure decode steps as CUDA graphs, one per batch-size bucket (CUDA devices and
    /// models without MoE layers, the dense hybrids included; elsewhere steps always run directly).
    pub cuda_graphs: bool,
    /// Queue each decode step before reading the tokens of the one before it (the next step
    /// decodes the ids where they were drawn, on the device), so the host's work between steps
    /// (reading tokens, detokenizing, scheduling, streaming) overlaps the device's. Tokens are
    /// the same either way; a request that ends costs its row one step of wasted work.
    pub overlap_steps: bool,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            block_size: 16,
            max_model_len: 4096,
            max_num_seqs: 64,
            max_batched_tokens: 2048,
            kv_blocks: KvBlocks::FreeMemory(0.5),
            prefix_caching: true,
            max_adapters: 8,
            threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
            cuda_graphs: true,
            overlap_steps: true,
        }
    }
}

impl EngineConfig {
    pub fn validate(&self) -> Result<(), EngineError> {
        let bad = |m: String| Err(EngineError::Config(m));
        if self.block_size == 0 || self.max_model_len == 0 || self.max_num_seqs == 0 {
            return bad("block_size, max_model_len and max_num_seqs must be at least 1".into());
        }
        if self.max_batched_tokens < self.max_num_seqs {
            return bad(format!(
                "max_batched_tokens {} is below max_num_seqs {}: a step could not decode every running sequence",
                self.max_batched_tokens, self.max_num_seqs
            ));
        }
        Ok(())
    }
}
