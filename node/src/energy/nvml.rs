//! NVIDIA GPUs' energy from NVML's total-energy counter (`nvmlDeviceGetTotalEnergyConsumption`:
//! millijoules since the driver was loaded, 64 bits, so it does not wrap within a run): read
//! before and after. `libnvidia-ml.so.1` is loaded when the run starts; without it (no driver)
//! the reason says so.
//!
//! A run names its GPUs by CUDA ordinal; NVML numbers every GPU of the machine. The ordinal is
//! taken through `CUDA_VISIBLE_DEVICES` when it is set (an index or a `GPU-…` UUID there), else
//! as NVML's index: CUDA's default order is NVML's (PCI bus order) on machines of one GPU model,
//! the machines runs are spread over.

use super::Counter;
use nvml_wrapper::Nvml;

/// A GPU as NVML finds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NvmlRef {
    Index(u32),
    Uuid(String),
}

/// The NVML device behind CUDA ordinal `cuda`, given `CUDA_VISIBLE_DEVICES` (`visible`).
pub fn nvml_ref(cuda: usize, visible: Option<&str>) -> Result<NvmlRef, String> {
    let Some(list) = visible else {
        return u32::try_from(cuda).map(NvmlRef::Index).map_err(|_| format!("CUDA device {cuda}"));
    };
    let entry = list
        .split(',')
        .map(str::trim)
        .nth(cuda)
        .ok_or_else(|| format!("CUDA device {cuda} is not in CUDA_VISIBLE_DEVICES={list:?}"))?;
    if let Ok(i) = entry.parse::<u32>() {
        return Ok(NvmlRef::Index(i));
    }
    if entry.starts_with("MIG-") {
        return Err(format!(
            "CUDA device {cuda} is MIG instance {entry}: NVML counts energy per GPU, not per instance"
        ));
    }
    if entry.starts_with("GPU-") {
        return Ok(NvmlRef::Uuid(entry.to_string()));
    }
    Err(format!("CUDA_VISIBLE_DEVICES entry {entry:?} is neither an index nor a GPU UUID"))
}

/// The counters read when the run started.
pub struct Start {
    nvml: Nvml,
    /// NVML index, name and millijoules at the start, per GPU.
    devices: Vec<(u32, String, u64)>,
}

/// Reads the counters of the run's GPUs (CUDA ordinals).
pub fn start(gpus: &[usize]) -> Result<Start, String> {
    let nvml = Nvml::init().map_err(|e| format!("NVML could not be loaded ({e})"))?;
    let visible = std::env::var("CUDA_VISIBLE_DEVICES").ok();
    let mut devices = Vec::new();
    for &cuda in gpus {
        let device = match nvml_ref(cuda, visible.as_deref())? {
            NvmlRef::Index(i) => nvml.device_by_index(i),
            NvmlRef::Uuid(u) => nvml.device_by_uuid(u),
        }
        .map_err(|e| format!("CUDA device {cuda}: NVML: {e}"))?;
        let index = device.index().map_err(|e| format!("CUDA device {cuda}: NVML: {e}"))?;
        let name = device.name().unwrap_or_else(|_| "NVIDIA GPU".into());
        let mj = device
            .total_energy_consumption()
            .map_err(|e| format!("{name} (NVML index {index}): no total-energy counter ({e})"))?;
        devices.push((index, name, mj));
    }
    Ok(Start { nvml, devices })
}

impl Start {
    /// Each GPU's joules since [`start`].
    pub fn finish(self) -> Result<Vec<Counter>, String> {
        self.devices
            .iter()
            .map(|(index, name, before)| {
                let now = self
                    .nvml
                    .device_by_index(*index)
                    .and_then(|d| d.total_energy_consumption())
                    .map_err(|e| format!("{name} (NVML index {index}): {e}"))?;
                Ok(Counter {
                    source: "nvml".into(),
                    name: format!("{name} (NVML index {index})"),
                    joules: now.saturating_sub(*before) as f64 / 1e3,
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cuda_ordinals_are_found_through_cuda_visible_devices() {
        assert_eq!(nvml_ref(1, None), Ok(NvmlRef::Index(1)));
        assert_eq!(nvml_ref(1, Some("3, 5")), Ok(NvmlRef::Index(5)));
        assert_eq!(nvml_ref(0, Some("GPU-8f0c")), Ok(NvmlRef::Uuid("GPU-8f0c".into())));
        assert!(nvml_ref(2, Some("3,5")).unwrap_err().contains("not in CUDA_VISIBLE_DEVICES"));
        assert!(nvml_ref(0, Some("MIG-1234")).unwrap_err().contains("per GPU"));
        assert!(nvml_ref(0, Some("gpu0")).unwrap_err().contains("neither"));
    }
}
