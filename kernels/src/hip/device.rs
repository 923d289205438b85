//! The device, its stream and the code objects loaded on it; device buffers.

use super::module::Image;
use super::{DeviceCopy, Result, check, invalid, sys};
use std::cell::RefCell;
use std::ffi::{CString, c_void};
use std::marker::PhantomData;
use std::rc::Rc;

/// What a device's buffers and launches share. Freed last: every buffer holds it.
pub(super) struct Context {
    ordinal: i32,
    stream: sys::hipStream_t,
    /// Code objects loaded so far, by source name; loaded on first use.
    modules: RefCell<Vec<(&'static str, sys::hipModule_t)>>,
}

impl Context {
    /// Makes this device the calling thread's current one, which allocations and module loads
    /// go to (launches and copies go to the stream's device).
    fn bind(&self) -> Result<()> {
        // SAFETY: no pointers; an invalid ordinal is an error code.
        Ok(check("hipSetDevice", unsafe { sys::hipSetDevice(self.ordinal) })?)
    }

    pub(super) fn stream(&self) -> sys::hipStream_t {
        self.stream
    }

    fn synchronize(&self) -> Result<()> {
        // SAFETY: the stream lives as long as self.
        Ok(check("hipStreamSynchronize", unsafe { sys::hipStreamSynchronize(self.stream) })?)
    }

    /// Kernel `name` of `image`, loading the image on first use.
    pub(super) fn function(&self, image: &'static Image, name: &str) -> Result<sys::hipFunction_t> {
        let module = self.module(image)?;
        let cname = CString::new(name).map_err(|_| invalid("launch", format!("kernel name {name:?} has a NUL")))?;
        let mut f = std::ptr::null_mut();
        // SAFETY: module is loaded and alive; cname is NUL-terminated; f is written on success.
        check("hipModuleGetFunction", unsafe { sys::hipModuleGetFunction(&mut f, module, cname.as_ptr()) })?;
        Ok(f)
    }

    fn module(&self, image: &'static Image) -> Result<sys::hipModule_t> {
        if let Some(&(_, m)) = self.modules.borrow().iter().find(|(n, _)| *n == image.name) {
            return Ok(m);
        }
        self.bind()?;
        let mut m = std::ptr::null_mut();
        // SAFETY: the image is a complete offload bundle embedded for the program's lifetime.
        let code = unsafe { sys::hipModuleLoadData(&mut m, image.bytes().as_ptr().cast()) };
        // A device whose target was not built is the likely failure: say which ones were.
        check("hipModuleLoadData", code).map_err(|mut e| {
            e.message += &format!(" (code objects for {})", env!("MINDXTRAIN_HIP_TARGETS"));
            e
        })?;
        self.modules.borrow_mut().push((image.name, m));
        Ok(m)
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        // Nothing can take an error from a drop; the handles are gone either way.
        // SAFETY: the handles are this context's own; the stream is drained first, so no
        // queued kernel outlives its module.
        unsafe {
            let _ = sys::hipStreamSynchronize(self.stream);
            for (_, m) in self.modules.get_mut().drain(..) {
                let _ = sys::hipModuleUnload(m);
            }
            let _ = sys::hipStreamDestroy(self.stream);
        }
    }
}

/// One AMD GPU and a stream on it, where every copy and launch of its buffers is queued in
/// order. Not `Send`: HIP's current device is a per-thread setting, made on the creating thread.
pub struct HipDevice {
    ctx: Rc<Context>,
}

impl HipDevice {
    /// Initialises HIP and opens device `ordinal`: on a machine without an AMD GPU this is the
    /// runtime's error (`hipInit`: `hipErrorInvalidDevice` with Debian's ROCm 5.2).
    pub fn new(ordinal: usize) -> Result<HipDevice> {
        let ordinal = i32::try_from(ordinal).map_err(|_| invalid("device", format!("ordinal {ordinal}")))?;
        let mut stream = std::ptr::null_mut();
        // SAFETY: plain calls; the stream handle is written on success.
        unsafe {
            check("hipInit", sys::hipInit(0))?;
            check("hipSetDevice", sys::hipSetDevice(ordinal))?;
            check("hipStreamCreate", sys::hipStreamCreate(&mut stream))?;
        }
        Ok(HipDevice { ctx: Rc::new(Context { ordinal, stream, modules: RefCell::default() }) })
    }

    /// A device copy of `host`.
    pub fn upload<T: DeviceCopy>(&self, host: &[T]) -> Result<DeviceBuffer<T>> {
        let buf = self.alloc_raw::<T>(host.len())?;
        if !host.is_empty() {
            // SAFETY: both ranges hold buf.bytes(); pageable host memory makes hipMemcpyAsync
            // copy synchronously (hip_runtime_api.h), so `host` is read before the call returns.
            let kind = sys::hipMemcpyKind::hipMemcpyHostToDevice;
            let code =
                unsafe { sys::hipMemcpyAsync(buf.ptr, host.as_ptr().cast(), buf.bytes(), kind, self.ctx.stream) };
            check("hipMemcpyAsync", code)?;
            self.ctx.synchronize()?;
        }
        Ok(buf)
    }

    /// Waits for everything queued on the device's stream.
    pub fn synchronize(&self) -> Result<()> {
        self.ctx.synchronize()
    }

    /// An output buffer of `len` elements for a kernel to write. In tests every byte is 0xFF
    /// first (NaN in f32 and bf16), so an element a kernel fails to write fails every check.
    pub(super) fn alloc<T: DeviceCopy>(&self, len: usize) -> Result<DeviceBuffer<T>> {
        let buf = self.alloc_raw(len)?;
        #[cfg(test)]
        if len > 0 {
            // SAFETY: buf owns buf.bytes() bytes at buf.ptr; the fill is queued on the stream.
            check("hipMemsetAsync", unsafe { sys::hipMemsetAsync(buf.ptr, 0xFF, buf.bytes(), self.ctx.stream) })?;
        }
        Ok(buf)
    }

    fn alloc_raw<T: DeviceCopy>(&self, len: usize) -> Result<DeviceBuffer<T>> {
        let bytes = len.checked_mul(size_of::<T>()).ok_or_else(|| invalid("alloc", format!("{len} elements")))?;
        self.ctx.bind()?;
        let mut ptr = std::ptr::null_mut();
        // SAFETY: ptr is written on success (null for 0 bytes, which hipFree accepts).
        check("hipMalloc", unsafe { sys::hipMalloc(&mut ptr, bytes) })?;
        Ok(DeviceBuffer { ptr, len, ctx: self.ctx.clone(), _elem: PhantomData })
    }

    pub(super) fn context(&self) -> &Context {
        &self.ctx
    }
}

/// `len` elements of `T` in device memory, freed on drop.
pub struct DeviceBuffer<T: DeviceCopy> {
    ptr: *mut c_void,
    len: usize,
    ctx: Rc<Context>,
    _elem: PhantomData<T>,
}

impl<T: DeviceCopy> DeviceBuffer<T> {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn bytes(&self) -> usize {
        self.len * size_of::<T>()
    }

    /// The contents, after everything queued before on the device's stream.
    pub fn to_vec(&self) -> Result<Vec<T>> {
        let mut host = Vec::<T>::with_capacity(self.len);
        if self.len > 0 {
            // SAFETY: host has room for bytes(); the copy is synchronous for pageable memory
            // (as in upload) and ordered after the stream's kernels.
            let kind = sys::hipMemcpyKind::hipMemcpyDeviceToHost;
            let code =
                unsafe { sys::hipMemcpyAsync(host.as_mut_ptr().cast(), self.ptr, self.bytes(), kind, self.ctx.stream) };
            check("hipMemcpyAsync", code)?;
            self.ctx.synchronize()?;
            // SAFETY: the copy wrote all len elements, and any bytes are a valid T (DeviceCopy).
            unsafe { host.set_len(self.len) };
        }
        Ok(host)
    }

    /// The device address, for a kernel argument.
    pub(super) fn ptr(&self) -> *mut c_void {
        self.ptr
    }

    /// The device the buffer lives on.
    pub(super) fn context(&self) -> &Context {
        &self.ctx
    }
}

impl<T: DeviceCopy> Drop for DeviceBuffer<T> {
    fn drop(&mut self) {
        // hipFree waits for the device, so no queued kernel still uses the memory. Nothing can
        // take an error from a drop.
        // SAFETY: ptr came from hipMalloc and is freed once.
        let _ = unsafe { sys::hipFree(self.ptr) };
    }
}
