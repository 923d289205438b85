//! The gated delta rule on the GPU (`cuda/delta_rule.cu`, whose header gives the design and its
//! predicted cost): one block per (batch row, value head, tile of value columns), the state in
//! registers, the tokens in order. q, k, v and the output in `T`; β, g, the states and the
//! checkpoints in f32 (the working dtype of every form of the op).

use super::{
    Elem, Kernel, LaunchConfig, Module, PushKernelArg, alloc, device, grid_for, int, launch, module, tensor, with_views,
};
use crate::delta_rule::{CHUNK, Dims, Operands};
use candle_core::{DType, Result, Tensor};

const MODULE: Module = module!("delta_rule");
/// Rows of the state a lane holds (RK in delta_rule.cu) times the warp width: the widest key
/// head the kernels serve.
pub(crate) const MAX_DK: usize = 4 * 32;
/// Value columns per warp (CV in delta_rule.cu).
const CV: usize = 8;
/// Warps a block: the forward's blocks are small (more of them in flight hides the per-token
/// latency); the backward's wider, since each block's q/k gradient partial costs memory.
const FWD_WARPS: usize = 4;
const BWD_WARPS: usize = 8;

/// `(warps per block, column tiles)` for `dv` columns and at most `warps` warps a block.
fn tiling(dv: usize, warps: usize) -> (usize, usize) {
    let warps = dv.div_ceil(CV).min(warps);
    (warps, dv.div_ceil(warps * CV))
}

fn sizes(d: &Dims) -> Result<[i32; 6]> {
    Ok([int(d.b)?, int(d.t)?, int(d.hk)?, int(d.h)?, int(d.dk)?, int(d.dv)?])
}

/// The per-token starts on the device, or a placeholder when rows are one document each.
fn starts_on(starts: Option<&[u32]>, like: &Tensor) -> Result<Tensor> {
    Tensor::new(starts.unwrap_or(&[0]), like.device())
}

/// `(out, final state, checkpoints)` as `crate::delta_rule` returns them; q, k, v in `T`.
pub(crate) fn forward<T: Elem>(
    x: &Operands,
    s0: &Tensor,
    starts: Option<&[u32]>,
    keep: bool,
) -> Result<(Tensor, Tensor, Tensor)> {
    let d = Dims::of(x)?;
    let dev = device(x.q)?;
    let (beta, g, s0) = (x.beta.to_dtype(DType::F32)?, x.g.to_dtype(DType::F32)?, s0.to_dtype(DType::F32)?);
    let st = starts_on(starts, x.q)?;
    let chunks = if keep { d.chunks() } else { 0 };
    let sz = d.dk * d.dv;
    let mut out = alloc::<T>(&dev, d.b * d.t * d.h * d.dv)?;
    let mut state = alloc::<f32>(&dev, d.b * d.h * sz)?;
    let mut kept = alloc::<f32>(&dev, (d.b * d.h * chunks * sz).max(1))?;
    let (warps, tiles) = tiling(d.dv, FWD_WARPS);
    let cfg = LaunchConfig {
        grid_dim: (int(d.b * d.h)? as u32, tiles as u32, 1),
        block_dim: ((warps * 32) as u32, 1, 1),
        shared_mem_bytes: 0,
    };
    let kernel = Kernel::new::<T>(&dev, &MODULE, "delta_rule_fwd")?;
    let [b, t, hk, h, dk, dv] = sizes(&d)?;
    let (scale, segmented, keep_i) = (x.scale as f32, i32::from(starts.is_some()), i32::from(keep));
    with_views::<T, _, 3>([x.q, x.k, x.v], |[q, k, v]| {
        with_views::<f32, _, 3>([&beta, &g, &s0], |[beta, g, s0]| {
            with_views::<u32, _, 1>([&st], |[st]| {
                let mut a = kernel.builder();
                a.arg(&q).arg(&k).arg(&v).arg(&beta).arg(&g).arg(&s0).arg(&st);
                a.arg(&mut out).arg(&mut state).arg(&mut kept);
                a.arg(&b).arg(&t).arg(&hk).arg(&h).arg(&dk).arg(&dv).arg(&scale).arg(&segmented).arg(&keep_i);
                launch(a, cfg)
            })
        })
    })?;
    let checkpoints = if keep {
        tensor(kept, &dev, (d.b, d.h, chunks, d.dk, d.dv))
    } else {
        Tensor::zeros((d.b, d.h, 0, d.dk, d.dv), DType::F32, x.q.device())?
    };
    Ok((tensor(out, &dev, (d.b, d.t, d.h, d.dv)), tensor(state, &dev, (d.b, d.h, d.dk, d.dv)), checkpoints))
}

/// `[dq, dk, dv, dβ, dg, d initial state]`: dq, dk, dv in `T`, the rest in f32. Memory besides
/// the gradients, freed on return: the chunk states' scratch (`4·B·H·64·128·d_v` bytes, the
/// state rows padded to 128: 400 MB at the 27B layer with B = 2) and the q/k partials per column
/// tile (`8·B·T·H·tiles·d_k` bytes, two tiles of 64 columns at d_v = 128: 400 MB there).
pub(crate) fn backward<T: Elem>(
    x: &Operands,
    starts: &[u32],
    checkpoints: &Tensor,
    dout: &Tensor,
    dstate: &Tensor,
) -> Result<[Tensor; 6]> {
    let d = Dims::of(x)?;
    let dev = device(x.q)?;
    let f32_of = |t: &Tensor| t.to_dtype(DType::F32);
    let (beta, g, kept, ds) = (f32_of(x.beta)?, f32_of(x.g)?, f32_of(checkpoints)?, f32_of(dstate)?);
    let dout = dout.to_dtype(x.q.dtype())?;
    let st = starts_on(Some(starts), x.q)?;
    let (warps, tiles) = tiling(d.dv, BWD_WARPS);
    let threads = warps * 32;
    let tokens = d.b * d.t * d.h;
    // Per block: CHUNK tokens × (4 rows × CV columns) a thread.
    let mut scratch = alloc::<f32>(&dev, d.b * d.h * tiles * CHUNK * 4 * CV * threads)?;
    let mut qk_part = alloc::<f32>(&dev, tokens * tiles * 2 * d.dk)?;
    let mut sc_part = alloc::<f32>(&dev, tokens * tiles * 2)?;
    let mut dv_out = alloc::<T>(&dev, tokens * d.dv)?;
    let mut ds0 = alloc::<f32>(&dev, d.b * d.h * d.dk * d.dv)?;
    let shared = (2 * CHUNK * warps * CV + 2 * warps * (d.dk + 2)) * 4;
    let cfg = LaunchConfig {
        grid_dim: (int(d.b * d.h)? as u32, tiles as u32, 1),
        block_dim: (threads as u32, 1, 1),
        shared_mem_bytes: shared as u32,
    };
    let kernel = Kernel::new::<T>(&dev, &MODULE, "delta_rule_bwd")?;
    let kernel = if shared > 48 << 10 { kernel.with_dynamic_shared(shared as u32)? } else { kernel };
    let [b, t, hk, h, dk, dv] = sizes(&d)?;
    let scale = x.scale as f32;
    with_views::<T, _, 4>([x.q, x.k, x.v, &dout], |[q, k, v, dout]| {
        with_views::<f32, _, 4>([&beta, &g, &kept, &ds], |[beta, g, kept, ds]| {
            with_views::<u32, _, 1>([&st], |[st]| {
                let mut a = kernel.builder();
                a.arg(&q).arg(&k).arg(&v).arg(&beta).arg(&g).arg(&kept).arg(&dout).arg(&ds).arg(&st);
                a.arg(&mut scratch).arg(&mut qk_part).arg(&mut sc_part).arg(&mut dv_out).arg(&mut ds0);
                a.arg(&b).arg(&t).arg(&hk).arg(&h).arg(&dk).arg(&dv).arg(&scale);
                launch(a, cfg)
            })
        })
    })?;
    drop(scratch);
    let mut dq = alloc::<T>(&dev, d.b * d.t * d.hk * d.dk)?;
    let mut dk_out = alloc::<T>(&dev, d.b * d.t * d.hk * d.dk)?;
    let (bt, tiles_i) = (int(d.b * d.t)?, int(tiles)?);
    let n = d.b * d.t * d.hk * d.dk;
    let kernel = Kernel::new::<T>(&dev, &MODULE, "delta_qk_grads")?;
    let mut a = kernel.builder();
    a.arg(&qk_part).arg(&mut dq).arg(&mut dk_out).arg(&bt).arg(&hk).arg(&h).arg(&tiles_i).arg(&dk);
    launch(a, grid_for(n, 256))?;
    let mut dbeta = alloc::<f32>(&dev, tokens)?;
    let mut dg = alloc::<f32>(&dev, tokens)?;
    let kernel = Kernel::named(&dev, &MODULE, "delta_scalar_grads")?;
    let mut a = kernel.builder();
    let n_i = int(tokens)?;
    a.arg(&sc_part).arg(&mut dbeta).arg(&mut dg).arg(&n_i).arg(&tiles_i);
    launch(a, grid_for(tokens, 256))?;
    let (qk, v, s, state) = ((d.b, d.t, d.hk, d.dk), (d.b, d.t, d.h, d.dv), (d.b, d.t, d.h), (d.b, d.h, d.dk, d.dv));
    Ok([
        tensor(dq, &dev, qk),
        tensor(dk_out, &dev, qk),
        tensor(dv_out, &dev, v),
        tensor(dbeta, &dev, s),
        tensor(dg, &dev, s),
        tensor(ds0, &dev, state),
    ])
}
