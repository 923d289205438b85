//! Which GPU attention kernels run: the AOT plan's attention choice, carried in the
//! [`crate::KernelConfig`] of the model that runs them, so every step of a run uses the same
//! kernels.
//!
//! ```
//! use mindxtrain_kernels::attention::AttentionKernels;
//! let split = AttentionKernels { key_tile: 32, dq_splits: 2 };
//! assert!(split.validate().is_ok());
//! assert!(!split.deterministic());
//! assert!(AttentionKernels { key_tile: 48, dq_splits: 1 }.validate().is_err());
//! ```

use candle_core::Result;

/// The tensor-core flash kernels' tunables (bf16, head size 64 or 128; other cases have one
/// kernel each and ignore this).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AttentionKernels {
    /// Keys per tile of the forward kernel: one of [`KEY_TILES`].
    pub key_tile: usize,
    /// Thread blocks that share one query block's dQ: 1 is the deterministic backward (one
    /// block owns each dQ tile); more split its keys and add the parts with f32 atomics, whose
    /// order varies between runs.
    pub dq_splits: usize,
}

/// The forward key tiles the kernels are instantiated for.
pub const KEY_TILES: [usize; 2] = [64, 32];
/// The most dQ splits accepted.
pub const MAX_DQ_SPLITS: usize = 8;

impl AttentionKernels {
    pub const DEFAULT: AttentionKernels = AttentionKernels { key_tile: 64, dq_splits: 1 };

    /// Whether two runs with the same inputs give the same bits.
    pub fn deterministic(&self) -> bool {
        self.dq_splits == 1
    }

    pub fn validate(&self) -> Result<()> {
        if !KEY_TILES.contains(&self.key_tile) {
            candle_core::bail!("attention: key tile {} is not one of {KEY_TILES:?}", self.key_tile);
        }
        if !(1..=MAX_DQ_SPLITS).contains(&self.dq_splits) {
            candle_core::bail!("attention: dq splits {} is not in 1..={MAX_DQ_SPLITS}", self.dq_splits);
        }
        Ok(())
    }
}

impl Default for AttentionKernels {
    fn default() -> Self {
        Self::DEFAULT
    }
}
