//! Runs on several ranks: one process per rank, as torchrun starts them.
//!
//! `mindxtrain train` with `hardware.gpus: N > 1` (or `--nproc-per-node N`, or `--collective`)
//! becomes the launcher of its node: it starts a rendezvous server (on `--rdzv HOST:PORT`,
//! loopback and a free port by default), starts one `mindxtrain rank` process per local rank in
//! a process group of its own, and supervises them ([`supervise`]): rank 0's events are appended
//! to the node's log here (rank 0 waits for each to be durable), its progress drives the
//! display, Ctrl-C reaches it as a cancel after the next step. When any rank fails, or its process
//! ends, every other rank is told to stop at once and the launcher records `run.failed` with the
//! first reason unless rank 0 already did; ranks that do not stop within a grace period are
//! killed. Nothing waits forever: joins and collectives have timeouts
//! (`train.distributed.timeout_seconds`), and a rank whose launcher goes away stops too.
//!
//! The launchers of other nodes (`--nnodes M --node-rank R`, R > 0) fetch the job from node 0's
//! rendezvous ([`follow`]), start their ranks with the same environment and wait for them; they
//! record nothing (rank 0 writes the run's events, on node 0).

mod probe;
mod rank;
mod spawn;
mod supervise;

pub use probe::collective_stage;
pub use rank::{RankArgs, run_rank};
pub use supervise::{Outcome, supervise};

use mindxtrain_trainer::collective::Backend;
use mindxtrain_trainer::recipe::{Recipe, Vendor};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::BTreeMap;
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::time::Duration;

/// How a run is spread, as the command line asks (see docs/cli.md).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LaunchOptions {
    /// Ranks on this node; default `hardware.gpus` (1 on a CPU recipe).
    pub nproc_per_node: Option<usize>,
    /// Nodes in the run (1).
    pub nnodes: usize,
    /// This node's index (0: the node that records the run).
    pub node_rank: usize,
    /// Where node 0's rendezvous listens (`HOST:PORT`); default loopback, a free port.
    pub rdzv: Option<String>,
    /// The collective backend; default NCCL on GPUs, TCP on the CPU. Giving it runs even one rank
    /// through the distributed path.
    pub collective: Option<Backend>,
    /// The CUDA device of each local rank (`0,1`; `0,0` shares one GPU); default `0..N`.
    pub devices: Option<Vec<usize>>,
}

/// A run on several ranks, resolved against its recipe.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Launch {
    pub ranks_per_node: usize,
    pub nnodes: usize,
    pub node_rank: usize,
    pub rdzv: SocketAddr,
    pub backend: Backend,
    /// The device each local rank trains on (`cpu`, `cuda:N`).
    pub devices: Vec<String>,
    pub timeout: Duration,
}

impl Launch {
    /// The launch `opts` ask for on `recipe`; `None` when the run is one process (one rank and no
    /// backend asked for).
    pub fn resolve(opts: &LaunchOptions, recipe: &Recipe) -> Result<Option<Launch>, String> {
        let gpus = recipe.hardware.gpus as usize;
        let on_gpu = gpus > 0 && recipe.hardware.name.vendor() == Vendor::Nvidia;
        let nnodes = opts.nnodes.max(1);
        let ranks_per_node = opts.nproc_per_node.unwrap_or(gpus.max(1));
        if ranks_per_node == 0 {
            return Err("--nproc-per-node: at least 1".into());
        }
        if opts.node_rank >= nnodes {
            return Err(format!("--node-rank {} with --nnodes {nnodes}: node ranks are 0..{nnodes}", opts.node_rank));
        }
        if nnodes > 1 && opts.rdzv.is_none() {
            return Err("--nnodes > 1 needs --rdzv HOST:PORT (node 0's address, the same on every node)".into());
        }
        if ranks_per_node * nnodes == 1 && opts.collective.is_none() {
            return Ok(None);
        }
        if let Some(why) = mindxtrain_trainer::run::MethodPlan::single_process_only(&recipe.train.method) {
            return Err(why);
        }
        if gpus > 0 && !on_gpu {
            return Err(format!(
                "hardware.name {:?} with gpus {gpus}: no launch path for these GPUs in this build; set hardware.gpus: 0",
                recipe.hardware.name
            ));
        }
        let backend = opts.collective.unwrap_or(if on_gpu { Backend::Nccl } else { Backend::Tcp });
        if backend == Backend::Nccl && !on_gpu {
            return Err("--collective nccl needs a GPU recipe (hardware.gpus >= 1 on NVIDIA hardware)".into());
        }
        let devices = if on_gpu {
            let ids = opts.devices.clone().unwrap_or_else(|| (0..ranks_per_node).collect());
            if ids.len() != ranks_per_node {
                return Err(format!("--devices lists {} device(s) for {ranks_per_node} rank(s) per node", ids.len()));
            }
            if backend == Backend::Nccl && (1..ids.len()).any(|i| ids[..i].contains(&ids[i])) {
                return Err(
                    "--devices: NCCL needs one GPU per rank; ranks that share a GPU use --collective tcp".into()
                );
            }
            ids.iter().map(|d| format!("cuda:{d}")).collect()
        } else {
            if opts.devices.is_some() {
                return Err("--devices: this recipe trains on the CPU (hardware.gpus: 0)".into());
            }
            vec!["cpu".to_string(); ranks_per_node]
        };
        let rdzv = match &opts.rdzv {
            None => SocketAddr::from(([127, 0, 0, 1], 0)),
            Some(a) => a
                .to_socket_addrs()
                .map_err(|e| format!("--rdzv {a}: {e}"))?
                .next()
                .ok_or_else(|| format!("--rdzv {a}: no address"))?,
        };
        Ok(Some(Launch {
            ranks_per_node,
            nnodes,
            node_rank: opts.node_rank,
            rdzv,
            backend,
            devices,
            timeout: Duration::from_secs(u64::from(recipe.train.distributed.timeout_seconds)),
        }))
    }

    pub fn world(&self) -> usize {
        self.ranks_per_node * self.nnodes
    }
}

/// What every rank runs, sent in its welcome.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Job {
    pub recipe_blake3: String,
    pub backend: Backend,
    /// The recipe's `train.env` with the plan's overrides: every rank's process environment.
    pub env: BTreeMap<String, String>,
    pub timeout_seconds: u64,
    pub work: Work,
}

/// What the ranks do.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Work {
    Train(TrainJob),
    /// Time collectives at these sizes (the probe's collective stage).
    Probe {
        sizes: Vec<u64>,
        ops: Vec<String>,
        dtype: String,
    },
}

/// A run, as rank 0's launcher was asked for it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrainJob {
    /// The plan file's bytes (its BLAKE3 is the run's plan hash).
    pub plan: String,
    pub out_dir: PathBuf,
    pub resume: bool,
    pub init_from: Option<PathBuf>,
    pub force_base: bool,
    pub skip_bad: bool,
    pub eval_prompts: usize,
    pub context: serde_json::Map<String, Value>,
}

/// How the rank processes of a node are started: the `mindxtrain` binary (this one, or
/// `MINDXTRAIN_RANK_EXE`) with its node directory, the recipe file as this node names it and the
/// directory its relative paths start from.
#[derive(Debug, Clone)]
pub struct RankCommand {
    pub exe: PathBuf,
    pub node_dir: PathBuf,
    pub recipe: PathBuf,
    pub recipe_dir: PathBuf,
}

impl RankCommand {
    pub fn current(node_dir: PathBuf, recipe: PathBuf, recipe_dir: PathBuf) -> std::io::Result<RankCommand> {
        let exe = match std::env::var_os("MINDXTRAIN_RANK_EXE") {
            Some(e) => PathBuf::from(e),
            None => std::env::current_exe()?,
        };
        let abs = |p: PathBuf| mindxtrain_trainer::run::base::absolute(&p);
        Ok(RankCommand { exe, node_dir: abs(node_dir), recipe: abs(recipe), recipe_dir: abs(recipe_dir) })
    }
}

/// A node other than 0: fetches each job from node 0's rendezvous (the probe's collective stage
/// is one job per candidate, then the run), starts this node's ranks with the job's environment
/// and waits for them. Returns once the ranks of the run (a training job) have ended: the first
/// failure, if any.
pub fn follow(launch: &Launch, cmd: &RankCommand) -> Result<(), String> {
    let mut last: Option<Value> = None;
    loop {
        let deadline = std::time::Instant::now() + launch.timeout;
        // Between two jobs node 0 closes its rendezvous and opens the next: a connection it
        // dropped, or the job already run, means asking again.
        let value = loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return Err(format!("node 0 at {} sent no new job within {} s", launch.rdzv, launch.timeout.as_secs()));
            }
            match mindxtrain_trainer::collective::rendezvous::fetch_job(launch.rdzv, launch.node_rank, left) {
                Ok(v) if last.as_ref() != Some(&v) => break v,
                Ok(_) => std::thread::sleep(Duration::from_millis(50)),
                Err(e) if std::time::Instant::now() >= deadline => return Err(e.to_string()),
                Err(_) => std::thread::sleep(Duration::from_millis(50)),
            }
        };
        let job: Job = serde_json::from_value(value.clone())
            .map_err(|e| format!("node 0 sent a job this build cannot read: {e}"))?;
        let mut ranks = spawn::LocalRanks::start(launch, cmd, launch.rdzv, &job.env, None)?;
        let result = ranks.wait_all();
        match job.work {
            Work::Train(_) => return result,
            // A candidate that failed is recorded as such by node 0; the next job follows.
            Work::Probe { .. } => last = Some(value),
        }
    }
}
