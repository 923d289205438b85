use thiserror::Error;

#[derive(Debug, Error)]
pub enum OptimError {
    #[error("no gradient for parameter `{0}`")]
    MissingGrad(String),
    #[error("gradient `{name}` has shape {grad:?}, parameter has {param:?}")]
    ShapeMismatch { name: String, param: Vec<usize>, grad: Vec<usize> },
    #[error("optimizer state: {0}")]
    State(String),
    #[error("schedule: {0}")]
    Schedule(String),
    #[error(transparent)]
    Tensor(#[from] candle_core::Error),
}
