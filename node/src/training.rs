//! The node side of training: the trainer's events go into the signed log, and every
//! finished run is sealed into a signed manifest.

use crate::identity::Identity;
use crate::log::index::Query;
use crate::log::{AppendError, AppendRequest, EventLog};
use crate::manifest::digest::DigestSet;
use crate::manifest::statement::ResourceDescriptor;
use crate::manifest::{self, EventRange, HashOptions, ManifestError, NamedBytes, NamedFile, RunFacts, Sealed};
use mindxtrain_trainer::events::{EventSink, TrainerEvent};
use mindxtrain_trainer::run::RunSummary;
use serde_json::Value;
use std::path::Path;
use std::time::{Duration, SystemTime};

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

/// A finished run as the node seals it: the trainer's summary and what the run read.
pub struct FinishedRun<'a> {
    pub summary: &'a RunSummary,
    /// The recipe and plan bytes the run used.
    pub recipe: NamedBytes,
    pub plan: Option<NamedBytes>,
    /// The run directory: every file under it (checkpoints, final weights or adapter,
    /// run.json, dataset.json, eval.json) becomes a subject of the manifest.
    pub out_dir: &'a Path,
    /// The weights the run started from (`--init-from`), hashed as the base model.
    pub base_dir: Option<&'a Path>,
    /// The machine the plan was measured on.
    pub hardware: Value,
}

/// Seals a finished run: the signed in-toto/SLSA manifest, its `manifest.sealed` event and
/// the anchoring request for its digest. Called by `train` and the demo at the end of
/// every run.
pub fn seal_run(log: &EventLog, key: &Identity, node_dir: &Path, run: FinishedRun) -> Result<Sealed, ManifestError> {
    let s = run.summary;
    let mut seqs = log.query(&Query::Run(s.run_id.clone())).map_err(|e| ManifestError::Log(e.to_string()))?;
    if seqs.is_empty() {
        seqs = log.query(&Query::Subject(s.run_id.clone())).map_err(|e| ManifestError::Log(e.to_string()))?;
    }
    let (Some(&first), Some(&last)) = (seqs.first(), seqs.last()) else {
        return Err(ManifestError::Invalid(format!("no events of run {} in the log", s.run_id)));
    };
    let base_model = match run.base_dir {
        Some(dir) => regular_files(dir)?,
        None => Vec::new(),
    };
    let digest = DigestSet { blake3: Some(s.dataset_digest.clone()), ..Default::default() };
    let dataset = ResourceDescriptor { name: Some("dataset".into()), digest: Some(digest), ..Default::default() };
    let eval = run.out_dir.join("eval.json");
    let finished = SystemTime::now();
    let facts = RunFacts {
        run_id: s.run_id.clone(),
        recipe: run.recipe,
        plan: run.plan,
        output_dir: run.out_dir.to_path_buf(),
        base_model,
        base_model_uri: run.base_dir.map(|d| format!("file://{}", d.display())),
        dataset: Some(dataset),
        source: None,
        eval_json: eval.is_file().then_some(eval),
        hardware: run.hardware,
        started: finished.checked_sub(Duration::from_secs_f64(s.seconds.max(0.0))).unwrap_or(finished),
        finished,
        events: EventRange { first, last },
    };
    manifest::seal(log, key, node_dir, &facts, HashOptions::default())
}

/// The regular files directly in `dir`, sorted by name.
fn regular_files(dir: &Path) -> Result<Vec<NamedFile>, ManifestError> {
    let io = |source| ManifestError::Io { path: dir.to_path_buf(), source };
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(io)? {
        let entry = entry.map_err(io)?;
        if entry.file_type().map_err(io)?.is_file() {
            files.push(NamedFile { name: entry.file_name().to_string_lossy().into_owned(), path: entry.path() });
        }
    }
    files.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(files)
}

/// A plan measured for a recipe, written to a file and recorded as `plan.emitted`.
pub struct RecordedPlan {
    pub plan: mindxtrain_trainer::plan::Plan,
    pub bytes: Vec<u8>,
    pub blake3: [u8; 32],
    pub path: std::path::PathBuf,
}

#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    #[error("measuring the plan: {0}")]
    Measure(#[from] mindxtrain_trainer::run::RunError),
    #[error("{path}: {source}")]
    Io { path: std::path::PathBuf, source: std::io::Error },
    #[error(transparent)]
    Log(#[from] AppendError),
}

/// Measures the AOT plan of `loaded` (whose relative paths are under `recipe_dir`), writes
/// it to `path` (never over an existing file) and records `plan.emitted` (idempotent per
/// plan digest). What `mindxtrain demo` and `POST /api/runs` do before training.
pub fn measure_and_record_plan(
    log: &EventLog,
    loaded: &mindxtrain_trainer::recipe::LoadedRecipe,
    recipe_dir: &Path,
    path: &Path,
) -> Result<RecordedPlan, PlanError> {
    use mindxtrain_trainer::data::DataOptions;
    let plan = mindxtrain_trainer::run::measure_plan(loaded, recipe_dir, DataOptions::default())?;
    let bytes = plan.to_bytes();
    crate::fsutil::write_new_durably(path, &bytes, 0o644)
        .map_err(|source| PlanError::Io { path: path.to_path_buf(), source })?;
    let blake3 = *blake3::hash(&bytes).as_bytes();
    let digest = hex::encode(blake3);
    let data = serde_json::json!({"plan_blake3": digest, "recipe_blake3": plan.recipe_blake3, "choices": plan.choices,
        "file": path.display().to_string(), "elapsed_ms": plan.elapsed_ms, "truncated": plan.truncated});
    log.append(AppendRequest::new(PLAN_EMITTED, digest.clone(), data).with_id(format!("plan:{digest}")))?;
    Ok(RecordedPlan { plan, bytes, blake3, path: path.to_path_buf() })
}
