//! Attention over a paged key/value cache: the serving engine's attention.
//!
//! The cache of one layer is two tensors `[blocks, block_size, kv_heads, head_dim]`; a sequence
//! owns a list of blocks (its block table), and its token at position `p` lives in block
//! `table[p / block_size]`, row `p % block_size` (its *slot* is `block · block_size + row`).
//! A step runs a flat batch: every sequence contributes its new tokens (a prefill chunk, or one
//! decode token), and [`PagedMeta`] says how many rows each has and how long its context is.
//!
//! * [`write_kv`] stores the new tokens' keys and values into their slots (in place).
//! * [`prepare`] is what a block does between its q/k/v projections and attention: per-head
//!   RMSNorm of q and k, RoPE, and the cache write (one fused kernel on a GPU).
//! * [`forward`] is causal attention of each sequence's new rows over its whole context, read
//!   through its block table (GQA: query head `h` reads kv head `h / (heads / kv_heads)`).
//!
//! Each has its composed [`reference`] (gather the blocks, then [`crate::attention::cached`]),
//! a fused CPU kernel for f32/f64 (`crate::cpu::paged`), and CUDA kernels for f32/bf16 under the
//! `cuda` feature (decode rows split over the context, split-K; prefill rows in query tiles).
//! Kernels see tensors and block ids only, never requests.

use crate::cpu::{self, dispatch};
use crate::on_gpu_or;
use crate::{rmsnorm, rope};
use candle_core::{DType, Device, Result, Tensor};

/// Where each sequence of a flat batch reads and writes the cache.
#[derive(Debug, Clone)]
pub struct PagedMeta {
    block_size: usize,
    /// Per sequence: its first row in the batch; one more entry at the end (the row count).
    query_starts: Vec<u32>,
    /// Per sequence: tokens in its context after this step (cached and new).
    context_lens: Vec<u32>,
    /// `[sequences, max_blocks]`, padded with block 0 past each table's end.
    block_tables: Vec<u32>,
    max_blocks: usize,
    /// The context the GPU kernels plan their split over keys for: the longest in the batch,
    /// or a fixed bound, so that a recorded graph's plan holds for every later step.
    plan_context: Option<usize>,
    /// The same on the device (for the GPU kernels): query starts, context lengths, tables.
    device: Option<[Tensor; 3]>,
    /// How the GPU kernels cut this batch into blocks, made once for all layers.
    #[cfg(feature = "cuda")]
    gpu: std::sync::OnceLock<crate::gpu::paged::GpuPlan>,
}

/// One sequence of a batch: `query_len` new rows over a context of `context_len` tokens (the
/// new ones last), stored in `blocks`.
#[derive(Debug, Clone, Copy)]
pub struct SeqSlice<'a> {
    pub query_len: usize,
    pub context_len: usize,
    pub blocks: &'a [u32],
}

impl PagedMeta {
    /// Checks every sequence (at least one row, no more rows than context, enough blocks) and
    /// copies the tables to `device` when it is not the CPU.
    pub fn new(block_size: usize, seqs: &[SeqSlice<'_>], device: &Device) -> Result<PagedMeta> {
        let widest = seqs.iter().map(|s| s.blocks.len()).max().unwrap_or(0).max(1);
        let mut meta = PagedMeta::host(block_size, seqs, widest)?;
        if !device.is_cpu() {
            let [starts, lens, tables] = meta.host_arrays();
            let d = device;
            meta.device = Some([
                Tensor::new(starts, d)?,
                Tensor::new(lens, d)?,
                Tensor::from_slice(tables, (seqs.len(), widest), d)?,
            ]);
        }
        Ok(meta)
    }

    /// The same checks, with every block table padded to `width` blocks and the GPU plan made
    /// for contexts up to `width · block_size`, but nothing on a device yet: the shape a
    /// recorded graph replays, whose device arrays are buffers the graph owns (attached with
    /// [`PagedMeta::with_device_arrays`], refilled from [`PagedMeta::host_arrays`] each step).
    pub fn fixed(block_size: usize, seqs: &[SeqSlice<'_>], width: usize) -> Result<PagedMeta> {
        if let Some(s) = seqs.iter().find(|s| s.blocks.len() > width) {
            candle_core::bail!("paged attention: a table of {} blocks is wider than {width}", s.blocks.len());
        }
        let mut meta = PagedMeta::host(block_size, seqs, width.max(1))?;
        meta.plan_context = Some(width.max(1) * block_size);
        Ok(meta)
    }

    fn host(block_size: usize, seqs: &[SeqSlice<'_>], max_blocks: usize) -> Result<PagedMeta> {
        if block_size == 0 || seqs.is_empty() {
            candle_core::bail!("paged attention: block size {block_size}, {} sequences", seqs.len());
        }
        let mut query_starts = Vec::with_capacity(seqs.len() + 1);
        let (mut rows, mut tables) = (0usize, Vec::with_capacity(seqs.len() * max_blocks));
        for (i, s) in seqs.iter().enumerate() {
            if s.query_len == 0 || s.query_len > s.context_len || s.blocks.len() * block_size < s.context_len {
                candle_core::bail!(
                    "paged attention: sequence {i} has {} new of {} tokens in {} blocks of {block_size}",
                    s.query_len,
                    s.context_len,
                    s.blocks.len()
                );
            }
            query_starts.push(u32_of(rows)?);
            rows += s.query_len;
            tables.extend_from_slice(s.blocks);
            tables.resize((i + 1) * max_blocks, 0);
        }
        query_starts.push(u32_of(rows)?);
        let context_lens = seqs.iter().map(|s| u32_of(s.context_len)).collect::<Result<Vec<_>>>()?;
        Ok(PagedMeta {
            block_size,
            query_starts,
            context_lens,
            block_tables: tables,
            max_blocks,
            plan_context: None,
            device: None,
            #[cfg(feature = "cuda")]
            gpu: std::sync::OnceLock::new(),
        })
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }

    pub fn sequences(&self) -> usize {
        self.context_lens.len()
    }

    /// Rows of the batch (new tokens of every sequence).
    pub fn rows(&self) -> usize {
        *self.query_starts.last().unwrap_or(&0) as usize
    }

    /// Sequence `s`: `(first row, rows, context length, block table)`.
    pub fn seq(&self, s: usize) -> (usize, usize, usize, &[u32]) {
        let (a, b) = (self.query_starts[s] as usize, self.query_starts[s + 1] as usize);
        let table = &self.block_tables[s * self.max_blocks..(s + 1) * self.max_blocks];
        (a, b - a, self.context_lens[s] as usize, table)
    }

    /// The cache slot of every row: the new tokens are the last positions of their context.
    pub fn slots(&self) -> Vec<u32> {
        let mut out = Vec::with_capacity(self.rows());
        for s in 0..self.sequences() {
            let (_, t, ctx, table) = self.seq(s);
            out.extend(
                (ctx - t..ctx)
                    .map(|p| table[p / self.block_size] * self.block_size as u32 + (p % self.block_size) as u32),
            );
        }
        out
    }

    /// The longest context in the batch.
    pub fn max_context(&self) -> usize {
        self.context_lens.iter().copied().max().unwrap_or(0) as usize
    }

    /// Query starts (`sequences + 1`), context lengths and the padded block tables
    /// (`sequences × width`), as the device arrays hold them.
    pub fn host_arrays(&self) -> [&[u32]; 3] {
        [&self.query_starts, &self.context_lens, &self.block_tables]
    }

    /// Uses `arrays` (shaped as [`PagedMeta::host_arrays`], the tables `[sequences, width]`)
    /// as this batch's device arrays.
    pub fn with_device_arrays(mut self, arrays: [Tensor; 3]) -> Result<PagedMeta> {
        let want = [self.query_starts.len(), self.context_lens.len(), self.block_tables.len()];
        if arrays.iter().zip(want).any(|(t, n)| t.elem_count() != n) {
            candle_core::bail!("paged attention: device arrays of the wrong size for {} sequences", self.sequences());
        }
        self.device = Some(arrays);
        Ok(self)
    }

    /// Whether every sequence has exactly one new row (a pure decode step).
    pub fn is_decode(&self) -> bool {
        self.rows() == self.sequences()
    }

    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub(crate) fn max_blocks(&self) -> usize {
        self.max_blocks
    }

    /// The context the GPU plan splits keys for (see `plan_context`).
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub(crate) fn plan_context(&self) -> usize {
        self.plan_context.unwrap_or_else(|| self.max_context())
    }

    /// The GPU kernels' work plan of `kind` over `kv` kv heads (the first call makes it; every
    /// layer of a step shares it, as every layer runs the same kernel).
    #[cfg(feature = "cuda")]
    pub(crate) fn gpu_plan(
        &self,
        kind: crate::gpu::paged::PlanKind,
        kv: usize,
        device: &Device,
    ) -> Result<std::borrow::Cow<'_, crate::gpu::paged::GpuPlan>> {
        use crate::gpu::paged::GpuPlan;
        use std::borrow::Cow;
        match self.gpu.get() {
            Some(p) if p.kind() == kind => Ok(Cow::Borrowed(p)),
            Some(_) => Ok(Cow::Owned(GpuPlan::new(self, kind, kv, device)?)),
            None => {
                let plan = GpuPlan::new(self, kind, kv, device)?;
                Ok(Cow::Borrowed(self.gpu.get_or_init(|| plan)))
            }
        }
    }

    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub(crate) fn device_tensors(&self) -> Result<&[Tensor; 3]> {
        self.device.as_ref().ok_or_else(|| candle_core::Error::Msg("paged attention: metadata is on the CPU".into()))
    }
}

/// Whether bf16 attention may run on the tensor-core kernel (on by default). Benchmarks turn it
/// off to time the CUDA-core kernel in the same process; results differ only by rounding.
pub fn use_tensor_cores(on: bool) {
    TENSOR_CORES.store(on, std::sync::atomic::Ordering::Relaxed);
}

#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) fn tensor_cores_allowed() -> bool {
    TENSOR_CORES.load(std::sync::atomic::Ordering::Relaxed)
}

static TENSOR_CORES: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(true);

/// How many thread blocks the tensor-core kernel's split over keys aims for (`None`: its
/// default, two waves of an H100/H200). Benchmarks set it to time other splits in one process.
pub fn tensor_core_busy_blocks(blocks: Option<usize>) {
    TC_BUSY_BLOCKS.store(blocks.unwrap_or(0), std::sync::atomic::Ordering::Relaxed);
}

#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) fn tensor_core_busy_blocks_set() -> Option<usize> {
    Some(TC_BUSY_BLOCKS.load(std::sync::atomic::Ordering::Relaxed)).filter(|&b| b > 0)
}

static TC_BUSY_BLOCKS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Whether the GPU kernels serve attention of this shape on `device`: they read every step's
/// lengths and block tables from the device. Otherwise the composed reference runs, which builds
/// its gathers from the host's copy of the metadata, so a recorded graph would replay the
/// recorded step's gathers forever: the serving engine records graphs only when this holds.
pub fn reads_device_metadata(device: &Device, dtype: DType, heads: usize, kv_heads: usize, head_dim: usize) -> bool {
    #[cfg(feature = "cuda")]
    if device.is_cuda() && matches!(dtype, DType::F32 | DType::BF16) && kv_heads > 0 && heads.is_multiple_of(kv_heads) {
        return crate::gpu::paged::served(head_dim, heads / kv_heads);
    }
    let _ = (device, dtype, heads, kv_heads, head_dim);
    false
}

fn u32_of(n: usize) -> Result<u32> {
    u32::try_from(n).map_err(|_| candle_core::Error::Msg(format!("paged attention: {n} exceeds u32")))
}

/// `[blocks, block_size, kv_heads, head_dim]` of a cache tensor, checked against the batch.
fn cache_dims(cache: &Tensor, meta: &PagedMeta) -> Result<(usize, usize, usize, usize)> {
    let dims = cache.dims4()?;
    if dims.1 != meta.block_size || meta.block_tables.iter().any(|&b| b as usize >= dims.0) {
        candle_core::bail!(
            "paged attention: cache {:?} for blocks of {} (tables name a block past its end?)",
            cache.dims(),
            meta.block_size
        );
    }
    Ok(dims)
}

/// Stores `k`, `v` (`[N, kv_heads, head_dim]`) into the caches at `slots` (`[N]` u32), in place.
pub fn write_kv(k_cache: &Tensor, v_cache: &Tensor, k: &Tensor, v: &Tensor, slots: &Tensor) -> Result<()> {
    let _profile = crate::profile::scope("kv write", k.device());
    let (n, kv, hd) = k.dims3()?;
    let (blocks, bs, ckv, chd) = k_cache.dims4()?;
    if v.dims3()? != (n, kv, hd) || (ckv, chd) != (kv, hd) || v_cache.dims() != k_cache.dims() || slots.dims1()? != n {
        candle_core::bail!(
            "kv write: k {:?}, v {:?} into {:?} at {:?} slots",
            k.dims(),
            v.dims(),
            k_cache.dims(),
            slots.dims()
        );
    }
    if !k_cache.is_contiguous() || !v_cache.is_contiguous() {
        candle_core::bail!("kv write: the caches must be contiguous");
    }
    let op = WriteKv { slots: blocks * bs };
    k_cache.inplace_op3(&k.contiguous()?, slots, &op)?;
    v_cache.inplace_op3(&v.contiguous()?, slots, &op)
}

/// The in-place cache write: rows of the source go to the cache rows the slots name.
struct WriteKv {
    slots: usize,
}

impl candle_core::InplaceOp3 for WriteKv {
    fn name(&self) -> &'static str {
        "kv-write"
    }

    fn cpu_fwd(
        &self,
        cache: &mut candle_core::CpuStorage,
        cache_l: &candle_core::Layout,
        src: &candle_core::CpuStorage,
        src_l: &candle_core::Layout,
        slots: &candle_core::CpuStorage,
        slots_l: &candle_core::Layout,
    ) -> Result<()> {
        use candle_core::CpuStorage as S;
        let slots = match slots {
            S::U32(s) => contiguous(s, slots_l)?,
            _ => candle_core::bail!("kv write: slots must be u32"),
        };
        let row = src_l.shape().elem_count() / slots.len().max(1);
        match (cache, src) {
            (S::F32(c), S::F32(s)) => {
                cpu::paged::write_rows(contiguous_mut(c, cache_l)?, contiguous(s, src_l)?, slots, row, self.slots)
            }
            (S::F64(c), S::F64(s)) => {
                cpu::paged::write_rows(contiguous_mut(c, cache_l)?, contiguous(s, src_l)?, slots, row, self.slots)
            }
            (S::BF16(c), S::BF16(s)) => {
                cpu::paged::write_rows(contiguous_mut(c, cache_l)?, contiguous(s, src_l)?, slots, row, self.slots)
            }
            (S::F16(c), S::F16(s)) => {
                cpu::paged::write_rows(contiguous_mut(c, cache_l)?, contiguous(s, src_l)?, slots, row, self.slots)
            }
            _ => candle_core::bail!("kv write: cache and source dtypes differ"),
        }
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        cache: &mut candle_core::CudaStorage,
        cache_l: &candle_core::Layout,
        src: &candle_core::CudaStorage,
        src_l: &candle_core::Layout,
        slots: &candle_core::CudaStorage,
        slots_l: &candle_core::Layout,
    ) -> Result<()> {
        crate::gpu::paged::write_rows(cache, cache_l, src, src_l, slots, slots_l, self.slots)
    }
}

fn contiguous<'a, T>(data: &'a [T], l: &candle_core::Layout) -> Result<&'a [T]> {
    match l.contiguous_offsets() {
        Some((a, b)) => Ok(&data[a..b]),
        None => candle_core::bail!("kv write: operand is not contiguous"),
    }
}

fn contiguous_mut<'a, T>(data: &'a mut [T], l: &candle_core::Layout) -> Result<&'a mut [T]> {
    match l.contiguous_offsets() {
        Some((a, b)) => Ok(&mut data[a..b]),
        None => candle_core::bail!("kv write: the cache is not contiguous"),
    }
}

/// What a block does between its projections and attention. `qkv` `[N, (heads + 2·kv)·hd]` is
/// the packed q/k/v projection (each row: the q heads, then the k heads, then the v heads; `kv`
/// and `hd` are the caches'); q and k are normalised per head (`norms`: gains `q_norm`, `k_norm`
/// `[hd]` and eps; `None` leaves them as given, for norms over the whole projection that the
/// caller applied) and rotated by `cos`/`sin` `[N, hd]`; the rotated keys and v go into the
/// caches at `slots`. Returns q `[N, heads, hd]`.
#[allow(clippy::too_many_arguments)]
pub fn prepare(
    qkv: &Tensor,
    heads: usize,
    norms: Option<(&Tensor, &Tensor, f64)>,
    cos: &Tensor,
    sin: &Tensor,
    caches: (&Tensor, &Tensor),
    slots: &Tensor,
) -> Result<Tensor> {
    let _profile = crate::profile::scope("paged prepare", qkv.device());
    let (_, _, kv, hd) = caches.0.dims4()?;
    let width = qkv.dim(1)?;
    if qkv.rank() != 2 || width != (heads + 2 * kv) * hd {
        candle_core::bail!("paged prepare: qkv {:?} is not [N, ({heads} + 2·{kv})·{hd}]", qkv.dims());
    }
    #[cfg(feature = "cuda")]
    use crate::gpu::paged::prepare as gpu;
    on_gpu_or!(
        [qkv, cos, sin],
        gpu(qkv, heads, norms, cos, sin, caches, slots),
        reference::prepare(qkv, heads, norms, cos, sin, caches, slots)
    )
}

/// Causal attention of every sequence's new rows over its context: `q` `[N, heads, hd]`,
/// caches `[blocks, block_size, kv, hd]`; returns `[N, heads, hd]`.
pub fn forward(q: &Tensor, k_cache: &Tensor, v_cache: &Tensor, meta: &PagedMeta, scale: f64) -> Result<Tensor> {
    let _profile = crate::profile::scope("paged attention", q.device());
    let (n, heads, hd) = q.dims3()?;
    let (_, _, kv, khd) = cache_dims(k_cache, meta)?;
    if n != meta.rows() || khd != hd || v_cache.dims() != k_cache.dims() || kv == 0 || !heads.is_multiple_of(kv) {
        candle_core::bail!(
            "paged attention: q {:?} ({} rows expected) over caches {:?}, {:?}",
            q.dims(),
            meta.rows(),
            k_cache.dims(),
            v_cache.dims()
        );
    }
    #[cfg(feature = "cuda")]
    use crate::gpu::paged::forward as gpu;
    use cpu::paged::forward as fused;
    let cpu_or_reference = || {
        dispatch!(
            [q, k_cache, v_cache],
            fused(q, k_cache, v_cache, meta, scale),
            reference::forward(q, k_cache, v_cache, meta, scale)
        )
    };
    on_gpu_or!([q, k_cache, v_cache], gpu(q, k_cache, v_cache, meta, scale), cpu_or_reference())
}

/// The composed forms, on any candle device: the referees of the fused kernels.
pub mod reference {
    use super::*;

    /// Gathers sequence `s`'s context from a cache: `[1, kv, context, hd]`.
    fn gather(cache: &Tensor, meta: &PagedMeta, s: usize) -> Result<Tensor> {
        let (blocks, bs, kv, hd) = cache.dims4()?;
        let (_, _, ctx, table) = meta.seq(s);
        let slots: Vec<u32> = (0..ctx).map(|p| table[p / bs] * bs as u32 + (p % bs) as u32).collect();
        let idx = Tensor::new(slots.as_slice(), cache.device())?;
        cache.reshape((blocks * bs, kv, hd))?.index_select(&idx, 0)?.transpose(0, 1)?.unsqueeze(0)
    }

    pub fn forward(q: &Tensor, k_cache: &Tensor, v_cache: &Tensor, meta: &PagedMeta, scale: f64) -> Result<Tensor> {
        let mut outs = Vec::with_capacity(meta.sequences());
        for s in 0..meta.sequences() {
            let (first, rows, _, _) = meta.seq(s);
            let qs = q.narrow(0, first, rows)?.transpose(0, 1)?.unsqueeze(0)?;
            let (k, v) = (gather(k_cache, meta, s)?, gather(v_cache, meta, s)?);
            let o = crate::attention::cached::forward(&qs, &k, &v, scale)?;
            outs.push(o.squeeze(0)?.transpose(0, 1)?);
        }
        Tensor::cat(&outs, 0)
    }

    /// The cache write as candle's scatter: each slot's row of `[slots, kv·hd]` replaced.
    pub fn write_kv(k_cache: &Tensor, v_cache: &Tensor, k: &Tensor, v: &Tensor, slots: &Tensor) -> Result<()> {
        let (blocks, bs, kv, hd) = k_cache.dims4()?;
        let n = slots.dim(0)?;
        let idx = slots.to_dtype(DType::U32)?.reshape((n, 1))?.broadcast_as((n, kv * hd))?.contiguous()?;
        for (cache, src) in [(k_cache, k), (v_cache, v)] {
            cache.reshape((blocks * bs, kv * hd))?.scatter_set(&idx, &src.reshape((n, kv * hd))?, 0)?;
        }
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    pub fn prepare(
        qkv: &Tensor,
        heads: usize,
        norms: Option<(&Tensor, &Tensor, f64)>,
        cos: &Tensor,
        sin: &Tensor,
        (k_cache, v_cache): (&Tensor, &Tensor),
        slots: &Tensor,
    ) -> Result<Tensor> {
        let (_, _, kv, hd) = k_cache.dims4()?;
        let n = qkv.dim(0)?;
        let part = |first: usize, count: usize| qkv.narrow(1, first * hd, count * hd)?.reshape((n, count, hd));
        let (q_pre, k_pre, v) = (part(0, heads)?, part(heads, kv)?, part(heads + kv, kv)?);
        let (cos, sin) = (cos.unsqueeze(1)?, sin.unsqueeze(1)?);
        let (q_pre, k_pre) = match norms {
            Some((q_norm, k_norm, eps)) => {
                (rmsnorm::forward(&q_pre, q_norm, eps)?.0, rmsnorm::forward(&k_pre, k_norm, eps)?.0)
            }
            None => (q_pre, k_pre),
        };
        let q = rope::forward(&q_pre, &cos, &sin)?;
        let k = rope::forward(&k_pre, &cos, &sin)?;
        super::write_kv(k_cache, v_cache, &k, &v, slots)?;
        Ok(q)
    }
}

#[cfg(test)]
mod tests;
