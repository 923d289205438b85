//! Fused CUDA kernels (feature `cuda`): the sources are in `kernels/cuda/*.cu`, written in the
//! portable dialect of `kernels/cuda/portable.h` and compiled to PTX by `build.rs`. Each op
//! module calls its kernel here for CUDA tensors of f32 or bf16 (arithmetic in f32 inside the
//! kernel) and falls back to the CPU kernel or the composed reference otherwise.
//!
//! Determinism: no kernel uses atomics; cross-row reductions go through fixed blocks summed in
//! order, so a result depends only on the inputs and the shapes.

pub(crate) mod adamw;
pub(crate) mod attention;
pub(crate) mod causal_conv1d;
pub(crate) mod cross_entropy;
pub(crate) mod delta_rule;
pub(crate) mod elementwise;
pub(crate) mod gemm;
pub(crate) mod gemv;
pub(crate) mod grouped;
pub(crate) mod lt;
pub(crate) mod multi_lora;
pub(crate) mod nf4;
pub(crate) mod paged;
pub(crate) mod reduce;
pub(crate) mod rmsnorm;
pub(crate) mod router;
pub(crate) mod sampling;
pub(crate) mod seeded;
#[cfg(test)]
mod tests;

use candle_core::cuda_backend::cudarc::driver::{
    CudaFunction, CudaSlice, CudaStream, CudaView, DeviceRepr, LaunchArgs, ValidAsZeroBits,
};
pub(crate) use candle_core::cuda_backend::cudarc::driver::{LaunchConfig, PushKernelArg};
use candle_core::cuda_backend::{CudaDType, CudaDevice, CudaStorage, WrapErr};
use candle_core::op::BackpropOp;
use candle_core::{DType, Device, Result, Shape, Storage, Tensor};

/// One `.cu` file's PTX, embedded at build time.
pub(crate) struct Module {
    name: &'static str,
    ptx: &'static str,
}

macro_rules! module {
    ($name:literal) => {
        $crate::gpu::Module { name: $name, ptx: include_str!(concat!(env!("OUT_DIR"), "/", $name, ".ptx")) }
    };
}
pub(crate) use module;

/// The element types the kernels are instantiated for; `SUFFIX` is the one in their names.
pub(crate) trait Elem: CudaDType + DeviceRepr + ValidAsZeroBits + Copy + Send + Sync + 'static {
    const SUFFIX: &'static str;
    const ONE: Self;
    const ZERO: Self;
}
impl Elem for f32 {
    const SUFFIX: &'static str = "f32";
    const ONE: Self = 1.0;
    const ZERO: Self = 0.0;
}
impl Elem for half::bf16 {
    const SUFFIX: &'static str = "bf16";
    const ONE: Self = half::bf16::ONE;
    const ZERO: Self = half::bf16::ZERO;
}

/// Whether the fused GPU kernels serve these tensors (all on one CUDA device, one dtype of
/// f32 or bf16), and in which dtype.
pub(crate) fn dtype_of(ts: &[&Tensor]) -> Option<DType> {
    let first = ts.first()?;
    let dt = first.dtype();
    let ok = matches!(dt, DType::F32 | DType::BF16)
        && ts.iter().all(|t| t.device().is_cuda() && t.device().same_device(first.device()) && t.dtype() == dt);
    ok.then_some(dt)
}

/// Calls `$f::<f32>` or `$f::<half::bf16>` when the GPU kernels serve `$ts`, else evaluates `$other`.
macro_rules! dispatch {
    ([$($t:expr),+], $f:ident($($arg:expr),*), $other:expr) => {
        match $crate::gpu::dtype_of(&[$($t),+]) {
            Some(candle_core::DType::F32) => $f::<f32>($($arg),*),
            Some(candle_core::DType::BF16) => $f::<half::bf16>($($arg),*),
            _ => $other,
        }
    };
}
pub(crate) use dispatch;

/// The CUDA device of a tensor that [`dtype_of`] accepted.
pub(crate) fn device(t: &Tensor) -> Result<CudaDevice> {
    match t.device() {
        Device::Cuda(d) => Ok(d.clone()),
        _ => candle_core::bail!("gpu kernel: tensor is not on a CUDA device"),
    }
}

/// A kernel of `module` named `{name}_{T::SUFFIX}`, with a launch builder on the device's stream.
pub(crate) struct Kernel {
    func: CudaFunction,
    stream: std::sync::Arc<CudaStream>,
}

impl Kernel {
    pub fn new<T: Elem>(dev: &CudaDevice, module: &Module, name: &str) -> Result<Kernel> {
        Self::named(dev, module, &format!("{name}_{}", T::SUFFIX))
    }

    /// A kernel with no dtype suffix.
    pub fn named(dev: &CudaDevice, module: &Module, name: &str) -> Result<Kernel> {
        let f = dev.get_or_load_custom_func(name, module.name, module.ptx)?;
        Ok(Kernel { func: f.into_cuda_function(), stream: dev.cuda_stream() })
    }

    /// Lets launches use `bytes` of dynamic shared memory (past the default 48 KiB).
    pub fn with_dynamic_shared(self, bytes: u32) -> Result<Kernel> {
        use candle_core::cuda_backend::cudarc::driver::sys::CUfunction_attribute;
        let attr = CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES;
        self.func.set_attribute(attr, bytes as i32).w()?;
        Ok(self)
    }

    pub fn builder(&self) -> LaunchArgs<'_> {
        self.stream.launch_builder(&self.func)
    }
}

/// Launches a built argument list; `args` owns nothing the kernel outlives (cudarc records
/// the buffers' uses on the stream).
pub(crate) fn launch(mut args: LaunchArgs<'_>, cfg: LaunchConfig) -> Result<()> {
    #[cfg(test)]
    LAUNCHES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    // SAFETY: every kernel in kernels/cuda takes exactly the arguments its Rust caller pushes,
    // in that order and of those types, and writes only inside the lengths it is given.
    unsafe { args.launch(cfg) }.w()?;
    Ok(())
}

/// Kernel launches so far: the tests check that an op really ran on a fused kernel rather
/// than falling back to the composed reference.
#[cfg(test)]
pub(crate) static LAUNCHES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// `n` threads in blocks of `block`, for a grid-stride kernel (the grid is capped; the loop
/// covers the rest).
pub(crate) fn grid_for(n: usize, block: u32) -> LaunchConfig {
    let blocks = n.div_ceil(block as usize).clamp(1, 65_535 * 16) as u32;
    LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (block, 1, 1), shared_mem_bytes: 0 }
}

/// An output buffer of `n` elements. Kernels write every element; in tests the buffer is
/// filled with NaN first, so an unwritten element cannot pass a check.
pub(crate) fn alloc<T: Elem>(dev: &CudaDevice, n: usize) -> Result<CudaSlice<T>> {
    // SAFETY: the buffer is written by the kernel before any read (poisoned in tests to prove it).
    #[allow(unused_mut)]
    let mut buf = unsafe { dev.alloc::<T>(n) }?;
    #[cfg(test)]
    poison(dev, &mut buf)?;
    Ok(buf)
}

#[cfg(test)]
fn poison<T: Elem>(dev: &CudaDevice, buf: &mut CudaSlice<T>) -> Result<()> {
    use candle_core::cuda_backend::cudarc::driver::DevicePtrMut;
    let stream = dev.cuda_stream();
    let bytes = buf.len() * std::mem::size_of::<T>();
    let (ptr, _sync) = buf.device_ptr_mut(&stream);
    // All-ones bytes are a NaN in f32 and in bf16.
    // SAFETY: ptr points at `bytes` bytes owned by `buf`, on this stream.
    unsafe { candle_core::cuda_backend::cudarc::driver::result::memset_d8_async(ptr, 0xFF, bytes, stream.cu_stream()) }
        .w()
}

/// A tensor owning a kernel's output buffer.
pub(crate) fn tensor<T: CudaDType>(buf: CudaSlice<T>, dev: &CudaDevice, shape: impl Into<Shape>) -> Tensor {
    let storage = Storage::Cuda(CudaStorage::wrap_cuda_slice(buf, dev.clone()));
    Tensor::from_storage(storage, shape, BackpropOp::none(), false)
}

/// Runs `f` on device views of `ts` (made contiguous first), all of element type `T`.
pub(crate) fn with_views<T: CudaDType + DeviceRepr, R, const N: usize>(
    ts: [&Tensor; N],
    f: impl FnOnce([CudaView<'_, T>; N]) -> Result<R>,
) -> Result<R> {
    let copies: Vec<Tensor> = ts.iter().map(|t| t.contiguous()).collect::<Result<_>>()?;
    with_dense_views(std::array::from_fn(|i| &copies[i]), f)
}

/// Runs `f` on device views of `ts` as they lie, no copy: each must fill one unbroken block of
/// its storage in some order of its axes (contiguous, or a transpose of a contiguous tensor),
/// and the kernel indexes it with that order's strides itself.
pub(crate) fn with_dense_views<T: CudaDType + DeviceRepr, R, const N: usize>(
    ts: [&Tensor; N],
    f: impl FnOnce([CudaView<'_, T>; N]) -> Result<R>,
) -> Result<R> {
    let guards: Vec<_> = ts.iter().map(|t| t.storage_and_layout()).collect();
    let mut views = Vec::with_capacity(N);
    for (storage, layout) in &guards {
        let Some((start, end)) = dense_offsets(layout) else {
            candle_core::bail!("gpu kernel: tensor of shape {:?} has gaps in its storage", layout.dims())
        };
        match &**storage {
            Storage::Cuda(c) => views.push(c.as_cuda_slice::<T>()?.slice(start..end)),
            _ => candle_core::bail!("gpu kernel: tensor is not on a CUDA device"),
        }
    }
    let views: [CudaView<'_, T>; N] = views.try_into().map_err(|_| candle_core::Error::Msg("view count".into()))?;
    f(views)
}

/// The storage range `layout` covers when it covers it without gaps or overlaps (any order of
/// its axes), else `None`.
fn dense_offsets(layout: &candle_core::Layout) -> Option<(usize, usize)> {
    let start = layout.start_offset();
    let mut axes: Vec<(usize, usize)> =
        layout.dims().iter().copied().zip(layout.stride().iter().copied()).filter(|&(d, _)| d > 1).collect();
    axes.sort_by_key(|&(_, s)| s);
    let mut expected = 1;
    for (d, s) in axes {
        if s != expected {
            return None;
        }
        expected *= d;
    }
    Some((start, start + layout.shape().elem_count()))
}

/// `name` (a kernel over `n` elements, or rows `n` wide, of `ts`) or its `_vec` form over 16-byte
/// chunks when `n` is a whole number of chunks and every input starts 16-byte aligned (fresh
/// outputs do), with the count of elements or chunks it takes.
pub(crate) fn chunked<T: Elem>(name: &str, n: usize, ts: &[&Tensor]) -> (String, usize) {
    let per = 16 / std::mem::size_of::<T>();
    if n.is_multiple_of(per) && ts.iter().all(|t| aligned16(t)) {
        (format!("{name}_vec"), n / per)
    } else {
        (name.to_string(), n)
    }
}

/// Whether `t`'s data starts 16-byte aligned as a kernel will see it: a tensor `with_views`
/// copies (not contiguous) starts a fresh, aligned allocation.
pub(crate) fn aligned16(t: &Tensor) -> bool {
    !t.is_contiguous() || (t.layout().start_offset() * t.dtype().size_in_bytes()).is_multiple_of(16)
}

/// A size as the kernels' `int`, refusing what would overflow it.
pub(crate) fn int(n: usize) -> Result<i32> {
    i32::try_from(n).map_err(|_| candle_core::Error::Msg(format!("gpu kernel: size {n} exceeds i32")))
}
