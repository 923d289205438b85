//! Splitting an optimizer step's rows into the plan's micro-batches and summing their
//! gradients.

use crate::batch::{PackedBatch, PreferenceBatch};
use candle_core::Tensor;
use std::collections::BTreeMap;

/// Rows `[start, start + rows)` of `batch`.
fn rows(batch: &PackedBatch, start: usize, n: usize) -> PackedBatch {
    let t = batch.seq_len;
    let span = start * t..(start + n) * t;
    PackedBatch {
        batch: n,
        seq_len: t,
        input_ids: batch.input_ids[span.clone()].to_vec(),
        position_ids: batch.position_ids[span.clone()].to_vec(),
        segment_ids: batch.segment_ids[span.clone()].to_vec(),
        labels: batch.labels[span].to_vec(),
    }
}

/// `batch` cut into consecutive pieces of `micro` rows (the last may be shorter).
pub fn split(batch: &PackedBatch, micro: usize) -> Vec<PackedBatch> {
    let micro = micro.max(1);
    (0..batch.batch).step_by(micro).map(|s| rows(batch, s, micro.min(batch.batch - s))).collect()
}

pub fn split_pairs(batch: &PreferenceBatch, micro: usize) -> Vec<PreferenceBatch> {
    split(&batch.chosen, micro)
        .into_iter()
        .zip(split(&batch.rejected, micro))
        .map(|(chosen, rejected)| PreferenceBatch { chosen, rejected })
        .collect()
}

/// Adds `grads` into `acc` (in name order, so the sum is deterministic).
pub fn accumulate(acc: &mut BTreeMap<String, Tensor>, grads: BTreeMap<String, Tensor>) -> candle_core::Result<()> {
    for (name, g) in grads {
        match acc.get_mut(&name) {
            Some(a) => *a = (&*a + &g)?,
            None => {
                acc.insert(name, g);
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batch(rows: usize, t: usize) -> PackedBatch {
        let n = rows * t;
        PackedBatch {
            batch: rows,
            seq_len: t,
            input_ids: (0..n as u32).collect(),
            position_ids: (0..n as u32).map(|i| i % t as u32).collect(),
            segment_ids: vec![1; n],
            labels: (0..n as i64).collect(),
        }
    }

    #[test]
    fn split_keeps_every_row_once_in_order() {
        let b = batch(5, 3);
        let parts = split(&b, 2);
        assert_eq!(parts.iter().map(|p| p.batch).collect::<Vec<_>>(), vec![2, 2, 1]);
        let ids: Vec<u32> = parts.iter().flat_map(|p| p.input_ids.clone()).collect();
        assert_eq!(ids, b.input_ids);
        assert_eq!(split(&b, 8).len(), 1);
    }

    #[test]
    fn accumulate_sums_by_name() {
        let dev = candle_core::Device::Cpu;
        let mut acc = BTreeMap::new();
        accumulate(&mut acc, BTreeMap::from([("a".to_string(), Tensor::new(&[1f32, 2.], &dev).unwrap())])).unwrap();
        accumulate(&mut acc, BTreeMap::from([("a".to_string(), Tensor::new(&[3f32, 4.], &dev).unwrap())])).unwrap();
        assert_eq!(acc["a"].to_vec1::<f32>().unwrap(), vec![4., 6.]);
    }
}
