//! An endless, resumable stream of batches.
//!
//! Epoch `e` orders the documents with a key derived from (seed, e) and packs them in that
//! order; rows are read in sequence, a batch takes the next `per_device` rows and may run
//! into the next epoch, so every batch is full. A [`DataCursor`] (epoch, row) is all the
//! state there is: a stream opened at a saved cursor yields exactly the batches the original
//! stream would have yielded next.
//!
//! The order is shuffled in windows so that a dataset larger than memory is read block by
//! block: the blocks are shuffled, consecutive blocks form windows of at least
//! [`WINDOW_TOKENS`] tokens, and the documents of each window are shuffled. A dataset of one
//! window (every dataset up to that size) is shuffled as a whole. The order depends only on
//! the seed, the epoch and the documents' blocks and lengths, never on the machine.

use std::sync::Arc;

use rand_chacha::ChaCha8Rng;
use rand_chacha::rand_core::{RngCore, SeedableRng};
use serde::{Deserialize, Serialize};

use super::error::DataError;
use super::pack::{empty_batch, plan_rows, push_row};
use super::store::{Doc, DocRef, DocStore, Part};
use crate::batch::{PackedBatch, PreferenceBatch};

/// Tokens of a shuffle window; the document cache holds several windows.
pub const WINDOW_TOKENS: usize = 8 << 20;

/// Where the next batch starts: the row `position` of epoch `epoch`'s packing.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct DataCursor {
    pub epoch: u64,
    pub position: u64,
}

/// How rows are formed and ordered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    pub seq_len: usize,
    pub packing: bool,
    pub shuffle: bool,
    pub seed: u64,
    pub pad_id: u32,
}

/// The order of `n` items in `epoch`: a Fisher-Yates shuffle driven by ChaCha8, whose output
/// is fixed by its key, so the order never depends on the `rand` version.
pub fn epoch_order(n: usize, seed: u64, epoch: u64, shuffle: bool) -> Vec<usize> {
    keyed_order(n, shuffle, &[&seed.to_le_bytes(), &epoch.to_le_bytes()])
}

fn keyed_order(n: usize, shuffle: bool, key_parts: &[&[u8]]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..n).collect();
    if !shuffle {
        return order;
    }
    let mut key = blake3::Hasher::new_derive_key("mindxtrain data shuffle v1");
    for part in key_parts {
        key.update(part);
    }
    let mut rng = ChaCha8Rng::from_seed(*key.finalize().as_bytes());
    for i in (1..n).rev() {
        // Multiply-shift maps 64 random bits onto 0..=i; its bias is below 2^-40 here.
        let j = ((u128::from(rng.next_u64()) * (i as u128 + 1)) >> 64) as usize;
        order.swap(i, j);
    }
    order
}

/// The order of `docs` (sorted by block) in `epoch`: shuffled blocks, windows of
/// [`WINDOW_TOKENS`], documents shuffled within each window.
pub fn window_order(docs: &[DocRef], seed: u64, epoch: u64, shuffle: bool) -> Vec<usize> {
    if !shuffle {
        return (0..docs.len()).collect();
    }
    let mut spans: Vec<(usize, usize)> = Vec::new();
    for (i, d) in docs.iter().enumerate() {
        match spans.last_mut() {
            Some(span) if docs[span.0].block == d.block => span.1 = i + 1,
            _ => spans.push((i, i + 1)),
        }
    }
    let block_order = keyed_order(spans.len(), true, &[b"blocks", &seed.to_le_bytes(), &epoch.to_le_bytes()]);
    let mut order = Vec::with_capacity(docs.len());
    let mut window: Vec<usize> = Vec::new();
    let (mut tokens, mut w) = (0usize, 0u64);
    let flush = |window: &mut Vec<usize>, w: &mut u64, order: &mut Vec<usize>| {
        let inner = if *w == 0 && window.len() == docs.len() {
            epoch_order(window.len(), seed, epoch, true)
        } else {
            keyed_order(window.len(), true, &[&seed.to_le_bytes(), &epoch.to_le_bytes(), &w.to_le_bytes()])
        };
        order.extend(inner.into_iter().map(|k| window[k]));
        window.clear();
        *w += 1;
    };
    for b in block_order {
        let (start, end) = spans[b];
        window.extend(start..end);
        tokens += docs[start..end].iter().map(|d| d.len as usize).sum::<usize>();
        if tokens >= WINDOW_TOKENS {
            flush(&mut window, &mut w, &mut order);
            tokens = 0;
        }
    }
    if !window.is_empty() {
        flush(&mut window, &mut w, &mut order);
    }
    order
}

/// Row plans epoch after epoch, with the read position.
struct RowStream {
    docs: Vec<DocRef>,
    layout: Layout,
    epoch: u64,
    rows: Vec<Vec<usize>>,
    position: usize,
}

impl RowStream {
    fn new(docs: Vec<DocRef>, layout: Layout, cursor: DataCursor) -> Result<RowStream, DataError> {
        let bad = |reason: &str| DataError::BadCursor {
            epoch: cursor.epoch,
            position: cursor.position,
            reason: reason.to_owned(),
        };
        if docs.is_empty() {
            return Err(bad("there is nothing to read"));
        }
        let mut stream = RowStream { docs, layout, epoch: cursor.epoch, rows: Vec::new(), position: 0 };
        stream.rows = stream.plan(cursor.epoch);
        let position = usize::try_from(cursor.position).map_err(|_| bad("position out of range"))?;
        if position > stream.rows.len() {
            return Err(bad(&format!("the epoch has only {} rows; is this the same dataset?", stream.rows.len())));
        }
        stream.position = position;
        Ok(stream)
    }

    fn plan(&self, epoch: u64) -> Vec<Vec<usize>> {
        plan_epoch(&self.docs, self.layout, epoch)
    }

    fn next_row(&mut self) -> &[usize] {
        if self.position >= self.rows.len() {
            self.epoch += 1;
            self.rows = self.plan(self.epoch);
            self.position = 0;
        }
        self.position += 1;
        &self.rows[self.position - 1]
    }

    fn cursor(&self) -> DataCursor {
        if self.position >= self.rows.len() {
            DataCursor { epoch: self.epoch + 1, position: 0 }
        } else {
            DataCursor { epoch: self.epoch, position: self.position as u64 }
        }
    }
}

/// The rows of `epoch`: documents (indices into `docs`) in the epoch's order, packed.
pub(crate) fn plan_epoch(docs: &[DocRef], layout: Layout, epoch: u64) -> Vec<Vec<usize>> {
    let lens: Vec<usize> = docs.iter().map(|d| d.len as usize).collect();
    let order = window_order(docs, layout.seed, epoch, layout.shuffle);
    plan_rows(&lens, &order, layout.seq_len, layout.packing)
}

fn fetch(store: &DocStore, part: Part, row: &[usize]) -> Result<Vec<Arc<Doc>>, DataError> {
    row.iter().map(|&d| store.get(part, d)).collect()
}

/// The training rows from `cursor` on, for batches of `per_device` (at least one).
fn row_stream(store: &DocStore, layout: Layout, per_device: usize, cursor: DataCursor) -> Result<RowStream, DataError> {
    if per_device == 0 {
        return Err(DataError::Config("per_device batch size must be at least 1".into()));
    }
    RowStream::new(store.train.clone(), layout, cursor)
}

/// Endless [`PackedBatch`]es of `per_device` rows.
pub struct BatchIter<'a> {
    store: &'a DocStore,
    rows: RowStream,
    per_device: usize,
}

impl<'a> BatchIter<'a> {
    pub(crate) fn new(
        store: &'a DocStore,
        layout: Layout,
        per_device: usize,
        cursor: DataCursor,
    ) -> Result<Self, DataError> {
        Ok(BatchIter { store, rows: row_stream(store, layout, per_device, cursor)?, per_device })
    }

    /// Where the next batch starts; save it with a checkpoint.
    pub fn cursor(&self) -> DataCursor {
        self.rows.cursor()
    }

    /// The next batch. Fails only when an input cannot be read again (changed, removed).
    pub fn next_batch(&mut self) -> Result<PackedBatch, DataError> {
        let mut batch = empty_batch(self.rows.layout.seq_len, self.per_device);
        let pad = self.rows.layout.pad_id;
        for _ in 0..self.per_device {
            let docs = fetch(self.store, Part::Train, self.rows.next_row())?;
            push_row(&mut batch, docs.iter().map(|d| d.sft()), pad);
        }
        Ok(batch)
    }
}

/// Endless [`PreferenceBatch`]es: `per_device` pairs, one answer per row, unpacked (DPO and
/// ORPO score each answer as a whole sequence).
pub struct PreferenceIter<'a> {
    store: &'a DocStore,
    rows: RowStream,
    per_device: usize,
}

impl<'a> PreferenceIter<'a> {
    pub(crate) fn new(
        store: &'a DocStore,
        layout: Layout,
        per_device: usize,
        cursor: DataCursor,
    ) -> Result<Self, DataError> {
        let layout = Layout { packing: false, ..layout };
        Ok(PreferenceIter { store, rows: row_stream(store, layout, per_device, cursor)?, per_device })
    }

    pub fn cursor(&self) -> DataCursor {
        self.rows.cursor()
    }

    pub fn next_batch(&mut self) -> Result<PreferenceBatch, DataError> {
        let (seq_len, pad) = (self.rows.layout.seq_len, self.rows.layout.pad_id);
        let mut chosen = empty_batch(seq_len, self.per_device);
        let mut rejected = empty_batch(seq_len, self.per_device);
        for _ in 0..self.per_device {
            let pair = self.rows.next_row()[0];
            let doc = self.store.get(Part::Train, pair)?;
            let Doc::Pair(c, r) = doc.as_ref() else {
                return Err(DataError::Config("only preference data yields preference batches".into()));
            };
            push_row(&mut chosen, [c], pad);
            push_row(&mut rejected, [r], pad);
        }
        Ok(PreferenceBatch { chosen, rejected })
    }
}

/// One pass over a part's documents in order (for evaluation): the last batch may hold fewer
/// rows. Preference pairs contribute their chosen side.
pub(crate) fn single_pass(
    store: &DocStore,
    part: Part,
    layout: Layout,
    per_device: usize,
) -> Result<Vec<PackedBatch>, DataError> {
    let docs = store.refs(part);
    let lens: Vec<usize> = docs.iter().map(|d| d.len as usize).collect();
    let order: Vec<usize> = (0..docs.len()).collect();
    let rows = plan_rows(&lens, &order, layout.seq_len, layout.packing);
    rows.chunks(per_device.max(1))
        .map(|chunk| {
            let mut batch = empty_batch(layout.seq_len, chunk.len());
            for row in chunk {
                let docs = fetch(store, part, row)?;
                push_row(&mut batch, docs.iter().map(|d| d.sft()), layout.pad_id);
            }
            Ok(batch)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::Encoded;

    fn encoded(n: usize) -> Vec<Encoded> {
        (0..n)
            .map(|d| {
                let len = 3 + d % 7;
                Encoded { ids: (0..len).map(|i| (d * 16 + i) as u32).collect(), targets: vec![true; len] }
            })
            .collect()
    }

    fn store(n: usize) -> DocStore {
        DocStore::in_memory(encoded(n).into_iter().map(Doc::Sft).collect(), 4)
    }

    fn layout(shuffle: bool) -> Layout {
        Layout { seq_len: 16, packing: true, shuffle, seed: 7, pad_id: 0 }
    }

    fn take(it: &mut BatchIter<'_>, n: usize) -> Vec<PackedBatch> {
        (0..n).map(|_| it.next_batch().unwrap()).collect()
    }

    #[test]
    fn resuming_from_a_saved_cursor_continues_exactly() {
        let docs = store(53);
        for stop_after in [0, 1, 5, 9, 23] {
            let mut run = BatchIter::new(&docs, layout(true), 3, DataCursor::default()).unwrap();
            take(&mut run, stop_after);
            let saved = run.cursor();
            let json = serde_json::to_string(&saved).unwrap();
            let want = take(&mut run, 12);
            let restored: DataCursor = serde_json::from_str(&json).unwrap();
            let resumed = take(&mut BatchIter::new(&docs, layout(true), 3, restored).unwrap(), 12);
            assert_eq!(resumed, want, "resumed after {stop_after} batches at {saved:?}");
        }
    }

    #[test]
    fn every_epoch_covers_every_document_once_in_a_new_order() {
        let n = 40;
        let a = epoch_order(n, 7, 0, true);
        let b = epoch_order(n, 7, 1, true);
        assert_ne!(a, b);
        assert_eq!(a, epoch_order(n, 7, 0, true));
        assert_ne!(a, epoch_order(n, 8, 0, true));
        let mut sorted = a.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..n).collect::<Vec<_>>());
        assert_eq!(epoch_order(5, 7, 3, false), vec![0, 1, 2, 3, 4]);
    }

    /// Over many blocks and windows: every document once per epoch, each window made of
    /// whole blocks, and the order fixed by seed and epoch.
    #[test]
    fn windows_hold_whole_blocks_and_cover_everything() {
        let per_block = 1000u32;
        let docs: Vec<DocRef> =
            (0..30_000u32).map(|i| DocRef { block: i / per_block, row: i % per_block, len: 1049 }).collect();
        let order = window_order(&docs, 3, 0, true);
        let mut sorted = order.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..docs.len()).collect::<Vec<_>>());
        assert_eq!(order, window_order(&docs, 3, 0, true));
        assert_ne!(order, window_order(&docs, 3, 1, true));
        // ~1.05M tokens a block, 8M a window: the first 8 blocks' documents come first, mixed.
        let first: std::collections::BTreeSet<u32> = order[..8000].iter().map(|&i| docs[i].block).collect();
        assert_eq!(first.len(), 8, "{first:?}");
        let firsts: Vec<u32> = order[..20].iter().map(|&i| docs[i].block).collect();
        assert!(firsts.windows(2).any(|w| w[0] != w[1]), "documents are shuffled within a window");
        assert_eq!(window_order(&docs, 3, 0, false), (0..docs.len()).collect::<Vec<_>>());
    }

    #[test]
    fn batches_are_full_and_cross_into_the_next_epoch() {
        let docs = store(10);
        let mut it = BatchIter::new(&docs, layout(false), 4, DataCursor::default()).unwrap();
        let epoch_rows = plan_epoch(&docs.train, layout(false), 0);
        let mut epochs_seen = 0;
        for _ in 0..10 {
            let b = it.next_batch().unwrap();
            assert_eq!(b.batch, 4);
            assert_eq!(b.input_ids.len(), 64);
            epochs_seen = it.cursor().epoch;
        }
        assert!(epochs_seen >= 40 / epoch_rows.len() as u64 - 1);
    }

    #[test]
    fn a_cursor_past_the_epoch_is_rejected() {
        let docs = store(5);
        let err = BatchIter::new(&docs, layout(true), 2, DataCursor { epoch: 0, position: 99 }).err().unwrap();
        assert!(matches!(err, DataError::BadCursor { .. }), "{err}");
        assert!(BatchIter::new(&docs, layout(true), 0, DataCursor::default()).is_err());
        assert!(BatchIter::new(&DocStore::in_memory(vec![], 4), layout(true), 1, DataCursor::default()).is_err());
    }

    #[test]
    fn preference_rows_pair_up_and_resume() {
        let d = encoded(9);
        let pairs: Vec<Doc> = d
            .chunks(3)
            .flat_map(|c| [Doc::Pair(c[0].clone(), c[1].clone()), Doc::Pair(c[1].clone(), c[2].clone())])
            .collect();
        let store = DocStore::in_memory(pairs, 4);
        let mut it = PreferenceIter::new(&store, layout(true), 2, DataCursor::default()).unwrap();
        let first = it.next_batch().unwrap();
        assert_eq!(first.chosen.batch, 2);
        assert_eq!(first.rejected.batch, 2);
        // One answer per row: segment 1 then padding.
        assert!(first.chosen.segment_ids.iter().all(|&s| s <= 1));
        let cursor = it.cursor();
        let want: Vec<_> = (0..5).map(|_| it.next_batch().unwrap()).collect();
        let mut again = PreferenceIter::new(&store, layout(true), 2, cursor).unwrap();
        let got: Vec<_> = (0..5).map(|_| again.next_batch().unwrap()).collect();
        assert_eq!(got, want);
    }

    #[test]
    fn single_pass_keeps_order_and_a_short_last_batch() {
        let docs = store(7);
        let l = Layout { packing: false, ..layout(false) };
        let batches = single_pass(&docs, Part::Train, l, 3).unwrap();
        assert_eq!(batches.iter().map(|b| b.batch).collect::<Vec<_>>(), vec![3, 3, 1]);
        assert_eq!(batches[0].input_ids[0], 0);
        assert_eq!(batches[0].input_ids[16], 16);
    }
}
