//! Sealing a finished run: its signed manifest, `manifest.sealed` and the anchoring request.

use crate::energy::Energy;
use crate::identity::Identity;
use crate::log::EventLog;
use crate::log::index::Query;
use crate::manifest::digest::DigestSet;
use crate::manifest::statement::{DATASET_NAME, ResourceDescriptor};
use crate::manifest::{self, EventRange, HashOptions, ManifestError, NamedBytes, NamedFile, RunFacts, Sealed};
use mindxtrain_trainer::hub::RepoKind;
use mindxtrain_trainer::run::{BaseRecord, RunSummary};
use serde_json::{Value, json};
use std::path::Path;
use std::time::{Duration, SystemTime};

/// A finished run as the node seals it: the trainer's summary and what the run read.
pub struct FinishedRun<'a> {
    pub summary: &'a RunSummary,
    /// The recipe and plan bytes the run used.
    pub recipe: NamedBytes,
    pub plan: Option<NamedBytes>,
    /// The run directory: every file under it (checkpoints, final weights or adapter,
    /// run.json, dataset.json, eval.json) becomes a subject of the manifest.
    pub out_dir: &'a Path,
    /// The machine the plan was measured on.
    pub hardware: Value,
    /// What the training drew (the node measures around it).
    pub energy: Energy,
}

/// Seals a finished run: the signed in-toto/SLSA manifest, its `manifest.sealed` event and
/// the anchoring request for its digest. The base the run started from (its summary's
/// record) is hashed as the base model. Called by [`super::train_and_seal`] at the end of
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
    let base_dir = s.base.path();
    let base_model = match &s.base {
        BaseRecord::Weights { path, files, .. } => {
            files.iter().map(|f| NamedFile { name: f.path.clone(), path: Path::new(path).join(&f.path) }).collect()
        }
        BaseRecord::RandomInit { .. } => Vec::new(),
    };
    // A base or dataset found in the hub cache is named by repository and commit, so the
    // manifest says what to fetch to check it. The base keeps its directory as its URI: a
    // replay relocates the adapter's record of it from there.
    let base_model_annotations = match &s.base {
        BaseRecord::Weights { hub: Some(h), .. } => Some(
            json!({"hf_repo": h.repo, "hf_revision": h.revision, "hf_commit": h.commit, "hf_uri": h.uri(RepoKind::Model)}),
        ),
        _ => None,
    };
    let digest = DigestSet { blake3: Some(s.dataset_digest.clone()), ..Default::default() };
    let dataset = ResourceDescriptor {
        name: Some(DATASET_NAME.into()),
        uri: s.dataset.hub_source().map(|h| h.uri(RepoKind::Dataset)),
        digest: Some(digest),
        ..Default::default()
    };
    let eval = run.out_dir.join("eval.json");
    let finished = SystemTime::now();
    let facts = RunFacts {
        run_id: s.run_id.clone(),
        recipe: run.recipe,
        plan: run.plan,
        output_dir: run.out_dir.to_path_buf(),
        base_model,
        base_model_uri: base_dir.map(|d| format!("file://{}", d.display())),
        base_model_annotations,
        dataset: Some(dataset),
        source: None,
        eval_json: eval.is_file().then_some(eval),
        hardware: run.hardware,
        energy: run.energy,
        started: finished.checked_sub(Duration::from_secs_f64(s.seconds.max(0.0))).unwrap_or(finished),
        finished,
        events: EventRange { first, last },
    };
    manifest::seal(log, key, node_dir, &facts, HashOptions::default())
}
