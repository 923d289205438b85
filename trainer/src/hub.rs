//! Models and datasets named by their Hugging Face hub id (`Qwen/Qwen3-8B`,
//! `HuggingFaceH4/ultrachat_200k`), found in the local hub cache that `huggingface_hub`, the
//! `hf` command and `mindxtrain fetch` fill.
//!
//! The cache is the one huggingface_hub uses: `HF_HUB_CACHE`, else `HF_HOME/hub`, else
//! `~/.cache/huggingface/hub`. A repository lies in `<cache>/<models|datasets>--<owner>--<name>/`:
//! `refs/<branch or tag>` holds the commit id it pointed to when fetched, `snapshots/<commit>/`
//! the files of that commit (links into `blobs/`). A run resolves strictly from there, with
//! `hf-hub`'s offline lookup: the node never downloads at run time, so what a run reads is what
//! was fetched, and the commit it resolved to is recorded with the run. Fetching is
//! [`HubCache::fetch`], behind `mindxtrain fetch`.

mod fetch;

use std::path::{Path, PathBuf};

use hf_hub::{HFClient, HFError, HFRepository, RepoType, RepoTypeDataset, RepoTypeModel};
use serde::{Deserialize, Serialize};

/// The revision a recipe that names none reads (the hub's default branch).
pub const DEFAULT_REVISION: &str = "main";

/// The two kinds of hub repository a run reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RepoKind {
    Model,
    Dataset,
}

impl RepoKind {
    /// `model` or `dataset`, for messages.
    pub fn word(self) -> &'static str {
        match self {
            RepoKind::Model => "model",
            RepoKind::Dataset => "dataset",
        }
    }

    /// The cache's folder prefix (`models--Qwen--Qwen3-8B`).
    fn plural(self) -> &'static str {
        match self {
            RepoKind::Model => "models",
            RepoKind::Dataset => "datasets",
        }
    }
}

/// What a run records about a snapshot it read: enough to fetch the same bytes again.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HubSource {
    /// `owner/name`.
    pub repo: String,
    /// The revision asked for: a branch, a tag or a commit id.
    pub revision: String,
    /// The commit id it resolved to in the cache.
    pub commit: String,
}

impl HubSource {
    /// `hf://owner/name@commit` (`hf://datasets/owner/name@commit` for a dataset), the form
    /// manifests name their inputs by.
    pub fn uri(&self, kind: RepoKind) -> String {
        match kind {
            RepoKind::Model => format!("hf://{}@{}", self.repo, self.commit),
            RepoKind::Dataset => format!("hf://datasets/{}@{}", self.repo, self.commit),
        }
    }
}

/// A snapshot found in the cache.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    pub source: HubSource,
    /// `<cache>/<kind>s--<owner>--<name>/snapshots/<commit>`.
    pub dir: PathBuf,
}

#[derive(Debug, thiserror::Error)]
pub enum HubError {
    #[error("{0:?} is not a hub repository id: expected `owner/name` (letters, digits, `.`, `_`, `-`)")]
    BadRepoId(String),
    #[error("{0:?} is not a revision: expected a branch, a tag or a commit id")]
    BadRevision(String),
    /// The snapshot is not in the cache: what was looked for, where, and how to fetch it.
    #[error(
        "{} {repo} at revision {revision} is not in the Hugging Face cache {} (no {}): fetch it with `{}`, \
         or point HF_HUB_CACHE at a cache that holds it (nothing is downloaded at run time)",
        kind.word(), cache.display(), looked.display(), fetch_command(repo, *kind, revision)
    )]
    Missing { kind: RepoKind, repo: String, revision: String, cache: PathBuf, looked: PathBuf },
    /// The cache directory could not be set up (an invalid `HF_ENDPOINT`, say).
    #[error("the Hugging Face cache: {0}")]
    Cache(String),
    /// The cache or the hub answered with something else than the snapshot.
    #[error("{} {repo}: {message}", kind.word())]
    Hub { kind: RepoKind, repo: String, message: String },
}

/// Whether `id` is a hub repository id, `owner/name`: what makes a recipe's `model.name` a
/// model to find in the cache. Each part is the hub's alphabet, not `.`/`..` and not starting
/// with `.` or `-`, so an id can never lead a cache path outside its folder.
pub fn is_repo_id(id: &str) -> bool {
    let part = |p: &str| {
        !p.is_empty()
            && !p.starts_with(['.', '-'])
            && !p.contains("..")
            && p.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
    };
    id.split_once('/').is_some_and(|(owner, name)| part(owner) && part(name))
}

/// The command that puts `repo` at `revision` into the cache.
pub fn fetch_command(repo: &str, kind: RepoKind, revision: &str) -> String {
    let mut cmd = format!("mindxtrain fetch {repo}");
    if kind == RepoKind::Dataset {
        cmd.push_str(" --dataset");
    }
    if revision != DEFAULT_REVISION {
        cmd.push_str(&format!(" --revision {revision}"));
    }
    cmd
}

/// The hub cache of this process's environment, as huggingface_hub finds it (see the module
/// doc), or one named directly.
#[derive(Debug, Clone)]
pub struct HubCache {
    client: HFClient,
}

impl HubCache {
    /// `HF_HUB_CACHE`, else `HF_HOME/hub`, else `~/.cache/huggingface/hub`.
    pub fn from_env() -> Result<HubCache, HubError> {
        HubCache::build(HFClient::builder())
    }

    /// The cache at `dir`.
    pub fn at(dir: &Path) -> Result<HubCache, HubError> {
        HubCache::build(HFClient::builder().cache_dir(dir))
    }

    fn build(builder: hf_hub::HFClientBuilder) -> Result<HubCache, HubError> {
        // Builds an HTTP client too; nothing connects until a request is sent.
        let client = builder.build().map_err(|e| HubError::Cache(e.to_string()))?;
        Ok(HubCache { client })
    }

    pub fn dir(&self) -> &Path {
        self.client.cache_dir()
    }

    /// The snapshot of `repo` at `revision` (default [`DEFAULT_REVISION`]) in this cache,
    /// without any network access: a branch or tag through `refs/<revision>`, a commit id
    /// directly.
    pub fn resolve(&self, repo: &str, kind: RepoKind, revision: Option<&str>) -> Result<Snapshot, HubError> {
        let revision = checked_revision(revision)?;
        let found = match kind {
            RepoKind::Model => local_snapshot(self.handle(RepoTypeModel, repo)?, revision),
            RepoKind::Dataset => local_snapshot(self.handle(RepoTypeDataset, repo)?, revision),
        };
        let missing = |looked: PathBuf| HubError::Missing {
            kind,
            repo: repo.to_owned(),
            revision: revision.to_owned(),
            cache: self.dir().to_path_buf(),
            looked,
        };
        let folder = self.dir().join(format!("{}--{}", kind.plural(), repo.replace('/', "--")));
        let dir = match found {
            Ok(dir) => dir,
            Err(HFError::LocalEntryNotFound { .. }) => {
                let sha = if is_commit_id(revision) {
                    Some(revision.to_owned())
                } else {
                    std::fs::read_to_string(folder.join("refs").join(revision)).ok().map(|s| s.trim().to_owned())
                };
                return Err(missing(match sha {
                    Some(sha) => folder.join("snapshots").join(sha),
                    None => folder.join("refs").join(revision),
                }));
            }
            Err(e) => return Err(HubError::Hub { kind, repo: repo.to_owned(), message: e.to_string() }),
        };
        // A snapshot directory is named by its commit id; a ref naming anything else is damage.
        let commit = dir.file_name().and_then(|n| n.to_str()).filter(|n| is_commit_id(n)).map(str::to_owned);
        let Some(commit) = commit else {
            let message = format!("{} is not a snapshot named by a commit id", dir.display());
            return Err(HubError::Hub { kind, repo: repo.to_owned(), message });
        };
        if !dir.is_dir() {
            return Err(missing(dir));
        }
        Ok(Snapshot { source: HubSource { repo: repo.to_owned(), revision: revision.to_owned(), commit }, dir })
    }

    /// A handle on `repo` (no connection is made until a request is sent).
    fn handle<T: RepoType>(&self, kind: T, repo: &str) -> Result<HFRepository<T>, HubError> {
        if !is_repo_id(repo) {
            return Err(HubError::BadRepoId(repo.to_owned()));
        }
        let (owner, name) = hf_hub::split_id(repo);
        Ok(self.client.repository(kind, owner, name))
    }
}

/// [`HubCache::resolve`] in the environment's cache: how a run finds its model and data.
pub fn resolve(repo: &str, kind: RepoKind, revision: Option<&str>) -> Result<Snapshot, HubError> {
    HubCache::from_env()?.resolve(repo, kind, revision)
}

/// `revision`, or the default; one whose parts could climb out of `refs/` is refused.
fn checked_revision(revision: Option<&str>) -> Result<&str, HubError> {
    let revision = revision.unwrap_or(DEFAULT_REVISION);
    if revision.starts_with('/') || revision.split('/').any(|p| p.is_empty() || p == "." || p == "..") {
        return Err(HubError::BadRevision(revision.to_owned()));
    }
    Ok(revision)
}

/// hf-hub's `local_files_only` lookup. It reads the cache and never waits on the network, so
/// the smallest executor drives it to the end on this thread.
fn local_snapshot<T: RepoType>(repo: HFRepository<T>, revision: &str) -> Result<PathBuf, HFError> {
    futures::executor::block_on(repo.snapshot_download().revision(revision).local_files_only(true).send())
}

/// A full commit id (40 hex digits), as the hub and its cache name commits.
fn is_commit_id(s: &str) -> bool {
    s.len() == 40 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

#[cfg(test)]
mod tests;
