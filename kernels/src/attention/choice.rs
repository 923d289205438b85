//! Which GPU attention kernels run: the AOT plan's attention choice, process-wide and set once
//! before a run (like the thread count), so every step of a run uses the same kernels.
//!
//! ```
//! use mindxtrain_kernels::attention::{AttentionKernels, set_kernels, kernels};
//! let split = AttentionKernels { key_tile: 32, dq_splits: 2 };
//! set_kernels(split).unwrap();
//! assert_eq!(kernels(), split);
//! assert!(!split.deterministic());
//! assert!(set_kernels(AttentionKernels { key_tile: 48, dq_splits: 1 }).is_err());
//! set_kernels(AttentionKernels::DEFAULT).unwrap();
//! ```

use candle_core::Result;
use std::sync::atomic::{AtomicUsize, Ordering};

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

static KEY_TILE: AtomicUsize = AtomicUsize::new(AttentionKernels::DEFAULT.key_tile);
static DQ_SPLITS: AtomicUsize = AtomicUsize::new(AttentionKernels::DEFAULT.dq_splits);

/// Selects the kernels every later attention call uses; refuses values no kernel exists for.
pub fn set_kernels(k: AttentionKernels) -> Result<()> {
    k.validate()?;
    KEY_TILE.store(k.key_tile, Ordering::Relaxed);
    DQ_SPLITS.store(k.dq_splits, Ordering::Relaxed);
    Ok(())
}

/// The kernels selected now.
pub fn kernels() -> AttentionKernels {
    AttentionKernels { key_tile: KEY_TILE.load(Ordering::Relaxed), dq_splits: DQ_SPLITS.load(Ordering::Relaxed) }
}
