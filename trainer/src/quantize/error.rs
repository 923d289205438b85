//! What quantizing a model can fail on.

use std::path::PathBuf;

use thiserror::Error;

use crate::checkpoint::CheckpointError;

#[derive(Debug, Error)]
pub enum QuantizeError {
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    #[error("tensor `{name}`: {source}")]
    Tensor { name: String, source: candle_core::Error },
    #[error("{path}: {message}")]
    Io { path: PathBuf, message: String },
    #[error("{path}: {message}")]
    BadConfig { path: PathBuf, message: String },
    #[error("tensor `{name}` has shape {dims:?}: FP8 weights are [out_features, in_features] matrices")]
    NotAMatrix { name: String, dims: Vec<usize> },
    #[error("tensor `{name}` holds {value} at row {row}: a weight that is not finite has no FP8 code")]
    NotFinite { name: String, row: usize, value: f32 },
    #[error("{path} is quantized already (its config.json has a quantization_config)")]
    AlreadyQuantized { path: PathBuf },
    #[error(
        "{path} holds a LoRA adapter: merge it into its base first (`mindxtrain export RECIPE --checkpoint {path} \
         --merge --out DIR`) and quantize DIR; a run whose recipe sets quantize.enabled does this itself"
    )]
    Adapter { path: PathBuf },
    /// A model this build cannot quantize correctly, named.
    #[error("{0}")]
    NotBuilt(String),
}

impl QuantizeError {
    pub(super) fn tensor(name: &str) -> impl FnOnce(candle_core::Error) -> QuantizeError + '_ {
        move |source| QuantizeError::Tensor { name: name.to_string(), source }
    }

    pub(super) fn io(path: &std::path::Path) -> impl FnOnce(std::io::Error) -> QuantizeError + '_ {
        move |e| QuantizeError::Io { path: path.to_path_buf(), message: e.to_string() }
    }
}
