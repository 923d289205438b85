//! Packing documents into fixed-length rows without letting them see or predict each other.
//!
//! A row holds whole documents back to back. Each gets its own segment id (1, 2, ...) and
//! positions from 0, and its last token carries no label, so no document learns to predict
//! the first token of the next one. Padding is segment 0 with label [`IGNORE`].

use crate::batch::{IGNORE, PackedBatch};

use super::template::Encoded;

/// How many rows stay open for first-fit at once. A window keeps packing linear in the
/// number of documents and keeps rows close to the shuffled order, while filling rows far
/// better than next-fit.
const OPEN_ROWS: usize = 8;

/// Groups documents (in `order`) into rows of at most `seq_len` tokens. `lens` are lengths
/// already cut to `seq_len`. Without packing every document gets its own row.
pub fn plan_rows(lens: &[usize], order: &[usize], seq_len: usize, packing: bool) -> Vec<Vec<usize>> {
    if !packing {
        return order.iter().map(|&d| vec![d]).collect();
    }
    let mut rows: Vec<(Vec<usize>, usize)> = Vec::new();
    let mut open: Vec<usize> = Vec::new();
    for &doc in order {
        let len = lens[doc].min(seq_len);
        match open.iter().position(|&r| rows[r].1 + len <= seq_len) {
            Some(slot) => {
                let r = open[slot];
                rows[r].0.push(doc);
                rows[r].1 += len;
                if rows[r].1 == seq_len {
                    open.remove(slot);
                }
            }
            None => {
                rows.push((vec![doc], len));
                if len < seq_len {
                    open.push(rows.len() - 1);
                    if open.len() > OPEN_ROWS {
                        open.remove(0);
                    }
                }
            }
        }
    }
    rows.into_iter().map(|(docs, _)| docs).collect()
}

/// An empty batch of `seq_len`-long rows, ready for [`push_row`].
pub fn empty_batch(seq_len: usize, rows: usize) -> PackedBatch {
    let cap = seq_len * rows;
    PackedBatch {
        batch: 0,
        seq_len,
        input_ids: Vec::with_capacity(cap),
        position_ids: Vec::with_capacity(cap),
        segment_ids: Vec::with_capacity(cap),
        labels: Vec::with_capacity(cap),
    }
}

/// Appends one row made of `docs` back to back, cut and padded to `seq_len`.
pub fn push_row<'a>(batch: &mut PackedBatch, docs: impl IntoIterator<Item = &'a Encoded>, pad_id: u32) {
    let seq_len = batch.seq_len;
    let start = batch.input_ids.len();
    for (segment, doc) in docs.into_iter().enumerate() {
        let used = batch.input_ids.len() - start;
        let n = doc.ids.len().min(seq_len - used);
        for i in 0..n {
            batch.input_ids.push(doc.ids[i]);
            batch.position_ids.push(i as u32);
            batch.segment_ids.push(segment as u32 + 1);
            let label = if i + 1 < n && doc.targets[i + 1] { i64::from(doc.ids[i + 1]) } else { IGNORE };
            batch.labels.push(label);
        }
    }
    let pad = seq_len - (batch.input_ids.len() - start);
    batch.input_ids.extend(std::iter::repeat_n(pad_id, pad));
    batch.position_ids.extend(std::iter::repeat_n(0, pad));
    batch.segment_ids.extend(std::iter::repeat_n(0, pad));
    batch.labels.extend(std::iter::repeat_n(IGNORE, pad));
    batch.batch += 1;
}

/// Tokens of `doc` that carry a label once it is cut to `seq_len` (its first token never
/// does: nothing before it predicts it).
pub fn learned_tokens(doc: &Encoded, seq_len: usize) -> usize {
    doc.targets.iter().take(seq_len).skip(1).filter(|t| **t).count()
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn doc(ids: Vec<u32>, targets: Vec<bool>) -> Encoded {
        Encoded { ids, targets }
    }

    #[test]
    fn labels_are_shifted_and_stop_at_the_document_end() {
        let docs = vec![doc(vec![1, 2, 3], vec![false, true, true]), doc(vec![4, 5], vec![true, true])];
        let mut b = empty_batch(8, 1);
        push_row(&mut b, &docs, 0);
        assert_eq!(b.input_ids, vec![1, 2, 3, 4, 5, 0, 0, 0]);
        assert_eq!(b.position_ids, vec![0, 1, 2, 0, 1, 0, 0, 0]);
        assert_eq!(b.segment_ids, vec![1, 1, 1, 2, 2, 0, 0, 0]);
        assert_eq!(b.labels, vec![2, 3, IGNORE, 5, IGNORE, IGNORE, IGNORE, IGNORE]);
        assert_eq!(b.target_tokens(), 3);
    }

    #[test]
    fn long_documents_are_cut_to_the_row() {
        let docs = vec![doc((10..20).collect(), vec![true; 10])];
        let mut b = empty_batch(4, 1);
        push_row(&mut b, &docs, 0);
        assert_eq!(b.input_ids, vec![10, 11, 12, 13]);
        assert_eq!(b.labels, vec![11, 12, 13, IGNORE]);
        assert_eq!(learned_tokens(&docs[0], 4), 3);
    }

    #[test]
    fn without_packing_each_document_has_its_own_row() {
        assert_eq!(plan_rows(&[2, 2, 2], &[2, 0, 1], 8, false), vec![vec![2], vec![0], vec![1]]);
        assert_eq!(plan_rows(&[2, 2, 2], &[2, 0, 1], 8, true), vec![vec![2, 0, 1]]);
    }

    #[test]
    fn first_fit_fills_earlier_rows() {
        // 6 opens a row, 5 does not fit beside it, 2 fills the first row.
        assert_eq!(plan_rows(&[6, 5, 2, 3], &[0, 1, 2, 3], 8, true), vec![vec![0, 2], vec![1, 3]]);
    }

    proptest! {
        /// Over random documents: every document lands in exactly one row, no row overflows,
        /// and in the materialised rows every label is the next token of the same document,
        /// positions restart per document, and each learned token appears exactly once.
        #[test]
        fn packing_invariants(
            specs in proptest::collection::vec((1usize..40, proptest::collection::vec(any::<bool>(), 40)), 1..30),
            seq_len in 4usize..48,
            packing in any::<bool>(),
        ) {
            let docs: Vec<Encoded> = specs.iter().enumerate().map(|(d, (len, mask))| {
                // Ids encode (document, index) so every label can be traced back.
                doc((0..*len).map(|i| (d * 100 + i) as u32 + 1000).collect(), mask[..*len].to_vec())
            }).collect();
            let lens: Vec<usize> = docs.iter().map(|d| d.ids.len()).collect();
            let order: Vec<usize> = (0..docs.len()).rev().collect();
            let rows = plan_rows(&lens, &order, seq_len, packing);
            let mut seen: Vec<usize> = rows.iter().flatten().copied().collect();
            seen.sort_unstable();
            prop_assert_eq!(seen, (0..docs.len()).collect::<Vec<_>>());
            let mut b = empty_batch(seq_len, rows.len());
            for row in &rows {
                prop_assert!(row.iter().map(|&d| lens[d].min(seq_len)).sum::<usize>() <= seq_len);
                push_row(&mut b, row.iter().map(|&d| &docs[d]), 7);
            }
            prop_assert_eq!(b.batch, rows.len());
            prop_assert_eq!(b.labels.len(), rows.len() * seq_len);
            let mut learned = std::collections::BTreeSet::new();
            for r in 0..b.batch {
                let at = |t: usize| r * seq_len + t;
                for t in 0..seq_len {
                    let seg = b.segment_ids[at(t)];
                    if seg == 0 {
                        prop_assert_eq!(b.labels[at(t)], IGNORE);
                        continue;
                    }
                    let first_of_segment = t == 0 || b.segment_ids[at(t - 1)] != seg;
                    prop_assert_eq!(b.position_ids[at(t)] == 0, first_of_segment);
                    if !first_of_segment {
                        prop_assert_eq!(b.position_ids[at(t)], b.position_ids[at(t - 1)] + 1);
                    }
                    let label = b.labels[at(t)];
                    if label != IGNORE {
                        prop_assert!(t + 1 < seq_len && b.segment_ids[at(t + 1)] == seg, "label across a boundary");
                        prop_assert_eq!(label, i64::from(b.input_ids[at(t + 1)]));
                        prop_assert!(learned.insert(label), "token learned twice");
                    }
                }
            }
            let want: usize = docs.iter().map(|d| learned_tokens(d, seq_len)).sum();
            prop_assert_eq!(learned.len(), want);
            prop_assert_eq!(b.target_tokens(), want);
        }
    }
}
