//! The mindxtrain node as a library: everything the `mindxtrain` binary does, callable
//! from tests and from other programs.
//!
//! * [`log`]: the append-only, hash-chained, signed event log (segments, group commit,
//!   recovery, sled index, Merkle proofs, signed checkpoints, audit);
//! * [`identity`]: the node's ed25519 key;
//! * [`canonical`]: RFC 8785 canonical JSON, which every hash and signature covers;
//! * [`node`]: a node directory and what lives in it;
//! * [`recipes`]: validating and registering recipes;
//! * [`anchor`]: anchoring checkpoints and digests on chain, every step an event;
//! * [`energy`]: the energy a run drew, from NVML and RAPL counters;
//! * [`manifest`]: sealing a run into a signed in-toto/SLSA manifest (DSSE);
//! * [`receipt`]: the self-contained receipt bundle and its verifier;
//! * [`serve`]: OpenAI-compatible inference sold over x402, and rentals;
//! * [`api`]: the operator API (health, metrics, the log over HTTP, OpenAPI).

pub mod anchor;
pub mod api;
pub mod canonical;
pub mod energy;
pub mod fsutil;
pub mod identity;
pub mod log;
pub mod manifest;
pub mod node;
pub mod receipt;
pub mod recipes;
pub mod serve;
pub mod training;

/// `mindxtrain/<version>`, recorded in genesis events and manifests.
pub const SOFTWARE: &str = concat!("mindxtrain/", env!("CARGO_PKG_VERSION"));
