//! The mixture-of-experts GEMMs (`moe::grouped`) on cuBLAS's grouped GEMM: every expert's
//! product of one term in a single `cublasGemmGroupedBatchedEx` call, each expert its own group
//! (its own row count), written in place into the rows and columns it owns. The composed form
//! launched one GEMM per expert and then concatenated, padded and added the parts: at 128
//! experts, hundreds of launches and three passes over the output per projection.
//!
//! Token rows read through the sort (`gathered`) are gathered once into sorted order first:
//! cuBLAS reads each expert's rows as one strided matrix.
//!
//! cuBLAS is column-major: a row-major `[r, c]` matrix is its transpose column-major with
//! leading dimension `c` (as in [`super::gemm`]), so the columns `col..col + out` of a row-major
//! `[rows, width]` output are a column-major `[out, rows]` matrix at `col` with leading
//! dimension `width`. Each expert's result depends only on its own rows: sums are cuBLAS's, in
//! an order fixed by the shapes, so a run gives the same bits every time.

use super::{Elem, device, dtype_of, int, tensor};
use crate::moe::Groups;
use crate::moe::grouped::{GradTerm, Term};
use candle_core::cuda_backend::cudarc::cublas::sys::{self, cublasComputeType_t, cublasOperation_t, cudaDataType_t};
use candle_core::cuda_backend::cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut};
use candle_core::cuda_backend::{CudaDevice, WrapErr};
use candle_core::{DType, Result, Tensor};

/// One GEMM of a grouped call, in cuBLAS's column-major terms: `c (+)= op(a)·op(b)` with `a`,
/// `b`, `c` element offsets into the call's three buffers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Problem {
    m: usize,
    n: usize,
    k: usize,
    a: usize,
    b: usize,
    c: usize,
}

/// The layout shared by every problem of one call (only sizes and offsets differ).
#[derive(Debug, Clone, Copy)]
struct Layout {
    transa: bool,
    transb: bool,
    lda: usize,
    ldb: usize,
    ldc: usize,
    accumulate: bool,
}

/// Each expert's `(first sorted row, rows)`, for the experts that have rows.
fn expert_rows(groups: &Groups) -> Result<Vec<(usize, usize, usize)>> {
    let host = groups.host()?;
    Ok((0..groups.num_experts)
        .map(|e| (e, host.offsets[e], host.offsets[e + 1] - host.offsets[e]))
        .filter(|&(_, _, len)| len > 0)
        .collect())
}

/// `x`'s rows in sorted order: gathered through the sort, or `x` itself.
fn sorted_rows(groups: &Groups, x: &Tensor, gathered: bool) -> Result<Tensor> {
    if gathered { groups.gather(x)?.contiguous() } else { x.contiguous() }
}

/// `[N·k, width]`: see `moe::grouped::forward_sum`. `None` when the tensors are not all f32 or
/// all bf16 on one CUDA device.
pub(crate) fn forward_sum(groups: &Groups, terms: &[Term<'_>], width: usize) -> Result<Option<Tensor>> {
    let all: Vec<&Tensor> = terms.iter().flat_map(|t| [t.x, t.w]).collect();
    match dtype_of(&all) {
        Some(DType::F32) => forward_typed::<f32>(groups, terms, width).map(Some),
        Some(DType::BF16) => forward_typed::<half::bf16>(groups, terms, width).map(Some),
        _ => Ok(None),
    }
}

fn forward_typed<T: Elem>(groups: &Groups, terms: &[Term<'_>], width: usize) -> Result<Tensor> {
    let dev = device(terms[0].x)?;
    // Zeros: the columns no term writes stay zero, and every term adds (β = 1).
    let mut y = dev.alloc_zeros::<T>(groups.len() * width)?;
    let experts = expert_rows(groups)?;
    for t in terms {
        let (out, d_in) = (t.w.dim(1)?, t.w.dim(2)?);
        let x = sorted_rows(groups, t.x, t.gathered)?;
        // y[p, col..col+out]ᵀ [out, len] = W_e [out, in] · x_pᵀ [in, len].
        let problems: Vec<Problem> = experts
            .iter()
            .map(|&(e, p0, len)| Problem {
                m: out,
                n: len,
                k: d_in,
                a: e * out * d_in,
                b: p0 * d_in,
                c: p0 * width + t.col,
            })
            .collect();
        let layout = Layout { transa: true, transb: false, lda: d_in, ldb: d_in, ldc: width, accumulate: true };
        run::<T>(&dev, layout, &problems, t.w, &x, &mut y)?;
    }
    Ok(tensor(y, &dev, (groups.len(), width)))
}

/// `[N·k, in]`: see `moe::grouped::input_grad_sum`. `None` as for [`forward_sum`].
pub(crate) fn input_grad_sum(groups: &Groups, terms: &[GradTerm<'_>]) -> Result<Option<Tensor>> {
    let all: Vec<&Tensor> = terms.iter().flat_map(|t| [t.dy, t.w]).collect();
    match dtype_of(&all) {
        Some(DType::F32) => input_grad_typed::<f32>(groups, terms).map(Some),
        Some(DType::BF16) => input_grad_typed::<half::bf16>(groups, terms).map(Some),
        _ => Ok(None),
    }
}

fn input_grad_typed<T: Elem>(groups: &Groups, terms: &[GradTerm<'_>]) -> Result<Tensor> {
    let dev = device(terms[0].dy)?;
    let d_in = terms[0].w.dim(2)?;
    let mut dx = dev.alloc_zeros::<T>(groups.len() * d_in)?;
    let experts = expert_rows(groups)?;
    for t in terms {
        let out = t.w.dim(1)?;
        let dy = t.dy.contiguous()?;
        let dy_w = dy.dim(1)?;
        // dx_pᵀ [in, len] = W_eᵀ [in, out] · dy[p, col..col+out]ᵀ [out, len].
        let problems: Vec<Problem> = experts
            .iter()
            .map(|&(e, p0, len)| Problem {
                m: d_in,
                n: len,
                k: out,
                a: e * out * d_in,
                b: p0 * dy_w + t.col,
                c: p0 * d_in,
            })
            .collect();
        let layout = Layout { transa: false, transb: false, lda: d_in, ldb: dy_w, ldc: d_in, accumulate: true };
        run::<T>(&dev, layout, &problems, t.w, &dy, &mut dx)?;
    }
    Ok(tensor(dx, &dev, (groups.len(), d_in)))
}

/// `[E, out, in]`: see `moe::grouped::weight_grad` (zeros for an expert without rows). `None`
/// as for [`forward_sum`].
pub(crate) fn weight_grad(
    groups: &Groups,
    dy: &Tensor,
    col: usize,
    out: usize,
    x: &Tensor,
    gathered: bool,
) -> Result<Option<Tensor>> {
    match dtype_of(&[dy, x]) {
        Some(DType::F32) => weight_grad_typed::<f32>(groups, dy, col, out, x, gathered).map(Some),
        Some(DType::BF16) => weight_grad_typed::<half::bf16>(groups, dy, col, out, x, gathered).map(Some),
        _ => Ok(None),
    }
}

fn weight_grad_typed<T: Elem>(
    groups: &Groups,
    dy: &Tensor,
    col: usize,
    out: usize,
    x: &Tensor,
    gathered: bool,
) -> Result<Tensor> {
    let dev = device(dy)?;
    let d_in = x.dim(1)?;
    let e_all = groups.num_experts;
    let mut dw = dev.alloc_zeros::<T>(e_all * out * d_in)?;
    let xs = sorted_rows(groups, x, gathered)?;
    let dy = dy.contiguous()?;
    let dy_w = dy.dim(1)?;
    // dW_eᵀ [in, out] = x_eᵀ [in, len] · dy_e[:, col..col+out] [len, out].
    let problems: Vec<Problem> = expert_rows(groups)?
        .into_iter()
        .map(|(e, p0, len)| Problem { m: d_in, n: out, k: len, a: p0 * d_in, b: p0 * dy_w + col, c: e * out * d_in })
        .collect();
    let layout = Layout { transa: false, transb: true, lda: d_in, ldb: dy_w, ldc: d_in, accumulate: false };
    run::<T>(&dev, layout, &problems, &xs, &dy, &mut dw)?;
    Ok(tensor(dw, &dev, (e_all, out, d_in)))
}

fn data_type<T: Elem>() -> cudaDataType_t {
    if T::SUFFIX == "bf16" { cudaDataType_t::CUDA_R_16BF } else { cudaDataType_t::CUDA_R_32F }
}

/// Device addresses of `base + offsets[i]` elements of `T`.
fn addresses<T>(base: u64, offsets: impl Iterator<Item = usize>) -> Vec<u64> {
    offsets.map(|o| base + (o * std::mem::size_of::<T>()) as u64).collect()
}

/// One `cublasGemmGroupedBatchedEx` over `problems`, each its own group, `a` and `b` read from
/// the contiguous tensors `a` and `b` and `c` written in `c`. f32 compute, no TF32, for both
/// element types (bf16 products accumulate in f32 as the other GEMMs do).
fn run<T: Elem>(
    dev: &CudaDevice,
    l: Layout,
    problems: &[Problem],
    a: &Tensor,
    b: &Tensor,
    c: &mut CudaSlice<T>,
) -> Result<()> {
    if problems.is_empty() {
        return Ok(());
    }
    #[cfg(test)]
    super::LAUNCHES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let stream = dev.cuda_stream();
    let op = |t: bool| if t { cublasOperation_t::CUBLAS_OP_T } else { cublasOperation_t::CUBLAS_OP_N };
    let count = problems.len();
    let ints = |f: &dyn Fn(&Problem) -> usize| problems.iter().map(|p| int(f(p))).collect::<Result<Vec<i32>>>();
    let (ms, ns, ks) = (ints(&|p| p.m)?, ints(&|p| p.n)?, ints(&|p| p.k)?);
    let (lda, ldb, ldc) = (vec![int(l.lda)?; count], vec![int(l.ldb)?; count], vec![int(l.ldc)?; count]);
    let (transa, transb) = (vec![op(l.transa); count], vec![op(l.transb); count]);
    let alpha = vec![1f32; count];
    let beta = vec![if l.accumulate { 1f32 } else { 0f32 }; count];
    let group_size = vec![1i32; count];
    super::with_views::<T, _, 2>([a, b], |[av, bv]| {
        let (a_base, _a_sync) = av.device_ptr(&stream);
        let (b_base, _b_sync) = bv.device_ptr(&stream);
        let (c_base, _c_sync) = c.device_ptr_mut(&stream);
        // The matrices' addresses, which cuBLAS reads on the device.
        let a_ptrs = stream.clone_htod(&addresses::<T>(a_base, problems.iter().map(|p| p.a))[..]).w()?;
        let b_ptrs = stream.clone_htod(&addresses::<T>(b_base, problems.iter().map(|p| p.b))[..]).w()?;
        let c_ptrs = stream.clone_htod(&addresses::<T>(c_base, problems.iter().map(|p| p.c))[..]).w()?;
        let (ap, _s1) = a_ptrs.device_ptr(&stream);
        let (bp, _s2) = b_ptrs.device_ptr(&stream);
        let (cp, _s3) = c_ptrs.device_ptr(&stream);
        let blas = dev.cublas_handle();
        let dt = data_type::<T>();
        // SAFETY: every problem's matrices lie inside the buffers they point into (the callers
        // derive the offsets and leading dimensions from the tensors' shapes, checked by
        // `moe::grouped`); the per-group arrays hold `count` entries; the address arrays live on
        // the device on this stream until the call's work is queued after their copies.
        unsafe {
            sys::cublasGemmGroupedBatchedEx(
                *blas.handle(),
                transa.as_ptr(),
                transb.as_ptr(),
                ms.as_ptr(),
                ns.as_ptr(),
                ks.as_ptr(),
                alpha.as_ptr().cast(),
                ap as *const *const std::ffi::c_void,
                dt,
                lda.as_ptr(),
                bp as *const *const std::ffi::c_void,
                dt,
                ldb.as_ptr(),
                beta.as_ptr().cast(),
                cp as *const *mut std::ffi::c_void,
                dt,
                ldc.as_ptr(),
                int(count)?,
                group_size.as_ptr(),
                cublasComputeType_t::CUBLAS_COMPUTE_32F,
            )
            .result()
            .w()?;
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_step_by_the_element_size() {
        assert_eq!(addresses::<half::bf16>(1000, [0, 3, 10].into_iter()), vec![1000, 1006, 1020]);
        assert_eq!(addresses::<f32>(64, [1].into_iter()), vec![68]);
    }
}
