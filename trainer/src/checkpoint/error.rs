use std::path::PathBuf;

use thiserror::Error;

#[derive(Debug, Error)]
pub enum CheckpointError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{dir}: no model.safetensors and no model.safetensors.index.json")]
    NoWeights { dir: PathBuf },
    #[error("{path}: bad index: {reason}")]
    BadIndex { path: PathBuf, reason: String },
    #[error("{index}: shard `{shard}` (holding `{tensor}`) does not exist")]
    MissingShard { index: PathBuf, shard: String, tensor: String },
    #[error("{path}: not a valid safetensors file: {reason}")]
    BadSafetensors { path: PathBuf, reason: String },
    #[error("{file}: tensor `{name}` is missing")]
    MissingTensor { name: String, file: PathBuf },
    #[error("{file}: tensor `{name}` has shape {found:?}, expected {expected:?}")]
    ShapeMismatch { name: String, file: PathBuf, expected: Vec<usize>, found: Vec<usize> },
    #[error("{file}: tensor `{name}` has dtype {dtype}; only bf16, f16 and f32 weights load")]
    UnsupportedDtype { name: String, file: PathBuf, dtype: String },
    #[error(
        "{file}: tensor `{name}` holds FP8 codes (a quantized model, as `mindxtrain quantize` writes): loading \
         quantized weights is not built here; load the directory it was quantized from, or serve this one with \
         vLLM or transformers"
    )]
    QuantizedWeights { name: String, file: PathBuf },
    #[error("{path}: bad adapter config: {reason}")]
    BadAdapterConfig { path: PathBuf, reason: String },
    #[error("adapter tensor `{name}`: {reason}")]
    BadAdapterTensor { name: String, reason: String },
    #[error("{path}: bad training state: {reason}")]
    BadState { path: PathBuf, reason: String },
    #[error("{path}: already exists; checkpoints are never overwritten")]
    Exists { path: PathBuf },
    /// A save in a released checkpoint's layout whose weights are not that checkpoint's text model.
    #[error("{dir}: cannot be written back in its released layout: {reason}")]
    ReleasedMismatch { dir: PathBuf, reason: String },
    #[error("`{name}`: {source}")]
    Tensor { name: String, source: candle_core::Error },
}

pub(super) fn io(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> CheckpointError {
    let path = path.into();
    move |source| CheckpointError::Io { path, source }
}

pub(super) fn tensor(name: &str) -> impl FnOnce(candle_core::Error) -> CheckpointError + '_ {
    move |source| CheckpointError::Tensor { name: name.to_string(), source }
}
