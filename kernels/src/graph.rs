//! CUDA graphs: a sequence of launches recorded once and replayed with one call.
//!
//! A serving engine's decode step of a 36-layer model is ~470 small launches; at batch 1 the
//! host needs longer to issue them (~16 µs each through candle) than the GPU needs to run them.
//! Recorded into a graph, the step costs the host one launch. What a graph replays is fixed at
//! capture: every kernel's arguments, grid and buffers. So the recorded work must read its
//! varying inputs from device buffers that outlive the graph (overwritten in place before each
//! replay), and every buffer allocated while recording must also be freed while recording (the
//! graph then owns that memory and reuses it on each replay). Copies from host memory cannot
//! be recorded: inputs are uploaded before [`Graph::replay`], never inside the recording.
//!
//! Only CUDA devices record graphs; [`capture`] on any other device is an error, which callers
//! treat as "run the work directly".

use candle_core::{Device, Result, Tensor};

/// A recorded graph, replayed on the stream of the thread that recorded it.
pub struct Graph {
    #[cfg(feature = "cuda")]
    inner: candle_core::cuda_backend::cudarc::driver::CudaGraph,
}

// SAFETY: a CUDA graph is a driver object any thread of the process may use, provided calls on
// it are serialised (the driver does not lock it). `Graph` is not `Sync` and its methods take
// `&self`, so moving it to another thread cannot make two threads call it at once.
#[cfg(feature = "cuda")]
unsafe impl Send for Graph {}

impl std::fmt::Debug for Graph {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Graph")
    }
}

/// Records what `record` queues on `device` (the calling thread's stream) into a graph,
/// without running it. `record` must not copy from the host or wait for the device (run both
/// inside [`with_host_copies_cached`]); an error
/// from it, or an operation the driver refuses to record, ends the recording and is returned.
/// Run the same work once directly before recording it, so that modules, library handles and
/// workspaces it creates on first use exist already.
pub fn capture(device: &Device, record: impl FnOnce() -> Result<()>) -> Result<Graph> {
    match device {
        #[cfg(feature = "cuda")]
        Device::Cuda(dev) => {
            use candle_core::cuda_backend::WrapErr;
            use candle_core::cuda_backend::cudarc::driver::sys;
            let stream = dev.cuda_stream();
            // Thread-local mode: only this thread's calls that could break the recording are
            // refused; other threads (HTTP handlers) never touch the device.
            stream.begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL).w()?;
            let recorded = record();
            // The recording ends either way, so that a failed one leaves the stream usable.
            let ended = stream.end_capture(sys::CUgraphInstantiate_flags(0));
            recorded?;
            match ended.w()? {
                Some(inner) => {
                    inner.upload().w()?;
                    Ok(Graph { inner })
                }
                None => candle_core::bail!("cuda graph: nothing was recorded"),
            }
        }
        other => {
            let _ = record;
            candle_core::bail!("cuda graph: {:?} devices do not record graphs", other.location())
        }
    }
}

/// Runs `work` with candle's cache of small host→device copies turned on for this thread.
/// candle uploads the shape and strides of every strided op's operand from a host vector; a
/// recording cannot copy from the host (the vector is gone by the time the graph replays), so
/// the direct run before a recording and the recording itself run inside this: the direct run
/// fills the cache, the recording reuses its device copies (and fails on a miss rather than
/// record a copy from freed host memory). The cached copies live as long as the thread.
pub fn with_host_copies_cached<R>(device: &Device, work: impl FnOnce() -> R) -> R {
    #[cfg(feature = "cuda")]
    let _cached = match device {
        Device::Cuda(dev) => Some(dev.enable_cuda_graph_htod_cache()),
        _ => None,
    };
    let _ = device;
    work()
}

/// Gives candle's cuBLAS handle on `device` a workspace of its own for the life of the process,
/// once. Without one, cuBLAS takes its workspace from the stream's memory pool as it sees fit; a
/// workspace taken while a graph records belongs to that graph, and a GEMM run later outside it
/// (or a replay after cuBLAS let it go) reads memory it no longer owns. PyTorch sets one for
/// the same reason. 32 MiB: what NVIDIA recommends for Hopper. CPU devices are left alone.
pub fn pin_blas_workspace(device: &Device) -> Result<()> {
    #[cfg(feature = "cuda")]
    if let Device::Cuda(dev) = device {
        use candle_core::cuda_backend::WrapErr;
        use candle_core::cuda_backend::cudarc::cublas::sys;
        use candle_core::cuda_backend::cudarc::driver::DevicePtrMut;
        use std::collections::HashSet;
        use std::sync::Mutex;
        const BYTES: usize = 32 << 20;
        static PINNED: Mutex<Option<HashSet<usize>>> = Mutex::new(None);
        let mut pinned = PINNED.lock().unwrap_or_else(|e| e.into_inner());
        let key = std::sync::Arc::as_ptr(&dev.cublas_handle()) as usize;
        if !pinned.get_or_insert_with(HashSet::new).insert(key) {
            return Ok(());
        }
        let stream = dev.cuda_stream();
        // SAFETY: only cuBLAS writes the workspace.
        let mut workspace = unsafe { stream.alloc::<u8>(BYTES) }.w()?;
        let (ptr, _sync) = workspace.device_ptr_mut(&stream);
        let handle = *dev.cublas_handle().handle();
        // SAFETY: the handle is candle's live cuBLAS handle of this device; the buffer is
        // `BYTES` long and is never freed (leaked below), so it outlives every use of the handle.
        let status = unsafe { sys::cublasSetWorkspace_v2(handle, ptr as *mut std::ffi::c_void, BYTES) };
        drop(_sync);
        std::mem::forget(workspace);
        if status != sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
            candle_core::bail!("cuBLAS refused a workspace: {status:?}");
        }
    }
    let _ = device;
    Ok(())
}

impl Graph {
    /// Queues the recorded work on the recording thread's stream; returns without waiting.
    pub fn replay(&self) -> Result<()> {
        #[cfg(feature = "cuda")]
        {
            use candle_core::cuda_backend::WrapErr;
            self.inner.launch().w()
        }
        #[cfg(not(feature = "cuda"))]
        candle_core::bail!("cuda graph: built without the cuda feature")
    }
}

/// Overwrites `dst` (contiguous, same dtype and element count) with `src`'s elements in place:
/// how a graph's input buffers take a new step's values. A copy queued on `dst`'s device (on a
/// GPU a plain device-to-device copy: candle has no copy kernel for every dtype, i32 included).
pub fn overwrite(dst: &Tensor, src: &Tensor) -> Result<()> {
    if dst.elem_count() != src.elem_count() || dst.dtype() != src.dtype() {
        candle_core::bail!(
            "overwrite: {} elements of {:?} into a buffer of {} of {:?}",
            src.elem_count(),
            src.dtype(),
            dst.elem_count(),
            dst.dtype()
        );
    }
    #[cfg(feature = "cuda")]
    if let Device::Cuda(dev) = dst.device() {
        return copy_on_device(dev, dst, src);
    }
    dst.flatten_all()?.slice_set(&src.flatten_all()?, 0, 0)
}

#[cfg(feature = "cuda")]
fn copy_on_device(dev: &candle_core::cuda_backend::CudaDevice, dst: &Tensor, src: &Tensor) -> Result<()> {
    use candle_core::backend::BackendStorage;
    use candle_core::cuda_backend::cudarc::driver::{DevicePtr, result};
    use candle_core::cuda_backend::{CudaStorage, WrapErr};
    use candle_core::{DType, Storage};
    let stream = dev.cuda_stream();
    let base = |storage: &CudaStorage| -> Result<u64> {
        Ok(match storage.dtype() {
            DType::U32 => storage.as_cuda_slice::<u32>()?.device_ptr(&stream).0,
            DType::I32 => storage.as_cuda_slice::<i32>()?.device_ptr(&stream).0,
            DType::F32 => storage.as_cuda_slice::<f32>()?.device_ptr(&stream).0,
            DType::BF16 => storage.as_cuda_slice::<half::bf16>()?.device_ptr(&stream).0,
            other => candle_core::bail!("overwrite: {other:?} buffers are not supported"),
        })
    };
    let size = dst.dtype().size_in_bytes() as u64;
    let (ds, dl) = dst.storage_and_layout();
    let (ss, sl) = src.storage_and_layout();
    let (Some((d0, _)), Some((s0, _))) = (dl.contiguous_offsets(), sl.contiguous_offsets()) else {
        candle_core::bail!("overwrite: buffers must be contiguous")
    };
    let (Storage::Cuda(dc), Storage::Cuda(sc)) = (&*ds, &*ss) else {
        candle_core::bail!("overwrite: both buffers must be on the GPU")
    };
    let (to, from) = (base(dc)? + d0 as u64 * size, base(sc)? + s0 as u64 * size);
    // SAFETY: both ranges lie inside live allocations (offsets and counts from their layouts,
    // equal element counts and dtypes checked above) and the copy is queued on their stream.
    unsafe { result::memcpy_dtod_async(to, from, dst.elem_count() * size as usize, stream.cu_stream()) }.w()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cpu_records_no_graph_and_says_so() {
        let err = capture(&Device::Cpu, || Ok(())).unwrap_err().to_string();
        assert!(err.contains("do not record graphs"), "{err}");
    }

    #[test]
    fn overwrite_replaces_a_buffer_in_place_and_refuses_a_size_mismatch() -> Result<()> {
        let buf = Tensor::zeros(6, candle_core::DType::U32, &Device::Cpu)?;
        let view = buf.narrow(0, 2, 3)?;
        overwrite(&view, &Tensor::new(&[7u32, 8, 9], &Device::Cpu)?)?;
        assert_eq!(buf.to_vec1::<u32>()?, [0, 0, 7, 8, 9, 0]);
        assert!(overwrite(&view, &Tensor::new(&[1u32, 2], &Device::Cpu)?).is_err());
        Ok(())
    }
}
