//! `mindxtrain manifest seal|show|hash`: sealing a run from the command line (what the
//! training loop does through `manifest::seal`), reading a manifest, hashing files.

use super::output::Output;
use super::{EXIT_INVALID_INPUT, file_name};
use anyhow::{Context, Result, bail};
use clap::Subcommand;
use mindxtrain_node::energy::Energy;
use mindxtrain_node::log::index::Query;
use mindxtrain_node::manifest::digest::{self, HashOptions};
use mindxtrain_node::manifest::statement::ResourceDescriptor;
use mindxtrain_node::manifest::{self, Digests, Envelope, EventRange, NamedBytes, NamedFile, RunFacts, SourceRef};
use mindxtrain_node::node;
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::SystemTime;

// Parsed once per process: boxing the large variant would buy nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand, Debug)]
pub enum ManifestCommand {
    /// Seal a finished run: hash every file under --output-dir, sign the in-toto/SLSA
    /// manifest, record `manifest.sealed` and request anchoring of its digest.
    #[command(
        after_help = "Example:\n  mindxtrain manifest seal run-1 --recipe run.yaml --plan plan.json --output-dir ./out \\\n    --eval ./out/eval.json --base-model ./base/model.safetensors --hardware '{\"accelerator\":\"cpu\"}'"
    )]
    Seal {
        run: String,
        #[arg(long)]
        recipe: PathBuf,
        #[arg(long)]
        plan: Option<PathBuf>,
        #[arg(long)]
        output_dir: PathBuf,
        /// A base model file (repeatable); named by its file name.
        #[arg(long = "base-model")]
        base_model: Vec<PathBuf>,
        /// Where the base model came from, e.g. hf://Qwen/Qwen3-8B@<revision>.
        #[arg(long)]
        base_model_uri: Option<String>,
        /// BLAKE3 (64 hex) of the dataset manifest.
        #[arg(long)]
        dataset_digest: Option<String>,
        #[arg(long)]
        eval: Option<PathBuf>,
        /// JSON describing the hardware.
        #[arg(long, default_value = "null")]
        hardware: String,
        #[arg(long, requires = "source_commit")]
        source_repo: Option<String>,
        #[arg(long, requires = "source_repo")]
        source_commit: Option<String>,
        /// RFC 3339 start and finish times (default: now).
        #[arg(long)]
        started: Option<String>,
        #[arg(long)]
        finished: Option<String>,
        /// The run's event range (default: the first and last events whose subject is RUN).
        #[arg(long, requires = "last_seq")]
        first_seq: Option<u64>,
        #[arg(long, requires = "first_seq")]
        last_seq: Option<u64>,
    },
    /// Print a manifest's statement (decoded payload) and its digests; the signature is not checked here.
    #[command(after_help = "Example:\n  mindxtrain manifest show manifests/<blake3>.json --json")]
    Show { file: PathBuf },
    /// SHA-256 and BLAKE3 of files in one pass (what sealing computes).
    #[command(after_help = "Example:\n  mindxtrain manifest hash model.safetensors")]
    Hash { files: Vec<PathBuf> },
}

pub fn run(cmd: ManifestCommand, dir: &Path, out: &Output) -> Result<ExitCode> {
    match cmd {
        ManifestCommand::Show { file } => show(&file, out),
        ManifestCommand::Hash { files } => hash(&files, out),
        ManifestCommand::Seal {
            run,
            recipe,
            plan,
            output_dir,
            base_model,
            base_model_uri,
            dataset_digest,
            eval,
            hardware,
            source_repo,
            source_commit,
            started,
            finished,
            first_seq,
            last_seq,
        } => {
            let hardware: Value = serde_json::from_str(&hardware).context("--hardware is not JSON")?;
            let dataset = match dataset_digest {
                Some(d) => {
                    let Some(h) = digest::parse_hex32(&d) else {
                        eprintln!("error: --dataset-digest {d:?} is not 64 hex digits");
                        return Ok(ExitCode::from(EXIT_INVALID_INPUT));
                    };
                    let set = manifest::digest::DigestSet { blake3: Some(hex::encode(h)), ..Default::default() };
                    Some(ResourceDescriptor { name: Some("dataset".into()), digest: Some(set), ..Default::default() })
                }
                None => None,
            };
            let (log, key, _) = node::open(dir)?;
            let events = match (first_seq, last_seq) {
                (Some(first), Some(last)) => EventRange { first, last },
                _ => {
                    let seqs = log.query(&Query::Subject(run.clone()))?;
                    match (seqs.first(), seqs.last()) {
                        (Some(&first), Some(&last)) => EventRange { first, last },
                        _ => bail!("no events with subject {run:?} in the log: pass --first-seq and --last-seq"),
                    }
                }
            };
            let facts = RunFacts {
                recipe: named_bytes(&recipe)?,
                plan: plan.as_deref().map(named_bytes).transpose()?,
                output_dir,
                base_model: base_model.iter().map(|p| NamedFile { name: file_name(p), path: p.clone() }).collect(),
                base_model_uri,
                base_model_annotations: None,
                dataset,
                source: source_repo.zip(source_commit).map(|(repository, commit)| SourceRef { repository, commit }),
                eval_json: eval,
                hardware,
                energy: Energy::unmeasured("sealed by `mindxtrain manifest seal`, which did not run the training"),
                started: time_arg(started.as_deref())?,
                finished: time_arg(finished.as_deref())?,
                events,
                run_id: run.clone(),
            };
            let sealed = manifest::seal(&log, &key, dir, &facts, HashOptions::default())?;
            let b3 = hex::encode(sealed.digests.blake3);
            out.emit(
                &json!({"run_id": run, "file": sealed.path, "blake3": b3, "sha256": hex::encode(sealed.digests.sha256), "seq": sealed.seq, "subjects": sealed.statement.subject.len()}),
                || format!("sealed run {run}: {} subject(s)\n  manifest {}\n  blake3 {b3} (requested for anchoring)\n  manifest.sealed at seq {}", sealed.statement.subject.len(), sealed.path.display(), sealed.seq),
            );
            Ok(ExitCode::SUCCESS)
        }
    }
}

fn named_bytes(p: &Path) -> Result<NamedBytes> {
    Ok(NamedBytes { name: file_name(p), bytes: std::fs::read(p).with_context(|| format!("reading {}", p.display()))? })
}

fn time_arg(t: Option<&str>) -> Result<SystemTime> {
    match t {
        Some(t) => humantime::parse_rfc3339(t).with_context(|| format!("{t:?} is not an RFC 3339 time")),
        None => Ok(SystemTime::now()),
    }
}

fn show(file: &Path, out: &Output) -> Result<ExitCode> {
    let bytes = std::fs::read(file).with_context(|| format!("reading {}", file.display()))?;
    let env = match Envelope::from_json(&bytes) {
        Ok(e) => e,
        Err(e) => {
            eprintln!("error: {}: {e}", file.display());
            return Ok(ExitCode::from(EXIT_INVALID_INPUT));
        }
    };
    let statement: Value =
        env.payload_bytes().ok().and_then(|p| serde_json::from_slice(&p).ok()).unwrap_or(Value::Null);
    let d = Digests::of_bytes(&env.to_canonical());
    let v = json!({"blake3": hex::encode(d.blake3), "sha256": hex::encode(d.sha256), "payloadType": env.payload_type,
        "keyids": env.signatures.iter().map(|s| s.keyid.clone()).collect::<Vec<_>>(), "statement": statement});
    out.emit(&v, || serde_json::to_string_pretty(&v).unwrap_or_default());
    Ok(ExitCode::SUCCESS)
}

fn hash(files: &[PathBuf], out: &Output) -> Result<ExitCode> {
    let mut rows = Vec::new();
    for f in files {
        let d = digest::hash_file(f, HashOptions::default()).with_context(|| format!("hashing {}", f.display()))?;
        rows.push(json!({"file": f, "size": d.size, "sha256": hex::encode(d.digests.sha256), "blake3": hex::encode(d.digests.blake3)}));
    }
    out.emit(&Value::Array(rows.clone()), || {
        rows.iter()
            .map(|r| {
                format!(
                    "sha256:{}  blake3:{}  {}",
                    r["sha256"].as_str().unwrap_or(""),
                    r["blake3"].as_str().unwrap_or(""),
                    r["file"].as_str().unwrap_or("")
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    });
    Ok(ExitCode::SUCCESS)
}
