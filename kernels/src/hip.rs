//! The kernels on AMD GPUs (feature `hip`): the same sources as the `cuda` feature's
//! (`kernels/cuda/*.cu`, the portable dialect of `portable.h`), compiled by `build.rs` with hipcc
//! into one code object bundle per source for the targets of `scripts/hip-targets`, embedded,
//! loaded with `hipModuleLoadData` and launched with `hipModuleLaunchKernel` through hip-sys.
//!
//! candle has no HIP backend, so this layer works on [`DeviceBuffer`]s rather than tensors: a
//! [`HipDevice`] owns a stream, and each op module (`rmsnorm`, `elementwise`, `adamw`,
//! `cross_entropy`, `attention`, `nf4`) launches its kernels with the arguments and geometry of
//! the CUDA launcher in `gpu/`, except that a kernel that gives a warp to each row gets a
//! 64-lane wavefront here. The tensor-core flash kernels are NVIDIA-only (empty under hipcc), so
//! attention runs the warp-per-row kernels.
//!
//! Built and linked against Debian's ROCm 5.2, never run: no machine of this project has an AMD
//! GPU. The device tests are ignored here; `scripts/hip-test` runs them on a machine with one.

pub mod adamw;
pub mod attention;
pub mod cross_entropy;
mod device;
pub mod elementwise;
mod module;
pub mod nf4;
pub mod rmsnorm;
#[cfg(test)]
mod tests;

pub use device::{DeviceBuffer, HipDevice};

use hip_sys::hiprt::{self as sys, hipError_t};

/// A HIP runtime call that did not return `hipSuccess`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{call} failed: {message} (hipError_t {code})")]
pub struct HipError {
    pub call: &'static str,
    pub code: i32,
    /// `hipGetErrorString` of the code.
    pub message: String,
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Hip(#[from] HipError),
    /// Arguments a kernel cannot take (lengths that disagree, sizes past `int`, buffers of
    /// another device): refused before anything is launched.
    #[error("hip {op}: {detail}")]
    Invalid { op: &'static str, detail: String },
}

pub type Result<T> = std::result::Result<T, Error>;

/// The error for arguments `op` cannot take.
fn invalid(op: &'static str, detail: impl Into<String>) -> Error {
    Error::Invalid { op, detail: detail.into() }
}

/// A size as the kernels' `int`, refusing what would overflow it.
fn int(op: &'static str, n: usize) -> Result<i32> {
    i32::try_from(n).map_err(|_| invalid(op, format!("size {n} exceeds i32")))
}

/// Refuses `what` of `got` elements where `op` needs `want`.
fn same_len(op: &'static str, what: &str, got: usize, want: usize) -> Result<()> {
    if got == want { Ok(()) } else { Err(invalid(op, format!("{what} has {got} elements, not {want}"))) }
}

/// `Ok` for `hipSuccess`, else `call`'s error with the runtime's description. hip-sys declares
/// `hipError_t` as a Rust enum; every code that Debian's ROCm 5.2 headers define is one of its
/// variants (checked when the dependency was added), so the runtime cannot return an invalid one.
fn check(call: &'static str, code: hipError_t) -> std::result::Result<(), HipError> {
    if code == hipError_t::hipSuccess {
        return Ok(());
    }
    // SAFETY: hipGetErrorString returns null or a static NUL-terminated string, for any code.
    let text = unsafe { sys::hipGetErrorString(code) };
    let message = if text.is_null() {
        "no description".to_owned()
    } else {
        // SAFETY: non-null, static and NUL-terminated (above).
        unsafe { std::ffi::CStr::from_ptr(text) }.to_string_lossy().into_owned()
    };
    Err(HipError { call, code: code as i32, message })
}

/// Element types a [`DeviceBuffer`] holds: plain values, so bytes copied back from the device
/// are always a valid value.
///
/// # Safety
/// Implementors have no padding and every bit pattern of their size is a valid value.
pub unsafe trait DeviceCopy: Copy + 'static {}
// SAFETY: plain numbers without padding, valid for every bit pattern.
unsafe impl DeviceCopy for f32 {}
// SAFETY: as above.
unsafe impl DeviceCopy for half::bf16 {}
// SAFETY: as above.
unsafe impl DeviceCopy for u32 {}
// SAFETY: as above.
unsafe impl DeviceCopy for u8 {}

mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for half::bf16 {}
}

/// The element types the kernels are instantiated for (sealed: a kernel reads its buffers as
/// exactly these types).
pub trait Elem: DeviceCopy + sealed::Sealed {
    /// The suffix of the extern "C" names, as `FOR_DTYPES` in portable.h writes them.
    const SUFFIX: &'static str;

    /// The name of kernel `base` for this type, e.g. `rmsnorm_fwd_f32`.
    fn kernel(base: &str) -> String {
        format!("{base}_{}", Self::SUFFIX)
    }
}
impl Elem for f32 {
    const SUFFIX: &'static str = "f32";
}
impl Elem for half::bf16 {
    const SUFFIX: &'static str = "bf16";
}
