//! The device side of a step: owns the model and the cache tensors, turns a schedule into one
//! flat batch (ids, positions, cache slots, block tables, adapter slots, the rows to sample),
//! runs the model's paged forward and samples on the device.

use candle_core::{Device, Tensor};
use mindxtrain_kernels::multi_lora::RowAdapters;
use mindxtrain_kernels::paged_attention::{PagedMeta, SeqSlice};
use mindxtrain_kernels::sampling::RowSampling;

use super::kv::CacheShape;
use super::sampler;
use crate::model::{AdapterStack, LayerCache, ModelError, PagedInputs, Params, Qwen3};

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
}

/// A step's logits `[R, vocab]`, one row per sequence that samples (or one unused row when
/// none does), with each row's sampling settings.
pub struct StepLogits {
    pub logits: Tensor,
    pub sampling: Vec<RowSampling>,
}

pub struct Runner {
    model: Qwen3,
    cache: Vec<LayerCache>,
    shape: CacheShape,
    /// Ids at or above this are never drawn.
    vocab: usize,
}

impl Runner {
    /// Allocates `blocks` cache blocks per layer on the model's device.
    pub fn new(model: Qwen3, block_size: usize, blocks: usize, vocab: usize) -> Result<Runner, ModelError> {
        let shape = Runner::cache_shape(&model, block_size);
        let dims = (blocks, block_size, shape.kv_heads, shape.head_dim);
        let cache = (0..shape.layers)
            .map(|_| {
                let z = || Tensor::zeros(dims, shape.dtype, model.device());
                Ok((z()?, z()?))
            })
            .collect::<Result<Vec<_>, candle_core::Error>>()?;
        Ok(Runner { model, cache, shape, vocab })
    }

    /// The cache geometry `model` needs for blocks of `block_size` tokens.
    pub fn cache_shape(model: &Qwen3, block_size: usize) -> CacheShape {
        let c = model.config();
        CacheShape {
            layers: c.num_hidden_layers,
            kv_heads: c.num_key_value_heads,
            head_dim: c.head_dim,
            block_size,
            dtype: model.dtype(),
        }
    }

    pub fn model(&self) -> &Qwen3 {
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
        Ok(())
    }

    pub fn device(&self) -> &Device {
        self.model.device()
    }

    /// Runs one step; returns `(token, log-probability)` for each sequence that samples, in order.
    pub fn step(&self, seqs: &[StepSeq<'_>], adapters: Option<&AdapterStack>) -> Result<Vec<(u32, f32)>, ModelError> {
        let step = self.forward(seqs, adapters)?;
        if step.sampling.is_empty() {
            return Ok(Vec::new());
        }
        Ok(sampler::sample(&step.logits, &step.sampling, self.vocab)?)
    }

    /// Enqueues one step's forward (the cache writes included) and returns without waiting for
    /// the device: what [`Runner::step`] samples from. Split out so that a benchmark can tell
    /// the host's time to launch a step from the device's time to run it.
    pub fn forward(&self, seqs: &[StepSeq<'_>], adapters: Option<&AdapterStack>) -> Result<StepLogits, ModelError> {
        let dev = self.model.device();
        let slices: Vec<SeqSlice> = seqs
            .iter()
            .map(|s| SeqSlice { query_len: s.tokens.len(), context_len: s.start + s.tokens.len(), blocks: s.blocks })
            .collect();
        let meta = PagedMeta::new(self.shape.block_size, &slices, dev)?;
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
        let inputs = PagedInputs {
            ids: &ids,
            positions: &positions,
            meta: &meta,
            slots: &slots,
            adapters: adapters.zip(lora_rows.as_ref()),
            logit_rows: &logit_rows_t,
        };
        let logits = self.model.forward_paged(&inputs, &self.cache)?;
        Ok(StepLogits { logits, sampling })
    }
}
