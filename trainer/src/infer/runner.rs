//! The device side of a step: owns the model and the cache tensors, turns a schedule into one
//! flat batch (ids, positions, cache slots, block tables, adapter slots, the rows to sample),
//! runs the model's paged forward and samples on the device. Pure decode steps replay a CUDA
//! graph of their batch-size bucket ([`super::graph`]).

use std::sync::Mutex;

use candle_core::{Device, Tensor};
use mindxtrain_kernels::multi_lora::RowAdapters;
use mindxtrain_kernels::paged_attention::{PagedMeta, SeqSlice};
use mindxtrain_kernels::sampling::{Draws, RowSampling};

use super::graph::{self, DecodeBatch, DecodeGraphs};
use super::sampler;
use crate::model::StateSlots;
use crate::model::{AdapterStack, CausalLm, LayerCache, ModelError, PagedInputs, Params, RopeTables, StatePool};
use crate::model::{CacheSpec, LayerSpec};

/// One sequence's part of a step.
#[derive(Debug, Clone, Copy)]
pub struct StepSeq<'a> {
    /// The tokens that run (positions `start ..`).
    pub tokens: &'a [u32],
    pub start: usize,
    pub blocks: &'a [u32],
    /// Its adapter's slot in the stack (`None`: the base).
    pub adapter: Option<u32>,
    /// Settings of the token to draw after the last of `tokens`, if one is drawn this step.
    pub sample: Option<RowSampling>,
    /// Its recurrent state's slot (`KvManager::state_slot`), for a model with recurrent layers.
    pub state_slot: Option<u32>,
}

/// A step's logits `[R, vocab]`, one row per sequence that samples (or one unused row when
/// none does), with each row's sampling settings.
pub struct StepLogits {
    pub logits: Tensor,
    pub sampling: Vec<RowSampling>,
}

/// A step queued on the device with its draws ([`Runner::launch`]).
pub struct Launched(Option<Draws>);

impl Launched {
    /// The ids this step drew, on the device (`None` when no sequence samples).
    pub fn ids(&self) -> Option<&Tensor> {
        self.0.as_ref().map(Draws::ids)
    }

    /// `(token, log-probability)` for each sequence that samples, in order; waits for them.
    pub fn read(self) -> Result<Vec<(u32, f32)>, ModelError> {
        Ok(self.0.map(Draws::read).transpose()?.unwrap_or_default())
    }
}

/// How a runner is sized.
#[derive(Debug, Clone, Copy)]
pub struct RunnerConfig {
    pub block_size: usize,
    /// Cache blocks the scheduler hands out.
    pub blocks: usize,
    /// Recurrent state slots per recurrent layer (one per running sequence; unused by an
    /// attention-only model). The runner keeps one more, which a padded step's padding rows use.
    pub state_slots: usize,
    /// Ids at or above this are never drawn.
    pub vocab: usize,
    /// The longest a sequence gets (positions and block tables are sized for it).
    pub max_model_len: usize,
    /// Replay pure decode steps as CUDA graphs (on a CUDA device, for a model without MoE layers).
    pub cuda_graphs: bool,
}

pub struct Runner {
    model: CausalLm,
    cache: Vec<LayerCache>,
    spec: CacheSpec,
    config: RunnerConfig,
    rope: RopeTables,
    /// `Some` when decode steps may replay graphs.
    graphs: Option<Mutex<DecodeGraphs>>,
}

impl Runner {
    /// Packs the model's projection groups (`CausalLm::pack_projections`), then allocates what
    /// each layer's cache spec asks for on its device: `config.blocks` blocks per attention layer,
    /// and one more: the block that a graph's padding rows write to; `config.state_slots` state
    /// slots per recurrent layer, and one more for the padding rows likewise.
    pub fn new(mut model: CausalLm, config: RunnerConfig) -> Result<Runner, ModelError> {
        model.pack_projections()?;
        let spec = model.cache_spec(config.block_size);
        let cache = spec
            .layers
            .iter()
            .map(|layer| match *layer {
                LayerSpec::Attention { kv_heads, head_dim } => {
                    let dims = (config.blocks + 1, config.block_size, kv_heads, head_dim);
                    let z = || Tensor::zeros(dims, spec.dtype, model.device());
                    Ok(LayerCache::Attention { k: z()?, v: z()? })
                }
                LayerSpec::Recurrent { .. } => {
                    let slots = config.state_slots + 1;
                    Ok(LayerCache::Recurrent(StatePool::new(layer, slots, spec.dtype, model.device())?))
                }
            })
            .collect::<Result<Vec<_>, ModelError>>()?;
        let rope = RopeTables::new(&model, config.max_model_len)?;
        let c = model.config();
        let device_metadata = mindxtrain_kernels::paged_attention::reads_device_metadata(
            model.device(),
            model.dtype(),
            c.num_attention_heads,
            c.num_key_value_heads,
            c.head_dim,
        );
        let graphable = config.cuda_graphs && device_metadata && c.moe.is_none();
        if graphable {
            mindxtrain_kernels::graph::pin_blas_workspace(model.device())?;
        }
        let graphs = graphable.then(|| Mutex::new(DecodeGraphs::default()));
        Ok(Runner { model, cache, spec, config, rope, graphs })
    }

    pub fn model(&self) -> &CausalLm {
        &self.model
    }

    /// Replaces the model's dense weights with `params` of the same names, shapes and dtype.
    pub fn set_weights(&mut self, params: Params) -> Result<(), ModelError> {
        let old = self.model.params();
        if let Some(name) = params.keys().find(|n| !old.contains_key(*n)) {
            return Err(ModelError::UnexpectedParam(name.clone()));
        }
        for (name, t) in old {
            let new = params.get(name).ok_or_else(|| ModelError::MissingParam(name.clone()))?;
            if new.dims() != t.dims() {
                return Err(ModelError::Shape {
                    name: name.clone(),
                    expected: t.dims().to_vec(),
                    got: new.dims().to_vec(),
                });
            }
            if new.dtype() != t.dtype() {
                return Err(ModelError::DType { name: name.clone(), expected: t.dtype(), got: new.dtype() });
            }
        }
        *self.model.params_mut() = params;
        self.model.pack_projections()?;
        // The recorded graphs read the old weights' addresses.
        self.clear_graphs();
        Ok(())
    }

    pub fn device(&self) -> &Device {
        self.model.device()
    }

    /// Runs one step; returns `(token, log-probability)` for each sequence that samples, in order.
    pub fn step(&self, seqs: &[StepSeq<'_>], adapters: Option<&AdapterStack>) -> Result<Vec<(u32, f32)>, ModelError> {
        self.launch(seqs, adapters, None)?.read()
    }

    /// Queues one step and its sampling on the device and returns without waiting for either.
    /// `drawn`: the ids a step launched before this one drew (`[seqs.len()]` u32 on the device,
    /// [`Launched::ids`]), decoded here in place of each sequence's one token, so that this step
    /// can be queued before the host has read them: every sequence must then decode exactly one
    /// token (its `tokens` are not read) and sample. Every step must be queued from one thread:
    /// candle's CUDA work goes to the calling thread's stream ([`super::Engine`] keeps one).
    pub fn launch(
        &self,
        seqs: &[StepSeq<'_>],
        adapters: Option<&AdapterStack>,
        drawn: Option<&Tensor>,
    ) -> Result<Launched, ModelError> {
        if let Some(ids) = drawn
            && (ids.dims() != [seqs.len()] || seqs.iter().any(|s| s.tokens.len() != 1 || s.sample.is_none()))
        {
            return Err(ModelError::Batch(format!(
                "{} drawn ids for {} sequences: each must decode one token and sample",
                ids.elem_count(),
                seqs.len()
            )));
        }
        let step = match self.decode_graphs(seqs, adapters) {
            Some((graphs, bucket)) => self.forward_bucketed(seqs, bucket, graphs, adapters, drawn)?,
            None => self.forward_drawn(seqs, adapters, drawn)?,
        };
        if step.sampling.is_empty() {
            return Ok(Launched(None));
        }
        Ok(Launched(Some(sampler::launch(&step.logits, &step.sampling, self.config.vocab)?)))
    }

    /// The graphs and the bucket of a step that may replay one: every sequence decodes one
    /// sampled token (with the base model, or an adapter of the stack).
    fn decode_graphs(
        &self,
        seqs: &[StepSeq<'_>],
        adapters: Option<&AdapterStack>,
    ) -> Option<(&Mutex<DecodeGraphs>, usize)> {
        let graphs = self.graphs.as_ref()?;
        let width = self.table_width();
        let decode = seqs.iter().all(|s| {
            s.tokens.len() == 1
                && s.sample.is_some()
                && s.blocks.len() <= width
                && (s.adapter.is_none() || adapters.is_some())
                && (s.state_slot.is_some() || !self.spec.is_recurrent())
        });
        if !decode || graphs.lock().map_or(true, |g| g.refused().is_some()) {
            return None;
        }
        Some((graphs, graph::bucket_for(seqs.len())?))
    }

    /// Records the decode step of every bucket up to the one holding `rows` sequences as a CUDA
    /// graph now, as serving engines do when they start: a bucket's first step otherwise runs
    /// directly, then is captured and instantiated, inside a request's time (~30 ms of a
    /// 64-stream load at the 8B shape on an H200). Every row is padding: one token at position 0
    /// of the spare block, which no sequence holds. Nothing to do without graphs or on a CPU
    /// (where a bucket's step would only run directly). Call it from the thread that queues
    /// the steps: the graphs replay on its stream.
    pub fn record_decode_graphs(&self, rows: usize) -> Result<(), ModelError> {
        let Some(graphs) = self.graphs.as_ref().filter(|_| self.device().is_cuda()) else {
            return Ok(());
        };
        let spare = [self.spare_block()?];
        let last = graph::bucket_for(rows.max(1)).unwrap_or(graph::BUCKETS[graph::BUCKETS.len() - 1]);
        for bucket in graph::BUCKETS.into_iter().take_while(|&b| b <= last) {
            let pad = StepSeq {
                tokens: &[0],
                start: 0,
                blocks: &spare,
                adapter: None,
                sample: Some(RowSampling::GREEDY),
                state_slot: None,
            };
            self.forward_bucketed(&vec![pad; bucket], bucket, graphs, None, None)?;
        }
        Ok(())
    }

    /// Drops the recorded graphs: they read the adapter stack where it was when recorded.
    pub fn clear_graphs(&self) {
        if let Some(g) = &self.graphs {
            g.lock().unwrap_or_else(|e| e.into_inner()).clear();
        }
    }

    /// The batch-size buckets whose decode step has been recorded as a CUDA graph.
    pub fn graph_buckets(&self) -> Vec<usize> {
        self.graphs.as_ref().map_or(Vec::new(), |g| g.lock().map_or(Vec::new(), |g| g.buckets()))
    }

    /// Why decode steps stopped replaying graphs (a recording failed), if they did.
    pub fn graph_refusal(&self) -> Option<String> {
        self.graphs.as_ref()?.lock().ok()?.refused().map(str::to_owned)
    }

    /// The block past the pool's that a padded step's padding rows write to.
    fn spare_block(&self) -> Result<u32, ModelError> {
        u32::try_from(self.config.blocks).map_err(|_| ModelError::Batch("cache too large".into()))
    }

    /// The state slot past the scheduler's that a padded step's padding rows use.
    fn spare_state_slot(&self) -> Result<u32, ModelError> {
        u32::try_from(self.config.state_slots).map_err(|_| ModelError::Batch("too many state slots".into()))
    }

    /// Table width (blocks) every sequence fits in.
    fn table_width(&self) -> usize {
        self.config.max_model_len.div_ceil(self.config.block_size)
    }

    /// A decode step padded to `bucket` rows over fixed buffers (replayed as a graph on a
    /// CUDA device; run directly elsewhere, which is how the CPU tests check the padding).
    pub fn forward_bucketed(
        &self,
        seqs: &[StepSeq<'_>],
        bucket: usize,
        graphs: &Mutex<DecodeGraphs>,
        adapters: Option<&AdapterStack>,
        drawn: Option<&Tensor>,
    ) -> Result<StepLogits, ModelError> {
        self.check_inputs(seqs, drawn.is_some())?;
        let spare = (self.spare_block()?, self.spare_state_slot()?);
        let batch = DecodeBatch::new(seqs, bucket, self.config.block_size, self.table_width(), spare)?;
        let recurrent = self.spec.is_recurrent();
        let mut graphs = graphs.lock().unwrap_or_else(|e| e.into_inner());
        let logits = graphs.run(self.device(), &batch, drawn, |v, meta, rows| {
            let inputs = PagedInputs {
                ids: &v.ids,
                positions: &v.positions,
                rope: &self.rope,
                meta,
                slots: &v.slots,
                adapters: adapters.zip(rows),
                logit_rows: &v.logit_rows,
                state_slots: recurrent.then_some(StateSlots::Device { slots: &v.state_slots, continues: &v.continues }),
            };
            self.model.forward_paged(&inputs, &self.cache).map_err(|e| candle_core::Error::Msg(e.to_string()))
        })?;
        let sampling = seqs.iter().filter_map(|s| s.sample).collect();
        Ok(StepLogits { logits: logits.narrow(0, 0, seqs.len())?, sampling })
    }

    /// Ids inside the vocabulary and positions inside the RoPE tables, checked on the host: on
    /// the device either would be a read past a table's end. (Ids drawn on the device are
    /// drawn inside the vocabulary.)
    fn check_inputs(&self, seqs: &[StepSeq<'_>], drawn: bool) -> Result<(), ModelError> {
        let vocab = self.model.config().vocab_size;
        let host_ids = seqs.iter().filter(|_| !drawn).flat_map(|s| s.tokens);
        if let Some(id) = host_ids.copied().find(|&id| id as usize >= vocab) {
            return Err(ModelError::Batch(format!("id {id} is outside the vocabulary of {vocab}")));
        }
        let positions = self.rope.positions();
        match seqs.iter().find(|s| s.start + s.tokens.len() > positions) {
            Some(s) => Err(ModelError::Batch(format!(
                "positions up to {} are past max_model_len {positions}",
                s.start + s.tokens.len() - 1
            ))),
            None => Ok(()),
        }
    }

    /// Enqueues one step's forward (the cache writes included) and returns without waiting for
    /// the device: what [`Runner::step`] samples from. Split out so that a benchmark can tell
    /// the host's time to launch a step from the device's time to run it.
    pub fn forward(&self, seqs: &[StepSeq<'_>], adapters: Option<&AdapterStack>) -> Result<StepLogits, ModelError> {
        self.forward_drawn(seqs, adapters, None)
    }

    fn forward_drawn(
        &self,
        seqs: &[StepSeq<'_>],
        adapters: Option<&AdapterStack>,
        drawn: Option<&Tensor>,
    ) -> Result<StepLogits, ModelError> {
        self.check_inputs(seqs, drawn.is_some())?;
        let dev = self.model.device();
        let slices: Vec<SeqSlice> = seqs
            .iter()
            .map(|s| SeqSlice { query_len: s.tokens.len(), context_len: s.start + s.tokens.len(), blocks: s.blocks })
            .collect();
        let meta = PagedMeta::new(self.spec.block_size, &slices, dev)?;
        let mut ids = Vec::with_capacity(meta.rows());
        let mut positions = Vec::with_capacity(meta.rows());
        let mut rows = Vec::with_capacity(meta.rows());
        let (mut logit_rows, mut sampling) = (Vec::new(), Vec::new());
        for s in seqs {
            ids.extend_from_slice(s.tokens);
            positions.extend((s.start..s.start + s.tokens.len()).map(|p| p as u32));
            rows.extend(std::iter::repeat_n(s.adapter, s.tokens.len()));
            if let Some(row) = s.sample {
                logit_rows.push(ids.len() as u32 - 1);
                sampling.push(row);
            }
        }
        let slots = Tensor::new(meta.slots().as_slice(), dev)?;
        let state_slots = match self.spec.is_recurrent() {
            true => Some(
                seqs.iter()
                    .map(|s| s.state_slot.ok_or_else(|| ModelError::Batch("a sequence holds no state slot".into())))
                    .collect::<Result<Vec<u32>, _>>()?,
            ),
            false => None,
        };
        let lora_rows = match adapters {
            Some(_) if rows.iter().any(Option::is_some) => Some(RowAdapters::new(rows, dev)?),
            _ => None,
        };
        if logit_rows.is_empty() {
            // Only prefill chunks that end before their prompt does: nothing to sample, but
            // the forward must still fill the cache. One row's logits are the cheapest way.
            logit_rows.push(0);
        }
        let logit_rows_t = Tensor::new(logit_rows.as_slice(), dev)?;
        let ids = match drawn {
            Some(d) => d.clone(),
            None => Tensor::new(ids.as_slice(), dev)?,
        };
        let positions = Tensor::new(positions.as_slice(), dev)?;
        let inputs = PagedInputs {
            ids: &ids,
            positions: &positions,
            rope: &self.rope,
            meta: &meta,
            slots: &slots,
            adapters: adapters.zip(lora_rows.as_ref()),
            logit_rows: &logit_rows_t,
            state_slots: state_slots.as_deref().map(StateSlots::Host),
        };
        let logits = self.model.forward_paged(&inputs, &self.cache)?;
        Ok(StepLogits { logits, sampling })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::infer::tests::model;
    use candle_core::DType;

    fn runner() -> Runner {
        let config = RunnerConfig {
            block_size: 4,
            blocks: 12,
            state_slots: 0,
            vocab: 40,
            max_model_len: 16,
            cuda_graphs: false,
        };
        Runner::new(model(40, DType::F64), config).unwrap()
    }

    /// A decode step padded to a bucket over fixed buffers (what a CUDA graph replays) gives
    /// the direct step's logits for every real row (to rounding), and its padding rows write only the spare
    /// block.
    #[test]
    fn a_bucketed_decode_step_equals_the_direct_one_and_pads_into_the_spare_block() {
        let prompts: [&[u32]; 3] = [&[1, 2, 3, 4, 5], &[6, 7], &[8, 9, 10, 11, 12, 13, 14]];
        let tables: [&[u32]; 3] = [&[0, 1], &[2], &[3, 4, 5]];
        let (direct, bucketed) = (runner(), runner());
        let seqs = |r: usize| -> Vec<StepSeq<'_>> {
            (0..3)
                .map(|i| {
                    let (p, n) = (prompts[i], prompts[i].len() - 1);
                    let (tokens, start) = if r == 0 { (&p[..n], 0) } else { (&p[n..], n) };
                    StepSeq {
                        tokens,
                        start,
                        blocks: tables[i],
                        adapter: None,
                        sample: Some(RowSampling::GREEDY),
                        state_slot: None,
                    }
                })
                .collect()
        };
        for r in [&direct, &bucketed] {
            r.forward(&seqs(0), None).unwrap();
        }
        let want = direct.forward(&seqs(1), None).unwrap().logits;
        for bucket in [4, 8] {
            let got =
                bucketed.forward_bucketed(&seqs(1), bucket, &Mutex::new(DecodeGraphs::default()), None, None).unwrap();
            // Equal up to rounding: a GEMM may block 8 rows differently from 3 (the GPU's
            // libraries too), so a padded row's sums may associate differently.
            let gap = (&got.logits - &want).unwrap().abs().unwrap().max_all().unwrap().to_scalar::<f64>().unwrap();
            assert!(gap < 1e-12, "bucket {bucket}: logits differ by {gap}");
            assert_eq!(got.sampling.len(), 3);
        }
        let spare = direct.config.blocks;
        let kv = |c: &LayerCache| match c {
            LayerCache::Attention { k, v } => (k.clone(), v.clone()),
            LayerCache::Recurrent(_) => panic!("the tiny Qwen3 has attention layers only"),
        };
        for ((dk, dv), (bk, bv)) in direct.cache.iter().map(kv).zip(bucketed.cache.iter().map(kv)) {
            for (d, b) in [(&dk, &bk), (&dv, &bv)] {
                // To rounding again (the packed k/v projection blocks 8 rows unlike 3); a padding
                // row's write would differ by whole values, or fill a slot left zero.
                let real = |t: &Tensor| t.narrow(0, 0, spare).unwrap();
                let gap = (real(d) - real(b)).unwrap().abs().unwrap().max_all().unwrap().to_scalar::<f64>().unwrap();
                assert!(gap < 1e-12, "a padding row wrote outside the spare block (cache differs by {gap})");
                let spare_abs =
                    |t: &Tensor| t.get(spare).unwrap().abs().unwrap().sum_all().unwrap().to_scalar::<f64>().unwrap();
                assert_eq!(spare_abs(d), 0.0);
                assert!(spare_abs(b) > 0.0, "the padding rows wrote nothing");
            }
        }
    }

    /// A hybrid's decode step padded to a bucket (its rows' state slots and restart flags in the
    /// fixed buffer, padding rows on the spare slot) gives the direct step's logits and leaves
    /// every real slot as the direct step does. One row is a one-token prompt in a slot that
    /// another sequence's prompt left full: it starts from zeros on both paths.
    #[test]
    fn a_bucketed_hybrid_decode_step_equals_the_direct_one_and_pads_into_the_spare_slot() {
        let c = crate::infer::hybrid_tests::hybrid_with(40, 4, (4, 3));
        let config = RunnerConfig {
            block_size: 4,
            blocks: 12,
            state_slots: 4,
            vocab: 40,
            max_model_len: 16,
            cuda_graphs: false,
        };
        let make = || Runner::new(crate::infer::tests::model_of(&c, DType::F64), config).unwrap();
        let (direct, bucketed) = (make(), make());
        fn seq<'a>(tokens: &'a [u32], start: usize, blocks: &'a [u32], slot: u32) -> StepSeq<'a> {
            let sample = Some(RowSampling::GREEDY);
            StepSeq { tokens, start, blocks, adapter: None, sample, state_slot: Some(slot) }
        }
        let (a, b, d) = ([1u32, 2, 3, 4, 5, 6], [7u32, 8, 9, 10], [11u32, 12, 13, 14]);
        let prefill = [seq(&a[..5], 0, &[0, 1], 2), seq(&b[..3], 0, &[2], 0), seq(&d, 0, &[3], 1)];
        for r in [&direct, &bucketed] {
            r.forward(&prefill, None).unwrap();
        }
        let decode = [seq(&a[5..], 5, &[0, 1], 2), seq(&b[3..], 3, &[2], 0), seq(&[19], 0, &[4], 1)];
        let want = direct.forward(&decode, None).unwrap().logits;
        let graphs = Mutex::new(DecodeGraphs::default());
        let got = bucketed.forward_bucketed(&decode, 4, &graphs, None, None).unwrap().logits;
        let gap =
            |x: &Tensor, y: &Tensor| (x - y).unwrap().abs().unwrap().max_all().unwrap().to_scalar::<f64>().unwrap();
        assert!(gap(&got, &want) < 1e-12, "logits differ by {}", gap(&got, &want));
        let spare = config.state_slots;
        for (dc, bc) in direct.cache.iter().zip(&bucketed.cache) {
            let (LayerCache::Recurrent(dp), LayerCache::Recurrent(bp)) = (dc, bc) else { continue };
            for slot in 0..spare {
                let (x, y) = (dp.read(slot).unwrap(), bp.read(slot).unwrap());
                let g = gap(&x.conv, &y.conv).max(gap(&x.rule, &y.rule));
                assert!(g < 1e-12, "slot {slot} differs by {g}");
            }
            let abs = |s: &crate::model::RecurrentState| {
                let f = |t: &Tensor| t.abs().unwrap().sum_all().unwrap().to_scalar::<f64>().unwrap();
                f(&s.conv) + f(&s.rule)
            };
            assert_eq!(abs(&dp.read(spare).unwrap()), 0.0);
            assert!(abs(&bp.read(spare).unwrap()) > 0.0, "the padding rows wrote no state");
        }
    }

    #[test]
    fn steps_too_wide_for_a_bucket_or_the_table_width_or_past_the_context_are_refused() {
        let r = runner();
        let ids = [[1u32]; 3];
        let wide: Vec<u32> = (0..5).collect();
        let seq = |i: usize, blocks: &'static [u32]| StepSeq {
            tokens: &ids[i],
            start: 2,
            blocks,
            adapter: None,
            sample: Some(RowSampling::GREEDY),
            state_slot: None,
        };
        let graphs = Mutex::new(DecodeGraphs::default());
        assert!(r.forward_bucketed(&[seq(0, &[0]), seq(1, &[1]), seq(2, &[2])], 2, &graphs, None, None).is_err());
        let too_wide = StepSeq { blocks: &wide, ..seq(0, &[0]) };
        assert!(r.forward_bucketed(&[too_wide], 1, &graphs, None, None).is_err());
        // Position 16 is past max_model_len 16: no RoPE row for it, on either path.
        let past_end = StepSeq { start: 16, ..seq(0, &[0, 1, 2, 3, 4]) };
        let err = r.forward(&[past_end], None).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(err.contains("past max_model_len 16"), "{err}");
        assert!(r.forward_bucketed(&[past_end], 1, &graphs, None, None).is_err());
    }
}
