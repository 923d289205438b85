//! Causal GQA attention on the GPU, no T×T matrix: bf16 with head size 64, 80 (Instella), 128
//! or 256 (Qwen3.5/3.6's gated attention) runs the tensor-core flash kernels
//! (`cuda/flash_attention.cu`; Hopper's wgmma family for 64 and 128); f32 and other head sizes run the warp-per-row kernels (`cuda/attention.cu`); head
//! sizes that are neither and not a multiple of the warp (or over 256) take the composed
//! reference.

use super::{
    Elem, Kernel, LaunchConfig, Module, PushKernelArg, alloc, device, int, launch, module, tensor, with_dense_views,
    with_views,
};
use crate::attention::{AttentionKernels, Mask, reference};
use candle_core::cuda_backend::CudaDevice;
use candle_core::cuda_backend::cudarc::driver::CudaSlice;
use candle_core::{DType, Result, Tensor};

const MODULE: Module = module!("attention");
const FLASH: Module = module!("flash_attention");
#[cfg(sm90a)]
const FLASH_SM90A: Module = module!("flash_attention_sm90a");
/// Query (forward, dQ) or key (dK/dV) rows per flash block, and its threads.
const FLASH_ROWS: usize = 64;
const FLASH_THREADS: u32 = 128;
/// Warps (rows) per block.
const ROWS: usize = 8;
/// `MAXC` in attention.cu: register chunks of 32 per row.
const MAX_HD: usize = 8 * 32;

fn served(hd: usize) -> bool {
    hd > 0 && hd <= MAX_HD
}

fn config(t: usize, heads: usize, b: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (t.div_ceil(ROWS) as u32, heads as u32, b as u32),
        block_dim: ((ROWS * 32) as u32, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// One warp per row over `rows` rows.
fn row_config(rows: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (rows.div_ceil(ROWS) as u32, 1, 1),
        block_dim: ((ROWS * 32) as u32, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// Head sizes the mma.sync flash kernels are instantiated for (`FLASH(..)` in the source).
const FLASH_HEADS: [usize; 4] = [64, 80, 128, 256];
/// The widest head whose fragments the flash kernels hold in registers (`held` in flash.h); wider
/// ones stage Q, dO, K and V in dynamic shared memory and split dK/dV's columns among blocks.
const HELD_MAX_HD: usize = 128;
/// dK/dV columns per block for wider heads (`dkdv_cols` in flash.h).
const WIDE_DKDV_COLS: usize = 128;

/// Blocks per 64-key dK/dV block: one per `dkdv_cols` columns.
fn dkdv_parts(hd: usize) -> usize {
    if hd > HELD_MAX_HD { hd / WIDE_DKDV_COLS } else { 1 }
}

/// Bytes of `rows` staged rows of a head (padded by 8 elements, bf16).
fn tile_bytes(rows: usize, hd: usize) -> usize {
    rows * (hd + 8) * 2
}
/// Those the Hopper wgmma kernels are: their 128-byte swizzled tiles need rows of 64 or 128.
#[cfg(sm90a)]
const WGMMA_HEADS: [usize; 2] = [64, 128];

/// Whether the flash kernels serve these tensors: bf16 (the MMA's input type), a head size
/// they are instantiated for, and 16-byte aligned rows (cp.async moves 16 bytes at a time;
/// a tensor read in another layout is copied to a fresh, aligned buffer first).
fn flash<T: Elem>(hd: usize, ts: &[&Tensor]) -> bool {
    T::SUFFIX == "bf16"
        && FLASH_HEADS.contains(&hd)
        && ts.iter().all(|t| row_stride(t).is_none() || t.layout().start_offset().is_multiple_of(8))
}

/// The row stride (elements between consecutive tokens of one head) of a `[B, heads, T, hd]`
/// tensor the flash kernels can read in place: `hd` when it is contiguous, `heads·hd` when it is
/// the transpose of a contiguous `[B, T, heads, hd]` (how the projections leave q, k and v and
/// how the o projection wants the output: no transpose runs on either side of attention).
fn row_stride(t: &Tensor) -> Option<usize> {
    let (_, heads, tt, hd) = t.dims4().ok()?;
    if t.is_contiguous() {
        return Some(hd);
    }
    (t.stride() == [tt * heads * hd, hd, heads * hd, 1]).then_some(heads * hd)
}

/// `t` laid out with row stride `ld` (one of `row_stride`'s two), copied only if it is not.
fn with_row_stride(t: &Tensor, ld: usize) -> Result<Tensor> {
    if row_stride(t) == Some(ld) {
        return Ok(t.clone());
    }
    if ld == t.dim(3)? { t.contiguous() } else { t.transpose(1, 2)?.contiguous()?.transpose(1, 2) }
}

/// A flash kernel's `[b, heads, t, hd]` output buffer as a tensor with row stride `ld`.
fn strided_tensor(
    buf: CudaSlice<half::bf16>,
    dev: &CudaDevice,
    (b, heads, t, hd): (usize, usize, usize, usize),
    ld: usize,
) -> Result<Tensor> {
    if ld == hd { Ok(tensor(buf, dev, (b, heads, t, hd))) } else { tensor(buf, dev, (b, t, heads, hd)).transpose(1, 2) }
}

/// Row strides of the query family (q, out, dout, dq) and the key family (k, v, dk, dv): each
/// family's first tensor's, when the kernels can read it in place.
fn row_strides(q: &Tensor, k: &Tensor) -> Result<(usize, usize)> {
    let hd = q.dim(3)?;
    Ok((row_stride(q).unwrap_or(hd), row_stride(k).unwrap_or(hd)))
}

fn flash_config(t: usize, heads: usize, b: usize, shared: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (t.div_ceil(FLASH_ROWS) as u32, heads as u32, b as u32),
        block_dim: (FLASH_THREADS, 1, 1),
        shared_mem_bytes: shared,
    }
}

/// Which tensor-core instructions the flash kernels use: the forward, the deterministic dQ and
/// dK/dV.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Flash {
    /// `flash_fwd_hd*_k{key tile}`, `flash_bwd_dq`, `flash_bwd_dkdv` (mma.sync, sm_80+; the
    /// plan's key tile picks the forward).
    Mma,
    /// `flash_fwd_wg`, `flash_bwd_dq_wg`, `flash_bwd_dkdv_wg` (wgmma, sm_90 only;
    /// `cuda/flash_attention_sm90a.cu`, in builds for `CUDA_COMPUTE_CAP` 90).
    #[cfg_attr(not(sm90a), allow(dead_code))]
    Wgmma,
}

impl Flash {
    /// The kernels this build can run on `dev` at head size `hd`, the fastest first.
    pub(crate) fn available(dev: &CudaDevice, hd: usize) -> Result<Vec<Flash>> {
        #[cfg(sm90a)]
        {
            use candle_core::cuda_backend::WrapErr;
            if WGMMA_HEADS.contains(&hd) && dev.cuda_stream().context().compute_capability().w()? == (9, 0) {
                return Ok(vec![Flash::Wgmma, Flash::Mma]);
            }
        }
        #[cfg(not(sm90a))]
        let _ = (dev, hd);
        Ok(vec![Flash::Mma])
    }

    /// `flash_{name}` of this family (`fwd`, `bwd_dq`, `bwd_dq_split` (mma.sync only),
    /// `bwd_dkdv`) and its dynamic shared memory (the `*_smem_bytes` of its source). The key tile
    /// (32 or 64) picks mma.sync's forward and wgmma's forward and dQ.
    fn kernel(self, dev: &CudaDevice, name: &str, hd: usize, key_tile: usize) -> Result<(Kernel, u32)> {
        let wide = hd > HELD_MAX_HD;
        let (module, kernel, bytes) = match (self, name) {
            // Wide heads: Q, K and V tiles.
            (Flash::Mma, "fwd") => {
                let bytes = if wide { tile_bytes(64 + 2 * key_tile, hd) } else { 0 };
                (&FLASH, format!("flash_fwd_hd{hd}_k{key_tile}"), bytes)
            }
            // Wide heads: Q and dO tiles of 64 rows, K and V tiles of 32.
            (Flash::Mma, "bwd_dq" | "bwd_dq_split") => {
                (&FLASH, format!("flash_{name}_hd{hd}"), if wide { tile_bytes(2 * 64 + 2 * 32, hd) } else { 0 })
            }
            // K and V tiles of 64 rows, two stages of Q and dO tiles of 32.
            (Flash::Mma, _) => (&FLASH, format!("flash_{name}_hd{hd}"), tile_bytes(2 * 64 + 4 * 32, hd)),
            #[cfg(sm90a)]
            (Flash::Wgmma, _) => {
                let bytes = match name {
                    // Q and two stages of K and V (swizzled tiles), 1 KB to align them.
                    "fwd" => (64 + 4 * key_tile) * hd * 2 + 1024,
                    // Q, dO and two stages of K and V.
                    "bwd_dq" => (2 * 64 + 4 * key_tile) * hd * 2 + 1024,
                    // K, V and two stages of Q and dO; two stages of 64 rows' lse, D and first key.
                    _ => 6 * 64 * hd * 2 + 2 * 3 * 64 * 4 + 1024,
                };
                let tile = if name == "bwd_dkdv" { String::new() } else { format!("_k{key_tile}") };
                (&FLASH_SM90A, format!("flash_{name}_wg_hd{hd}{tile}"), bytes)
            }
            #[cfg(not(sm90a))]
            (Flash::Wgmma, _) => candle_core::bail!("attention: this build has no sm_90a kernels"),
        };
        let kernel = Kernel::named(dev, module, &kernel)?;
        Ok((if bytes > 0 { kernel.with_dynamic_shared(bytes as u32)? } else { kernel }, bytes as u32))
    }
}

/// The mask's per-token first visible key, on the device.
fn starts(mask: &Mask, q: &Tensor) -> Result<Tensor> {
    Tensor::new(mask.starts(), q.device())
}

pub(crate) fn forward<T: Elem>(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    mask: &Mask,
    scale: f64,
    kernels: AttentionKernels,
) -> Result<(Tensor, Tensor)> {
    let hd = q.dim(3)?;
    if flash::<T>(hd, &[q, k, v]) {
        return flash_forward(q, k, v, mask, scale, kernels.key_tile, Flash::available(&device(q)?, hd)?[0]);
    }
    if !served(hd) {
        return reference::forward(q, k, v, mask, scale);
    }
    rows_forward::<T>(q, k, v, mask, scale)
}

/// The warp-per-row forward (`attn_fwd` of attention.cu), any served head size and type.
pub(crate) fn rows_forward<T: Elem>(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    mask: &Mask,
    scale: f64,
) -> Result<(Tensor, Tensor)> {
    let (b, heads, t, hd) = q.dims4()?;
    let kv = k.dim(1)?;
    let dev = device(q)?;
    let starts = starts(mask, q)?;
    let mut out = alloc::<T>(&dev, q.elem_count())?;
    let mut lse = alloc::<f32>(&dev, b * heads * t)?;
    let (h, kvh, tt, hd_i, scale) = (int(heads)?, int(kv)?, int(t)?, int(hd)?, scale as f32);
    with_views::<T, _, 3>([q, k, v], |[qv, kv_, vv]| {
        with_views::<u32, _, 1>([&starts], |[st]| {
            let kernel = Kernel::new::<T>(&dev, &MODULE, "attn_fwd")?;
            let mut a = kernel.builder();
            a.arg(&qv).arg(&kv_).arg(&vv).arg(&st).arg(&mut out).arg(&mut lse);
            a.arg(&h).arg(&kvh).arg(&tt).arg(&hd_i).arg(&scale);
            launch(a, config(t, heads, b))
        })
    })?;
    Ok((tensor(out, &dev, q.shape().clone()), tensor(lse, &dev, (b, heads, t))))
}

/// The tensor-core forward (bf16): q, k and v read where they lie (see `row_stride`), the
/// output written with q's row stride.
#[allow(clippy::too_many_arguments)]
pub(crate) fn flash_forward(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    mask: &Mask,
    scale: f64,
    key_tile: usize,
    family: Flash,
) -> Result<(Tensor, Tensor)> {
    type T = half::bf16;
    let (b, heads, t, hd) = q.dims4()?;
    let kv = k.dim(1)?;
    let dev = device(q)?;
    let starts = starts(mask, q)?;
    let (qld, kld) = row_strides(q, k)?;
    let (q, k, v) = (with_row_stride(q, qld)?, with_row_stride(k, kld)?, with_row_stride(v, kld)?);
    let mut out = alloc::<T>(&dev, q.elem_count())?;
    let mut lse = alloc::<f32>(&dev, b * heads * t)?;
    let (h, kvh, qld_i, kld_i, tt, scale) = (int(heads)?, int(kv)?, int(qld)?, int(kld)?, int(t)?, scale as f32);
    let (kernel, shared) = family.kernel(&dev, "fwd", hd, key_tile)?;
    with_dense_views::<T, _, 3>([&q, &k, &v], |[qv, kv_, vv]| {
        with_views::<u32, _, 1>([&starts], |[st]| {
            let mut a = kernel.builder();
            a.arg(&qv).arg(&kv_).arg(&vv).arg(&st).arg(&mut out).arg(&mut lse);
            a.arg(&h).arg(&kvh).arg(&qld_i).arg(&kld_i).arg(&tt).arg(&scale);
            launch(a, flash_config(t, heads, b, shared))
        })
    })?;
    Ok((strided_tensor(out, &dev, (b, heads, t, hd), qld)?, tensor(lse, &dev, (b, heads, t))))
}

/// `out` is the forward's output: the flash backward takes D = rowsum(dout∘out) from it.
#[allow(clippy::too_many_arguments)]
pub(crate) fn backward<T: Elem>(
    dout: &Tensor,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    out: &Tensor,
    lse: &Tensor,
    mask: &Mask,
    scale: f64,
    kernels: AttentionKernels,
) -> Result<(Tensor, Tensor, Tensor)> {
    let hd = q.dim(3)?;
    if flash::<T>(hd, &[dout, q, k, v, out]) {
        let family = Flash::available(&device(q)?, hd)?[0];
        return flash_backward(dout, q, k, v, out, lse, mask, scale, kernels, family);
    }
    if !served(hd) {
        return reference::backward(dout, q, k, v, &lse.to_dtype(q.dtype())?, mask, scale);
    }
    rows_backward::<T>(dout, q, k, v, lse, mask, scale)
}

/// The warp-per-row backward (`attn_bwd_dq`, `attn_bwd_dkdv` of attention.cu).
pub(crate) fn rows_backward<T: Elem>(
    dout: &Tensor,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    lse: &Tensor,
    mask: &Mask,
    scale: f64,
) -> Result<(Tensor, Tensor, Tensor)> {
    let (b, heads, t, hd) = q.dims4()?;
    let kv = k.dim(1)?;
    let dev = device(q)?;
    let starts = starts(mask, q)?;
    let lse = lse.to_dtype(DType::F32)?;
    let mut dq = alloc::<T>(&dev, q.elem_count())?;
    let mut delta = alloc::<f32>(&dev, b * heads * t)?;
    let (mut dk, mut dv) = (alloc::<T>(&dev, k.elem_count())?, alloc::<T>(&dev, v.elem_count())?);
    let (h, kvh, tt, hd_i, scale) = (int(heads)?, int(kv)?, int(t)?, int(hd)?, scale as f32);
    let dq_kernel = Kernel::new::<T>(&dev, &MODULE, "attn_bwd_dq")?;
    let dkdv_kernel = Kernel::new::<T>(&dev, &MODULE, "attn_bwd_dkdv")?;
    with_views::<T, _, 4>([dout, q, k, v], |[dov, qv, kv_, vv]| {
        with_views::<u32, _, 1>([&starts], |[st]| {
            with_views::<f32, _, 1>([&lse], |[l]| {
                let mut a = dq_kernel.builder();
                a.arg(&dov).arg(&qv).arg(&kv_).arg(&vv).arg(&st).arg(&l).arg(&mut dq).arg(&mut delta);
                a.arg(&h).arg(&kvh).arg(&tt).arg(&hd_i).arg(&scale);
                launch(a, config(t, heads, b))?;
                let mut a = dkdv_kernel.builder();
                a.arg(&dov).arg(&qv).arg(&kv_).arg(&vv).arg(&st).arg(&l).arg(&delta).arg(&mut dk).arg(&mut dv);
                a.arg(&h).arg(&kvh).arg(&tt).arg(&hd_i).arg(&scale);
                launch(a, config(t, kv, b))
            })
        })
    })?;
    Ok((tensor(dq, &dev, q.shape().clone()), tensor(dk, &dev, k.shape().clone()), tensor(dv, &dev, v.shape().clone())))
}

/// The tensor-core backward: D, then dQ per query block (or per part of one, added with
/// atomics, when the selected kernels split it) and dK/dV per key block (bf16 only). Inputs are
/// read where they lie (dout and out with q's row stride, v with k's); dq comes back with q's,
/// dk and dv with k's.
#[allow(clippy::too_many_arguments)]
pub(crate) fn flash_backward(
    dout: &Tensor,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    out: &Tensor,
    lse: &Tensor,
    mask: &Mask,
    scale: f64,
    kernels: AttentionKernels,
    family: Flash,
) -> Result<(Tensor, Tensor, Tensor)> {
    type T = half::bf16;
    let (b, heads, t, hd) = q.dims4()?;
    let kv = k.dim(1)?;
    let dev = device(q)?;
    let starts = starts(mask, q)?;
    let lse = lse.to_dtype(DType::F32)?;
    let (qld, kld) = row_strides(q, k)?;
    let [dout, q, out] = [dout, q, out].map(|x| with_row_stride(x, qld));
    let (dout, q, out) = (dout?, q?, out?);
    let (k, v) = (with_row_stride(k, kld)?, with_row_stride(v, kld)?);
    let rows = b * heads * t;
    let mut delta = alloc::<f32>(&dev, rows)?;
    let mut dq = alloc::<T>(&dev, q.elem_count())?;
    let (mut dk, mut dv) = (alloc::<T>(&dev, k.elem_count())?, alloc::<T>(&dev, v.elem_count())?);
    let (h, kvh, tt, hd_i, rows_i, scale) = (int(heads)?, int(kv)?, int(t)?, int(hd)?, int(rows)?, scale as f32);
    let (qld_i, kld_i) = (int(qld)?, int(kld)?);
    let delta_kernel = Kernel::named(&dev, &FLASH, "attn_bwd_delta_bf16")?;
    // The split dQ (atomics) exists for mma.sync only.
    let splits = kernels.dq_splits;
    let (dq_kernel, dq_shared) = match splits {
        1 => family.kernel(&dev, "bwd_dq", hd, kernels.key_tile)?,
        _ => Flash::Mma.kernel(&dev, "bwd_dq_split", hd, kernels.key_tile)?,
    };
    let (dkdv_kernel, dkdv_shared) = family.kernel(&dev, "bwd_dkdv", hd, 0)?;
    with_dense_views::<T, _, 5>([&dout, &q, &k, &v, &out], |[dov, qv, kv_, vv, ov]| {
        with_views::<u32, _, 1>([&starts], |[st]| {
            with_views::<f32, _, 1>([&lse], |[l]| {
                let mut a = delta_kernel.builder();
                a.arg(&dov).arg(&ov).arg(&mut delta).arg(&rows_i).arg(&hd_i).arg(&h).arg(&tt).arg(&qld_i);
                launch(a, row_config(rows))?;
                if splits == 1 {
                    let mut a = dq_kernel.builder();
                    a.arg(&dov).arg(&qv).arg(&kv_).arg(&vv).arg(&st).arg(&l).arg(&delta).arg(&mut dq);
                    a.arg(&h).arg(&kvh).arg(&qld_i).arg(&kld_i).arg(&tt).arg(&scale);
                    launch(a, flash_config(t, heads, b, dq_shared))?;
                } else {
                    let mut sum = dev.alloc_zeros::<f32>(q.elem_count())?;
                    let splits_i = int(splits)?;
                    let mut a = dq_kernel.builder();
                    a.arg(&dov).arg(&qv).arg(&kv_).arg(&vv).arg(&st).arg(&l).arg(&delta).arg(&mut sum);
                    a.arg(&splits_i).arg(&h).arg(&kvh).arg(&qld_i).arg(&kld_i).arg(&tt).arg(&scale);
                    let mut cfg = flash_config(t, heads, b, dq_shared);
                    cfg.grid_dim.0 *= splits as u32;
                    launch(a, cfg)?;
                    let finish = Kernel::named(&dev, &FLASH, "flash_dq_finish")?;
                    let mut a = finish.builder();
                    let n = q.elem_count();
                    a.arg(&sum).arg(&mut dq).arg(&n);
                    launch(a, super::grid_for(n, 256))?;
                }
                let mut a = dkdv_kernel.builder();
                a.arg(&dov).arg(&qv).arg(&kv_).arg(&vv).arg(&st).arg(&l).arg(&delta).arg(&mut dk).arg(&mut dv);
                a.arg(&h).arg(&kvh).arg(&qld_i).arg(&kld_i).arg(&tt).arg(&scale);
                let mut cfg = flash_config(t, kv, b, dkdv_shared);
                cfg.grid_dim.0 *= dkdv_parts(hd) as u32;
                launch(a, cfg)
            })
        })
    })?;
    let kdims = (b, kv, t, hd);
    Ok((
        strided_tensor(dq, &dev, (b, heads, t, hd), qld)?,
        strided_tensor(dk, &dev, kdims, kld)?,
        strided_tensor(dv, &dev, kdims, kld)?,
    ))
}
