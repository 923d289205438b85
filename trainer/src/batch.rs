//! The unit of work handed from the data pipeline to the model: packed token rows.
//!
//! Rows are `seq_len` long. Several documents may share a row (packing); `segment_ids`
//! keeps them apart — a token attends only to earlier tokens of the same segment — and
//! `position_ids` restart at 0 for each document, so a packed row trains exactly like the
//! documents would alone. Padding is segment 0 with label [`IGNORE`]; real documents use
//! segment ids from 1.

/// Label value for tokens that carry no loss (prompt, padding, document joins).
pub const IGNORE: i64 = -100;

/// `batch` rows of `seq_len` tokens, row-major (`[batch, seq_len]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PackedBatch {
    pub batch: usize,
    pub seq_len: usize,
    pub input_ids: Vec<u32>,
    pub position_ids: Vec<u32>,
    pub segment_ids: Vec<u32>,
    /// The token to predict at each position (already shifted: `labels[t]` is the target
    /// for the logits at `t`), or [`IGNORE`].
    pub labels: Vec<i64>,
}

impl PackedBatch {
    /// One unlabelled document of `ids` in one row: what scoring a sequence (log-probabilities
    /// of its own tokens) feeds the model.
    pub fn single_row(ids: &[u32]) -> PackedBatch {
        let n = ids.len();
        PackedBatch {
            batch: 1,
            seq_len: n,
            input_ids: ids.to_vec(),
            position_ids: (0..n as u32).collect(),
            segment_ids: vec![1; n],
            labels: vec![IGNORE; n],
        }
    }

    /// Tokens that carry a loss: the denominator of the per-token mean.
    pub fn target_tokens(&self) -> usize {
        self.labels.iter().filter(|&&l| l != IGNORE).count()
    }
}

/// A preference pair for DPO/ORPO: the same prompt with a chosen and a rejected answer,
/// row `i` of `chosen` pairs with row `i` of `rejected`. Labels mask the prompt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PreferenceBatch {
    pub chosen: PackedBatch,
    pub rejected: PackedBatch,
}
