//! Sequences (a prompt and its completion, with the tokens that are learned marked) packed
//! into [`PackedBatch`] rows for the policy step, and where each sequence's learned tokens
//! landed, so per-token log-probs can be read back and derivatives put in place.
//!
//! Sequences go into rows of `seq_len` tokens in order, a new row when the next one does not
//! fit (each its own segment, positions from 0: a packed row computes what the sequences would
//! alone). A micro-batch is `rows` rows, cut to its longest row: completions are short beside
//! `seq_len`, and padding is work.

use crate::batch::{IGNORE, PackedBatch};

/// One sequence: its tokens, and for each whether the model learns it (is scored on it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seq {
    pub tokens: Vec<u32>,
    pub learned: Vec<bool>,
}

impl Seq {
    /// A prompt and its completion: the completion's tokens are learned.
    pub fn completion(prompt: &[u32], completion: &[u32]) -> Seq {
        Seq {
            tokens: [prompt, completion].concat(),
            learned: std::iter::repeat_n(false, prompt.len())
                .chain(std::iter::repeat_n(true, completion.len()))
                .collect(),
        }
    }

    /// Learned tokens that can be scored (the first token has no context to predict it from).
    pub fn targets(&self) -> usize {
        self.learned.iter().skip(1).filter(|&&l| l).count()
    }
}

/// A micro-batch and, for each of its sequences (by index into the packed list), the flat
/// positions (`row × seq_len + t`) of the log-probs of its learned tokens, in order.
#[derive(Debug, Clone, PartialEq)]
pub struct MicroBatch {
    pub batch: PackedBatch,
    pub seqs: Vec<(usize, Vec<usize>)>,
}

/// Packs `seqs` into micro-batches of `rows` rows of at most `seq_len` tokens. A sequence over
/// `seq_len` is an error (the caller bounds prompts and completions).
pub fn pack(seqs: &[Seq], seq_len: usize, rows: usize, pad_id: u32) -> Result<Vec<MicroBatch>, String> {
    let mut row_plans: Vec<Vec<usize>> = Vec::new();
    let mut used = seq_len; // forces a first row
    for (i, s) in seqs.iter().enumerate() {
        if s.tokens.len() != s.learned.len() {
            return Err(format!("sequence {i}: {} tokens but {} learned flags", s.tokens.len(), s.learned.len()));
        }
        if s.tokens.len() > seq_len {
            return Err(format!("sequence {i} has {} tokens, over the {seq_len} of a row", s.tokens.len()));
        }
        if used + s.tokens.len() > seq_len {
            row_plans.push(Vec::new());
            used = 0;
        }
        row_plans.last_mut().expect("a row was opened").push(i);
        used += s.tokens.len();
    }
    Ok(row_plans.chunks(rows.max(1)).map(|plans| micro_batch(seqs, plans, pad_id)).collect())
}

fn micro_batch(seqs: &[Seq], plans: &[Vec<usize>], pad_id: u32) -> MicroBatch {
    let width = plans.iter().map(|p| p.iter().map(|&i| seqs[i].tokens.len()).sum::<usize>()).max().unwrap_or(1).max(1);
    let mut b = PackedBatch {
        batch: plans.len(),
        seq_len: width,
        input_ids: Vec::with_capacity(plans.len() * width),
        position_ids: Vec::with_capacity(plans.len() * width),
        segment_ids: Vec::with_capacity(plans.len() * width),
        labels: Vec::with_capacity(plans.len() * width),
    };
    let mut positions = Vec::new();
    for (row, plan) in plans.iter().enumerate() {
        let mut offset = 0;
        for (segment, &i) in plan.iter().enumerate() {
            let s = &seqs[i];
            let n = s.tokens.len();
            let mut at = Vec::new();
            for t in 0..n {
                b.input_ids.push(s.tokens[t]);
                b.position_ids.push(t as u32);
                b.segment_ids.push(segment as u32 + 1);
                // The logits at t predict token t + 1.
                let learned_next = t + 1 < n && s.learned[t + 1];
                b.labels.push(if learned_next { i64::from(s.tokens[t + 1]) } else { IGNORE });
                if learned_next {
                    at.push(row * width + offset + t);
                }
            }
            offset += n;
            positions.push((i, at));
        }
        for _ in offset..width {
            b.input_ids.push(pad_id);
            b.position_ids.push(0);
            b.segment_ids.push(0);
            b.labels.push(IGNORE);
        }
    }
    MicroBatch { batch: b, seqs: positions }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sequences_pack_in_order_and_their_targets_are_found_again() {
        let seqs = vec![
            Seq::completion(&[1, 2, 3], &[4, 5]),
            Seq::completion(&[6], &[7, 8, 9]),
            Seq::completion(&[1, 2, 3, 4, 5, 6], &[7]),
            Seq::completion(&[2], &[3]),
        ];
        let mbs = pack(&seqs, 9, 2, 0).unwrap();
        // Rows: [s0, s1] (9 tokens), [s2, s3] (9 tokens) → one micro-batch of two rows.
        assert_eq!(mbs.len(), 1);
        let b = &mbs[0].batch;
        assert_eq!((b.batch, b.seq_len), (2, 9));
        assert_eq!(b.input_ids, [1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2, 3, 4, 5, 6, 7, 2, 3]);
        assert_eq!(b.segment_ids, [1, 1, 1, 1, 1, 2, 2, 2, 2, 1, 1, 1, 1, 1, 1, 1, 2, 2]);
        assert_eq!(b.position_ids, [0, 1, 2, 3, 4, 0, 1, 2, 3, 0, 1, 2, 3, 4, 5, 6, 0, 1]);
        for (i, at) in &mbs[0].seqs {
            let want: Vec<i64> = seqs[*i]
                .tokens
                .iter()
                .zip(&seqs[*i].learned)
                .skip(1)
                .filter(|(_, l)| **l)
                .map(|(t, _)| i64::from(*t))
                .collect();
            let got: Vec<i64> = at.iter().map(|&p| b.labels[p]).collect();
            assert_eq!(got, want, "sequence {i}");
            assert_eq!(at.len(), seqs[*i].targets());
        }
        assert_eq!(b.target_tokens(), 7);
    }

    #[test]
    fn micro_batches_are_cut_to_their_longest_row() {
        let seqs: Vec<Seq> = (0..5).map(|i| Seq::completion(&[1; 3], &vec![2; 1 + i])).collect();
        let mbs = pack(&seqs, 8, 2, 9).unwrap();
        let widths: Vec<(usize, usize)> = mbs.iter().map(|m| (m.batch.batch, m.batch.seq_len)).collect();
        assert_eq!(widths, [(2, 5), (2, 7), (1, 8)]);
        assert_eq!(mbs[0].batch.input_ids[4], 9, "padding");
        assert!(pack(&[Seq::completion(&[1; 6], &[2; 3])], 8, 1, 0).unwrap_err().contains("over the 8"));
    }
}
