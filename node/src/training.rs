//! The node side of training: one driver ([`train_and_seal`]) that the CLI, the demo and
//! the operator API all run, the trainer's events in the signed log, every finished run
//! sealed into a signed manifest, and the runs read back from the log.
//!
//! * `driver`: recipe bytes read once, the output directory checked, the plan given or
//!   probed, the run trained and sealed;
//! * `plan`: measuring a plan and recording `plan.emitted`;
//! * `seal`: the manifest of a finished run;
//! * `env`: the recipe's `train.env` in the training process's environment;
//! * `history`: every run the log knows of, CLI and API alike, with its phase;
//! * `tensorboard`: scalar event files for TensorBoard.

mod driver;
pub mod env;
mod history;
pub mod launch;
mod plan;
mod seal;
pub mod tensorboard;

pub use driver::{
    Hooks, Origin, PLAN_FILE, PlanSource, RUN_FILES, RecipeInput, RecipeInputError, TrainError, TrainRequest, Trained,
    UsedPlan, prepare_out_dir, train_and_seal,
};
pub use history::{Phase, RunInfo, run_history};
pub use plan::{PlanError, ProbeInput, RecordedPlan, measure_and_record_plan, parallel_plan};
pub use seal::{FinishedRun, seal_run};

use crate::log::{AppendError, AppendRequest, EventLog};
use mindxtrain_trainer::events::{EventSink, TrainerEvent};

/// Kind of the event that records a measured autotune plan.
pub const PLAN_EMITTED: &str = "plan.emitted";

/// Appends every trainer event to the log; `emit` returns once the event is fsynced, so a
/// run never gets ahead of its record.
pub struct LogSink<'a> {
    log: &'a EventLog,
}

impl<'a> LogSink<'a> {
    pub fn new(log: &'a EventLog) -> Self {
        LogSink { log }
    }
}

impl EventSink for LogSink<'_> {
    type Error = AppendError;

    fn emit(&mut self, event: TrainerEvent) -> Result<(), AppendError> {
        self.log.append(AppendRequest::new(event.kind, event.subject, event.data))?;
        Ok(())
    }
}

/// Keeps freed memory in the process for reuse, for the programs that train.
///
/// A training step frees and reallocates the same activation buffers every step. glibc
/// serves blocks above 128 KiB with mmap and returns them with munmap, so each step
/// page-faulted its buffers back in: 14% of a CPU step at the demo's shapes. With these
/// thresholds (the largest glibc takes) freed blocks stay in the heap and are reused.
/// Process-wide, so binaries call it first thing; elsewhere than glibc it does nothing.
pub fn keep_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes allocator thresholds; called before other threads start.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 1 << 30);
    }
}
