//! Per-row sampling on the GPU (`cuda/sampling.cu`): each row's max and log-sum-exp from many
//! blocks a row (`sample_parts`), then one block per row draws over the logits where they are;
//! only the chosen ids and their log-probabilities come back to the host, copied
//! into page-locked buffers behind the kernel on the same stream, so launching waits for
//! nothing and reading waits only for this copy (not for what was queued after it).

use std::sync::{Arc, Mutex};

use super::{Kernel, LaunchConfig, Module, PushKernelArg, alloc, device, int, launch, module, tensor, with_views};
use crate::sampling::RowSampling;
use candle_core::cuda_backend::WrapErr;
use candle_core::cuda_backend::cudarc::driver::{
    CudaContext, CudaEvent, CudaSlice, CudaStream, DevicePtr, PinnedHostSlice, result, sys,
};
use candle_core::{DType, Result, Tensor};

const MODULE: Module = module!("sampling");
/// Logits one `sample_parts` block scans (8 KiB of bf16: two 16-byte chunks a thread), so a
/// 152k vocabulary is 38 blocks a row rather than one block walking all of it.
const PART: usize = 4096;
/// Threads of a sampling block: the draw folds one part a thread.
const THREADS: usize = 256;

/// Page-locked buffers the draws are copied into: allocating them costs more than a decode
/// step's host work, so they are kept (a few, as only a step or two is ever in flight).
struct Readback {
    tokens: PinnedHostSlice<u32>,
    logprobs: PinnedHostSlice<f32>,
    /// Recorded behind the copies into them.
    copied: CudaEvent,
}

static READBACKS: Mutex<Vec<Readback>> = Mutex::new(Vec::new());
const KEPT_READBACKS: usize = 4;

impl Readback {
    fn take(ctx: &Arc<CudaContext>, n: usize) -> Result<Readback> {
        let mut kept = READBACKS.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(i) = kept.iter().position(|r| r.tokens.len() >= n && Arc::ptr_eq(r.tokens.context(), ctx)) {
            return Ok(kept.swap_remove(i));
        }
        drop(kept);
        let len = n.next_power_of_two().max(256);
        // SAFETY: only the part a copy has written is read (`Pending::read`).
        // Portable: pinned for every context, not only the one that allocated it.
        unsafe {
            Ok(Readback {
                tokens: ctx.alloc_pinned_with_flags(len, sys::CU_MEMHOSTALLOC_PORTABLE).w()?,
                logprobs: ctx.alloc_pinned_with_flags(len, sys::CU_MEMHOSTALLOC_PORTABLE).w()?,
                // Spinning, not blocking: the wait is short and on the step's critical path
                // when nothing is queued behind it.
                copied: ctx.new_event(None).w()?,
            })
        }
    }

    /// Queues the copies of `n` tokens and log-probabilities into the first `n` places, then
    /// the event. (cudarc's `memcpy_dtoh` copies as many elements as the host buffer holds.)
    fn queue(&mut self, stream: &Arc<CudaStream>, token: &CudaSlice<u32>, logprob: &CudaSlice<f32>) -> Result<()> {
        let n = token.len();
        let (tp, _t) = token.device_ptr(stream);
        let (lp, _l) = logprob.device_ptr(stream);
        // SAFETY: both host buffers hold at least n elements (`take`); nothing reads them until
        // `copied` has completed; the device ranges are n elements of live allocations, read on
        // their stream.
        unsafe {
            let tokens = std::slice::from_raw_parts_mut(self.tokens.as_mut_ptr().w()?, n);
            result::memcpy_dtoh_async(tokens, tp, stream.cu_stream()).w()?;
            let logprobs = std::slice::from_raw_parts_mut(self.logprobs.as_mut_ptr().w()?, n);
            result::memcpy_dtoh_async(logprobs, lp, stream.cu_stream()).w()?;
        }
        self.copied.record(stream).w()
    }

    fn give_back(self) {
        let mut kept = READBACKS.lock().unwrap_or_else(|e| e.into_inner());
        if kept.len() < KEPT_READBACKS {
            kept.push(self);
        }
    }
}

/// Draws whose copy to the host is queued.
pub(crate) struct Pending {
    ids: Tensor,
    readback: Readback,
    rows: usize,
}

impl Pending {
    pub(crate) fn ids(&self) -> &Tensor {
        &self.ids
    }

    pub(crate) fn read(self) -> Result<Vec<(u32, f32)>> {
        let Pending { readback, rows, .. } = self;
        readback.copied.synchronize().w()?;
        let tokens = readback.tokens.as_slice().w()?[..rows].to_vec();
        let logprobs = readback.logprobs.as_slice().w()?[..rows].to_vec();
        readback.give_back();
        Ok(tokens.into_iter().zip(logprobs).collect())
    }
}

pub(crate) fn queue(logits: &Tensor, rows: &[RowSampling]) -> Result<Pending> {
    let (n, vocab) = logits.dims2()?;
    let logits = match logits.dtype() {
        DType::F32 | DType::BF16 => logits.contiguous()?,
        _ => logits.to_dtype(DType::F32)?,
    };
    let dev = device(&logits)?;
    let d = logits.device();
    let col = |f: &dyn Fn(&RowSampling) -> f32| Tensor::new(rows.iter().map(f).collect::<Vec<f32>>().as_slice(), d);
    let (temp, top_p, uniform) = (col(&|r| r.temperature)?, col(&|r| r.top_p)?, col(&|r| r.uniform)?);
    let top_k = Tensor::new(rows.iter().map(|r| r.top_k).collect::<Vec<u32>>().as_slice(), d)?;
    let mut token = dev.alloc_zeros::<u32>(n)?;
    let mut logprob = alloc::<f32>(&dev, n)?;
    let vocab_i = int(vocab)?;
    // Multiples of 8, so every part starts on a 16-byte chunk; at most THREADS parts a row.
    let per = vocab.div_ceil(THREADS).max(PART).next_multiple_of(8);
    let nparts = vocab.div_ceil(per);
    let (per_i, nparts_i) = (int(per)?, int(nparts)?);
    let mut parts = alloc::<f32>(&dev, n * nparts * 3)?;
    let parts_cfg =
        LaunchConfig { grid_dim: (n as u32, nparts as u32, 1), block_dim: (THREADS as u32, 1, 1), shared_mem_bytes: 0 };
    let cfg = LaunchConfig { grid_dim: (n as u32, 1, 1), block_dim: (THREADS as u32, 1, 1), shared_mem_bytes: 0 };
    with_views::<f32, _, 3>([&temp, &top_p, &uniform], |[tv, pv, uv]| {
        with_views::<u32, _, 1>([&top_k], |[kv]| {
            macro_rules! go {
                ($t:ty, $suffix:literal) => {{
                    let scan = Kernel::named(&dev, &MODULE, concat!("sample_parts_", $suffix))?;
                    let draw = Kernel::named(&dev, &MODULE, concat!("sample_", $suffix))?;
                    with_views::<$t, _, 1>([&logits], |[lv]| {
                        let mut a = scan.builder();
                        a.arg(&lv).arg(&mut parts).arg(&vocab_i).arg(&per_i);
                        launch(a, parts_cfg)?;
                        let mut a = draw.builder();
                        a.arg(&lv).arg(&parts).arg(&nparts_i).arg(&tv).arg(&pv).arg(&kv).arg(&uv);
                        a.arg(&mut token).arg(&mut logprob).arg(&vocab_i);
                        launch(a, cfg)
                    })
                }};
            }
            match logits.dtype() {
                DType::BF16 => go!(half::bf16, "bf16"),
                _ => go!(f32, "f32"),
            }
        })
    })?;
    let stream = dev.cuda_stream();
    let mut readback = Readback::take(stream.context(), n)?;
    readback.queue(&stream, &token, &logprob)?;
    Ok(Pending { ids: tensor(token, &dev, n), readback, rows: n })
}
