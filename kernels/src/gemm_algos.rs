//! Which GEMM algorithm runs for each distinct GEMM shape: the AOT plan's GEMM axis.
//!
//! On a GPU every GEMM of the linear ops goes through cuBLAS. The probe records the shapes a
//! training step uses ([`crate::KernelConfig::recording_shapes`]), times cuBLAS's default
//! against cuBLASLt's heuristic candidates for each (`time_candidates`, feature `cuda`), and the
//! plan keeps the fastest. A run puts the plan's table into its [`crate::KernelConfig`]
//! ([`crate::KernelConfig::with_gemm_algos`]); shapes not in it use the default. Nothing is
//! tuned while a run trains.

use serde::{Deserialize, Serialize};

/// One GEMM in cuBLAS's column-major terms: `C[m × n] = op(A)·op(B)` with `op(A)` of `m × k`
/// (`A` stored transposed when `transa`) and `op(B)` of `k × n`; every matrix is dense, so the
/// leading dimensions follow from the shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GemmShape {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub transa: bool,
    pub transb: bool,
    /// bf16 operands (f32 accumulation); f32 otherwise.
    pub bf16: bool,
}

impl GemmShape {
    /// Multiply-adds ×2.
    pub fn flops(&self) -> f64 {
        2.0 * self.m as f64 * self.n as f64 * self.k as f64
    }
}

/// The algorithm a GEMM shape runs with.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind", deny_unknown_fields)]
pub enum GemmAlgo {
    /// cuBLAS's own choice (`cublasGemmEx`).
    Default,
    /// A cuBLASLt algorithm: `index` is its rank among the heuristic's candidates when it was
    /// measured, `algo` the opaque `cublasLtMatmulAlgo_t` (64 bytes, hex), valid for the cuBLAS
    /// version and GPU it was measured on.
    Lt { index: usize, algo: String },
}

/// Bytes in a `cublasLtMatmulAlgo_t`.
pub const LT_ALGO_BYTES: usize = 64;

impl GemmAlgo {
    /// The cuBLASLt algorithm's bytes, checked.
    pub fn lt_bytes(&self) -> Result<Option<[u8; LT_ALGO_BYTES]>, String> {
        let GemmAlgo::Lt { algo, .. } = self else { return Ok(None) };
        let bytes = (0..algo.len())
            .step_by(2)
            .map(|i| algo.get(i..i + 2).and_then(|h| u8::from_str_radix(h, 16).ok()))
            .collect::<Option<Vec<u8>>>()
            .ok_or_else(|| format!("gemm algorithm {algo:?} is not hex"))?;
        bytes
            .try_into()
            .map(Some)
            .map_err(|b: Vec<u8>| format!("gemm algorithm has {} bytes, not {LT_ALGO_BYTES}", b.len()))
    }

    /// A short label for tables: `default` or `lt#3`.
    pub fn label(&self) -> String {
        match self {
            GemmAlgo::Default => "default".into(),
            GemmAlgo::Lt { index, .. } => format!("lt#{index}"),
        }
    }
}

#[cfg(feature = "cuda")]
pub use crate::gpu::lt::{GemmTiming, time_candidates};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn algorithms_round_trip_through_json_and_bad_hex_is_refused() {
        let lt = GemmAlgo::Lt { index: 1, algo: "ab".repeat(64) };
        let json = serde_json::to_string(&lt).unwrap();
        assert_eq!(serde_json::from_str::<GemmAlgo>(&json).unwrap(), lt);
        assert_eq!(lt.lt_bytes().unwrap().unwrap(), [0xab; 64]);
        assert_eq!(GemmAlgo::Default.lt_bytes().unwrap(), None);
        assert!(GemmAlgo::Lt { index: 0, algo: "ab".repeat(63) }.lt_bytes().is_err());
        assert!(GemmAlgo::Lt { index: 0, algo: "é".repeat(64) }.lt_bytes().is_err());
        assert_eq!(serde_json::to_string(&GemmAlgo::Default).unwrap(), r#"{"kind":"default"}"#);
    }
}
