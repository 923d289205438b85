//! Anchoring the node's provenance on chain, with every step in the event log.
//!
//! * [`deployment`]: `chain.json`, the registry this node anchors to;
//! * [`session`]: reaching the chain (RPC URL, preset, or an embedded anvil) and the key;
//! * [`state`]: what is pending and what is anchored, replayed from the log;
//! * [`run`]: deploy, request, checkpoint and anchor, appending `chain.deployed`,
//!   `anchor.requested`, `anchor.submitted`, `anchor.confirmed` and `anchor.failed`.

pub mod deployment;
pub mod run;
pub mod session;
pub mod state;

use crate::log::AppendError;
use mindxtrain_chain::ChainError;
use mindxtrain_chain::anvil::AnvilError;
use mindxtrain_chain::key::KeyError;
use std::path::PathBuf;
use thiserror::Error;

pub const KIND_DEPLOYED: &str = "chain.deployed";
pub const KIND_REQUESTED: &str = "anchor.requested";
pub const KIND_SUBMITTED: &str = "anchor.submitted";
pub const KIND_CONFIRMED: &str = "anchor.confirmed";
pub const KIND_FAILED: &str = "anchor.failed";

pub use deployment::Deployment;
pub use run::{BatchOutcome, anchor_pending, checkpoint_log, request, state_of_log, state_of_reader};
pub use session::{Access, ChainOptions, ChainSession};
pub use state::{AnchorState, Item};

#[derive(Debug, Error)]
pub enum AnchorError {
    #[error(transparent)]
    Chain(#[from] ChainError),
    #[error(transparent)]
    Deployment(#[from] deployment::DeploymentError),
    #[error(transparent)]
    Anvil(#[from] AnvilError),
    #[error(transparent)]
    Key(#[from] KeyError),
    #[error("event log: {0}")]
    Log(String),
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{0}")]
    Other(String),
}

impl From<AppendError> for AnchorError {
    fn from(e: AppendError) -> Self {
        AnchorError::Log(e.to_string())
    }
}
