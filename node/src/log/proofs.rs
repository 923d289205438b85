//! Merkle proofs and signed checkpoints as JSON documents, self-checked before they are
//! handed out: what `mindxtrain log proof|consistency|checkpoint` print and the operator
//! API serves.

use mindxtrain_chain::merkle;
use serde_json::{Value, json};

use super::View;
use super::checkpoint::{self, Checkpoint};
use crate::identity::Identity;

/// Why a proof could not be made.
#[derive(Debug, thiserror::Error)]
pub enum ProofError {
    #[error("seq {seq} is not inside a tree of size {size} (the log holds {len} events)")]
    OutOfRange { seq: u64, size: u64, len: u64 },
    #[error("tree size {size} is larger than the log ({len} events)")]
    TooLarge { size: u64, len: u64 },
    #[error(
        "a consistency proof goes from a tree of at least 1 event to one at least as large; asked from {old} to {size}"
    )]
    BadSizes { old: u64, size: u64 },
    #[error("{0}")]
    Read(String),
}

/// The inclusion proof of event `seq` in the tree of the first `size` events.
pub fn inclusion(v: &View, seq: u64, size: u64) -> Result<Value, ProofError> {
    let len = v.len();
    if size > len {
        return Err(ProofError::TooLarge { size, len });
    }
    if seq >= size {
        return Err(ProofError::OutOfRange { seq, size, len });
    }
    let read = |e: &dyn std::fmt::Display| ProofError::Read(e.to_string());
    let root = v.root(size).map_err(|e| read(&e))?;
    let leaf = v.leaf(seq).ok_or(ProofError::OutOfRange { seq, size, len })?;
    let proof = v.inclusion_proof(seq, size).map_err(|e| read(&e))?;
    merkle::verify_inclusion(&leaf, seq, size, &proof, &root).map_err(|e| read(&format!("self-check failed: {e}")))?;
    let event_hash = v.hash(seq).ok_or(ProofError::OutOfRange { seq, size, len })?;
    Ok(json!({"seq": seq, "tree_size": size, "event_hash": hex::encode(event_hash), "leaf_hash": hex::encode(leaf),
        "root": hex::encode(root), "proof": proof.iter().map(hex::encode).collect::<Vec<_>>()}))
}

/// The consistency proof from the tree of `old` events to the tree of `size`.
pub fn consistency(v: &View, old: u64, size: u64) -> Result<Value, ProofError> {
    let len = v.len();
    if old == 0 || old > size {
        return Err(ProofError::BadSizes { old, size });
    }
    if size > len {
        return Err(ProofError::TooLarge { size, len });
    }
    let read = |e: &dyn std::fmt::Display| ProofError::Read(e.to_string());
    let proof = v.consistency_proof(old, size).map_err(|e| read(&e))?;
    let (old_root, new_root) = (v.root(old).map_err(|e| read(&e))?, v.root(size).map_err(|e| read(&e))?);
    merkle::verify_consistency(old, size, &old_root, &new_root, &proof)
        .map_err(|e| read(&format!("self-check failed: {e}")))?;
    Ok(json!({"old_size": old, "new_size": size, "old_root": hex::encode(old_root), "new_root": hex::encode(new_root),
        "proof": proof.iter().map(hex::encode).collect::<Vec<_>>()}))
}

/// A checkpoint of the whole view signed by `id`, as `{origin, size, root, note, verifier_key}`.
pub fn signed_checkpoint(v: &View, id: &Identity) -> Result<(Checkpoint, Value), ProofError> {
    let size = v.len();
    let root = v.root(size).map_err(|e| ProofError::Read(e.to_string()))?;
    let cp = Checkpoint { origin: checkpoint::origin_for(&id.public_bytes()), size, root };
    let note = cp.sign(id);
    let vkey = checkpoint::verifier_key(&cp.origin, &id.public_bytes());
    let doc = json!({"origin": cp.origin, "size": size, "root": hex::encode(root), "note": note, "verifier_key": vkey});
    Ok((cp, doc))
}
