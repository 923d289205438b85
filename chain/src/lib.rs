//! Anchoring mindxtrain's provenance on EVM chains.
//!
//! * [`merkle`]: the RFC 6962-shaped BLAKE3 Merkle tree shared by the event log and
//!   by batch anchoring, with inclusion and consistency proofs.

pub mod merkle;
