//! NCCL through cudarc's bindings: the GPU backend of [`Collective`].
//!
//! Every operation is queued on a CUDA stream of the communicator's own, so a gradient bucket is
//! reduced while the compute stream goes on with the backward pass. Ordering between the two
//! streams: before each operation NCCL's stream waits for everything the calling thread's compute
//! stream has queued so far (`Nccl::follow_compute`), so an input is read only after the
//! kernels that wrote it. Per-buffer events cannot do this: candle's kernels pass their outputs
//! as shared references, so cudarc never records a write event for them, and a wait on one is a
//! no-op (on two GPUs NCCL summed buckets before the backward had written them, and runs
//! diverged to NaN). The other direction is cudarc's event tracking: NCCL's outputs are written
//! through mutable views whose write events are recorded after `ncclGroupEnd`, and every later
//! use of a result on the compute stream waits for them. That holds only for buffers allocated
//! on the compute stream (see `Nccl::alloc`): candle's copy kernels wait on the stream a buffer
//! was allocated on, not the one they run on.
//!
//! Never a hang: a wait on the host (small values, the timeline, [`Collective::synchronize`])
//! polls the queued work, NCCL's asynchronous error (`ncclCommGetAsyncError`: a peer that died,
//! a broken connection) and the launcher's stop, and gives up at the collective timeout; the
//! communicator is aborted (`ncclCommAbort`) when the rank drops it. A rank whose compute stream
//! waits on a dead peer is also ended by its watchdog once the launcher stops the run (see
//! `mindxtrain rank`): the launcher sees every rank process end.
//!
//! Spans that are not one equal chunk per rank in rank order (ZeRO shards whole tensors) are
//! reduced with one `ncclReduce` to each span's owner and gathered with one `ncclBroadcast` from
//! it, all in one NCCL group.

use super::spans::{owned, placed, total};
use super::{Abort, Backend, Collective, CollectiveError, Span};
use candle_core::cuda_backend::cudarc::driver::{CudaEvent, CudaSlice, CudaStream, DeviceRepr, ValidAsZeroBits, sys};
use candle_core::cuda_backend::cudarc::nccl::{result as nccl_result, safe as nccl};
use candle_core::cuda_backend::{CudaDType, CudaDevice, CudaStorage};
use candle_core::op::BackpropOp;
use candle_core::{DType, Device, Storage, Tensor};
use comm::Comm;
use half::{bf16, f16};
use std::sync::Arc;
use std::time::{Duration, Instant};

mod comm;
#[cfg(test)]
mod gpu_tests;

/// One rank's NCCL communicator and the stream its operations run on.
pub struct Nccl {
    comm: Comm,
    device: CudaDevice,
    stream: Arc<CudaStream>,
    timeout: Duration,
    abort: Arc<Abort>,
    /// While recording: the host time of `base` and each operation's events.
    timeline: Option<Timeline>,
}

struct Timeline {
    base: CudaEvent,
    base_at: Instant,
    ops: Vec<(String, CudaEvent, CudaEvent)>,
}

// SAFETY: the communicator is used by one thread at a time (the trait takes `&mut self`); NCCL
// communicators may move between threads, only concurrent use of one is forbidden.
unsafe impl Send for Nccl {}

fn nccl_err(what: &str) -> impl Fn(nccl_result::NcclError) -> CollectiveError + '_ {
    move |e| CollectiveError::Nccl(format!("{what}: {:?}", e.0))
}

fn driver_err(what: &str) -> impl Fn(candle_core::cuda_backend::cudarc::driver::DriverError) -> CollectiveError + '_ {
    move |e| CollectiveError::Nccl(format!("{what}: {e}"))
}

impl Nccl {
    /// A new NCCL unique id (made on rank 0, sent to every rank through the rendezvous), as hex.
    pub fn unique_id() -> Result<String, CollectiveError> {
        let id = comm::unique_id().map_err(nccl_err("ncclGetUniqueId"))?;
        Ok(id.iter().map(|&c| format!("{:02x}", c as u8)).collect())
    }

    /// Joins the communicator of `world` ranks named by `id` (from [`Nccl::unique_id`]) as `rank`,
    /// on `device`'s GPU with a stream of its own.
    pub fn new(
        device: &Device,
        rank: usize,
        world: usize,
        id: &str,
        timeout: Duration,
        abort: Arc<Abort>,
    ) -> Result<Nccl, CollectiveError> {
        let Device::Cuda(dev) = device else {
            return Err(CollectiveError::Nccl(format!("rank {rank}: NCCL needs a CUDA device, not {device:?}")));
        };
        let bytes: Vec<u8> = (0..id.len() / 2)
            .map(|i| u8::from_str_radix(id.get(2 * i..2 * i + 2).unwrap_or("zz"), 16))
            .collect::<Result<_, _>>()
            .map_err(|_| CollectiveError::Rendezvous("the NCCL unique id is not hex".into()))?;
        let mut internal = [0 as std::ffi::c_char; 128];
        if bytes.len() != internal.len() {
            return Err(CollectiveError::Rendezvous(format!("the NCCL unique id has {} bytes, not 128", bytes.len())));
        }
        for (d, b) in internal.iter_mut().zip(&bytes) {
            *d = *b as std::ffi::c_char;
        }
        let ctx = dev.cuda_stream().context().clone();
        if !ctx.is_event_tracking() {
            // NCCL's stream shares buffers with the compute stream; without the allocations'
            // events nothing would order their uses (kernels::skip_allocation_events).
            return Err(CollectiveError::Nccl(format!(
                "rank {rank}: this process runs a serving engine, which turned off CUDA's \
                 cross-stream events; run NCCL ranks in their own processes (the launcher does)"
            )));
        }
        let stream = ctx.new_stream().map_err(driver_err("a stream for NCCL"))?;
        let comm = Comm::join(stream.clone(), rank, world, internal).map_err(nccl_err("ncclCommInitRank"))?;
        Ok(Nccl { comm, device: dev.clone(), stream, timeout, abort, timeline: None })
    }

    /// Waits on the host for everything queued on NCCL's stream, checking NCCL's asynchronous
    /// error and the launcher's stop, up to the collective timeout.
    fn wait_host(&mut self, op: &'static str) -> Result<(), CollectiveError> {
        let done = self.stream.record_event(None).map_err(driver_err("recording an event"))?;
        let start = Instant::now();
        let mut pause = Duration::from_micros(20);
        loop {
            if done.try_is_complete().map_err(driver_err(op))? {
                return Ok(());
            }
            if let Err(code) = self.comm.async_error() {
                return Err(CollectiveError::Nccl(format!(
                    "{op}: NCCL reported {code:?} (a peer failed or a connection broke)"
                )));
            }
            if let Some(reason) = self.abort.reason() {
                return Err(CollectiveError::Aborted { reason });
            }
            if start.elapsed() > self.timeout {
                return Err(CollectiveError::Timeout { peer: usize::MAX, op, seconds: self.timeout.as_secs() });
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(5));
        }
    }

    /// Brackets one operation with timing events while a timeline is being recorded.
    fn timed<R>(
        &mut self,
        label: &str,
        f: impl FnOnce(&mut Self) -> Result<R, CollectiveError>,
    ) -> Result<R, CollectiveError> {
        let timing = Some(sys::CUevent_flags::CU_EVENT_DEFAULT);
        let start = match self.timeline {
            Some(_) => Some(self.stream.record_event(timing).map_err(driver_err("recording an event"))?),
            None => None,
        };
        let r = f(self)?;
        if let (Some(start), Some(tl)) = (start, self.timeline.as_mut()) {
            let end = self.stream.record_event(timing).map_err(driver_err("recording an event"))?;
            tl.ops.push((label.to_string(), start, end));
        }
        Ok(r)
    }

    /// A tensor owning `buf` (on this rank's device).
    fn tensor<T: CudaDType>(&self, buf: CudaSlice<T>) -> Tensor {
        let n = buf.len();
        let storage = Storage::Cuda(CudaStorage::wrap_cuda_slice(buf, self.device.clone()));
        Tensor::from_storage(storage, n, BackpropOp::none(), false)
    }

    /// Makes NCCL's stream wait for the work the compute stream (this thread's, as candle queues
    /// it) has queued so far: the kernels that wrote the operation's inputs among it.
    fn follow_compute(&self) -> Result<(), CollectiveError> {
        let compute = self.device.cuda_stream();
        let queued = compute.record_event(None).map_err(driver_err("recording the compute stream's position"))?;
        self.stream.wait(&queued).map_err(driver_err("ordering NCCL after the compute stream"))
    }

    /// An output buffer, allocated on the compute stream, not NCCL's: candle's copy kernels
    /// (`Tensor::cat`, index and gather ops) take a source's pointer against the stream the
    /// buffer was allocated on, so a buffer of NCCL's stream would be read by a compute-stream
    /// kernel without waiting for NCCL's write (ZeRO's gathered weights, joined with `cat`,
    /// went NaN on two GPUs and not with `CUDA_LAUNCH_BLOCKING=1`). Allocated on the compute
    /// stream, every reader waits for the write event NCCL records, and the free waits for it.
    fn alloc<T: DeviceRepr>(&self, n: usize) -> Result<CudaSlice<T>, CollectiveError> {
        // SAFETY: every caller hands the whole buffer to one NCCL operation that writes all of
        // it (each element of a sum, a gathered span or a reduced span) before any read, and a
        // buffer whose operation failed is dropped unread.
        unsafe { self.device.cuda_stream().alloc::<T>(n) }.map_err(driver_err("allocating a collective's output"))
    }

    /// [`Nccl::alloc`], or nothing for no elements (CUDA allocates no empty buffer).
    fn alloc_nonempty<T: DeviceRepr>(&self, n: usize) -> Result<Option<CudaSlice<T>>, CollectiveError> {
        if n == 0 { Ok(None) } else { self.alloc(n).map(Some) }
    }

    /// The tensor owning `buf`, or an empty one of `dtype`.
    fn tensor_or_empty<T: CudaDType>(
        &self,
        buf: Option<CudaSlice<T>>,
        dtype: DType,
    ) -> Result<Tensor, CollectiveError> {
        Ok(match buf {
            Some(b) => self.tensor(b),
            None => Tensor::zeros(0, dtype, &Device::Cuda(self.device.clone()))?,
        })
    }

    /// A buffer for values the host reads back through NCCL's own stream (lengths, bytes).
    fn alloc_host_bound<T: DeviceRepr + ValidAsZeroBits>(&self, n: usize) -> Result<CudaSlice<T>, CollectiveError> {
        self.stream.alloc_zeros::<T>(n).map_err(driver_err("allocating a collective's output"))
    }
}

/// Calls `$body` with `$T` bound to the element type of `$dtype`.
macro_rules! by_dtype {
    ($dtype:expr, $T:ident => $body:expr) => {
        match $dtype {
            DType::F32 => {
                type $T = f32;
                $body
            }
            DType::F64 => {
                type $T = f64;
                $body
            }
            DType::BF16 => {
                type $T = bf16;
                $body
            }
            DType::F16 => {
                type $T = f16;
                $body
            }
            other => Err(CollectiveError::Tensor(format!("collectives carry floats, not {other:?}"))),
        }
    };
}

/// `t` flattened, contiguous and on `device` (a host tensor is copied over).
fn flat_on(t: &Tensor, device: &CudaDevice) -> Result<Tensor, CollectiveError> {
    let t = t.flatten_all()?.contiguous()?;
    Ok(if t.device().is_cuda() { t } else { t.to_device(&Device::Cuda(device.clone()))? })
}

impl Nccl {
    fn all_reduce_as<T: CudaDType + nccl::NcclType + DeviceRepr + ValidAsZeroBits>(
        &mut self,
        t: &Tensor,
    ) -> Result<Tensor, CollectiveError> {
        let t = flat_on(t, &self.device)?;
        self.follow_compute()?;
        let n = t.elem_count();
        let mut out = self.alloc::<T>(n)?;
        {
            let (storage, layout) = t.storage_and_layout();
            let Storage::Cuda(c) = &*storage else { return Err(CollectiveError::Tensor("not on the GPU".into())) };
            let (a, b) = layout.contiguous_offsets().ok_or_else(|| CollectiveError::Tensor("not contiguous".into()))?;
            let src = c.as_cuda_slice::<T>()?.slice(a..b);
            let dst = out.slice_mut(0..n);
            let mut group = self.comm.group().map_err(nccl_err("ncclGroupStart"))?;
            group.all_reduce(src, dst).map_err(nccl_err("ncclAllReduce"))?;
            group.end().map_err(nccl_err("ncclGroupEnd"))?;
        }
        Ok(self.tensor(out))
    }

    fn reduce_scatter_as<T: CudaDType + nccl::NcclType + DeviceRepr + ValidAsZeroBits>(
        &mut self,
        t: &Tensor,
        spans: &[Span],
    ) -> Result<Tensor, CollectiveError> {
        let t = flat_on(t, &self.device)?;
        self.follow_compute()?;
        let rank = self.comm.rank();
        if t.elem_count() != total(spans) {
            return Err(CollectiveError::Mismatch(format!(
                "reduce-scatter of {} elements over spans of {}",
                t.elem_count(),
                total(spans)
            )));
        }
        // One buffer for the spans this rank owns, in span order: NCCL writes each part of it.
        let mut out = self.alloc_nonempty::<T>(owned(spans, rank))?;
        {
            let (storage, layout) = t.storage_and_layout();
            let Storage::Cuda(c) = &*storage else { return Err(CollectiveError::Tensor("not on the GPU".into())) };
            let (a, _) = layout.contiguous_offsets().ok_or_else(|| CollectiveError::Tensor("not contiguous".into()))?;
            let src = c.as_cuda_slice::<T>()?;
            let mut group = self.comm.group().map_err(nccl_err("ncclGroupStart"))?;
            let dst = out.as_mut().map(|o| group.output(o.slice_mut(..)));
            for (off, mine, s) in placed(spans, rank) {
                let view = src.slice(a + off..a + off + s.len);
                let part = match mine {
                    Some(at) => Some(dst.and_then(|d| d.part(at, s.len)).ok_or_else(|| part_err(at, s.len))?),
                    None => None,
                };
                group.reduce(view, part, s.owner).map_err(nccl_err("ncclReduce"))?;
            }
            group.end().map_err(nccl_err("ncclGroupEnd"))?;
        }
        self.tensor_or_empty(out, t.dtype())
    }

    fn all_gather_as<T: CudaDType + nccl::NcclType + DeviceRepr + ValidAsZeroBits>(
        &mut self,
        mine: &Tensor,
        spans: &[Span],
    ) -> Result<Tensor, CollectiveError> {
        let rank = self.comm.rank();
        if mine.elem_count() != owned(spans, rank) {
            return Err(CollectiveError::Mismatch(format!(
                "all-gather: rank {rank} holds {} elements, its spans {}",
                mine.elem_count(),
                owned(spans, rank)
            )));
        }
        let dtype = mine.dtype();
        let mut out = self.alloc_nonempty::<T>(total(spans))?;
        let mine = if mine.elem_count() == 0 { None } else { Some(flat_on(mine, &self.device)?) };
        self.follow_compute()?;
        {
            let guard = mine.as_ref().map(|m| m.storage_and_layout());
            let src = match &guard {
                Some((storage, layout)) => {
                    let Storage::Cuda(c) = &**storage else {
                        return Err(CollectiveError::Tensor("not on the GPU".into()));
                    };
                    let (a, b) =
                        layout.contiguous_offsets().ok_or_else(|| CollectiveError::Tensor("not contiguous".into()))?;
                    Some(c.as_cuda_slice::<T>()?.slice(a..b))
                }
                None => None,
            };
            let mut group = self.comm.group().map_err(nccl_err("ncclGroupStart"))?;
            let dst = out.as_mut().map(|o| group.output(o.slice_mut(..)));
            // This rank's spans are sent from its own buffer, in order (a broadcast's root).
            for (off, mine, s) in placed(spans, rank) {
                let send = match (&src, mine) {
                    (Some(src), Some(from)) => Some(src.slice(from..from + s.len)),
                    _ => None,
                };
                let part = dst.and_then(|d| d.part(off, s.len)).ok_or_else(|| part_err(off, s.len))?;
                group.broadcast(send, part, s.owner).map_err(nccl_err("ncclBroadcast"))?;
            }
            group.end().map_err(nccl_err("ncclGroupEnd"))?;
        }
        self.tensor_or_empty(out, dtype)
    }
}

/// A span that does not fit the buffer laid out for the spans (the span arithmetic is wrong).
fn part_err(at: usize, len: usize) -> CollectiveError {
    CollectiveError::Mismatch(format!("a span of {len} elements at {at} lies outside its buffer"))
}

impl Collective for Nccl {
    fn rank(&self) -> usize {
        self.comm.rank()
    }

    fn world(&self) -> usize {
        self.comm.world()
    }

    fn backend(&self) -> Backend {
        Backend::Nccl
    }

    fn all_reduce(&mut self, t: &Tensor) -> Result<Tensor, CollectiveError> {
        let dtype = t.dtype();
        self.timed("all-reduce", |s| by_dtype!(dtype, T => s.all_reduce_as::<T>(t)))
    }

    fn reduce_scatter(&mut self, t: &Tensor, spans: &[Span]) -> Result<Tensor, CollectiveError> {
        let dtype = t.dtype();
        self.timed("reduce-scatter", |s| by_dtype!(dtype, T => s.reduce_scatter_as::<T>(t, spans)))
    }

    fn all_gather(&mut self, mine: &Tensor, spans: &[Span]) -> Result<Tensor, CollectiveError> {
        let dtype = mine.dtype();
        self.timed("all-gather", |s| by_dtype!(dtype, T => s.all_gather_as::<T>(mine, spans)))
    }

    fn all_gather_bytes(&mut self, bytes: &[u8]) -> Result<Vec<Vec<u8>>, CollectiveError> {
        let world = self.comm.world();
        // Lengths first, then every rank's bytes padded to the longest.
        let len = self.stream.clone_htod(&[bytes.len() as u64]).map_err(driver_err("copying to the GPU"))?;
        let mut lens = self.alloc_host_bound::<u64>(world)?;
        {
            let mut group = self.comm.group().map_err(nccl_err("ncclGroupStart"))?;
            group.all_gather(len.slice(0..1), lens.slice_mut(0..world)).map_err(nccl_err("ncclAllGather"))?;
            group.end().map_err(nccl_err("ncclGroupEnd"))?;
        }
        self.wait_host("host gather")?;
        let lens = self.stream.clone_dtoh(&lens).map_err(driver_err("copying from the GPU"))?;
        let longest = lens.iter().copied().max().unwrap_or(0).max(1) as usize;
        let mut padded = bytes.to_vec();
        padded.resize(longest, 0);
        let send = self.stream.clone_htod(&padded).map_err(driver_err("copying to the GPU"))?;
        let mut all = self.alloc_host_bound::<u8>(longest * world)?;
        {
            let mut group = self.comm.group().map_err(nccl_err("ncclGroupStart"))?;
            group
                .all_gather(send.slice(0..longest), all.slice_mut(0..longest * world))
                .map_err(nccl_err("ncclAllGather"))?;
            group.end().map_err(nccl_err("ncclGroupEnd"))?;
        }
        self.wait_host("host gather")?;
        let all = self.stream.clone_dtoh(&all).map_err(driver_err("copying from the GPU"))?;
        Ok(lens.iter().enumerate().map(|(r, &l)| all[r * longest..r * longest + l as usize].to_vec()).collect())
    }

    fn synchronize(&mut self) -> Result<(), CollectiveError> {
        self.wait_host("synchronize")
    }

    fn record_timeline(&mut self, on: bool) {
        self.timeline = if on {
            let timing = Some(sys::CUevent_flags::CU_EVENT_DEFAULT);
            match self.stream.record_event(timing).and_then(|base| base.synchronize().map(|_| base)) {
                Ok(base) => Some(Timeline { base, base_at: Instant::now(), ops: Vec::new() }),
                Err(_) => None,
            }
        } else {
            None
        };
    }

    fn timeline(&mut self) -> Vec<(String, Instant, Instant)> {
        let Some(tl) = self.timeline.as_mut() else { return Vec::new() };
        let ops = std::mem::take(&mut tl.ops);
        let at = |e: &CudaEvent| {
            e.synchronize().ok()?;
            let ms = tl.base.elapsed_ms(e).ok()?;
            Some(tl.base_at + Duration::from_secs_f64(f64::from(ms.max(0.0)) / 1e3))
        };
        ops.iter().filter_map(|(label, s, e)| Some((label.clone(), at(s)?, at(e)?))).collect()
    }
}
