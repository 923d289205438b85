//! The MoE router's kernels (`moe_router_*` in `cuda/moe_router.cu`): one warp a token, the
//! CPU kernel's arithmetic (`moe::cpu`), results on the logits' device.

use super::{Elem, Kernel, Module, PushKernelArg, alloc, device, dtype_of, int, launch, module, tensor, with_views};
use crate::moe::router::{LossTerms, Routing};
use candle_core::cuda_backend::cudarc::driver::LaunchConfig;
use candle_core::{DType, Result, Tensor};

const MODULE: Module = module!("moe_router");
/// Eight tokens (warps) a block.
const THREADS: u32 = 256;
/// A lane marks its chosen experts in one 32-bit mask, one bit per expert it holds.
const MAX_EXPERTS: usize = 32 * 32;

fn grid(n: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (n.div_ceil(THREADS as usize / 32) as u32, 1, 1),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// The routing of `logits` `[N, E]` (f32 or bf16 on a GPU, E ≤ 1,024), or `None` where the
/// kernel does not serve them.
pub(crate) fn forward(logits: &Tensor, k: usize, norm_topk: bool) -> Result<Option<Routing>> {
    let (n, e) = logits.dims2()?;
    if n == 0 || e > MAX_EXPERTS {
        return Ok(None);
    }
    match dtype_of(&[logits]) {
        Some(DType::F32) => forward_as::<f32>(logits, n, e, k, norm_topk).map(Some),
        Some(DType::BF16) => forward_as::<half::bf16>(logits, n, e, k, norm_topk).map(Some),
        _ => Ok(None),
    }
}

fn forward_as<T: Elem>(logits: &Tensor, n: usize, e: usize, k: usize, norm_topk: bool) -> Result<Routing> {
    let dev = device(logits)?;
    let kernel = Kernel::new::<T>(&dev, &MODULE, "moe_router_fwd")?;
    let (mut probs, mut lse) = (alloc::<f32>(&dev, n * e)?, alloc::<f32>(&dev, n)?);
    let mut experts = dev.alloc_zeros::<u32>(n * k)?;
    let mut weights = alloc::<T>(&dev, n * k)?;
    let (n_i, e_i, k_i, norm) = (int(n)?, int(e)?, int(k)?, i32::from(norm_topk));
    with_views::<T, _, 1>([logits], |[l]| {
        let mut a = kernel.builder();
        a.arg(&l).arg(&mut probs).arg(&mut lse).arg(&mut experts).arg(&mut weights);
        a.arg(&n_i).arg(&e_i).arg(&k_i).arg(&norm);
        launch(a, grid(n))
    })?;
    Ok(Routing {
        probs: tensor(probs, &dev, (n, e)),
        lse: tensor(lse, &dev, n),
        experts: tensor(experts, &dev, (n, k)),
        weights: tensor(weights, &dev, (n, k)),
        norm_topk,
    })
}

/// `∂L/∂logits` from `∂L/∂weights` (f32 or bf16 on a GPU, a routing of this module's forward),
/// or `None` where the kernel does not serve them.
pub(crate) fn backward(d_weights: &Tensor, routing: &Routing, terms: &LossTerms) -> Result<Option<Tensor>> {
    let (n, e) = (routing.tokens(), routing.num_experts());
    let dev_ok =
        [&routing.probs, &routing.lse, &routing.experts].iter().all(|t| t.device().same_device(d_weights.device()));
    if n == 0 || e > MAX_EXPERTS || routing.probs.dtype() != DType::F32 || !dev_ok {
        return Ok(None);
    }
    match dtype_of(&[d_weights]) {
        Some(DType::F32) => backward_as::<f32>(d_weights, routing, terms).map(Some),
        Some(DType::BF16) => backward_as::<half::bf16>(d_weights, routing, terms).map(Some),
        _ => Ok(None),
    }
}

fn backward_as<T: Elem>(d_weights: &Tensor, routing: &Routing, terms: &LossTerms) -> Result<Tensor> {
    let dev = device(d_weights)?;
    let (n, e, k) = (routing.tokens(), routing.num_experts(), routing.k());
    let on = |t: &Tensor| t.to_device(d_weights.device())?.to_dtype(DType::F32);
    let balance = match &terms.balance {
        Some(b) => on(b)?,
        None => Tensor::zeros(e, DType::F32, d_weights.device())?,
    };
    let counted = match &terms.counted {
        Some(c) => on(c)?,
        None => Tensor::ones(n, DType::F32, d_weights.device())?,
    };
    let kernel = Kernel::new::<T>(&dev, &MODULE, "moe_router_bwd")?;
    let mut out = alloc::<T>(&dev, n * e)?;
    let (n_i, e_i, k_i, norm, z) = (int(n)?, int(e)?, int(k)?, i32::from(routing.norm_topk), terms.z as f32);
    with_views::<T, _, 1>([d_weights], |[dw]| {
        with_views::<f32, _, 4>([&routing.probs, &routing.lse, &balance, &counted], |[p, lse, b, c]| {
            with_views::<u32, _, 1>([&routing.experts], |[ex]| {
                let mut a = kernel.builder();
                a.arg(&dw).arg(&p).arg(&lse).arg(&ex).arg(&b).arg(&c).arg(&z).arg(&norm).arg(&mut out);
                a.arg(&n_i).arg(&e_i).arg(&k_i);
                launch(a, grid(n))
            })
        })
    })?;
    Ok(tensor(out, &dev, (n, e)))
}
