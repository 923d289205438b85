//! Training runs: recipe + plan in, checkpoints, eval and events out.
//!
//! [`train`] prepares everything a run needs (tokenizer, data, model, adapters,
//! optimizer, schedule), resumes from the newest complete checkpoint when asked, then
//! steps until the budget is spent. It reports through the [`EventSink`]: `run.started`,
//! `train.progress` every `log_every_steps`, `checkpoint.saved` with file digests,
//! `eval.completed`, and `run.finished` or `run.failed` with the error. Nothing is
//! re-tuned while it runs: thread count, micro-batch split and activation checkpointing
//! come from the plan verbatim.
//!
//! Everything random is derived from the recipe seed and the step (dropout masks) or the
//! epoch (data order), so the state a resume needs is the step, the data cursor, the
//! optimizer moments and the weights — and a resumed run is bitwise identical to an
//! uninterrupted one.

mod autotune;
mod device;
pub mod eval;
#[cfg(all(test, feature = "cuda"))]
mod gpu_tests;
mod layout;
mod method;
mod microbatch;
mod session;
mod threads;

pub use autotune::measure_plan;
pub use device::{device_name, run_device};
pub use eval::{EvalReport, check_regression, evaluate};
pub use layout::{OutDir, RunRecord};
pub use method::MethodPlan;
pub use session::{Session, evaluate_checkpoint, load_checkpoint};
pub use threads::{apply_choices, apply_plan, apply_threads};

use crate::checkpoint::{CheckpointError, FileDigest as SavedFile};
use crate::data::{DataError, DataOptions};
use crate::events::EventSink;
use crate::model::ModelError;
use crate::optim::OptimError;
use crate::plan::Plan;
use crate::recipe::LoadedRecipe;
use std::path::PathBuf;
use thiserror::Error;

/// Everything a run is made from.
#[derive(Debug, Clone)]
pub struct RunSpec {
    pub recipe: LoadedRecipe,
    /// Relative paths in the recipe are taken from here.
    pub recipe_dir: PathBuf,
    pub plan: Plan,
    pub plan_blake3: [u8; 32],
    pub out_dir: PathBuf,
    /// Continue from the newest complete checkpoint in `out_dir`.
    pub resume: bool,
    pub data: DataOptions,
    /// Start from this HF checkpoint directory instead of `model.path` / random init.
    pub init_from: Option<PathBuf>,
    /// Prompts generated and scored per evaluation.
    pub eval_prompts: usize,
}

/// What a finished run produced.
#[derive(Debug, Clone)]
pub struct RunSummary {
    pub run_id: String,
    pub steps: u64,
    pub final_loss: Option<f64>,
    pub tokens: u64,
    pub seconds: f64,
    /// The trained weights (HF layout) or adapter (PEFT layout).
    pub final_dir: PathBuf,
    pub files: Vec<SavedFile>,
    pub eval: Option<EvalReport>,
    pub dataset_digest: String,
}

/// One optimizer step, for progress displays.
#[derive(Debug, Clone, PartialEq)]
pub struct StepReport {
    pub step: u64,
    pub total_steps: u64,
    /// Per-token mean loss of the step.
    pub loss: f64,
    pub lr: f64,
    pub grad_norm: f64,
    pub tokens_per_s: f64,
    pub elapsed_s: f64,
}

/// Sees every step (the event log only gets every `log_every_steps`-th); the node draws
/// its progress bar here.
pub trait Observer {
    fn started(&mut self, _first_step: u64, _total_steps: u64) {}
    fn step(&mut self, _report: &StepReport) {}
    fn note(&mut self, _message: &str) {}
    /// Asked after every step: `true` stops the run there, after a checkpoint (so
    /// `--resume` continues from it), with `run.cancelled` and [`RunError::Cancelled`].
    fn cancelled(&mut self) -> bool {
        false
    }
}

/// An observer that ignores everything.
pub struct Quiet;
impl Observer for Quiet {}

#[derive(Debug, Error)]
pub enum RunError {
    #[error(transparent)]
    Data(#[from] DataError),
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error(transparent)]
    Optim(#[from] OptimError),
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    #[error(transparent)]
    Plan(#[from] crate::plan::PlanError),
    #[error(transparent)]
    Eval(#[from] eval::EvalError),
    #[error("tensor: {0}")]
    Tensor(#[from] candle_core::Error),
    #[error("recipe: {0}")]
    Recipe(String),
    #[error("{path}: {message}")]
    Io { path: String, message: String },
    #[error("recording an event failed, so the run stopped: {0}")]
    Events(String),
    #[error("loss became {value} at step {step}: the run diverged (lower the learning rate?)")]
    Diverged { step: u64, value: f64 },
    #[error("cancelled after step {step} (checkpointed: resume continues from there)")]
    Cancelled { step: u64 },
}

/// Runs `spec` to the end, reporting to `sink` and `observer`.
pub fn train(
    spec: &RunSpec,
    sink: &mut (impl EventSink + Send),
    observer: &mut (dyn Observer + Send),
) -> Result<RunSummary, RunError> {
    spec.plan.check_recipe(&spec.recipe.bytes_blake3, "plan")?;
    let pool = apply_plan(&spec.plan)?;
    pool.install(|| Session::open(spec, sink)?.run(sink, observer))
}
