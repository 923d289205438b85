//! Reductions of whole tensors to f64 on the host: the parts of a gradient norm.
//!
//! On the GPU each tensor is summed by a fixed grid of blocks into f64 partials, all of them
//! brought back in one copy (candle's `sum_all` runs one block for the whole tensor: at an 8B
//! model's full gradients, seconds a step). The CPU reference sums each tensor's elements in
//! order in f64; the two agree to f64 rounding, and each is deterministic.

use candle_core::{DType, Result, Tensor};

/// `Σ x²` of each tensor, in f64, in the order given. The f32 and bf16 tensors on the first
/// tensor's GPU take the kernel (one launch each, one copy back for all); any other tensor the
/// reference.
pub fn sum_squares(ts: &[&Tensor]) -> Result<Vec<f64>> {
    #[cfg(feature = "cuda")]
    if let Some(candle_core::Device::Cuda(dev)) = ts.iter().map(|t| t.device()).find(|d| d.is_cuda()) {
        let gpu = candle_core::Device::Cuda(dev.clone());
        let on_kernel = |t: &Tensor| t.device().same_device(&gpu) && matches!(t.dtype(), DType::F32 | DType::BF16);
        let batch: Vec<&Tensor> = ts.iter().copied().filter(|t| on_kernel(t)).collect();
        let _profile = crate::profile::scope("sum of squares", &gpu);
        let mut sums = crate::gpu::reduce::sum_squares(dev, &batch)?.into_iter();
        return ts
            .iter()
            .map(|t| {
                if on_kernel(t) {
                    sums.next().ok_or_else(|| candle_core::Error::Msg("sum of squares: a kernel sum is missing".into()))
                } else {
                    reference(t)
                }
            })
            .collect();
    }
    ts.iter().map(|t| reference(t)).collect()
}

/// Each element squared and added in order, in f64.
pub fn reference(t: &Tensor) -> Result<f64> {
    let v = t.to_dtype(DType::F64)?.flatten_all()?.to_vec1::<f64>()?;
    Ok(v.iter().map(|x| x * x).sum())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gradcheck::random;
    use candle_core::Device;

    #[test]
    fn sums_of_squares_add_every_element_in_f64() -> Result<()> {
        let dev = Device::Cpu;
        let a = random(&[3, 7], 1, &dev)?;
        let b = Tensor::new(&[3f32, 4.0], &dev)?;
        let got = sum_squares(&[&a, &b, &a.to_dtype(DType::BF16)?])?;
        let want: f64 = a.flatten_all()?.to_vec1::<f64>()?.iter().map(|x| x * x).sum();
        assert_eq!(got[0], want);
        assert_eq!(got[1], 25.0);
        assert!((got[2] - want).abs() <= 1e-2 * want, "bf16 rounding only: {} vs {want}", got[2]);
        Ok(())
    }
}
