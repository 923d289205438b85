//! The serving kernels (paged attention, the fused prepare, the cache write, multi-LoRA and
//! sampling) against their CPU references, on fresh random inputs.

use super::*;
use crate::multi_lora::{self, LoraStack, RowAdapters};
use crate::paged_attention::{self, PagedMeta, SeqSlice};
use crate::sampling::{self, RowSampling};

const BS: usize = 16;

/// Sequences of a step as `(new rows, context)`, each with its own scattered blocks.
fn tables(seqs: &[(usize, usize)]) -> (Vec<Vec<u32>>, usize) {
    let mut next = 0u32;
    let mut out = Vec::new();
    for &(_, ctx) in seqs {
        let n = ctx.div_ceil(BS) as u32;
        // Interleave: every other block, so no table is contiguous.
        out.push((0..n).map(|i| next + 2 * i + 1).collect());
        next += 2 * n + 1;
    }
    (out, next as usize)
}

fn meta(seqs: &[(usize, usize)], tables: &[Vec<u32>], device: &Device) -> Result<PagedMeta> {
    let slices: Vec<SeqSlice> = seqs
        .iter()
        .zip(tables)
        .map(|(&(query_len, context_len), b)| SeqSlice { query_len, context_len, blocks: b })
        .collect();
    PagedMeta::new(BS, &slices, device)
}

#[test]
fn paged_attention_matches_the_reference_for_decodes_prefills_and_long_contexts() -> Result<()> {
    // A decode-only step (one long context: split over keys), mixed steps (prefill chunks
    // beside decodes, chunks after a cached prefix, chunks of several work items and a last
    // partial one), GQA 32/8, 16/8, 32/4, 48/3 and none; head sizes 64/128 (bf16: the
    // tensor-core kernel, whose decode rows of groups up to 8 heads take its `_g8` kernels and
    // 48/3's 16 its full ones) and 256 (bf16: the CUDA-core kernel, as f32 always).
    let steps: [&[(usize, usize)]; 4] = [
        &[(1, 3000), (1, 17), (1, 700)],
        &[(37, 37), (1, 64), (20, 531), (1, 1)],
        &[(1, 5)],
        &[(150, 700), (1, 900), (64, 64), (3, 40)],
    ];
    for (heads, kv, hd) in [(32, 8, 128), (16, 8, 64), (8, 8, 128), (32, 4, 128), (48, 3, 64), (16, 8, 256)] {
        for seqs in steps {
            let (tables, blocks) = tables(seqs);
            let (cpu_meta, gpu_meta) = (meta(seqs, &tables, &Device::Cpu)?, meta(seqs, &tables, &gpu())?);
            for (dt, tol) in DTYPES {
                let mut inp = Inputs::new(dt);
                let (q, qr) = inp.make(&[cpu_meta.rows(), heads, hd], 1.0)?;
                let ((kc, kcr), (vc, vcr)) =
                    (inp.make(&[blocks, BS, kv, hd], 1.0)?, inp.make(&[blocks, BS, kv, hd], 1.0)?);
                let scale = 1.0 / (hd as f64).sqrt();
                let got = fused(|| paged_attention::forward(&q, &kc, &vc, &gpu_meta, scale))?;
                let want = paged_attention::reference::forward(&qr, &kcr, &vcr, &cpu_meta, scale)?;
                expect_close(
                    &format!("paged attention {seqs:?} {heads}/{kv}×{hd} {dt:?}"),
                    &got,
                    &want,
                    tol,
                    inp.seed,
                )?;
            }
        }
    }
    Ok(())
}

#[test]
fn prepare_and_kv_write_match_the_reference() -> Result<()> {
    // Head sizes 128 and 64: a lane's elements whole (`prepare_unit_vec`); 96: element by element.
    for hd in [128, 64, 96] {
        prepare_and_kv_write_at(hd)?;
    }
    Ok(())
}

fn prepare_and_kv_write_at(hd: usize) -> Result<()> {
    let (n, heads, kv, blocks) = (19, 16, 4, 6);
    let positions: Vec<u32> = (0..n as u32).map(|i| i * 37 % 90).collect();
    let slots: Vec<u32> = (0..n as u32).map(|i| (i * 7 + 3) % (blocks * BS) as u32).collect();
    let slots: Vec<u32> = {
        let mut s = slots;
        s.sort();
        s.dedup();
        s
    };
    let n = slots.len();
    for (dt, tol) in DTYPES {
        let mut inp = Inputs::new(dt);
        let ((q, qr), (k, kr), (v, vr)) =
            (inp.make(&[n, heads, hd], 2.0)?, inp.make(&[n, kv, hd], 2.0)?, inp.make(&[n, kv, hd], 1.0)?);
        let ((qn, qnr), (kn, knr)) = (inp.make(&[hd], 1.0)?, inp.make(&[hd], 1.0)?);
        let (cos, sin) = crate::rope::tables(&positions[..n], hd, 1e6, dt, &gpu())?;
        let (cosr, sinr) = crate::rope::tables(&positions[..n], hd, 1e6, DType::F64, &Device::Cpu)?;
        let zeros = |d: &Device, t: DType| Tensor::zeros((blocks, BS, kv, hd), t, d);
        let (kc, vc, kcr, vcr) = (
            zeros(&gpu(), dt)?,
            zeros(&gpu(), dt)?,
            zeros(&Device::Cpu, DType::F64)?,
            zeros(&Device::Cpu, DType::F64)?,
        );
        let (s_gpu, s_cpu) = (Tensor::new(slots.as_slice(), &gpu())?, Tensor::new(slots.as_slice(), &Device::Cpu)?);
        let pack = |q: &Tensor, k: &Tensor, v: &Tensor| Tensor::cat(&[q, k, v], 1)?.reshape((n, (heads + 2 * kv) * hd));
        let (qkv, qkvr) = (pack(&q, &k, &v)?, pack(&qr, &kr, &vr)?);
        // With norms per head (Qwen3) and without (Instella normalises the whole projection first).
        for norms in [true, false] {
            let (g, r) = (norms.then_some((&qn, &kn, 1e-6)), norms.then_some((&qnr, &knr, 1e-6)));
            let got = fused(|| paged_attention::prepare(&qkv, heads, g, &cos, &sin, (&kc, &vc), &s_gpu))?;
            let want = paged_attention::reference::prepare(&qkvr, heads, r, &cosr, &sinr, (&kcr, &vcr), &s_cpu)?;
            expect_close(&format!("prepare q hd {hd} {dt:?} norms {norms}"), &got, &want, tol, inp.seed)?;
            expect_close(&format!("prepare k cache {dt:?} norms {norms}"), &kc, &kcr, tol, inp.seed)?;
            expect_close(&format!("prepare v cache {dt:?} norms {norms}"), &vc, &vcr, tol, inp.seed)?;
        }
        // The plain cache write, in place, every other slot untouched.
        let (kc2, vc2) = (zeros(&gpu(), dt)?, zeros(&gpu(), dt)?);
        fused(|| paged_attention::write_kv(&kc2, &vc2, &k, &v, &s_gpu))?;
        let (kw, vw) = (zeros(&Device::Cpu, DType::F64)?, zeros(&Device::Cpu, DType::F64)?);
        paged_attention::reference::write_kv(&kw, &vw, &kr, &vr, &s_cpu)?;
        expect_close(&format!("kv write k {dt:?}"), &kc2, &kw, 0.0, inp.seed)?;
        expect_close(&format!("kv write v {dt:?}"), &vc2, &vw, 0.0, inp.seed)?;
    }
    Ok(())
}

#[test]
fn multi_lora_matches_the_loop_over_adapters() -> Result<()> {
    let (n, d_in, d_out, r, slots) = (77, 256, 384, 16, 8);
    let ids: Vec<Option<u32>> = (0..n).map(|i| if i % 5 == 3 { None } else { Some((i * 3 % slots) as u32) }).collect();
    let cfg = crate::KernelConfig::default();
    // One projection, and packed groups of three (q/k/v-like) and two (gate/up-like) members.
    for members in [vec![d_out], vec![256, 64, 64], vec![192, 192]] {
        for (dt, tol) in DTYPES {
            let mut inp = Inputs::new(dt);
            let m = members.len();
            let ((x, xr), (w, wr)) = (inp.make(&[n, d_in], 1.0)?, inp.make(&[d_out, d_in], 1.0)?);
            let ((a, ar), (b, br)) = (inp.make(&[slots, m * r, d_in], 1.0)?, inp.make(&[slots, d_out, r], 1.0)?);
            let scales: Vec<f64> = (0..slots).map(|s| 0.5 + s as f64 / 4.0).collect();
            let stack = LoraStack { a, b, scales: scales.clone(), member_rows: members.clone() };
            let stack_r = LoraStack { a: ar, b: br, scales, member_rows: members.clone() };
            let got = fused(|| multi_lora::forward(&cfg, &x, &w, &stack, &RowAdapters::new(ids.clone(), &gpu())?))?;
            let want = multi_lora::reference::forward(
                &cfg,
                &xr,
                &wr,
                &stack_r,
                &RowAdapters::new(ids.clone(), &Device::Cpu)?,
            )?;
            expect_close(&format!("multi-LoRA {members:?} {dt:?}"), &got, &want, tol * 2.0, inp.seed)?;
        }
    }
    Ok(())
}

#[test]
fn device_sampling_picks_the_reference_s_tokens() -> Result<()> {
    let (rows, vocab) = (64, 151_936);
    let mut rng = seed();
    let mut next = || {
        rng = rng.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (rng >> 11) as f64 / (1u64 << 53) as f64
    };
    let settings: Vec<RowSampling> = (0..rows)
        .map(|i| RowSampling {
            temperature: [0.0, 0.7, 1.0, 1.3][i % 4],
            top_p: [1.0, 0.9, 0.5, 1.0][(i / 4) % 4],
            top_k: [0, 50, 1, 1000][(i / 16) % 4],
            uniform: next() as f32,
        })
        .collect();
    for dt in [DType::F32, DType::BF16] {
        let mut inp = Inputs::new(dt);
        let (logits, _) = inp.make(&[rows, vocab], 8.0)?;
        let got = sampling::sample(&logits, &settings)?;
        let host = logits.to_device(&Device::Cpu)?;
        let want = sampling::reference::sample(&host, &settings)?;
        let host = host.to_dtype(DType::F32)?.to_vec2::<f32>()?;
        let mut differ = 0;
        for (i, ((gt, gl), (wt, wl))) in got.iter().zip(&want).enumerate() {
            // Greedy rows must agree exactly; a sampled row may differ only where f32 sums put
            // the draw on the other side of a boundary the f64 reference drew: the kernel's token
            // must be the reference's for a uniform within 1e-3 of the row's. (Untruncated rows
            // at temperature 1.3 give each of 152k tokens ~1e-5 of the mass, below the f32 sum's
            // error, so a few such flips per run are expected; a bound of one flaked.)
            if gt != wt {
                differ += 1;
                let s = settings[i];
                assert!(s.temperature > 0.0 && s.top_k != 1, "row {i} ({s:?}): {gt} vs {wt}");
                let at = |u: f32| {
                    sampling::reference::row(&host[i], &RowSampling { uniform: u.clamp(0.0, 0.999_999), ..s }).0
                };
                let (lo, hi) = (at(s.uniform - 1e-3), at(s.uniform + 1e-3));
                assert!(lo <= *gt && *gt <= hi, "row {i} ({s:?}): {gt} is no draw near the reference's ({lo}..={hi})");
            } else {
                assert!((gl - wl).abs() < 1e-3, "row {i}: log-probability {gl} vs {wl}");
            }
        }
        println!("sampling {dt:?}: {differ} of {rows} rows differ from the f64 reference (seed {})", inp.seed);
        assert!(differ <= 8, "{differ} rows differ (seed {})", inp.seed);
        // Rows with no finite logit (NaN or −∞ throughout: diverged weights) draw token 0 with a
        // NaN log-probability, as the reference does, never an id past the vocabulary.
        let bad = Tensor::from_vec(
            [f32::NAN, f32::NEG_INFINITY].iter().flat_map(|&x| [x; 3 * 1000]).collect::<Vec<f32>>(),
            (6, 1000),
            &gpu(),
        )?
        .to_dtype(dt)?;
        let hot = RowSampling { temperature: 0.8, top_p: 0.9, top_k: 50, uniform: 0.5 };
        let modes = [RowSampling::GREEDY, hot, RowSampling { top_k: 0, top_p: 1.0, ..hot }];
        let modes: Vec<RowSampling> = modes.iter().chain(&modes).copied().collect();
        let got = sampling::sample(&bad, &modes)?;
        let want = sampling::reference::sample(&bad.to_device(&Device::Cpu)?, &modes)?;
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert!(g.0 == 0 && w.0 == 0 && g.1.is_nan() && w.1.is_nan(), "row {i}: {g:?}, reference {w:?}");
        }
    }
    Ok(())
}
