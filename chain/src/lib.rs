//! Anchoring mindxtrain's provenance on EVM chains.
//!
//! * [`merkle`]: the RFC 6962-shaped BLAKE3 Merkle tree shared by the event log and
//!   by batch anchoring, with inclusion and consistency proofs;
//! * [`bindings`]: typed bindings of the contracts, from the committed forge artifacts;
//! * [`network`]: chain presets (anvil, Base, Base Sepolia) and RPC URLs;
//! * [`key`]: the anchoring key (0600 file or environment), never printed;
//! * [`anchorer`]: idempotent anchoring of a root with retries, confirmations and safe
//!   nonces; lookups (read-only without a key);
//! * [`batch`]: many digests → one anchored root, and each digest's [`batch::BatchProof`];
//! * [`deploy`]: deploying Registry, TestUSDC and X402Receiver;
//! * [`anvil`]: a local anvil from the project's toolchain, stopped on drop;
//! * [`rpc`]: providers, timeouts and retry with backoff.
//!
//! This crate knows nothing of the node: callers record progress through
//! [`anchorer::AnchorObserver`].

pub mod anchorer;
pub mod anvil;
pub mod batch;
pub mod bindings;
pub mod deploy;
pub mod error;
pub mod key;
pub mod merkle;
pub mod network;
pub mod rpc;

/// The alloy version these APIs speak (for callers needing its types or traits).
pub use alloy;
pub use alloy::primitives::{Address, B256};
pub use anchorer::{AnchorObserver, AnchorRecord, AnchorStep, Anchored, Anchorer, AnchorerConfig};
pub use batch::{AnchorPlace, Batch, BatchProof};
pub use error::ChainError;
pub use key::AnchorKey;
