//! Measuring a run's AOT plan, writing it once and recording it as `plan.emitted`.

use super::PLAN_EMITTED;
use super::launch::{self, Launch, RankCommand};
use crate::log::{AppendError, AppendRequest, EventLog};
use mindxtrain_trainer::data::DataOptions;
use mindxtrain_trainer::plan::{CollectiveStage, ParallelPlan, Plan};
use mindxtrain_trainer::recipe::{LoadedRecipe, Sharding};
use mindxtrain_trainer::run::RunError;
use std::path::{Path, PathBuf};
use std::time::Duration;

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
            "file": self.path.display().to_string(), "elapsed_ms": p.elapsed_ms, "truncated": p.truncated,
            "parallel": p.parallel, "env": p.env, "note": p.note, "warnings": p.warnings});
        Ok(log.append(AppendRequest::new(PLAN_EMITTED, digest.clone(), data).with_id(format!("plan:{digest}")))?.seq)
    }
}

/// What a plan is measured for: the recipe (its relative paths under `recipe_dir`), the base
/// the run is given (`--init-from`; `None` takes the recipe's own) and the data options.
#[derive(Clone, Copy)]
pub struct ProbeInput<'a> {
    pub loaded: &'a LoadedRecipe,
    pub recipe_dir: &'a Path,
    pub init_from: Option<&'a Path>,
    pub data: DataOptions,
}

/// Measures the AOT plan of `input`, writes it to `path` and records `plan.emitted`: what a
/// run given no plan does first. A run on several ranks (`launched`) also gets the collective
/// stage: its layout (with `global_batch`, a resumed run's, else the recipe's at this world
/// size) and the collective environment that won, written into the plan's `env`.
pub fn measure_and_record_plan(
    log: &EventLog,
    input: ProbeInput<'_>,
    path: &Path,
    launched: Option<(&Launch, &RankCommand)>,
    global_batch: Option<u64>,
) -> Result<RecordedPlan, PlanError> {
    let mut plan = mindxtrain_trainer::run::measure_plan(input.loaded, input.recipe_dir, input.init_from, input.data)?;
    if let Some((launch, cmd)) = launched {
        plan.parallel = Some(parallel_plan(input, launch, cmd, global_batch)?);
        let chosen = plan.parallel.as_ref().map(|p| p.collective.chosen.clone()).unwrap_or_default();
        plan.env.extend(chosen.into_iter().map(|(k, v)| (k, Some(v))));
    }
    let recorded = RecordedPlan::write(plan, path)?;
    recorded.record(log)?;
    Ok(recorded)
}

/// The layout of a run on the ranks of `launch` and its collective stage (a recorded no-op at
/// one rank).
pub fn parallel_plan(
    input: ProbeInput<'_>,
    launch: &Launch,
    cmd: &RankCommand,
    global_batch: Option<u64>,
) -> Result<ParallelPlan, PlanError> {
    let r = &input.loaded.recipe;
    let world = launch.world() as u64;
    let per_device = u64::from(r.train.batch.per_device);
    let global_batch = global_batch.unwrap_or(per_device * u64::from(r.train.batch.grad_accum) * world);
    let grad_accum = mindxtrain_trainer::parallel::accumulation(global_batch, per_device, launch.world())
        .map_err(|e| PlanError::Measure(RunError::Recipe(e)))?;
    let sharding = r.train.distributed.sharding(r.train.fsdp);
    let (buckets, dtype) = mindxtrain_trainer::run::gradient_buckets(input.loaded, input.recipe_dir, input.init_from)?;
    let op = if matches!(sharding, Sharding::Zero2 | Sharding::Zero3) { "reduce_scatter" } else { "all_reduce" };
    let collective = if launch.world() == 1 {
        CollectiveStage { skipped: Some("one rank: nothing to reduce".into()), ..CollectiveStage::default() }
    } else if !r.autotune.enabled {
        CollectiveStage { skipped: Some("autotune.enabled is false".into()), ..CollectiveStage::default() }
    } else {
        let base_env = r.train.env.clone();
        let dtype = match dtype {
            candle_core::DType::BF16 => "bf16",
            candle_core::DType::F16 => "f16",
            _ => "f32",
        };
        let budget = Duration::from_secs(u64::from(r.autotune.budget_seconds));
        launch::collective_stage(
            launch,
            cmd,
            &hex::encode(input.loaded.bytes_blake3),
            &base_env,
            &buckets,
            dtype,
            op,
            budget,
        )
    };
    Ok(ParallelPlan {
        world_size: launch.world(),
        nnodes: launch.nnodes,
        ranks_per_node: launch.ranks_per_node,
        backend: launch.backend,
        sharding,
        per_device,
        grad_accum,
        global_batch,
        bucket_bytes: r.train.distributed.bucket_bytes() as u64,
        buckets,
        collective,
    })
}
