//! NF4 storage for QLoRA's frozen base weights: blocks of 64 consecutive values, each block
//! scaled by its absmax and every value rounded to the nearest of the 16 NormalFloat4 levels
//! (the quantiles of a standard normal from the QLoRA paper, as in bitsandbytes). The scales
//! stay f32 (no double quantisation). Weights are dequantised when a forward or backward
//! needs them and never stored dense.
//!
//! [`Nf4Tensor`] is the one quantiser (host-side codes). What a model keeps is resident on its
//! device: [`Nf4Projection`] a dense layer's projection, [`Nf4Experts`] a Qwen3-MoE layer's
//! stacked expert weight, so each product expands its weight where it runs. All expand through
//! the kernels' one dequantiser (`mindxtrain_kernels::nf4`: the host function, or its GPU kernel).

use candle_core::{DType, Device, Tensor};
use mindxtrain_kernels::nf4::{Nf4Weight, dequantize_host};

use super::ModelError;

/// The block size and code values are the kernels' (one definition for storage and the
/// dequant-matmul kernels).
pub use mindxtrain_kernels::nf4::{BLOCK, LEVELS};

// A block's codes are whole bytes of its own, so blocks are quantised independently.
const _: () = assert!(BLOCK.is_multiple_of(2));

/// A tensor in NF4: two 4-bit codes per byte (low nibble first) and one scale per block.
#[derive(Debug, Clone, PartialEq)]
pub struct Nf4Tensor {
    pub shape: Vec<usize>,
    pub codes: Vec<u8>,
    pub scales: Vec<f32>,
}

impl Nf4Tensor {
    pub fn quantize(t: &Tensor) -> Result<Nf4Tensor, ModelError> {
        use rayon::prelude::*;
        // To the host before widening: an f32 copy on a GPU would be twice a bf16 weight.
        let values = t.to_device(&Device::Cpu)?.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?;
        let mut codes = vec![0u8; values.len().div_ceil(2)];
        let mut scales = vec![0f32; values.len().div_ceil(BLOCK)];
        // Blocks in parallel (a stacked expert weight is hundreds of millions of values); each
        // block's codes and scale depend on its values alone, so any thread count gives the same.
        codes.par_chunks_mut(BLOCK / 2).zip(values.par_chunks(BLOCK)).zip(scales.par_iter_mut()).for_each(
            |((codes, block), scale)| {
                let absmax = block.iter().fold(0f32, |m, v| m.max(v.abs()));
                *scale = absmax;
                let inv = if absmax > 0.0 { 1.0 / absmax } else { 0.0 };
                for (j, &v) in block.iter().enumerate() {
                    codes[j / 2] |= nearest_level(v * inv) << (4 * (j % 2));
                }
            },
        );
        Ok(Nf4Tensor { shape: t.dims().to_vec(), codes, scales })
    }

    pub fn dequantize(&self, dtype: DType, device: &Device) -> Result<Tensor, ModelError> {
        let n: usize = self.shape.iter().product();
        let values = dequantize_host(&self.codes, &self.scales, 0, n)?;
        Ok(Tensor::from_vec(values, self.shape.as_slice(), device)?.to_dtype(dtype)?)
    }

    /// Bytes held: half a byte per value plus four per block.
    pub fn storage_bytes(&self) -> usize {
        self.codes.len() + 4 * self.scales.len()
    }
}

/// `t`'s NF4 codes and scales (computed on the host) as tensors on `device`, as rows of its
/// last dimension: what the kernels' dequantiser reads.
fn resident(t: &Tensor, device: &Device) -> Result<Nf4Weight, ModelError> {
    let cols = t.dims().last().copied().unwrap_or(0);
    if cols == 0 {
        return Err(ModelError::Config(format!("an NF4 weight of shape {:?} holds no values", t.dims())));
    }
    let q = Nf4Tensor::quantize(t)?;
    let (n_codes, n_scales) = (q.codes.len(), q.scales.len());
    let codes = Tensor::from_vec(q.codes, n_codes, device)?;
    let scales = Tensor::from_vec(q.scales, n_scales, device)?;
    Ok(Nf4Weight::new(codes, scales, t.elem_count() / cols, cols)?)
}

/// Bytes an NF4 weight holds: half a byte per value plus four per block of 64 (0.5625 per value).
fn resident_bytes(w: &Nf4Weight) -> usize {
    w.codes.elem_count() + 4 * w.scales.elem_count()
}

/// A dense layer's projection `[out, in]` in NF4 for QLoRA, resident on the model's device: on a
/// GPU each use expands it with the dequantisation kernel (host codes, expanded on the host and
/// uploaded at every use, moved two bytes a value over the bus for every product).
#[derive(Debug, Clone)]
pub struct Nf4Projection {
    weight: Nf4Weight,
}

impl Nf4Projection {
    /// `w` in NF4, resident on `device` (where `w` is, or a GPU a host-loaded base goes to).
    pub fn quantize(w: &Tensor, device: &Device) -> Result<Nf4Projection, ModelError> {
        w.dims2()?;
        Ok(Nf4Projection { weight: resident(w, device)? })
    }

    /// The dense weight in `dtype`, a new tensor on the weight's device.
    pub fn dequantize(&self, dtype: DType) -> candle_core::Result<Tensor> {
        self.weight.dequantize_rows(0, self.weight.rows, dtype)
    }

    pub fn storage_bytes(&self) -> usize {
        resident_bytes(&self.weight)
    }
}

/// A sparse layer's stacked expert weight (`mlp.experts.gate_up_proj` `[E, 2F, H]` or
/// `down_proj` `[E, H, F]`) in NF4 for QLoRA: [`Nf4Tensor`]'s codes and scales (blocks over the
/// flattened tensor), held as device tensors on the weight's device. On a GPU each grouped
/// product expands it with the dequantisation kernel into a scratch tensor freed after the
/// product: uploading host codes for every product, as the dense layers' storage does, would
/// move a quarter of a bf16 expert weight over the bus twice a step (forward, input gradient).
#[derive(Debug, Clone)]
pub struct Nf4Experts {
    /// Rows `E·out` of `in` values, as the kernels' dequantiser takes them.
    weight: Nf4Weight,
    experts: usize,
}

impl Nf4Experts {
    /// Quantises `w` `[E, out, in]` (the codes are computed on the host) onto `device`.
    pub fn quantize(w: &Tensor, device: &Device) -> Result<Nf4Experts, ModelError> {
        let experts = w.dims3()?.0;
        if experts == 0 {
            return Err(ModelError::Config(format!("an expert weight {:?} with no experts", w.dims())));
        }
        Ok(Nf4Experts { weight: resident(w, device)?, experts })
    }

    /// `(E, out, in)`.
    pub fn dims(&self) -> (usize, usize, usize) {
        (self.experts, self.weight.rows / self.experts, self.weight.cols)
    }

    /// The whole weight `[E, out, in]` dense in `dtype`, a new tensor on the weight's device
    /// (the GPU kernel for f32/bf16 on CUDA, the host dequantiser elsewhere).
    pub fn dequantize(&self, dtype: DType) -> candle_core::Result<Tensor> {
        let w = &self.weight;
        w.dequantize_rows(0, w.rows, dtype)?.reshape(self.dims())
    }

    pub fn storage_bytes(&self) -> usize {
        resident_bytes(&self.weight)
    }
}

fn nearest_level(x: f32) -> u8 {
    // LEVELS is sorted: the nearest level is one of the two around the insertion point.
    let i = LEVELS.partition_point(|&l| l < x);
    if i == 0 {
        0
    } else if i == LEVELS.len() {
        15
    } else if (x - LEVELS[i - 1]) <= (LEVELS[i] - x) {
        (i - 1) as u8
    } else {
        i as u8
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::rng::SplitMix64;

    #[test]
    fn round_trip_error_is_bounded_by_half_the_level_gap() -> Result<(), ModelError> {
        let mut rng = SplitMix64::new(9);
        let (rows, cols) = (7, 50); // 350 values: the last block is partial
        let v: Vec<f32> = (0..rows * cols).map(|_| (0.02 * rng.normal()) as f32).collect();
        let t = Tensor::from_vec(v.clone(), (rows, cols), &Device::Cpu)?;
        let q = Nf4Tensor::quantize(&t)?;
        assert_eq!((q.codes.len(), q.scales.len()), (175, 6));
        let back = q.dequantize(DType::F32, &Device::Cpu)?.flatten_all()?.to_vec1::<f32>()?;
        let max_gap = LEVELS.windows(2).map(|w| w[1] - w[0]).fold(0f32, f32::max);
        let (mut err2, mut sig2) = (0f64, 0f64);
        for (i, (&a, &b)) in v.iter().zip(&back).enumerate() {
            let scale = q.scales[i / BLOCK];
            assert!((a - b).abs() <= scale * max_gap / 2.0 + 1e-7, "value {i}: {a} vs {b}");
            err2 += ((a - b) as f64).powi(2);
            sig2 += (a as f64).powi(2);
        }
        // Gaussian weights are what NF4 is built for: about 10% relative RMS error.
        assert!((err2 / sig2).sqrt() < 0.12, "relative rms error {}", (err2 / sig2).sqrt());
        // The block absmax itself and exact levels come back exactly.
        let exact = Tensor::new(&[[0.5f32, -0.5, 0.0, 0.281_308_5]], &Device::Cpu)?;
        let back = Nf4Tensor::quantize(&exact)?.dequantize(DType::F32, &Device::Cpu)?.to_vec2::<f32>()?;
        assert_eq!(&back[0][..3], &[0.5, -0.5, 0.0]);
        assert!((back[0][3] - 0.281_308_5).abs() < 1e-6);
        Ok(())
    }
}
