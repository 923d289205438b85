//! Per-row sampling on the GPU (`cuda/sampling.cu`): one block per row over the logits where
//! they are; only the chosen ids and their log-probabilities come back to the host.

use super::{Kernel, LaunchConfig, Module, PushKernelArg, alloc, device, int, launch, module, with_views};
use crate::sampling::RowSampling;
use candle_core::{DType, Result, Tensor};

const MODULE: Module = module!("sampling");

pub(crate) fn sample(logits: &Tensor, rows: &[RowSampling]) -> Result<Vec<(u32, f32)>> {
    let (n, vocab) = logits.dims2()?;
    let logits = match logits.dtype() {
        DType::F32 | DType::BF16 => logits.contiguous()?,
        _ => logits.to_dtype(DType::F32)?,
    };
    let dev = device(&logits)?;
    let d = logits.device();
    let col = |f: &dyn Fn(&RowSampling) -> f32| Tensor::new(rows.iter().map(f).collect::<Vec<f32>>().as_slice(), d);
    let (temp, top_p, uniform) = (col(&|r| r.temperature)?, col(&|r| r.top_p)?, col(&|r| r.uniform)?);
    let top_k = Tensor::new(rows.iter().map(|r| r.top_k).collect::<Vec<u32>>().as_slice(), d)?;
    let mut token = dev.alloc_zeros::<u32>(n)?;
    let mut logprob = alloc::<f32>(&dev, n)?;
    let vocab_i = int(vocab)?;
    let cfg = LaunchConfig { grid_dim: (n as u32, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
    with_views::<f32, _, 3>([&temp, &top_p, &uniform], |[tv, pv, uv]| {
        with_views::<u32, _, 1>([&top_k], |[kv]| {
            macro_rules! go {
                ($t:ty, $name:literal) => {{
                    let kernel = Kernel::named(&dev, &MODULE, $name)?;
                    with_views::<$t, _, 1>([&logits], |[lv]| {
                        let mut a = kernel.builder();
                        a.arg(&lv).arg(&tv).arg(&pv).arg(&kv).arg(&uv).arg(&mut token).arg(&mut logprob).arg(&vocab_i);
                        launch(a, cfg)
                    })
                }};
            }
            match logits.dtype() {
                DType::BF16 => go!(half::bf16, "sample_bf16"),
                _ => go!(f32, "sample_f32"),
            }
        })
    })?;
    let tokens = dev.clone_dtoh(&token)?;
    let logprobs = dev.clone_dtoh(&logprob)?;
    Ok(tokens.into_iter().zip(logprobs).collect())
}
