//! The serving engine's benchmark (docs/benchmarks.md, "Serving"): batch-1 decode against the
//! bandwidth floor measured here, throughput and latency at 1/16/64/256 streams (all at once and
//! Poisson arrivals), 8 LoRA adapters mixed in one batch against one, and greedy tokens against
//! a peer's (HF transformers) for the same weights. `bench/serving.sh` runs it on the GPU machine
//! beside the peer (`bench/serving_peer.py`) and turns both into JSON lines.
//!
//! ```text
//! serve_bench device=cuda shape=8B weights=DIR peer_tokens=FILE out=FILE
//!             streams=1,16,64,256 prompt=512 gen=256 rate=8 adapters=8 budget_s=400
//!             [arrivals=all_at_once,poisson] [overlap=1] [graphs=1]
//! serve_bench device=cpu shape=tiny streams=1,4 prompt=32 gen=16      (a smoke run on the CPU)
//! serve_bench device=cuda shape=qwen3.6-27b streams=1,64 adapters=0   (the Qwen3.6 hybrid on
//!             random weights; bench/serving.sh runs it with no peer)
//! serve_bench probe=1,64      (only the host launch time against the step time, per batch size)
//! serve_bench probe=1 probe_variants=cuda_graph probe_steps=1   (one variant, one timed step:
//!             short enough for a kernel profiler, which slows each launch ~20 ms)
//! serve_bench probe=16,64 probe_variants=cuda_graph probe_tc_busy=1188,1584   (the graph step
//!             again with the tensor-core attention's key split aimed at those block counts)
//! serve_bench probe=0 probe_prefill=16x512   (a prefill step of 16 prompts of 512 tokens, with
//!             tensor-core and CUDA-core attention; probe_variants=…: some of tensor_core_attention, cuda_core_attention,
//!             tensor_core_attention_engine_settings)
//! serve_bench probe=16,64 probe_gemm=1   (a decode step's GEMM shapes: cuBLAS's default
//!             against the best cuBLASLt candidate, before the decode probe)
//! ```
//! Without `weights` the model is random (device-side init); with it, an HF directory (the
//! peer saves its random model there, so both sides hold the same weights). Prints one JSON
//! object per measurement and writes them all to `out`.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use candle_core::{DType, Device, Tensor};
use mindxtrain_trainer::infer::{Engine, EngineConfig, Event, KvBlocks, Request, RequestId};
use mindxtrain_trainer::model::{Adapters, CausalLm, LmConfig, LoraConfig};
use mindxtrain_trainer::recipe::TargetModule;
use serde_json::{Value, json};

mod probe;

use probe::Probe;

type Res<T> = Result<T, Box<dyn std::error::Error>>;

struct Args(BTreeMap<String, String>);

impl Args {
    fn parse() -> Args {
        Args(std::env::args().skip(1).filter_map(|a| a.split_once('=').map(|(k, v)| (k.into(), v.into()))).collect())
    }
    fn get(&self, k: &str, default: &str) -> String {
        self.0.get(k).cloned().unwrap_or_else(|| default.into())
    }
    fn num(&self, k: &str, default: usize) -> usize {
        self.0.get(k).and_then(|v| v.parse().ok()).unwrap_or(default)
    }
}

/// Deterministic token ids (the peer draws its own with the same rule).
fn tokens(n: usize, seed: u64, vocab: usize) -> Vec<u32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s % vocab as u64) as u32
        })
        .collect()
}

fn sync(d: &Device) -> Res<()> {
    Ok(d.synchronize()?)
}

/// Copy bandwidth (bytes read + written per second) of a 2 GiB device-to-device copy (32 MiB on
/// the CPU smoke run).
fn copy_bandwidth(d: &Device) -> Res<f64> {
    let n = if d.is_cuda() { 1usize << 30 } else { 1 << 24 };
    let x = Tensor::zeros(n, DType::BF16, d)?;
    let _ = x.copy()?;
    sync(d)?;
    let reps = 10;
    let t = Instant::now();
    for _ in 0..reps {
        let _ = x.copy()?;
    }
    sync(d)?;
    Ok(2.0 * (2 * n * reps) as f64 / t.elapsed().as_secs_f64())
}

/// bf16 GEMM FLOP/s at 8192³.
fn gemm_ceiling(d: &Device) -> Res<f64> {
    let n = if d.is_cuda() { 8192 } else { 512 };
    let a = Tensor::ones((n, n), DType::BF16, d)?;
    let _ = a.matmul(&a)?;
    sync(d)?;
    let reps = 5;
    let t = Instant::now();
    for _ in 0..reps {
        let _ = a.matmul(&a)?;
    }
    sync(d)?;
    Ok(2.0 * (n * n * n * reps) as f64 / t.elapsed().as_secs_f64())
}

fn percentile(xs: &mut [f64], p: f64) -> f64 {
    if xs.is_empty() {
        return f64::NAN;
    }
    xs.sort_by(|a, b| a.total_cmp(b));
    xs[((xs.len() - 1) as f64 * p).round() as usize]
}

/// One load: requests arriving at `arrivals` (seconds from the start), all run to their end.
struct Load {
    out_tok_s: f64,
    ttft: Vec<f64>,
    itl: Vec<f64>,
    tokens: BTreeMap<usize, Vec<u32>>,
}

fn drive(engine: &mut Engine, reqs: Vec<Request>, arrivals: &[f64], deadline: Instant) -> Res<Load> {
    let start = Instant::now();
    let mut pending: Vec<(usize, Request)> = reqs.into_iter().enumerate().collect();
    pending.reverse();
    let mut ids: BTreeMap<RequestId, usize> = BTreeMap::new();
    let mut last: BTreeMap<usize, f64> = BTreeMap::new();
    let (mut ttft, mut itl, mut produced) = (Vec::new(), Vec::new(), 0usize);
    let mut tokens: BTreeMap<usize, Vec<u32>> = BTreeMap::new();
    loop {
        let now = start.elapsed().as_secs_f64();
        while pending.last().is_some_and(|(i, _)| arrivals[*i] <= now) {
            let (i, r) = pending.pop().expect("checked");
            ids.insert(engine.add(r)?, i);
        }
        if engine.is_idle() {
            match pending.last() {
                None => break,
                Some((i, _)) => {
                    std::thread::sleep(Duration::from_secs_f64((arrivals[*i] - now).max(0.0)));
                    continue;
                }
            }
        }
        if Instant::now() > deadline {
            return Err("the time budget ran out mid-load".into());
        }
        for (id, e) in engine.step() {
            let i = ids[&id];
            let t = start.elapsed().as_secs_f64();
            match e {
                Event::Token { id, .. } => {
                    produced += 1;
                    tokens.entry(i).or_default().push(id);
                    match last.insert(i, t) {
                        None => ttft.push(t - arrivals[i]),
                        Some(prev) => itl.push(t - prev),
                    }
                }
                Event::Failed(m) => {
                    let n = tokens.get(&i).map_or(0, Vec::len);
                    let s = engine.stats();
                    return Err(format!("request {i} failed after {n} tokens at {t:.3} s: {m} ({s:?})").into());
                }
                Event::Finished { .. } => {}
            }
        }
    }
    Ok(Load { out_tok_s: produced as f64 / start.elapsed().as_secs_f64(), ttft, itl, tokens })
}

fn lora_adapters(config: &LmConfig, n: usize, dtype: DType, d: &Device) -> Res<Vec<Adapters>> {
    let lora = LoraConfig { r: 16, alpha: 32.0, dropout: 0.0, target_modules: TargetModule::all(), rslora: false };
    (0..n)
        .map(|i| {
            let init = Adapters::init(config, &lora, i as u64, dtype, d)?;
            // PEFT's B = 0 would make every adapter the base: small random B instead.
            let tensors = init
                .tensors
                .into_iter()
                .map(|(k, t)| {
                    let t = if k.contains("lora_B") {
                        (Tensor::randn(0f32, 0.01, t.shape(), d)?.to_dtype(dtype))?
                    } else {
                        t
                    };
                    Ok((k, t))
                })
                .collect::<Result<_, candle_core::Error>>()?;
            Ok(Adapters::new(config, lora.clone(), tensors)?)
        })
        .collect()
}

fn main() -> Res<()> {
    let args = Args::parse();
    let device = match args.get("device", "cuda").as_str() {
        "cpu" => Device::Cpu,
        _ => Device::new_cuda(0)?,
    };
    let shape = args.get("shape", "8B");
    let config = LmConfig::timing_shape(&shape)
        .ok_or(format!("shape {shape:?}: expected tiny, tiny-hybrid, 0.6B, 1.7B, 8B, instella-3b or qwen3.6-27b"))?;
    let dtype = if device.is_cuda() { DType::BF16 } else { DType::F32 };
    let (prompt_len, new_tokens) = (args.num("prompt", 512), args.num("gen", 256));
    let streams: Vec<usize> = args.get("streams", "1,16,64,256").split(',').filter_map(|s| s.parse().ok()).collect();
    let deadline = Instant::now() + Duration::from_secs(args.num("budget_s", 420) as u64);
    // Each result goes to `out` as soon as it is measured: a run cut short keeps what it has.
    let mut out = match args.0.get("out") {
        Some(path) => Some(std::fs::File::create(path)?),
        None => None,
    };
    let mut emit = |v: Value| {
        println!("{v}");
        if let Some(f) = out.as_mut() {
            use std::io::Write;
            let _ = writeln!(f, "{v}");
        }
    };

    // As the engine keeps freed memory in its pool, so do the ceilings (the probe starts from
    // the driver's default to measure the difference).
    if !args.0.contains_key("probe") {
        mindxtrain_kernels::cache_freed_memory(&device)?;
    }
    let bandwidth = copy_bandwidth(&device)?;
    let gemm = gemm_ceiling(&device)?;
    emit(json!({"metric": "copy_bandwidth_bytes_per_s", "ours": bandwidth}));
    emit(json!({"metric": "bf16_gemm_flops", "ours": gemm}));

    let t = Instant::now();
    let model = match args.0.get("weights") {
        Some(dir) => mindxtrain_trainer::checkpoint::load_hf_model(&PathBuf::from(dir), dtype, &device)?.0,
        None => CausalLm::init_for_timing(&config, dtype, &device)?,
    };
    sync(&device)?;
    let config = model.config().clone();
    let weight_bytes: usize = model.params().values().map(|t| t.elem_count() * t.dtype().size_in_bytes()).sum();
    eprintln!("model loaded in {:.1} s ({:.2} GB)", t.elapsed().as_secs_f64(), weight_bytes as f64 / 1e9);
    if let Some(batches) = args.0.get("probe") {
        let probe = Probe {
            batches: batches.split(',').filter_map(|s| s.parse().ok()).collect(),
            variants: args.0.get("probe_variants").map(|v| v.split(',').map(str::to_string).collect()),
            steps: args.num("probe_steps", 20).max(1),
            busy_blocks: args
                .0
                .get("probe_tc_busy")
                .map(|v| v.split(',').filter_map(|b| b.parse().ok()).collect())
                .unwrap_or_default(),
        };
        // The probe leaves process-wide settings behind (no event tracking): it runs alone.
        if let Some((n, len)) = args.0.get("probe_prefill").and_then(|v| v.split_once('x')) {
            let (n, len) = (n.parse()?, len.parse()?);
            probe::prefill_probe(&model, (n, len), &probe, &mut emit)?;
        }
        #[cfg(feature = "cuda")]
        if args.0.contains_key("probe_gemm") {
            probe::gemm_probe(&model, &probe.batches, prompt_len + new_tokens / 2, &mut emit)?;
        }
        return probe::decode_probe(&model, &probe, prompt_len + new_tokens / 2, &mut emit);
    }
    // The identity prompts are 64 + 32 tokens.
    let max_model_len = (prompt_len + new_tokens).max(64 + 32) + 16;
    let engine_config = EngineConfig {
        block_size: 16,
        max_model_len,
        max_num_seqs: streams.iter().copied().max().unwrap_or(1).max(1),
        max_batched_tokens: args.num("max_batched_tokens", 8192).max(streams.iter().copied().max().unwrap_or(1)),
        kv_blocks: KvBlocks::FreeMemory(if device.is_cuda() { 0.85 } else { 0.05 }),
        prefix_caching: false,
        max_adapters: 16,
        threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
        cuda_graphs: args.get("graphs", "1") != "0",
        overlap_steps: args.get("overlap", "1") != "0",
    };
    let mut engine = Engine::new(model, None, engine_config.clone())?;
    let vocab = config.vocab_size;
    let greedy = |i: usize, adapter: Option<String>| Request {
        adapter,
        ..Request::greedy(tokens(prompt_len, 1000 + i as u64, vocab), new_tokens)
    };
    // Warm-up: every kernel's PTX is JIT-compiled on its first launch.
    drive(&mut engine, vec![greedy(0, None), greedy(1, None)], &[0.0, 0.0], deadline)?;

    // Greedy tokens of the identity prompts, against the peer's when it wrote them.
    let ident: Vec<Request> = (0..16).map(|i| Request::greedy(tokens(64, 7000 + i as u64, vocab), 32)).collect();
    let ours = drive(&mut engine, ident, &[0.0; 16], deadline)?.tokens;
    let ours: Vec<Vec<u32>> = (0..16).map(|i| ours.get(&i).cloned().unwrap_or_default()).collect();
    if let Some(path) = args.0.get("peer_tokens")
        && let Ok(text) = std::fs::read_to_string(path)
    {
        let peer: Vec<Vec<u32>> = serde_json::from_str(&text)?;
        let firsts: Vec<Option<usize>> =
            ours.iter().zip(&peer).map(|(a, b)| a.iter().zip(b).position(|(x, y)| x != y)).collect();
        let identical = firsts.iter().filter(|f| f.is_none()).count();
        emit(json!({"metric": "greedy_identical_prompts_of_16", "ours": identical, "first_divergence": firsts}));
    }
    emit(json!({"metric": "greedy_identity_tokens", "ours": ours}));

    // Batch-1 decode against the floor: every decode step reads every weight once.
    let one = drive(&mut engine, vec![greedy(0, None)], &[0.0], deadline)?;
    let decode_tok_s = 1.0 / (one.itl.iter().sum::<f64>() / one.itl.len().max(1) as f64);
    let floor = bandwidth / weight_bytes as f64;
    emit(
        json!({"metric": "batch1_decode_tok_s", "ours": decode_tok_s, "floor_tok_s": floor, "fraction_of_floor": decode_tok_s / floor}),
    );

    let rate = args.num("rate", 8) as f64;
    let arrivals_wanted = args.get("arrivals", "all_at_once,poisson");
    for &n in &streams {
        for arrival in ["all_at_once", "poisson"] {
            if !arrivals_wanted.split(',').any(|a| a == arrival) {
                continue;
            }
            if Instant::now() > deadline {
                emit(json!({"metric": format!("streams_{n}_{arrival}"), "skipped": "time budget"}));
                continue;
            }
            let arrivals: Vec<f64> = match arrival {
                "poisson" => {
                    let mut t = 0.0;
                    let mut s = 0x5eed_u64 + n as u64;
                    (0..n)
                        .map(|_| {
                            let at = t;
                            s = s.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
                            let u = ((s >> 11) as f64 / (1u64 << 53) as f64).max(1e-12);
                            t += -u.ln() / rate;
                            at
                        })
                        .collect()
                }
                _ => vec![0.0; n],
            };
            let tag = format!("streams_{n}_{arrival}");
            let mut l = match drive(&mut engine, (0..n).map(|i| greedy(i, None)).collect(), &arrivals, deadline) {
                Ok(l) => l,
                Err(e) => {
                    emit(json!({"metric": format!("{tag}_output_tok_s"), "skipped": e.to_string()}));
                    continue;
                }
            };
            // Each request's tokens as one number: loads run twice (say, with steps queued ahead
            // and without) can be compared token for token.
            let digests: Vec<String> = l
                .tokens
                .values()
                .map(|t| {
                    format!(
                        "{:016x}",
                        t.iter()
                            .fold(0xcbf2_9ce4_8422_2325u64, |h, &x| (h ^ u64::from(x)).wrapping_mul(0x100_0000_01b3))
                    )
                })
                .collect();
            emit(json!({"metric": format!("{tag}_output_tok_s"), "ours": l.out_tok_s, "token_digests": digests}));
            emit(json!({"metric": format!("{tag}_ttft_p50_s"), "ours": percentile(&mut l.ttft, 0.5)}));
            emit(json!({"metric": format!("{tag}_ttft_p99_s"), "ours": percentile(&mut l.ttft, 0.99)}));
            emit(json!({"metric": format!("{tag}_itl_p50_s"), "ours": percentile(&mut l.itl, 0.5)}));
            emit(json!({"metric": format!("{tag}_itl_p99_s"), "ours": percentile(&mut l.itl, 0.99)}));
        }
    }

    // Eight adapters mixed in one batch against one adapter for every row.
    let n_adapters = args.num("adapters", 8);
    let lora_streams = args.num("lora_streams", 64);
    if n_adapters > 0 && Instant::now() < deadline {
        for (i, a) in lora_adapters(&config, n_adapters, dtype, &device)?.into_iter().enumerate() {
            engine.load_adapter(&format!("a{i}"), a)?;
        }
        let mut tok_s = Vec::new();
        for mixed in [false, true] {
            let reqs = (0..lora_streams)
                .map(|i| greedy(i, Some(format!("a{}", if mixed { i % n_adapters } else { 0 }))))
                .collect();
            tok_s.push(drive(&mut engine, reqs, &vec![0.0; lora_streams], deadline)?.out_tok_s);
        }
        emit(json!({"metric": format!("lora_1_adapter_{lora_streams}_streams_output_tok_s"), "ours": tok_s[0]}));
        emit(
            json!({"metric": format!("lora_{n_adapters}_adapters_{lora_streams}_streams_output_tok_s"), "ours": tok_s[1], "ratio_to_one_adapter": tok_s[1] / tok_s[0]}),
        );
    }
    eprintln!(
        "CUDA graphs: decode buckets recorded {:?}; recording refused: {:?}",
        engine.graph_buckets(),
        engine.graph_refusal()
    );
    Ok(())
}
