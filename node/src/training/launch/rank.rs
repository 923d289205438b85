//! One rank's process (`mindxtrain rank`, started by a launcher): join the rendezvous, connect
//! the collective, run the job, report.

use super::supervise::progress_call;
use super::{Job, Work};
use crate::training::RecipeInput;
use mindxtrain_trainer::collective::rendezvous::{self, Control, Join};
use mindxtrain_trainer::collective::{Abort, Backend, Collective, CollectiveError, Mesh, bench};
use mindxtrain_trainer::data::DataOptions;
use mindxtrain_trainer::events::{Discard, EventSink, TrainerEvent};
use mindxtrain_trainer::parallel::Distributed;
use mindxtrain_trainer::plan::Plan;
use mindxtrain_trainer::run::{self, EvalReport, Observer, Quiet, RunError, RunSpec, StepReport};
use serde_json::json;
use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// A stopped rank whose main thread does not return by itself within this long is ended by its
/// watchdog (its collective may be stuck on a device that no longer answers).
const WATCHDOG_GRACE: Duration = Duration::from_secs(5);

/// The exit status of a rank its watchdog ended.
pub const EXIT_STOPPED: i32 = 3;

/// What a launcher tells a rank process on its command line.
#[derive(Debug, Clone)]
pub struct RankArgs {
    pub recipe: PathBuf,
    /// Where the recipe's relative paths start (default: the recipe file's directory).
    pub recipe_dir: Option<PathBuf>,
    pub rdzv: SocketAddr,
    pub node_rank: usize,
    pub local_rank: usize,
    pub nnodes: usize,
    pub nproc_per_node: usize,
    pub collective: Backend,
    /// `cpu` or `cuda:N`.
    pub device: String,
}

/// Rank 0's events, recorded by the launcher before `emit` returns.
struct ControlSink<'a>(&'a Control);

impl EventSink for ControlSink<'_> {
    type Error = CollectiveError;

    fn emit(&mut self, e: TrainerEvent) -> Result<(), CollectiveError> {
        self.0.event(&e.kind, &e.subject, e.data)
    }
}

/// Rank 0's progress, shown by the launcher; the launcher's cancel.
struct ControlObserver<'a>(&'a Control);

impl Observer for ControlObserver<'_> {
    fn started(&mut self, first_step: u64, total_steps: u64) {
        let _ =
            self.0.progress(progress_call("started", json!({"first_step": first_step, "total_steps": total_steps})));
    }
    fn step(&mut self, r: &StepReport) {
        let _ = self.0.progress(progress_call("step", serde_json::to_value(r).unwrap_or_default()));
    }
    fn note(&mut self, message: &str) {
        let _ = self.0.progress(progress_call("note", json!(message)));
    }
    fn evaluated(&mut self, r: &EvalReport) {
        let _ = self.0.progress(progress_call("evaluated", serde_json::to_value(r).unwrap_or_default()));
    }
    fn cancelled(&mut self) -> bool {
        // A launcher that cannot answer is gone: the next collective says so.
        self.0.ask_cancel().unwrap_or(false)
    }
}

#[cfg(feature = "cuda")]
fn nccl_id(args: &RankArgs) -> Result<Option<String>, String> {
    if args.collective == Backend::Nccl && args.node_rank == 0 && args.local_rank == 0 {
        return mindxtrain_trainer::collective::Nccl::unique_id().map(Some).map_err(|e| e.to_string());
    }
    Ok(None)
}

#[cfg(not(feature = "cuda"))]
fn nccl_id(args: &RankArgs) -> Result<Option<String>, String> {
    if args.collective == Backend::Nccl {
        return Err("--collective nccl: this build has no CUDA (build with scripts/build-gpu)".into());
    }
    Ok(None)
}

fn connect(
    args: &RankArgs,
    welcome: &rendezvous::Welcome,
    listener: TcpListener,
    device: &candle_core::Device,
    timeout: Duration,
    abort: Arc<Abort>,
) -> Result<Box<dyn Collective>, String> {
    match args.collective {
        Backend::Tcp => Mesh::connect(welcome.rank, &welcome.peers, listener, timeout, abort)
            .map(|m| Box::new(m) as Box<dyn Collective>)
            .map_err(|e| e.to_string()),
        Backend::Nccl => nccl(welcome, device, timeout, abort),
    }
}

#[cfg(feature = "cuda")]
fn nccl(
    welcome: &rendezvous::Welcome,
    device: &candle_core::Device,
    timeout: Duration,
    abort: Arc<Abort>,
) -> Result<Box<dyn Collective>, String> {
    let id = welcome.nccl_id.as_deref().ok_or("rank 0 sent no NCCL unique id")?;
    mindxtrain_trainer::collective::Nccl::new(device, welcome.rank, welcome.world, id, timeout, abort)
        .map(|n| Box::new(n) as Box<dyn Collective>)
        .map_err(|e| e.to_string())
}

#[cfg(not(feature = "cuda"))]
fn nccl(
    _: &rendezvous::Welcome,
    _: &candle_core::Device,
    _: Duration,
    _: Arc<Abort>,
) -> Result<Box<dyn Collective>, String> {
    Err("--collective nccl: this build has no CUDA (build with scripts/build-gpu)".into())
}

/// Runs one rank to its end; `Err` is what it reports (the launcher heard it already).
pub fn run_rank(args: RankArgs) -> Result<(), String> {
    let mut recipe = RecipeInput::from_file(&args.recipe).map_err(|e| e.to_string())?;
    if let Some(dir) = &args.recipe_dir {
        recipe.dir = dir.clone();
    }
    let timeout = Duration::from_secs(u64::from(recipe.loaded.recipe.train.distributed.timeout_seconds));
    let abort = Arc::new(Abort::new());
    let id = nccl_id(&args)?;
    let mut listener = None;
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").map(|h| h.trim().to_string()).unwrap_or_default();
    let (welcome, control) = rendezvous::join(
        args.rdzv,
        |ip| {
            let l = TcpListener::bind(SocketAddr::new(ip, 0))
                .map_err(|e| CollectiveError::Rendezvous(format!("listening for the other ranks on {ip}: {e}")))?;
            let mesh = l.local_addr().map_err(|e| CollectiveError::Rendezvous(e.to_string()))?;
            listener = Some(l);
            Ok(Join {
                node_rank: args.node_rank,
                local_rank: args.local_rank,
                mesh,
                recipe_blake3: hex::encode(recipe.loaded.bytes_blake3),
                device: args.device.clone(),
                host,
                pid: std::process::id(),
                nccl_id: id,
            })
        },
        timeout,
        abort.clone(),
    )
    .map_err(|e| e.to_string())?;
    let rank = welcome.rank;
    // The watchdog: once the launcher says stop, the main thread gets a moment to fail by itself
    // (and report); a rank stuck in a device wait is ended.
    let watched = abort.clone();
    std::thread::spawn(move || {
        let reason = loop {
            if let Some(r) = watched.wait_reason(Duration::from_secs(3600)) {
                break r;
            }
        };
        std::thread::sleep(WATCHDOG_GRACE);
        eprintln!("rank {rank}: stopped: {reason}");
        std::process::exit(EXIT_STOPPED);
    });
    let result = run_job(&args, &recipe, &welcome, &control, listener, timeout, abort);
    if let Err(e) = &result {
        control.failed(e);
        eprintln!("rank {rank}: {e}");
    }
    result
}

fn run_job(
    args: &RankArgs,
    recipe: &RecipeInput,
    welcome: &rendezvous::Welcome,
    control: &Control,
    listener: Option<TcpListener>,
    timeout: Duration,
    abort: Arc<Abort>,
) -> Result<(), String> {
    let job: Job = serde_json::from_value(welcome.job.clone()).map_err(|e| format!("the launcher's job: {e}"))?;
    if job.recipe_blake3 != hex::encode(recipe.loaded.bytes_blake3) {
        return Err(format!("this rank's recipe is not the launcher's ({})", job.recipe_blake3));
    }
    let device = run::named_device(&args.device).map_err(|e| e.to_string())?;
    let listener = listener.ok_or("no mesh listener")?;
    let mut collective = connect(args, welcome, listener, &device, timeout, abort)?;
    match job.work {
        Work::Probe { sizes, ops, dtype } => {
            let dtype = match dtype.as_str() {
                "bf16" => candle_core::DType::BF16,
                "f16" => candle_core::DType::F16,
                _ => candle_core::DType::F32,
            };
            let ops: Vec<&str> = ops.iter().map(String::as_str).collect();
            let timings =
                bench::time_ops(collective.as_mut(), &device, dtype, &sizes, &ops).map_err(|e| e.to_string())?;
            control.report(json!({"outcome": "probe", "timings": timings})).map_err(|e| e.to_string())
        }
        Work::Train(t) => {
            let plan_bytes = t.plan.into_bytes();
            let plan = Plan::from_bytes(&plan_bytes, "the launcher's plan").map_err(|e| e.to_string())?;
            let spec = RunSpec {
                recipe: recipe.loaded.clone(),
                recipe_dir: recipe.dir.clone(),
                plan,
                plan_blake3: *blake3::hash(&plan_bytes).as_bytes(),
                out_dir: t.out_dir,
                resume: t.resume,
                data: DataOptions { skip_bad: t.skip_bad, ..DataOptions::default() },
                init_from: t.init_from,
                force_base: t.force_base,
                eval_prompts: t.eval_prompts,
                context: t.context,
            };
            let dist = Distributed { collective, topology: welcome.topology.clone() };
            let result = if welcome.rank == 0 {
                run::train_rank(&spec, dist, device, &mut ControlSink(control), &mut ControlObserver(control))
            } else {
                run::train_rank(&spec, dist, device, &mut Discard, &mut Quiet)
            };
            let report = match result {
                Ok(summary) => json!({"outcome": "finished", "summary": summary}),
                Err(RunError::Cancelled { step }) => json!({"outcome": "cancelled", "step": step}),
                Err(e) => return Err(e.to_string()),
            };
            control.report(report).map_err(|e| e.to_string())
        }
    }
}
