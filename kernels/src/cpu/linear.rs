//! `y = x·Wᵀ` and its gradients as single-threaded GEMM calls on fixed blocks, in parallel
//! (rows per block: the [`crate::KernelConfig`]'s `gemm_rows`, the plan's choice).
//!
//! At the CPU recipes' shapes (1024 × 64 by 64 × 16 and the like) candle's matmul spends
//! more on threading one small GEMM than on the arithmetic; fixed blocks of rows (or of
//! `dW` rows) as independent tasks scale instead, and keep every sum in one order.

use super::{MatRef, Real, matmul, tensor, with_slices};
use candle_core::{Result, Tensor};
use rayon::prelude::*;

/// Rows of `dW` per task.
const OUT_ROWS: usize = 32;

/// `x` `[n, in]`, `w` `[out, in]` → `[n, out]`.
pub(crate) fn forward<T: Real>(x: &Tensor, w: &Tensor, rows: usize) -> Result<Tensor> {
    let d_in = x.dim(1)?;
    rows_times::<T>(x, w, w.dim(0)?, rows, |w| MatRef::transposed(w, d_in))
}

/// `dx = dy·W`: `dy` `[n, out]`, `w` `[out, in]` → `[n, in]`.
pub(crate) fn input_grad<T: Real>(dy: &Tensor, w: &Tensor, rows: usize) -> Result<Tensor> {
    let d_in = w.dim(1)?;
    rows_times::<T>(dy, w, d_in, rows, |w| MatRef::rows(w, d_in))
}

/// `a` `[n, k]` times the `[k, cols]` operand that `view` makes of `w`, in blocks of `rows` rows.
fn rows_times<T: Real>(
    a: &Tensor,
    w: &Tensor,
    cols: usize,
    rows: usize,
    view: impl Fn(&[T]) -> MatRef<T> + Sync,
) -> Result<Tensor> {
    let (n, k) = a.dims2()?;
    let (mut y, rows) = (vec![T::ZERO; n * cols], rows.max(1));
    with_slices::<T, _, 2>([a, w], |[a, w]| {
        y.par_chunks_mut(rows * cols).zip(a.par_chunks(rows * k)).for_each(|(y, a)| {
            let m = y.len() / cols;
            matmul(y, m, cols, k, MatRef::rows(a, k), view(w), T::ONE, false);
        });
        Ok(())
    })?;
    tensor(y, (n, cols))
}

/// `dW = dyᵀ·x`: `dy` `[n, out]`, `x` `[n, in]` → `[out, in]`, split over rows of `dW` so
/// each sum over the `n` tokens stays in one task.
pub(crate) fn weight_grad<T: Real>(dy: &Tensor, x: &Tensor) -> Result<Tensor> {
    let (n, d_out) = dy.dims2()?;
    let d_in = x.dim(1)?;
    let mut dw = vec![T::ZERO; d_out * d_in];
    with_slices::<T, _, 2>([dy, x], |[dy, x]| {
        dw.par_chunks_mut(OUT_ROWS * d_in).enumerate().for_each(|(blk, dw)| {
            let (o0, rows) = (blk * OUT_ROWS, dw.len() / d_in);
            // Columns o0.. of dy read as the rows of dyᵀ.
            let dy_t = MatRef { data: &dy[o0..], rs: 1, cs: d_out };
            matmul(dw, rows, d_in, n, dy_t, MatRef::rows(x, d_in), T::ONE, false);
        });
        Ok(())
    })?;
    tensor(dw, (d_out, d_in))
}
