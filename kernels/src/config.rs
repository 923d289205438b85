//! The kernels' tunables as a value: what the AOT plan chose (CPU GEMM blocking, the GPU
//! attention kernels, the GEMM algorithm of each shape), owned by whoever runs the model and
//! passed to every op that reads it.
//!
//! Training and serving can live in one process (the API server starts runs inside the node
//! that serves; RL rollouts generate while they train), each with its own plan, so nothing
//! here is process-wide: a [`KernelConfig`] is cloned into the model it configures, and two
//! models with two configs run side by side.
//!
//! ```
//! use mindxtrain_kernels::KernelConfig;
//! use mindxtrain_kernels::attention::AttentionKernels;
//! use mindxtrain_kernels::gemm_algos::{GemmAlgo, GemmShape};
//! let shape = GemmShape { m: 1024, n: 4096, k: 1024, transa: true, transb: false, bf16: true };
//! let split = AttentionKernels { key_tile: 32, dq_splits: 2 };
//! let cfg = KernelConfig::new(64, split).unwrap()
//!     .with_gemm_algos([(shape, GemmAlgo::Lt { index: 2, algo: "00".repeat(64) })]).unwrap();
//! assert!(matches!(cfg.gemm_algo(&shape), Some(GemmAlgo::Lt { index: 2, .. })));
//! assert_eq!(cfg.attention(), split);
//! // Values no kernel exists for are refused.
//! assert!(KernelConfig::new(64, AttentionKernels { key_tile: 48, dq_splits: 1 }).is_err());
//! assert!(cfg.clone().with_gemm_algos([(shape, GemmAlgo::Lt { index: 0, algo: "zz".into() })]).is_err());
//! // The default is what a run without a plan gets.
//! assert_eq!(KernelConfig::default().gemm_rows(), mindxtrain_kernels::linear::DEFAULT_BLOCK_ROWS);
//! ```

use crate::attention::AttentionKernels;
use crate::gemm_algos::{GemmAlgo, GemmShape};
use crate::moe::MoeKernels;
use candle_core::Result;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

/// What the kernels may be told; cheap to clone (the GEMM table is shared).
#[derive(Debug, Clone)]
pub struct KernelConfig {
    gemm_rows: usize,
    attention: AttentionKernels,
    gemm_algos: Arc<BTreeMap<GemmShape, GemmAlgo>>,
    shapes: Option<GemmShapeLog>,
    moe: MoeKernels,
    gemv_rows: usize,
}

impl Default for KernelConfig {
    fn default() -> Self {
        KernelConfig {
            gemm_rows: crate::linear::DEFAULT_BLOCK_ROWS,
            attention: AttentionKernels::DEFAULT,
            gemm_algos: Arc::default(),
            shapes: None,
            moe: MoeKernels::default(),
            gemv_rows: crate::linear::DEFAULT_GEMV_ROWS,
        }
    }
}

impl KernelConfig {
    /// `gemm_rows`: token rows per task of the CPU linear kernels (at least 1); `attention`: the
    /// GPU flash kernels, refused when no kernel exists for them.
    pub fn new(gemm_rows: usize, attention: AttentionKernels) -> Result<KernelConfig> {
        attention.validate()?;
        Ok(KernelConfig { gemm_rows: gemm_rows.max(1), attention, ..KernelConfig::default() })
    }

    /// The same with this table of GEMM algorithms (shapes not in it use cuBLAS's default);
    /// refused if any entry is malformed.
    pub fn with_gemm_algos(
        mut self,
        algos: impl IntoIterator<Item = (GemmShape, GemmAlgo)>,
    ) -> std::result::Result<KernelConfig, String> {
        let table: BTreeMap<GemmShape, GemmAlgo> = algos.into_iter().collect();
        for algo in table.values() {
            algo.lt_bytes()?;
        }
        self.gemm_algos = Arc::new(table);
        Ok(self)
    }

    /// The same, noting the shape of every GEMM it runs into the returned log (the probe's
    /// way of learning which shapes a step uses).
    pub fn recording_shapes(self) -> (KernelConfig, GemmShapeLog) {
        let log = GemmShapeLog::default();
        (self.recording_into(&log), log)
    }

    /// The same, noting GEMM shapes into an existing log (several configs, one log).
    pub fn recording_into(mut self, log: &GemmShapeLog) -> KernelConfig {
        self.shapes = Some(log.clone());
        self
    }

    /// The same with these grouped-GEMM settings (mixture-of-experts layers).
    pub fn with_moe(mut self, moe: MoeKernels) -> KernelConfig {
        self.moe = moe;
        self
    }

    /// The same with bf16 `x·Wᵀ` of up to `rows` rows on the GPU going to the bandwidth-bound
    /// GEMV rather than cuBLAS (0: never; the kernel serves at most 8 rows). The benchmarks
    /// turn it off to time the cuBLAS path beside it.
    pub fn with_gemv_rows(mut self, rows: usize) -> KernelConfig {
        self.gemv_rows = rows;
        self
    }

    /// Rows up to which a GPU `x·Wᵀ` runs the GEMV (see [`KernelConfig::with_gemv_rows`]).
    pub fn gemv_rows(&self) -> usize {
        self.gemv_rows
    }

    /// The grouped GEMMs' tile and expert order.
    pub fn moe(&self) -> MoeKernels {
        self.moe
    }

    pub fn gemm_rows(&self) -> usize {
        self.gemm_rows
    }

    pub fn attention(&self) -> AttentionKernels {
        self.attention
    }

    /// The algorithm chosen for `shape`, if the table has one.
    pub fn gemm_algo(&self, shape: &GemmShape) -> Option<&GemmAlgo> {
        self.gemm_algos.get(shape)
    }

    /// Notes a GEMM about to run (a no-op unless recording).
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub(crate) fn note(&self, shape: GemmShape) {
        if let Some(log) = &self.shapes {
            log.0.lock().unwrap_or_else(|e| e.into_inner()).insert(shape);
        }
    }
}

/// The distinct GEMM shapes a [`KernelConfig::recording_shapes`] config has run.
#[derive(Debug, Clone, Default)]
pub struct GemmShapeLog(Arc<Mutex<BTreeSet<GemmShape>>>);

impl GemmShapeLog {
    /// The shapes seen so far, in order.
    pub fn shapes(&self) -> Vec<GemmShape> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).iter().copied().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recording_collects_distinct_shapes_of_its_own_config_only() {
        let s = |m| GemmShape { m, n: 2, k: 3, transa: false, transb: true, bf16: false };
        let plain = KernelConfig::default();
        let (recording, log) = plain.clone().recording_shapes();
        plain.note(s(1));
        for m in [5, 4, 5] {
            recording.note(s(m));
        }
        assert_eq!(log.shapes(), [s(4), s(5)]);
        // A clone shares the log (the model and its reference copy record into one).
        recording.clone().note(s(6));
        assert_eq!(log.shapes(), [s(4), s(5), s(6)]);
    }
}
