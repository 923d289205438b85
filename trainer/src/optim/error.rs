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
    /// Refused at check time too; a recipe that skipped the check gets this.
    #[error("train.optimizer.name: adamw_8bit is not built; use adamw, lion, adafactor or sgd")]
    AdamW8bitNotBuilt,
    /// A checkpoint's optimizer state read by another optimizer would be misread (Lion's
    /// `exp_avg` is not AdamW's), so a resume must keep the optimizer.
    #[error(
        "the checkpoint holds optimizer state of {saved}, but the recipe's train.optimizer.name is {recipe}: \
         resume with train.optimizer.name: {saved}, or start a new run"
    )]
    OtherOptimizer { saved: String, recipe: String },
    #[error(transparent)]
    Tensor(#[from] candle_core::Error),
}
