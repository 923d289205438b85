//! The chunk passes of the lm_head cross-entropy on the GPU (`cuda/cross_entropy.cu`).

use super::{
    Elem, Kernel, LaunchConfig, Module, PushKernelArg, alloc, device, grid_for, int, launch, module, tensor, with_views,
};
use candle_core::{DType, Result, Tensor};

const MODULE: Module = module!("cross_entropy");

/// `[N, 1]` f32: one warp per row, eight rows per block.
pub(crate) fn row_lse<T: Elem>(logits: &Tensor) -> Result<Tensor> {
    let dev = device(logits)?;
    let (n, c) = logits.dims2()?;
    let mut lse = alloc::<f32>(&dev, n)?;
    let k = Kernel::new::<T>(&dev, &MODULE, "row_lse")?;
    with_views::<T, _, 1>([logits], |[x]| {
        let mut b = k.builder();
        let (n_i, c_i) = (int(n)?, int(c)?);
        b.arg(&x).arg(&mut lse).arg(&n_i).arg(&c_i);
        let cfg =
            LaunchConfig { grid_dim: (n.div_ceil(8).max(1) as u32, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
        launch(b, cfg)
    })?;
    Ok(tensor(lse, &dev, (n, 1)))
}

pub(crate) fn chunk_grad<T: Elem>(
    logits: &Tensor,
    lse: &Tensor,
    weight: &Tensor,
    targets: &Tensor,
    v0: usize,
) -> Result<Tensor> {
    let dev = device(logits)?;
    let (n, c) = logits.dims2()?;
    let (lse, weight) = (lse.to_dtype(DType::F32)?, weight.to_dtype(DType::F32)?);
    let mut out = alloc::<T>(&dev, n * c)?;
    let k = Kernel::new::<T>(&dev, &MODULE, "ce_chunk_grad")?;
    with_views::<T, _, 1>([logits], |[x]| {
        with_views::<f32, _, 2>([&lse, &weight], |[lse, weight]| {
            with_views::<u32, _, 1>([targets], |[t]| {
                let mut b = k.builder();
                let (v0, n_i, c_i) = (int(v0)?, int(n)?, int(c)?);
                b.arg(&x).arg(&lse).arg(&weight).arg(&t).arg(&v0).arg(&n_i).arg(&c_i).arg(&mut out);
                launch(b, grid_for(n * c, 256))
            })
        })
    })?;
    Ok(tensor(out, &dev, (n, c)))
}
