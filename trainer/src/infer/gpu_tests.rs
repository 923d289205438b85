//! The engine on a GPU against the same engine on the CPU (`scripts/gpu-test`).

use candle_core::{DType, Device};

use super::hybrid_moe_tests::hybrid_moe;
use super::hybrid_tests::{hybrid_with, run_arrivals};
use super::tests::{adapters_for, adapters_on, config_with_head_dim, engine_config, instella_with_head_dim, model_of};
use super::tests::{prompts, run};
use super::*;
use crate::recipe::TargetModule;

fn gpu() -> Device {
    static DEVICE: std::sync::OnceLock<Device> = std::sync::OnceLock::new();
    DEVICE.get_or_init(|| Device::new_cuda(0).expect("a CUDA device (run through scripts/gpu-test)")).clone()
}

fn config() -> EngineConfig {
    EngineConfig {
        block_size: 16,
        max_model_len: 128,
        max_num_seqs: 8,
        max_batched_tokens: 24,
        kv_blocks: KvBlocks::Exact(64),
        prefix_caching: true,
        max_adapters: 4,
        threads: 1,
        cuda_graphs: true,
        overlap_steps: true,
    }
}

/// A small fp32 model with every request kind at once (chunked prompts, decodes, three
/// adapters and the base, decode steps replayed as graphs with adapter rows): the GPU engine's
/// greedy tokens equal the CPU engine's, with heads of
/// 64 (the fused paged kernels) and of 4 (a size they do not serve: the composed reference on
/// the GPU); and Instella's (q/k norms over the projection, before the cache write) with heads
/// of 64 and of its 3B's 80.
#[test]
fn gpu_engine_greedy_tokens_equal_the_cpu_engine_s() {
    let shapes = [64, 4].map(|hd| config_with_head_dim(64, hd)).into_iter();
    for c in shapes.chain([64, 80].map(|hd| instella_with_head_dim(64, hd))) {
        let (head_dim, arch) = (c.head_dim, c.arch);
        let cpu_model = model_of(&c, DType::F32);
        let gpu_model = crate::model::CausalLm::new(c.clone(), cpu_model.params().clone(), &gpu()).unwrap();
        let named = [("a", adapters_for(&c, 1, 2)), ("b", adapters_for(&c, 2, 8)), ("c", adapters_for(&c, 3, 4))];
        let requests = || -> Vec<Request> {
            prompts()
                .into_iter()
                .enumerate()
                .map(|(i, p)| Request {
                    adapter: [None, Some("a"), Some("b"), Some("c")][i % 4].map(String::from),
                    ..Request::greedy(p, 24)
                })
                .collect()
        };
        let mut outs = Vec::new();
        for m in [cpu_model, gpu_model] {
            let on_gpu = m.device().is_cuda();
            let mut engine = Engine::new(m, None, config()).unwrap();
            for (name, ad) in &named {
                engine.load_adapter(name, ad.clone()).unwrap();
            }
            outs.push(run(&mut engine, requests()));
            // Once every prompt is in, the six decode together, three adapters and the base:
            // those steps replay a graph with adapter rows. Heads of 4 run the composed
            // attention, which reads host metadata: never recorded.
            assert_eq!(engine.graph_refusal(), None);
            let recorded = !engine.graph_buckets().is_empty();
            assert_eq!(recorded, on_gpu && head_dim == 64, "head_dim {head_dim}: recorded {recorded}");
        }
        for (i, (cpu, gpu)) in outs[0].iter().zip(&outs[1]).enumerate() {
            let diverge = cpu.0.iter().zip(&gpu.0).position(|(a, b)| a != b);
            assert_eq!(
                cpu.0, gpu.0,
                "{arch:?} head_dim {head_dim}, request {i}: first divergence at token {diverge:?} (ended: CPU {:?}, GPU {:?})",
                cpu.1, gpu.1
            );
        }
        println!(
            "GPU engine, {arch:?} head_dim {head_dim}: {} requests token-identical to the CPU engine",
            outs[0].len()
        );
    }
}

/// Base-model requests joining at different steps: decode batches of 1 to 8 rows replay
/// their buckets' CUDA graphs (recorded when the engine starts), and the tokens equal the CPU
/// engine's and the GPU engine's without graphs; decode steps queued ahead (their ids drawn on
/// the device, copied into a graph's input buffer or decoded directly) give the tokens of steps
/// run one at a time, with a pool of 8 threads (candle queues CUDA work on the calling
/// thread's stream: the engine must queue every step from one thread, or a step queued ahead
/// reads unordered ids) and over several rounds.
#[test]
fn decode_steps_replayed_as_cuda_graphs_give_the_direct_steps_tokens() {
    let c = config_with_head_dim(64, 64);
    let cpu_model = model_of(&c, DType::F32);
    // Lengths 24, 20, … 4: the decode batch shrinks from 6 rows to 1 as requests end.
    let requests =
        || prompts().into_iter().enumerate().map(|(i, p)| Request::greedy(p, 24 - 4 * i)).collect::<Vec<_>>();
    let mut outs = Vec::new();
    // (device, graphs, overlap)
    let runs = [
        (Device::Cpu, false, true),
        (gpu(), false, false),
        (gpu(), true, false),
        (gpu(), true, true),
        (gpu(), false, true),
    ];
    for (device, graphs, overlap) in runs {
        let m = crate::model::CausalLm::new(c.clone(), cpu_model.params().clone(), &device).unwrap();
        let config = EngineConfig { cuda_graphs: graphs, overlap_steps: overlap, threads: 8, ..config() };
        let mut engine = Engine::new(m, None, config).unwrap();
        // Every bucket up to the batch's largest (8 sequences) is recorded before any request:
        // the first steps replay graphs too.
        let at_start = engine.graph_buckets();
        assert_eq!(at_start, if graphs && device.is_cuda() { vec![1, 2, 4, 8] } else { vec![] }, "{device:?} {graphs}");
        let rounds = if overlap && device.is_cuda() { 4 } else { 1 };
        let first = run(&mut engine, requests());
        // Later rounds hit the prefix cache (their usage says so); their tokens are the first's.
        let tokens = |out: &[(Vec<u32>, Event)]| out.iter().map(|o| o.0.clone()).collect::<Vec<_>>();
        for round in 1..rounds {
            let again = run(&mut engine, requests());
            assert_eq!(tokens(&again), tokens(&first), "graphs {graphs} overlap {overlap}: round {round} differs");
        }
        outs.push(first);
        let s = engine.stats();
        assert_eq!(overlap, s.steps_ahead > 0, "{device:?} graphs {graphs} overlap {overlap}: {s:?}");
        let buckets = engine.graph_buckets();
        assert_eq!(engine.graph_refusal(), None, "recording a graph failed");
        assert_eq!(graphs, !buckets.is_empty(), "{device:?} graphs {graphs}: recorded buckets {buckets:?}");
        if graphs {
            assert!(buckets.len() >= 2, "only the buckets {buckets:?} were recorded");
            println!("CUDA graphs recorded for decode batches of {buckets:?}");
        }
    }
    let [cpu, direct, graphed, graphed_ahead, direct_ahead] = &outs[..] else { unreachable!() };
    for i in 0..cpu.len() {
        assert_eq!(cpu[i].0, direct[i].0, "request {i}: the GPU engine without graphs differs from the CPU's");
        assert_eq!(direct[i].0, graphed[i].0, "request {i}: replayed graphs differ from direct steps");
        assert_eq!(graphed[i], graphed_ahead[i], "request {i}: replays queued ahead differ from replays one at a time");
        assert_eq!(direct[i], direct_ahead[i], "request {i}: steps queued ahead differ from steps one at a time");
    }
}

/// bf16 on the GPU runs the same schedule to the end with every block freed.
#[test]
fn gpu_engine_runs_bf16() {
    let m = model_of(&config_with_head_dim(64, 64), DType::F32);
    let params = m.params().iter().map(|(k, v)| (k.clone(), v.to_dtype(DType::BF16).unwrap())).collect();
    let bf16 = crate::model::CausalLm::new(m.config().clone(), params, &gpu()).unwrap();
    let mut engine = Engine::new(bf16, None, config()).unwrap();
    let outs = run(&mut engine, prompts().into_iter().map(|p| Request::greedy(p, 16)).collect());
    for (i, (t, e)) in outs.iter().enumerate() {
        assert!(t.len() == 16 && matches!(e, Event::Finished { .. }), "request {i}: {} tokens, then {e:?}", t.len());
    }
}

/// A Qwen3.5/3.6 dense hybrid (linear, attention, linear layers) served on the GPU: its Gated
/// DeltaNet states in slots on the device (the decoding sequences gathered, advanced by the
/// CUDA `step` kernels and scattered back together; prompt chunks one by one from their slot's
/// state), requests joining at different steps, prompts chunked by a 7-token budget, two
/// adapters (one on the linear-attention projections only) and the base in one batch: greedy
/// tokens equal the CPU engine's, with decode steps replayed as CUDA graphs (their state slots in
/// the bucket's buffer) and run directly. Attention heads of 4 (the composed paged attention,
/// which reads host metadata: never recorded) with linear heads of 4×3, and of 64 (the fused
/// paged kernels: recorded) with linear heads of 32×32.
#[test]
fn gpu_hybrid_engine_greedy_tokens_equal_the_cpu_engine_s() {
    use TargetModule::*;
    for c in [hybrid_with(64, 4, (4, 3)), hybrid_with(64, 64, (32, 32))] {
        let shape = (c.head_dim, c.hybrid.as_ref().map(|h| h.linear_key_head_dim));
        let cpu_model = model_of(&c, DType::F32);
        let named = [
            ("linear", adapters_on(&c, 1, 2, vec![InProjQkv, InProjZ, InProjB, InProjA, OutProj])),
            ("both", adapters_on(&c, 2, 3, vec![QProj, OProj, InProjQkv, DownProj])),
        ];
        let at = [0, 0, 1, 3, 4, 9];
        let arrivals: Vec<(usize, Request)> = prompts()
            .into_iter()
            .enumerate()
            .map(|(i, p)| {
                let adapter = [None, Some("linear"), Some("both")][i % 3].map(String::from);
                (at[i], Request { adapter, ..Request::greedy(p, 12 + i) })
            })
            .collect();
        let mut outs = Vec::new();
        for (device, graphs) in [(Device::Cpu, false), (gpu(), true), (gpu(), false)] {
            let m = crate::model::CausalLm::new(c.clone(), cpu_model.params().clone(), &device).unwrap();
            let config = EngineConfig { max_num_seqs: 6, cuda_graphs: graphs, ..engine_config(64, 7) };
            let mut engine = Engine::new(m, None, config).unwrap();
            for (name, ad) in &named {
                engine.load_adapter(name, ad.clone()).unwrap();
            }
            let started = std::time::Instant::now();
            outs.push(run_arrivals(&mut engine, arrivals.clone()));
            let buckets = engine.graph_buckets();
            println!(
                "hybrid {shape:?} on {device:?}, graphs {graphs}: {} steps in {:?}, buckets recorded {buckets:?}",
                engine.stats().steps,
                started.elapsed()
            );
            assert_eq!(engine.graph_refusal(), None, "recording a hybrid's decode step failed");
            let recorded = device.is_cuda() && graphs && c.head_dim == 64;
            assert_eq!(!buckets.is_empty(), recorded, "hybrid {shape:?} graphs {graphs}: buckets {buckets:?}");
        }
        for (i, cpu) in outs[0].iter().enumerate() {
            assert_eq!(cpu.len(), 12 + i);
            for (run, gpu) in ["graphs", "direct"].iter().zip(&outs[1..]) {
                let diverge = cpu.iter().zip(&gpu[i]).position(|(a, b)| a != b);
                assert_eq!(
                    cpu, &gpu[i],
                    "hybrid {shape:?} on the GPU ({run}), request {i}: first divergence at {diverge:?}"
                );
            }
        }
        println!("GPU engine, hybrid {shape:?}: {} requests token-identical to the CPU engine", outs[0].len());
    }
}

/// A Qwen3.5/3.6-MoE hybrid served on the GPU: every layer's routed experts and its sigmoid-gated
/// shared expert over the paged step beside the recurrent and attention layers, requests joining
/// at different steps, prompts chunked by a 7-token budget, an adapter on the shared expert and
/// its gate beside the base: greedy tokens equal the CPU engine's (f32; decode steps run directly,
/// as for every sparse model).
#[test]
fn gpu_moe_hybrid_engine_greedy_tokens_equal_the_cpu_engine_s() {
    use TargetModule::*;
    let c = hybrid_moe(64);
    let cpu_model = model_of(&c, DType::F32);
    let shared = adapters_on(&c, 5, 2, vec![GateProj, UpProj, DownProj, SharedExpertGate, InProjQkv, QProj]);
    let at = [0, 0, 1, 3, 4, 9];
    let arrivals: Vec<(usize, Request)> = prompts()
        .into_iter()
        .enumerate()
        .map(|(i, p)| (at[i], Request { adapter: (i % 2 == 1).then(|| "shared".into()), ..Request::greedy(p, 10 + i) }))
        .collect();
    let outs: Vec<Vec<Vec<u32>>> = [Device::Cpu, gpu()]
        .iter()
        .map(|device| {
            let m = crate::model::CausalLm::new(c.clone(), cpu_model.params().clone(), device).unwrap();
            let mut engine = Engine::new(m, None, EngineConfig { max_num_seqs: 6, ..engine_config(64, 7) }).unwrap();
            engine.load_adapter("shared", shared.clone()).unwrap();
            run_arrivals(&mut engine, arrivals.clone())
        })
        .collect();
    for (i, (cpu, gpu)) in outs[0].iter().zip(&outs[1]).enumerate() {
        assert_eq!(cpu.len(), 10 + i);
        let diverge = cpu.iter().zip(gpu).position(|(a, b)| a != b);
        assert_eq!(cpu, gpu, "MoE hybrid on the GPU, request {i}: first divergence at {diverge:?}");
    }
    println!("GPU engine, MoE hybrid: {} requests token-identical to the CPU engine", outs[0].len());
}

/// bf16 on the GPU: the hybrid's engine runs the same staggered, chunked schedule with adapters
/// to the end, every request its full length, every block freed (`run_arrivals` checks it).
#[test]
fn gpu_hybrid_engine_runs_bf16() {
    let c = hybrid_with(64, 64, (32, 32));
    let m = model_of(&c, DType::F32);
    let params = m.params().iter().map(|(k, v)| (k.clone(), v.to_dtype(DType::BF16).unwrap())).collect();
    let bf16 = crate::model::CausalLm::new(c.clone(), params, &gpu()).unwrap();
    let mut engine = Engine::new(bf16, None, EngineConfig { max_num_seqs: 6, ..engine_config(64, 7) }).unwrap();
    engine.load_adapter("a", adapters_for(&c, 1, 2)).unwrap();
    let arrivals = prompts()
        .into_iter()
        .enumerate()
        .map(|(i, p)| (i, Request { adapter: (i % 2 == 0).then(|| "a".into()), ..Request::greedy(p, 10) }))
        .collect();
    for (i, t) in run_arrivals(&mut engine, arrivals).iter().enumerate() {
        assert_eq!(t.len(), 10, "request {i}");
    }
}
