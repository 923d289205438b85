//! One way to train: `train`, the demo and `POST /api/runs` all call [`train_and_seal`].
//!
//! The recipe's bytes are read once ([`RecipeInput`]): the same bytes are parsed, kept
//! under `node-dir/recipes/<blake3>.yaml`, registered, trained and sealed. The output
//! directory must be empty unless the run resumes or is told to replace an earlier run
//! ([`prepare_out_dir`]). The plan is the one given, else the recipe's `autotune.plan`,
//! else (on a resume) the run's own, else it is probed now and recorded as such; the plan
//! used is kept in the run directory as `plan.json`, so a resume needs no `--plan`.

use super::launch::{self, Job, Launch, RankCommand, TrainJob, Work};
use super::{FinishedRun, PlanError, seal_run};
use crate::energy::{Energy, Meter};
use crate::identity::Identity;
use crate::log::{AppendError, EventLog};
use crate::manifest::{ManifestError, NamedBytes, Sealed};
use crate::receipt::{ExportError, WriteError};
use mindxtrain_trainer::collective::CollectiveError;
use mindxtrain_trainer::data::DataOptions;
use mindxtrain_trainer::plan::Plan;
use mindxtrain_trainer::recipe::{LoadedRecipe, Recipe, RecipeErrors, Vendor};
use mindxtrain_trainer::run::{self, Observer, OutDir, RunError, RunSpec, RunSummary};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};

/// The plan a run used, as kept in its directory; what a run writes in its directory (and so
/// what `--force` may remove), besides the hidden and `.tmp` names of files being written.
pub use mindxtrain_trainer::run::{PLAN_FILE, RUN_FILES};

fn written_by_a_run(name: &str) -> bool {
    RUN_FILES.contains(&name) || name.starts_with('.') || name.ends_with(".tmp") || archived_plan(name)
}

/// `plan-<16 hex>.json`: the plan of an earlier world size, kept when a resume at another world
/// size measured a new one.
fn archived_plan(name: &str) -> bool {
    name.strip_prefix("plan-")
        .and_then(|r| r.strip_suffix(".json"))
        .is_some_and(|h| h.len() == 16 && h.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// A recipe as a run reads it: its bytes, read once and parsed once (the bytes registered,
/// trained and sealed are the bytes parsed), the name they are shown and sealed under, and
/// the directory its relative paths start from.
#[derive(Debug, Clone)]
pub struct RecipeInput {
    pub name: String,
    pub text: String,
    pub dir: PathBuf,
    pub loaded: LoadedRecipe,
}

/// Why a recipe could not be read.
#[derive(Debug, thiserror::Error)]
pub enum RecipeInputError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{0}")]
    Invalid(RecipeErrors),
}

impl RecipeInput {
    /// Parses `text`, reported against `name`.
    pub fn parse(name: String, text: String, dir: PathBuf) -> Result<RecipeInput, RecipeErrors> {
        let loaded = Recipe::check_str(&text, &name)?;
        Ok(RecipeInput { name, text, dir, loaded })
    }

    /// Reads and parses a recipe file; errors name the path as given.
    pub fn from_file(path: &Path) -> Result<RecipeInput, RecipeInputError> {
        let text = std::fs::read_to_string(path)
            .map_err(|source| RecipeInputError::Io { path: path.to_path_buf(), source })?;
        let name = path.file_name().map_or_else(|| path.display().to_string(), |n| n.to_string_lossy().into_owned());
        let dir = crate::fsutil::parent_dir(path).to_path_buf();
        let loaded = Recipe::check_str(&text, &path.display().to_string()).map_err(RecipeInputError::Invalid)?;
        Ok(RecipeInput { name, text, dir, loaded })
    }
}

/// Who launched a run, recorded in its `run.started` event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    Cli,
    Demo,
    /// The operator API, with the launch's id.
    Api {
        launch: String,
    },
}

/// Everything a run is asked to do.
#[derive(Debug, Clone)]
pub struct TrainRequest {
    pub recipe: RecipeInput,
    /// A plan file to use; `None`: the recipe's `autotune.plan`, the run's own on a
    /// resume, or a probe now.
    pub plan: Option<PathBuf>,
    pub out_dir: PathBuf,
    pub resume: bool,
    /// Replace an earlier run in `out_dir` (its files only).
    pub force: bool,
    /// The base weights (an HF directory); on a resume `None` means the recorded base.
    pub init_from: Option<PathBuf>,
    /// Accept a base other than the recorded one on a resume.
    pub force_base: bool,
    pub data: DataOptions,
    pub eval_prompts: usize,
    pub origin: Origin,
    /// Several ranks (one process each); `None`: this process trains alone.
    pub launch: Option<Launch>,
    /// The recipe as a file, for rank processes to read (a launched run); default the node's
    /// stored copy of the bytes.
    pub recipe_path: Option<PathBuf>,
}

/// How the plan a run used was obtained.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PlanSource {
    /// A file the caller (or the recipe's `autotune.plan`) named.
    Given(PathBuf),
    /// Measured for this run before it started.
    Probed,
    /// The run's own, kept in its directory (a resume).
    Kept,
}

impl PlanSource {
    fn label(&self) -> &'static str {
        match self {
            PlanSource::Given(_) => "given",
            PlanSource::Probed => "probed",
            PlanSource::Kept => "kept",
        }
    }
}

/// The plan a run used.
pub struct UsedPlan {
    pub plan: Plan,
    pub bytes: Vec<u8>,
    pub blake3: [u8; 32],
    /// The run directory's `plan.json`.
    pub path: PathBuf,
    pub source: PlanSource,
}

/// What the caller sees of a run besides every step: the plan chosen, the sealing begun.
pub trait Hooks: Observer + Send {
    /// A plan is about to be measured (within the recipe's budget), to be kept at `path`.
    fn probing(&mut self, _budget_seconds: u32, _path: &Path) {}
    fn planned(&mut self, _plan: &UsedPlan) {}
    fn sealing(&mut self) {}
}

/// A run trained and sealed.
pub struct Trained {
    pub summary: RunSummary,
    pub sealed: Sealed,
    pub plan: UsedPlan,
    /// Where the node keeps the recipe's bytes.
    pub recipe_file: PathBuf,
    /// What the training drew (as sealed, whether or not `receipt.include` asks for it).
    pub energy: Energy,
    /// The run's receipt bundle as sealed (not anchored yet), at the recipe's `receipt.output`.
    pub receipt: PathBuf,
}

#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    /// Refused before anything ran: an output directory in use, a plan for other bytes.
    #[error("{0}")]
    Refused(String),
    #[error(transparent)]
    Plan(#[from] PlanError),
    #[error(transparent)]
    Run(#[from] RunError),
    #[error("recording: {0}")]
    Log(#[from] AppendError),
    #[error("sealing the run's manifest: {0}")]
    Seal(#[from] ManifestError),
    #[error("exporting the run's receipt: {0}")]
    ReceiptExport(#[from] ExportError),
    #[error("the run is sealed, but its receipt was not written: {0}")]
    ReceiptWrite(#[from] WriteError),
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
}

impl TrainError {
    /// Bad input (exit 4 on the command line, 400 over the API) rather than a failure.
    pub fn is_invalid_input(&self) -> bool {
        matches!(self, TrainError::Refused(_) | TrainError::Run(RunError::Plan(_) | RunError::Env(_)))
            || matches!(self, TrainError::Run(e) if e.is_refusal())
    }
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> TrainError + '_ {
    move |source| TrainError::Io { path: path.to_path_buf(), source }
}

/// Trains `req` to the end and seals it. Events go to `log`; `hooks` sees the plan, every
/// step and the sealing. A run stopped by [`Observer::cancelled`] returns
/// `TrainError::Run(RunError::Cancelled)` after its checkpoint and `run.cancelled`.
pub fn train_and_seal(
    log: &EventLog,
    key: &Identity,
    node_dir: &Path,
    req: &TrainRequest,
    hooks: &mut dyn Hooks,
) -> Result<Trained, TrainError> {
    let loaded = &req.recipe.loaded;
    // A run in this process needs train.env in it already; a launcher hands it to its ranks.
    if req.launch.is_none()
        && let Some(why) = super::env::refusal(&loaded.recipe.train.env)
    {
        return Err(TrainError::Refused(why));
    }
    if !req.resume {
        // A resume finds its base in run.json; the trainer checks it there.
        run::check_base_choice(&loaded.recipe, &req.recipe.dir, req.init_from.as_deref())?;
    }
    // A dataset named by hub id is in the cache, or the run is refused before anything is recorded.
    mindxtrain_trainer::data::source::files::hub_snapshot(&loaded.recipe.data).map_err(RunError::from)?;
    prepare_out_dir(&req.out_dir, req.resume, req.force)?;
    let receipt_path = receipt_output(&req.out_dir, &loaded.recipe);
    // Refused before training: a resume may replace its own receipt, a new run none.
    let resumed = if req.resume { OutDir::new(&req.out_dir).read_record().ok().flatten() } else { None };
    if let Some(what) = crate::receipt::occupant(&receipt_path, resumed.as_ref().map(|r| r.run_id.as_str()))? {
        return Err(TrainError::Refused(WriteError::Occupied { path: receipt_path, what }.to_string()));
    }
    let recipe_file = crate::recipes::store(node_dir, &loaded.bytes_blake3, &req.recipe.text)
        .map_err(io(&crate::recipes::stored_path(node_dir, &loaded.bytes_blake3)))?;
    crate::recipes::record(log, &req.recipe.name, &req.recipe.text, loaded.clone())?;
    let cmd = match &req.launch {
        Some(_) => Some(
            RankCommand::current(
                node_dir.to_path_buf(),
                req.recipe_path.clone().unwrap_or_else(|| recipe_file.clone()),
                req.recipe.dir.clone(),
            )
            .map_err(io(Path::new("mindxtrain")))?,
        ),
        None => None,
    };
    let launched = req.launch.as_ref().zip(cmd.as_ref());
    let plan = choose_plan(log, loaded, req, launched, hooks)?;
    hooks.planned(&plan);
    let mut context = serde_json::Map::new();
    context.insert("origin".into(), origin_json(&req.origin));
    context.insert("plan".into(), json!({"source": plan.source.label(), "file": plan.path}));
    if let PlanSource::Given(given) = &plan.source {
        context.insert("plan_given".into(), json!(given));
    }
    context.insert("recipe_file".into(), json!(recipe_file));
    context.insert("recipe_dir".into(), json!(run::base::absolute(&req.recipe.dir)));
    // `out_dir` in the event is as given (maybe relative to where `train` ran).
    context.insert("out_dir".into(), json!(run::base::absolute(&req.out_dir)));
    let spec = RunSpec {
        recipe: loaded.clone(),
        recipe_dir: req.recipe.dir.clone(),
        plan: plan.plan.clone(),
        plan_blake3: plan.blake3,
        out_dir: req.out_dir.clone(),
        resume: req.resume,
        data: req.data,
        init_from: req.init_from.clone(),
        force_base: req.force_base,
        eval_prompts: req.eval_prompts,
        context,
    };
    let meter = Meter::start(&run_gpus(&loaded.recipe, req.launch.as_ref()));
    let summary = match launched {
        None => run::train(&spec, &mut super::LogSink::new(log), hooks)?,
        Some((l, cmd)) => train_ranks(log, &spec, &plan, req, l, cmd, hooks)?,
    };
    let mut energy = meter.finish();
    if let Some(l) = req.launch.as_ref().filter(|l| l.nnodes > 1) {
        energy.not_counted(format!("the other {} node(s) of the run are not counted (only node 0's)", l.nnodes - 1));
    }
    let mut hardware = serde_json::to_value(&plan.plan.machine).unwrap_or(Value::Null);
    if let (Some(layout), Value::Object(h)) = (&summary.parallel, &mut hardware) {
        // World size, topology and the collective settings the ranks ran with.
        h.insert("parallel".into(), json!(layout));
        h.insert("env".into(), json!(run::effective_env(&spec)?));
    }
    hooks.sealing();
    let finished = FinishedRun {
        summary: &summary,
        recipe: NamedBytes { name: req.recipe.name.clone(), bytes: req.recipe.text.as_bytes().to_vec() },
        plan: Some(NamedBytes { name: PLAN_FILE.into(), bytes: plan.bytes.clone() }),
        out_dir: &req.out_dir,
        hardware,
        energy: energy.clone(),
    };
    let sealed = seal_run(log, key, node_dir, finished)?;
    let receipt = crate::receipt::export(node_dir, &summary.run_id)?;
    crate::receipt::write_for_run(&receipt_path, &receipt)?;
    Ok(Trained { summary, sealed, plan, recipe_file, energy, receipt: receipt_path })
}

/// Trains `spec` on the ranks of `launch`: rank 0's events into `log`, its progress to `hooks`.
fn train_ranks(
    log: &EventLog,
    spec: &RunSpec,
    plan: &UsedPlan,
    req: &TrainRequest,
    launch: &Launch,
    cmd: &RankCommand,
    hooks: &mut dyn Hooks,
) -> Result<RunSummary, TrainError> {
    let job = Job {
        recipe_blake3: hex::encode(spec.recipe.bytes_blake3),
        backend: launch.backend,
        env: run::effective_env(spec)?,
        timeout_seconds: launch.timeout.as_secs(),
        work: Work::Train(TrainJob {
            plan: String::from_utf8_lossy(&plan.bytes).into_owned(),
            out_dir: run::base::absolute(&req.out_dir),
            resume: req.resume,
            init_from: req.init_from.as_deref().map(run::base::absolute),
            force_base: req.force_base,
            skip_bad: req.data.skip_bad,
            eval_prompts: req.eval_prompts,
            context: spec.context.clone(),
        }),
    };
    let mut record = |kind: &str, subject: &str, data: Value| {
        log.append(crate::log::AppendRequest::new(kind, subject, data)).map(|_| ()).map_err(|e| e.to_string())
    };
    match launch::supervise(launch, cmd, &job, &mut record, hooks) {
        Ok(launch::Outcome::Finished(summary)) => Ok(*summary),
        Ok(launch::Outcome::Cancelled { step }) => Err(RunError::Cancelled { step }.into()),
        Ok(other) => Err(TrainError::Refused(format!("the ranks answered a training job with {other:?}"))),
        Err(reason) => Err(RunError::Collective(CollectiveError::Aborted { reason }).into()),
    }
}

/// Where the run's receipt goes: the recipe's `receipt.output` (relative to the run
/// directory), else `OUT/receipt.json`.
pub fn receipt_output(out_dir: &Path, recipe: &mindxtrain_trainer::recipe::Recipe) -> PathBuf {
    out_dir.join(recipe.receipt.output.as_deref().unwrap_or(run::DEFAULT_RECEIPT_FILE))
}

/// The CUDA devices a run trains on, whose energy counters it is measured by: each local
/// rank's (`cuda:N`) in a launch, else device 0 of an NVIDIA recipe, else none.
fn run_gpus(recipe: &mindxtrain_trainer::recipe::Recipe, launch: Option<&Launch>) -> Vec<usize> {
    let mut gpus: Vec<usize> = match launch {
        Some(l) => l.devices.iter().filter_map(|d| d.strip_prefix("cuda:")?.parse().ok()).collect(),
        None if recipe.hardware.gpus > 0 && recipe.hardware.name.vendor() == Vendor::Nvidia => vec![0],
        None => Vec::new(),
    };
    gpus.sort_unstable();
    gpus.dedup();
    gpus
}

fn origin_json(origin: &Origin) -> Value {
    match origin {
        Origin::Cli => json!({"kind": "cli"}),
        Origin::Demo => json!({"kind": "demo"}),
        Origin::Api { launch } => json!({"kind": "api", "launch": launch}),
    }
}

/// The plan a run uses (see the module doc), kept in the run directory as `plan.json`.
fn choose_plan(
    log: &EventLog,
    loaded: &LoadedRecipe,
    req: &TrainRequest,
    launched: Option<(&Launch, &RankCommand)>,
    hooks: &mut dyn Hooks,
) -> Result<UsedPlan, TrainError> {
    let budget = loaded.recipe.autotune.budget_seconds;
    let kept = req.out_dir.join(PLAN_FILE);
    let given = req.plan.clone().or_else(|| loaded.recipe.autotune.plan.as_ref().map(|p| req.recipe.dir.join(p)));
    // A resumed run keeps its global batch (run.json); a new one takes the recipe's at this world.
    let global_batch = match (req.resume, OutDir::new(&req.out_dir).read_record()) {
        (true, Ok(Some(r))) => r.global_batch,
        _ => None,
    };
    let input =
        super::ProbeInput { loaded, recipe_dir: &req.recipe.dir, init_from: req.init_from.as_deref(), data: req.data };
    let measure = |path: &Path| super::measure_and_record_plan(log, input, path, launched, global_batch);
    let (bytes, source) = match given {
        Some(path) if path.exists() || req.plan.is_some() => {
            let bytes = std::fs::read(&path).map_err(|e| TrainError::Refused(format!("{}: {e}", path.display())))?;
            (bytes, PlanSource::Given(path))
        }
        Some(path) => {
            // The recipe names a plan file that is not there yet: the probe writes it.
            hooks.probing(budget, &path);
            (measure(&path)?.bytes, PlanSource::Given(path))
        }
        None if req.resume && kept.exists() => {
            let bytes = std::fs::read(&kept).map_err(io(&kept))?;
            let world = launched.map_or(1, |(l, _)| l.world());
            match Plan::from_bytes(&bytes, &kept.display().to_string()) {
                // A resume at another world size: the kept plan was measured for the old one. It
                // is kept beside the run as plan-<hash>.json and a plan for this world measured.
                Ok(p) if p.parallel.as_ref().map_or(1, |x| x.world_size) != world => {
                    archive_plan(&req.out_dir, &kept, &bytes)?;
                    hooks.probing(budget, &kept);
                    (measure(&kept)?.bytes, PlanSource::Probed)
                }
                _ => (bytes, PlanSource::Kept),
            }
        }
        None => {
            hooks.probing(budget, &kept);
            (measure(&kept)?.bytes, PlanSource::Probed)
        }
    };
    let shown = match &source {
        PlanSource::Given(p) => p.display().to_string(),
        _ => kept.display().to_string(),
    };
    let plan = Plan::from_bytes(&bytes, &shown).map_err(|e| TrainError::Refused(e.to_string()))?;
    if source == PlanSource::Kept && plan.recipe_blake3 != hex::encode(loaded.bytes_blake3) {
        return Err(TrainError::Refused(format!(
            "--resume: {} was started with recipe bytes {}, not these ({}): resume it with the recipe it was \
             started with",
            req.out_dir.display(),
            plan.recipe_blake3,
            hex::encode(loaded.bytes_blake3)
        )));
    }
    plan.check_recipe(&loaded.bytes_blake3, &shown).map_err(|e| TrainError::Refused(e.to_string()))?;
    plan.check_constraints(&loaded.recipe, &shown).map_err(|e| TrainError::Refused(e.to_string()))?;
    check_plan_world(&plan, &shown, launched.map(|(l, _)| l))?;
    match std::fs::read(&kept) {
        // A resume at another world size brings its own plan: the old one is kept beside it.
        Ok(existing) if existing != bytes && req.resume && world_of(&existing) != world_of(&bytes) => {
            archive_plan(&req.out_dir, &kept, &existing)?;
            crate::fsutil::write_new_durably(&kept, &bytes, 0o644).map_err(io(&kept))?;
        }
        Ok(existing) if existing != bytes => {
            return Err(TrainError::Refused(format!(
                "{shown} is not the plan this run used ({}): leave --plan out to continue with it",
                kept.display()
            )));
        }
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            crate::fsutil::write_new_durably(&kept, &bytes, 0o644).map_err(io(&kept))?;
        }
        Err(e) => return Err(io(&kept)(e)),
    }
    let blake3 = *blake3::hash(&bytes).as_bytes();
    Ok(UsedPlan { plan, bytes, blake3, path: kept, source })
}

/// The world size a plan's bytes were measured for (1 for a one-process plan or unreadable bytes).
fn world_of(bytes: &[u8]) -> usize {
    Plan::from_bytes(bytes, "plan").ok().and_then(|p| p.parallel).map_or(1, |p| p.world_size)
}

/// Moves the run's `plan.json` (of an earlier world size) aside as `plan-<16 hex>.json`.
fn archive_plan(out_dir: &Path, kept: &Path, bytes: &[u8]) -> Result<(), TrainError> {
    let hash = blake3::hash(bytes).to_hex();
    let archived = out_dir.join(format!("plan-{}.json", &hash[..16]));
    std::fs::rename(kept, &archived).map_err(io(kept))?;
    crate::fsutil::sync_dir(out_dir).map_err(io(out_dir))
}

/// A plan is measured for one layout: its world size and collective backend must be the launch's.
fn check_plan_world(plan: &Plan, shown: &str, launch: Option<&Launch>) -> Result<(), TrainError> {
    let measured = plan.parallel.as_ref().map(|p| (p.world_size, p.backend));
    let wanted = launch.map(|l| (l.world(), l.backend));
    if measured == wanted {
        return Ok(());
    }
    let say = |w: Option<(usize, mindxtrain_trainer::collective::Backend)>| match w {
        None => "one process".to_string(),
        Some((n, b)) => format!("{n} rank(s) over {}", b.name()),
    };
    let flags = launch.map_or(String::new(), |l| format!(" --nproc-per-node {}", l.ranks_per_node));
    Err(TrainError::Refused(format!(
        "{shown} was measured for {}, this run is {}: leave --plan out to measure one for it, or \
         `mindxtrain bench RECIPE --out NEW.json{flags}`",
        say(measured),
        say(wanted)
    )))
}

/// Makes `dir` ready for a run: created when missing; kept when resuming; otherwise it
/// must be empty, or, with `force`, hold only what an earlier run wrote (which is then
/// removed). A run directory replaced by accident takes its sealed files with it, so the
/// refusal says what is there and how to go on.
pub fn prepare_out_dir(dir: &Path, resume: bool, force: bool) -> Result<(), TrainError> {
    let entries: Vec<std::fs::DirEntry> = match std::fs::read_dir(dir) {
        Ok(rd) => rd.collect::<Result<_, _>>().map_err(io(dir))?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if resume {
                return Err(TrainError::Refused(format!(
                    "--resume: {} does not exist; there is no run to continue",
                    dir.display()
                )));
            }
            return std::fs::create_dir_all(dir).map_err(io(dir));
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotADirectory => {
            return Err(TrainError::Refused(format!("--out {}: not a directory", dir.display())));
        }
        Err(e) => return Err(io(dir)(e)),
    };
    if entries.is_empty() || resume {
        return Ok(());
    }
    let what = match OutDir::new(dir).read_record() {
        Ok(Some(r)) => format!("run {}", r.run_id),
        _ => format!("{} entries", entries.len()),
    };
    if !force {
        return Err(TrainError::Refused(format!(
            "{} is not empty (it holds {what}): pass --resume to continue that run, --force to replace it, \
             or give another --out",
            dir.display()
        )));
    }
    let foreign: Vec<String> =
        entries.iter().map(|e| e.file_name().to_string_lossy().into_owned()).filter(|n| !written_by_a_run(n)).collect();
    if !foreign.is_empty() {
        return Err(TrainError::Refused(format!(
            "--force replaces only a run directory; {} also holds {}, which no run writes: give another --out",
            dir.display(),
            foreign.join(", ")
        )));
    }
    for e in entries {
        let path = e.path();
        let removed = if e.file_type().map_err(io(&path))?.is_dir() {
            std::fs::remove_dir_all(&path)
        } else {
            std::fs::remove_file(&path)
        };
        removed.map_err(io(&path))?;
    }
    crate::fsutil::sync_dir(dir).map_err(io(dir))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(r: Result<(), TrainError>) -> String {
        match r {
            Err(TrainError::Refused(m)) => m,
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    #[test]
    fn an_output_directory_in_use_is_refused_unless_resumed_or_forced() {
        let tmp = tempfile::tempdir().unwrap();
        let out = tmp.path().join("run");
        prepare_out_dir(&out, false, false).unwrap();
        assert!(out.is_dir());
        prepare_out_dir(&out, false, false).unwrap();
        std::fs::write(
            out.join("run.json"),
            br#"{"run_id":"run-1","recipe_blake3":"","plan_blake3":"","method":"lora","seed":1}"#,
        )
        .unwrap();
        std::fs::create_dir_all(out.join("final")).unwrap();
        let m = refused(prepare_out_dir(&out, false, false));
        assert!(m.contains("holds run run-1") && m.contains("--resume") && m.contains("--force"), "{m}");
        prepare_out_dir(&out, true, false).unwrap();
        assert!(out.join("run.json").exists(), "a resume keeps everything");
        prepare_out_dir(&out, false, true).unwrap();
        assert_eq!(std::fs::read_dir(&out).unwrap().count(), 0, "--force removed the run's files");

        std::fs::write(out.join("run.json"), b"{}").unwrap();
        std::fs::write(out.join("notes.txt"), b"mine").unwrap();
        let m = refused(prepare_out_dir(&out, false, true));
        assert!(m.contains("notes.txt"), "{m}");
        assert!(out.join("notes.txt").exists() && out.join("run.json").exists(), "nothing removed");

        let m = refused(prepare_out_dir(&tmp.path().join("missing"), true, false));
        assert!(m.contains("no run to continue"), "{m}");
        let file = tmp.path().join("file");
        std::fs::write(&file, b"x").unwrap();
        assert!(refused(prepare_out_dir(&file, false, false)).contains("not a directory"));
    }
}
