//! Typed errors of the data pipeline. Every problem with an input line names the file and the
//! 1-based line number, so an operator can open the file at the spot.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum DataError {
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A JSONL line that is not a valid record of the expected format.
    #[error("{}:{line}: {reason}", path.display())]
    BadLine { path: PathBuf, line: u64, reason: String },
    #[error("tokenizer {origin}: {message}")]
    Tokenizer { origin: String, message: String },
    /// The recipe asks for something the data pipeline cannot do with what it was given.
    #[error("data: {0}")]
    Config(String),
    #[error("data: {0}")]
    Empty(String),
    /// A saved data cursor that does not point into this dataset.
    #[error("data cursor epoch {epoch} position {position}: {reason}")]
    BadCursor { epoch: u64, position: u64, reason: String },
}
