//! Seeded draws on the GPU (`cuda/seeded.cu`): one launch per tensor; normals in f64, dropout
//! masks in f32.

use super::{Kernel, Module, PushKernelArg, grid_for, launch, module, with_views};
use candle_core::cuda_backend::CudaStorage;
use candle_core::op::BackpropOp;
use candle_core::{DType, Device, Result, Storage, Tensor};

const MODULE: Module = module!("seeded");

/// See `crate::seeded::normal`; the caller checked `states` against `n` and `block`.
pub(crate) fn normal(states: &[u64], block: usize, n: usize, scale: f64, device: &Device) -> Result<Tensor> {
    let Device::Cuda(dev) = device else { candle_core::bail!("seeded: not a CUDA device") };
    if n == 0 {
        return Tensor::zeros(0, DType::F64, device);
    }
    // candle has no u64 dtype: the states travel as i64 of the same bits.
    let states: Vec<i64> = states.iter().map(|&s| s as i64).collect();
    let states = Tensor::new(states.as_slice(), device)?;
    let mut out = dev.alloc_zeros::<f64>(n)?;
    let k = Kernel::named(dev, &MODULE, "seeded_normal_f64")?;
    with_views::<i64, _, 1>([&states], |[s]| {
        let mut b = k.builder();
        b.arg(&s).arg(&mut out).arg(&n).arg(&block).arg(&scale);
        launch(b, grid_for(n, 256))
    })?;
    let storage = Storage::Cuda(CudaStorage::wrap_cuda_slice(out, dev.clone()));
    Ok(Tensor::from_storage(storage, n, BackpropOp::none(), false))
}

/// See `crate::seeded::dropout_mask`: `[n]` f32 on `device`.
pub(crate) fn dropout_mask(state: u64, n: usize, p: f64, keep: f32, device: &Device) -> Result<Tensor> {
    let Device::Cuda(dev) = device else { candle_core::bail!("seeded: not a CUDA device") };
    if n == 0 {
        return Tensor::zeros(0, DType::F32, device);
    }
    let mut out = dev.alloc_zeros::<f32>(n)?;
    let k = Kernel::named(dev, &MODULE, "seeded_dropout_f32")?;
    let mut b = k.builder();
    b.arg(&state).arg(&mut out).arg(&n).arg(&p).arg(&keep);
    launch(b, grid_for(n, 256))?;
    let storage = Storage::Cuda(CudaStorage::wrap_cuda_slice(out, dev.clone()));
    Ok(Tensor::from_storage(storage, n, BackpropOp::none(), false))
}
