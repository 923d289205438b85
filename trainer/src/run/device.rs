//! Where a run and its probe compute: the recipe's `hardware` decides, so a recipe and its plan
//! name one kind of machine and a run never silently falls back to another.

use super::RunError;
use crate::recipe::{Recipe, Vendor};
use candle_core::Device;

/// The host CPU for `hardware.gpus: 0`; for NVIDIA hardware, the first CUDA device (a process
/// trains on one GPU; a run on several has one rank process per GPU, each given its device by
/// [`named_device`]), with the device memory pool set to keep freed blocks. Anything this build
/// cannot run is an error that says what to do.
pub fn run_device(recipe: &Recipe) -> Result<Device, RunError> {
    let hw = &recipe.hardware;
    if hw.gpus == 0 {
        return Ok(Device::Cpu);
    }
    match hw.name.vendor() {
        Vendor::Nvidia => cuda(hw.gpus),
        Vendor::Amd => Err(RunError::Recipe(format!(
            "hardware.name `{:?}` asks for AMD GPUs: this build compiles the kernels for HIP \
             (scripts/build-hip) but has no HIP launch path yet; set hardware.gpus: 0 to train on the CPU",
            hw.name
        ))),
        Vendor::Cpu => Ok(Device::Cpu),
    }
}

#[cfg(feature = "cuda")]
fn cuda(gpus: u32) -> Result<Device, RunError> {
    if gpus > 1 {
        return Err(RunError::Recipe(format!(
            "hardware.gpus: {gpus}: one process trains on one GPU; `mindxtrain train` starts one rank per GPU"
        )));
    }
    cuda_ordinal(0)
}

#[cfg(not(feature = "cuda"))]
fn cuda(gpus: u32) -> Result<Device, RunError> {
    Err(RunError::Recipe(format!(
        "hardware.gpus: {gpus} on NVIDIA hardware, but this build has no CUDA: build with \
         scripts/build-gpu (feature `cuda`), or set hardware.gpus: 0 to train on the CPU"
    )))
}

/// A device by the name [`device_name`] gives it (`cpu`, `cuda:N`), as a launcher assigns one to
/// each rank; a CUDA device gets the memory pool setting of [`run_device`].
pub fn named_device(name: &str) -> Result<Device, RunError> {
    if name == "cpu" {
        return Ok(Device::Cpu);
    }
    let ordinal: usize = name
        .strip_prefix("cuda:")
        .and_then(|n| n.parse().ok())
        .ok_or_else(|| RunError::Recipe(format!("device `{name}`: expected cpu or cuda:N")))?;
    cuda_ordinal(ordinal)
}

#[cfg(feature = "cuda")]
fn cuda_ordinal(ordinal: usize) -> Result<Device, RunError> {
    let device = Device::new_cuda(ordinal)
        .map_err(|e| RunError::Recipe(format!("cuda:{ordinal}: no CUDA device could be opened: {e}")))?;
    mindxtrain_kernels::cache_freed_memory(&device)?;
    Ok(device)
}

#[cfg(not(feature = "cuda"))]
fn cuda_ordinal(ordinal: usize) -> Result<Device, RunError> {
    Err(RunError::Recipe(format!("cuda:{ordinal}: this build has no CUDA (build with scripts/build-gpu)")))
}

/// The device as plans and events name it: `cpu` or `cuda:N`.
pub fn device_name(device: &Device) -> String {
    match device.location() {
        candle_core::DeviceLocation::Cpu => "cpu".into(),
        candle_core::DeviceLocation::Cuda { gpu_id } => format!("cuda:{gpu_id}"),
        candle_core::DeviceLocation::Metal { gpu_id } => format!("metal:{gpu_id}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::recipe::HardwareName;

    /// The demo recipe with its hardware set after parsing (run_device sees only the struct).
    fn recipe(name: HardwareName, gpus: u32) -> Recipe {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../recipes/tiny_cpu_lora.yaml");
        let mut r = Recipe::from_path(&path).unwrap().recipe;
        (r.hardware.name, r.hardware.gpus) = (name, gpus);
        r
    }

    #[test]
    fn cpu_recipes_run_on_the_cpu() {
        assert!(matches!(run_device(&recipe(HardwareName::Cpu, 0)), Ok(Device::Cpu)));
        assert!(matches!(run_device(&recipe(HardwareName::H100, 0)), Ok(Device::Cpu)));
        assert_eq!(device_name(&Device::Cpu), "cpu");
    }

    #[test]
    fn gpus_this_build_cannot_use_are_refused_with_what_to_do() {
        let amd = run_device(&recipe(HardwareName::Mi300x, 1)).unwrap_err().to_string();
        assert!(amd.contains("HIP") && amd.contains("gpus: 0"), "{amd}");
        let many = run_device(&recipe(HardwareName::H200, 8)).unwrap_err().to_string();
        assert!(many.contains("gpus: 8"), "{many}");
        if cfg!(not(feature = "cuda")) {
            let nv = run_device(&recipe(HardwareName::H100, 1)).unwrap_err().to_string();
            assert!(nv.contains("scripts/build-gpu") && nv.contains("gpus: 0"), "{nv}");
        }
    }
}
