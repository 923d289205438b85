//! The gated delta rule's training forward in chunked form on the GPU
//! (`cuda/delta_rule_chunked.cu`, whose header gives the stages and their predicted cost): the
//! same contract as the fused-recurrent forward (`super::delta_rule::forward` with checkpoints),
//! which stays the decoding / prefill path (`crate::delta_rule::step`) and the backward.

use super::{
    Elem, Kernel, LaunchConfig, Module, PushKernelArg, alloc, device, int, launch, module, tensor, with_views,
};
use crate::delta_rule::{CHUNK, Dims, Operands};
use candle_core::{DType, Result, Tensor};

const MODULE: Module = module!("delta_rule_chunked");
/// Threads a block, and the value columns a block of the state and output kernels serves
/// (THREADS, STATE_COLS, OUT_COLS in the source).
const THREADS: u32 = 256;
const STATE_COLS: usize = 32;
const OUT_COLS: usize = 64;
/// The per-token scalars each kernel stages (start, G, raw g, β, carry).
const TOKEN_FLOATS: usize = 5 * CHUNK;

/// `(out, final state, checkpoints)` as `crate::delta_rule::forward` returns them; q, k, v in `T`.
/// Scratch besides the results, freed on return: `4·B·H·⌈T/64⌉·64·(2·d_v + d_k + 1)` bytes
/// (~0.6 GB at the Qwen3.6-27B layer with B = 2, T = 4096).
pub(crate) fn forward<T: Elem>(x: &Operands, s0: &Tensor, starts: &[u32]) -> Result<(Tensor, Tensor, Tensor)> {
    let d = Dims::of(x)?;
    let dev = device(x.q)?;
    let (beta, g, s0) = (x.beta.to_dtype(DType::F32)?, x.g.to_dtype(DType::F32)?, s0.to_dtype(DType::F32)?);
    let st = Tensor::new(starts, x.q.device())?;
    let (bh, chunks) = (d.b * d.h, d.chunks());
    let rows = bh * chunks * CHUNK;
    let mut u = alloc::<f32>(&dev, rows * d.dv)?;
    let mut w = alloc::<f32>(&dev, rows * d.dk)?;
    let mut gc = alloc::<f32>(&dev, rows)?;
    let mut delta = alloc::<f32>(&dev, rows * d.dv)?;
    let mut out = alloc::<T>(&dev, d.b * d.t * d.h * d.dv)?;
    let mut state = alloc::<f32>(&dev, bh * d.dk * d.dv)?;
    let mut kept = alloc::<f32>(&dev, bh * chunks * d.dk * d.dv)?;
    // The tiles each kernel stages (their layouts in the source).
    let (ld, kld, qld) = (d.dk + 1, d.dk.next_multiple_of(4), CHUNK + 4);
    let bytes = |floats: usize| (floats * 4) as u32;
    let wy_shared = bytes(CHUNK * ld + CHUNK * (CHUNK + 1) + TOKEN_FLOATS);
    let state_shared = bytes(kld * STATE_COLS + 2 * kld * CHUNK + CHUNK * STATE_COLS + TOKEN_FLOATS);
    let out_shared = bytes(2 * d.dk * qld + CHUNK * CHUNK + CHUNK * OUT_COLS + TOKEN_FLOATS);
    let cfg = |grid: (usize, usize), shared: u32| -> Result<LaunchConfig> {
        Ok(LaunchConfig {
            grid_dim: (int(grid.0)? as u32, int(grid.1)? as u32, 1),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: shared,
        })
    };
    let kernel = |name: &str, shared: u32| Kernel::new::<T>(&dev, &MODULE, name)?.with_dynamic_shared(shared);
    let [b, t, hk, h, dk, dv, ch] = [int(d.b)?, int(d.t)?, int(d.hk)?, int(d.h)?, int(d.dk)?, int(d.dv)?, int(chunks)?];
    let scale = x.scale as f32;
    with_views::<T, _, 3>([x.q, x.k, x.v], |[q, k, v]| {
        with_views::<f32, _, 3>([&beta, &g, &s0], |[beta, g, s0]| {
            with_views::<u32, _, 1>([&st], |[st]| {
                let wy = kernel("delta_chunk_wy", wy_shared)?;
                let mut a = wy.builder();
                a.arg(&k).arg(&v).arg(&beta).arg(&g).arg(&st).arg(&mut u).arg(&mut w).arg(&mut gc);
                a.arg(&b).arg(&t).arg(&hk).arg(&h).arg(&dk).arg(&dv).arg(&ch);
                launch(a, cfg((bh, chunks), wy_shared)?)?;
                let recur = kernel("delta_chunk_state", state_shared)?;
                let mut a = recur.builder();
                a.arg(&k).arg(&st).arg(&u).arg(&w).arg(&gc).arg(&s0).arg(&mut delta).arg(&mut state).arg(&mut kept);
                a.arg(&b).arg(&t).arg(&hk).arg(&h).arg(&dk).arg(&dv).arg(&ch);
                launch(a, cfg((bh, d.dv.div_ceil(STATE_COLS)), state_shared)?)?;
                let output = kernel("delta_chunk_out", out_shared)?;
                let mut a = output.builder();
                a.arg(&q).arg(&k).arg(&st).arg(&gc).arg(&kept).arg(&delta).arg(&mut out);
                a.arg(&b).arg(&t).arg(&hk).arg(&h).arg(&dk).arg(&dv).arg(&ch).arg(&scale);
                launch(a, cfg((bh, chunks), out_shared)?)
            })
        })
    })?;
    Ok((
        tensor(out, &dev, (d.b, d.t, d.h, d.dv)),
        tensor(state, &dev, (d.b, d.h, d.dk, d.dv)),
        tensor(kept, &dev, (d.b, d.h, chunks, d.dk, d.dv)),
    ))
}
