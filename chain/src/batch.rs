//! Batch anchoring: many 32-byte digests (manifest digests, log checkpoints) become the
//! leaves of one RFC 6962/BLAKE3 Merkle tree ([`crate::merkle`], the tree the event log
//! uses); only its root goes on chain, and each digest keeps an inclusion proof.
//!
//! A [`BatchProof`] is self-contained: with it, anyone can recompute the root from the
//! digest offline, then ask the chain whether the registry holds that root.

use crate::anchorer::AnchorRecord;
use crate::merkle::{self, Hash, ProofError};
use alloy::primitives::{Address, B256};
use serde::{Deserialize, Serialize};
use thiserror::Error;

/// Version of the [`BatchProof`] JSON format.
pub const PROOF_VERSION: u32 = 1;

#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum BatchError {
    #[error("a batch needs at least one digest")]
    Empty,
    #[error("digest {0} is not in this batch")]
    NotInBatch(String),
}

#[derive(Debug, Error)]
pub enum BatchProofError {
    #[error("unsupported batch proof version {0} (this build reads version {PROOF_VERSION})")]
    Version(u32),
    #[error("malformed batch proof: {0}")]
    Malformed(String),
    #[error("inclusion proof does not verify: {0}")]
    Inclusion(#[from] ProofError),
    #[error("the registry does not hold root {root}")]
    NotAnchored { root: String },
    #[error("the chain's record differs from the proof: {0}")]
    RecordMismatch(String),
}

/// Digests to anchor together, in a fixed order (duplicates dropped, first kept).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Batch {
    digests: Vec<Hash>,
    leaves: Vec<Hash>,
    root: Hash,
}

impl Batch {
    pub fn new(digests: impl IntoIterator<Item = Hash>) -> Result<Self, BatchError> {
        let mut seen = std::collections::HashSet::new();
        let digests: Vec<Hash> = digests.into_iter().filter(|d| seen.insert(*d)).collect();
        if digests.is_empty() {
            return Err(BatchError::Empty);
        }
        let leaves: Vec<Hash> = digests.iter().map(|d| merkle::leaf_hash(d)).collect();
        let root = merkle::root(&leaves);
        Ok(Self { digests, leaves, root })
    }

    /// The Merkle root that is anchored.
    pub fn root(&self) -> Hash {
        self.root
    }

    pub fn digests(&self) -> &[Hash] {
        &self.digests
    }

    pub fn len(&self) -> usize {
        self.digests.len()
    }

    pub fn is_empty(&self) -> bool {
        self.digests.is_empty()
    }

    /// The proof for `digest`, once the root is anchored at `at`.
    pub fn proof(&self, digest: &Hash, at: &AnchorPlace) -> Result<BatchProof, BatchError> {
        let index =
            self.digests.iter().position(|d| d == digest).ok_or_else(|| BatchError::NotInBatch(hex::encode(digest)))?;
        let path = merkle::inclusion_proof(&self.leaves, index as u64).expect("index is inside the batch");
        Ok(BatchProof {
            v: PROOF_VERSION,
            digest: *digest,
            leaf_index: index as u64,
            tree_size: self.len() as u64,
            proof: path,
            root: self.root,
            chain_id: at.chain_id,
            registry: at.registry,
            tx: at.tx,
            block: at.block,
            timestamp: at.timestamp,
        })
    }

    /// Every digest's proof, in batch order.
    pub fn proofs(&self, at: &AnchorPlace) -> Vec<BatchProof> {
        self.digests.iter().map(|d| self.proof(d, at).expect("digest from the batch")).collect()
    }
}

/// Where a batch root was anchored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct AnchorPlace {
    pub chain_id: u64,
    pub registry: Address,
    pub tx: B256,
    pub block: u64,
    pub timestamp: u64,
}

/// One digest's proof of anchoring (JSON: see docs/formats.md).
///
/// BLAKE3 values (`digest`, `proof`, `root`) are lowercase hex without prefix, like
/// every hash in the event log; EVM values (`registry`, `tx`) are 0x-prefixed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BatchProof {
    pub v: u32,
    #[serde(with = "hex32")]
    pub digest: Hash,
    pub leaf_index: u64,
    pub tree_size: u64,
    #[serde(with = "hex32_vec")]
    pub proof: Vec<Hash>,
    #[serde(with = "hex32")]
    pub root: Hash,
    pub chain_id: u64,
    pub registry: Address,
    pub tx: B256,
    pub block: u64,
    pub timestamp: u64,
}

impl BatchProof {
    /// Offline check: the digest's leaf and path recompute the root.
    pub fn verify(&self) -> Result<(), BatchProofError> {
        if self.v != PROOF_VERSION {
            return Err(BatchProofError::Version(self.v));
        }
        let leaf = merkle::leaf_hash(&self.digest);
        merkle::verify_inclusion(&leaf, self.leaf_index, self.tree_size, &self.proof, &self.root)?;
        Ok(())
    }

    /// Offline check, then compare with the registry's record of the root (from
    /// [`crate::Anchorer::lookup`]): block and timestamp must match.
    pub fn verify_against(&self, record: Option<&AnchorRecord>) -> Result<(), BatchProofError> {
        self.verify()?;
        let rec = record.ok_or_else(|| BatchProofError::NotAnchored { root: hex::encode(self.root) })?;
        if rec.root.0 != self.root {
            return Err(BatchProofError::RecordMismatch("record is for another root".into()));
        }
        if rec.block != self.block || rec.timestamp != self.timestamp {
            return Err(BatchProofError::RecordMismatch(format!(
                "chain says block {} time {}, proof says block {} time {}",
                rec.block, rec.timestamp, self.block, self.timestamp
            )));
        }
        if let Some(tx) = rec.tx
            && tx != self.tx
        {
            return Err(BatchProofError::RecordMismatch(format!("chain says tx {tx}, proof says {}", self.tx)));
        }
        Ok(())
    }

    /// The root as the registry's `bytes32`.
    pub fn root_b256(&self) -> B256 {
        B256::from(self.root)
    }

    pub fn from_json(text: &str) -> Result<Self, BatchProofError> {
        serde_json::from_str(text).map_err(|e| BatchProofError::Malformed(e.to_string()))
    }

    pub fn to_json(&self) -> serde_json::Value {
        serde_json::to_value(self).expect("a batch proof serialises")
    }
}

/// Parses 64 hex digits (an optional 0x is accepted).
pub fn parse_hash(text: &str) -> Option<Hash> {
    let t = text.trim();
    let t = t.strip_prefix("0x").unwrap_or(t);
    if t.len() != 64 {
        return None;
    }
    hex::decode(t).ok()?.try_into().ok()
}

mod hex32 {
    use serde::{Deserialize, Deserializer, Serializer, de::Error};

    pub fn serialize<S: Serializer>(h: &[u8; 32], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&hex::encode(h))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<[u8; 32], D::Error> {
        let s = String::deserialize(d)?;
        super::parse_hash(&s).ok_or_else(|| D::Error::custom(format!("{s:?} is not 64 hex digits")))
    }
}

mod hex32_vec {
    use serde::{Deserialize, Deserializer, Serializer, de::Error, ser::SerializeSeq};

    pub fn serialize<S: Serializer>(v: &[[u8; 32]], s: S) -> Result<S::Ok, S::Error> {
        let mut seq = s.serialize_seq(Some(v.len()))?;
        for h in v {
            seq.serialize_element(&hex::encode(h))?;
        }
        seq.end()
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<[u8; 32]>, D::Error> {
        Vec::<String>::deserialize(d)?
            .iter()
            .map(|s| super::parse_hash(s).ok_or_else(|| D::Error::custom(format!("{s:?} is not 64 hex digits"))))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn place() -> AnchorPlace {
        AnchorPlace {
            chain_id: 31337,
            registry: Address::repeat_byte(7),
            tx: B256::repeat_byte(9),
            block: 5,
            timestamp: 77,
        }
    }

    #[test]
    fn duplicates_are_dropped_and_empty_batches_refused() {
        let b = Batch::new([[1u8; 32], [2; 32], [1; 32]]).unwrap();
        assert_eq!(b.len(), 2);
        assert_eq!(Batch::new([]), Err(BatchError::Empty));
        assert!(matches!(b.proof(&[3; 32], &place()), Err(BatchError::NotInBatch(_))));
    }

    #[test]
    fn root_is_the_log_tree_over_leaf_hashed_digests() {
        let digests: Vec<Hash> = (0u8..5).map(|i| [i; 32]).collect();
        let b = Batch::new(digests.clone()).unwrap();
        let leaves: Vec<Hash> = digests.iter().map(|d| merkle::leaf_hash(d)).collect();
        assert_eq!(b.root(), merkle::root(&leaves));
    }

    #[test]
    fn proof_json_round_trips_and_rejects_unknown_fields() {
        let b = Batch::new((0u8..3).map(|i| [i; 32])).unwrap();
        let p = b.proof(&[2; 32], &place()).unwrap();
        let text = p.to_json().to_string();
        assert!(text.contains("\"registry\":\"0x0707"), "{text}");
        assert_eq!(BatchProof::from_json(&text).unwrap(), p);
        let mut v = p.to_json();
        v["extra"] = serde_json::json!(1);
        assert!(BatchProof::from_json(&v.to_string()).is_err());
        let mut v = p.to_json();
        v["digest"] = serde_json::json!("zz");
        assert!(BatchProof::from_json(&v.to_string()).is_err());
    }

    #[test]
    fn chain_record_must_match() {
        let b = Batch::new([[4u8; 32]]).unwrap();
        let p = b.proof(&[4; 32], &place()).unwrap();
        let rec = AnchorRecord {
            root: B256::from(b.root()),
            timestamp: 77,
            block: 5,
            by: Address::ZERO,
            tx: Some(B256::repeat_byte(9)),
        };
        p.verify_against(Some(&rec)).unwrap();
        assert!(matches!(p.verify_against(None), Err(BatchProofError::NotAnchored { .. })));
        let later = AnchorRecord { block: 6, ..rec.clone() };
        assert!(matches!(p.verify_against(Some(&later)), Err(BatchProofError::RecordMismatch(_))));
        let other_tx = AnchorRecord { tx: Some(B256::repeat_byte(1)), ..rec };
        assert!(matches!(p.verify_against(Some(&other_tx)), Err(BatchProofError::RecordMismatch(_))));
    }

    proptest! {
        #[test]
        fn every_member_verifies_and_any_tampering_fails(n in 1usize..80, pick in any::<prop::sample::Index>(), flip in 0usize..32) {
            let digests: Vec<Hash> = (0..n).map(|i| *blake3::hash(&(i as u64).to_le_bytes()).as_bytes()).collect();
            let b = Batch::new(digests.clone()).unwrap();
            let at = place();
            for p in b.proofs(&at) {
                prop_assert!(p.verify().is_ok());
            }
            let i = pick.index(n);
            let mut p = b.proof(&digests[i], &at).unwrap();
            p.digest[flip] ^= 1;
            prop_assert!(p.verify().is_err());
            let mut p = b.proof(&digests[i], &at).unwrap();
            p.root[flip] ^= 0x80;
            prop_assert!(p.verify().is_err());
            if n > 1 {
                let mut p = b.proof(&digests[i], &at).unwrap();
                p.leaf_index = (p.leaf_index + 1) % n as u64;
                prop_assert!(p.verify().is_err());
            }
        }
    }
}
