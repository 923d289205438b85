//! An endless, resumable stream of batches.
//!
//! Epoch `e` shuffles the documents with a key derived from (seed, e) and packs them in that
//! order; rows are read in sequence, a batch takes the next `per_device` rows and may run
//! into the next epoch, so every batch is full. A [`DataCursor`] (epoch, row) is all the
//! state there is: a stream opened at a saved cursor yields exactly the batches the original
//! stream would have yielded next.

use rand_chacha::ChaCha8Rng;
use rand_chacha::rand_core::{RngCore, SeedableRng};
use serde::{Deserialize, Serialize};

use super::error::DataError;
use super::pack::{empty_batch, plan_rows, push_row};
use super::template::Encoded;
use crate::batch::{PackedBatch, PreferenceBatch};

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
    let mut order: Vec<usize> = (0..n).collect();
    if !shuffle {
        return order;
    }
    let mut key = blake3::Hasher::new_derive_key("mindxtrain data shuffle v1");
    key.update(&seed.to_le_bytes());
    key.update(&epoch.to_le_bytes());
    let mut rng = ChaCha8Rng::from_seed(*key.finalize().as_bytes());
    for i in (1..n).rev() {
        // Multiply-shift maps 64 random bits onto 0..=i; its bias is below 2^-40 here.
        let j = ((u128::from(rng.next_u64()) * (i as u128 + 1)) >> 64) as usize;
        order.swap(i, j);
    }
    order
}

/// Row plans epoch after epoch, with the read position.
struct RowStream {
    lens: Vec<usize>,
    layout: Layout,
    epoch: u64,
    rows: Vec<Vec<usize>>,
    position: usize,
}

impl RowStream {
    fn new(lens: Vec<usize>, layout: Layout, cursor: DataCursor) -> Result<RowStream, DataError> {
        let bad = |reason: &str| DataError::BadCursor {
            epoch: cursor.epoch,
            position: cursor.position,
            reason: reason.to_owned(),
        };
        if lens.is_empty() {
            return Err(bad("there is nothing to read"));
        }
        let mut stream = RowStream { lens, layout, epoch: cursor.epoch, rows: Vec::new(), position: 0 };
        stream.rows = stream.plan(cursor.epoch);
        let position = usize::try_from(cursor.position).map_err(|_| bad("position out of range"))?;
        if position > stream.rows.len() {
            return Err(bad(&format!("the epoch has only {} rows; is this the same dataset?", stream.rows.len())));
        }
        stream.position = position;
        Ok(stream)
    }

    fn plan(&self, epoch: u64) -> Vec<Vec<usize>> {
        let l = &self.layout;
        let order = epoch_order(self.lens.len(), l.seed, epoch, l.shuffle);
        plan_rows(&self.lens, &order, l.seq_len, l.packing)
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

/// Endless [`PackedBatch`]es of `per_device` rows.
pub struct BatchIter<'a> {
    docs: &'a [Encoded],
    rows: RowStream,
    per_device: usize,
}

impl<'a> BatchIter<'a> {
    pub fn new(docs: &'a [Encoded], layout: Layout, per_device: usize, cursor: DataCursor) -> Result<Self, DataError> {
        if per_device == 0 {
            return Err(DataError::Config("per_device batch size must be at least 1".into()));
        }
        let lens = docs.iter().map(|d| d.ids.len()).collect();
        Ok(BatchIter { docs, rows: RowStream::new(lens, layout, cursor)?, per_device })
    }

    /// Where the next batch starts; save it with a checkpoint.
    pub fn cursor(&self) -> DataCursor {
        self.rows.cursor()
    }

    pub fn next_batch(&mut self) -> PackedBatch {
        let mut batch = empty_batch(self.rows.layout.seq_len, self.per_device);
        let pad = self.rows.layout.pad_id;
        for _ in 0..self.per_device {
            let row = self.rows.next_row();
            push_row(&mut batch, self.docs, row, pad);
        }
        batch
    }
}

impl Iterator for BatchIter<'_> {
    type Item = PackedBatch;
    fn next(&mut self) -> Option<PackedBatch> {
        Some(self.next_batch())
    }
}

/// Endless [`PreferenceBatch`]es: `per_device` pairs, one answer per row, unpacked (DPO and
/// ORPO score each answer as a whole sequence).
pub struct PreferenceIter<'a> {
    pairs: &'a [(Encoded, Encoded)],
    rows: RowStream,
    per_device: usize,
}

impl<'a> PreferenceIter<'a> {
    pub fn new(
        pairs: &'a [(Encoded, Encoded)],
        layout: Layout,
        per_device: usize,
        cursor: DataCursor,
    ) -> Result<Self, DataError> {
        if per_device == 0 {
            return Err(DataError::Config("per_device batch size must be at least 1".into()));
        }
        let layout = Layout { packing: false, ..layout };
        let lens = pairs.iter().map(|(c, r)| c.ids.len().max(r.ids.len())).collect();
        Ok(PreferenceIter { pairs, rows: RowStream::new(lens, layout, cursor)?, per_device })
    }

    pub fn cursor(&self) -> DataCursor {
        self.rows.cursor()
    }

    pub fn next_batch(&mut self) -> PreferenceBatch {
        let (seq_len, pad) = (self.rows.layout.seq_len, self.rows.layout.pad_id);
        let mut chosen = empty_batch(seq_len, self.per_device);
        let mut rejected = empty_batch(seq_len, self.per_device);
        for _ in 0..self.per_device {
            let pair = self.rows.next_row()[0];
            let (c, r) = &self.pairs[pair];
            push_row(&mut chosen, std::slice::from_ref(c), &[0], pad);
            push_row(&mut rejected, std::slice::from_ref(r), &[0], pad);
        }
        PreferenceBatch { chosen, rejected }
    }
}

impl Iterator for PreferenceIter<'_> {
    type Item = PreferenceBatch;
    fn next(&mut self) -> Option<PreferenceBatch> {
        Some(self.next_batch())
    }
}

/// One pass over `docs` in order (for evaluation): the last batch may hold fewer rows.
pub fn single_pass(docs: &[Encoded], layout: Layout, per_device: usize) -> Vec<PackedBatch> {
    let lens: Vec<usize> = docs.iter().map(|d| d.ids.len()).collect();
    let order: Vec<usize> = (0..docs.len()).collect();
    let rows = plan_rows(&lens, &order, layout.seq_len, layout.packing);
    rows.chunks(per_device.max(1))
        .map(|chunk| {
            let mut batch = empty_batch(layout.seq_len, chunk.len());
            for row in chunk {
                push_row(&mut batch, docs, row, layout.pad_id);
            }
            batch
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn docs(n: usize) -> Vec<Encoded> {
        (0..n)
            .map(|d| {
                let len = 3 + d % 7;
                Encoded { ids: (0..len).map(|i| (d * 16 + i) as u32).collect(), targets: vec![true; len] }
            })
            .collect()
    }

    fn layout(shuffle: bool) -> Layout {
        Layout { seq_len: 16, packing: true, shuffle, seed: 7, pad_id: 0 }
    }

    #[test]
    fn resuming_from_a_saved_cursor_continues_exactly() {
        let docs = docs(53);
        for stop_after in [0, 1, 5, 9, 23] {
            let mut run = BatchIter::new(&docs, layout(true), 3, DataCursor::default()).unwrap();
            let _: Vec<_> = run.by_ref().take(stop_after).collect();
            let saved = run.cursor();
            let json = serde_json::to_string(&saved).unwrap();
            let want: Vec<PackedBatch> = run.take(12).collect();
            let restored: DataCursor = serde_json::from_str(&json).unwrap();
            let resumed: Vec<PackedBatch> =
                BatchIter::new(&docs, layout(true), 3, restored).unwrap().take(12).collect();
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

    #[test]
    fn batches_are_full_and_cross_into_the_next_epoch() {
        let docs = docs(10);
        let mut it = BatchIter::new(&docs, layout(false), 4, DataCursor::default()).unwrap();
        let epoch_rows =
            plan_rows(&docs.iter().map(|d| d.ids.len()).collect::<Vec<_>>(), &(0..10).collect::<Vec<_>>(), 16, true);
        let mut epochs_seen = 0;
        for _ in 0..10 {
            let b = it.next_batch();
            assert_eq!(b.batch, 4);
            assert_eq!(b.input_ids.len(), 64);
            epochs_seen = it.cursor().epoch;
        }
        assert!(epochs_seen >= 40 / epoch_rows.len() as u64 - 1);
    }

    #[test]
    fn a_cursor_past_the_epoch_is_rejected() {
        let docs = docs(5);
        let err = BatchIter::new(&docs, layout(true), 2, DataCursor { epoch: 0, position: 99 }).err().unwrap();
        assert!(matches!(err, DataError::BadCursor { .. }), "{err}");
        assert!(BatchIter::new(&docs, layout(true), 0, DataCursor::default()).is_err());
        assert!(BatchIter::new(&[], layout(true), 1, DataCursor::default()).is_err());
    }

    #[test]
    fn preference_rows_pair_up_and_resume() {
        let d = docs(9);
        let pairs: Vec<(Encoded, Encoded)> =
            d.chunks(3).flat_map(|c| [(c[0].clone(), c[1].clone()), (c[1].clone(), c[2].clone())]).collect();
        let mut it = PreferenceIter::new(&pairs, layout(true), 2, DataCursor::default()).unwrap();
        let first = it.next_batch();
        assert_eq!(first.chosen.batch, 2);
        assert_eq!(first.rejected.batch, 2);
        // One answer per row: segment 1 then padding.
        assert!(first.chosen.segment_ids.iter().all(|&s| s <= 1));
        let cursor = it.cursor();
        let want: Vec<_> = it.take(5).collect();
        let got: Vec<_> = PreferenceIter::new(&pairs, layout(true), 2, cursor).unwrap().take(5).collect();
        assert_eq!(got, want);
    }

    #[test]
    fn single_pass_keeps_order_and_a_short_last_batch() {
        let docs = docs(7);
        let l = Layout { packing: false, ..layout(false) };
        let batches = single_pass(&docs, l, 3);
        assert_eq!(batches.iter().map(|b| b.batch).collect::<Vec<_>>(), vec![3, 3, 1]);
        assert_eq!(batches[0].input_ids[0], 0);
        assert_eq!(batches[0].input_ids[16], 16);
    }
}
