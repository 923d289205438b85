//! The causal conv1d's CUDA kernels against the fused CPU kernel in f64 on the same (rounded)
//! inputs, every output and gradient, and decoding token by token against one forward.

use super::*;
use crate::attention::Mask;
use crate::causal_conv1d;

/// Row 0 holds three documents (the second starting one token in, the third mid-row), the
/// others one each.
fn packed(b: usize, t: usize) -> Result<Mask> {
    let ids: Vec<u32> =
        (0..b * t).map(|i| if i < t { u32::from(i >= 1.min(t - 1)) + u32::from(i >= t / 2) } else { 5 }).collect();
    Mask::new(&ids, b, t)
}

#[test]
fn causal_conv1d_matches_the_cpu_kernel_with_every_gradient() -> Result<()> {
    // The 27B layer's channels (2·16·128 + 48·128 = 10240) over a partial block of the weight
    // gradient's token blocks; rows shorter than the state (the final state reaching into the
    // initial one); channels no multiple of a warp over several token blocks.
    for (b, t, c, width) in [(2, 150, 10240, 4), (3, 2, 100, 4), (1, 600, 37, 4), (2, 40, 64, 1)] {
        for (dtype, tol) in DTYPES {
            for given in [false, true] {
                let mut inp = Inputs::new(dtype);
                let tag = format!("conv1d {b}×{t}×{c} W={width} {dtype:?} bias/state {given}");
                let (x, xr) = inp.make(&[b, t, c], 1.0)?;
                let (w, wr) = inp.make(&[c, width], 1.0)?;
                let (bias, biasr) = inp.make(&[c], 1.0)?;
                let (s0, s0r) = inp.make(&[b, c, width - 1], 1.0)?;
                let (dy, dyr) = inp.make(&[b, t, c], 1.0)?;
                let (ds, dsr) = inp.make(&[b, c, width - 1], 1.0)?;
                let mask = packed(b, t)?;
                let opt = |t: &Tensor| given.then(|| t.clone());
                let (y, last) =
                    fused(|| causal_conv1d::forward(&x, &w, opt(&bias).as_ref(), opt(&s0).as_ref(), &mask))?;
                let (y_ref, last_ref) =
                    causal_conv1d::forward(&xr, &wr, opt(&biasr).as_ref(), opt(&s0r).as_ref(), &mask)?;
                expect_close(&format!("{tag} y"), &y, &y_ref, tol, inp.seed)?;
                if width > 1 {
                    expect_close(&format!("{tag} final state"), &last, &last_ref, tol, inp.seed)?;
                }
                let g = fused(|| {
                    causal_conv1d::backward(
                        &dy,
                        &x,
                        &w,
                        opt(&bias).as_ref(),
                        opt(&s0).as_ref(),
                        &mask,
                        opt(&ds).as_ref(),
                    )
                })?;
                let want = causal_conv1d::backward(
                    &dyr,
                    &xr,
                    &wr,
                    opt(&biasr).as_ref(),
                    opt(&s0r).as_ref(),
                    &mask,
                    opt(&dsr).as_ref(),
                )?;
                expect_close(&format!("{tag} dx"), &g.dx, &want.dx, tol, inp.seed)?;
                expect_close(&format!("{tag} dw"), &g.dw, &want.dw, tol, inp.seed)?;
                assert_eq!((g.dbias.is_some(), g.dstate.is_some()), (given, given), "{tag}");
                if let (Some(got), Some(want)) = (&g.dbias, &want.dbias) {
                    expect_close(&format!("{tag} dbias"), got, want, tol, inp.seed)?;
                }
                if let (Some(got), Some(want)) = (&g.dstate, &want.dstate)
                    && width > 1
                {
                    expect_close(&format!("{tag} dstate"), got, want, tol, inp.seed)?;
                }
                // Deterministic: the weight's gradient is summed in a fixed order.
                let again = causal_conv1d::backward(&dy, &x, &w, None, None, &mask, None)?;
                let first = causal_conv1d::backward(&dy, &x, &w, None, None, &mask, None)?;
                let same = again.dw.eq(&first.dw)?.to_dtype(DType::F32)?.min_all()?.to_scalar::<f32>()?;
                assert_eq!(same, 1.0, "{tag}: a second weight gradient differs");
            }
        }
    }
    Ok(())
}

#[test]
fn causal_conv1d_steps_token_by_token_give_the_forward() -> Result<()> {
    let (b, t, c, width) = (2, 9, 300, 4);
    for dtype in [DType::F32, DType::BF16] {
        let mut inp = Inputs::new(dtype);
        let ((x, _), (w, _), (bias, _), (s0, _)) = (
            inp.make(&[b, t, c], 1.0)?,
            inp.make(&[c, width], 1.0)?,
            inp.make(&[c], 1.0)?,
            inp.make(&[b, c, width - 1], 1.0)?,
        );
        let whole = Mask::new(&vec![0; b * t], b, t)?;
        let (y, last) = fused(|| causal_conv1d::forward(&x, &w, Some(&bias), Some(&s0), &whole))?;
        let mut state = s0.clone();
        let mut ys = Vec::with_capacity(t);
        for i in 0..t {
            let (yi, s) = fused(|| causal_conv1d::step(&x.narrow(1, i, 1)?, &w, Some(&bias), &state))?;
            ys.push(yi);
            state = s;
        }
        let same = |a: &Tensor, b: &Tensor| -> Result<f32> {
            a.to_dtype(DType::F32)?.eq(&b.to_dtype(DType::F32)?)?.to_dtype(DType::F32)?.min_all()?.to_scalar::<f32>()
        };
        assert_eq!(same(&Tensor::cat(&ys, 1)?, &y)?, 1.0, "{dtype:?}: stepped outputs differ (seed {})", inp.seed);
        assert_eq!(same(&state, &last)?, 1.0, "{dtype:?}: stepped state differs (seed {})", inp.seed);
    }
    Ok(())
}

#[test]
fn causal_conv1d_timing_at_the_27b_layer_shape() -> Result<()> {
    // Qwen3.6-27B's conv: 2·16·128 + 48·128 = 10240 channels, kernel 4, two packed rows of 4096
    // bf16 tokens. A print, not an assertion.
    let (b, t, c, width) = (2, 4096, 10240, 4);
    let mut inp = Inputs::new(DType::BF16);
    let ((x, _), (w, _), (bias, _), (dy, _)) =
        (inp.make(&[b, t, c], 1.0)?, inp.make(&[c, width], 1.0)?, inp.make(&[c], 1.0)?, inp.make(&[b, t, c], 1.0)?);
    let mask = packed(b, t)?;
    let fwd = time_ms(&mut || causal_conv1d::forward(&x, &w, Some(&bias), None, &mask).map(drop))?;
    let bwd = time_ms(&mut || causal_conv1d::backward(&dy, &x, &w, Some(&bias), None, &mask, None).map(drop))?;
    println!("causal conv1d {b}×{t}×{c} W={width} bf16: forward {fwd:.3} ms, backward {bwd:.3} ms");
    Ok(())
}
