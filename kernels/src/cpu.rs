//! Fused CPU kernels: each op in one pass over contiguous slices, parallel over independent
//! rows with rayon, in f32 (training) and f64 (gradient checks).
//!
//! Why: composed from candle ops, a step at the demo's shapes spends most of its time in
//! allocation, broadcast passes and scalar `expf`, not in arithmetic. Each op module calls
//! its kernel here for CPU tensors of these dtypes and its composed `reference` otherwise;
//! tests hold the two together, and the gradient checks run through the kernels.
//!
//! Determinism: work is split at fixed boundaries (rows, heads, fixed-size row blocks for
//! reductions) and every partial is combined in a fixed order, so results do not depend on
//! the thread count.

pub(crate) mod attention;
pub(crate) mod conv1d;
pub(crate) mod cross_entropy;
pub(crate) mod delta_rule;
pub(crate) mod elementwise;
pub(crate) mod linear;
pub(crate) mod paged;
pub(crate) mod rmsnorm;

use candle_core::{DType, Device, Result, Shape, Storage, Tensor, WithDType};
use std::ops::{Add, AddAssign, Div, Mul, MulAssign, Neg, Sub, SubAssign};

/// The float types the kernels are written for.
pub(crate) trait Real:
    WithDType
    + Copy
    + Send
    + Sync
    + PartialOrd
    + Add<Output = Self>
    + Sub<Output = Self>
    + Mul<Output = Self>
    + Div<Output = Self>
    + Neg<Output = Self>
    + AddAssign
    + SubAssign
    + MulAssign
{
    const ZERO: Self;
    const ONE: Self;
    const NEG_INFINITY: Self;
    fn of(v: f64) -> Self;
    fn ln(self) -> Self;
    fn sqrt(self) -> Self;
    /// `e^x` for every element, in place. f32 uses a vectorisable polynomial (below).
    fn exp_in_place(xs: &mut [Self]);
}

/// The parts of [`Real`] that are the same for both types; `$exp` maps one element.
macro_rules! real {
    ($t:ty, $exp:expr) => {
        impl Real for $t {
            const ZERO: $t = 0.0;
            const ONE: $t = 1.0;
            const NEG_INFINITY: $t = <$t>::NEG_INFINITY;
            fn of(v: f64) -> $t {
                v as $t
            }
            fn ln(self) -> $t {
                <$t>::ln(self)
            }
            fn sqrt(self) -> $t {
                <$t>::sqrt(self)
            }
            #[inline(always)]
            fn exp_in_place(xs: &mut [$t]) {
                for x in xs {
                    *x = $exp(*x);
                }
            }
        }
    };
}
real!(f32, exp_f32);
real!(f64, f64::exp);

/// `e^x` in f32 within 2 ulp on the range that matters, written so LLVM vectorises a loop
/// of it (no calls, no branches, integer ops for the 2ⁿ scale). libm's `expf` is scalar
/// and was 15% of a training step.
#[inline(always)]
pub(crate) fn exp_f32(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    // ln 2 split so that n·LN2_HI is exact for the n that occur (Cody–Waite).
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    // Adding 1.5·2²³ rounds to an integer and leaves it in the low mantissa bits.
    const ROUND: f32 = 12_582_912.0;
    let xc = x.clamp(-87.0, 88.0);
    let shifted = xc * LOG2E + ROUND;
    let n = shifted - ROUND;
    let r = xc - n * LN2_HI - n * LN2_LO;
    // Minimax polynomial for e^r on |r| ≤ ln2/2 (Cephes expf coefficients).
    let p = 1.987_569_1e-4_f32;
    let p = p * r + 1.398_199_9e-3;
    let p = p * r + 8.333_452e-3;
    let p = p * r + 4.166_579_6e-2;
    let p = p * r + 1.666_666_5e-1;
    let p = p * r + 0.5;
    let er = p * r * r + r + 1.0;
    let k = (shifted.to_bits() as i32).wrapping_sub(ROUND.to_bits() as i32);
    let scale = f32::from_bits(((k + 127) << 23) as u32);
    let y = er * scale;
    // Below the clamp the true value is under 2⁻¹²⁵: flush to 0 (−∞ → 0, as expf).
    if x < -87.0 { 0.0 } else { y }
}

/// A matrix operand: elements `(r, c)` at `data[r·rs + c·cs]` (strides let one buffer be
/// read transposed without a copy).
#[derive(Clone, Copy)]
pub(crate) struct MatRef<'a, T> {
    pub data: &'a [T],
    pub rs: usize,
    pub cs: usize,
}

impl<'a, T> MatRef<'a, T> {
    /// Row-major with `cols` columns.
    pub fn rows(data: &'a [T], cols: usize) -> Self {
        MatRef { data, rs: cols, cs: 1 }
    }
    /// The transpose of a row-major matrix with `cols` columns.
    pub fn transposed(data: &'a [T], cols: usize) -> Self {
        MatRef { data, rs: 1, cs: cols }
    }
    fn fits(&self, rows: usize, cols: usize) -> bool {
        rows == 0 || cols == 0 || (rows - 1) * self.rs + (cols - 1) * self.cs < self.data.len()
    }
}

/// `dst (m×n, row-major) = scale·a·b` (`a` m×k, `b` k×n), or `+=` with `accumulate`, on
/// this thread (the kernels parallelise over their own tasks). Sizes are checked, so the
/// unsafe call below never reads or writes outside the slices.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub(crate) fn matmul<T: Real>(
    dst: &mut [T],
    m: usize,
    n: usize,
    k: usize,
    a: MatRef<T>,
    b: MatRef<T>,
    scale: T,
    accumulate: bool,
) {
    matmul_ld(dst, n, m, n, k, a, b, scale, accumulate)
}

/// [`matmul`] into a destination of row stride `ld ≥ n` (a block of a wider matrix).
#[allow(clippy::too_many_arguments)]
pub(crate) fn matmul_ld<T: Real>(
    dst: &mut [T],
    ld: usize,
    m: usize,
    n: usize,
    k: usize,
    a: MatRef<T>,
    b: MatRef<T>,
    scale: T,
    accumulate: bool,
) {
    let dst_fits = m == 0 || n == 0 || (ld >= n && (m - 1) * ld + n <= dst.len());
    assert!(dst_fits && a.fits(m, k) && b.fits(k, n), "matmul operands smaller than {m}×{k}·{k}×{n}");
    // SAFETY: every index the call touches is inside the slices (asserted above); dst does
    // not alias a or b (a unique borrow against shared ones).
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst.as_mut_ptr(),
            1,
            ld as isize,
            accumulate,
            a.data.as_ptr(),
            a.cs as isize,
            a.rs as isize,
            b.data.as_ptr(),
            b.cs as isize,
            b.rs as isize,
            T::ONE,
            scale,
            false,
            false,
            false,
            gemm::Parallelism::None,
        )
    }
}

/// Runs `f` inside a function compiled for AVX2 when the CPU has it, so the loops inlined
/// into it run 8 lanes wide instead of the x86-64 baseline's 4. The bits do not change:
/// Rust never contracts `a·b + c` into an FMA, and every sum has a fixed lane order.
#[inline(always)]
pub(crate) fn wide<R>(f: impl FnOnce() -> R) -> R {
    #[cfg(target_arch = "x86_64")]
    {
        #[target_feature(enable = "avx2")]
        fn avx2<R>(f: impl FnOnce() -> R) -> R {
            f()
        }
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU has AVX2, checked just above.
            return unsafe { avx2(f) };
        }
    }
    f()
}

/// Lanes of the independent partial sums in [`dot`]: a serial float sum cannot be
/// vectorised (its order is fixed), eight fixed interleaved ones can, and still give the
/// same result on every run.
const LANES: usize = 8;

/// `Σ a_i·b_i` in a fixed order of eight interleaved partial sums.
#[inline]
pub(crate) fn dot<T: Real>(a: &[T], b: &[T]) -> T {
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let mut acc = [T::ZERO; LANES];
    let (ac, bc) = (a.chunks_exact(LANES), b.chunks_exact(LANES));
    let (ar, br) = (ac.remainder(), bc.remainder());
    for (x, y) in ac.zip(bc) {
        for l in 0..LANES {
            acc[l] += x[l] * y[l];
        }
    }
    let mut total = acc.iter().fold(T::ZERO, |s, &x| s + x);
    for (&x, &y) in ar.iter().zip(br) {
        total += x * y;
    }
    total
}

/// `Σ x_i` in the same fixed lane order as [`dot`].
#[inline]
pub(crate) fn sum<T: Real>(xs: &[T]) -> T {
    let mut acc = [T::ZERO; LANES];
    let chunks = xs.chunks_exact(LANES);
    let rest = chunks.remainder();
    for x in chunks {
        for l in 0..LANES {
            acc[l] += x[l];
        }
    }
    rest.iter().fold(acc.iter().fold(T::ZERO, |s, &x| s + x), |s, &x| s + x)
}

/// The largest element (−∞ for none).
pub(crate) fn max<T: Real>(xs: &[T]) -> T {
    xs.iter().fold(T::NEG_INFINITY, |m, &x| if x > m { x } else { m })
}

/// Whether the fused CPU kernels serve these tensors, and in which dtype.
pub(crate) fn dtype_of(ts: &[&Tensor]) -> Option<DType> {
    let first = ts.first()?;
    let dt = first.dtype();
    let ok = matches!(dt, DType::F32 | DType::F64) && ts.iter().all(|t| t.device().is_cpu() && t.dtype() == dt);
    ok.then_some(dt)
}

/// Calls `$f::<f32>` or `$f::<f64>` when the fused kernels serve `$ts`, `$fallback` otherwise.
macro_rules! dispatch {
    ([$($t:expr),+], $f:ident($($arg:expr),*), $fallback:expr) => {
        match $crate::cpu::dtype_of(&[$($t),+]) {
            Some(candle_core::DType::F32) => $f::<f32>($($arg),*),
            Some(candle_core::DType::F64) => $f::<f64>($($arg),*),
            _ => $fallback,
        }
    };
}
pub(crate) use dispatch;

/// A contiguous CPU tensor's elements, borrowed for as long as the view lives.
pub(crate) struct View<'a> {
    storage: candle_core::StorageRef<'a>,
    start: usize,
    end: usize,
}

impl<'a> View<'a> {
    /// `t` must be contiguous (callers pass `t.contiguous()?`); the check is kept because
    /// a wrong offset would read other data silently.
    pub fn of(t: &'a Tensor) -> Result<View<'a>> {
        let (storage, layout) = t.storage_and_layout();
        let Some((start, end)) = layout.contiguous_offsets() else {
            candle_core::bail!("fused cpu kernel: tensor of shape {:?} is not contiguous", t.dims())
        };
        Ok(View { storage, start, end })
    }

    pub fn slice<T: WithDType>(&self) -> Result<&[T]> {
        match &*self.storage {
            Storage::Cpu(c) => Ok(&c.as_slice::<T>()?[self.start..self.end]),
            _ => candle_core::bail!("fused cpu kernel: tensor is not on the CPU"),
        }
    }
}

/// Runs `f` on the slices of `ts` (made contiguous first).
pub(crate) fn with_slices<T: Real, R, const N: usize>(
    ts: [&Tensor; N],
    f: impl FnOnce([&[T]; N]) -> Result<R>,
) -> Result<R> {
    let owned: Vec<Tensor> = ts.iter().map(|t| t.contiguous()).collect::<Result<_>>()?;
    let views: Vec<View> = owned.iter().map(View::of).collect::<Result<_>>()?;
    let slices: Vec<&[T]> = views.iter().map(View::slice::<T>).collect::<Result<_>>()?;
    let slices: [&[T]; N] = slices.try_into().map_err(|_| candle_core::Error::Msg("slice count".into()))?;
    f(slices)
}

/// A CPU tensor from a kernel's output buffer (moved, not copied).
pub(crate) fn tensor<T: Real>(data: Vec<T>, shape: impl Into<Shape>) -> Result<Tensor> {
    Tensor::from_vec(data, shape.into(), &Device::Cpu)
}

/// Rows per block of a cross-row reduction (norm gains): fixed, so that the order of the
/// partial sums never depends on the thread count.
pub(crate) const REDUCE_ROWS: usize = 64;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fast_exp_is_within_two_ulp_of_libm_and_handles_the_edges() {
        let mut worst = 0f64;
        let mut x = -87.0f32;
        while x < 88.0 {
            let (got, want) = (exp_f32(x) as f64, (x as f64).exp());
            worst = worst.max(((got - want) / want).abs());
            x += 0.001_7;
        }
        assert!(worst < 2.5e-7, "worst relative error {worst}");
        assert_eq!(exp_f32(0.0), 1.0);
        assert_eq!(exp_f32(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp_f32(-100.0), 0.0);
        assert!(exp_f32(88.0).is_finite());
        let mut v = vec![1.0f32, -1.0, 2.5];
        f32::exp_in_place(&mut v);
        assert!((v[0] - std::f32::consts::E).abs() < 1e-6 && (v[2] - 2.5f32.exp()).abs() < 1e-5);
    }
}
