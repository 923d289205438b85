//! What can go wrong when talking to a chain, as one typed error.

use alloy::primitives::{Address, B256};
use alloy::transports::{RpcError, TransportError, TransportErrorKind};
use thiserror::Error;

/// Errors of the chain client: each variant names what to do about it.
#[derive(Debug, Error)]
pub enum ChainError {
    #[error("the RPC endpoint serves chain id {actual}, but {expected} was expected (check --rpc-url / --network)")]
    WrongChainId { expected: u64, actual: u64 },
    #[error(
        "no contract code at {address}: the registry is not deployed on this chain (run `mindxtrain chain deploy`)"
    )]
    ContractMissing { address: Address },
    #[error("account {address} cannot pay for the transaction: {message}")]
    InsufficientFunds { address: Address, message: String },
    #[error("transaction reverted{}: {reason}", tx.map(|t| format!(" ({t})")).unwrap_or_default())]
    Reverted { tx: Option<B256>, reason: String },
    #[error("transport error after {attempts} attempt(s): {message}")]
    Transport { attempts: u32, message: String },
    #[error("the node rejected the request: {0}")]
    Rpc(String),
    #[error("transaction {tx} was not mined within {seconds}s")]
    NotMined { tx: B256, seconds: u64 },
    #[error("this client is read-only: anchoring and deploying need a key (--key-file or MINDXTRAIN_ANCHOR_KEY)")]
    ReadOnly,
    #[error("invalid RPC URL {url:?}: {reason}")]
    BadUrl { url: String, reason: String },
    #[error("{0}")]
    Other(String),
}

impl ChainError {
    /// Whether retrying the same request later may succeed (the endpoint was unreachable,
    /// timed out or asked us to slow down), as opposed to a definite answer.
    pub fn is_transient(&self) -> bool {
        matches!(self, ChainError::Transport { .. })
    }
}

/// Maps an alloy transport error: connection problems and rate limits are transient,
/// error responses are the node's definite answer.
pub(crate) fn from_transport(err: TransportError) -> ChainError {
    match &err {
        RpcError::Transport(kind) => transient(kind),
        RpcError::ErrorResp(payload) if payload.is_retry_err() => {
            ChainError::Transport { attempts: 1, message: payload.to_string() }
        }
        RpcError::ErrorResp(payload) => ChainError::Rpc(payload.to_string()),
        RpcError::NullResp => ChainError::Transport { attempts: 1, message: err.to_string() },
        _ => ChainError::Rpc(err.to_string()),
    }
}

fn transient(kind: &TransportErrorKind) -> ChainError {
    ChainError::Transport { attempts: 1, message: kind.to_string() }
}

/// Whether a node's error message says the sender cannot cover gas and value.
pub(crate) fn is_insufficient_funds(message: &str) -> bool {
    let m = message.to_ascii_lowercase();
    m.contains("insufficient funds") || m.contains("insufficient balance")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connection_failures_are_transient_and_error_responses_are_not() {
        let conn = from_transport(TransportErrorKind::custom_str("connection refused"));
        assert!(conn.is_transient(), "{conn:?}");
        let payload = serde_json::from_str(r#"{"code":-32000,"message":"execution reverted"}"#).unwrap();
        let resp = from_transport(RpcError::ErrorResp(payload));
        assert!(!resp.is_transient(), "{resp:?}");
        assert!(is_insufficient_funds("Insufficient funds for gas * price + value"));
        assert!(!is_insufficient_funds("nonce too low"));
    }
}
