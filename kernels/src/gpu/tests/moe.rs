//! The mixture-of-experts ops on the GPU (the composed forms: per-expert cuBLAS GEMMs over the
//! sorted rows, candle's gathers) against the fused f64 CPU kernels, on fresh random routings
//! and inputs, f32 and bf16.

use super::{DTYPES, Inputs, expect_close};
use crate::KernelConfig;
use crate::moe::grouped::{GradTerm, Term};
use crate::moe::router::{self, LossTerms};
use crate::moe::{Groups, combine, glu, grouped};
use candle_core::{DType, Device, Result};

#[test]
fn moe_ops_match_the_f64_cpu_kernels() -> Result<()> {
    // 30B-A3B's routing (128 experts, 8 per token) at a small width, and a small odd case.
    for (n, e, k, h, f) in [(300, 128, 8, 64, 48), (77, 6, 2, 40, 24)] {
        for (dt, tol) in DTYPES {
            let mut inp = Inputs::new(dt);
            let tag = format!("moe {n} tokens {e}e top-{k} h{h} f{f} {dt:?}");
            let (logits, logits_ref) = inp.make(&[n, e], 3.0)?;
            let r = router::forward(&logits, k, true)?;
            let r_ref = router::forward(&logits_ref, k, true)?;
            // Same rounded logits on both sides: the same choice of experts.
            assert_eq!(r.experts.to_vec2::<u32>()?, r_ref.experts.to_vec2::<u32>()?, "{tag}: routing");
            expect_close(&format!("{tag} weights"), &r.weights, &r_ref.weights, tol, inp.seed)?;
            let (dw, dw_ref) = inp.make(&[n, k], 1.0)?;
            let (bal, bal_ref) = inp.make(&[e], 0.1)?;
            let terms = LossTerms { balance: Some(bal.to_dtype(DType::F32)?), z: 0.01, counted: None };
            let terms_ref = LossTerms { balance: Some(bal_ref), z: 0.01, counted: None };
            let dl = router::backward(&dw, &r, &terms)?;
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
