//! The GPU kernels against the f64 CPU kernels on fresh random inputs (a new seed every run,
//! printed on failure), by ‖out − ref‖ / ‖ref‖: f32 arithmetic must land under 1e-5, bf16
//! storage under 1e-2. Outputs are NaN-poisoned before each launch (`alloc` under cfg(test)),
//! and NaN fails every comparison. Needs a CUDA device: run through `scripts/gpu-test`.

use crate::gradcheck::random;
use candle_core::{DType, Device, Result, Tensor};
use std::time::{SystemTime, UNIX_EPOCH};

const F32_TOL: f64 = 1e-5;
const BF16_TOL: f64 = 1e-2;
const DTYPES: [(DType, f64); 2] = [(DType::F32, F32_TOL), (DType::BF16, BF16_TOL)];

/// One device for every tensor: two `Device::new_cuda(0)` are different devices to candle,
/// and the kernels (rightly) refuse to mix them.
fn gpu() -> Device {
    static DEVICE: std::sync::OnceLock<Device> = std::sync::OnceLock::new();
    DEVICE.get_or_init(|| Device::new_cuda(0).expect("a CUDA device (these tests run on the GPU machine)")).clone()
}

/// Runs `f` and checks that it launched a fused kernel: a silent fallback to the composed
/// reference would otherwise pass every comparison.
fn fused<R>(f: impl FnOnce() -> Result<R>) -> Result<R> {
    use std::sync::atomic::Ordering;
    let before = super::LAUNCHES.load(Ordering::Relaxed);
    let r = f()?;
    assert!(super::LAUNCHES.load(Ordering::Relaxed) > before, "no fused kernel ran");
    Ok(r)
}

/// A fresh seed per call: the kernels must compute the same function on any input.
fn seed() -> u64 {
    let t = SystemTime::now().duration_since(UNIX_EPOCH).expect("clock after 1970").as_nanos() as u64;
    t ^ (std::process::id() as u64) << 32
}

/// Random inputs for one check: f64 values rounded through `dtype`, so the reference sees
/// exactly what the GPU sees. Returns (GPU tensor in `dtype`, CPU tensor in f64).
struct Inputs {
    seed: u64,
    dtype: DType,
}

impl Inputs {
    fn new(dtype: DType) -> Inputs {
        Inputs { seed: seed(), dtype }
    }
    fn make(&mut self, shape: &[usize], scale: f64) -> Result<(Tensor, Tensor)> {
        self.seed = self.seed.wrapping_add(0x9E37_79B9);
        let x = (random(shape, self.seed, &Device::Cpu)? * scale)?.to_dtype(self.dtype)?;
        Ok((x.to_device(&gpu())?, x.to_dtype(DType::F64)?))
    }
}

/// ‖got − want‖ / ‖want‖ in f64; NaN (so failing every bound) if `got` has a NaN.
fn rel_err(got: &Tensor, want: &Tensor) -> Result<f64> {
    assert_eq!(got.dims(), want.dims(), "shapes");
    let g = got.to_device(&Device::Cpu)?.to_dtype(DType::F64)?.flatten_all()?.to_vec1::<f64>()?;
    let w = want.to_dtype(DType::F64)?.flatten_all()?.to_vec1::<f64>()?;
    if g.iter().any(|v| !v.is_finite()) {
        return Ok(f64::NAN);
    }
    let diff: f64 = g.iter().zip(&w).map(|(a, b)| (a - b) * (a - b)).sum();
    let norm: f64 = w.iter().map(|b| b * b).sum();
    Ok((diff / norm).sqrt())
}

fn expect_close(what: &str, got: &Tensor, want: &Tensor, tol: f64, seed: u64) -> Result<()> {
    let err = rel_err(got, want)?;
    assert!(err <= tol, "{what}: relative error {err:e} over {tol:e} (seed {seed})");
    println!("{what}: relative error {err:.2e} (bound {tol:.0e})");
    Ok(())
}

/// Milliseconds a call of `f` takes on the GPU: one warm-up call, then the mean of three, the
/// device synchronised around them.
fn time_ms(f: &mut dyn FnMut() -> Result<()>) -> Result<f64> {
    const RUNS: u32 = 3;
    f()?;
    gpu().synchronize()?;
    let t0 = std::time::Instant::now();
    for _ in 0..RUNS {
        f()?;
    }
    gpu().synchronize()?;
    Ok(t0.elapsed().as_secs_f64() * 1e3 / f64::from(RUNS))
}

#[test]
fn poisoned_outputs_read_back_as_nan() -> Result<()> {
    let Device::Cuda(dev) = gpu() else { unreachable!() };
    let buf = super::alloc::<f32>(&dev, 1000)?;
    let t = super::tensor(buf, &dev, 1000);
    assert!(t.to_vec1::<f32>()?.iter().all(|v| v.is_nan()));
    let buf = super::alloc::<half::bf16>(&dev, 1000)?;
    let t = super::tensor(buf, &dev, 1000);
    assert!(t.to_dtype(DType::F32)?.to_vec1::<f32>()?.iter().all(|v| v.is_nan()));
    Ok(())
}

#[test]
fn rmsnorm_matches_the_f64_reference() -> Result<()> {
    // d = 100 (not a multiple of the warp), 128 (per-head norms), 4096 (8B hidden); rows past
    // several dw blocks with a partial last one. Below 1024 rows the forward runs one block per
    // row (1 and 64: decode batches); from 1024, rows of 1 KiB or more run a block per row sized
    // to two chunks a thread (1024×4096, 2048×1024: 64 threads in bf16), narrower ones one warp
    // per row. A block per row loads its row in 16-byte chunks where they fit: 1000 leaves threads
    // idle, 8192 fills four chunks a thread in bf16, 8200 is past that (and, in f32, not a whole
    // number of chunks): the element loop. The backward (one warp per row) reads 16-byte chunks
    // wherever d is a whole number of them (all but d = 100 in bf16).
    for (rows, d) in [
        (3 * 256 + 17, 100),
        (2000, 128),
        (600, 4096),
        (1, 4096),
        (64, 4096),
        (1024, 4096),
        (2048, 1024),
        (3, 1000),
        (1, 8192),
        (2, 8200),
    ] {
        for (dt, tol) in DTYPES {
            let mut inp = Inputs::new(dt);
            let ((x, xr), (w, wr), (dy, dyr)) =
                (inp.make(&[rows, d], 2.0)?, inp.make(&[d], 1.0)?, inp.make(&[rows, d], 1.0)?);
            let (y, rstd) = fused(|| crate::rmsnorm::forward(&x, &w, 1e-6))?;
            let (y_ref, rstd_ref) = crate::rmsnorm::forward(&xr, &wr, 1e-6)?;
            let tag = format!("rmsnorm {rows}x{d} {dt:?}");
            expect_close(&format!("{tag} y"), &y, &y_ref, tol, inp.seed)?;
            expect_close(&format!("{tag} rstd"), &rstd, &rstd_ref, F32_TOL, inp.seed)?;
            let (dx, dw) = fused(|| crate::rmsnorm::backward(&dy, &x, &w, &rstd, true))?;
            let (dx_ref, dw_ref) = crate::rmsnorm::backward(&dyr, &xr, &wr, &rstd_ref, true)?;
            expect_close(&format!("{tag} dx"), &dx, &dx_ref, tol, inp.seed)?;
            expect_close(&format!("{tag} dw"), &dw.unwrap(), &dw_ref.unwrap(), tol, inp.seed)?;
            // Deterministic: no atomics, fixed reduction order.
            let (dx2, dw2) = crate::rmsnorm::backward(&dy, &x, &w, &rstd, true)?;
            assert!(dx.eq(&dx2)?.to_dtype(DType::F32)?.min_all()?.to_scalar::<f32>()? == 1.0);
            let (a, b) = (crate::rmsnorm::backward(&dy, &x, &w, &rstd, true)?.1.unwrap(), dw2.unwrap());
            assert_eq!(a.to_dtype(DType::F32)?.to_vec1::<f32>()?, b.to_dtype(DType::F32)?.to_vec1::<f32>()?);
            assert!(crate::rmsnorm::backward(&dy, &x, &w, &rstd, false)?.1.is_none());

            let (r, rr) = inp.make(&[rows, d], 1.0)?;
            let (s, y, _) = fused(|| crate::rmsnorm::add_forward(&x, &r, &w, 1e-6))?;
            // The reference adds in f64 then rounds the sum to the dtype, as the kernel stores it.
            let s_ref = (&xr + &rr)?.to_dtype(dt)?.to_dtype(DType::F64)?;
            let (y_ref, _) = crate::rmsnorm::forward(&s_ref, &wr, 1e-6)?;
            expect_close(&format!("{tag} add+norm s"), &s, &s_ref, tol, inp.seed)?;
            expect_close(&format!("{tag} add+norm y"), &y, &y_ref, tol, inp.seed)?;
            // The trainer's block swaps a separate add and norm for this: the same bits.
            let s_sep = (&x + &r)?;
            let (y_sep, _) = crate::rmsnorm::forward(&s_sep, &w, 1e-6)?;
            for (name, f, sep) in [("s", &s, &s_sep), ("y", &y, &y_sep)] {
                let same = f.eq(sep)?.to_dtype(DType::F32)?.min_all()?.to_scalar::<f32>()?;
                assert_eq!(same, 1.0, "{tag}: fused add+norm {name} differs from add then norm");
            }
        }
    }
    Ok(())
}

#[test]
fn swiglu_matches_the_f64_reference() -> Result<()> {
    for (dt, tol) in DTYPES {
        let mut inp = Inputs::new(dt);
        // Gates over ±12 so both tails of the sigmoid are exercised; an odd size.
        let shape = [777, 3001];
        let ((g, gr), (u, ur), (dh, dhr)) = (inp.make(&shape, 12.0)?, inp.make(&shape, 1.0)?, inp.make(&shape, 1.0)?);
        let tag = format!("swiglu {dt:?}");
        expect_close(
            &format!("{tag} h"),
            &fused(|| crate::swiglu::forward(&g, &u))?,
            &crate::swiglu::forward(&gr, &ur)?,
            tol,
            inp.seed,
        )?;
        // The packed form ([gate | up] per row, a serving step's one GEMM) computes the same bits,
        // element by element (3001 wide) and in 16-byte chunks (3000).
        for f in [3001, 3000] {
            let (g, u) = (g.narrow(1, 0, f)?.contiguous()?, u.narrow(1, 0, f)?.contiguous()?);
            let packed = fused(|| crate::swiglu::forward_packed(&Tensor::cat(&[&g, &u], 1)?))?;
            let want = crate::swiglu::forward(&g, &u)?;
            expect_close(&format!("{tag} packed h, f = {f}"), &packed, &want, 0.0, inp.seed)?;
        }
        let (dg, du) = fused(|| crate::swiglu::backward(&dh, &g, &u))?;
        let (dg_ref, du_ref) = crate::swiglu::backward(&dhr, &gr, &ur)?;
        expect_close(&format!("{tag} dgate"), &dg, &dg_ref, tol, inp.seed)?;
        expect_close(&format!("{tag} dup"), &du, &du_ref, tol, inp.seed)?;
        // 3000 wide, the element count is a whole number of 16-byte chunks: the chunked kernels
        // give the element kernels' bits (the 3001-wide results' first 3000 columns).
        let cut = |t: &Tensor| t.narrow(1, 0, 3000)?.contiguous();
        let (g8, u8_, dh8) = (cut(&g)?, cut(&u)?, cut(&dh)?);
        let h = fused(|| crate::swiglu::forward(&g, &u))?;
        expect_close(&format!("{tag} chunked h"), &crate::swiglu::forward(&g8, &u8_)?, &cut(&h)?, 0.0, inp.seed)?;
        let (dg8, du8) = crate::swiglu::backward(&dh8, &g8, &u8_)?;
        expect_close(&format!("{tag} chunked dgate"), &dg8, &cut(&dg)?, 0.0, inp.seed)?;
        expect_close(&format!("{tag} chunked dup"), &du8, &cut(&du)?, 0.0, inp.seed)?;
        // The packed backward (MoE experts' fused gate/up) writes the same bits in [dg | du] rows.
        let packed = fused(|| crate::swiglu::backward_packed(&dh, &Tensor::cat(&[&g, &u], 1)?))?;
        expect_close(&format!("{tag} packed d[gate|up]"), &packed, &Tensor::cat(&[&dg, &du], 1)?, 0.0, inp.seed)?;
    }
    Ok(())
}

#[test]
fn sums_of_squares_match_the_f64_reference() -> Result<()> {
    for (dt, _) in DTYPES {
        let mut inp = Inputs::new(dt);
        // One element, part of a block, a ragged last block, and more than 1024 blocks' worth.
        let made: Vec<(Tensor, Tensor)> = [vec![1], vec![1000], vec![4096, 2049], vec![1_234_567]]
            .iter()
            .map(|s| inp.make(s, 3.0))
            .collect::<Result<_>>()?;
        let on_gpu: Vec<&Tensor> = made.iter().map(|m| &m.0).collect();
        let got = fused(|| crate::reduce::sum_squares(&on_gpu))?;
        assert_eq!(got, crate::reduce::sum_squares(&on_gpu)?, "{dt:?}: the same bits twice (seed {})", inp.seed);
        for ((t, want), got) in made.iter().zip(&got) {
            // The same rounded values on both sides, squared and added in f64: only the order
            // differs, and a sum of n non-negative terms in any order is within (n − 1)·u of the
            // exact one (u = ε/2), so two orders differ by at most n·ε relatively. (A fixed 1e-12
            // failed on an H200 at 8.4 M terms: 1.03e-12, 2026-11-28; the bound there is 1.9e-9.)
            let want = crate::reduce::reference(want)?;
            let rel = (got - want).abs() / want;
            let bound = t.elem_count() as f64 * f64::EPSILON;
            assert!(
                rel <= bound,
                "{dt:?} {:?}: {got} vs {want} (rel {rel:e} > {bound:e}, seed {})",
                t.dims(),
                inp.seed
            );
        }
    }
    Ok(())
}

#[test]
fn rope_matches_the_f64_reference() -> Result<()> {
    for (dt, tol) in DTYPES {
        let mut inp = Inputs::new(dt);
        let (tokens, heads, hd) = (1000, 16, 128);
        let positions: Vec<u32> = (0..tokens as u32).map(|p| (p * 7919) % 4096).collect();
        let (cos_r, sin_r) = crate::rope::tables(&positions, hd, 1e6, DType::F64, &Device::Cpu)?;
        let round = |t: &Tensor| -> Result<Tensor> { t.to_dtype(dt)?.to_dtype(DType::F64) };
        let (cos_r, sin_r) = (round(&cos_r)?.reshape((tokens, 1, hd))?, round(&sin_r)?.reshape((tokens, 1, hd))?);
        let (cos, sin) = (cos_r.to_dtype(dt)?.to_device(&gpu())?, sin_r.to_dtype(dt)?.to_device(&gpu())?);
        let ((x, xr), (dy, dyr)) = (inp.make(&[tokens, heads, hd], 1.0)?, inp.make(&[tokens, heads, hd], 1.0)?);
        let tag = format!("rope {dt:?}");
        let (y, y_ref) = (fused(|| crate::rope::forward(&x, &cos, &sin))?, crate::rope::forward(&xr, &cos_r, &sin_r)?);
        expect_close(&format!("{tag} y"), &y, &y_ref, tol, inp.seed)?;
        let (dx, dx_ref) =
            (fused(|| crate::rope::backward(&dy, &cos, &sin))?, crate::rope::backward(&dyr, &cos_r, &sin_r)?);
        expect_close(&format!("{tag} dx"), &dx, &dx_ref, tol, inp.seed)?;
    }
    Ok(())
}

#[test]
fn adamw_matches_the_cpu_update() -> Result<()> {
    for (dt, tol) in DTYPES {
        let mut inp = Inputs::new(dt);
        let n = [1000, 333];
        let (p, pr) = inp.make(&n, 1.0)?;
        let (g, gr) = inp.make(&n, 0.1)?;
        // Moments as after some steps: m of either sign, v positive.
        let (m, mr) = {
            let mut f = Inputs { seed: inp.seed, dtype: DType::F32 };
            f.make(&n, 0.01)?
        };
        let v_r = mr.sqr()?.affine(3.0, 1e-6)?;
        let v = v_r.to_dtype(DType::F32)?.to_device(&gpu())?;
        for (step, decay) in [(1, true), (7, false)] {
            // lr 1e-2: steps of ~1e-2, far above f32 rounding of p (~1e-7), so Δp is measurable.
            let k = crate::adamw::Coefficients::new([0.9, 0.999], 1e-8, 0.01, 1e-2, step);
            let (p1, m1, v1) = fused(|| crate::adamw::step(&k, decay, &p, &g, &m, &v))?;
            // The CPU update in f32 on the same (rounded) values is the reference.
            let c = |t: &Tensor| t.to_dtype(DType::F32);
            let (p_ref, m_ref, v_ref) = crate::adamw::step(&k, decay, &c(&pr)?, &c(&gr)?, &c(&mr)?, &c(&v_r)?)?;
            let tag = format!("adamw step {step} {dt:?}");
            expect_close(&format!("{tag} m"), &m1, &m_ref, F32_TOL, inp.seed)?;
            expect_close(&format!("{tag} v"), &v1, &v_ref, F32_TOL, inp.seed)?;
            if dt == DType::F32 {
                // Compare the change: p itself would hide an update error under its magnitude.
                let f64_of = |t: &Tensor| t.to_dtype(DType::F64);
                let (dp, dp_ref) = ((f64_of(&p1)? - f64_of(&p)?)?, (f64_of(&p_ref)? - &pr)?);
                expect_close(&format!("{tag} Δp"), &dp, &dp_ref, 1e-4, inp.seed)?;
            } else {
                // bf16: the kernel rounds the f32 result once, so it must equal the rounded
                // reference except where f32 rounding differences cross a bf16 boundary.
                let got = p1.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?;
                let want = p_ref.to_dtype(DType::BF16)?.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?;
                let off = got.iter().zip(&want).filter(|(a, b)| a != b).count();
                assert!(
                    off * 1000 <= got.len(),
                    "{tag}: {off} of {} differ from the rounded reference (seed {})",
                    got.len(),
                    inp.seed
                );
                println!("{tag}: {off} of {} elements off the rounded reference", got.len());
            }
            expect_close(&format!("{tag} p"), &p1, &p_ref, tol, inp.seed)?;
        }
    }
    Ok(())
}

#[test]
fn lm_head_cross_entropy_matches_full_logits_in_f64() -> Result<()> {
    use crate::cross_entropy::{self, Labels};
    let (n, d, v, chunk) = (300, 256, 5000, 1536);
    for (dt, tol) in DTYPES {
        let mut inp = Inputs::new(dt);
        let ((h, hr), (w, wr), (dl, dlr)) = (inp.make(&[n, d], 1.0)?, inp.make(&[v, d], 0.3)?, inp.make(&[n], 1.0)?);
        let ids: Vec<i64> = (0..n as i64)
            .map(|i| if i % 9 == 4 { -100 } else { (i * 7919 + inp.seed as i64 % 97) % v as i64 })
            .collect();
        let labels = Labels::new(&ids, v, dt, &gpu())?;
        let labels_r = Labels::new(&ids, v, DType::F64, &Device::Cpu)?;
        let (l, lse) = fused(|| crate::lm_head_ce::forward(&Default::default(), &h, &w, &labels, chunk))?;
        let logits = hr.matmul(&wr.t()?)?;
        let (l_ref, lse_ref) = cross_entropy::forward(&logits, &labels_r)?;
        let tag = format!("lm_head ce {dt:?}");
        expect_close(&format!("{tag} losses"), &l, &l_ref, tol, inp.seed)?;
        expect_close(&format!("{tag} lse"), &lse, &lse_ref, tol, inp.seed)?;
        let (dh, dw) =
            fused(|| crate::lm_head_ce::backward(&Default::default(), &dl, &h, &w, &lse, &labels, chunk, true))?;
        let g = cross_entropy::backward(&dlr, &logits, &lse_ref, &labels_r)?;
        expect_close(&format!("{tag} dh"), &dh, &g.matmul(&wr)?, tol, inp.seed)?;
        expect_close(&format!("{tag} dw"), &dw.unwrap(), &g.t()?.matmul(&hr)?, tol, inp.seed)?;
    }
    Ok(())
}

#[test]
fn gemm_sums_match_the_f64_reference() -> Result<()> {
    use crate::linear;
    // A projection with its LoRA branch (forward) and two projections' input gradients
    // plus a branch (backward); odd sizes so no dimension is a tile multiple.
    let (n, d_in, d_out, r) = (300, 200, 130, 16);
    let cfg = crate::KernelConfig::default();
    for (dt, tol) in DTYPES {
        let mut inp = Inputs::new(dt);
        let ((x, xr), (w, wr)) = (inp.make(&[n, d_in], 1.0)?, inp.make(&[d_out, d_in], 1.0)?);
        let ((xa, xar), (b, br)) = (inp.make(&[n, r], 1.0)?, inp.make(&[d_out, r], 1.0)?);
        let y = fused(|| linear::forward_sum(&cfg, &[(&x, &w), (&xa, &b)]))?;
        let want = (xr.matmul(&wr.t()?)? + xar.matmul(&br.t()?)?)?;
        expect_close(&format!("x·Wᵀ + xa·Bᵀ {dt:?}"), &y, &want, tol, inp.seed)?;
        let ((dy, dyr), (dy2, dy2r)) = (inp.make(&[n, d_out], 1.0)?, inp.make(&[n, d_out], 1.0)?);
        let ((w2, w2r), (dxa, dxar), (a, ar)) =
            (inp.make(&[d_out, d_in], 1.0)?, inp.make(&[n, r], 1.0)?, inp.make(&[r, d_in], 1.0)?);
        let dx = fused(|| linear::input_grad_sum(&cfg, &[(&dy, &w), (&dy2, &w2), (&dxa, &a)]))?;
        let want = ((dyr.matmul(&wr)? + dy2r.matmul(&w2r)?)? + dxar.matmul(&ar)?)?;
        expect_close(&format!("dy·W + dy₂·W₂ + dxa·A {dt:?}"), &dx, &want, tol, inp.seed)?;
    }
    Ok(())
}

#[test]
fn every_planned_gemm_algorithm_computes_the_same_products() -> Result<()> {
    use crate::gemm_algos::{self, GemmAlgo};
    use crate::linear;
    // Shapes of a LoRA projection at small scale: the base forward, its input gradient, a
    // weight gradient, and a thin rank-16 product.
    let (n, d_in, d_out) = (512, 256, 384);
    for (dt, tol) in DTYPES {
        let mut inp = Inputs::new(dt);
        let ((x, xr), (w, wr), (dy, dyr)) =
            (inp.make(&[n, d_in], 1.0)?, inp.make(&[d_out, d_in], 1.0)?, inp.make(&[n, d_out], 1.0)?);
        let ops = |cfg: &crate::KernelConfig, x: &Tensor, w: &Tensor, dy: &Tensor| -> Result<[Tensor; 3]> {
            Ok([
                linear::forward(cfg, x, w)?,
                linear::input_grad_sum(cfg, &[(dy, w)])?,
                linear::weight_grad(cfg, dy, x)?,
            ])
        };
        let (recording, log) = crate::KernelConfig::default().recording_shapes();
        let defaults = fused(|| ops(&recording, &x, &w, &dy))?;
        let shapes = log.shapes();
        assert_eq!(shapes.len(), 3, "{shapes:?}");
        let want = [xr.matmul(&wr.t()?)?, dyr.matmul(&wr)?, dyr.t()?.matmul(&xr)?];
        for (got, want) in defaults.iter().zip(&want) {
            expect_close(&format!("default gemm {dt:?} {:?}", got.dims()), got, want, tol, inp.seed)?;
        }
        for shape in &shapes {
            let timings = gemm_algos::time_candidates(&gpu(), shape, 4, 1.0)?;
            println!("{shape:?}: {:?}", timings.iter().map(|t| (t.algo.label(), t.us)).collect::<Vec<_>>());
            assert!(timings.len() >= 2, "cuBLASLt proposed no algorithm for {shape:?}");
            for t in &timings {
                assert!(t.us.is_some_and(|us| us > 0.0), "{shape:?} {}: {:?}", t.algo.label(), t.error);
            }
            // Every Lt candidate, installed for this shape alone, gives the reference's products.
            for t in timings.iter().filter(|t| t.algo != GemmAlgo::Default) {
                let cfg = crate::KernelConfig::default()
                    .with_gemm_algos([(*shape, t.algo.clone())])
                    .map_err(candle_core::Error::Msg)?;
                for (got, want) in ops(&cfg, &x, &w, &dy)?.iter().zip(&want) {
                    expect_close(&format!("{} {shape:?} {dt:?}", t.algo.label()), got, want, tol, inp.seed)?;
                }
            }
        }
    }
    Ok(())
}

#[test]
fn nf4_dequant_matmul_matches_the_host_dequantisation() -> Result<()> {
    use crate::nf4::{self, BLOCK, Nf4Weight};
    // Odd sizes: a partial last scale block, a tile that does not divide the rows, an odd
    // element count so the last code byte is half used.
    let (rows, cols, tile): (usize, usize, usize) = (999, 257, 128);
    let n = rows * cols;
    let s = seed();
    let codes: Vec<u8> = (0..n.div_ceil(2)).map(|i| ((i as u64).wrapping_mul(s | 1) >> 17) as u8).collect();
    let scales: Vec<f32> = (0..n.div_ceil(BLOCK)).map(|b| 0.01 + ((b as u64 ^ s) % 100) as f32 * 1e-3).collect();
    let host = Nf4Weight::new(
        Tensor::new(codes.as_slice(), &Device::Cpu)?,
        Tensor::new(scales.as_slice(), &Device::Cpu)?,
        rows,
        cols,
    )?;
    let dev = Nf4Weight::new(host.codes.to_device(&gpu())?, host.scales.to_device(&gpu())?, rows, cols)?;
    let dense = host.dequantize_rows(0, rows, DType::F64)?;
    for (dt, tol) in DTYPES {
        let mut inp = Inputs::new(dt);
        let ((x, xr), (dy, dyr)) = (inp.make(&[300, cols], 1.0)?, inp.make(&[300, rows], 1.0)?);
        let tag = format!("nf4 {dt:?}");
        let w = fused(|| dev.dequantize_rows(0, rows, dt))?;
        // Levels × f32 scales are exact in f32; bf16 rounds each value once.
        expect_close(&format!("{tag} dequantised"), &w, &dense, if dt == DType::F32 { 0.0 } else { tol }, inp.seed)?;
        let y = fused(|| nf4::matmul_t(&x, &dev, tile))?;
        expect_close(&format!("{tag} x·Wᵀ"), &y, &xr.matmul(&dense.t()?)?, tol, inp.seed)?;
        let dx = fused(|| nf4::matmul(&dy, &dev, tile))?;
        expect_close(&format!("{tag} dy·W"), &dx, &dyr.matmul(&dense)?, tol, inp.seed)?;
    }
    Ok(())
}

/// The weight init's draws: each value the host's (`seeded::host`) up to the last bits of `log`
/// and `cos`, over block edges, a last partial block and draw indices past 2^22 (where `2j + 1`
/// times γ wraps many times).
#[test]
fn seeded_dropout_masks_are_the_hosts_bit_for_bit() -> Result<()> {
    use crate::seeded;
    let state = seed();
    for (p, n) in [(0.05, 4 * 2048 * 2560 + 7), (0.5, 1000)] {
        let got = fused(|| seeded::dropout_mask(state, p, &[n], DType::F32, &gpu()))?.to_vec1::<f32>()?;
        let want = seeded::dropout_host(state, p, (1.0 / (1.0 - p)) as f32, n);
        let first_diff = got.iter().zip(&want).position(|(g, w)| g.to_bits() != w.to_bits());
        assert_eq!(first_diff, None, "p {p}, {n} values, state {state}");
    }
    Ok(())
}

#[test]
fn seeded_normal_matches_the_host_draws() -> Result<()> {
    use crate::seeded;
    let mut s = seed();
    let mut next = || {
        s = s.wrapping_add(seeded::GAMMA);
        seeded::mix(s)
    };
    for (block, n) in [(1000usize, 12_345usize), (1 << 22, (1 << 22) + 5000)] {
        let states: Vec<u64> = (0..n.div_ceil(block)).map(|_| next()).collect();
        let got = fused(|| seeded::normal(&states, block, n, 0.02, &gpu()))?;
        assert_eq!(got.dims(), [n]);
        let got = got.to_vec1::<f64>()?;
        let want = seeded::host(&states, block, n, 0.02)?;
        let mut exact = 0;
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert!(
                (g - w).abs() <= 1e-13 * w.abs(),
                "value {i} of {n} (block {block}): {g} vs host {w} (states {states:?})"
            );
            exact += usize::from(g == w);
        }
        // The same function, not merely a close one: most values have the host's bits (86%
        // on an H200: CUDA's log and cos differ from glibc's in the last bit or two), the rest
        // are within the 1e-13 above; a different draw would miss both by orders of magnitude.
        assert!(exact as f64 >= 0.5 * n as f64, "{exact} of {n} values with the host's bits");
        println!("seeded normal, blocks of {block}: {exact} of {n} values bitwise the host's, the rest within 1e-13");
        // Deterministic on the device.
        assert_eq!(seeded::normal(&states, block, n, 0.02, &gpu())?.to_vec1::<f64>()?, got);
    }
    Ok(())
}

mod attention;
mod causal_conv1d;
mod delta_rule;
mod gemv;
mod moe;
mod serving;
