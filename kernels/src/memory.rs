//! How much memory a device has free: what a serving engine sizes its key/value cache from.

use candle_core::{Device, Result};

/// Bytes free on `device` now: the CUDA driver's free device memory, or the host's available
/// memory (`MemAvailable` of `/proc/meminfo`) for the CPU.
pub fn free_bytes(device: &Device) -> Result<u64> {
    match device {
        Device::Cpu => meminfo("MemAvailable:"),
        #[cfg(feature = "cuda")]
        Device::Cuda(dev) => {
            use candle_core::cuda_backend::WrapErr;
            use candle_core::cuda_backend::cudarc::driver::result;
            dev.cuda_stream().context().bind_to_thread().w()?;
            let (free, _total) = result::mem_get_info().w()?;
            Ok(free as u64)
        }
        #[allow(unreachable_patterns)]
        other => candle_core::bail!("free memory: {:?} is not supported", other.location()),
    }
}

/// Bytes of memory `device` has in all: the CUDA device's total, or the host's (`MemTotal` of
/// `/proc/meminfo`) for the CPU.
pub fn total_bytes(device: &Device) -> Result<u64> {
    match device {
        Device::Cpu => meminfo("MemTotal:"),
        #[cfg(feature = "cuda")]
        Device::Cuda(dev) => {
            use candle_core::cuda_backend::WrapErr;
            use candle_core::cuda_backend::cudarc::driver::result;
            dev.cuda_stream().context().bind_to_thread().w()?;
            let (_free, total) = result::mem_get_info().w()?;
            Ok(total as u64)
        }
        #[allow(unreachable_patterns)]
        other => candle_core::bail!("device memory: {:?} is not supported", other.location()),
    }
}

/// Makes the device's default memory pool keep freed blocks instead of handing them back to
/// the driver at every synchronisation. candle allocates every op's output (stream-ordered
/// `cuMemAllocAsync`) and frees it when the tensor drops; with the pool's default release
/// threshold of 0, a training step or a serving step that synchronises pays for mapping its
/// memory again on each step. Call once per process, before the first step; CPU devices are
/// left alone.
pub fn cache_freed_memory(device: &Device) -> Result<()> {
    #[cfg(feature = "cuda")]
    if let Device::Cuda(dev) = device {
        use candle_core::cuda_backend::WrapErr;
        use candle_core::cuda_backend::cudarc::driver::{result, sys};
        let ctx = dev.cuda_stream().context().clone();
        ctx.bind_to_thread().w()?;
        let mut threshold = u64::MAX;
        // SAFETY: the device comes from a live context; the attribute takes a u64 by pointer.
        unsafe {
            let pool = result::device::get_default_mem_pool(ctx.cu_device()).w()?;
            let attr = sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD;
            result::mem_pool::set_attribute(pool, attr, (&mut threshold as *mut u64).cast()).w()?;
        }
    }
    let _ = device;
    Ok(())
}

/// Stops cudarc from creating two CUDA events with every allocation on a context that has one
/// stream, and returns whether it did. The events exist to synchronise slices used on several
/// streams; on one stream they are never recorded, only created and destroyed, which cost a
/// decode step of a 36-layer model 0.7 ms of host time (H200, `serve_bench probe`). A context
/// that already has a second stream (NCCL's) keeps them, and `collective::Nccl` refuses a
/// context where they are off. CPU devices are left alone.
pub fn skip_allocation_events(device: &Device) -> Result<bool> {
    #[cfg(feature = "cuda")]
    if let Device::Cuda(dev) = device {
        let ctx = dev.cuda_stream().context().clone();
        if ctx.is_in_multi_stream_mode() {
            return Ok(false);
        }
        // SAFETY: the context has one stream, so no slice can be used on another; a later
        // second stream (NCCL) checks `is_event_tracking` and refuses to start.
        unsafe { ctx.disable_event_tracking() };
        return Ok(true);
    }
    let _ = device;
    Ok(false)
}

/// Waits for everything any thread queued on `device`. candle's CUDA device is the per-thread
/// default stream: what one thread queues is not ordered after another thread's work, so a
/// thread that takes over tensors another thread made (the serving engine's thread, a
/// collective's thread) waits here first. CPU devices return at once.
pub fn settle(device: &Device) -> Result<()> {
    #[cfg(feature = "cuda")]
    if let Device::Cuda(dev) = device {
        use candle_core::cuda_backend::WrapErr;
        dev.cuda_stream().context().synchronize().w()?;
    }
    let _ = device;
    Ok(())
}

/// A `/proc/meminfo` line's value (`MemTotal:`, `MemAvailable:`) in bytes.
fn meminfo(key: &str) -> Result<u64> {
    let info = std::fs::read_to_string("/proc/meminfo")
        .map_err(|e| candle_core::Error::Msg(format!("host memory: /proc/meminfo: {e}")))?;
    info.lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.trim().strip_suffix("kB"))
        .and_then(|kb| kb.trim().parse::<u64>().ok())
        .map(|kb| kb * 1024)
        .ok_or_else(|| candle_core::Error::Msg(format!("host memory: /proc/meminfo has no {key}")))
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_host_reports_its_memory_and_some_of_it_free() {
        let cpu = candle_core::Device::Cpu;
        let (free, total) = (super::free_bytes(&cpu).unwrap(), super::total_bytes(&cpu).unwrap());
        assert!(free > 1 << 20 && total >= free, "free {free}, total {total}");
    }
}
