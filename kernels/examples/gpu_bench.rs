//! Times the fused GPU kernels at the shapes of a Qwen3 LoRA step, next to the two ceilings
//! measured on the same GPU in the same run (bf16 GEMM through cuBLAS, device memory
//! bandwidth through a read+write pass), and prints each kernel's floor: the larger of its
//! FLOPs over the GEMM ceiling and its bytes over the bandwidth (METHOD: the gap to the floor
//! says what bounds it). Inputs are random, never zeros. Built by scripts/build-gpu and run on
//! the GPU machine by scripts/gpu-bench-kernels. `gpu_bench decode` times only a decode step's
//! products (cuBLAS against the GEMV, rows 1 to 8).

use candle_core::{DType, Device, Result, Tensor};
use mindxtrain_kernels::attention::{self, Mask};
use mindxtrain_kernels::cross_entropy::Labels;
use mindxtrain_kernels::{KernelConfig, graph, linear, lm_head_ce, rmsnorm, swiglu};
use std::time::Instant;

/// Median wall time of `f` in ms over `reps` runs after 3 warm-ups, synchronised each run.
fn time<R>(dev: &Device, reps: usize, mut f: impl FnMut() -> Result<R>) -> Result<f64> {
    for _ in 0..3 {
        f()?;
    }
    dev.synchronize()?;
    let mut ms = Vec::with_capacity(reps);
    for _ in 0..reps {
        let t0 = Instant::now();
        f()?;
        dev.synchronize()?;
        ms.push(t0.elapsed().as_secs_f64() * 1e3);
    }
    ms.sort_by(f64::total_cmp);
    Ok(ms[reps / 2])
}

fn rand(shape: &[usize], dev: &Device) -> Result<Tensor> {
    Tensor::randn(0f32, 1.0, shape, dev)?.to_dtype(DType::BF16)
}

struct Ceilings {
    flops: f64,
    bytes: f64,
}

impl Ceilings {
    fn measure(dev: &Device) -> Result<Ceilings> {
        let n = 8192;
        let (a, b) = (rand(&[n, n], dev)?, rand(&[n, n], dev)?);
        let ms = time(dev, 10, || a.matmul(&b))?;
        let flops = 2.0 * (n as f64).powi(3) / (ms * 1e-3);
        let x = rand(&[512 * 1024 * 1024], dev)?; // 1 GiB of bf16
        // copy() is a device-to-device memcpy: the bandwidth every kernel here competes with.
        let ms_copy = time(dev, 10, || x.copy())?;
        let bytes = 2.0 * x.elem_count() as f64 * 2.0 / (ms_copy * 1e-3);
        println!(
            "ceilings: bf16 GEMM {:.0} TFLOP/s ({n}³ in {ms:.2} ms), read+write {:.2} TB/s",
            flops / 1e12,
            bytes / 1e12
        );
        Ok(Ceilings { flops, bytes })
    }

    fn report(&self, what: &str, ms: f64, flops: f64, bytes: f64) {
        let floor = (flops / self.flops).max(bytes / self.bytes) * 1e3;
        println!("{what:<44} {ms:>9.3} ms   floor {floor:>8.3} ms   {:>5.1}x floor", ms / floor);
    }
}

fn main() -> Result<()> {
    let dev = Device::new_cuda(0)?;
    let cfg = mindxtrain_kernels::KernelConfig::default();
    // The same measurement before and after keeping freed memory in the pool: candle allocates
    // every output, so the difference is what each op pays for allocation by default.
    print!("pool releases freed memory (default) -> ");
    Ceilings::measure(&dev)?;
    mindxtrain_kernels::cache_freed_memory(&dev)?;
    print!("pool keeps freed memory              -> ");
    let c = Ceilings::measure(&dev)?;
    if std::env::args().nth(1).as_deref() == Some("decode") {
        return decode_products(&dev, &c);
    }
    // (name, tokens, hidden, ffn, heads, kv heads, batch)
    for (name, tokens, hidden, ffn, heads, kv, batch) in
        [("0.6B", 16384, 1024, 3072, 16, 8, 8), ("8B", 4096, 4096, 12288, 32, 8, 2)]
    {
        let (t, hd) = (tokens / batch, 128);
        println!("-- Qwen3-{name} shapes: {batch}×{t} tokens");
        let x = rand(&[tokens, hidden], &dev)?;
        let w = rand(&[hidden], &dev)?;
        let (_, rstd) = rmsnorm::forward(&x, &w, 1e-6)?;
        let act = (tokens * hidden * 2) as f64;
        c.report("rmsnorm fwd", time(&dev, 20, || rmsnorm::forward(&x, &w, 1e-6))?, 0.0, 2.0 * act);
        c.report("rmsnorm+residual fwd", time(&dev, 20, || rmsnorm::add_forward(&x, &x, &w, 1e-6))?, 0.0, 4.0 * act);
        c.report(
            "rmsnorm bwd (dx, dw)",
            time(&dev, 20, || rmsnorm::backward(&x, &x, &w, &rstd, true))?,
            0.0,
            3.0 * act,
        );
        let (g, u) = (rand(&[tokens, ffn], &dev)?, rand(&[tokens, ffn], &dev)?);
        let fa = (tokens * ffn * 2) as f64;
        c.report("swiglu fwd", time(&dev, 20, || swiglu::forward(&g, &u))?, 0.0, 3.0 * fa);
        c.report("swiglu bwd", time(&dev, 20, || swiglu::backward(&g, &g, &u))?, 0.0, 5.0 * fa);
        let mask = Mask::new(&vec![0u32; tokens], batch, t)?;
        let (q, k, v) =
            (rand(&[batch, heads, t, hd], &dev)?, rand(&[batch, kv, t, hd], &dev)?, rand(&[batch, kv, t, hd], &dev)?);
        let scale = 1.0 / (hd as f64).sqrt();
        let (out, lse) = attention::forward(&cfg, &q, &k, &v, &mask, scale)?;
        // Causal: half of the T×T scores; 2 GEMMs forward, 5 backward (recomputing scores).
        let pairs = (batch * heads) as f64 * (t * t) as f64 / 2.0;
        let qb = (q.elem_count() * 2) as f64;
        c.report(
            "attention fwd",
            time(&dev, 5, || attention::forward(&cfg, &q, &k, &v, &mask, scale))?,
            4.0 * pairs * hd as f64,
            2.5 * qb,
        );
        c.report(
            "attention bwd",
            time(&dev, 3, || attention::backward(&cfg, &out, &q, &k, &v, &out, &lse, &mask, scale))?,
            10.0 * pairs * hd as f64,
            5.0 * qb,
        );
        let vocab = 151_936;
        let lm = rand(&[vocab, hidden], &dev)?;
        let ids: Vec<i64> = (0..tokens as i64).map(|i| i * 7919 % vocab as i64).collect();
        let labels = Labels::new(&ids, vocab, DType::BF16, &dev)?;
        let gemm = 2.0 * (tokens * vocab * hidden) as f64;
        for chunk in [8192, 32768] {
            let (_, lse) = lm_head_ce::forward(&cfg, &x, &lm, &labels, chunk)?;
            let dl = Tensor::ones(tokens, DType::F32, &dev)?;
            c.report(
                &format!("lm_head CE fwd (chunk {chunk})"),
                time(&dev, 5, || lm_head_ce::forward(&cfg, &x, &lm, &labels, chunk))?,
                gemm,
                0.0,
            );
            c.report(
                &format!("lm_head CE bwd (chunk {chunk}, dh only)"),
                time(&dev, 5, || lm_head_ce::backward(&cfg, &dl, &x, &lm, &lse, &labels, chunk, false))?,
                2.0 * gemm,
                0.0,
            );
        }
    }
    Ok(())
}

/// A decode step's `x·Wᵀ` at the Qwen3-8B shapes for 1 to 8 rows, through `linear::forward`
/// with the GEMV off (cuBLAS) and on. Each pass runs over ≥ 1 GiB of weight copies, so no
/// weight is still in the 60 MB L2 when it is read again, and is timed as a CUDA graph's replay:
/// a product of a few µs would otherwise time the host's launch.
fn decode_products(dev: &Device, c: &Ceilings) -> Result<()> {
    graph::pin_blas_workspace(dev)?;
    let (cublas, gemv) = (KernelConfig::default().with_gemv_rows(0), KernelConfig::default());
    println!("-- decode products x[rows, in]·Wᵀ, Qwen3-8B shapes: cuBLAS | GEMV (ms per product, GEMV speed-up)");
    for (name, out, inp) in [
        ("q, o", 4096, 4096),
        ("k, v", 1024, 4096),
        ("gate, up", 12_288, 4096),
        ("down", 4096, 12_288),
        ("lm_head", 151_936, 4096),
    ] {
        let bytes = out * inp * 2;
        let copies = (1usize << 30).div_ceil(bytes);
        let ws: Vec<Tensor> = (0..copies).map(|_| rand(&[out, inp], dev)).collect::<Result<_>>()?;
        for rows in [1, 2, 4, 8] {
            let x = rand(&[rows, inp], dev)?;
            let per_product = |cfg: &KernelConfig| -> Result<f64> {
                let pass = || ws.iter().try_for_each(|w| linear::forward(cfg, &x, w).map(drop));
                let g = graph::with_host_copies_cached(dev, || {
                    pass()?;
                    graph::capture(dev, pass)
                })?;
                Ok(time(dev, 10, || g.replay())? / copies as f64)
            };
            let (b, g) = (per_product(&cublas)?, per_product(&gemv)?);
            // The weight read once at the copy's rate (bytes read plus written per second).
            let floor = bytes as f64 / c.bytes * 1e3;
            println!(
                "{name:<9} {out:>6}x{inp:<5} rows {rows:>2}: {b:>7.4} | {g:>7.4} ms  ({:.2}x)   floor {floor:.4} ms, GEMV at {:.0}% of copy bandwidth",
                b / g,
                floor / g * 100.0
            );
        }
    }
    Ok(())
}
