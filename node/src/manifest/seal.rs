//! Sealing a run: what the training loop knows ([`RunFacts`]) becomes a signed, durable
//! manifest, a `manifest.sealed` event, and an `anchor.requested` item for the next batch.

use super::digest::{self, DigestSet, Digests, HashOptions};
use super::dsse::{Envelope, IN_TOTO_PAYLOAD_TYPE};
use super::statement::*;
use super::{KIND_SEALED, MANIFEST_DIR, ManifestError, manifest_path};
use crate::canonical;
use crate::energy::Energy;
use crate::identity::Identity;
use crate::log::checkpoint::{self, Checkpoint};
use crate::log::{AppendRequest, EventLog};
use mindxtrain_trainer::recipe::Recipe;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

/// A file known by a name (relative, `/`-separated) and where it lies now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NamedFile {
    pub name: String,
    pub path: PathBuf,
}

/// Bytes known by a name (the recipe and plan are read once, by the caller, so the bytes
/// hashed are the bytes the run used).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NamedBytes {
    pub name: String,
    pub bytes: Vec<u8>,
}

/// Inclusive range of the run's events in the node's log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EventRange {
    pub first: u64,
    pub last: u64,
}

/// The source the node was built from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceRef {
    /// e.g. `git+https://github.com/org/mindxtrain`
    pub repository: String,
    /// Full hex commit id.
    pub commit: String,
}

/// Everything the training loop knows about a finished run, for [`seal`].
#[derive(Debug, Clone)]
pub struct RunFacts {
    pub run_id: String,
    /// The recipe's exact bytes (YAML); must be a valid recipe.
    pub recipe: NamedBytes,
    /// The autotune plan's exact bytes (JSON, or any text), if the run had one.
    pub plan: Option<NamedBytes>,
    /// Every regular file under it becomes a subject (checkpoints, adapters, eval.json…).
    pub output_dir: PathBuf,
    /// Base model files (hashed at sealing), and where the model came from (e.g.
    /// `hf://Qwen/Qwen3-8B@<revision>`).
    pub base_model: Vec<NamedFile>,
    pub base_model_uri: Option<String>,
    /// What else is known of the base, on each of its descriptors (a base found in the hub
    /// cache: its repository, the revision asked and the commit).
    pub base_model_annotations: Option<Value>,
    /// The dataset manifest, as a descriptor with its digest (the trainer's BLAKE3).
    pub dataset: Option<ResourceDescriptor>,
    pub source: Option<SourceRef>,
    /// The eval report; its digests and top-level scalar members go into the manifest.
    pub eval_json: Option<PathBuf>,
    /// Accelerator, driver, host: whatever the trainer reports, as JSON.
    pub hardware: Value,
    /// What the run drew, measured around its training.
    pub energy: Energy,
    pub started: SystemTime,
    pub finished: SystemTime,
    pub events: EventRange,
}

/// What [`seal`] produced.
#[derive(Debug, Clone)]
pub struct Sealed {
    pub envelope: Envelope,
    /// The canonical envelope bytes, as written to `path`.
    pub bytes: Vec<u8>,
    /// Digests of `bytes`. The BLAKE3 is the item anchored on chain.
    pub digests: Digests,
    pub path: PathBuf,
    /// Seq of the `manifest.sealed` event.
    pub seq: u64,
    pub statement: Statement,
}

/// Hashes the run's files, signs the manifest with `key`, writes it durably to
/// `<node_dir>/manifests/<blake3>.json`, appends `manifest.sealed` and requests anchoring
/// of the manifest's BLAKE3 (`anchor.requested`, label `manifest`).
///
/// Blocking (hashing, fsync, log appends): call from a blocking context. Sealing a run
/// twice with different content is refused by the log (the event id is per run).
pub fn seal(
    log: &EventLog,
    key: &Identity,
    node_dir: &Path,
    facts: &RunFacts,
    opts: HashOptions,
) -> Result<Sealed, ManifestError> {
    let statement = build_statement(log, key, facts, opts)?;
    let payload =
        canonical::to_vec(&serde_json::to_value(&statement).map_err(|e| ManifestError::Invalid(e.to_string()))?)
            .map_err(|e| ManifestError::Invalid(format!("statement: {e}")))?;
    let envelope = Envelope::sign(IN_TOTO_PAYLOAD_TYPE, &payload, key);
    let bytes = envelope.to_canonical();
    let digests = Digests::of_bytes(&bytes);
    let path = manifest_path(node_dir, &digests.blake3);
    write_content_addressed(&path, &bytes)?;
    let b3 = hex::encode(digests.blake3);
    let mut data = json!({
        "run_id": facts.run_id,
        "blake3": b3,
        "sha256": hex::encode(digests.sha256),
        "bytes": bytes.len(),
        "subjects": statement.subject.len(),
        "file": format!("{MANIFEST_DIR}/{b3}.json"),
    });
    // The receipt carries this event: the run's event range goes in only where the manifest's does.
    if statement.predicate.run_details.mindxtrain_log.is_some() {
        data["first_seq"] = json!(facts.events.first);
        data["last_seq"] = json!(facts.events.last);
    }
    let sealed = log.append(
        AppendRequest::new(KIND_SEALED, facts.run_id.clone(), data).with_id(format!("{KIND_SEALED}:{}", facts.run_id)),
    )?;
    crate::anchor::request(log, &digests.blake3, "manifest")?;
    Ok(Sealed { envelope, bytes, digests, path, seq: sealed.seq, statement })
}

fn build_statement(
    log: &EventLog,
    key: &Identity,
    facts: &RunFacts,
    opts: HashOptions,
) -> Result<Statement, ManifestError> {
    validate_run_id(&facts.run_id)?;
    if facts.events.first > facts.events.last || facts.events.last >= log.len() {
        return Err(ManifestError::Invalid(format!(
            "event range {}..={} is not inside the log (seqs 0..={})",
            facts.events.first,
            facts.events.last,
            log.len().saturating_sub(1)
        )));
    }
    let (recipe, loaded) = recipe_parameter(&facts.recipe)?;
    let items = ReceiptItems::of(&loaded.receipt.include);
    let has = |item| items.has(item);
    // Without `checkpoints`, the step checkpoints are not subjects; final/ and the run's other files are.
    let subject = hash_output_dir(&facts.output_dir, opts, |name| {
        has(ReceiptItem::Checkpoints) || !name.starts_with(CHECKPOINTS_PREFIX)
    })?;
    let plan = facts.plan.as_ref().filter(|_| has(ReceiptItem::Plan)).map(plan_parameter);
    let mut deps = Vec::new();
    for f in &facts.base_model {
        let d = hash(&f.path, opts)?;
        deps.push(ResourceDescriptor {
            name: Some(format!("base/{}", f.name)),
            uri: facts.base_model_uri.clone(),
            digest: Some(d.to_set()),
            annotations: facts.base_model_annotations.clone(),
            ..Default::default()
        });
    }
    deps.extend(facts.dataset.clone().filter(|_| has(ReceiptItem::DatasetHashes)));
    if let Some(src) = facts.source.as_ref().filter(|_| has(ReceiptItem::CodeVersion)) {
        let mut other = BTreeMap::new();
        other.insert("gitCommit".to_string(), src.commit.clone());
        deps.push(ResourceDescriptor {
            name: Some(SOURCE_NAME.into()),
            uri: Some(format!("{}@{}", src.repository, src.commit)),
            digest: Some(DigestSet { other, ..Default::default() }),
            ..Default::default()
        });
    }
    let byproducts = match facts.eval_json.as_ref().filter(|_| has(ReceiptItem::EvalReport)) {
        Some(p) => vec![eval_descriptor(p)?],
        None => Vec::new(),
    };
    let version = if has(ReceiptItem::CodeVersion) {
        BTreeMap::from([
            ("mindxtrain".to_string(), crate::SOFTWARE.to_string()),
            ("mindxtrain-trainer".to_string(), mindxtrain_trainer::VERSION.to_string()),
            ("mindxtrain-kernels".to_string(), mindxtrain_trainer::KERNELS_VERSION.to_string()),
        ])
    } else {
        BTreeMap::new()
    };
    let meta = &loaded.meta;
    let meta = ModelMeta {
        project: meta.project.clone(),
        run_name: meta.run_name.clone(),
        license: meta.license.clone(),
        description: meta.description.clone(),
    };
    let size = log.len();
    let root = log.read(|v| v.root(size)).map_err(|e| ManifestError::Log(e.to_string()))?;
    let origin = checkpoint::origin_for(&key.public_bytes());
    let note = Checkpoint { origin: origin.clone(), size, root }.sign(key);
    Ok(Statement {
        type_: STATEMENT_TYPE.into(),
        subject,
        predicate_type: SLSA_PROVENANCE_V1.into(),
        predicate: Provenance {
            build_definition: BuildDefinition {
                build_type: BUILD_TYPE.into(),
                external_parameters: ExternalParameters { recipe, meta: Some(meta) },
                internal_parameters: InternalParameters { plan },
                resolved_dependencies: deps,
            },
            run_details: RunDetails {
                builder: Builder { id: format!("{BUILDER_ID_PREFIX}{}", hex::encode(key.public_bytes())), version },
                metadata: BuildMetadata {
                    invocation_id: facts.run_id.clone(),
                    started_on: humantime::format_rfc3339_seconds(facts.started).to_string(),
                    finished_on: humantime::format_rfc3339_seconds(facts.finished).to_string(),
                },
                byproducts,
                mindxtrain_hardware: if has(ReceiptItem::Hardware) { facts.hardware.clone() } else { Value::Null },
                mindxtrain_log: has(ReceiptItem::EventLog).then_some(LogPosition {
                    origin,
                    first_seq: facts.events.first,
                    last_seq: facts.events.last,
                    checkpoint: note,
                }),
                mindxtrain_energy: has(ReceiptItem::EnergyKwh).then(|| facts.energy.clone()),
                mindxtrain_receipt: Some(items.clone()),
            },
        },
    })
}

fn validate_run_id(id: &str) -> Result<(), ManifestError> {
    let ok = !id.is_empty()
        && id.len() <= 128
        && id.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    if ok { Ok(()) } else { Err(ManifestError::Invalid(format!("run id {id:?} must be 1-128 of [A-Za-z0-9._-]"))) }
}

fn hash(path: &Path, opts: HashOptions) -> Result<Digests, ManifestError> {
    digest::hash_file(path, opts)
        .map(|f| f.digests)
        .map_err(|source| ManifestError::Io { path: path.to_path_buf(), source })
}

/// Every regular file under `dir` whose name `keep` keeps, named by its `/`-separated
/// relative path, sorted.
pub fn hash_output_dir(
    dir: &Path,
    opts: HashOptions,
    keep: impl Fn(&str) -> bool,
) -> Result<Vec<Subject>, ManifestError> {
    let mut files = Vec::new();
    list_files(dir, dir, &mut files)?;
    files.retain(|name| keep(name));
    files.sort();
    if files.is_empty() {
        return Err(ManifestError::Invalid(format!("{} holds no files to seal", dir.display())));
    }
    files
        .into_iter()
        .map(|name| Ok::<_, ManifestError>(Subject { digest: hash(&dir.join(&name), opts)?.to_set(), name }))
        .collect()
}

fn list_files(root: &Path, dir: &Path, out: &mut Vec<String>) -> Result<(), ManifestError> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| ManifestError::Io { path, source }
    };
    for entry in std::fs::read_dir(dir).map_err(io(dir))? {
        let entry = entry.map_err(io(dir))?;
        let path = entry.path();
        let kind = entry.file_type().map_err(io(&path))?;
        if kind.is_dir() {
            list_files(root, &path, out)?;
        } else if kind.is_file() {
            out.push(subject_name(root, &path)?);
        } else {
            // A symlink could point anywhere, and its target could change after sealing.
            return Err(ManifestError::Invalid(format!("{} is not a regular file or directory", path.display())));
        }
    }
    Ok(())
}

fn subject_name(root: &Path, path: &Path) -> Result<String, ManifestError> {
    let rel = path
        .strip_prefix(root)
        .map_err(|_| ManifestError::Invalid(format!("{} escapes the output dir", path.display())))?;
    let parts: Option<Vec<&str>> = rel.components().map(|c| c.as_os_str().to_str()).collect();
    parts.map(|p| p.join("/")).ok_or_else(|| ManifestError::Invalid(format!("{} is not a UTF-8 name", path.display())))
}

/// The recipe as a parameter, and as parsed (its `receipt` and `meta` shape the statement).
fn recipe_parameter(recipe: &NamedBytes) -> Result<(Parameter, Recipe), ManifestError> {
    let text = std::str::from_utf8(&recipe.bytes)
        .map_err(|_| ManifestError::Invalid(format!("recipe {} is not UTF-8", recipe.name)))?;
    let loaded =
        Recipe::from_str(text, &recipe.name).map_err(|e| ManifestError::Invalid(format!("recipe: {e}")))?.recipe;
    let content = serde_json::to_value(&loaded).map_err(|e| ManifestError::Invalid(format!("recipe: {e}")))?;
    let param = Parameter { name: recipe.name.clone(), digest: Digests::of_bytes(&recipe.bytes).to_set(), content };
    Ok((param, loaded))
}

/// The plan as JSON if it is JSON, else as text (or base64 if not UTF-8): its digest
/// covers the exact bytes either way.
fn plan_parameter(plan: &NamedBytes) -> Parameter {
    let content = serde_json::from_slice::<Value>(&plan.bytes)
        .ok()
        .filter(|v| canonical::to_vec(v).is_ok())
        .or_else(|| std::str::from_utf8(&plan.bytes).ok().map(|s| Value::String(s.to_string())))
        .unwrap_or_else(|| {
            use base64::Engine;
            json!({"base64": base64::engine::general_purpose::STANDARD.encode(&plan.bytes)})
        });
    Parameter { name: plan.name.clone(), digest: Digests::of_bytes(&plan.bytes).to_set(), content }
}

/// eval.json's digests, plus its top-level scalar members as a summary.
fn eval_descriptor(path: &Path) -> Result<ResourceDescriptor, ManifestError> {
    let bytes = std::fs::read(path).map_err(|source| ManifestError::Io { path: path.to_path_buf(), source })?;
    let d = Digests::of_bytes(&bytes);
    let parsed: Value = serde_json::from_slice(&bytes)
        .map_err(|e| ManifestError::Invalid(format!("{} is not JSON: {e}", path.display())))?;
    let summary: serde_json::Map<String, Value> = parsed
        .as_object()
        .map(|m| {
            m.iter()
                .filter(|(_, v)| matches!(v, Value::Number(_) | Value::String(_) | Value::Bool(_)))
                .filter(|(_, v)| canonical::to_vec(v).is_ok())
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect()
        })
        .unwrap_or_default();
    Ok(ResourceDescriptor {
        name: Some(EVAL_NAME.into()),
        digest: Some(d.to_set()),
        media_type: Some("application/json".into()),
        annotations: Some(json!({"summary": summary})),
        ..Default::default()
    })
}

/// Writes `bytes` at a path named by their own digest: if it exists, it holds these bytes.
fn write_content_addressed(path: &Path, bytes: &[u8]) -> Result<(), ManifestError> {
    let io = |source| ManifestError::Io { path: path.to_path_buf(), source };
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|source| ManifestError::Io { path: dir.to_path_buf(), source })?;
    }
    match std::fs::read(path) {
        Ok(existing) if existing == bytes => Ok(()),
        Ok(_) => Err(ManifestError::Invalid(format!("{} exists with other bytes", path.display()))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            crate::fsutil::write_new_durably(path, bytes, 0o644).map_err(io)
        }
        Err(e) => Err(io(e)),
    }
}
