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
        check_host_arch(&hw.arch, std::env::consts::ARCH)?;
        return Ok(Device::Cpu);
    }
    match hw.name.vendor() {
        Vendor::Nvidia => {
            let device = cuda(hw.gpus)?;
            check_gpu_arch(&device, &hw.arch)?;
            Ok(device)
        }
        // `recipe check` refuses AMD GPUs (no launch path); a recipe built in code may still ask.
        Vendor::Amd => Err(RunError::Recipe(format!(
            "hardware.name `{:?}` asks for AMD GPUs: this build compiles the kernels for HIP \
             (scripts/build-hip) but has no HIP launch path yet; set hardware.gpus: 0 to train on the CPU",
            hw.name
        ))),
        Vendor::Cpu => Ok(Device::Cpu),
    }
}

/// A CPU run's `hardware.arch`: `native` is whatever this machine is; `x86_64` or `aarch64`
/// names the machine the recipe (and its plan) was made for, and another one is refused.
fn check_host_arch(arch: &str, host: &str) -> Result<(), RunError> {
    if arch == "native" || arch == host {
        return Ok(());
    }
    Err(RunError::Recipe(format!(
        "hardware.arch is {arch} but this machine is {host}: run the recipe on an {arch} host, or set \
         hardware.arch: native"
    )))
}

/// An NVIDIA run's `hardware.arch` (`sm_90`, `sm_100`) against the GPU's compute capability.
#[cfg(feature = "cuda")]
fn check_gpu_arch(device: &Device, arch: &str) -> Result<(), RunError> {
    use candle_core::cuda_backend::cudarc::driver::sys::CUdevice_attribute as A;
    let Device::Cuda(dev) = device else { return Ok(()) };
    let ctx = dev.cuda_stream().context().clone();
    let attr = |a| ctx.attribute(a).map_err(|e| RunError::Recipe(format!("reading the GPU's compute capability: {e}")));
    let found = format!(
        "sm_{}{}",
        attr(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
        attr(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?
    );
    if found == arch {
        return Ok(());
    }
    Err(RunError::Recipe(format!(
        "hardware.arch is {arch} but this GPU is {found}: the recipe names other hardware (hardware.name)"
    )))
}

#[cfg(not(feature = "cuda"))]
fn check_gpu_arch(_device: &Device, _arch: &str) -> Result<(), RunError> {
    Ok(())
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
    fn a_cpu_recipe_for_another_architecture_is_refused() {
        assert!(check_host_arch("native", "x86_64").is_ok());
        assert!(check_host_arch("x86_64", "x86_64").is_ok());
        let other = check_host_arch("aarch64", "x86_64").unwrap_err().to_string();
        assert!(other.contains("hardware.arch is aarch64") && other.contains("x86_64"), "{other}");
        let mut r = recipe(HardwareName::Cpu, 0);
        r.hardware.arch = if std::env::consts::ARCH == "x86_64" { "aarch64" } else { "x86_64" }.into();
        assert!(run_device(&r).is_err());
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
