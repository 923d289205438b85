//! The NCCL communicator, held here through cudarc's raw bindings rather than its `safe::Comm`:
//! that type keeps its handle private, and the handle is what `ncclCommGetAsyncError` takes. A
//! peer that died or a broken connection shows there, while the work queued on the stream would
//! otherwise wait for it forever.
//!
//! Ordering with other streams is the same as cudarc's own groups: each buffer's device pointer is
//! taken with its event guard, and the guards are dropped (their events recorded) after
//! `ncclGroupEnd`, when the work is really queued.

use candle_core::cuda_backend::cudarc::driver::{CudaStream, CudaView, CudaViewMut, SyncOnDrop};
use candle_core::cuda_backend::cudarc::nccl::result::{self, NcclError};
use candle_core::cuda_backend::cudarc::nccl::safe::NcclType;
use candle_core::cuda_backend::cudarc::nccl::sys;
use std::ffi::c_void;
use std::marker::PhantomData;
use std::mem::MaybeUninit;
use std::sync::Arc;

const SUM: sys::ncclRedOp_t = sys::ncclRedOp_t::ncclSum;

/// One rank's communicator; aborted when dropped (a rank that leaves does not wait for peers).
pub(super) struct Comm {
    raw: sys::ncclComm_t,
    stream: Arc<CudaStream>,
    rank: usize,
    world: usize,
}

/// A fresh unique id (rank 0 makes it; the rendezvous hands it to every rank).
pub(super) fn unique_id() -> Result<[std::ffi::c_char; 128], NcclError> {
    Ok(result::get_uniqueid()?.internal)
}

impl Comm {
    /// Joins the communicator of `world` ranks named by `id` as `rank`; its work runs on `stream`.
    pub(super) fn join(
        stream: Arc<CudaStream>,
        rank: usize,
        world: usize,
        id: [std::ffi::c_char; 128],
    ) -> Result<Comm, NcclError> {
        let invalid = || NcclError(sys::ncclResult_t::ncclInvalidArgument);
        let (n, r) = (i32::try_from(world).map_err(|_| invalid())?, i32::try_from(rank).map_err(|_| invalid())?);
        let mut raw = MaybeUninit::uninit();
        // SAFETY: `raw` is written by a successful ncclCommInitRank and read only then.
        let raw = unsafe {
            result::comm_init_rank(raw.as_mut_ptr(), n, sys::ncclUniqueId { internal: id }, r)?;
            raw.assume_init()
        };
        Ok(Comm { raw, stream, rank, world })
    }

    pub(super) fn rank(&self) -> usize {
        self.rank
    }

    pub(super) fn world(&self) -> usize {
        self.world
    }

    /// The communicator's asynchronous error: `Ok(())` while there is none (or an operation is
    /// still being set up), else the NCCL result that ended it.
    pub(super) fn async_error(&self) -> Result<(), sys::ncclResult_t> {
        let mut state = sys::ncclResult_t::ncclSuccess;
        // SAFETY: `raw` is a live communicator; NCCL writes one result through the pointer.
        let call = unsafe { sys::ncclCommGetAsyncError(self.raw, &mut state) };
        match (call, state) {
            (sys::ncclResult_t::ncclSuccess, sys::ncclResult_t::ncclSuccess | sys::ncclResult_t::ncclInProgress) => {
                Ok(())
            }
            (sys::ncclResult_t::ncclSuccess, failed) => Err(failed),
            (failed, _) => Err(failed),
        }
    }

    /// Starts a group of operations; they are queued together by [`Group::end`].
    pub(super) fn group(&self) -> Result<Group<'_>, NcclError> {
        result::group_start()?;
        Ok(Group { comm: self, guards: Vec::new(), ended: false })
    }
}

impl Drop for Comm {
    fn drop(&mut self) {
        // SAFETY: `raw` is live and not used after this. An abort that fails leaves nothing to
        // do: the process is leaving the communicator either way.
        let _ = unsafe { result::comm_abort(self.raw) };
    }
}

/// Operations between `ncclGroupStart` and `ncclGroupEnd`, with the event guards of their buffers.
pub(super) struct Group<'a> {
    comm: &'a Comm,
    guards: Vec<SyncOnDrop<'a>>,
    ended: bool,
}

impl<'a> Group<'a> {
    fn stream(&self) -> sys::cudaStream_t {
        self.comm.stream.cu_stream() as sys::cudaStream_t
    }

    /// `view`'s device pointer for NCCL to read; its event guard is kept until the group ends.
    fn input<T>(&mut self, view: CudaView<'a, T>) -> *const c_void {
        let comm: &'a Comm = self.comm;
        let (ptr, guard) = view.view_ptr(&comm.stream);
        self.guards.push(guard);
        ptr as *const c_void
    }

    /// `view` for NCCL to write, whole or in parts ([`Out::part`]); its event guard is kept
    /// until the group ends. One buffer written in parts is what lets a gather or a scatter to
    /// many owners return a single tensor without joining pieces on the compute stream (a join
    /// there waits for NCCL at once, so nothing queued after it overlaps the operation).
    pub(super) fn output<T>(&mut self, view: CudaViewMut<'a, T>) -> Out<T> {
        let comm: &'a Comm = self.comm;
        let len = view.len();
        let (ptr, guard) = view.view_ptr_mut(&comm.stream);
        self.guards.push(guard);
        Out { ptr, len, _t: PhantomData }
    }

    /// `dst` = the sum over ranks of `src`.
    pub(super) fn all_reduce<T: NcclType>(
        &mut self,
        src: CudaView<'a, T>,
        dst: CudaViewMut<'a, T>,
    ) -> Result<(), NcclError> {
        let count = src.len();
        let (s, d) = (self.input(src), self.output(dst).ptr());
        // SAFETY: both pointers come from live views of `count` elements of `T`.
        unsafe { result::all_reduce(s, d, count, T::as_nccl_type(), SUM, self.comm.raw, self.stream()) }.map(drop)
    }

    /// The sum over ranks of `src` into `dst` on `root` (`dst` is `None` on every other rank).
    pub(super) fn reduce<T: NcclType>(
        &mut self,
        src: CudaView<'a, T>,
        dst: Option<Out<T>>,
        root: usize,
    ) -> Result<(), NcclError> {
        let count = src.len();
        if dst.is_some_and(|d| d.len != count) {
            return Err(NcclError(sys::ncclResult_t::ncclInvalidArgument));
        }
        let s = self.input(src);
        let d = dst.map_or(std::ptr::null_mut(), |d| d.ptr());
        // SAFETY: `s` (and `d` where given) point into live buffers of `count` elements of `T`.
        unsafe { result::reduce(s, d, count, T::as_nccl_type(), SUM, root as i32, self.comm.raw, self.stream()) }
            .map(drop)
    }

    /// `root`'s `src` into every rank's `dst` (`src` is `None` on every other rank).
    pub(super) fn broadcast<T: NcclType>(
        &mut self,
        src: Option<CudaView<'a, T>>,
        dst: Out<T>,
        root: usize,
    ) -> Result<(), NcclError> {
        let count = dst.len;
        if src.as_ref().is_some_and(|s| s.len() != count) {
            return Err(NcclError(sys::ncclResult_t::ncclInvalidArgument));
        }
        let s = src.map_or(std::ptr::null(), |src| self.input(src));
        let d = dst.ptr();
        // SAFETY: `d` (and `s` where given) point into live buffers of `count` elements of `T`.
        unsafe { result::broadcast(s, d, count, T::as_nccl_type(), root as i32, self.comm.raw, self.stream()) }
            .map(drop)
    }

    /// Every rank's `src` side by side in `dst` (world × its length).
    pub(super) fn all_gather<T: NcclType>(
        &mut self,
        src: CudaView<'a, T>,
        dst: CudaViewMut<'a, T>,
    ) -> Result<(), NcclError> {
        let count = src.len();
        let d = self.output(dst);
        if d.len != count * self.comm.world {
            return Err(NcclError(sys::ncclResult_t::ncclInvalidArgument));
        }
        let (s, d) = (self.input(src), d.ptr());
        // SAFETY: `s` holds `count` elements of `T`, `d` world × `count`.
        unsafe { result::all_gather(s, d, count, T::as_nccl_type(), self.comm.raw, self.stream()) }.map(drop)
    }

    /// Queues the group's work; the buffers' events are recorded after this returns.
    pub(super) fn end(mut self) -> Result<(), NcclError> {
        self.ended = true;
        result::group_end().map(drop)
    }
}

/// Where an operation of a [`Group`] writes: a buffer given to [`Group::output`], or a range of
/// one. Valid while the group is (the group holds the buffer's borrow and event guard).
pub(super) struct Out<T> {
    ptr: u64,
    len: usize,
    _t: PhantomData<T>,
}

impl<T> Clone for Out<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for Out<T> {}

impl<T> Out<T> {
    /// Elements `[at, at + len)`, or `None` past the buffer's end.
    pub(super) fn part(&self, at: usize, len: usize) -> Option<Out<T>> {
        let end = at.checked_add(len)?;
        (end <= self.len).then(|| Out { ptr: self.ptr + (at * std::mem::size_of::<T>()) as u64, len, _t: PhantomData })
    }

    fn ptr(&self) -> *mut c_void {
        self.ptr as *mut c_void
    }
}

impl Drop for Group<'_> {
    fn drop(&mut self) {
        // A group left by an error is still closed, so NCCL's group depth stays balanced.
        if !self.ended {
            let _ = result::group_end();
        }
    }
}
