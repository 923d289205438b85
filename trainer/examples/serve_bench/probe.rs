//! The probes of `serve_bench probe=…`: where a decode step's time goes at each batch size
//! (launch against step, each process-wide setting, graph replays), a decode step's GEMM shapes
//! against cuBLASLt's candidates, and a prefill step. Each prints JSON through `emit`.

use std::time::Instant;

#[cfg(feature = "cuda")]
use candle_core::Device;
use mindxtrain_kernels::sampling::RowSampling;
use mindxtrain_trainer::infer::runner::{Runner, RunnerConfig, StepSeq};
use mindxtrain_trainer::infer::sampler;
use mindxtrain_trainer::model::CausalLm;
use serde_json::{Value, json};

use super::{Res, percentile, sync, tokens};

/// Where a decode step's time goes, at each batch size with every sequence `ctx` tokens deep:
/// the host's time to launch the step (`Runner::forward` returns before the device is done)
/// against the whole step (sampled, so waited for). Launch ≈ step means the host is the bound;
/// a step near `(weight + cache bytes) / bandwidth` means the device's memory is. With
/// `MINDXTRAIN_PROFILE` set, the ops' table too (each op then waits for the device).
pub(super) fn decode_probe(model: &CausalLm, probe: &Probe, ctx: usize, emit: &mut impl FnMut(Value)) -> Res<()> {
    let batches = &probe.batches;
    let (block, dev, c) = (16usize, model.device().clone(), model.config().clone());
    let per_seq = (ctx + 1).div_ceil(block);
    let most = batches.iter().copied().max().unwrap_or(1);
    let sized = |cuda_graphs| RunnerConfig {
        block_size: block,
        blocks: most * per_seq,
        state_slots: most,
        vocab: c.vocab_size,
        max_model_len: ctx + 1,
        cuda_graphs,
    };
    let runner = Runner::new(model.clone(), sized(false))?;
    let (ids, tables) = decode_fixture(most, per_seq, c.vocab_size);
    // Attention reads the cache's bytes whatever they hold: zeros time like real keys.
    let kv_bytes_per_token =
        2 * c.num_hidden_layers * c.num_key_value_heads * c.head_dim * model.dtype().size_in_bytes();
    // The process-wide settings, in the order they can be turned on: the pool as it was before
    // the engine kept freed memory, the pool kept (what `Engine::new` does), and allocations
    // without cudarc's two CUDA events each (only safe on one stream: measured, not used).
    // Last, the step as the engine runs it: a decode step replays its bucket's CUDA graph.
    // Each `_cublas` twin is the step before it with every projection on cuBLAS rather than the
    // few-row GEMV (`KernelConfig::with_gemv_rows(0)`), timed in the same process.
    let mut cublas = model.clone();
    cublas.set_kernels(model.kernels().clone().with_gemv_rows(0));
    let cublas_runner = Runner::new(cublas.clone(), sized(false))?;
    let variants = [
        "pool_default",
        "pool_kept",
        "pool_kept_no_event_tracking",
        "no_event_tracking_cublas",
        "cuda_graph",
        "cuda_graph_cublas",
        "cuda_graph_cuda_core_attention",
    ];
    // The process-wide settings of an earlier variant stay on for a later one even where the
    // filter skips the earlier's timing.
    for variant in variants {
        match variant {
            "pool_kept" => mindxtrain_kernels::cache_freed_memory(&dev)?,
            #[cfg(feature = "cuda")]
            "pool_kept_no_event_tracking" => {
                if let Device::Cuda(d) = &dev {
                    // SAFETY: this process runs one stream, so no slice is shared across streams.
                    unsafe { d.disable_event_tracking() }
                }
            }
            _ => {}
        }
        if !probe.variants.as_ref().is_none_or(|only| only.iter().any(|v| v == variant)) {
            continue;
        }
        // `cuda_graph` again with the tensor-core attention's split aimed at other block counts.
        if variant == "cuda_graph" {
            for busy in &probe.busy_blocks {
                mindxtrain_kernels::paged_attention::tensor_core_busy_blocks(Some(*busy));
                let runner = Runner::new(model.clone(), sized(true))?;
                let label = format!("cuda_graph_tc_busy_{busy}");
                for &b in batches.iter().filter(|&&b| b > 0) {
                    probe_batch(&runner, b, (&ids, &tables, ctx), (&label, probe.steps), kv_bytes_per_token, emit)?;
                }
            }
            mindxtrain_kernels::paged_attention::tensor_core_busy_blocks(None);
        }
        // The last variant times bf16 attention on the CUDA-core kernel (the tensor-core one is
        // the default): its graphs are recorded with that kernel.
        mindxtrain_kernels::paged_attention::use_tensor_cores(variant != "cuda_graph_cuda_core_attention");
        let graphed = match variant {
            "cuda_graph" | "cuda_graph_cuda_core_attention" => Some(Runner::new(model.clone(), sized(true))?),
            "cuda_graph_cublas" => Some(Runner::new(cublas.clone(), sized(true))?),
            _ => None,
        };
        let direct = if variant == "no_event_tracking_cublas" { &cublas_runner } else { &runner };
        for &b in batches.iter().filter(|&&b| b > 0) {
            let runner = graphed.as_ref().unwrap_or(direct);
            probe_batch(runner, b, (&ids, &tables, ctx), (variant, probe.steps), kv_bytes_per_token, emit)?;
        }
    }
    Ok(())
}

/// `b` sequences of one token each, sequence `i` in blocks `i·per_seq ..` of its own.
fn decode_fixture(b: usize, per_seq: usize, vocab: usize) -> (Vec<[u32; 1]>, Vec<Vec<u32>>) {
    let ids = (0..b).map(|i| [(i * 7919 % vocab) as u32]).collect();
    let tables = (0..b).map(|i| (i * per_seq..(i + 1) * per_seq).map(|x| x as u32).collect()).collect();
    (ids, tables)
}

/// One greedy decode row per sequence, each `ctx` tokens deep.
fn decode_rows<'a>(ids: &'a [[u32; 1]], tables: &'a [Vec<u32>], ctx: usize) -> Vec<StepSeq<'a>> {
    ids.iter()
        .zip(tables)
        .enumerate()
        .map(|(i, (tokens, blocks))| StepSeq {
            tokens,
            start: ctx,
            blocks,
            adapter: None,
            sample: Some(RowSampling::GREEDY),
            state_slot: Some(i as u32),
        })
        .collect()
}

/// What `probe=` asks: batch sizes, optionally only some variants, and how many timed steps.
pub(super) struct Probe {
    pub batches: Vec<usize>,
    pub variants: Option<Vec<String>>,
    pub steps: usize,
    /// Block counts the tensor-core attention's split aims for, each timed as a `cuda_graph` twin.
    pub busy_blocks: Vec<usize>,
}

/// One batch size of [`decode_probe`]: 3 warm-up steps, then `steps` timed.
fn probe_batch(
    runner: &Runner,
    b: usize,
    (ids, tables, ctx): (&[[u32; 1]], &[Vec<u32>], usize),
    (variant, steps): (&str, usize),
    kv_bytes_per_token: usize,
    emit: &mut impl FnMut(Value),
) -> Res<()> {
    let (dev, vocab) = (runner.device().clone(), runner.model().config().vocab_size);
    let seqs = decode_rows(&ids[..b], tables, ctx);
    for _ in 0..3 {
        runner.step(&seqs, None)?;
    }
    let _ = mindxtrain_kernels::profile::take();
    let (mut launch, mut whole) = (Vec::new(), Vec::new());
    for _ in 0..steps {
        sync(&dev)?;
        let t = Instant::now();
        if variant.starts_with("cuda_graph") {
            // A replay is one launch: only the whole step is worth timing.
            runner.step(&seqs, None)?;
        } else {
            let step = runner.forward(&seqs, None)?;
            launch.push(t.elapsed().as_secs_f64());
            sampler::sample(&step.logits, &step.sampling, vocab)?;
        }
        whole.push(t.elapsed().as_secs_f64());
    }
    emit(json!({
        "metric": format!("decode_probe_batch_{b}_ctx_{ctx}_{variant}"),
        "launch_ms_p50": (!launch.is_empty()).then(|| percentile(&mut launch, 0.5) * 1e3),
        "step_ms_p50": percentile(&mut whole, 0.5) * 1e3,
        "cache_bytes_read": b * (ctx + 1) * kv_bytes_per_token,
    }));
    for (label, calls, secs) in mindxtrain_kernels::profile::take() {
        eprintln!(
            "  batch {b} {variant}: {label:<28} {:>6} calls {:>9.3} ms/step",
            calls / steps as u64,
            secs * 1e3 / steps as f64
        );
    }
    Ok(())
}

/// The GEMMs of a decode step at each batch size above the GEMV's rows: every distinct shape,
/// cuBLAS's default against the best of 8 cuBLASLt heuristic candidates (what the training plan's
/// GEMM axis chooses from), and what the best would save a step (layer shapes run once a layer,
/// the output head once).
#[cfg(feature = "cuda")]
pub(super) fn gemm_probe(model: &CausalLm, batches: &[usize], ctx: usize, emit: &mut impl FnMut(Value)) -> Res<()> {
    let (block, c) = (16usize, model.config().clone());
    let per_seq = (ctx + 1).div_ceil(block);
    for &b in batches.iter().filter(|&&b| b > 8) {
        let mut recording = model.clone();
        let (kernels, log) = model.kernels().clone().recording_shapes();
        recording.set_kernels(kernels);
        let config = RunnerConfig {
            block_size: block,
            blocks: b * per_seq,
            state_slots: b,
            vocab: c.vocab_size,
            max_model_len: ctx + 1,
            cuda_graphs: false,
        };
        let runner = Runner::new(recording, config)?;
        let (ids, tables) = decode_fixture(b, per_seq, c.vocab_size);
        runner.step(&decode_rows(&ids, &tables, ctx), None)?;
        let mut saved_ms = 0.0;
        for shape in log.shapes() {
            let timings = mindxtrain_kernels::gemm_algos::time_candidates(model.device(), &shape, 8, 20.0)?;
            let default = timings.first().and_then(|t| t.us).unwrap_or(f64::NAN);
            let best =
                timings.iter().filter_map(|t| t.us.map(|us| (us, t.algo.label()))).min_by(|a, b| a.0.total_cmp(&b.0));
            let calls = if shape.m == c.vocab_size || shape.n == c.vocab_size { 1 } else { c.num_hidden_layers };
            let (best_us, label) = best.unwrap_or((default, "default".into()));
            saved_ms += (default - best_us).max(0.0) * calls as f64 / 1e3;
            emit(json!({
                "metric": format!("decode_gemm_batch_{b}_m{}_n{}_k{}", shape.m, shape.n, shape.k),
                "default_us": default, "best_us": best_us, "best": label, "calls_per_step": calls,
                "default_bytes_per_s": (shape.n * shape.k + shape.m * shape.k + shape.m * shape.n) as f64 * 2.0 / (default * 1e-6),
            }));
        }
        emit(json!({"metric": format!("decode_gemm_batch_{b}_best_saves_ms_per_step"), "ours": saved_ms}));
    }
    Ok(())
}

/// A prefill step of `seqs` prompts of `len` tokens each (no cached prefix, the last row of each
/// sampled), as the engine runs one when that many requests arrive together: the step's time
/// and the host's time to launch it, with bf16 attention on the tensor-core kernel and on the
/// CUDA-core one, then again with the engine's memory settings, in this process; with
/// `MINDXTRAIN_PROFILE` set the ops' table of each.
pub(super) fn prefill_probe(
    model: &CausalLm,
    (seqs, len): (usize, usize),
    probe: &Probe,
    emit: &mut impl FnMut(Value),
) -> Res<()> {
    let steps = probe.steps.min(5);
    let (block, dev, c) = (16usize, model.device().clone(), model.config().clone());
    let per_seq = len.div_ceil(block);
    let config = RunnerConfig {
        block_size: block,
        blocks: seqs * per_seq,
        state_slots: seqs,
        vocab: c.vocab_size,
        max_model_len: len,
        cuda_graphs: false,
    };
    let runner = Runner::new(model.clone(), config)?;
    let tables: Vec<Vec<u32>> =
        (0..seqs).map(|i| (i * per_seq..(i + 1) * per_seq).map(|b| b as u32).collect()).collect();
    let prompts: Vec<Vec<u32>> = (0..seqs).map(|i| tokens(len, 1000 + i as u64, c.vocab_size)).collect();
    let batch: Vec<StepSeq> = (0..seqs)
        .map(|i| StepSeq {
            tokens: &prompts[i],
            start: 0,
            blocks: &tables[i],
            adapter: None,
            sample: Some(RowSampling::GREEDY),
            state_slot: Some(i as u32),
        })
        .collect();
    // The last variant runs with the engine's process-wide settings (freed memory kept in the
    // pool, no per-allocation events), which stay on once set: it comes last.
    let variants = [
        ("tensor_core_attention", true, false),
        ("cuda_core_attention", false, false),
        ("tensor_core_attention_engine_settings", true, true),
    ];
    for (variant, tensor_cores, engine_settings) in variants {
        if !probe.variants.as_ref().is_none_or(|only| only.iter().any(|v| v == variant)) {
            continue;
        }
        if engine_settings {
            mindxtrain_kernels::cache_freed_memory(&dev)?;
            mindxtrain_kernels::skip_allocation_events(&dev)?;
        }
        mindxtrain_kernels::paged_attention::use_tensor_cores(tensor_cores);
        for _ in 0..2 {
            runner.step(&batch, None)?;
        }
        sync(&dev)?;
        let _ = mindxtrain_kernels::profile::take();
        let (mut launch, mut whole) = (Vec::new(), Vec::new());
        for _ in 0..steps {
            let t = Instant::now();
            let step = runner.forward(&batch, None)?;
            launch.push(t.elapsed().as_secs_f64());
            sampler::sample(&step.logits, &step.sampling, c.vocab_size)?;
            sync(&dev)?;
            whole.push(t.elapsed().as_secs_f64());
        }
        let ms = percentile(&mut whole, 0.5) * 1e3;
        // Weights' FLOPs of the step: 2 per parameter per row, the output head once per prompt.
        let head = c.vocab_size * c.hidden_size;
        let tables = if c.tie_word_embeddings { 1 } else { 2 }; // the embedding is a lookup
        let params: usize = model.params().values().map(|t| t.elem_count()).sum();
        let flops = 2.0 * ((params - tables * head) * seqs * len + head * seqs) as f64;
        emit(json!({
            "metric": format!("prefill_probe_{seqs}x{len}_{variant}_step_ms_p50"),
            "ours": ms,
            "launch_ms_p50": percentile(&mut launch, 0.5) * 1e3,
            "projection_tflops": flops / (ms * 1e-3) / 1e12,
        }));
        for (label, calls, secs) in mindxtrain_kernels::profile::take() {
            eprintln!(
                "  prefill {seqs}x{len} {variant}: {label:<28} {:>6} calls {:>9.3} ms/step",
                calls / steps as u64,
                secs * 1e3 / steps as f64
            );
        }
    }
    mindxtrain_kernels::paged_attention::use_tensor_cores(true);
    Ok(())
}
