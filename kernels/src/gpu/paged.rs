//! Paged attention, the fused q/k norm + RoPE + cache write, and the cache write itself on the
//! GPU (`cuda/paged_attention.cu`); CPU references in `crate::paged_attention`.

use super::{
    Elem, Kernel, LaunchConfig, Module, PushKernelArg, aligned16, alloc, device, grid_for, int, launch, module, tensor,
    with_views,
};
use crate::paged_attention::{PagedMeta, reference};
use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::DevicePtr;
use candle_core::cuda_backend::{CudaDType, CudaStorage};
use candle_core::{Layout, Result, Tensor};

const MODULE: Module = module!("paged_attention");
const TC_MODULE: Module = module!("paged_attention_tc");
const THREADS: u32 = 128;
/// `MAX_UNITS` in the kernel: (row, query head) pairs one block holds.
const MAX_UNITS: usize = 16;
const WARP: usize = 32;
/// Blocks that keep an H100/H200 busy (2 per SM): below this a step's work is split over keys.
const BUSY_BLOCKS: usize = 264;
/// Keys per tile of the tensor-core kernel (`BC` in `cuda/paged_attention_tc.cu`).
const TC_TILE: usize = 64;
/// Its blocks (69.6 KB of shared memory each at head size 128: 3 per SM) for two waves on an
/// H100/H200, so a 64-sequence decode step (512 blocks) is split in two rather than run as 1.3
/// waves.
const TC_BUSY_BLOCKS: usize = 792;
/// Units (row, query head) one tensor-core block holds: 4 warps × 16 MMA rows.
const TC_UNITS: usize = 64;

/// How a batch is cut into thread blocks: work items of rows of one sequence, and each item's
/// keys into `splits` near-equal parts (cut by the kernels from each item's real context,
/// `cuda/paged.h`; the host only decides how many).
#[derive(Debug, Clone)]
pub(crate) struct GpuPlan {
    kind: PlanKind,
    items: Tensor,
    count: usize,
    /// Items `0..decodes` are single decode rows (the tensor-core kernel's `kp4` launch).
    decodes: usize,
    splits: usize,
}

/// Which kernel a plan is cut for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PlanKind {
    /// `paged_attn`: items of up to `tq` rows, key parts in whole warps of keys.
    CudaCores { tq: usize },
    /// `paged_attn_tc`: decode rows first, then items of up to `tq` rows, key parts in tiles.
    TensorCores { tq: usize },
}

impl GpuPlan {
    pub(crate) fn new(meta: &PagedMeta, kind: PlanKind, kv: usize, device: &candle_core::Device) -> Result<GpuPlan> {
        let mut flat: Vec<i32> = Vec::new();
        let cut = |flat: &mut Vec<i32>, s: usize, t: usize, tq: usize| {
            for row0 in (0..t).step_by(tq) {
                flat.extend([s as i32, row0 as i32, tq.min(t - row0) as i32]);
            }
        };
        let (decodes, tile, busy) = match kind {
            PlanKind::CudaCores { tq } => {
                (0..meta.sequences()).for_each(|s| cut(&mut flat, s, meta.seq(s).1, tq));
                (0, WARP, BUSY_BLOCKS)
            }
            PlanKind::TensorCores { tq } => {
                let rows = |s: usize| meta.seq(s).1;
                (0..meta.sequences()).filter(|&s| rows(s) == 1).for_each(|s| cut(&mut flat, s, 1, 1));
                let decodes = flat.len() / 3;
                (0..meta.sequences()).filter(|&s| rows(s) > 1).for_each(|s| cut(&mut flat, s, rows(s), tq));
                let busy = crate::paged_attention::tensor_core_busy_blocks_set().unwrap_or(TC_BUSY_BLOCKS);
                (decodes, TC_TILE, busy)
            }
        };
        let count = flat.len() / 3;
        let max_ctx = meta.plan_context().max(1);
        let tiles = max_ctx.div_ceil(tile);
        let wanted = busy.div_ceil((count * kv).max(1)).clamp(1, tiles);
        let splits = max_ctx.div_ceil(tiles.div_ceil(wanted) * tile);
        let items = Tensor::from_vec(flat, count * 3, device)?;
        Ok(GpuPlan { kind, items, count, decodes, splits })
    }

    pub(crate) fn kind(&self) -> PlanKind {
        self.kind
    }
}

pub(crate) fn served(hd: usize, group: usize) -> bool {
    matches!(hd, 64 | 128 | 256) && group <= MAX_UNITS
}

pub(crate) fn forward<T: Elem>(q: &Tensor, kc: &Tensor, vc: &Tensor, meta: &PagedMeta, scale: f64) -> Result<Tensor> {
    let (n, heads, hd) = q.dims3()?;
    let (_, bs, kv, _) = kc.dims4()?;
    let g = heads / kv;
    if !served(hd, g) {
        return reference::forward(q, kc, vc, meta, scale);
    }
    let dev = device(q)?;
    let tc = on_tensor_cores(q, kc, vc);
    let kind = if tc {
        PlanKind::TensorCores { tq: (TC_UNITS / g).max(1) }
    } else {
        PlanKind::CudaCores { tq: (MAX_UNITS / g).max(1) }
    };
    let plan = meta.gpu_plan(kind, kv, q.device())?;
    let [starts, lens, tables] = meta.device_tensors()?;
    let mut out = alloc::<T>(&dev, n * heads * hd)?;
    let partial = if plan.splits > 1 { n * heads * plan.splits } else { 1 };
    let mut pm = alloc::<f32>(&dev, partial)?;
    let mut pl = alloc::<f32>(&dev, partial)?;
    let mut pacc = alloc::<f32>(&dev, partial * if plan.splits > 1 { hd } else { 1 })?;
    // Each launch: (kernel, first item, items, dynamic shared bytes).
    let launches: Vec<(Kernel, usize, usize, u32)> = if tc {
        // Two stages of K and V tiles, rows padded by 16 bytes (`PAD` in mma.h).
        let shared = (2 * 2 * TC_TILE * (hd + 8) * 2) as u32;
        let kernel = |name: String| Kernel::named(&dev, &TC_MODULE, &name)?.with_dynamic_shared(shared);
        let mut l = Vec::with_capacity(2);
        if plan.decodes > 0 {
            // A decode row of at most 8 heads a group fills only the MMA's first 8 rows.
            let rows = if g <= 8 { "_g8" } else { "" };
            l.push((kernel(format!("paged_attn_tc_hd{hd}_kp4{rows}"))?, 0, plan.decodes, shared));
        }
        if plan.count > plan.decodes {
            l.push((kernel(format!("paged_attn_tc_hd{hd}_kp1"))?, plan.decodes, plan.count - plan.decodes, shared));
        }
        l
    } else {
        // K rows padded by 16 bytes (`KPad` in the kernel).
        let elem = std::mem::size_of::<T>();
        let pad = 16 / elem;
        let shared = (WARP * (hd + pad) * elem + WARP * hd * elem + MAX_UNITS * hd * 4) as u32;
        let kernel =
            Kernel::named(&dev, &MODULE, &format!("paged_attn_{}_hd{hd}", T::SUFFIX))?.with_dynamic_shared(shared)?;
        vec![(kernel, 0, plan.count, shared)]
    };
    let (h, kvh, mb) = (int(heads)?, int(kv)?, int(meta.max_blocks())?);
    // The CUDA-core kernel takes the block size, the tensor-core kernel its log2 (a power of two).
    let bsz = if tc { int(bs.trailing_zeros() as usize)? } else { int(bs)? };
    let (splits, scale) = (int(plan.splits)?, scale as f32);
    with_views::<T, _, 3>([q, kc, vc], |[qv, kcv, vcv]| {
        with_views::<u32, _, 3>([starts, lens, tables], |[sv, lv, tv]| {
            with_views::<i32, _, 1>([&plan.items], |[iv]| {
                for (kernel, first, count, shared) in &launches {
                    let first = int(*first)?;
                    let mut a = kernel.builder();
                    a.arg(&qv).arg(&kcv).arg(&vcv).arg(&sv).arg(&lv).arg(&tv).arg(&iv);
                    if tc {
                        a.arg(&first);
                    }
                    a.arg(&mut out).arg(&mut pm).arg(&mut pl).arg(&mut pacc);
                    a.arg(&h).arg(&kvh).arg(&bsz).arg(&mb).arg(&splits).arg(&scale);
                    let cfg = LaunchConfig {
                        grid_dim: (*count as u32, kv as u32, plan.splits as u32),
                        block_dim: (THREADS, 1, 1),
                        shared_mem_bytes: *shared,
                    };
                    launch(a, cfg)?;
                }
                Ok(())
            })
        })
    })?;
    if plan.splits > 1 {
        let reduce = Kernel::new::<T>(&dev, &MODULE, "paged_reduce")?;
        let mut a = reduce.builder();
        let hd_i = int(hd)?;
        a.arg(&pm).arg(&pl).arg(&pacc).arg(&mut out).arg(&h).arg(&splits).arg(&hd_i);
        let cfg = LaunchConfig {
            grid_dim: (n as u32, heads as u32, 1),
            block_dim: (hd.min(256) as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        launch(a, cfg)?;
    }
    Ok(tensor(out, &dev, (n, heads, hd)))
}

/// Whether the tensor-core kernel serves this call: bf16, head size 64 or 128 (256 would not
/// fit its accumulators in registers), and every operand's rows 16-byte aligned for cp.async.
fn on_tensor_cores(q: &Tensor, kc: &Tensor, vc: &Tensor) -> bool {
    crate::paged_attention::tensor_cores_allowed()
        && q.dtype() == candle_core::DType::BF16
        && matches!(q.dim(2), Ok(64 | 128))
        // The kernel finds a key's slot by shift and mask, one lookup for a thread's 8 keys
        // (`cuda/paged_attention_tc.cu`).
        && kc.dim(1).is_ok_and(|bs| bs.is_power_of_two() && bs >= 8)
        && [q, kc, vc].into_iter().all(aligned16)
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn prepare<T: Elem>(
    qkv: &Tensor,
    heads: usize,
    norms: Option<(&Tensor, &Tensor, f64)>,
    cos: &Tensor,
    sin: &Tensor,
    (kc, vc): (&Tensor, &Tensor),
    slots: &Tensor,
) -> Result<Tensor> {
    let n = qkv.dim(0)?;
    let (blocks, bs, kv, hd) = kc.dims4()?;
    let fits = hd <= 256
        && hd.is_multiple_of(2)
        && kc.dtype() == qkv.dtype()
        && vc.dims() == kc.dims()
        && kc.is_contiguous()
        && vc.is_contiguous()
        && slots.dims1()? == n
        && cos.dims() == [n, hd];
    if !fits {
        return reference::prepare(qkv, heads, norms, cos, sin, (kc, vc), slots);
    }
    // Without norms the gain pointers are never read: the kernel gets the input's in their place.
    let (qn, kn, eps, norm) = match norms {
        Some((qn, kn, eps)) => (qn, kn, eps, 1i32),
        None => (qkv, qkv, 0.0, 0i32),
    };
    let dev = device(qkv)?;
    let mut q = alloc::<T>(&dev, n * heads * hd)?;
    // Head sizes of 32·E with aligned rows: a lane's E elements whole (`prepare_unit_vec`).
    let vec = matches!(hd, 64 | 128 | 256) && [qkv, qn, kn, cos, sin, kc, vc].into_iter().all(aligned16);
    let name = if vec { format!("paged_prepare_vec{}", hd / WARP) } else { "paged_prepare".to_owned() };
    let kernel = Kernel::new::<T>(&dev, &MODULE, &name)?;
    let capacity = u32::try_from(blocks * bs).map_err(|_| candle_core::Error::Msg("kv cache too large".into()))?;
    let (n_i, h, kvh, hd_i, eps) = (int(n)?, int(heads)?, int(kv)?, int(hd)?, eps as f32);
    let stream = dev.cuda_stream();
    with_views::<T, _, 7>([qkv, qn, kn, cos, sin, kc, vc], |[xv, qw, kw, cv, sv, kcv, vcv]| {
        with_views::<u32, _, 1>([slots], |[slv]| {
            // The caches are written in place through their raw pointers: they are contiguous,
            // owned by the engine's runner (no other tensor aliases them), and the kernel writes
            // only rows at slots below `capacity`.
            let (kc_ptr, _kc_sync) = kcv.device_ptr(&stream);
            let (vc_ptr, _vc_sync) = vcv.device_ptr(&stream);
            let mut a = kernel.builder();
            a.arg(&xv).arg(&qw).arg(&kw).arg(&cv).arg(&sv).arg(&mut q);
            a.arg(&kc_ptr).arg(&vc_ptr).arg(&slv).arg(&capacity).arg(&n_i).arg(&h).arg(&kvh).arg(&hd_i).arg(&eps);
            a.arg(&norm);
            let units = n * (heads + 2 * kv);
            let per_block = THREADS as usize / WARP;
            let cfg = LaunchConfig {
                grid_dim: (units.div_ceil(per_block) as u32, 1, 1),
                block_dim: (THREADS, 1, 1),
                shared_mem_bytes: 0,
            };
            launch(a, cfg)
        })
    })?;
    Ok(tensor(q, &dev, (n, heads, hd)))
}

/// The in-place cache write of `crate::paged_attention::write_kv` (candle's in-place op hands
/// over the cache's storage mutably).
pub(crate) fn write_rows(
    cache: &mut CudaStorage,
    cache_l: &Layout,
    src: &CudaStorage,
    src_l: &Layout,
    slots: &CudaStorage,
    slots_l: &Layout,
    capacity: usize,
) -> Result<()> {
    let dev = cache.device.clone();
    let n = src_l.shape().elem_count();
    let rows = slots_l.shape().elem_count();
    let row = int(n / rows.max(1))?;
    let capacity = u32::try_from(capacity).map_err(|_| candle_core::Error::Msg("kv cache too large".into()))?;
    let range = |l: &Layout| {
        l.contiguous_offsets().ok_or_else(|| candle_core::Error::Msg("kv write: operand is not contiguous".into()))
    };
    let ((c0, c1), (s0, s1), (i0, i1)) = (range(cache_l)?, range(src_l)?, range(slots_l)?);
    let slot_view = slots.as_cuda_slice::<u32>()?.slice(i0..i1);
    // One argument per kernel parameter: the launch reads best beside the kernel's signature.
    #[allow(clippy::too_many_arguments)]
    fn go<T: Elem + CudaDType>(
        dev: &candle_core::cuda_backend::CudaDevice,
        cache: &mut CudaStorage,
        src: &CudaStorage,
        (c0, c1, s0, s1): (usize, usize, usize, usize),
        slot_view: &candle_core::cuda_backend::cudarc::driver::CudaView<'_, u32>,
        n: usize,
        row: i32,
        capacity: u32,
    ) -> Result<()> {
        let kernel = Kernel::new::<T>(dev, &MODULE, "kv_write")?;
        let src_view = src.as_cuda_slice::<T>()?.slice(s0..s1);
        let mut cache_view = cache.as_cuda_slice_mut::<T>()?.slice_mut(c0..c1);
        let mut a = kernel.builder();
        a.arg(&mut cache_view).arg(&src_view).arg(slot_view).arg(&n).arg(&row).arg(&capacity);
        launch(a, grid_for(n, 256))
    }
    let offsets = (c0, c1, s0, s1);
    match cache.dtype() {
        candle_core::DType::F32 => go::<f32>(&dev, cache, src, offsets, &slot_view, n, row, capacity),
        candle_core::DType::BF16 => go::<half::bf16>(&dev, cache, src, offsets, &slot_view, n, row, capacity),
        other => candle_core::bail!("kv write: {other:?} caches are not served on the GPU"),
    }
}
