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
    /// A problem with a Parquet or Arrow file (boxed: it is the largest, and every `Result`
    /// of a run carries the size of its error).
    #[error(transparent)]
    BadTable(Box<TableError>),
    /// A chat template that does not compile or fails on a conversation.
    #[error("chat template {origin}: {message}")]
    Template { origin: String, message: String },
    /// An input file that changed after it was indexed (its size or modification time).
    #[error("{}: changed while the run was reading it ({reason}); its BLAKE3 in the manifest no longer describes it", path.display())]
    Changed { path: PathBuf, reason: String },
    #[error("tokenizer {origin}: {message}")]
    Tokenizer { origin: String, message: String },
    /// The recipe asks for something the data pipeline cannot do with what it was given.
    #[error("data: {0}")]
    Config(String),
    #[error("data: {0}")]
    Empty(String),
    /// A dataset named by hub id (`data.hf_id`) that the Hugging Face cache does not hold
    /// (boxed: it is large, and rare).
    #[error(transparent)]
    Hub(Box<crate::hub::HubError>),
    /// A saved data cursor that does not point into this dataset.
    #[error("data cursor epoch {epoch} position {position}: {reason}")]
    BadCursor { epoch: u64, position: u64, reason: String },
}

impl From<crate::hub::HubError> for DataError {
    fn from(e: crate::hub::HubError) -> Self {
        DataError::Hub(Box::new(e))
    }
}

/// A problem with a Parquet or Arrow file: where it is, as precisely as known (the row group or
/// record batch, the column, the row within it).
#[derive(Debug, thiserror::Error)]
#[error("{}{}{}{}: {message}", path.display(),
    group.as_ref().map(|g| format!(" {g}")).unwrap_or_default(),
    column.as_ref().map(|c| format!(" column `{c}`")).unwrap_or_default(),
    row.map(|r| format!(" row {r}")).unwrap_or_default())]
pub struct TableError {
    pub path: PathBuf,
    pub group: Option<String>,
    pub column: Option<String>,
    pub row: Option<u64>,
    pub message: String,
}
