//! Every run the log knows of, whoever launched it (the command line, the demo or the
//! operator API) and whenever (before this process started too): a fold of the `run.*`
//! events, the latest `train.progress` and `manifest.sealed` of each run, read through the
//! log's kind and run indexes.

use crate::log::EventLog;
use crate::log::index::Query;
use serde::Serialize;
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Where a run is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    Planning,
    Training,
    Sealing,
    Finished,
    Failed,
    Cancelled,
    /// Started, never ended: the process running it stopped (kill -9, a crash, a power
    /// cut). Its newest checkpoint is where a resume continues.
    Interrupted,
}

impl Phase {
    /// Whether a run in this phase is going.
    pub fn going(self) -> bool {
        matches!(self, Phase::Planning | Phase::Training | Phase::Sealing)
    }

    /// Whether a run in this phase may be resumed.
    pub fn resumable(self) -> bool {
        matches!(self, Phase::Cancelled | Phase::Failed | Phase::Interrupted)
    }
}

/// A run as `GET /api/runs` shows it.
#[derive(Debug, Clone, Serialize)]
pub struct RunInfo {
    /// The launch id for a run launched over the API, else the run id.
    pub id: String,
    /// `cli`, `demo` or `api`.
    pub origin: String,
    /// The recipe's name (its file name, or the name given over the API).
    pub recipe: String,
    pub phase: Phase,
    pub run_id: Option<String>,
    pub step: u64,
    pub total_steps: u64,
    pub loss: Option<f64>,
    pub lr: Option<f64>,
    pub tokens_per_s: Option<f64>,
    pub plan_blake3: Option<String>,
    /// The sealed manifest's file.
    pub manifest: Option<String>,
    pub error: Option<String>,
    pub out_dir: PathBuf,
    /// The seq of the run's first event (its `run.started`); its events come from here on.
    pub first_seq: u64,
    /// What the driver recorded about the run in `run.started` (origin, plan, where the
    /// recipe's bytes are kept): what a resume after a restart needs.
    #[serde(skip)]
    pub context: Value,
}

const KINDS: [&str; 6] =
    ["run.started", "run.resumed", "run.cancelled", "run.failed", "run.finished", "manifest.sealed"];

/// Every run in the log, oldest first.
pub fn run_history(log: &EventLog, node_dir: &Path) -> Result<Vec<RunInfo>, String> {
    let mut seqs = Vec::new();
    for kind in KINDS {
        seqs.extend(log.query(&Query::Kind(kind.into())).map_err(|e| e.to_string())?);
    }
    seqs.sort_unstable();
    let mut runs: BTreeMap<String, RunInfo> = BTreeMap::new();
    for seq in seqs {
        let e = log.get(seq).map_err(|e| e.to_string())?;
        let data = &e.envelope.data;
        let Some(run_id) = data["run_id"].as_str().map(str::to_string) else { continue };
        let kind = e.envelope.kind.as_str();
        if matches!(kind, "run.started" | "run.resumed") {
            let run = runs.entry(run_id.clone()).or_insert_with(|| started(&run_id, seq, data));
            run.phase = Phase::Training;
            run.error = None;
            run.step = data["start_step"].as_u64().unwrap_or(run.step);
            run.total_steps = data["total_steps"].as_u64().unwrap_or(run.total_steps);
            run.context = data["context"].clone();
            if let Some(dir) = run.context["out_dir"].as_str() {
                run.out_dir = PathBuf::from(dir);
            }
            continue;
        }
        let Some(run) = runs.get_mut(&run_id) else { continue };
        match kind {
            "run.cancelled" => (run.phase, run.step) = (Phase::Cancelled, data["step"].as_u64().unwrap_or(run.step)),
            "run.failed" => {
                run.phase = Phase::Failed;
                run.error = data["error"].as_str().map(str::to_string);
            }
            "run.finished" => (run.phase, run.step) = (Phase::Finished, data["steps"].as_u64().unwrap_or(run.step)),
            "manifest.sealed" => run.manifest = data["file"].as_str().map(|f| node_dir.join(f).display().to_string()),
            _ => {}
        }
    }
    let mut all: Vec<RunInfo> = runs.into_values().collect();
    for run in &mut all {
        latest_progress(log, run)?;
        if run.phase == Phase::Training {
            run.phase = Phase::Interrupted;
            run.error = Some(
                "the process running it stopped before the run ended; resume continues from its newest checkpoint"
                    .into(),
            );
        }
    }
    all.sort_by_key(|r| r.first_seq);
    Ok(all)
}

fn started(run_id: &str, seq: u64, data: &Value) -> RunInfo {
    let origin = &data["context"]["origin"];
    RunInfo {
        id: origin["launch"].as_str().unwrap_or(run_id).to_string(),
        origin: origin["kind"].as_str().unwrap_or("cli").to_string(),
        recipe: data["recipe_file"].as_str().unwrap_or("-").to_string(),
        phase: Phase::Training,
        run_id: Some(run_id.to_string()),
        step: 0,
        total_steps: 0,
        loss: None,
        lr: None,
        tokens_per_s: None,
        plan_blake3: data["plan_blake3"].as_str().map(str::to_string),
        manifest: None,
        error: None,
        out_dir: PathBuf::from(data["out_dir"].as_str().unwrap_or_default()),
        first_seq: seq,
        context: Value::Null,
    }
}

/// The step, loss, lr and tokens/s of the run's newest `train.progress`.
fn latest_progress(log: &EventLog, run: &mut RunInfo) -> Result<(), String> {
    let Some(run_id) = &run.run_id else { return Ok(()) };
    let seqs = log.query(&Query::Run(run_id.clone())).map_err(|e| e.to_string())?;
    for &seq in seqs.iter().rev() {
        let e = log.get(seq).map_err(|e| e.to_string())?;
        if e.envelope.kind == "train.progress" {
            let d = &e.envelope.data;
            run.step = run.step.max(d["step"].as_u64().unwrap_or(0));
            (run.loss, run.lr, run.tokens_per_s) = (d["loss"].as_f64(), d["lr"].as_f64(), d["tokens_per_s"].as_f64());
            break;
        }
    }
    Ok(())
}
