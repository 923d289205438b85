//! cuBLASLt: the heuristic's candidate algorithms for a GEMM shape, timing them against cuBLAS's
//! default (the probe), and running a GEMM with a chosen one (the run).
//!
//! Descriptors and layouts are built once per shape and kept: a shape's GEMM runs thousands of
//! times per run. One handle and one workspace serve the process's device.

use super::{Elem, gemm};
use crate::gemm_algos::{GemmAlgo, GemmShape, LT_ALGO_BYTES};
use candle_core::cuda_backend::cudarc::cublas::{CudaBlas, Gemm, sys::cublasOperation_t as Op_};
use candle_core::cuda_backend::cudarc::cublaslt::{result, sys};
use candle_core::cuda_backend::cudarc::driver::{CudaSlice, CudaView, DevicePtr, DevicePtrMut};
use candle_core::cuda_backend::{CudaDevice, WrapErr};
use candle_core::{Device, Result};
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// Workspace the algorithms may use: NVIDIA's recommendation for Hopper.
const WORKSPACE_BYTES: usize = 32 << 20;
/// Every operand is at least 16-byte aligned (allocations are 256, views start on whole rows of
/// 8 bf16); asking the heuristic for that keeps it from returning algorithms that need more.
const MIN_ALIGNMENT: u32 = 16;

struct Handle {
    device: candle_core::cuda_backend::DeviceId,
    handle: sys::cublasLtHandle_t,
    workspace: CudaSlice<u8>,
    ops: HashMap<GemmShape, Arc<Op>>,
}
// SAFETY: the handle is only used under the HANDLE mutex or through an Arc<Op> whose
// descriptors are immutable after creation (cuBLASLt allows sharing them between threads).
unsafe impl Send for Handle {}

static HANDLE: Mutex<Option<Handle>> = Mutex::new(None);

/// A shape's matmul descriptor and matrix layouts.
struct Op {
    desc: sys::cublasLtMatmulDesc_t,
    layouts: [sys::cublasLtMatrixLayout_t; 3],
}
// SAFETY: see Handle.
unsafe impl Send for Op {}
unsafe impl Sync for Op {}

impl Drop for Op {
    fn drop(&mut self) {
        // SAFETY: created by `Op::new`, destroyed once here. Errors on teardown are not actionable.
        unsafe {
            let _ = result::destroy_matmul_desc(self.desc);
            for l in self.layouts {
                let _ = result::destroy_matrix_layout(l);
            }
        }
    }
}

fn lt_err(e: result::CublasError) -> candle_core::Error {
    candle_core::Error::Msg(format!("cublasLt: {e:?}"))
}

impl Op {
    fn new(s: &GemmShape) -> Result<Op> {
        let dt = if s.bf16 { sys::cudaDataType_t::CUDA_R_16BF } else { sys::cudaDataType_t::CUDA_R_32F };
        let compute = sys::cublasComputeType_t::CUBLAS_COMPUTE_32F;
        let desc = result::create_matmul_desc(compute, sys::cudaDataType_t::CUDA_R_32F).map_err(lt_err)?;
        let op = |t: bool| if t { Op_::CUBLAS_OP_T } else { Op_::CUBLAS_OP_N };
        let (m, n, k) = (s.m as u64, s.n as u64, s.k as u64);
        let (a_rows, a_cols) = if s.transa { (k, m) } else { (m, k) };
        let (b_rows, b_cols) = if s.transb { (n, k) } else { (k, n) };
        let layout = |r: u64, c: u64| result::create_matrix_layout(dt, r, c, r as i64).map_err(lt_err);
        let made =
            (|| Ok::<_, candle_core::Error>([layout(a_rows, a_cols)?, layout(b_rows, b_cols)?, layout(m, n)?]))();
        let op_ = Op {
            desc,
            layouts: match made {
                Ok(l) => l,
                Err(e) => {
                    // SAFETY: created above, not shared.
                    unsafe {
                        let _ = result::destroy_matmul_desc(desc);
                    }
                    return Err(e);
                }
            },
        };
        for (attr, t) in [
            (sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSA, s.transa),
            (sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSB, s.transb),
        ] {
            let v = op(t);
            // SAFETY: the attribute takes a cublasOperation_t by pointer.
            unsafe {
                result::set_matmul_desc_attribute(op_.desc, attr, (&v as *const _) as *const c_void, size_of_val(&v))
            }
            .map_err(lt_err)?;
        }
        Ok(op_)
    }
}

/// Runs `f` with the process's handle for `dev` (created on first use) and `shape`'s descriptors.
fn with_op<R>(dev: &CudaDevice, shape: &GemmShape, f: impl FnOnce(&Handle, &Op) -> Result<R>) -> Result<R> {
    let mut guard = HANDLE.lock().unwrap_or_else(|e| e.into_inner());
    if guard.as_ref().is_none_or(|h| h.device != dev.id()) {
        let stream = dev.cuda_stream();
        stream.context().bind_to_thread().w()?;
        let handle = result::create_handle().map_err(lt_err)?;
        // SAFETY: only cuBLASLt writes the workspace.
        let workspace = unsafe { stream.alloc::<u8>(WORKSPACE_BYTES) }.w()?;
        *guard = Some(Handle { device: dev.id(), handle, workspace, ops: HashMap::new() });
    }
    let h = guard.as_mut().expect("set above");
    let op = match h.ops.get(shape) {
        Some(op) => op.clone(),
        None => {
            let op = Arc::new(Op::new(shape)?);
            h.ops.insert(*shape, op.clone());
            op
        }
    };
    f(h, &op)
}

/// Up to `count` algorithms cuBLASLt's heuristic proposes for `shape`, best first.
fn heuristics(dev: &CudaDevice, shape: &GemmShape, count: usize) -> Result<Vec<sys::cublasLtMatmulAlgo_t>> {
    with_op(dev, shape, |h, op| {
        let pref = result::create_matmul_pref().map_err(lt_err)?;
        let ws = WORKSPACE_BYTES as u64;
        let set = |attr, v: *const c_void, n: usize| {
            // SAFETY: pref is live; each attribute is passed with its own size.
            unsafe { result::set_matmul_pref_attribute(pref, attr, v, n) }.map_err(lt_err)
        };
        use sys::cublasLtMatmulPreferenceAttributes_t as P;
        let found = (|| {
            set(P::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, (&ws as *const u64).cast(), 8)?;
            for attr in [
                P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
            ] {
                set(attr, (&MIN_ALIGNMENT as *const u32).cast(), 4)?;
            }
            // SAFETY: a zeroed heuristic result is a valid out-parameter; cuBLASLt fills `found` of them.
            let mut results: Vec<sys::cublasLtMatmulHeuristicResult_t> = vec![unsafe { std::mem::zeroed() }; count];
            let mut found = 0i32;
            let [a, b, c] = op.layouts;
            // SAFETY: every descriptor is live; `results` holds `count` entries.
            unsafe {
                sys::cublasLtMatmulAlgoGetHeuristic(
                    h.handle,
                    op.desc,
                    a,
                    b,
                    c,
                    c,
                    pref,
                    count as i32,
                    results.as_mut_ptr(),
                    &mut found,
                )
            }
            .result()
            .map_err(lt_err)?;
            Ok(results
                .into_iter()
                .take(found.max(0) as usize)
                .filter(|r| r.state == sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS)
                .map(|r| r.algo)
                .collect())
        })();
        // SAFETY: created above, used only here.
        unsafe {
            let _ = result::destroy_matmul_pref(pref);
        }
        found
    })
}

fn algo_from(bytes: &[u8; LT_ALGO_BYTES]) -> sys::cublasLtMatmulAlgo_t {
    let mut data = [0u64; 8];
    for (d, chunk) in data.iter_mut().zip(bytes.chunks_exact(8)) {
        *d = u64::from_le_bytes(chunk.try_into().expect("8 bytes"));
    }
    sys::cublasLtMatmulAlgo_t { data }
}

fn algo_hex(algo: &sys::cublasLtMatmulAlgo_t) -> String {
    algo.data.iter().flat_map(|d| d.to_le_bytes()).map(|b| format!("{b:02x}")).collect()
}

/// `c = a·b` (β = 0) or `c += a·b` (β = 1) with cuBLASLt algorithm `algo`, in `shape`'s terms.
/// Returns false, having run nothing, when an operand is less aligned than the algorithms were
/// chosen for (the caller then runs the default).
pub(crate) fn matmul<T: Elem>(
    dev: &CudaDevice,
    shape: &GemmShape,
    algo: &[u8; LT_ALGO_BYTES],
    a: &CudaView<'_, T>,
    b: &CudaView<'_, T>,
    c: &mut CudaSlice<T>,
    accumulate: bool,
) -> Result<bool> {
    let algo = algo_from(algo);
    let (alpha, beta) = (1f32, if accumulate { 1f32 } else { 0f32 });
    with_op(dev, shape, |h, op| {
        let stream = dev.cuda_stream();
        let (pa, _ra) = a.device_ptr(&stream);
        let (pb, _rb) = b.device_ptr(&stream);
        let (pc, _rc) = c.device_ptr_mut(&stream);
        let (pw, _rw) = h.workspace.device_ptr(&stream);
        if [pa, pb, pc].iter().any(|p| p % u64::from(MIN_ALIGNMENT) != 0) {
            return Ok(false);
        }
        let [la, lb, lc] = op.layouts;
        // SAFETY: the views and c hold the shape's element counts (the caller checked the
        // shapes), the descriptors match the shape, and the workspace outlives the stream's use.
        unsafe {
            result::matmul(
                h.handle,
                op.desc,
                (&alpha as *const f32).cast(),
                (&beta as *const f32).cast(),
                pa as *const c_void,
                la,
                pb as *const c_void,
                lb,
                pc as *const c_void,
                lc,
                pc as *mut c_void,
                lc,
                &algo,
                pw as *mut c_void,
                WORKSPACE_BYTES,
                stream.cu_stream() as *mut _,
            )
        }
        .map_err(lt_err)?;
        Ok(true)
    })
}

/// One candidate's measured time.
#[derive(Debug, Clone, PartialEq)]
pub struct GemmTiming {
    pub algo: GemmAlgo,
    /// Mean microseconds per GEMM; `None` when it failed (with the error).
    pub us: Option<f64>,
    pub error: Option<String>,
}

/// Times cuBLAS's default and up to `lt_candidates` cuBLASLt heuristic algorithms for `shape`
/// on random operands: one warm-up call, then back-to-back calls for about `per_candidate_ms`.
pub fn time_candidates(
    device: &Device,
    shape: &GemmShape,
    lt_candidates: usize,
    per_candidate_ms: f64,
) -> Result<Vec<GemmTiming>> {
    let Device::Cuda(dev) = device else { candle_core::bail!("gemm timing needs a CUDA device") };
    if shape.bf16 {
        time_typed::<half::bf16>(dev, device, shape, lt_candidates, per_candidate_ms)
    } else {
        time_typed::<f32>(dev, device, shape, lt_candidates, per_candidate_ms)
    }
}

fn time_typed<T: Elem>(
    dev: &CudaDevice,
    device: &Device,
    s: &GemmShape,
    lt_candidates: usize,
    per_candidate_ms: f64,
) -> Result<Vec<GemmTiming>>
where
    CudaBlas: Gemm<T>,
{
    let dtype = if s.bf16 { candle_core::DType::BF16 } else { candle_core::DType::F32 };
    let operand = |n: usize| candle_core::Tensor::randn(0f32, 1.0, n, device)?.to_dtype(dtype);
    let (a, b) = (operand(s.m * s.k)?, operand(s.k * s.n)?);
    let mut c = super::alloc::<T>(dev, s.m * s.n)?;
    let mut algos = vec![GemmAlgo::Default];
    for (index, algo) in heuristics(dev, s, lt_candidates)?.iter().enumerate() {
        algos.push(GemmAlgo::Lt { index, algo: algo_hex(algo) });
    }
    let stream = dev.cuda_stream();
    super::with_views::<T, _, 2>([&a, &b], |[av, bv]| {
        let mut out = Vec::with_capacity(algos.len());
        for algo in algos {
            let mut call = || gemm::run(dev, s, &algo, &av, &bv, &mut c, false);
            let timed = (|| {
                call()?;
                stream.synchronize().w()?;
                let t = Instant::now();
                let mut calls = 0u32;
                while calls < 3 || (t.elapsed().as_secs_f64() * 1e3 < per_candidate_ms && calls < 1000) {
                    call()?;
                    calls += 1;
                    if calls.is_power_of_two() {
                        stream.synchronize().w()?;
                    }
                }
                stream.synchronize().w()?;
                Ok::<_, candle_core::Error>(t.elapsed().as_secs_f64() * 1e6 / f64::from(calls))
            })();
            out.push(match timed {
                Ok(us) => GemmTiming { algo, us: Some(us), error: None },
                Err(e) => GemmTiming { algo, us: None, error: Some(e.to_string()) },
            });
        }
        Ok(out)
    })
}
