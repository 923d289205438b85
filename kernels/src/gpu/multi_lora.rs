//! Several LoRA adapters in one batch on the GPU (`cuda/multi_lora.cu`): the base GEMM through
//! the planned cuBLAS path into a fresh buffer, then the shrink and expand kernels add each row's
//! adapter branch into it. The reference is `crate::multi_lora::reference` (a loop over adapters).

use super::{
    Elem, Kernel, Module, PushKernelArg, alloc, device, dtype_of, grid_for, int, launch, module, tensor, with_views,
};
use crate::KernelConfig;
use crate::multi_lora::{LoraStack, RowAdapters};
use candle_core::cuda_backend::cudarc::cublas::{CudaBlas, Gemm};
use candle_core::{DType, Result, Tensor};

const MODULE: Module = module!("multi_lora");

/// `None` when the tensors are not all f32 or all bf16 on one CUDA device.
pub(crate) fn forward(
    cfg: &KernelConfig,
    x: &Tensor,
    w: &Tensor,
    lora: &LoraStack,
    rows: &RowAdapters,
) -> Result<Option<Tensor>> {
    match dtype_of(&[x, w, &lora.a, &lora.b]) {
        Some(DType::F32) => typed::<f32>(cfg, x, w, lora, rows).map(Some),
        Some(DType::BF16) => typed::<half::bf16>(cfg, x, w, lora, rows).map(Some),
        _ => Ok(None),
    }
}

fn typed<T: Elem>(cfg: &KernelConfig, x: &Tensor, w: &Tensor, lora: &LoraStack, rows: &RowAdapters) -> Result<Tensor>
where
    CudaBlas: Gemm<T>,
{
    let dev = device(x)?;
    let (n, d_in) = x.dims2()?;
    let (_, mr, _) = lora.a.dims3()?;
    let r = lora.rank()?;
    let d_out = w.dim(0)?;
    // Member boundaries (output rows where the next member starts); past the end when absent.
    let mut bounds = [d_out; crate::multi_lora::MAX_MEMBERS - 1];
    let mut row = 0;
    for (i, rows) in lora.member_rows.iter().take(bounds.len()).enumerate() {
        row += rows;
        bounds[i] = row.min(d_out);
    }
    let (mut y, _, _) = super::gemm::sum_slice::<T>(cfg, &[(x, w)], true)?;
    let scales: Vec<f32> = lora.scales.iter().map(|&s| s as f32).collect();
    let scales = Tensor::new(scales.as_slice(), x.device())?;
    let ids = rows.device_ids()?;
    let mut xa = alloc::<f32>(&dev, n * mr)?;
    let (n_i, r_i, mr_i, in_i, out_i) = (int(n)?, int(r)?, int(mr)?, int(d_in)?, int(d_out)?);
    let (b1, b2) = (int(bounds[0])?, int(bounds[1])?);
    let shrink = Kernel::new::<T>(&dev, &MODULE, "lora_shrink")?;
    let expand = Kernel::new::<T>(&dev, &MODULE, "lora_expand")?;
    with_views::<T, _, 3>([x, &lora.a, &lora.b], |[xv, av, bv]| {
        with_views::<f32, _, 1>([&scales], |[sv]| {
            with_views::<i32, _, 1>([ids], |[iv]| {
                let mut a = shrink.builder();
                a.arg(&xv).arg(&av).arg(&sv).arg(&iv).arg(&mut xa).arg(&n_i).arg(&mr_i).arg(&in_i);
                launch(a, grid_for(n * mr * 32, 256))?;
                let mut a = expand.builder();
                a.arg(&mut y).arg(&xa).arg(&bv).arg(&iv).arg(&n_i).arg(&r_i).arg(&out_i).arg(&mr_i).arg(&b1).arg(&b2);
                launch(a, grid_for(n * d_out, 256))
            })
        })
    })?;
    Ok(tensor(y, &dev, (n, d_out)))
}
