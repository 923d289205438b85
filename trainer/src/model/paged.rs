//! The serving forward: a flat batch of tokens from many sequences (prefill chunks and decode
//! tokens mixed) over a paged key/value cache, each row with its own position and adapter.
//!
//! Training batches are `[B, T]` rectangles with a packing mask; a serving step is ragged (one
//! row for a sequence that decodes, hundreds for a prompt chunk) and reads keys that earlier
//! steps left in the cache. So the attention metadata here comes from the kernels' own
//! [`PagedMeta`], not from a training batch, and the block is the inference one: projections
//! (with every row's adapter), the fused norm/RoPE/cache write, paged attention, the MLP (or a
//! Qwen3-MoE layer's routed experts).

use candle_core::Tensor;
use mindxtrain_kernels::multi_lora::{self, RowAdapters};
use mindxtrain_kernels::paged_attention::{self, PagedMeta};
use mindxtrain_kernels::{embedding, linear, rmsnorm, rope, swiglu};

use super::adapter_stack::AdapterStack;
use super::moe::{self, MoeWeights};
use super::params::{EMBED, FINAL_NORM, Norm, Proj, base_weight_name, norm_name};
use super::{ModelError, Qwen3};

/// One step's tokens and where they go.
pub struct PagedInputs<'a> {
    /// `[N]` token ids, sequence after sequence in the order of `meta`.
    pub ids: &'a [u32],
    /// `[N]` positions (each row's place in its sequence).
    pub positions: &'a [u32],
    pub meta: &'a PagedMeta,
    /// `[N]` u32 cache slots of the rows (`meta.slots()` on the model's device).
    pub slots: &'a Tensor,
    /// The stacked adapters and each row's slot in them; `None` runs the base alone.
    pub adapters: Option<(&'a AdapterStack, &'a RowAdapters)>,
    /// `[R]` u32 rows whose logits are wanted (the last row of each sequence that samples).
    pub logit_rows: &'a Tensor,
}

/// One layer's key and value caches, `[blocks, block_size, kv_heads, head_dim]` each.
pub type LayerCache = (Tensor, Tensor);

impl Qwen3 {
    /// Runs the batch, writing every row's keys and values into `cache` (one pair per layer),
    /// and returns the logits `[R, vocab]` of `inputs.logit_rows`.
    pub fn forward_paged(&self, inputs: &PagedInputs<'_>, cache: &[LayerCache]) -> Result<Tensor, ModelError> {
        let c = self.config();
        let n = inputs.ids.len();
        if n == 0 || inputs.positions.len() != n || inputs.meta.rows() != n || cache.len() != c.num_hidden_layers {
            return Err(ModelError::Batch(format!(
                "paged step: {n} ids, {} positions, {} rows in the metadata, {} cached layers of {}",
                inputs.positions.len(),
                inputs.meta.rows(),
                cache.len(),
                c.num_hidden_layers
            )));
        }
        if let Some((i, id)) = inputs.ids.iter().enumerate().find(|&(_, &id)| id as usize >= c.vocab_size) {
            return Err(ModelError::Batch(format!("row {i}: id {id} is outside the vocabulary of {}", c.vocab_size)));
        }
        let dev = self.device();
        let (cos, sin) = rope::tables(inputs.positions, c.head_dim, c.rope_theta, self.dtype(), dev)?;
        let ids = Tensor::new(inputs.ids, dev)?;
        let mut x = embedding::forward(&ids, &*self.weight(EMBED)?)?;
        for (layer, kv) in cache.iter().enumerate() {
            x = self.paged_block(layer, &x, inputs, (&cos, &sin), kv)?;
        }
        let last = x.index_select(inputs.logit_rows, 0)?;
        let (h, _) = rmsnorm::forward(&last, &*self.weight(FINAL_NORM)?, c.rms_norm_eps)?;
        Ok(linear::forward(self.kernels(), &h, &*self.weight(self.head_name())?)?)
    }

    /// `x·Wᵀ` of projection `proj`, plus each row's adapter branch.
    fn paged_proj(&self, layer: usize, proj: Proj, x: &Tensor, inputs: &PagedInputs<'_>) -> Result<Tensor, ModelError> {
        let w = self.weight(&base_weight_name(layer, proj))?;
        Ok(match inputs.adapters.and_then(|(stack, rows)| Some((stack.get(layer, proj)?, rows))) {
            Some((lora, rows)) => multi_lora::forward(self.kernels(), x, &w, lora, rows)?,
            None => linear::forward(self.kernels(), x, &w)?,
        })
    }

    fn paged_block(
        &self,
        layer: usize,
        x: &Tensor,
        inputs: &PagedInputs<'_>,
        (cos, sin): (&Tensor, &Tensor),
        (k_cache, v_cache): &LayerCache,
    ) -> Result<Tensor, ModelError> {
        let c = self.config();
        let (n, nh, nkv, hd) = (x.dim(0)?, c.num_attention_heads, c.num_key_value_heads, c.head_dim);
        let eps = c.rms_norm_eps;
        let (h1, _) = rmsnorm::forward(x, &*self.weight(&norm_name(layer, Norm::Input))?, eps)?;
        let q = self.paged_proj(layer, Proj::Q, &h1, inputs)?.reshape((n, nh, hd))?;
        let k = self.paged_proj(layer, Proj::K, &h1, inputs)?.reshape((n, nkv, hd))?;
        let v = self.paged_proj(layer, Proj::V, &h1, inputs)?.reshape((n, nkv, hd))?;
        let (qn, kn) = (self.weight(&norm_name(layer, Norm::Q))?, self.weight(&norm_name(layer, Norm::K))?);
        let q = paged_attention::prepare(&q, &k, &v, (&qn, &kn, eps), cos, sin, (k_cache, v_cache), inputs.slots)?;
        let scale = 1.0 / (hd as f64).sqrt();
        let o = paged_attention::forward(&q, k_cache, v_cache, inputs.meta, scale)?.reshape((n, nh * hd))?;
        let attn = self.paged_proj(layer, Proj::O, &o, inputs)?;
        let post = self.weight(&norm_name(layer, Norm::PostAttention))?;
        let (x2, h2, _) = rmsnorm::add_forward(x, &attn, &post, eps)?;
        if let Some(shape) = c.moe.as_ref().filter(|m| m.is_sparse(layer)) {
            let (router, gate_up, down) = (
                self.weight(&moe::router_name(layer))?,
                self.weight(&moe::gate_up_name(layer))?,
                self.weight(&moe::down_name(layer))?,
            );
            let w = MoeWeights { router: &router, gate_up: &gate_up, down: &down };
            return Ok((x2 + moe::forward(self.kernels(), shape, &w, &h2)?.0)?);
        }
        let gate = self.paged_proj(layer, Proj::Gate, &h2, inputs)?;
        let up = self.paged_proj(layer, Proj::Up, &h2, inputs)?;
        let down = self.paged_proj(layer, Proj::Down, &swiglu::forward(&gate, &up)?, inputs)?;
        Ok((x2 + down)?)
    }
}
