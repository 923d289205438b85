//! One weight matrix to FP8 E4M3 codes and scales, and back.
//!
//! Symmetric, as compressed-tensors' `float` weights are: `scale = max|w| / 448` over each output
//! channel (row of the `[out_features, in_features]` matrix) or over the whole tensor, stored in
//! the weight's own dtype (what llm-compressor writes, and what transformers multiplies the codes
//! by); then `code = e4m3(w / scale)`. The codes are taken with the *stored* scale, so the
//! dequantized weight is exactly `decode(code) * scale` as any reader computes it.

use candle_core::{DType, Device, Tensor};
use float8::F8E4M3;

use super::QuantizeError;
use super::e4m3::{E4M3_MAX, decode, encode};

/// Which weights share a scale.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Granularity {
    /// One scale per output channel (compressed-tensors' `channel` strategy), shape `[out, 1]`.
    Channel,
    /// One scale for the tensor (`tensor` strategy), shape `[1]`.
    Tensor,
}

impl Granularity {
    /// The compressed-tensors `strategy` name.
    pub fn strategy(self) -> &'static str {
        match self {
            Granularity::Channel => "channel",
            Granularity::Tensor => "tensor",
        }
    }
}

/// A weight as FP8: `codes` (`F8E4M3`, the weight's shape) and `scale` (the weight's dtype).
#[derive(Debug, Clone)]
pub struct Fp8Weight {
    pub codes: Tensor,
    pub scale: Tensor,
}

/// The smallest scale used: an all-zero row keeps a positive scale (as compressed-tensors clamps
/// its scales to f32's epsilon), so dequantizing never divides by or multiplies into nothing.
const MIN_SCALE: f32 = f32::EPSILON;

/// Quantizes the matrix `w` (named `name` in errors) with `granularity`'s scales.
pub fn quantize(name: &str, w: &Tensor, granularity: Granularity) -> Result<Fp8Weight, QuantizeError> {
    let &[rows, cols] = w.dims() else {
        return Err(QuantizeError::NotAMatrix { name: name.to_string(), dims: w.dims().to_vec() });
    };
    let scale_dtype = w.dtype();
    let values = w.to_dtype(DType::F32).and_then(|t| t.to_vec2::<f32>()).map_err(QuantizeError::tensor(name))?;
    let mut amax = vec![0f32; rows];
    for (r, row) in values.iter().enumerate() {
        for &x in row {
            if !x.is_finite() {
                return Err(QuantizeError::NotFinite { name: name.to_string(), row: r, value: x });
            }
            amax[r] = amax[r].max(x.abs());
        }
    }
    if granularity == Granularity::Tensor {
        let all = amax.iter().copied().fold(0f32, f32::max);
        amax = vec![all];
    }
    // The scales as stored (rounded to the weight's dtype), which the codes are taken against.
    let wanted: Vec<f32> = amax.iter().map(|&a| (a / E4M3_MAX).max(MIN_SCALE)).collect();
    let scale_shape: &[usize] = match granularity {
        Granularity::Channel => &[rows, 1],
        Granularity::Tensor => &[1],
    };
    let scale = Tensor::from_vec(wanted, scale_shape, &Device::Cpu)
        .and_then(|t| t.to_dtype(scale_dtype))
        .map_err(QuantizeError::tensor(name))?;
    let stored = scale
        .to_dtype(DType::F32)
        .and_then(|t| t.flatten_all()?.to_vec1::<f32>())
        .map_err(QuantizeError::tensor(name))?;
    let mut codes = Vec::with_capacity(rows * cols);
    for (r, row) in values.iter().enumerate() {
        let s = stored[if granularity == Granularity::Channel { r } else { 0 }];
        codes.extend(row.iter().map(|&x| encode(x / s)));
    }
    let codes = Tensor::from_vec(codes, (rows, cols), &Device::Cpu).map_err(QuantizeError::tensor(name))?;
    Ok(Fp8Weight { codes, scale })
}

impl Fp8Weight {
    /// `decode(code) * scale` in `dtype`: the weight every reader of the directory computes.
    pub fn dequantize(&self, dtype: DType) -> Result<Tensor, QuantizeError> {
        let name = "fp8 weight";
        let &[rows, cols] = self.codes.dims() else {
            return Err(QuantizeError::NotAMatrix { name: name.to_string(), dims: self.codes.dims().to_vec() });
        };
        let codes: Vec<f32> = self
            .codes
            .flatten_all()
            .and_then(|t| t.to_vec1::<F8E4M3>())
            .map_err(QuantizeError::tensor(name))?
            .into_iter()
            .map(decode)
            .collect();
        let values = Tensor::from_vec(codes, (rows, cols), &Device::Cpu).map_err(QuantizeError::tensor(name))?;
        let scale = self.scale.to_dtype(DType::F32).map_err(QuantizeError::tensor(name))?;
        let scale = if scale.rank() == 1 { scale.reshape((1, 1)) } else { Ok(scale) };
        scale
            .and_then(|s| values.broadcast_mul(&s))
            .and_then(|w| w.to_dtype(dtype))
            .map_err(QuantizeError::tensor(name))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    fn random(rows: usize, cols: usize, seed: u64) -> Tensor {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        // Rows of very different magnitudes, as trained weights have.
        let v: Vec<f32> =
            (0..rows * cols).map(|i| rng.random_range(-1.0f32..1.0) * 10f32.powi((i / cols) as i32 % 5 - 3)).collect();
        Tensor::from_vec(v, (rows, cols), &Device::Cpu).unwrap()
    }

    #[test]
    fn per_channel_scales_map_each_row_s_largest_weight_to_448() {
        let w = random(12, 40, 1);
        let q = quantize("w", &w, Granularity::Channel).unwrap();
        assert_eq!(q.scale.dims(), &[12, 1]);
        assert_eq!(q.codes.dtype(), DType::F8E4M3);
        let rows = w.to_vec2::<f32>().unwrap();
        let scales = q.scale.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        let codes = q.codes.to_vec2::<F8E4M3>().unwrap();
        for (r, row) in rows.iter().enumerate() {
            let amax = row.iter().fold(0f32, |m, x| m.max(x.abs()));
            assert_eq!(scales[r], amax / E4M3_MAX, "row {r}");
            let top = codes[r].iter().map(|c| decode(*c).abs()).fold(0f32, f32::max);
            assert_eq!(top, E4M3_MAX, "row {r}: its largest weight is not at 448");
        }
    }

    #[test]
    fn the_round_trip_stays_within_half_an_e4m3_step_of_each_weight() {
        for (seed, granularity) in [(2, Granularity::Channel), (3, Granularity::Tensor)] {
            let w = random(16, 64, seed);
            let q = quantize("w", &w, granularity).unwrap();
            let back = q.dequantize(DType::F32).unwrap().to_vec2::<f32>().unwrap();
            let scales = q.scale.flatten_all().unwrap().to_vec1::<f32>().unwrap();
            for (r, (row, got)) in w.to_vec2::<f32>().unwrap().iter().zip(&back).enumerate() {
                let s = scales[if granularity == Granularity::Channel { r } else { 0 }];
                for (x, y) in row.iter().zip(got) {
                    // E4M3 has 3 mantissa bits: a relative step of 2^-3 in the normal range,
                    // an absolute one of 2^-9 (times the scale) among the subnormals.
                    let bound = (x.abs() / 16.0).max(s * 2f32.powi(-10)) * 1.0001;
                    assert!((x - y).abs() <= bound, "{granularity:?} row {r}: {x} came back as {y}");
                }
            }
        }
    }

    #[test]
    fn bf16_weights_get_bf16_scales_and_the_codes_are_taken_against_them() {
        let w = random(8, 32, 4).to_dtype(DType::BF16).unwrap();
        let q = quantize("w", &w, Granularity::Channel).unwrap();
        assert_eq!(q.scale.dtype(), DType::BF16);
        let back = q.dequantize(DType::F32).unwrap().to_vec2::<f32>().unwrap();
        for (r, row) in back.iter().enumerate() {
            // A bf16 scale rounded down may push the largest weight past 448: it saturates there.
            assert!(row.iter().all(|x| x.is_finite()), "row {r}");
        }
        let orig = w.to_dtype(DType::F32).unwrap().to_vec2::<f32>().unwrap();
        let scales = q.scale.to_dtype(DType::F32).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
        for (r, (row, got)) in orig.iter().zip(&back).enumerate() {
            for (x, y) in row.iter().zip(got) {
                let bound = (x.abs() / 16.0).max(scales[r] * 2f32.powi(-10)) + scales[r] * 0.5;
                assert!((x - y).abs() <= bound * 1.0001, "row {r}: {x} came back as {y}");
            }
        }
    }

    #[test]
    fn a_zero_row_keeps_a_positive_scale_and_zero_codes() {
        let mut v = vec![0f32; 2 * 4];
        v[4..].copy_from_slice(&[1.0, -2.0, 3.0, 448.0]);
        let w = Tensor::from_vec(v, (2, 4), &Device::Cpu).unwrap();
        let q = quantize("w", &w, Granularity::Channel).unwrap();
        let scales = q.scale.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        assert_eq!(scales, vec![MIN_SCALE, 1.0]);
        assert_eq!(q.dequantize(DType::F32).unwrap().to_vec2::<f32>().unwrap(), w.to_vec2::<f32>().unwrap());
    }

    #[test]
    fn what_has_no_fp8_form_is_refused_by_name() {
        let v = Tensor::from_vec(vec![1f32, 2.0, 3.0], 3, &Device::Cpu).unwrap();
        assert!(
            matches!(quantize("norm", &v, Granularity::Channel), Err(QuantizeError::NotAMatrix { name, .. }) if name == "norm")
        );
        let w = Tensor::from_vec(vec![1f32, f32::NAN, 0.0, 1.0], (2, 2), &Device::Cpu).unwrap();
        assert!(matches!(quantize("w", &w, Granularity::Tensor), Err(QuantizeError::NotFinite { row: 0, .. })));
    }
}
