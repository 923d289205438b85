//! How much memory a device has free: what a serving engine sizes its key/value cache from.

use candle_core::{Device, Result};

/// Bytes free on `device` now: the CUDA driver's free device memory, or the host's available
/// memory (`MemAvailable` of `/proc/meminfo`) for the CPU.
pub fn free_bytes(device: &Device) -> Result<u64> {
    match device {
        Device::Cpu => cpu_available(),
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

fn cpu_available() -> Result<u64> {
    let info = std::fs::read_to_string("/proc/meminfo")
        .map_err(|e| candle_core::Error::Msg(format!("free memory: /proc/meminfo: {e}")))?;
    info.lines()
        .find_map(|l| l.strip_prefix("MemAvailable:"))
        .and_then(|v| v.trim().strip_suffix("kB"))
        .and_then(|kb| kb.trim().parse::<u64>().ok())
        .map(|kb| kb * 1024)
        .ok_or_else(|| candle_core::Error::Msg("free memory: /proc/meminfo has no MemAvailable".into()))
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_host_reports_some_free_memory() {
        assert!(super::free_bytes(&candle_core::Device::Cpu).unwrap() > 1 << 20);
    }
}
