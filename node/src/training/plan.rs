//! Measuring a run's AOT plan, writing it once and recording it as `plan.emitted`.

use super::PLAN_EMITTED;
use crate::log::{AppendError, AppendRequest, EventLog};
use mindxtrain_trainer::data::DataOptions;
use mindxtrain_trainer::plan::Plan;
use mindxtrain_trainer::recipe::LoadedRecipe;
use std::path::{Path, PathBuf};

/// A plan written to a file: the plan, its bytes and their BLAKE3.
pub struct RecordedPlan {
    pub plan: Plan,
    pub bytes: Vec<u8>,
    pub blake3: [u8; 32],
    pub path: PathBuf,
}

#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    #[error("measuring the plan: {0}")]
    Measure(#[from] mindxtrain_trainer::run::RunError),
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error(transparent)]
    Log(#[from] AppendError),
}

impl RecordedPlan {
    /// Writes `plan` to `path`, never over an existing file: a plan's identity is its bytes.
    pub fn write(plan: Plan, path: &Path) -> Result<RecordedPlan, PlanError> {
        let bytes = plan.to_bytes();
        crate::fsutil::write_new_durably(path, &bytes, 0o644)
            .map_err(|source| PlanError::Io { path: path.to_path_buf(), source })?;
        let blake3 = *blake3::hash(&bytes).as_bytes();
        Ok(RecordedPlan { plan, bytes, blake3, path: path.to_path_buf() })
    }

    /// Records `plan.emitted` (idempotent per plan digest); returns its seq.
    pub fn record(&self, log: &EventLog) -> Result<u64, AppendError> {
        let digest = hex::encode(self.blake3);
        let p = &self.plan;
        let data = serde_json::json!({"plan_blake3": digest, "recipe_blake3": p.recipe_blake3, "choices": p.choices,
            "file": self.path.display().to_string(), "elapsed_ms": p.elapsed_ms, "truncated": p.truncated});
        Ok(log.append(AppendRequest::new(PLAN_EMITTED, digest.clone(), data).with_id(format!("plan:{digest}")))?.seq)
    }
}

/// Measures the AOT plan of `loaded` (whose relative paths are under `recipe_dir`), writes
/// it to `path` and records `plan.emitted`: what a run given no plan does first.
pub fn measure_and_record_plan(
    log: &EventLog,
    loaded: &LoadedRecipe,
    recipe_dir: &Path,
    data: DataOptions,
    path: &Path,
) -> Result<RecordedPlan, PlanError> {
    let plan = mindxtrain_trainer::run::measure_plan(loaded, recipe_dir, data)?;
    let recorded = RecordedPlan::write(plan, path)?;
    recorded.record(log)?;
    Ok(recorded)
}
