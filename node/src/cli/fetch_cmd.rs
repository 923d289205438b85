//! `mindxtrain fetch`: a model or dataset of the Hugging Face hub into the local hub cache,
//! where runs find it (a run never downloads: `model.name` and `data.hf_id` resolve from the
//! cache only, and their error names this command).

use super::EXIT_INVALID_INPUT;
use super::output::Output;
use anyhow::{Context, Result};
use clap::Args;
use hf_hub::progress::{DownloadEvent, FileStatus, ProgressEvent, ProgressHandler};
use mindxtrain_trainer::hub::{self, HubCache, HubError, RepoKind};
use serde_json::json;
use std::collections::HashSet;
use std::process::ExitCode;
use std::sync::Mutex;

#[derive(Args, Debug)]
pub struct FetchArgs {
    /// The hub repository, `owner/name` (a model unless --dataset).
    pub repo: String,
    /// The repository is a dataset (`data.hf_id`), not a model (`model.name`).
    #[arg(long)]
    pub dataset: bool,
    /// A branch, tag or commit id (`model.revision`, `data.revision`; default main).
    #[arg(long)]
    pub revision: Option<String>,
}

pub fn run(args: FetchArgs, out: &Output) -> Result<ExitCode> {
    let kind = if args.dataset { RepoKind::Dataset } else { RepoKind::Model };
    let refuse = |message: String| {
        out.emit(&json!({"ok": false, "error": message}), String::new);
        if !out.json {
            eprintln!("error: {message}");
        }
        Ok(ExitCode::from(EXIT_INVALID_INPUT))
    };
    if !hub::is_repo_id(&args.repo) {
        return refuse(HubError::BadRepoId(args.repo).to_string());
    }
    let cache = HubCache::from_env()?;
    let revision = args.revision.as_deref().unwrap_or(hub::DEFAULT_REVISION);
    eprintln!("fetching {} {}@{revision} into {}", kind.word(), args.repo, cache.dir().display());
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the download runtime")?;
    let progress = StderrProgress { done: Mutex::new(HashSet::new()) };
    let fetched = runtime.block_on(cache.fetch(&args.repo, kind, args.revision.as_deref(), Some(progress.into())));
    let snapshot = match fetched {
        Ok(s) => s,
        Err(e @ (HubError::BadRepoId(_) | HubError::BadRevision(_))) => return refuse(e.to_string()),
        Err(e) => return Err(e).context(format!("fetching {}@{revision} from the Hugging Face hub", args.repo)),
    };
    let s = &snapshot.source;
    let value = json!({"ok": true, "kind": kind, "repo": s.repo, "revision": s.revision, "commit": s.commit,
        "dir": snapshot.dir, "cache": cache.dir()});
    out.emit(&value, || {
        format!(
            "{} {}@{} is commit {}\n  {}\nruns read it offline from this cache (HF_HUB_CACHE, else HF_HOME/hub)",
            kind.word(),
            s.repo,
            s.revision,
            s.commit,
            snapshot.dir.display()
        )
    });
    Ok(ExitCode::SUCCESS)
}

/// One line on stderr when the download starts and one per file done (hf-hub may report a
/// file complete twice: each is printed once).
struct StderrProgress {
    done: Mutex<HashSet<String>>,
}

impl ProgressHandler for StderrProgress {
    fn on_progress(&self, event: &ProgressEvent) {
        let ProgressEvent::Download(event) = event else { return };
        match event {
            DownloadEvent::Start { total_files, total_bytes } => {
                eprintln!("  {total_files} files, {total_bytes} bytes");
            }
            DownloadEvent::Progress { files } => {
                let Ok(mut done) = self.done.lock() else { return };
                for f in files.iter().filter(|f| f.status == FileStatus::Complete) {
                    if done.insert(f.filename.clone()) {
                        eprintln!("  {} ({} bytes)", f.filename, f.total_bytes);
                    }
                }
            }
            DownloadEvent::AggregateProgress { .. } | DownloadEvent::Complete => {}
        }
    }
}
