//! The flash attention kernels against the f64 reference, in both memory layouts and every
//! kernel family the device runs; and their times at the LoRA bench's shapes (ignored: run by
//! hand on a GPU).

use super::*;

#[test]
fn attention_matches_the_f64_reference() -> Result<()> {
    use crate::attention::{AttentionKernels, Mask};
    // GQA 8 over 2, head sizes 64, 80 (Instella's, mma.sync only) and 128; batch row 1 packs
    // three documents, row 0 one.
    let (b, heads, kv, t) = (2, 8, 2, 300);
    let mut segments = vec![0u32; b * t];
    for (i, s) in segments[t..].iter_mut().enumerate() {
        *s = if i < 70 {
            1
        } else if i < 250 {
            2
        } else {
            3
        };
    }
    let mask = Mask::new(&segments, b, t)?;
    // Every flash variant the plan can choose (bf16); f32 has one kernel.
    let variants =
        [(64, 1), (32, 1), (64, 2), (32, 4)].map(|(key_tile, dq_splits)| AttentionKernels { key_tile, dq_splits });
    for hd in [64, 80, 128] {
        let scale = 1.0 / (hd as f64).sqrt();
        for (dt, tol) in DTYPES {
            for &variant in if dt == DType::BF16 { &variants[..] } else { &variants[..1] } {
                let cfg = crate::KernelConfig::new(crate::linear::DEFAULT_BLOCK_ROWS, variant)?;
                let tag = format!("attention hd {hd} {dt:?} {variant:?}");
                attention_case(&cfg, &tag, &mask, [b, heads, kv, t, hd], scale, dt, tol, variant.deterministic())?;
            }
        }
    }
    Ok(())
}

/// One attention check: forward and backward against the f64 reference; a deterministic
/// backward must also give the same bits twice.
#[allow(clippy::too_many_arguments)]
fn attention_case(
    cfg: &crate::KernelConfig,
    tag: &str,
    mask: &crate::attention::Mask,
    [b, heads, kv, t, hd]: [usize; 5],
    scale: f64,
    dt: DType,
    tol: f64,
    deterministic: bool,
) -> Result<()> {
    use crate::attention;
    let mut inp = Inputs::new(dt);
    let (q, qr) = inp.make(&[b, heads, t, hd], 2.0)?;
    let ((k, kr), (v, vr)) = (inp.make(&[b, kv, t, hd], 2.0)?, inp.make(&[b, kv, t, hd], 1.0)?);
    let (dout, dor) = inp.make(&[b, heads, t, hd], 1.0)?;
    let (out, lse) = fused(|| attention::forward(cfg, &q, &k, &v, mask, scale))?;
    let (out_ref, lse_ref) = attention::forward(cfg, &qr, &kr, &vr, mask, scale)?;
    expect_close(&format!("{tag} out"), &out, &out_ref, tol, inp.seed)?;
    expect_close(&format!("{tag} lse"), &lse, &lse_ref, F32_TOL, inp.seed)?;
    let (dq, dk, dv) = fused(|| attention::backward(cfg, &dout, &q, &k, &v, &out, &lse, mask, scale))?;
    let (dq_ref, dk_ref, dv_ref) = attention::backward(cfg, &dor, &qr, &kr, &vr, &out_ref, &lse_ref, mask, scale)?;
    expect_close(&format!("{tag} dq"), &dq, &dq_ref, tol, inp.seed)?;
    expect_close(&format!("{tag} dk"), &dk, &dk_ref, tol, inp.seed)?;
    expect_close(&format!("{tag} dv"), &dv, &dv_ref, tol, inp.seed)?;
    if deterministic {
        let again = attention::backward(cfg, &dout, &q, &k, &v, &out, &lse, mask, scale)?;
        for (first, second) in [(&dq, &again.0), (&dk, &again.1), (&dv, &again.2)] {
            assert!(same_bits(first, second)?, "{tag}: reruns differ");
        }
    }
    // The model's layout: q, k, v (and dout, out) stored `[B, T, heads, hd]` and seen as
    // `[B, heads, T, hd]`. The flash kernels read and write it in place (the outputs come back
    // in it, not contiguous) with the same arithmetic, so the same bits; v and dout given in the
    // other layout than their family's are copied to it.
    let tokens_major = |x: &Tensor| x.transpose(1, 2)?.contiguous()?.transpose(1, 2);
    let (qt, kt) = (tokens_major(&q)?, tokens_major(&k)?);
    let (out_t, lse_t) = attention::forward(cfg, &qt, &kt, &v, mask, scale)?;
    let in_place = dt == DType::BF16 && matches!(hd, 64 | 80 | 128);
    assert_eq!(out_t.is_contiguous(), !in_place, "{tag}: output layout");
    assert!(same_bits(&out_t, &out)? && same_bits(&lse_t, &lse)?, "{tag}: strided forward differs");
    let (dq_t, dk_t, dv_t) =
        attention::backward(cfg, &dout, &qt, &kt, &tokens_major(&v)?, &out_t, &lse_t, mask, scale)?;
    assert_eq!(dk_t.is_contiguous(), !in_place, "{tag}: dk layout");
    if deterministic {
        for (strided, plain) in [(&dq_t, &dq), (&dk_t, &dk), (&dv_t, &dv)] {
            assert!(same_bits(strided, plain)?, "{tag}: strided backward differs");
        }
    } else {
        expect_close(&format!("{tag} strided dq"), &dq_t, &dq_ref, tol, inp.seed)?;
        expect_close(&format!("{tag} strided dk"), &dk_t, &dk_ref, tol, inp.seed)?;
    }
    // `backward` took the device's fastest kernels; each other family this build has for the
    // device is held to the reference too.
    if in_place {
        use crate::gpu::attention::{Flash, flash_backward, flash_forward};
        let kernels = cfg.attention();
        for family in Flash::available(&crate::gpu::device(&q)?, hd)?.into_iter().skip(1) {
            let (out_o, lse_o) = flash_forward(&q, &k, &v, mask, scale, kernels.key_tile, family)?;
            expect_close(&format!("{tag} {family:?} out"), &out_o, &out_ref, tol, inp.seed)?;
            expect_close(&format!("{tag} {family:?} lse"), &lse_o, &lse_ref, F32_TOL, inp.seed)?;
            let (dq_o, dk_o, dv_o) = flash_backward(&dout, &q, &k, &v, &out, &lse, mask, scale, kernels, family)?;
            expect_close(&format!("{tag} {family:?} dq"), &dq_o, &dq_ref, tol, inp.seed)?;
            expect_close(&format!("{tag} {family:?} dk"), &dk_o, &dk_ref, tol, inp.seed)?;
            expect_close(&format!("{tag} {family:?} dv"), &dv_o, &dv_ref, tol, inp.seed)?;
        }
    }
    Ok(())
}

/// Whether two tensors of one shape hold the same values bit for bit (in any layouts).
fn same_bits(a: &Tensor, b: &Tensor) -> Result<bool> {
    let bits = |x: &Tensor| x.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>();
    Ok(a.dims() == b.dims() && bits(a)?.iter().zip(bits(b)?).all(|(x, y)| x.to_bits() == y.to_bits()))
}

/// Times every flash kernel family and key tile at the 0.6B and 8B LoRA bench shapes (median of
/// 10 after 3 warm-ups, synchronised), tokens-major like the model: `--ignored --nocapture`.
#[test]
#[ignore]
fn flash_kernel_times() -> Result<()> {
    use crate::attention::{AttentionKernels, Mask};
    use crate::gpu::attention::{Flash, flash_backward, flash_forward};
    let dev = Device::new_cuda(0)?;
    let time = |f: &mut dyn FnMut() -> Result<()>| -> Result<f64> {
        for _ in 0..3 {
            f()?;
        }
        let mut ms = Vec::new();
        for _ in 0..10 {
            dev.synchronize()?;
            let t0 = std::time::Instant::now();
            f()?;
            dev.synchronize()?;
            ms.push(t0.elapsed().as_secs_f64() * 1e3);
        }
        ms.sort_by(f64::total_cmp);
        Ok(ms[5])
    };
    for (name, b, heads, kv) in [("0.6B", 8, 16, 8), ("8B", 2, 32, 8)] {
        let (t, hd) = (2048, 128);
        let mask = Mask::new(&vec![0u32; b * t], b, t)?;
        let r = |h: usize| -> Result<Tensor> {
            Tensor::randn(0f32, 1.0, (b, t, h, hd), &dev)?.to_dtype(DType::BF16)?.transpose(1, 2)
        };
        let (q, k, v, dout) = (r(heads)?, r(kv)?, r(kv)?, r(heads)?);
        let scale = 1.0 / (hd as f64).sqrt();
        for family in Flash::available(&crate::gpu::device(&q)?, hd)? {
            for key_tile in [32, 64] {
                let kernels = AttentionKernels { key_tile, dq_splits: 1 };
                let (out, lse) = flash_forward(&q, &k, &v, &mask, scale, key_tile, family)?;
                let fwd = time(&mut || flash_forward(&q, &k, &v, &mask, scale, key_tile, family).map(drop))?;
                let bwd = time(&mut || {
                    flash_backward(&dout, &q, &k, &v, &out, &lse, &mask, scale, kernels, family).map(drop)
                })?;
                println!("{name} {family:?} key tile {key_tile}: forward {fwd:.3} ms, backward {bwd:.3} ms");
            }
        }
    }
    Ok(())
}
