//! Receipt bundles: everything a third party needs to check a run, in one JSON file, and
//! nothing that needs the node (its log, keys or database) to verify.
//!
//! ```text
//! manifest (DSSE envelope) ──BLAKE3──► digest ──► manifest.sealed event (signed, in the log)
//!                                         │                 │ inclusion proof
//!                                         │                 ▼
//!                                         │        signed log checkpoint (root, size)
//!                                         └── batch proof ──► anchored root ──► Registry on chain
//! ```
//! The format is specified in docs/formats.md ("Receipt bundle"); [`verify`](mod@verify)
//! checks it.

pub mod replay;
pub mod verify;

pub use verify::{Check, Outcome, Report, Status, VerifyInputs};

use crate::canonical;
use crate::identity::Identity;
use crate::log::checkpoint::{self, Checkpoint};
use crate::log::{Event, LogReader};
use crate::manifest::{self, Digests, Envelope, KIND_SEALED};
use mindxtrain_chain::batch::BatchProof;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use thiserror::Error;

/// Version of the bundle format written by this build.
pub const RECEIPT_VERSION: u32 = 1;
/// Largest bundle a verifier reads (a manifest is kilobytes; proofs are small).
pub const MAX_RECEIPT_BYTES: usize = 32 << 20;

/// The receipt bundle (JSON; unknown members refused).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Receipt {
    pub v: u32,
    /// The manifest's DSSE envelope. Its digest is over its RFC 8785 canonical bytes.
    pub manifest: Envelope,
    /// The `manifest.sealed` event that records the manifest's digest.
    pub event: SignedEvent,
    /// A C2SP signed note over the log, whose tree contains `event`.
    pub checkpoint: String,
    /// Inclusion proof of `event` (leaf `event.seq`) in the checkpoint's tree.
    pub inclusion: Vec<String>,
    /// Where the manifest's digest was anchored; `null` while it is not yet anchored.
    pub anchor: Option<BatchProof>,
}

/// One log event as stored: its canonical envelope text and signature.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SignedEvent {
    pub seq: u64,
    /// The event's canonical (RFC 8785) envelope JSON, verbatim: its BLAKE3 is the event hash.
    pub envelope: String,
    /// Hex of the Ed25519 signature over `"mindxtrain/event/v1\n" ‖ event hash`.
    pub sig: String,
}

#[derive(Debug, Error)]
pub enum ExportError {
    #[error(transparent)]
    Read(#[from] crate::log::ReadError),
    #[error("run {0:?} has no manifest.sealed event in this node's log")]
    NotSealed(String),
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{0}")]
    Corrupt(String),
    #[error(transparent)]
    Identity(#[from] crate::identity::IdentityError),
    #[error(transparent)]
    Anchor(#[from] crate::anchor::AnchorError),
}

impl Receipt {
    pub fn from_json(bytes: &[u8]) -> Result<Self, String> {
        if bytes.len() > MAX_RECEIPT_BYTES {
            return Err(format!("{} bytes is more than {MAX_RECEIPT_BYTES}", bytes.len()));
        }
        serde_json::from_slice(bytes).map_err(|e| e.to_string())
    }

    pub fn to_json_pretty(&self) -> Vec<u8> {
        let mut v = serde_json::to_vec_pretty(self).expect("a receipt serialises");
        v.push(b'\n');
        v
    }

    /// Digests of the manifest's canonical bytes (BLAKE3 = the anchored item).
    pub fn manifest_digests(&self) -> Digests {
        Digests::of_bytes(&self.manifest.to_canonical())
    }

    /// The run its manifest is of (unchecked: the signature is [`verify`](mod@verify)'s job).
    pub fn run_id(&self) -> Option<String> {
        let payload = self.manifest.payload_bytes().ok()?;
        manifest::parse_statement(&payload).ok().map(|s| s.run_id().to_string())
    }
}

/// Why a run's receipt was not written.
#[derive(Debug, Error)]
pub enum WriteError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error(
        "receipt.output {path} holds {what}: a run never writes its receipt over another's (move it, or give the \
         recipe another receipt.output)"
    )]
    Occupied { path: PathBuf, what: String },
}

/// What lies at `path` that a receipt of run `run_id` may not replace: `None` when nothing
/// does, or when it is that run's own receipt (`run_id` `None`: a run whose id is not known
/// yet, which owns no receipt).
pub fn occupant(path: &Path, run_id: Option<&str>) -> Result<Option<String>, WriteError> {
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => return Err(WriteError::Io { path: path.to_path_buf(), source }),
    };
    Ok(match Receipt::from_json(&bytes).ok().and_then(|r| r.run_id()) {
        Some(id) if Some(id.as_str()) == run_id => None,
        Some(id) => Some(format!("the receipt of run {id}")),
        None => Some("a file that is not a receipt".into()),
    })
}

/// Writes `receipt` at `path` (its directories created) unless another run's receipt or
/// another file is there ([`occupant`]).
pub fn write_for_run(path: &Path, receipt: &Receipt) -> Result<(), WriteError> {
    if let Some(what) = occupant(path, receipt.run_id().as_deref())? {
        return Err(WriteError::Occupied { path: path.to_path_buf(), what });
    }
    let dir = crate::fsutil::parent_dir(path);
    std::fs::create_dir_all(dir).map_err(|source| WriteError::Io { path: dir.to_path_buf(), source })?;
    write(path, receipt).map_err(|source| WriteError::Io { path: path.to_path_buf(), source })
}

/// Writes `receipt` at `path` through a temporary file and a rename, so a reader never sees
/// half a receipt.
pub fn write(path: &Path, receipt: &Receipt) -> std::io::Result<()> {
    let dir = crate::fsutil::parent_dir(path);
    let tmp = tempfile::NamedTempFile::new_in(dir)?;
    std::fs::write(tmp.path(), receipt.to_json_pretty())?;
    tmp.as_file().sync_all()?;
    tmp.persist(path).map_err(|e| e.error)?;
    crate::fsutil::sync_dir(dir)
}

/// Builds the receipt of `run_id` from a node directory: the sealed manifest, its event
/// with an inclusion proof in a checkpoint of the whole log signed now with the node key,
/// and the manifest's batch proof if it has been anchored.
pub fn export(node_dir: &Path, run_id: &str) -> Result<Receipt, ExportError> {
    let reader = LogReader::open(node_dir)?;
    let view = reader.view();
    let size = view.len();
    let event = find_sealed(&reader, run_id)?;
    let digest =
        event.envelope.data.get("blake3").and_then(|v| v.as_str()).and_then(manifest::digest::parse_hex32).ok_or_else(
            || ExportError::Corrupt(format!("manifest.sealed at seq {} has no blake3", event.envelope.seq)),
        )?;
    let path = manifest::manifest_path(node_dir, &digest);
    let bytes = std::fs::read(&path).map_err(|source| ExportError::Io { path: path.clone(), source })?;
    if *blake3::hash(&bytes).as_bytes() != digest {
        return Err(ExportError::Corrupt(format!("{} does not hash to its name", path.display())));
    }
    let envelope = Envelope::from_json(&bytes).map_err(|e| ExportError::Corrupt(format!("{}: {e}", path.display())))?;
    let key = Identity::load_from(node_dir)?;
    let root = view.root(size)?;
    let note = Checkpoint { origin: checkpoint::origin_for(&key.public_bytes()), size, root }.sign(&key);
    let inclusion = view.inclusion_proof(event.envelope.seq, size)?.iter().map(hex::encode).collect();
    let anchor = crate::anchor::state_of_reader(&reader)?.proof_of(&digest).map(|(p, _)| p);
    Ok(Receipt {
        v: RECEIPT_VERSION,
        manifest: envelope,
        event: signed_event(&event)?,
        checkpoint: note,
        inclusion,
        anchor,
    })
}

fn find_sealed(reader: &LogReader, run_id: &str) -> Result<Event, ExportError> {
    let view = reader.view();
    for seq in (0..view.len()).rev() {
        let ev = view.event(seq)?;
        if ev.envelope.kind == KIND_SEALED && ev.envelope.subject == run_id {
            return Ok(ev);
        }
    }
    Err(ExportError::NotSealed(run_id.to_string()))
}

fn signed_event(ev: &Event) -> Result<SignedEvent, ExportError> {
    let value = serde_json::to_value(&ev.envelope).map_err(|e| ExportError::Corrupt(e.to_string()))?;
    let bytes = canonical::to_vec(&value).map_err(|e| ExportError::Corrupt(e.to_string()))?;
    if *blake3::hash(&bytes).as_bytes() != ev.hash {
        return Err(ExportError::Corrupt(format!("event {} does not re-encode to its hash", ev.envelope.seq)));
    }
    let envelope = String::from_utf8(bytes).map_err(|e| ExportError::Corrupt(e.to_string()))?;
    Ok(SignedEvent { seq: ev.envelope.seq, envelope, sig: hex::encode(ev.signature) })
}

#[cfg(test)]
mod tests;
