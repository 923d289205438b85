//! The decode GEMV against the f64 `x·Wᵀ` of the same bf16 inputs, and its dispatch from
//! `linear::forward`.

use super::{BF16_TOL, Inputs, expect_close};
use crate::KernelConfig;
use crate::gpu::{device, gemv, tensor};
use crate::linear;
use candle_core::{DType, Result, Tensor};

/// Products are exact in f32 and summed in f32: the output's rounding to bf16 (at most 2⁻⁸ of
/// each element, ~1.7e-3 over many) is all the error there is, under the 1e-2 of bf16 kernels.
const TOL: f64 = 4e-3;

/// `x [rows, in]·wᵀ` by the kernel itself (it must serve the shape).
fn by_kernel(x: &Tensor, w: &Tensor) -> Result<Tensor> {
    let dev = device(x)?;
    let y = gemv::forward::<half::bf16>(&dev, x, w)?.expect("the GEMV serves this shape");
    Ok(tensor(y, &dev, (x.dim(0)?, w.dim(0)?)))
}

#[test]
fn gemv_matches_the_f64_product() -> Result<()> {
    // (rows, out, in): one row, odd row counts, the most rows served (8), outputs
    // that are no multiple of a block's 8 or 16 columns on either side of the two-tile switch,
    // `in` a multiple of 8 but not of a warp's 32-wide step, and the 8B model's shapes.
    let shapes = [
        (1, 4096, 4096),
        (3, 1000, 4096),
        (8, 1024, 12288),
        (8, 4104, 1000),
        (7, 4095, 4096),
        (2, 9, 8),
        (5, 12288, 4096),
        (1, 151_936, 4096),
    ];
    for (rows, d_out, d_in) in shapes {
        let mut inp = Inputs::new(DType::BF16);
        let ((x, xr), (w, wr)) = (inp.make(&[rows, d_in], 1.0)?, inp.make(&[d_out, d_in], 1.0)?);
        let want = xr.matmul(&wr.t()?)?;
        let got = by_kernel(&x, &w)?;
        expect_close(&format!("gemv {rows}×{d_in}·({d_out}×{d_in})ᵀ"), &got, &want, TOL, inp.seed)?;
        // Deterministic: the same bits again.
        assert_eq!(by_kernel(&x, &w)?.to_vec2::<half::bf16>()?, got.to_vec2::<half::bf16>()?);
    }
    Ok(())
}

#[test]
fn linear_runs_the_gemv_for_few_bf16_rows_only() -> Result<()> {
    let mut inp = Inputs::new(DType::BF16);
    let ((x, xr), (w, wr)) = (inp.make(&[4, 256], 1.0)?, inp.make(&[100, 256], 1.0)?);
    let on = KernelConfig::default().with_gemv_rows(gemv::MAX_ROWS);
    // Through linear::forward, a batch dimension flattened: the kernel's own bits.
    let y = linear::forward(&on, &x.reshape((2, 2, 256))?, &w)?.reshape((4, 100))?;
    assert_eq!(y.to_vec2::<half::bf16>()?, by_kernel(&x, &w)?.to_vec2::<half::bf16>()?);
    // Off, cuBLAS computes the same product (to bf16 rounding).
    let off = linear::forward(&KernelConfig::default().with_gemv_rows(0), &x, &w)?;
    expect_close("linear, GEMV off", &off, &xr.matmul(&wr.t()?)?, BF16_TOL, inp.seed)?;
    // What the kernel does not serve: more rows than it holds, `in` not a multiple of 8, a
    // strided weight, f32.
    let dev = device(&x)?;
    let (x9, x12) = (inp.make(&[gemv::MAX_ROWS + 1, 256], 1.0)?.0, inp.make(&[4, 12], 1.0)?.0);
    assert!(gemv::forward::<half::bf16>(&dev, &x9, &w)?.is_none());
    assert!(gemv::forward::<half::bf16>(&dev, &x12, &inp.make(&[100, 12], 1.0)?.0)?.is_none());
    let strided = w.t()?.contiguous()?.t()?;
    assert!(gemv::forward::<half::bf16>(&dev, &x, &strided)?.is_none());
    let (xf, wf) = (x.to_dtype(DType::F32)?, w.to_dtype(DType::F32)?);
    assert!(gemv::forward::<f32>(&dev, &xf, &wf)?.is_none());
    // The fallbacks still compute the product.
    let y = linear::forward(&on, &x, &strided)?;
    expect_close("linear, strided weight", &y, &xr.matmul(&wr.t()?)?, BF16_TOL, inp.seed)?;
    Ok(())
}
