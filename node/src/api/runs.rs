//! Training runs over the API: launched from an embedded recipe or a YAML body, the plan
//! measured first (AOT, recorded as `plan.emitted`), trained on a thread of their own with
//! every event in the log, sealed into a manifest at the end; cancelled after a step (with a
//! checkpoint), resumed from it; watched live as server-sent events. One run at a time.
//!
//! Files: `node-dir/runs/<id>/` (the run), `node-dir/plans/<id>.plan.json`,
//! `node-dir/recipes/<blake3>.yaml` (the recipe bytes the run used).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use mindxtrain_trainer::data::DataOptions;
use mindxtrain_trainer::events::{EventSink, TrainerEvent};
use mindxtrain_trainer::plan::Plan;
use mindxtrain_trainer::recipe::{LoadedRecipe, Recipe};
use mindxtrain_trainer::run::{self, Observer, RunError, RunSpec, StepReport};
use serde::Serialize;
use serde_json::{Value, json};

use super::ApiState;
use super::log_routes::event_stream;
use super::recipes::RecipeRef;
use crate::log::AppendError;
use crate::manifest::NamedBytes;
use crate::serve::openai::ApiError;
use crate::training::{self, FinishedRun, LogSink};

/// Where a launched run is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    Planning,
    Training,
    Sealing,
    Finished,
    Failed,
    Cancelled,
}

#[derive(Debug, Clone, Serialize)]
pub struct Status {
    pub id: String,
    pub recipe: String,
    pub phase: Phase,
    pub run_id: Option<String>,
    pub step: u64,
    pub total_steps: u64,
    pub loss: Option<f64>,
    pub lr: Option<f64>,
    pub tokens_per_s: Option<f64>,
    pub plan_blake3: Option<String>,
    pub manifest: Option<String>,
    pub error: Option<String>,
    pub out_dir: PathBuf,
}

/// One launched run.
pub struct Launch {
    status: Mutex<Status>,
    cancel: AtomicBool,
    /// The recipe bytes and the name they were given.
    source: (String, String),
    plan: PathBuf,
    /// The log's size when the run was launched: its events come after.
    first_seq: u64,
    /// The thread training it (the latest, after a resume).
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Launch {
    pub fn status(&self) -> Status {
        lock(&self.status).clone()
    }

    fn update(&self, f: impl FnOnce(&mut Status)) {
        f(&mut lock(&self.status));
    }
}

/// The runs launched by this process, by id.
#[derive(Default)]
pub struct Launches {
    by_id: Mutex<BTreeMap<String, Arc<Launch>>>,
    /// Set at shutdown: nothing is launched or resumed any more.
    closed: AtomicBool,
}

impl Launches {
    fn get(&self, id: &str) -> Option<Arc<Launch>> {
        let all = lock(&self.by_id);
        all.get(id).cloned().or_else(|| all.values().find(|l| l.status().run_id.as_deref() == Some(id)).cloned())
    }

    /// What a run launched here used and made, for checking its receipt against them:
    /// its output directory, its plan file and its recipe file.
    pub fn files_of(&self, run_id: &str, node_dir: &std::path::Path) -> Option<[PathBuf; 3]> {
        let launch = self.get(run_id)?;
        let recipe = super::recipes::stored_path(node_dir, blake3::hash(launch.source.1.as_bytes()).as_bytes());
        Some([launch.status().out_dir, launch.plan.clone(), recipe])
    }

    /// For shutdown: refuses launches and resumes from now on, and asks every going run to
    /// stop after its current step, as `POST /api/runs/{id}/cancel` does (a checkpoint, then
    /// `run.cancelled`). Returns the ids of the runs asked.
    pub fn close(&self) -> Vec<String> {
        let all = lock(&self.by_id);
        self.closed.store(true, Ordering::Release);
        let mut asked = Vec::new();
        for l in all.values().filter(|l| going(l.status().phase)) {
            l.cancel.store(true, Ordering::Release);
            asked.push(l.status().id);
        }
        asked
    }

    /// Waits up to `limit` for every run's thread to end (the log's last events of them
    /// written); true when all have.
    pub async fn finished(&self, limit: Duration) -> bool {
        let until = Instant::now() + limit;
        loop {
            let busy = lock(&self.by_id)
                .values()
                .any(|l| going(l.status().phase) || lock(&l.thread).as_ref().is_some_and(|t| !t.is_finished()));
            if !busy {
                for l in lock(&self.by_id).values() {
                    if let Some(t) = lock(&l.thread).take() {
                        let _ = t.join();
                    }
                }
                return true;
            }
            if Instant::now() >= until {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    fn shutting_down() -> ApiError {
        let message = "the node is shutting down";
        ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "server_error", "shutting_down", message)
    }

    fn running(&self) -> Option<String> {
        lock(&self.by_id).values().map(|l| l.status()).find(|s| going(s.phase)).map(|s| s.id)
    }
}

fn going(phase: Phase) -> bool {
    matches!(phase, Phase::Planning | Phase::Training | Phase::Sealing)
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// `POST /api/runs`: `{"recipe": NAME}` or `{"yaml": TEXT, "name": NAME}` → 202 with the
/// run's status; 400 with every recipe error (line, column, field) when the recipe is
/// invalid; 409 while another run is going.
pub async fn launch(State(s): State<Arc<ApiState>>, Json(req): Json<RecipeRef>) -> Response {
    let (name, src, loaded) = match req.load(&s.node_dir) {
        Ok(r) => r,
        Err(rejected) => return rejected.into_response(),
    };
    if s.launches.closed.load(Ordering::Acquire) {
        return Launches::shutting_down().into_response();
    }
    if let Some(other) = s.launches.running() {
        let message = format!("run {other} is going; cancel it or wait (one run at a time)");
        return ApiError::new(StatusCode::CONFLICT, "invalid_request_error", "run_in_progress", message)
            .into_response();
    }
    let mut random = [0u8; 6];
    if getrandom::fill(&mut random).is_err() {
        return ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", "no_randomness", "getrandom failed")
            .into_response();
    }
    let id = format!("{}-{}", loaded.recipe.meta.run_name, hex::encode(random));
    let launch = Arc::new(Launch {
        status: Mutex::new(Status {
            id: id.clone(),
            recipe: name.clone(),
            phase: Phase::Planning,
            run_id: None,
            step: 0,
            total_steps: 0,
            loss: None,
            lr: None,
            tokens_per_s: None,
            plan_blake3: None,
            manifest: None,
            error: None,
            out_dir: s.node_dir.join("runs").join(&id),
        }),
        cancel: AtomicBool::new(false),
        source: (name, src),
        plan: s.node_dir.join("plans").join(format!("{id}.plan.json")),
        first_seq: s.log.len(),
        thread: Mutex::new(None),
    });
    lock(&s.launches.by_id).insert(id, launch.clone());
    start(&s, launch.clone(), loaded, false);
    (StatusCode::ACCEPTED, Json(launch.status())).into_response()
}

fn start(s: &Arc<ApiState>, launch: Arc<Launch>, loaded: LoadedRecipe, resume: bool) {
    let state = s.clone();
    let run = launch.clone();
    let thread = std::thread::spawn(move || {
        let outcome = execute(&state, &run, loaded, resume);
        run.update(|st| match outcome {
            Ok(manifest) => (st.phase, st.manifest) = (Phase::Finished, Some(manifest)),
            Err(RunFailure::Cancelled) => st.phase = Phase::Cancelled,
            Err(RunFailure::Failed(e)) => (st.phase, st.error) = (Phase::Failed, Some(e)),
        });
    });
    *lock(&launch.thread) = Some(thread);
    // Launched as shutdown began: it stops at its first step, like the others.
    if s.launches.closed.load(Ordering::Acquire) {
        launch.cancel.store(true, Ordering::Release);
    }
}

enum RunFailure {
    Cancelled,
    Failed(String),
}

impl<E: std::fmt::Display> From<E> for RunFailure {
    fn from(e: E) -> Self {
        RunFailure::Failed(e.to_string())
    }
}

/// Plans (or reads the plan of a resumed run), trains and seals; returns the manifest path.
fn execute(s: &ApiState, launch: &Launch, loaded: LoadedRecipe, resume: bool) -> Result<String, RunFailure> {
    let recipe_dir = s.node_dir.join("recipes");
    std::fs::create_dir_all(&recipe_dir)?;
    std::fs::create_dir_all(launch.plan.parent().unwrap_or(&s.node_dir))?;
    let (name, src) = &launch.source;
    let recipe_file = super::recipes::stored_path(&s.node_dir, &loaded.bytes_blake3);
    if !recipe_file.exists() {
        crate::fsutil::write_new_durably(&recipe_file, src.as_bytes(), 0o644)?;
    }
    let (plan, plan_blake3, plan_bytes) = if resume {
        let (plan, blake3) = Plan::read(&launch.plan)?;
        (plan, blake3, std::fs::read(&launch.plan)?)
    } else {
        let p = training::measure_and_record_plan(&s.log, &loaded, &recipe_dir, &launch.plan)?;
        (p.plan, p.blake3, p.bytes)
    };
    launch.update(|st| (st.phase, st.plan_blake3) = (Phase::Training, Some(hex::encode(plan_blake3))));
    let out_dir = launch.status().out_dir;
    let hardware = serde_json::to_value(&plan.machine)?;
    let spec = RunSpec {
        recipe: loaded,
        recipe_dir,
        plan,
        plan_blake3,
        out_dir: out_dir.clone(),
        resume,
        data: DataOptions::default(),
        init_from: None,
        eval_prompts: 64,
    };
    let mut sink = LaunchSink { log: LogSink::new(&s.log), launch };
    let summary = match run::train(&spec, &mut sink, &mut LaunchObserver(launch)) {
        Ok(summary) => summary,
        Err(RunError::Cancelled { .. }) => return Err(RunFailure::Cancelled),
        Err(e) => return Err(e.into()),
    };
    launch.update(|st| st.phase = Phase::Sealing);
    let plan_name = launch.plan.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let finished = FinishedRun {
        summary: &summary,
        recipe: NamedBytes { name: name.clone(), bytes: src.as_bytes().to_vec() },
        plan: Some(NamedBytes { name: plan_name, bytes: plan_bytes }),
        out_dir: &out_dir,
        base_dir: None,
        hardware,
    };
    let sealed = training::seal_run(&s.log, &s.identity, &s.node_dir, finished)?;
    Ok(sealed.path.display().to_string())
}

/// The log sink that also learns the run's id from its first event.
struct LaunchSink<'a> {
    log: LogSink<'a>,
    launch: &'a Launch,
}

impl EventSink for LaunchSink<'_> {
    type Error = AppendError;

    fn emit(&mut self, event: TrainerEvent) -> Result<(), AppendError> {
        if matches!(event.kind.as_str(), "run.started" | "run.resumed") {
            let id = event.subject.clone();
            self.launch.update(|st| st.run_id = Some(id));
        }
        self.log.emit(event)
    }
}

struct LaunchObserver<'a>(&'a Launch);

impl Observer for LaunchObserver<'_> {
    fn started(&mut self, first_step: u64, total_steps: u64) {
        self.0.update(|st| (st.step, st.total_steps) = (first_step, total_steps));
    }

    fn step(&mut self, r: &StepReport) {
        self.0.update(|st| {
            (st.step, st.loss, st.lr, st.tokens_per_s) = (r.step, Some(r.loss), Some(r.lr), Some(r.tokens_per_s));
        });
    }

    fn cancelled(&mut self) -> bool {
        self.0.cancel.load(Ordering::Acquire)
    }
}

fn not_found(id: &str) -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, "invalid_request_error", "run_not_found", format!("no run {id} here"))
}

/// `GET /api/runs`: the runs launched here, newest last.
pub async fn list(State(s): State<Arc<ApiState>>) -> Json<Value> {
    let all: Vec<Status> = lock(&s.launches.by_id).values().map(|l| l.status()).collect();
    Json(json!({"runs": all}))
}

/// `GET /api/runs/{id}` (the launch id, or the trainer's run id).
pub async fn show(State(s): State<Arc<ApiState>>, Path(id): Path<String>) -> Result<Json<Status>, ApiError> {
    s.launches.get(&id).map(|l| Json(l.status())).ok_or_else(|| not_found(&id))
}

/// `POST /api/runs/{id}/cancel`: the run stops after its current step, checkpointed.
pub async fn cancel(State(s): State<Arc<ApiState>>, Path(id): Path<String>) -> Result<Response, ApiError> {
    let launch = s.launches.get(&id).ok_or_else(|| not_found(&id))?;
    let phase = launch.status().phase;
    if !matches!(phase, Phase::Planning | Phase::Training) {
        let message = format!("run {id} is {phase:?}, not going");
        return Err(ApiError::new(StatusCode::CONFLICT, "invalid_request_error", "not_running", message));
    }
    launch.cancel.store(true, Ordering::Release);
    Ok((StatusCode::ACCEPTED, Json(launch.status())).into_response())
}

/// `POST /api/runs/{id}/resume`: a cancelled or failed run continues from its newest
/// checkpoint, with the same recipe and plan.
pub async fn resume(State(s): State<Arc<ApiState>>, Path(id): Path<String>) -> Result<Response, ApiError> {
    let launch = s.launches.get(&id).ok_or_else(|| not_found(&id))?;
    let phase = launch.status().phase;
    if !matches!(phase, Phase::Cancelled | Phase::Failed) {
        let message = format!("run {id} is {phase:?}: only a cancelled or failed run resumes");
        return Err(ApiError::new(StatusCode::CONFLICT, "invalid_request_error", "not_resumable", message));
    }
    if s.launches.closed.load(Ordering::Acquire) {
        return Err(Launches::shutting_down());
    }
    if let Some(other) = s.launches.running() {
        let message = format!("run {other} is going; one run at a time");
        return Err(ApiError::new(StatusCode::CONFLICT, "invalid_request_error", "run_in_progress", message));
    }
    let (name, src) = &launch.source;
    let loaded = Recipe::check_str(src, name).map_err(|e| ApiError::invalid("recipe", e.to_string()))?;
    launch.cancel.store(false, Ordering::Release);
    launch.update(|st| (st.phase, st.error) = (Phase::Training, None));
    start(&s, launch.clone(), loaded, true);
    Ok((StatusCode::ACCEPTED, Json(launch.status())).into_response())
}

/// `GET /api/runs/{id}/events`: the run's events (those whose subject is its run id) from
/// its launch on, then live, as server-sent events.
pub async fn events(State(s): State<Arc<ApiState>>, Path(id): Path<String>) -> Result<Response, ApiError> {
    let launch = s.launches.get(&id).ok_or_else(|| not_found(&id))?;
    let from = launch.first_seq;
    let keep = move |e: &crate::log::Event| launch.status().run_id.as_deref() == Some(e.envelope.subject.as_str());
    Ok(event_stream(s.log.clone(), from, keep))
}
