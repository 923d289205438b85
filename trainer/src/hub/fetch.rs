//! Downloading a snapshot into the cache (`mindxtrain fetch`): the only place that talks to the
//! hub. Runs never call it; they find what it left with [`HubCache::resolve`].

use hf_hub::progress::Progress;
use hf_hub::{HFRepository, RepoType, RepoTypeDataset, RepoTypeModel};

use super::{HubCache, HubError, RepoKind, Snapshot, checked_revision};

impl HubCache {
    /// Downloads every file of `repo` at `revision` (default `main`) into this cache (with
    /// `HF_TOKEN`, or the token `hf auth login` saved, as huggingface_hub reads it), reporting
    /// to `progress`, and returns the snapshot as a run will find it.
    pub async fn fetch(
        &self,
        repo: &str,
        kind: RepoKind,
        revision: Option<&str>,
        progress: Option<Progress>,
    ) -> Result<Snapshot, HubError> {
        let revision = checked_revision(revision)?;
        let downloaded = match kind {
            RepoKind::Model => download(self.handle(RepoTypeModel, repo)?, revision, progress).await,
            RepoKind::Dataset => download(self.handle(RepoTypeDataset, repo)?, revision, progress).await,
        };
        downloaded.map_err(|e| HubError::Hub { kind, repo: repo.to_owned(), message: e.to_string() })?;
        self.resolve(repo, kind, Some(revision))
    }
}

async fn download<T: RepoType>(
    repo: HFRepository<T>,
    revision: &str,
    progress: Option<Progress>,
) -> Result<(), hf_hub::HFError> {
    repo.snapshot_download().revision(revision).maybe_progress(progress).send().await.map(drop)
}
