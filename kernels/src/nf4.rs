//! NF4 dequant-matmul for QLoRA's frozen base weights: `y = x·Wᵀ` and `dx = dy·W` with `W`
//! `[out, in]` held as NF4 codes (two per byte, low nibble first) and one f32 absmax scale per
//! block of [`BLOCK`] consecutive values. `W` is expanded a tile of rows at a time (on the GPU
//! by a fused kernel, elsewhere on the host) and each tile feeds one GEMM, so the dense weight
//! never exists whole: peak extra memory is one tile.

use candle_core::{DType, Result, Tensor};

/// Values per scale block.
pub const BLOCK: usize = 64;

/// The 16 NormalFloat4 code values, ascending (the QLoRA paper's quantiles, as bitsandbytes).
pub const LEVELS: [f32; 16] = [
    -1.0,
    -0.696_192_8,
    -0.525_073_05,
    -0.394_917_5,
    -0.284_441_38,
    -0.184_773_43,
    -0.091_050_036,
    0.0,
    0.079_580_3,
    0.160_930_2,
    0.246_112_3,
    0.337_915_24,
    0.440_709_83,
    0.562_617,
    0.722_956_84,
    1.0,
];

/// An NF4 weight on some device: `codes` u8 `[⌈n/2⌉]`, `scales` f32 `[⌈n/BLOCK⌉]`, `shape`
/// `[out, in]`.
#[derive(Debug, Clone)]
pub struct Nf4Weight {
    pub codes: Tensor,
    pub scales: Tensor,
    pub rows: usize,
    pub cols: usize,
}

impl Nf4Weight {
    pub fn new(codes: Tensor, scales: Tensor, rows: usize, cols: usize) -> Result<Nf4Weight> {
        let n = rows * cols;
        if codes.dtype() != DType::U8 || scales.dtype() != DType::F32 {
            candle_core::bail!("nf4: codes must be u8 and scales f32");
        }
        if codes.elem_count() != n.div_ceil(2) || scales.elem_count() != n.div_ceil(BLOCK) {
            candle_core::bail!(
                "nf4: {} codes and {} scales for a {rows}×{cols} weight",
                codes.elem_count(),
                scales.elem_count()
            );
        }
        Ok(Nf4Weight { codes, scales, rows, cols })
    }

    /// Rows `r0..r0 + n` of the weight, dense in `dtype`, on the weight's device.
    pub fn dequantize_rows(&self, r0: usize, n: usize, dtype: DType) -> Result<Tensor> {
        if r0 + n > self.rows {
            candle_core::bail!("nf4: rows {r0}..{} of {}", r0 + n, self.rows);
        }
        #[cfg(feature = "cuda")]
        if self.codes.device().is_cuda() {
            use crate::gpu::nf4::dequantize_rows as gpu;
            match dtype {
                DType::F32 => return gpu::<f32>(self, r0, n),
                DType::BF16 => return gpu::<half::bf16>(self, r0, n),
                _ => {}
            }
        }
        host_dequantize_rows(self, r0, n, dtype)
    }
}

/// The host form (and the referee of the GPU kernel).
fn host_dequantize_rows(w: &Nf4Weight, r0: usize, n: usize, dtype: DType) -> Result<Tensor> {
    let codes = w.codes.to_vec1::<u8>()?;
    let scales = w.scales.to_vec1::<f32>()?;
    let values = dequantize_host(&codes, &scales, r0 * w.cols, n * w.cols)?;
    Tensor::from_vec(values, (n, w.cols), w.codes.device())?.to_dtype(dtype)
}

/// Elements `start..start + n` of an NF4 array (codes two per byte, low nibble first; one
/// scale per block of [`BLOCK`]), each `LEVELS[code] · scale` in f32: the one host
/// dequantiser, shared by [`Nf4Weight`] and the trainer's NF4 storage, and the same f32
/// product as the GPU kernel (`cuda/nf4.cu`), so every path sees the same values.
pub fn dequantize_host(codes: &[u8], scales: &[f32], start: usize, n: usize) -> Result<Vec<f32>> {
    use rayon::prelude::*;
    let end = start + n;
    if codes.len() < end.div_ceil(2) || scales.len() < end.div_ceil(BLOCK) {
        candle_core::bail!("nf4: elements {start}..{end} of {} codes and {} scales", codes.len(), scales.len());
    }
    let value = |e: usize| LEVELS[((codes[e / 2] >> (4 * (e % 2))) & 0xF) as usize] * scales[e / BLOCK];
    // Each value is a function of its index alone: chunks on any thread count give the same bits,
    // and a stacked expert weight (hundreds of millions of values) is expanded on every core.
    let mut out = vec![0f32; n];
    out.par_chunks_mut(1 << 16).enumerate().for_each(|(c, chunk)| {
        let first = start + (c << 16);
        chunk.iter_mut().enumerate().for_each(|(i, v)| *v = value(first + i));
    });
    Ok(out)
}

/// `x·Wᵀ` for `x` `[N, in]`, expanding `tile` rows of `W` at a time.
pub fn matmul_t(x: &Tensor, w: &Nf4Weight, tile: usize) -> Result<Tensor> {
    check(x, w.cols, tile)?;
    let mut parts = Vec::with_capacity(w.rows.div_ceil(tile));
    for r0 in (0..w.rows).step_by(tile) {
        let wt = w.dequantize_rows(r0, tile.min(w.rows - r0), x.dtype())?;
        parts.push(x.matmul(&wt.t()?)?);
    }
    Tensor::cat(&parts, 1)
}

/// `dy·W` for `dy` `[N, out]` (the input gradient; the base is frozen, so no `dW`).
pub fn matmul(dy: &Tensor, w: &Nf4Weight, tile: usize) -> Result<Tensor> {
    check(dy, w.rows, tile)?;
    let mut acc: Option<Tensor> = None;
    for r0 in (0..w.rows).step_by(tile) {
        let n = tile.min(w.rows - r0);
        // contiguous: candle's CUDA matmul takes no row stride.
        let part = dy.narrow(1, r0, n)?.contiguous()?.matmul(&w.dequantize_rows(r0, n, dy.dtype())?)?;
        acc = Some(match acc {
            None => part,
            Some(a) => (a + part)?,
        });
    }
    acc.ok_or_else(|| candle_core::Error::Msg("nf4: empty weight".into()))
}

fn check(x: &Tensor, k: usize, tile: usize) -> Result<()> {
    let (_, kx) = x.dims2()?;
    if kx != k || tile == 0 {
        candle_core::bail!("nf4 matmul: input {:?} against {k} columns, tile {tile}", x.dims());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gradcheck::{assert_close, random};
    use candle_core::Device;

    /// A weight with every code and a partial last block: tiles (one that does not divide the
    /// rows) must equal the dense product with the host-dequantised weight.
    #[test]
    fn tiled_products_equal_the_dense_ones() -> Result<()> {
        let dev = Device::Cpu;
        let (rows, cols): (usize, usize) = (37, 30);
        let n = rows * cols;
        let codes: Vec<u8> = (0..n.div_ceil(2)).map(|i| (i * 37 % 256) as u8).collect();
        let scales: Vec<f32> = (0..n.div_ceil(BLOCK)).map(|b| 0.5 + b as f32 * 0.25).collect();
        let w = Nf4Weight::new(Tensor::new(codes, &dev)?, Tensor::new(scales, &dev)?, rows, cols)?;
        let dense = w.dequantize_rows(0, rows, DType::F64)?;
        // Element 3 is the high nibble of byte 1 (37): code 2, in block 0 (scale 0.5).
        assert_eq!(dense.get(0)?.get(3)?.to_scalar::<f64>()?, (LEVELS[(37 >> 4) & 0xF] * 0.5) as f64);
        let x = random(&[5, cols], 1, &dev)?;
        let dy = random(&[5, rows], 2, &dev)?;
        for tile in [8, 37, 64] {
            assert_close(&matmul_t(&x, &w, tile)?, &x.matmul(&dense.t()?)?, 1e-12)?;
            assert_close(&matmul(&dy, &w, tile)?, &dy.matmul(&dense)?, 1e-12)?;
        }
        assert!(matmul_t(&dy, &w, 8).is_err());
        assert!(Nf4Weight::new(w.codes.clone(), w.scales.clone(), rows, cols + 2).is_err());
        Ok(())
    }
}
