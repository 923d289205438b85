//! Why a collective failed: always naming the rank and the operation, never a hang.

use thiserror::Error;

#[derive(Debug, Clone, PartialEq, Error)]
pub enum CollectiveError {
    /// The peer's end of the connection closed: its process ended (killed, crashed or failed).
    #[error("rank {peer} closed its connection during {op}: its process ended")]
    PeerClosed { peer: usize, op: &'static str },
    /// Nothing arrived from (or could be sent to) the peer within the collective timeout.
    #[error(
        "rank {peer} did not answer within {seconds} s during {op} (the collective timeout, \
         train.distributed.timeout_seconds): it hangs, or is far slower than this rank"
    )]
    Timeout { peer: usize, op: &'static str, seconds: u64 },
    /// The launcher stopped the run: another rank failed, or the launcher itself went away.
    #[error("stopped: {reason}")]
    Aborted { reason: String },
    /// The ranks are not doing the same thing (another operation, another length, another run).
    #[error("ranks disagree: {0}")]
    Mismatch(String),
    #[error("connection with rank {peer}: {message}")]
    Io { peer: usize, message: String },
    #[error("tensor: {0}")]
    Tensor(String),
    #[error("rendezvous: {0}")]
    Rendezvous(String),
    #[error("nccl: {0}")]
    Nccl(String),
}

impl From<candle_core::Error> for CollectiveError {
    fn from(e: candle_core::Error) -> Self {
        CollectiveError::Tensor(e.to_string())
    }
}
