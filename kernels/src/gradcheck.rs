//! Central finite differences in f64: the referee for every backward.
//!
//! A backward is checked through the scalar `L = Σ f(inputs) ⊙ dy` for a fixed random `dy`:
//! its analytic gradient with respect to each input is exactly what the backward returns
//! when fed `dy`, and its numerical gradient needs only the forward.

use candle_core::{DType, Device, Result, Tensor};

/// How close analytic and numerical gradients must be: `|a − n| ≤ atol + rtol·|n|`.
#[derive(Debug, Clone, Copy)]
pub struct Tolerance {
    /// Half-width of the central difference.
    pub eps: f64,
    pub atol: f64,
    pub rtol: f64,
}

impl Default for Tolerance {
    fn default() -> Self {
        Tolerance { eps: 1e-6, atol: 1e-7, rtol: 1e-5 }
    }
}

/// Checks every element of every input of `f` (tiny shapes only: two forwards per element).
/// `analytic[i]` is the backward's gradient for `inputs[i]`; a missing gradient must be
/// passed as zeros and is then caught wherever the true gradient is not zero.
pub fn check<F>(f: F, inputs: &[Tensor], dy: &Tensor, analytic: &[Tensor]) -> Result<()>
where
    F: Fn(&[Tensor]) -> Result<Tensor>,
{
    let dy = dy.to_dtype(DType::F64)?;
    let scalar = |t: &[Tensor]| -> Result<f64> { f(t)?.to_dtype(DType::F64)?.mul(&dy)?.sum_all()?.to_scalar::<f64>() };
    let mut probes = Vec::new();
    for (i, x) in inputs.iter().enumerate() {
        probes.extend((0..x.elem_count()).map(|j| (i, j)));
    }
    check_scalar_at(scalar, inputs, analytic, &probes, Tolerance::default())
}

/// Checks the gradient of a scalar function at the given `(input, flat element)` probes.
pub fn check_scalar_at<F>(
    f: F,
    inputs: &[Tensor],
    analytic: &[Tensor],
    probes: &[(usize, usize)],
    tol: Tolerance,
) -> Result<()>
where
    F: Fn(&[Tensor]) -> Result<f64>,
{
    if analytic.len() != inputs.len() {
        candle_core::bail!("gradcheck: {} gradients for {} inputs", analytic.len(), inputs.len());
    }
    let mut flat = Vec::with_capacity(inputs.len());
    for (x, g) in inputs.iter().zip(analytic) {
        if x.dims() != g.dims() {
            candle_core::bail!("gradcheck: gradient shape {:?} differs from input shape {:?}", g.dims(), x.dims());
        }
        flat.push(g.to_dtype(DType::F64)?.flatten_all()?.to_vec1::<f64>()?);
    }
    let mut failures = Vec::new();
    for &(i, j) in probes {
        let numerical = numerical_grad(&f, inputs, i, j, tol.eps)?;
        let a = flat[i][j];
        // Written so that a NaN on either side fails.
        let close = (a - numerical).abs() <= tol.atol + tol.rtol * numerical.abs();
        if !close {
            failures.push(format!("input {i} element {j}: analytic {a:e}, numerical {numerical:e}"));
        }
    }
    if failures.is_empty() {
        Ok(())
    } else {
        let shown = failures.iter().take(8).cloned().collect::<Vec<_>>().join("; ");
        candle_core::bail!("gradcheck: {} of {} probes disagree: {shown}", failures.len(), probes.len())
    }
}

/// `(f(x + eps·e_j) − f(x − eps·e_j)) / 2eps` for element `j` of input `i` (inputs in f64).
pub fn numerical_grad<F>(f: &F, inputs: &[Tensor], i: usize, j: usize, eps: f64) -> Result<f64>
where
    F: Fn(&[Tensor]) -> Result<f64>,
{
    let x = &inputs[i];
    let base = x.to_dtype(DType::F64)?.flatten_all()?.to_vec1::<f64>()?;
    let at = |delta: f64| -> Result<f64> {
        let mut v = base.clone();
        v[j] += delta;
        let mut moved = inputs.to_vec();
        moved[i] = Tensor::from_vec(v, x.shape(), x.device())?.to_dtype(x.dtype())?;
        f(&moved)
    };
    Ok((at(eps)? - at(-eps)?) / (2.0 * eps))
}

/// Asserts `|a − b| ≤ tol·(1 + |b|)` elementwise (after casting both to f64), naming the
/// first element that is off; NaN never passes. For comparing a kernel with its reference.
pub fn assert_close(a: &Tensor, b: &Tensor, tol: f64) -> Result<()> {
    if a.dims() != b.dims() {
        candle_core::bail!("shapes differ: {:?} vs {:?}", a.dims(), b.dims());
    }
    let flat = |t: &Tensor| t.to_dtype(DType::F64)?.flatten_all()?.to_vec1::<f64>();
    for (i, (x, y)) in flat(a)?.into_iter().zip(flat(b)?).enumerate() {
        let within = (x - y).abs() <= tol * (1.0 + y.abs());
        if !within {
            candle_core::bail!("element {i} of {:?}: {x} vs reference {y} (tolerance {tol})", a.dims());
        }
    }
    Ok(())
}

/// A new seed on every call (the clock, the process id and a call count): tests that draw their
/// inputs from it check a kernel on fresh values each run, and name the seed when they fail.
pub fn fresh_seed() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static CALLS: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
    let call = CALLS.fetch_add(1, Ordering::Relaxed);
    nanos ^ (u64::from(std::process::id()) << 32) ^ call.wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

/// A deterministic f64 tensor with entries uniform in `[-1, 1)` (SplitMix64 of `seed`).
pub fn random(shape: &[usize], seed: u64, device: &Device) -> Result<Tensor> {
    let n: usize = shape.iter().product();
    let mut state = seed;
    let v: Vec<f64> = (0..n).map(|_| 2.0 * unit(&mut state) - 1.0).collect();
    Tensor::from_vec(v, shape, device)
}

fn unit(state: &mut u64) -> f64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    (z >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::linear;

    fn setup() -> Result<(Tensor, Tensor, Tensor)> {
        let dev = Device::Cpu;
        Ok((random(&[3, 4], 1, &dev)?, random(&[2, 4], 2, &dev)?, random(&[3, 2], 3, &dev)?))
    }

    #[test]
    fn a_slightly_wrong_gradient_is_caught() -> Result<()> {
        let (x, w, dy) = setup()?;
        let (dx, dw) = linear::backward(&Default::default(), &dy, &x, &w, true)?;
        let wrong = dx.affine(1.001, 0.0)?;
        let f = |t: &[Tensor]| linear::forward(&Default::default(), &t[0], &t[1]);
        assert!(check(f, &[x.clone(), w.clone()], &dy, &[wrong, dw.clone().unwrap()]).is_err());
        check(f, &[x, w], &dy, &[dx, dw.unwrap()])
    }

    #[test]
    fn a_missing_gradient_is_caught() -> Result<()> {
        let (x, w, dy) = setup()?;
        let (dx, _) = linear::backward(&Default::default(), &dy, &x, &w, false)?;
        let f = |t: &[Tensor]| linear::forward(&Default::default(), &t[0], &t[1]);
        let err = check(f, &[x, w.clone()], &dy, &[dx, w.zeros_like()?]).unwrap_err();
        assert!(err.to_string().contains("8 of 20 probes disagree"), "{err}");
        Ok(())
    }
}
