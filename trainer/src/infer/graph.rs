//! Decode steps replayed as CUDA graphs, one graph per batch-size bucket.
//!
//! A decode step of a 36-layer model is ~470 launches; at small batches the host takes longer
//! to issue them than the GPU takes to run them (`serve_bench probe`). A step whose every
//! sequence decodes one token is padded up to a bucket (1, 2, 4, … 256
//! rows) and run with its inputs in one buffer per bucket: token ids, positions, cache slots,
//! the rows to sample and the attention metadata, with every block table padded to the width
//! `max_model_len` needs and the attention's split over keys planned for that length. Such a
//! step's launches are the same at every step of its bucket, so the bucket's first step runs
//! directly (it loads kernels and library workspaces) and is then recorded
//! ([`mindxtrain_kernels::graph`]); later steps overwrite the buffer and replay the graph.
//! Padding rows decode token 0 at position 0 over one spare cache block that the runner keeps
//! beside the scheduler's blocks, so they never touch a sequence's keys; their logits are not
//! sampled. Rows of served adapters decode in graphs of their own (the bucket's adapter slots in
//! a second buffer); a graph reads the adapter stack where it was, so loading or evicting an
//! adapter drops the recorded graphs. A recurrent model's rows carry their state slots in the
//! buffer too (padding rows a spare slot of their own, `model::StateSlots::Device`). Prefill
//! chunks and MoE layers (whose routing is decided on the host) run directly.

use std::collections::HashMap;

use candle_core::{Device, Tensor};
use mindxtrain_kernels::graph::{self, Graph};
use mindxtrain_kernels::multi_lora::RowAdapters;
use mindxtrain_kernels::paged_attention::{PagedMeta, SeqSlice};

use super::runner::StepSeq;

/// Batch sizes a decode step is padded up to.
pub const BUCKETS: [usize; 9] = [1, 2, 4, 8, 16, 32, 64, 128, 256];

/// The smallest bucket that holds `rows`, if any does.
pub fn bucket_for(rows: usize) -> Option<usize> {
    BUCKETS.iter().copied().find(|&b| b >= rows)
}

/// One padded decode step: its inputs as one array of u32 words, and its attention metadata.
pub struct DecodeBatch {
    rows: usize,
    width: usize,
    words: Vec<u32>,
    meta: PagedMeta,
    /// Each row's adapter slot (padding rows: none).
    adapters: Vec<Option<u32>>,
}

/// Where each input sits in a bucket's buffer (views share the buffer's storage).
pub struct DecodeViews {
    pub ids: Tensor,
    pub positions: Tensor,
    pub slots: Tensor,
    pub logit_rows: Tensor,
    pub meta: [Tensor; 3],
    /// A recurrent model's state slot of each row, and 1 where the row continues its state.
    pub state_slots: Tensor,
    pub continues: Tensor,
}

impl DecodeBatch {
    /// `seqs` (each one decode token) padded to `bucket` rows, block tables
    /// `width` blocks wide, padding rows over block `spare` and state slot `spare_state`.
    pub fn new(
        seqs: &[StepSeq<'_>],
        bucket: usize,
        block_size: usize,
        width: usize,
        (spare, spare_state): (u32, u32),
    ) -> candle_core::Result<DecodeBatch> {
        if seqs.is_empty() || seqs.len() > bucket || seqs.iter().any(|s| s.tokens.len() != 1) {
            candle_core::bail!("decode batch: {} sequences for a bucket of {bucket}, one token each", seqs.len());
        }
        let spare_table = [spare];
        let mut slices: Vec<SeqSlice<'_>> =
            seqs.iter().map(|s| SeqSlice { query_len: 1, context_len: s.start + 1, blocks: s.blocks }).collect();
        slices.resize(bucket, SeqSlice { query_len: 1, context_len: 1, blocks: &spare_table });
        let meta = PagedMeta::fixed(block_size, &slices, width)?;
        let mut words = Vec::with_capacity(layout_len(bucket, width));
        words.extend(seqs.iter().map(|s| s.tokens[0]));
        words.resize(bucket, 0);
        let position = |s: &StepSeq<'_>| u32::try_from(s.start).unwrap_or(u32::MAX);
        words.extend(seqs.iter().map(position));
        words.resize(2 * bucket, 0);
        words.extend(meta.slots());
        words.extend(0..bucket as u32);
        for array in meta.host_arrays() {
            words.extend_from_slice(array);
        }
        // A recurrent model's state slots (padding rows share the spare one), and whether each
        // row continues a state (a sequence's first token starts from zeros).
        words.extend(seqs.iter().map(|s| s.state_slot.unwrap_or(spare_state)));
        words.resize(words.len() + bucket - seqs.len(), spare_state);
        words.extend(seqs.iter().map(|s| u32::from(s.start > 0)));
        words.resize(words.len() + bucket - seqs.len(), 0);
        debug_assert_eq!(words.len(), layout_len(bucket, width));
        let mut adapters: Vec<Option<u32>> = seqs.iter().map(|s| s.adapter).collect();
        adapters.resize(bucket, None);
        Ok(DecodeBatch { rows: bucket, width, words, meta, adapters })
    }

    /// Whether any row runs an adapter (such steps have graphs of their own).
    pub fn uses_adapters(&self) -> bool {
        self.adapters.iter().any(Option::is_some)
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn words(&self) -> &[u32] {
        &self.words
    }

    /// The attention metadata over `views.meta`.
    pub fn meta_on(&self, views: &DecodeViews) -> candle_core::Result<PagedMeta> {
        self.meta.clone().with_device_arrays(views.meta.clone())
    }

    /// The inputs' views into `buffer` (this batch's words, on the model's device).
    pub fn views(&self, buffer: &Tensor) -> candle_core::Result<DecodeViews> {
        let (b, w) = (self.rows, self.width);
        let lens = sections(b, w);
        let mut at = 0;
        let mut next = |n: usize| {
            let v = buffer.narrow(0, at, n);
            at += n;
            v
        };
        let (ids, positions, slots, logit_rows) = (next(lens[0])?, next(lens[1])?, next(lens[2])?, next(lens[3])?);
        let meta = [next(lens[4])?, next(lens[5])?, next(lens[6])?.reshape((b, w))?];
        let (state_slots, continues) = (next(lens[7])?, next(lens[8])?);
        Ok(DecodeViews { ids, positions, slots, logit_rows, meta, state_slots, continues })
    }
}

/// Lengths of a bucket's buffer sections, in order: ids, positions, slots, sampled rows, query
/// starts, context lengths, block tables, state slots, whether each row continues its state.
fn sections(bucket: usize, width: usize) -> [usize; 9] {
    [bucket, bucket, bucket, bucket, bucket + 1, bucket, bucket * width, bucket, bucket]
}

fn layout_len(bucket: usize, width: usize) -> usize {
    sections(bucket, width).iter().sum()
}

/// A bucket's recorded step and the buffers it replays over.
struct Recorded {
    graph: Graph,
    /// The inputs, overwritten before each replay.
    buffer: Tensor,
    /// `[bucket]` i32 adapter slots, overwritten before each replay (graphs with adapters).
    adapter_ids: Option<Tensor>,
    /// `[bucket, vocab]`: where the graph leaves the logits.
    logits: Tensor,
    /// Holds the attention plan's device array the graph reads.
    _meta: PagedMeta,
}

/// The recorded buckets of one runner. Dropped (and so re-recorded) when the weights or the
/// adapter stack change: a graph holds the addresses of the tensors it read.
#[derive(Default)]
pub struct DecodeGraphs {
    /// By bucket and whether its rows run adapters.
    recorded: HashMap<(usize, bool), Recorded>,
    /// Why a recording failed, after which every step runs directly.
    refused: Option<String>,
}

impl DecodeGraphs {
    pub fn clear(&mut self) {
        self.recorded.clear();
    }

    /// The recorded buckets, smallest first.
    pub fn buckets(&self) -> Vec<usize> {
        let mut b: Vec<usize> = self.recorded.keys().map(|k| k.0).collect();
        b.sort_unstable();
        b.dedup();
        b
    }

    /// Why recording was given up, if it was.
    pub fn refused(&self) -> Option<&str> {
        self.refused.as_deref()
    }

    /// The logits `[batch rows, vocab]` of `batch`: replayed when its bucket is recorded,
    /// otherwise run by `forward` directly and then recorded. `forward` runs the model over
    /// the views (and row adapters) it is given and returns the logits of every row. `drawn`:
    /// ids on the device that replace the batch's first token ids (a step queued before the
    /// host read what the step before it drew).
    pub fn run(
        &mut self,
        device: &Device,
        batch: &DecodeBatch,
        drawn: Option<&Tensor>,
        forward: impl Fn(&DecodeViews, &PagedMeta, Option<&RowAdapters>) -> candle_core::Result<Tensor>,
    ) -> candle_core::Result<Tensor> {
        let fresh = Tensor::new(batch.words(), device)?;
        let take_drawn = |buffer: &Tensor| match drawn {
            // The ids are the buffer's first section.
            Some(ids) => graph::overwrite(&buffer.narrow(0, 0, ids.elem_count())?, ids),
            None => Ok(()),
        };
        let lora = batch.uses_adapters();
        let fresh_ids =
            lora.then(|| Tensor::new(RowAdapters::slot_ids(&batch.adapters).as_slice(), device)).transpose()?;
        if let Some(r) = self.recorded.get(&(batch.rows(), lora)) {
            graph::overwrite(&r.buffer, &fresh)?;
            take_drawn(&r.buffer)?;
            if let (Some(dst), Some(src)) = (&r.adapter_ids, &fresh_ids) {
                graph::overwrite(dst, src)?;
            }
            r.graph.replay()?;
            return Ok(r.logits.clone());
        }
        // The first step of the bucket runs directly, over the buffers it will be recorded with.
        let (buffer, adapter_ids) = (fresh, fresh_ids);
        take_drawn(&buffer)?;
        let views = batch.views(&buffer)?;
        let meta = batch.meta_on(&views)?;
        let rows = adapter_ids.clone().map(|ids| RowAdapters::on_device(batch.adapters.clone(), ids)).transpose()?;
        let record = self.refused.is_none() && device.is_cuda();
        let (logits, recording) = graph::with_host_copies_cached(device, || {
            let logits = forward(&views, &meta, rows.as_ref())?;
            if !record {
                return Ok((logits, None));
            }
            let kept = logits.zeros_like()?;
            let recording = graph::capture(device, || {
                let out = forward(&views, &meta, rows.as_ref())?;
                graph::overwrite(&kept, &out)
            });
            Ok::<_, candle_core::Error>((logits, Some(recording.map(|g| (g, kept)))))
        })?;
        let Some(recording) = recording else {
            return Ok(logits);
        };
        match recording {
            Ok((graph, kept)) => {
                let r = Recorded { graph, buffer, adapter_ids, logits: kept, _meta: meta };
                self.recorded.insert((batch.rows(), lora), r);
            }
            Err(e) => {
                tracing::warn!(error = %e, "decode steps run without CUDA graphs: recording one failed");
                self.refused = Some(e.to_string());
            }
        }
        Ok(logits)
    }
}
