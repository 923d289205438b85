//! Post-training quantization (`quantize: fp8`, `mindxtrain quantize`): FP8 E4M3 weights with
//! per-output-channel (or per-tensor) scales, activations quantized per token at run time,
//! written as an HF directory in the compressed-tensors format that transformers and vLLM load.
//!
//! * `e4m3`: the FP8 codec; `fp8`: one matrix to codes and scales and back;
//! * `targets`: which tensors are quantized; `config`: the `quantization_config`;
//! * `dir`: a model directory to its quantized directory; `step`: the pipeline's step in a run.

mod config;
mod dir;
mod e4m3;
mod error;
mod fp8;
mod step;
mod targets;

pub use config::{Fp8Options, SCHEME, quantization_config};
pub use dir::{Quantized, quantize_dir};
pub use e4m3::{E4M3_MAX, decode, encode};
pub use error::QuantizeError;
pub use fp8::{Fp8Weight, Granularity, quantize};
pub use step::{MODEL_QUANTIZED, QUANTIZED_DIR, after_training, event_data};
pub use targets::{Treatment, treatment};

use crate::checkpoint::StagedDir;

/// The last component of `path`, for naming a file of a directory.
fn file_name(path: &std::path::Path) -> String {
    path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default()
}
