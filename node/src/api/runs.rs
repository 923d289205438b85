//! Training runs over the API: launched from an embedded recipe or a YAML body (on a base
//! given as a finished run or a directory), the plan measured first (AOT, recorded as
//! `plan.emitted`), trained on a thread of their own through the node's one driver
//! ([`training::train_and_seal`]), sealed at the end; cancelled after a step (with a
//! checkpoint), resumed from it, after a restart of the node too; watched live as
//! server-sent events. One run at a time.
//!
//! The list is the log's ([`training::run_history`]): runs trained with `mindxtrain train`
//! or by the demo appear beside those launched here, and survive a restart. A run going
//! in this process shows its live state (planning, sealing) over the log's.
//!
//! Files: `node-dir/runs/<id>/` (the run, with its `plan.json`),
//! `node-dir/recipes/<blake3>.yaml` (the recipe bytes the run used).

use crate::training::launch::Launch as RankLaunch;
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
use mindxtrain_trainer::run::{self, Observer, OutDir, RunError, StepReport};
use serde::Deserialize;
use serde_json::{Value, json};

use super::ApiState;
use super::log_routes::event_stream;
use super::recipes::{RecipeRef, Rejected};
use crate::serve::openai::ApiError;
use crate::training::{self, Hooks, Origin, Phase, RecipeInput, RunInfo, TrainError, TrainRequest, UsedPlan};

/// One run going (or gone) in this process.
pub struct Launch {
    status: Mutex<RunInfo>,
    cancel: AtomicBool,
    /// What it was asked to do; a resume asks the same with `resume` set.
    request: Mutex<TrainRequest>,
    /// The thread training it (the latest, after a resume).
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Launch {
    pub fn status(&self) -> RunInfo {
        lock(&self.status).clone()
    }

    fn update(&self, f: impl FnOnce(&mut RunInfo)) {
        f(&mut lock(&self.status));
    }
}

/// The runs launched or resumed by this process, by id.
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

    /// For shutdown: refuses launches and resumes from now on, and asks every going run to
    /// stop after its current step, as `POST /api/runs/{id}/cancel` does (a checkpoint, then
    /// `run.cancelled`). Returns the ids of the runs asked.
    pub fn close(&self) -> Vec<String> {
        let all = lock(&self.by_id);
        self.closed.store(true, Ordering::Release);
        let mut asked = Vec::new();
        for l in all.values().filter(|l| l.status().phase.going()) {
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
                .any(|l| l.status().phase.going() || lock(&l.thread).as_ref().is_some_and(|t| !t.is_finished()));
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
        lock(&self.by_id).values().map(|l| l.status()).find(|s| s.phase.going()).map(|s| s.id)
    }

    fn refuse_if_busy(&self) -> Result<(), ApiError> {
        if self.closed.load(Ordering::Acquire) {
            return Err(Launches::shutting_down());
        }
        if let Some(other) = self.running() {
            let message = format!("run {other} is going; cancel it or wait (one run at a time)");
            return Err(ApiError::new(StatusCode::CONFLICT, "invalid_request_error", "run_in_progress", message));
        }
        Ok(())
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Every run the log knows, with this process's live state over it; oldest first.
async fn all_runs(s: &Arc<ApiState>) -> Result<Vec<RunInfo>, ApiError> {
    let state = s.clone();
    let history = tokio::task::spawn_blocking(move || training::run_history(&state.log, &state.node_dir))
        .await
        .map_err(|e| super::records::unreadable(e.to_string()))?
        .map_err(super::records::unreadable)?;
    let mut live: BTreeMap<String, RunInfo> =
        lock(&s.launches.by_id).values().map(|l| l.status()).map(|st| (st.id.clone(), st)).collect();
    let mut all: Vec<RunInfo> = history.into_iter().map(|h| live.remove(&h.id).unwrap_or(h)).collect();
    all.extend(live.into_values());
    all.sort_by_key(|r| r.first_seq);
    Ok(all)
}

async fn find(s: &Arc<ApiState>, id: &str) -> Result<RunInfo, ApiError> {
    if let Some(l) = s.launches.get(id) {
        return Ok(l.status());
    }
    let all = all_runs(s).await?;
    all.into_iter().find(|r| r.id == id || r.run_id.as_deref() == Some(id)).ok_or_else(|| not_found(id))
}

/// What a run recorded about itself, for checking its receipt: its output directory, its
/// plan file and its recipe's bytes (blocking: reads the log).
pub fn files_of(s: &ApiState, run_id: &str) -> Option<[PathBuf; 3]> {
    let runs = training::run_history(&s.log, &s.node_dir).ok()?;
    let run = runs.into_iter().find(|r| r.run_id.as_deref() == Some(run_id))?;
    let plan = run.out_dir.join(training::PLAN_FILE);
    let recipe = PathBuf::from(run.context["recipe_file"].as_str()?);
    Some([run.out_dir, plan, recipe])
}

/// `POST /api/runs` body: a recipe as [`RecipeRef`] names one, and the base an adapter
/// trains on.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LaunchRequest {
    pub recipe: Option<String>,
    pub yaml: Option<String>,
    pub name: Option<String>,
    /// A finished run of this node (its id or launch id: its `final/` weights) or an HF
    /// model directory on the node.
    pub base: Option<String>,
}

/// `POST /api/runs`: `{"recipe": NAME}` or `{"yaml": TEXT, "name": NAME}`, with `"base"`
/// for an adapter → 202 with the run's status; 400 with every recipe error (line, column,
/// field) when the recipe is invalid, or when an adapter would train on random weights; 409
/// while another run is going.
pub async fn launch(State(s): State<Arc<ApiState>>, Json(req): Json<LaunchRequest>) -> Response {
    match launch_run(&s, req).await {
        Ok(status) => (StatusCode::ACCEPTED, Json(status)).into_response(),
        Err(response) => response,
    }
}

async fn launch_run(s: &Arc<ApiState>, req: LaunchRequest) -> Result<RunInfo, Response> {
    let recipe_ref = RecipeRef { recipe: req.recipe, yaml: req.yaml, name: req.name };
    let (name, src, loaded) = recipe_ref.load(&s.node_dir).map_err(Rejected::into_response)?;
    s.launches.refuse_if_busy().map_err(IntoResponse::into_response)?;
    let init_from = match &req.base {
        Some(base) => Some(base_dir(s, base).await.map_err(IntoResponse::into_response)?),
        None => None,
    };
    let recipe_dir = s.node_dir.join("recipes");
    match run::check_base_choice(&loaded.recipe, &recipe_dir, init_from.as_deref()) {
        Ok(_) => {}
        Err(RunError::RandomBase) => {
            let message = "train.method trains an adapter, but its base would be random weights (no model.path \
                and no \"base\"): give \"base\": the id of a finished run of this node (its final/ weights) or an \
                HF model directory on the node, or set model.random_init: true in the recipe to train on random \
                weights on purpose";
            return Err(ApiError::invalid("base", message).into_response());
        }
        Err(e) => return Err(ApiError::invalid("base", e.to_string()).into_response()),
    }
    let mut random = [0u8; 6];
    if getrandom::fill(&mut random).is_err() {
        return Err(ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "server_error",
            "no_randomness",
            "getrandom failed",
        )
        .into_response());
    }
    let id = format!("{}-{}", loaded.recipe.meta.run_name, hex::encode(random));
    let out_dir = s.node_dir.join("runs").join(&id);
    let request_recipe = loaded.recipe.clone();
    let request = TrainRequest {
        recipe: RecipeInput { name: name.clone(), text: src, dir: recipe_dir, loaded },
        plan: None,
        out_dir: out_dir.clone(),
        resume: false,
        force: false,
        init_from,
        force_base: false,
        data: Default::default(),
        eval_prompts: 64,
        origin: Origin::Api { launch: id.clone() },
        // A recipe for several GPUs starts its ranks as the command line would.
        launch: RankLaunch::resolve(&Default::default(), &request_recipe).unwrap_or(None),
        recipe_path: None,
    };
    let status = RunInfo {
        id: id.clone(),
        origin: "api".into(),
        recipe: name,
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
        out_dir,
        first_seq: s.log.len(),
        context: Value::Null,
    };
    let launch = Arc::new(Launch {
        status: Mutex::new(status),
        cancel: AtomicBool::new(false),
        request: Mutex::new(request),
        thread: Mutex::new(None),
    });
    lock(&s.launches.by_id).insert(id, launch.clone());
    start(s, launch.clone());
    Ok(launch.status())
}

/// The directory `base` names: a finished run's `final/` (holding full weights), or an HF
/// model directory.
async fn base_dir(s: &Arc<ApiState>, base: &str) -> Result<PathBuf, ApiError> {
    let dir = match find(s, base).await {
        Ok(run) if run.phase == Phase::Finished => run.out_dir.join("final"),
        Ok(run) => {
            let message = format!("run {base} is {:?}, not finished: it has no final weights yet", run.phase);
            return Err(ApiError::invalid("base", message));
        }
        Err(_) if std::path::Path::new(base).is_absolute() => PathBuf::from(base),
        Err(_) => {
            let message = format!("{base}: neither a run of this node nor an absolute directory");
            return Err(ApiError::invalid("base", message));
        }
    };
    if !dir.join("config.json").is_file() {
        let message =
            format!("{} holds no full model weights (config.json): an adapter cannot be a base", dir.display());
        return Err(ApiError::invalid("base", message));
    }
    Ok(dir)
}

fn start(s: &Arc<ApiState>, launch: Arc<Launch>) {
    let state = s.clone();
    let run = launch.clone();
    let thread = std::thread::spawn(move || {
        let request = lock(&run.request).clone();
        let outcome =
            training::train_and_seal(&state.log, &state.identity, &state.node_dir, &request, &mut LaunchHooks(&run));
        run.update(|st| match outcome {
            Ok(t) => (st.phase, st.manifest) = (Phase::Finished, Some(t.sealed.path.display().to_string())),
            Err(TrainError::Run(RunError::Cancelled { .. })) => st.phase = Phase::Cancelled,
            Err(e) => (st.phase, st.error) = (Phase::Failed, Some(e.to_string())),
        });
    });
    *lock(&launch.thread) = Some(thread);
    // Launched as shutdown began: it stops at its first step, like the others.
    if s.launches.closed.load(Ordering::Acquire) {
        launch.cancel.store(true, Ordering::Release);
    }
}

/// Follows a launch's run: its plan, run id, steps and sealing, and its cancel flag.
struct LaunchHooks<'a>(&'a Launch);

impl Observer for LaunchHooks<'_> {
    fn started(&mut self, first_step: u64, total_steps: u64) {
        // `run.started` is in the log by now, and run.json names the run.
        let out = self.0.status().out_dir;
        let run_id = OutDir::new(&out).read_record().ok().flatten().map(|r| r.run_id);
        self.0
            .update(|st| (st.step, st.total_steps, st.run_id) = (first_step, total_steps, run_id.or(st.run_id.take())));
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

impl Hooks for LaunchHooks<'_> {
    fn planned(&mut self, plan: &UsedPlan) {
        self.0.update(|st| (st.phase, st.plan_blake3) = (Phase::Training, Some(hex::encode(plan.blake3))));
    }

    fn sealing(&mut self) {
        self.0.update(|st| st.phase = Phase::Sealing);
    }
}

fn not_found(id: &str) -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, "invalid_request_error", "run_not_found", format!("no run {id} here"))
}

/// `GET /api/runs`: every run the node knows (launched here, or trained with the CLI or
/// the demo), oldest first.
pub async fn list(State(s): State<Arc<ApiState>>) -> Result<Json<Value>, ApiError> {
    Ok(Json(json!({"runs": all_runs(&s).await?})))
}

/// `GET /api/runs/{id}` (the launch id, or the trainer's run id).
pub async fn show(State(s): State<Arc<ApiState>>, Path(id): Path<String>) -> Result<Json<RunInfo>, ApiError> {
    find(&s, &id).await.map(Json)
}

/// `POST /api/runs/{id}/cancel`: the run stops after its current step, checkpointed.
pub async fn cancel(State(s): State<Arc<ApiState>>, Path(id): Path<String>) -> Result<Response, ApiError> {
    let Some(launch) = s.launches.get(&id) else {
        let run = find(&s, &id).await?;
        let message = format!("run {id} is {:?}, not going", run.phase);
        return Err(ApiError::new(StatusCode::CONFLICT, "invalid_request_error", "not_running", message));
    };
    let phase = launch.status().phase;
    if !matches!(phase, Phase::Planning | Phase::Training) {
        let message = format!("run {id} is {phase:?}, not going");
        return Err(ApiError::new(StatusCode::CONFLICT, "invalid_request_error", "not_running", message));
    }
    launch.cancel.store(true, Ordering::Release);
    Ok((StatusCode::ACCEPTED, Json(launch.status())).into_response())
}

/// `POST /api/runs/{id}/resume`: a cancelled, failed or interrupted run continues from its
/// newest checkpoint, with the same recipe bytes, plan and base, whether it was started by
/// this process, an earlier one, or `mindxtrain train`.
pub async fn resume(State(s): State<Arc<ApiState>>, Path(id): Path<String>) -> Result<Response, ApiError> {
    let run = find(&s, &id).await?;
    if !run.phase.resumable() {
        let message = format!("run {id} is {:?}: only a cancelled, failed or interrupted run resumes", run.phase);
        return Err(ApiError::new(StatusCode::CONFLICT, "invalid_request_error", "not_resumable", message));
    }
    s.launches.refuse_if_busy()?;
    let launch = match s.launches.get(&id) {
        Some(launch) => launch,
        None => {
            let request = recorded_request(&s, &run)?;
            let launch = Arc::new(Launch {
                status: Mutex::new(run.clone()),
                cancel: AtomicBool::new(false),
                request: Mutex::new(request),
                thread: Mutex::new(None),
            });
            lock(&s.launches.by_id).insert(run.id.clone(), launch.clone());
            launch
        }
    };
    launch.cancel.store(false, Ordering::Release);
    {
        let mut request = lock(&launch.request);
        (request.resume, request.plan, request.init_from) = (true, None, None);
    }
    launch.update(|st| (st.phase, st.error) = (Phase::Training, None));
    start(&s, launch.clone());
    Ok((StatusCode::ACCEPTED, Json(launch.status())).into_response())
}

/// A run known from the log, asked again: the recipe bytes the node kept (their digest
/// checked), its directory, origin and recipe directory as `run.started` recorded them.
fn recorded_request(s: &ApiState, run: &RunInfo) -> Result<TrainRequest, ApiError> {
    let gone = |why: String| ApiError::new(StatusCode::CONFLICT, "invalid_request_error", "not_resumable", why);
    let file = run.context["recipe_file"].as_str().map(PathBuf::from).ok_or_else(|| {
        gone(format!("run {} did not record where its recipe's bytes are kept (recorded by an older node)", run.id))
    })?;
    let text = std::fs::read_to_string(&file).map_err(|e| gone(format!("{}: {e}", file.display())))?;
    let dir = run.context["recipe_dir"].as_str().map_or_else(|| s.node_dir.join("recipes"), PathBuf::from);
    let recipe = RecipeInput::parse(run.recipe.clone(), text, dir)
        .map_err(|e| gone(format!("{}: no longer a valid recipe: {e}", file.display())))?;
    let origin = match run.origin.as_str() {
        "api" => Origin::Api { launch: run.id.clone() },
        "demo" => Origin::Demo,
        _ => Origin::Cli,
    };
    Ok(TrainRequest {
        plan: None,
        out_dir: run.out_dir.clone(),
        resume: true,
        force: false,
        init_from: None,
        force_base: false,
        data: Default::default(),
        eval_prompts: 64,
        origin,
        launch: RankLaunch::resolve(&Default::default(), &recipe.loaded.recipe).unwrap_or(None),
        recipe_path: None,
        recipe,
    })
}

/// `GET /api/runs/{id}/events`: the run's events (those whose subject is its run id) from
/// its launch on, then live, as server-sent events.
pub async fn events(State(s): State<Arc<ApiState>>, Path(id): Path<String>) -> Result<Response, ApiError> {
    let run = find(&s, &id).await?;
    let from = run.first_seq;
    // A launch learns its run id from its `run.started`, which names the launch.
    let (launch, known) = (run.id.clone(), Mutex::new(run.run_id.clone()));
    let keep = move |e: &crate::log::Event| {
        let env = &e.envelope;
        let mut known = lock(&known);
        if known.is_none()
            && matches!(env.kind.as_str(), "run.started" | "run.resumed")
            && env.data["context"]["origin"]["launch"] == launch.as_str()
        {
            *known = Some(env.subject.clone());
        }
        known.as_deref() == Some(env.subject.as_str())
    };
    Ok(event_stream(s.log.clone(), from, keep))
}
