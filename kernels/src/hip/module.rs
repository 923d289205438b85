//! The embedded code objects, kernel arguments, launch geometry and the launch itself.

use super::device::Context;
use super::{DeviceBuffer, DeviceCopy, HipDevice, Result, check, invalid, sys};
use std::ffi::c_void;

/// One `.cu` file's code objects: the offload bundle `build.rs` wrote (one ELF per target).
pub(super) struct Image {
    pub(super) name: &'static str,
    bytes: &'static PageAligned<[u8]>,
}

impl Image {
    pub(super) fn bytes(&self) -> &'static [u8] {
        &self.bytes.0
    }
}

/// The bundler places each code object at a 4 KiB offset; a page-aligned image keeps the ELF
/// headers inside aligned wherever the loader reads them in place.
#[repr(C, align(4096))]
pub(super) struct PageAligned<B: ?Sized>(B);

macro_rules! image {
    ($name:literal) => {
        Image { name: $name, bytes: &PageAligned(*include_bytes!(concat!(env!("OUT_DIR"), "/", $name, ".hipfb"))) }
    };
}

pub(super) static RMSNORM: Image = image!("rmsnorm");
pub(super) static ELEMENTWISE: Image = image!("elementwise");
pub(super) static CROSS_ENTROPY: Image = image!("cross_entropy");
pub(super) static ATTENTION: Image = image!("attention");
pub(super) static NF4: Image = image!("nf4");

/// Lanes per wavefront on AMD GPUs: `WARP` in portable.h under hipcc.
pub(super) const WAVE: u32 = 64;
/// Threads per block, as the CUDA launchers use.
pub(super) const BLOCK: u32 = 256;

/// Blocks of a launch (x, y, z); every launch here has one-dimensional blocks of [`BLOCK`].
#[derive(Debug, Clone, Copy)]
pub(super) struct Grid(pub u32, pub u32, pub u32);

/// One wavefront per row, `BLOCK / WAVE` rows per block (the CUDA launchers' 256 threads hold
/// 8 rows of 32 lanes; here 4 rows of 64), over `y` × `z` further blocks. `rows` fits an `int`.
pub(super) fn per_row(rows: usize, y: usize, z: usize) -> Grid {
    let per_block = (BLOCK / WAVE) as usize;
    Grid(rows.div_ceil(per_block).max(1) as u32, y as u32, z as u32)
}

/// Blocks for one thread per element of `n`, which fits an `int`.
pub(super) fn per_thread(n: usize) -> u32 {
    n.div_ceil(BLOCK as usize).max(1) as u32
}

/// `n` threads for a grid-stride kernel (the grid is capped; the loop covers the rest).
pub(super) fn grid_stride(n: usize) -> Grid {
    Grid(per_thread(n.min(65_535 * 16 * BLOCK as usize)), 1, 1)
}

/// One kernel argument, held by value so that the launch can point at it: a buffer's device
/// address (borrowed for `'a`, so it outlives the launch call) or a scalar of the kernel's
/// C type (`int`, `float`, `size_t`).
pub(super) enum Arg<'a> {
    Buffer(*mut c_void, &'a Context),
    Int(i32),
    Float(f32),
    Size(usize),
}

impl Arg<'_> {
    /// The pointer `hipModuleLaunchKernel` reads the argument's value through.
    fn param(&mut self) -> *mut c_void {
        match self {
            Arg::Buffer(ptr, _) => (ptr as *mut *mut c_void).cast(),
            Arg::Int(v) => (v as *mut i32).cast(),
            Arg::Float(v) => (v as *mut f32).cast(),
            Arg::Size(v) => (v as *mut usize).cast(),
        }
    }
}

impl<'a, T: DeviceCopy> From<&'a DeviceBuffer<T>> for Arg<'a> {
    fn from(b: &'a DeviceBuffer<T>) -> Self {
        Arg::Buffer(b.ptr(), b.context())
    }
}

impl<'a, T: DeviceCopy> From<&'a mut DeviceBuffer<T>> for Arg<'a> {
    fn from(b: &'a mut DeviceBuffer<T>) -> Self {
        Arg::from(&*b)
    }
}

impl From<i32> for Arg<'_> {
    fn from(v: i32) -> Self {
        Arg::Int(v)
    }
}

impl From<f32> for Arg<'_> {
    fn from(v: f32) -> Self {
        Arg::Float(v)
    }
}

impl From<usize> for Arg<'_> {
    fn from(v: usize) -> Self {
        Arg::Size(v)
    }
}

/// `[Arg; N]` from buffers (`&` inputs, `&mut` outputs) and scalars, in the kernel's order.
macro_rules! args {
    ($($a:expr),* $(,)?) => { [$($crate::hip::module::Arg::from($a)),*] };
}
pub(super) use args;

/// Queues kernel `name` of `image` on `dev`'s stream over `grid` blocks of [`BLOCK`] threads.
/// Buffers of another device are refused.
pub(super) fn launch(
    dev: &HipDevice,
    image: &'static Image,
    name: &str,
    grid: Grid,
    args: &mut [Arg<'_>],
) -> Result<()> {
    let ctx = dev.context();
    if args.iter().any(|a| matches!(a, Arg::Buffer(_, c) if !std::ptr::eq(*c, ctx))) {
        return Err(invalid("launch", format!("{name}: a buffer of another device")));
    }
    let f = ctx.function(image, name)?;
    let mut params: Vec<*mut c_void> = args.iter_mut().map(Arg::param).collect();
    // SAFETY: each kernel in kernels/cuda takes exactly the arguments its launcher here passes,
    // in that order and of those C types, and reads and writes only inside the lengths it is
    // given, which the launcher checked against the buffers; the runtime copies the values
    // before returning, while `args` and `params` are alive.
    let code = unsafe {
        sys::hipModuleLaunchKernel(
            f,
            grid.0,
            grid.1,
            grid.2,
            BLOCK,
            1,
            1,
            0,
            ctx.stream(),
            params.as_mut_ptr(),
            std::ptr::null_mut(),
        )
    };
    Ok(check("hipModuleLaunchKernel", code)?)
}
