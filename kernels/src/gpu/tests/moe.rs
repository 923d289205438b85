//! The mixture-of-experts ops on the GPU (the router's kernel, the grouped cuBLAS GEMMs over the
//! sorted rows, candle's gathers) against the fused f64 CPU kernels, on fresh random routings
//! and inputs, f32 and bf16.

use super::{DTYPES, Inputs, expect_close, fused};
use crate::KernelConfig;
use crate::moe::grouped::{GradTerm, Term};
use crate::moe::router::{self, LossTerms};
use crate::moe::{Groups, combine, glu, grouped};
use candle_core::{DType, Device, Result, Tensor};

#[test]
fn moe_ops_match_the_f64_cpu_kernels() -> Result<()> {
    // 30B-A3B's routing (128 experts, 8 per token) at a small width, and a small odd case.
    for (n, e, k, h, f) in [(300, 128, 8, 64, 48), (77, 6, 2, 40, 24)] {
        for (dt, tol) in DTYPES {
            let mut inp = Inputs::new(dt);
            let tag = format!("moe {n} tokens {e}e top-{k} h{h} f{f} {dt:?}");
            let (logits, logits_ref) = inp.make(&[n, e], 3.0)?;
            // The router's kernel (one warp a token), not the host path.
            let r = fused(|| router::forward(&logits, k, true))?;
            let r_ref = router::forward(&logits_ref, k, true)?;
            // Same rounded logits on both sides: the same choice of experts.
            assert_eq!(r.experts.to_vec2::<u32>()?, r_ref.experts.to_vec2::<u32>()?, "{tag}: routing");
            expect_close(&format!("{tag} weights"), &r.weights, &r_ref.weights, tol, inp.seed)?;
            let (dw, dw_ref) = inp.make(&[n, k], 1.0)?;
            let (bal, bal_ref) = inp.make(&[e], 0.1)?;
            let terms = LossTerms { balance: Some(bal.to_dtype(DType::F32)?), z: 0.01, counted: None };
            let terms_ref = LossTerms { balance: Some(bal_ref), z: 0.01, counted: None };
            let dl = fused(|| router::backward(&dw, &r, &terms))?;
            expect_close(
                &format!("{tag} dlogits"),
                &dl,
                &router::backward(&dw_ref, &r_ref, &terms_ref)?,
                tol,
                inp.seed,
            )?;

            let (g, g_ref) = (Groups::new(&r.experts, e)?, Groups::new(&r_ref.experts, e)?);
            assert_eq!(g.counts()?, g_ref.counts()?);
            let cfg = KernelConfig::default();
            let ((x, xr), (wgu, wgur), (wd, wdr)) =
                (inp.make(&[n, h], 1.0)?, inp.make(&[e, 2 * f, h], 0.2)?, inp.make(&[e, h, f], 0.2)?);
            let gu = grouped::forward_sum(&cfg, &g, &[Term { x: &x, gathered: true, w: &wgu, col: 0 }], 2 * f)?;
            let gu_ref =
                grouped::forward_sum(&cfg, &g_ref, &[Term { x: &xr, gathered: true, w: &wgur, col: 0 }], 2 * f)?;
            expect_close(&format!("{tag} gate/up"), &gu, &gu_ref, tol, inp.seed)?;
            let (m, m_ref) = (glu::forward(&gu)?, glu::forward(&gu_ref)?);
            expect_close(&format!("{tag} swiglu"), &m, &m_ref, tol, inp.seed)?;
            let y = grouped::forward_sum(&cfg, &g, &[Term { x: &m, gathered: false, w: &wd, col: 0 }], h)?;
            let y_ref = grouped::forward_sum(&cfg, &g_ref, &[Term { x: &m_ref, gathered: false, w: &wdr, col: 0 }], h)?;
            expect_close(&format!("{tag} down"), &y, &y_ref, tol, inp.seed)?;
            let out = combine::forward(&y, &r.weights, &g)?;
            expect_close(
                &format!("{tag} combine"),
                &out,
                &combine::forward(&y_ref, &r_ref.weights, &g_ref)?,
                tol,
                inp.seed,
            )?;

            let (dout, dout_ref) = inp.make(&[n, h], 1.0)?;
            let (dy, dwt) = combine::backward(&dout, &y, &r.weights, &g)?;
            let (dy_ref, dwt_ref) = combine::backward(&dout_ref, &y_ref, &r_ref.weights, &g_ref)?;
            expect_close(&format!("{tag} combine dy"), &dy, &dy_ref, tol, inp.seed)?;
            expect_close(&format!("{tag} combine dweights"), &dwt, &dwt_ref, tol, inp.seed)?;
            let dm = grouped::input_grad_sum(&cfg, &g, &[GradTerm { dy: &dy, col: 0, w: &wd }])?;
            let dm_ref = grouped::input_grad_sum(&cfg, &g_ref, &[GradTerm { dy: &dy_ref, col: 0, w: &wdr }])?;
            expect_close(&format!("{tag} down dx"), &dm, &dm_ref, tol, inp.seed)?;
            let dwd = grouped::weight_grad(&cfg, &g, &dy, 0, h, &m, false)?;
            expect_close(
                &format!("{tag} down dW"),
                &dwd,
                &grouped::weight_grad(&cfg, &g_ref, &dy_ref, 0, h, &m_ref, false)?,
                tol,
                inp.seed,
            )?;
            let dgu = glu::backward(&dm, &gu)?;
            let dgu_ref = glu::backward(&dm_ref, &gu_ref)?;
            expect_close(&format!("{tag} swiglu bwd"), &dgu, &dgu_ref, tol, inp.seed)?;
            let dxs = grouped::input_grad_sum(&cfg, &g, &[GradTerm { dy: &dgu, col: 0, w: &wgu }])?;
            let dxs_ref = grouped::input_grad_sum(&cfg, &g_ref, &[GradTerm { dy: &dgu_ref, col: 0, w: &wgur }])?;
            let dx = combine::scatter_sum(&dxs, &g)?;
            expect_close(&format!("{tag} dx"), &dx, &combine::scatter_sum(&dxs_ref, &g_ref)?, tol, inp.seed)?;
            let dwgu = grouped::weight_grad(&cfg, &g, &dgu, 0, 2 * f, &x, true)?;
            let dwgu_ref = grouped::weight_grad(&cfg, &g_ref, &dgu_ref, 0, 2 * f, &xr, true)?;
            expect_close(&format!("{tag} gate/up dW"), &dwgu, &dwgu_ref, tol, inp.seed)?;
            assert!(matches!(dx.device(), Device::Cuda(_)), "{tag}: the GPU path ran on the GPU");
        }
    }
    Ok(())
}

/// The grouped GEMMs as the LoRA-on-experts step uses them: two terms summed into one output at
/// column offsets (a base projection and a rank-r branch beside it), input gradients of two
/// terms summed, weight gradients of a column slice, an expert with no rows (zeros) — each term
/// one cuBLAS grouped call, against the f64 CPU kernels.
#[test]
fn grouped_gemms_sum_terms_at_column_offsets_in_one_call_each() -> Result<()> {
    use std::sync::atomic::Ordering;
    let (n, e, k, h, o, r) = (97, 7, 2, 40, 24, 8);
    // Expert 6 gets no row; expert 0 most of them.
    let ids: Vec<u32> = (0..n as u32)
        .flat_map(|t| {
            let a = if t % 3 == 0 { 0 } else { t % 6 };
            [a, (a + 1 + t % 4) % 6]
        })
        .collect();
    let routing = Tensor::from_vec(ids, (n, k), &Device::Cpu)?;
    let g_ref = Groups::new(&routing, e)?;
    let g = Groups::new(&routing.to_device(&super::gpu())?, e)?;
    assert_eq!(g.counts()?[e - 1], 0, "an expert without rows is part of the test");
    let cfg = KernelConfig::default();
    for (dt, tol) in DTYPES {
        let mut inp = Inputs::new(dt);
        let tag = format!("grouped terms {dt:?}");
        let ((x, xr), (w, wr)) = (inp.make(&[n, h], 1.0)?, inp.make(&[e, o, h], 0.3)?);
        let ((xa, xar), (b, br)) = (inp.make(&[n * k, r], 1.0)?, inp.make(&[e, o, r], 0.3)?);
        let width = 2 * o + 3;
        let terms =
            [Term { x: &x, gathered: true, w: &w, col: 0 }, Term { x: &xa, gathered: false, w: &b, col: o + 3 }];
        let terms_ref =
            [Term { x: &xr, gathered: true, w: &wr, col: 0 }, Term { x: &xar, gathered: false, w: &br, col: o + 3 }];
        let before = super::super::LAUNCHES.load(Ordering::Relaxed);
        let y = grouped::forward_sum(&cfg, &g, &terms, width)?;
        assert_eq!(super::super::LAUNCHES.load(Ordering::Relaxed) - before, 2, "{tag}: one grouped call per term");
        expect_close(
            &format!("{tag} forward"),
            &y,
            &grouped::forward_sum(&cfg, &g_ref, &terms_ref, width)?,
            tol,
            inp.seed,
        )?;

        let (dy, dyr) = inp.make(&[n * k, width], 1.0)?;
        let (w2, w2r) = inp.make(&[e, o, h], 0.3)?;
        let gt = [GradTerm { dy: &dy, col: 0, w: &w }, GradTerm { dy: &dy, col: o + 3, w: &w2 }];
        let gt_ref = [GradTerm { dy: &dyr, col: 0, w: &wr }, GradTerm { dy: &dyr, col: o + 3, w: &w2r }];
        let dx = grouped::input_grad_sum(&cfg, &g, &gt)?;
        expect_close(
            &format!("{tag} input grad"),
            &dx,
            &grouped::input_grad_sum(&cfg, &g_ref, &gt_ref)?,
            tol,
            inp.seed,
        )?;

        let before = super::super::LAUNCHES.load(Ordering::Relaxed);
        let db = grouped::weight_grad(&cfg, &g, &dy, o + 3, o, &xa, false)?;
        assert_eq!(super::super::LAUNCHES.load(Ordering::Relaxed) - before, 1, "{tag}: one grouped call");
        expect_close(
            &format!("{tag} weight grad (columns)"),
            &db,
            &grouped::weight_grad(&cfg, &g_ref, &dyr, o + 3, o, &xar, false)?,
            tol,
            inp.seed,
        )?;
        let dw = grouped::weight_grad(&cfg, &g, &dy, 0, o, &x, true)?;
        let empty = dw.get(e - 1)?.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?;
        assert!(empty.iter().all(|&v| v == 0.0), "{tag}: an expert without rows gets a zero gradient");
        expect_close(
            &format!("{tag} weight grad (gathered)"),
            &dw,
            &grouped::weight_grad(&cfg, &g_ref, &dyr, 0, o, &xr, true)?,
            tol,
            inp.seed,
        )?;
    }
    Ok(())
}
