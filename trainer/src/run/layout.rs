//! The run directory: what a run writes and where.
//!
//! ```text
//! OUT/run.json                 run id, recipe and plan digests, the base it started from
//! OUT/dataset.json             the dataset manifest
//! OUT/checkpoints/step-NNNNNNNN/   weights or adapter + trainer state (complete or absent)
//! OUT/final/                   the trained weights (HF) or adapter (PEFT)
//! OUT/eval.json                the last evaluation
//! ```
//! A checkpoint directory is built under a temporary name and renamed into place, so a
//! `step-*` directory is always complete; `checkpoints/latest` names the newest one, which
//! is where `--resume` continues.

use super::RunError;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

const CHECKPOINTS: &str = "checkpoints";

/// The plan a run used, kept in its directory by the node, so a resume needs no `--plan`.
pub const PLAN_FILE: &str = "plan.json";

/// What a run writes in its directory, trainer and node together: what `train --force` may
/// remove, and what the recipe's `receipt.output` may not name (the receipt would replace a
/// file of the run). Hidden and `.tmp` names of files being written come on top.
pub const RUN_FILES: [&str; 10] = [
    "run.json",
    "dataset.json",
    "eval.json",
    super::eval::BASELINE_FILE,
    PLAN_FILE,
    super::session::RL_JSON,
    super::card::DEFAULT_RECEIPT_FILE,
    CHECKPOINTS,
    "final",
    "tensorboard",
];

/// `OUT/run.json`: what identifies a run across resumes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunRecord {
    pub run_id: String,
    pub recipe_blake3: String,
    pub plan_blake3: String,
    pub method: String,
    pub seed: u64,
    /// The weights the run started from (absent in runs recorded before bases were).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base: Option<super::BaseRecord>,
    /// Rows per optimizer step over every rank, fixed when the run starts (absent in runs
    /// recorded before it was: one process, `per_device × grad_accum`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub global_batch: Option<u64>,
}

#[derive(Debug, Clone)]
pub struct OutDir {
    root: PathBuf,
}

fn io(path: &Path, e: impl std::fmt::Display) -> RunError {
    RunError::Io { path: path.display().to_string(), message: e.to_string() }
}

impl OutDir {
    pub fn new(root: impl Into<PathBuf>) -> OutDir {
        OutDir { root: root.into() }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn run_json(&self) -> PathBuf {
        self.root.join("run.json")
    }

    pub fn dataset_json(&self) -> PathBuf {
        self.root.join("dataset.json")
    }

    pub fn eval_json(&self) -> PathBuf {
        self.root.join("eval.json")
    }

    pub fn final_dir(&self) -> PathBuf {
        self.root.join("final")
    }

    pub fn checkpoint_dir(&self, step: u64) -> PathBuf {
        self.root.join(CHECKPOINTS).join(format!("step-{step:08}"))
    }

    pub fn read_record(&self) -> Result<Option<RunRecord>, RunError> {
        let path = self.run_json();
        match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes).map(Some).map_err(|e| io(&path, e)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(io(&path, e)),
        }
    }

    /// Replaces `path` atomically and durably: temp file, fsync, rename, fsync directory.
    pub fn write_json(&self, path: &Path, value: &impl Serialize) -> Result<(), RunError> {
        let mut bytes = serde_json::to_vec_pretty(value).map_err(|e| io(path, e))?;
        bytes.push(b'\n');
        let tmp = path.with_extension("json.tmp");
        let write = || -> std::io::Result<()> {
            let mut f = std::fs::File::create(&tmp)?;
            std::io::Write::write_all(&mut f, &bytes)?;
            f.sync_all()?;
            std::fs::rename(&tmp, path)?;
            let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
            std::fs::File::open(dir)?.sync_all()
        };
        write().map_err(|e| io(path, e))
    }

    pub fn checkpoints_root(&self) -> PathBuf {
        self.root.join(CHECKPOINTS)
    }
}
