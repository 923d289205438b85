//! Run manifests: an in-toto Statement v1 (SLSA Provenance v1 predicate) in a DSSE
//! envelope signed with the node's key. docs/formats.md ("Manifest") is the contract.
//!
//! * [`digest`]: SHA-256 and BLAKE3 of big files in one pass (mmap, rayon);
//! * [`dsse`]: the envelope, PAE, signing and verification;
//! * [`statement`]: the statement and provenance types;
//! * [`seal`](mod@seal): [`RunFacts`] → signed manifest on disk + `manifest.sealed` event +
//!   an anchoring request for the manifest's BLAKE3.
//!
//! The digest that is anchored ("the manifest digest") is the BLAKE3 of the manifest
//! file's bytes, which are the RFC 8785 canonical JSON of the envelope.

pub mod digest;
pub mod dsse;
pub mod seal;
pub mod statement;

pub use digest::{Digests, HashOptions};
pub use dsse::Envelope;
pub use seal::{EventRange, NamedBytes, NamedFile, RunFacts, Sealed, SourceRef, seal};
pub use statement::Statement;

use crate::log::AppendError;
use crate::log::witness::{Claim, Witness};
use ed25519_dalek::VerifyingKey;
use std::path::{Path, PathBuf};
use thiserror::Error;

/// Kind of the event recording a sealed manifest (subject: the run id).
pub const KIND_SEALED: &str = "manifest.sealed";
/// Sub-directory of the node dir holding manifests, named `<blake3 hex>.json`.
pub const MANIFEST_DIR: &str = "manifests";

#[derive(Debug, Error)]
pub enum ManifestError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("cannot seal: {0}")]
    Invalid(String),
    #[error("event log: {0}")]
    Log(String),
    #[error(transparent)]
    Envelope(#[from] dsse::DsseError),
    #[error("the payload is not an in-toto statement of mindxtrain provenance: {0}")]
    Statement(String),
}

impl From<AppendError> for ManifestError {
    fn from(e: AppendError) -> Self {
        ManifestError::Log(e.to_string())
    }
}

/// Where the manifest with BLAKE3 `digest` lives in a node directory.
pub fn manifest_path(node_dir: &Path, digest: &[u8; 32]) -> PathBuf {
    node_dir.join(MANIFEST_DIR).join(format!("{}.json", hex::encode(digest)))
}

/// The statement inside verified payload bytes, checked to be ours: in-toto v1, SLSA
/// provenance v1, mindxtrain's build type.
pub fn parse_statement(payload: &[u8]) -> Result<Statement, ManifestError> {
    let s: Statement = serde_json::from_slice(payload).map_err(|e| ManifestError::Statement(e.to_string()))?;
    if s.type_ != statement::STATEMENT_TYPE {
        return Err(ManifestError::Statement(format!("_type is {:?}", s.type_)));
    }
    if s.predicate_type != statement::SLSA_PROVENANCE_V1 {
        return Err(ManifestError::Statement(format!("predicateType is {:?}", s.predicate_type)));
    }
    if s.predicate.build_definition.build_type != statement::BUILD_TYPE {
        return Err(ManifestError::Statement(format!("buildType is {:?}", s.predicate.build_definition.build_type)));
    }
    Ok(s)
}

#[cfg(test)]
pub(crate) mod tests;

/// What this node's sealed manifests say of its log, as witnesses (see
/// [`crate::log::witness`]): each names its run's events and carries a checkpoint signed
/// when it was sealed. Files that are not manifests signed by `key` are passed over: they
/// vouch for no log of this node.
pub fn witnesses(node_dir: &Path, key: &VerifyingKey) -> Result<Vec<Witness>, (PathBuf, std::io::Error)> {
    let dir = node_dir.join(MANIFEST_DIR);
    let entries = match std::fs::read_dir(&dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err((dir, e)),
    };
    let mut found = Vec::new();
    for entry in entries {
        let path = entry.map_err(|e| (dir.clone(), e))?.path();
        if path.extension().is_none_or(|x| x != "json") {
            continue;
        }
        let bytes = std::fs::read(&path).map_err(|e| (path.clone(), e))?;
        let Some((run, position)) = Envelope::from_json(&bytes)
            .ok()
            .and_then(|env| env.verify(key).ok())
            .and_then(|payload| parse_statement(&payload).ok())
            .and_then(|s| Some((s.run_id().to_owned(), s.predicate.run_details.mindxtrain_log?)))
        else {
            // Not ours, or sealed without its log position (`receipt.include` without event_log).
            continue;
        };
        let Ok(cp) = crate::log::checkpoint::Checkpoint::verify(&position.checkpoint, key) else { continue };
        found.push(Witness {
            source: format!("run {run}'s manifest"),
            path,
            claim: Claim::Tree { size: cp.size, root: cp.root },
            events: Some((position.first_seq, position.last_seq)),
        });
    }
    found.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(found)
}
