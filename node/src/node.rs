//! A node directory: identity, log, index.
//!
//! ```text
//! <node dir>/
//!   node.key      ed25519 seed, hex, mode 0600
//!   node.pub      public key, hex
//!   api.token     the operator API's bearer token, mode 0600
//!   log/          segment files (the record of truth), LOCK, torn/ (preserved torn tails)
//!   index/        sled secondary index (rebuildable)
//!   log-checkpoint.note   the log's latest signed checkpoint (a witness: see log::witness)
//! ```
//!
//! Only [`init`] starts a log; [`open`] refuses one that is gone, empty or shorter than
//! what the node recorded of it.

use crate::identity::{Identity, IdentityError};
use crate::log::{EventLog, LogOptions, OpenError, OpenReport};
use std::path::{Path, PathBuf};
use thiserror::Error;

#[derive(Debug, Error)]
pub enum NodeError {
    #[error("{0} is already a node directory (it has a node.key)")]
    AlreadyInitialised(PathBuf),
    #[error("{0} is not a node directory; run `mindxtrain init --node-dir {0}` first")]
    NotInitialised(PathBuf),
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error(transparent)]
    Identity(#[from] IdentityError),
    #[error(transparent)]
    Log(#[from] OpenError),
    #[error(transparent)]
    Token(#[from] crate::api::auth::TokenError),
}

/// Creates a node directory with a fresh key and a log holding its genesis event.
pub fn init(dir: &Path) -> Result<(Identity, OpenReport), NodeError> {
    if dir.join(crate::identity::SECRET_FILE).exists() {
        return Err(NodeError::AlreadyInitialised(dir.to_path_buf()));
    }
    std::fs::create_dir_all(dir).map_err(|source| NodeError::Io { path: dir.to_path_buf(), source })?;
    let id = Identity::create_in(dir)?;
    crate::api::auth::ApiToken::load_or_create(dir)?;
    let (_log, report) = EventLog::create(dir, id.clone(), LogOptions::default())?;
    Ok((id, report))
}

/// Opens an initialised node's log for writing.
pub fn open(dir: &Path) -> Result<(EventLog, Identity, OpenReport), NodeError> {
    if !dir.join(crate::identity::SECRET_FILE).exists() {
        return Err(NodeError::NotInitialised(dir.to_path_buf()));
    }
    let id = Identity::load_from(dir)?;
    let (log, report) = EventLog::open(dir, id.clone(), LogOptions::default())?;
    Ok((log, id, report))
}
