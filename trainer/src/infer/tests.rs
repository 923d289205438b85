//! The engine on the CPU backend against one-at-a-time generation and the training model's
//! own decode path.

use std::collections::BTreeMap;
use std::ops::ControlFlow;

use candle_core::{DType, Device, Tensor};

use super::*;
use crate::data::Tokenizer;
use crate::generate::{Limits, Sampling, generate};
use crate::model::rng::SplitMix64;
use crate::model::{Adapters, CausalLm, LmConfig, LoraConfig};
use crate::recipe::TargetModule;

fn config(vocab: usize) -> LmConfig {
    config_with_head_dim(vocab, 4)
}

/// The tiny test model with heads of `head_dim` (64 reaches the GPU's fused paged kernels).
pub(super) fn config_with_head_dim(vocab: usize, head_dim: usize) -> LmConfig {
    LmConfig {
        arch: crate::model::Arch::Qwen3,
        vocab_size: vocab,
        hidden_size: 16,
        intermediate_size: 24,
        num_hidden_layers: 2,
        num_attention_heads: 4,
        num_key_value_heads: 2,
        head_dim,
        rms_norm_eps: 1e-6,
        rope_theta: 10_000.0,
        tie_word_embeddings: false,
        max_position_embeddings: 256,
        moe: None,
        hybrid: None,
    }
}

/// [`config_with_head_dim`] as Instella: heads that tile the hidden size, q/k norms over the
/// whole projection (the paged path normalises the fused projection's q and k columns).
pub(super) fn instella_with_head_dim(vocab: usize, head_dim: usize) -> LmConfig {
    let c = config_with_head_dim(vocab, head_dim);
    LmConfig { arch: crate::model::Arch::Instella, hidden_size: c.num_attention_heads * head_dim, ..c }
}

/// Weights large enough that the logits are far from uniform (no near-ties for greedy).
pub(super) fn model(vocab: usize, dtype: DType) -> CausalLm {
    model_of(&config(vocab), dtype)
}

pub(super) fn model_of(config: &LmConfig, dtype: DType) -> CausalLm {
    let mut m = CausalLm::init_random(config, 3, dtype, &Device::Cpu).unwrap();
    for (name, t) in m.params_mut().iter_mut() {
        // A Gated DeltaNet layer's decay parameters stay as drawn: scaled, every state would
        // decay to nothing in one token and the tests would not see it carried.
        if !["norm.weight", "A_log", "dt_bias"].iter().any(|s| name.ends_with(s)) {
            *t = (&*t * 20.0).unwrap();
        }
    }
    m
}

pub(super) fn engine_config(blocks: usize, budget: usize) -> EngineConfig {
    EngineConfig {
        block_size: 4,
        max_model_len: 96,
        max_num_seqs: 8,
        max_batched_tokens: budget,
        kv_blocks: KvBlocks::Exact(blocks),
        prefix_caching: true,
        max_adapters: 4,
        threads: 2,
        cuda_graphs: true,
        overlap_steps: true,
    }
}

/// Adapters over q, v and down with random non-zero B (PEFT's init would make them no-ops).
pub(super) fn adapters(seed: u64, r: usize) -> Adapters {
    adapters_for(&config(64), seed, r)
}

pub(super) fn adapters_for(c: &LmConfig, seed: u64, r: usize) -> Adapters {
    adapters_on(c, seed, r, vec![TargetModule::QProj, TargetModule::VProj, TargetModule::DownProj])
}

/// Adapters on `targets` with random non-zero B.
pub(super) fn adapters_on(c: &LmConfig, seed: u64, r: usize, targets: Vec<TargetModule>) -> Adapters {
    let lora = LoraConfig { r, alpha: 2.0 * r as f64, dropout: 0.0, target_modules: targets, rslora: false };
    let mut rng = SplitMix64::derive(seed, &[]);
    let init = Adapters::init(c, &lora, seed, DType::F64, &Device::Cpu).unwrap();
    let tensors: BTreeMap<String, Tensor> = init
        .tensors
        .iter()
        .map(|(k, t)| {
            let v: Vec<f64> = (0..t.elem_count()).map(|_| rng.unit() - 0.5).collect();
            (k.clone(), Tensor::from_vec(v, t.shape(), &Device::Cpu).unwrap())
        })
        .collect();
    Adapters::new(c, lora, tensors).unwrap()
}

/// Drives an engine until every request ended; returns each request's tokens and its ending.
pub(super) fn run(engine: &mut Engine, reqs: Vec<Request>) -> Vec<(Vec<u32>, Event)> {
    let ids: Vec<RequestId> = reqs.into_iter().map(|r| engine.add(r).unwrap()).collect();
    let mut out: BTreeMap<RequestId, (Vec<u32>, Option<Event>)> = ids.iter().map(|&id| (id, (vec![], None))).collect();
    for _ in 0..10_000 {
        if engine.is_idle() {
            break;
        }
        for (id, e) in engine.step() {
            let slot = out.get_mut(&id).unwrap();
            match e {
                Event::Token { id, .. } => slot.0.push(id),
                end => slot.1 = Some(end),
            }
        }
        engine.check().unwrap();
    }
    assert_eq!(engine.stats().kv_used_blocks, 0, "every block is free once all requests ended");
    ids.iter().map(|id| out.remove(id).map(|(t, e)| (t, e.expect("ended"))).unwrap()).collect()
}

pub(super) fn prompts() -> Vec<Vec<u32>> {
    vec![
        (0..23).map(|i| (i * 7 + 3) % 64).collect(),
        vec![5, 9],
        (0..11).map(|i| (i * 13 + 1) % 64).collect(),
        (0..37).map(|i| (i * 5 + 2) % 64).collect(),
        vec![42],
        (0..8).map(|i| (i * 3) % 64).collect(),
    ]
}

fn requests() -> Vec<Request> {
    prompts()
        .into_iter()
        .enumerate()
        .map(|(i, p)| Request {
            prompt: p,
            max_tokens: 6 + i * 3,
            sampling: if i % 2 == 0 {
                SamplingParams::greedy()
            } else {
                SamplingParams { temperature: 0.9, top_p: 0.9, top_k: 20, seed: i as u64 }
            },
            adapter: None,
            stop: vec![],
        })
        .collect()
}

#[test]
fn interleaved_requests_give_the_tokens_of_one_at_a_time_generation() {
    let alone: Vec<Vec<u32>> = requests()
        .into_iter()
        .map(|r| {
            run(&mut Engine::new(model(64, DType::F64), None, engine_config(64, 64)).unwrap(), vec![r])[0].0.clone()
        })
        .collect();
    // All at once, with a budget of 8 tokens a step: prompts are chunked and mixed with decodes.
    let mut engine = Engine::new(model(64, DType::F64), None, engine_config(64, 8)).unwrap();
    let together = run(&mut engine, requests());
    for (i, (got, want)) in together.iter().zip(&alone).enumerate() {
        assert_eq!(&got.0, want, "request {i}");
        assert!(matches!(got.1, Event::Finished { reason: FinishReason::Length, .. }));
    }
    // And again on a cache so small that sequences are preempted and recomputed.
    let mut tight = Engine::new(model(64, DType::F64), None, engine_config(24, 16)).unwrap();
    let preempted = run(&mut tight, requests());
    assert_eq!(preempted.iter().map(|r| r.0.clone()).collect::<Vec<_>>(), alone);
}

#[test]
fn steps_queued_ahead_give_the_events_of_steps_run_one_at_a_time() {
    let serial = |blocks, budget| EngineConfig { overlap_steps: false, ..engine_config(blocks, budget) };
    // Roomy, chunked prompts, and a cache so small that sequences are preempted.
    for (blocks, budget) in [(64, 64), (64, 8), (24, 16)] {
        let mut one_by_one = Engine::new(model(64, DType::F64), None, serial(blocks, budget)).unwrap();
        let want = run(&mut one_by_one, requests());
        assert_eq!(one_by_one.stats().steps_ahead, 0);
        let mut ahead = Engine::new(model(64, DType::F64), None, engine_config(blocks, budget)).unwrap();
        let got = run(&mut ahead, requests());
        assert_eq!(got, want, "{blocks} blocks, budget {budget}");
        let s = ahead.stats();
        assert!(s.steps_ahead > 0 && s.steps_ahead < s.steps, "{blocks} blocks, budget {budget}: {s:?}");
    }
    // The steady state of a batch that only decodes: every step after the first is queued ahead.
    let mut ahead = Engine::new(model(64, DType::F64), None, engine_config(64, 64)).unwrap();
    let reqs: Vec<Request> = (0..3).map(|i| Request::greedy(vec![i + 1, 2, 3], 10)).collect();
    run(&mut ahead, reqs);
    let s = ahead.stats();
    // The prefill and the first decode run as scheduled; the 8 decodes after are queued ahead.
    assert_eq!((s.steps, s.steps_ahead), (10, 8), "{s:?}");
}

#[test]
fn requests_that_arrive_or_leave_while_a_step_is_queued_ahead() {
    let alone =
        |r: Request| run(&mut Engine::new(model(64, DType::F64), None, engine_config(64, 64)).unwrap(), vec![r]);
    let mut engine = Engine::new(model(64, DType::F64), None, engine_config(64, 64)).unwrap();
    let reqs = requests();
    let (want_0, want_late) = (alone(reqs[0].clone()).remove(0).0, alone(reqs[3].clone()).remove(0).0);
    let first = engine.add(reqs[0].clone()).unwrap();
    let gone = engine.add(reqs[1].clone()).unwrap();
    let mut tokens: BTreeMap<RequestId, Vec<u32>> = BTreeMap::new();
    let mut late = None;
    for step in 0..200 {
        if engine.is_idle() {
            break;
        }
        if step == 3 {
            // A step is queued ahead now (two sequences decoding, nothing waiting).
            assert!(engine.stats().steps_ahead > 0, "{:?}", engine.stats());
            engine.abort(gone);
            late = Some(engine.add(reqs[3].clone()).unwrap());
        }
        for (id, e) in engine.step() {
            assert_ne!((id, step > 3), (gone, true), "an aborted request hears nothing more");
            if let Event::Token { id: t, .. } = e {
                tokens.entry(id).or_default().push(t);
            }
        }
        engine.check().unwrap();
    }
    assert!(engine.is_idle());
    assert_eq!(engine.stats().kv_used_blocks, 0);
    assert_eq!(tokens[&first], want_0);
    assert_eq!(tokens[&late.unwrap()], want_late);
}

#[test]
fn a_model_with_non_finite_logits_fails_its_requests_clearly() {
    let mut m = model(64, DType::F64);
    let head = m.params()["lm_head.weight"].clone();
    m.params_mut().insert("lm_head.weight".into(), (head * f64::NAN).unwrap());
    let mut engine = Engine::new(m, None, engine_config(64, 64)).unwrap();
    for (tokens, end) in run(&mut engine, requests()) {
        assert!(tokens.is_empty(), "{tokens:?}");
        assert!(matches!(&end, Event::Failed(m) if m.contains("not finite")), "{end:?}");
    }
}

/// The paged path against dense decoding, for each architecture (Instella's q/k norms span the
/// projection, so its paged step normalises before the cache write, not inside it).
#[test]
fn greedy_output_equals_the_trainer_s_generate() {
    for m in [model(64, DType::F64), model_of(&instella_with_head_dim(64, 4), DType::F64)] {
        let arch = m.config().arch;
        let mut engine = Engine::new(m.clone(), None, engine_config(64, 16)).unwrap();
        let reqs: Vec<Request> = prompts().into_iter().map(|p| Request::greedy(p, 12)).collect();
        for (req, (got, _)) in reqs.clone().into_iter().zip(run(&mut engine, reqs)) {
            let mut want = Vec::new();
            let limits = Limits { max_tokens: 12, vocab: 64, stop_ids: &[] };
            generate(&m, None, &req.prompt, limits, &Sampling::greedy(), |t| {
                want.push(t);
                ControlFlow::Continue(())
            })
            .unwrap();
            assert_eq!(got, want, "{arch:?}, prompt {:?}", req.prompt);
        }
    }
}

#[test]
fn prefix_cache_hits_give_the_tokens_of_misses() {
    let system: Vec<u32> = (0..14).map(|i| (i * 11 + 5) % 64).collect();
    let asks = |tail: &[u32]| Request::greedy([system.clone(), tail.to_vec()].concat(), 8);
    let mut cached = Engine::new(model(64, DType::F64), None, engine_config(64, 64)).unwrap();
    let mut uncached =
        Engine::new(model(64, DType::F64), None, EngineConfig { prefix_caching: false, ..engine_config(64, 64) })
            .unwrap();
    run(&mut cached, vec![asks(&[1, 2, 3])]);
    // The hits: three whole blocks of the 14 shared tokens, or four when the tail repeats the
    // first request's.
    for (tail, hits) in [(&[9u32, 8][..], 12), (&[1, 2, 3], 16), (&[60], 12)] {
        let hit = run(&mut cached, vec![asks(tail)]).remove(0);
        let miss = run(&mut uncached, vec![asks(tail)]).remove(0);
        assert_eq!(hit.0, miss.0, "tail {tail:?}");
        let Event::Finished { usage, .. } = hit.1 else { panic!("{:?}", hit.1) };
        assert_eq!(usage.cached_tokens, hits, "tail {tail:?}");
    }
}

#[test]
fn several_adapters_in_one_batch_answer_as_each_does_alone() {
    let base = model(64, DType::F64);
    let named = [("a", adapters(1, 2)), ("b", adapters(2, 4)), ("c", adapters(3, 3))];
    let mut engine = Engine::new(base.clone(), None, engine_config(64, 32)).unwrap();
    for (name, ad) in &named {
        engine.load_adapter(name, ad.clone()).unwrap();
    }
    assert_eq!(engine.adapters(), ["a", "b", "c"]);
    let prompt: Vec<u32> = (0..9).map(|i| (i * 17 + 4) % 64).collect();
    let ask =
        |adapter: Option<&str>| Request { adapter: adapter.map(str::to_string), ..Request::greedy(prompt.clone(), 10) };
    let which = [Some("b"), None, Some("a"), Some("c"), Some("a")];
    let together = run(&mut engine, which.iter().map(|&w| ask(w)).collect());
    for (w, (got, _)) in which.iter().zip(&together) {
        // The training model's decode path with that one adapter is the referee.
        let ad = w.map(|n| &named.iter().find(|(m, _)| *m == n).unwrap().1);
        let mut want = Vec::new();
        let limits = Limits { max_tokens: 10, vocab: 64, stop_ids: &[] };
        generate(&base, ad, &prompt, limits, &Sampling::greedy(), |t| {
            want.push(t);
            ControlFlow::Continue(())
        })
        .unwrap();
        assert_eq!(got, &want, "adapter {w:?}");
    }
    assert_ne!(together[0].0, together[1].0, "the adapters change the answer");
    // Asked again under the same adapter, the prompt's whole blocks come from the cache.
    let again = run(&mut engine, vec![ask(Some("c"))]).remove(0);
    let Event::Finished { usage, .. } = again.1 else { panic!() };
    assert_eq!((again.0, usage.cached_tokens), (together[3].0.clone(), 8));
}

#[test]
fn unknown_adapters_and_prompts_over_the_context_are_refused_clearly() {
    let mut engine = Engine::new(model(64, DType::F32), None, engine_config(64, 32)).unwrap();
    let err = engine.add(Request { adapter: Some("nope".into()), ..Request::greedy(vec![1], 4) }).unwrap_err();
    assert!(matches!(&err, EngineError::UnknownAdapter(n) if n == "nope"), "{err}");
    let err = engine.add(Request::greedy(vec![1; 96], 4)).unwrap_err();
    assert!(matches!(err, EngineError::PromptTooLong { prompt: 96, context: 96 }), "{err}");
    assert!(err.to_string().contains("96 tokens"));
    for (bad, what) in [
        (Request::greedy(vec![], 4), "empty"),
        (Request::greedy(vec![64], 4), "vocabulary"),
        (Request::greedy(vec![1], 0), "max_tokens"),
        (Request { stop: vec!["x".into()], ..Request::greedy(vec![1], 4) }, "tokenizer"),
        (
            Request {
                sampling: SamplingParams { temperature: 3.0, ..SamplingParams::greedy() },
                ..Request::greedy(vec![1], 4)
            },
            "temperature",
        ),
    ] {
        let e = engine.add(bad).unwrap_err().to_string();
        assert!(e.contains(what), "{e}");
    }
    // A prompt that nearly fills the context gets only what is left.
    let (tokens, end) = run(&mut engine, vec![Request::greedy(vec![1; 93], 50)]).remove(0);
    assert_eq!(tokens.len(), 3);
    assert!(matches!(
        end,
        Event::Finished { reason: FinishReason::Length, usage: Usage { completion_tokens: 3, .. }, .. }
    ));
    assert!(
        Engine::new(model(64, DType::F32), None, engine_config(10, 32)).is_err(),
        "10 blocks cannot hold 96 tokens"
    );
}

/// Adapters on a MoE model's experts are refused unmerged, saying how to serve them (the
/// per-row adapter kernels cover the projections, not the grouped expert GEMMs); adapters on the
/// same model's attention are served, and the merged model answers as the adapted one.
#[test]
fn adapters_on_experts_are_refused_unmerged_and_answer_merged() {
    use crate::model::{MoeShape, merge_lora};
    let moe = MoeShape {
        num_experts: 4,
        num_experts_per_tok: 2,
        moe_intermediate_size: 8,
        norm_topk_prob: true,
        decoder_sparse_step: 1,
        mlp_only_layers: vec![],
        router_aux_loss_coef: 0.0,
    };
    let c = LmConfig { moe: Some(moe), ..config(64) };
    let base = model_of(&c, DType::F64);
    let lora = |targets| LoraConfig { r: 2, alpha: 4.0, dropout: 0.0, target_modules: targets, rslora: false };
    let experts = Adapters::init(&c, &lora(TargetModule::all()), 5, DType::F64, &Device::Cpu).unwrap();
    let mut rng = SplitMix64::derive(6, &[]);
    let experts = Adapters {
        tensors: experts
            .tensors
            .iter()
            .map(|(k, t)| {
                let v: Vec<f64> = (0..t.elem_count()).map(|_| rng.unit() - 0.5).collect();
                (k.clone(), Tensor::from_vec(v, t.shape(), &Device::Cpu).unwrap())
            })
            .collect(),
        ..experts
    };
    let mut engine = Engine::new(base.clone(), None, engine_config(64, 32)).unwrap();
    let e = engine.load_adapter("moe-lora", experts.clone()).unwrap_err().to_string();
    assert!(e.contains("moe-lora") && e.contains("experts") && e.contains("--merge"), "{e}");
    let attention = Adapters::init(&c, &lora(vec![TargetModule::QProj]), 5, DType::F64, &Device::Cpu).unwrap();
    engine.load_adapter("attn", attention).unwrap();
    let merged = CausalLm::new(c.clone(), merge_lora(base.params(), &c, &experts).unwrap(), &Device::Cpu).unwrap();
    let mut merged_engine = Engine::new(merged, None, engine_config(64, 32)).unwrap();
    let (tokens, _) = run(&mut merged_engine, vec![Request::greedy(vec![1, 2, 3], 6)]).remove(0);
    let mut want = Vec::new();
    let limits = Limits { max_tokens: 6, vocab: 64, stop_ids: &[] };
    generate(&base, Some(&experts), &[1, 2, 3], limits, &Sampling::greedy(), |t| {
        want.push(t);
        ControlFlow::Continue(())
    })
    .unwrap();
    assert_eq!(tokens, want, "the merged experts answer as the adapted model");
}

#[test]
fn stop_strings_and_stop_tokens_end_the_text() {
    let tok = Tokenizer::byte();
    let vocab = tok.vocab_size().next_power_of_two();
    let prompt = tok.encode("hello").unwrap();
    let mut engine = Engine::new(model(vocab, DType::F64), Some(tok.clone()), engine_config(64, 32)).unwrap();
    let text = |events: &[Event]| -> String {
        events
            .iter()
            .map(|e| match e {
                Event::Token { text, .. } | Event::Finished { text, .. } => text.as_str(),
                Event::Failed(m) => panic!("{m}"),
            })
            .collect()
    };
    let collect = |engine: &mut Engine, req: Request| {
        let id = engine.add(req).unwrap();
        let mut events = Vec::new();
        while !engine.is_idle() {
            events.extend(engine.step().into_iter().filter(|(i, _)| *i == id).map(|(_, e)| e));
        }
        events
    };
    let free = collect(&mut engine, Request::greedy(prompt.clone(), 30));
    let whole = text(&free);
    let ids: Vec<u32> =
        free.iter().filter_map(|e| if let Event::Token { id, .. } = e { Some(*id) } else { None }).collect();
    // Streamed text equals the decode of all the tokens (except a stop token, never shown).
    let shown: Vec<u32> = ids.iter().copied().filter(|t| !tok.stop_ids().contains(t)).collect();
    assert_eq!(whole, tok.decode(&shown, true).unwrap());
    // Cut at a stop string taken from the middle of that answer.
    let chars: Vec<char> = whole.chars().collect();
    if chars.len() >= 4 {
        let stop: String = chars[chars.len() / 2..chars.len() / 2 + 2].iter().collect();
        let cut = collect(&mut engine, Request { stop: vec![stop.clone()], ..Request::greedy(prompt.clone(), 30) });
        assert_eq!(text(&cut), whole[..whole.find(&stop).unwrap()]);
        assert!(matches!(cut.last(), Some(Event::Finished { reason: FinishReason::Stop, .. })));
    }
}

#[test]
fn a_client_that_leaves_frees_its_slot_and_blocks() {
    let engine = Engine::new(model(64, DType::F32), None, engine_config(64, 32)).unwrap();
    let handle = EngineHandle::spawn(engine);
    let mut stream = handle.stream(Request::greedy(vec![1, 2, 3, 4, 5, 6], 80)).unwrap();
    assert!(matches!(stream.next(), Some(Event::Token { .. })));
    assert!(handle.stats().kv_used_blocks > 0 || handle.stats().running <= 1);
    drop(stream);
    // The engine drops it at its next step; then it is idle with every block free.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while handle.stats() != (Stats { kv_used_blocks: 0, running: 0, waiting: 0, ..handle.stats() }) {
        assert!(std::time::Instant::now() < deadline, "{:?}", handle.stats());
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    // It still serves the next request; once its stream has ended, the published load shows it
    // gone; refusals come back at submit time.
    let events: Vec<Event> = handle.stream(Request::greedy(vec![7, 8], 3)).unwrap().collect();
    assert_eq!(events.len(), 4);
    assert_eq!((handle.stats().running, handle.stats().kv_used_blocks), (0, 0));
    assert!(matches!(handle.stream(Request::greedy(vec![1; 200], 3)), Err(EngineError::PromptTooLong { .. })));
}

/// The engine depends on the model, never on training: `run` (and GRPO in it) may import
/// `infer`, not the other way round, and a recipe reaches the engine as an [`EngineConfig`].
#[test]
fn the_engine_imports_nothing_of_training() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/infer");
    let mut files = vec![root.with_extension("rs")];
    let mut dirs = vec![root];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                dirs.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                files.push(p);
            }
        }
    }
    assert!(files.len() > 10, "{files:?}");
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap();
        for banned in ["crate::run", "crate::optim", "crate::recipe::train", "crate::plan"] {
            let used = text.lines().any(|l| !l.trim_start().starts_with("//") && l.contains(banned));
            // The test itself names them in its list; it imports none of them.
            assert!(!used || f.ends_with("infer/tests.rs"), "{} uses {banned}", f.display());
        }
    }
}

/// Requests arriving at random steps (prompts chunked beside decodes, lengths 1 to 30, some
/// aborted): with steps queued ahead each request gets the tokens it gets with steps one at a
/// time. (An aborted request's count may differ: a request that arrives while a step is queued
/// ahead starts one step later, so an abort at a fixed step finds it a token shorter.)
#[test]
fn random_arrivals_and_aborts_give_the_same_tokens_with_steps_queued_ahead() {
    let mut rng = SplitMix64::new(11);
    for round in 0..4 {
        let reqs: Vec<(usize, Request, Option<usize>)> = (0..24)
            .map(|i| {
                let len = 1 + (rng.next_u64() % 30) as usize;
                let prompt: Vec<u32> = (0..len).map(|_| (rng.next_u64() % 64) as u32).collect();
                let arrive = (rng.next_u64() % 40) as usize;
                let abort = rng.next_u64().is_multiple_of(5).then(|| arrive + 1 + (rng.next_u64() % 8) as usize);
                let sampling = if i % 3 == 0 {
                    SamplingParams { temperature: 0.8, top_p: 0.95, top_k: 0, seed: i as u64 }
                } else {
                    SamplingParams::greedy()
                };
                let max_tokens = 1 + (rng.next_u64() % 12) as usize;
                (arrive, Request { prompt, max_tokens, sampling, adapter: None, stop: vec![] }, abort)
            })
            .collect();
        let drive = |overlap: bool| {
            let config = EngineConfig { overlap_steps: overlap, ..engine_config(48, 12) };
            let mut engine = Engine::new(model(64, DType::F64), None, config).unwrap();
            let mut ids: Vec<Option<RequestId>> = vec![None; reqs.len()];
            let mut tokens: BTreeMap<usize, Vec<u32>> = BTreeMap::new();
            for step in 0..400 {
                for (i, (arrive, req, abort)) in reqs.iter().enumerate() {
                    if *arrive == step {
                        ids[i] = Some(engine.add(req.clone()).unwrap());
                    }
                    if *abort == Some(step) {
                        engine.abort(ids[i].unwrap());
                    }
                }
                for (id, e) in engine.step() {
                    let i = ids.iter().position(|x| *x == Some(id)).unwrap();
                    if let Event::Token { id: t, .. } = e {
                        tokens.entry(i).or_default().push(t);
                    }
                }
                engine.check().unwrap();
            }
            assert!(engine.is_idle(), "round {round}");
            assert_eq!(engine.stats().kv_used_blocks, 0, "round {round}");
            (tokens, engine.stats())
        };
        let (want, _) = drive(false);
        let (got, stats) = drive(true);
        assert!(stats.steps_ahead > 0, "round {round}: {stats:?}");
        for (i, (_, _, abort)) in reqs.iter().enumerate() {
            let (g, w) = (got.get(&i).cloned().unwrap_or_default(), want.get(&i).cloned().unwrap_or_default());
            if abort.is_some() {
                let n = g.len().min(w.len());
                assert_eq!(g[..n], w[..n], "round {round}, aborted request {i}");
            } else {
                assert_eq!(g, w, "round {round}, request {i}");
            }
        }
    }
}

/// Adapters loaded and evicted while base-model requests run with steps queued ahead (the
/// engine then waits for the queued step and swaps the stack on its own thread): the running
/// requests get the tokens they get with no adapter traffic, and an engine dropped with a step
/// still queued waits for it rather than leave it writing into freed memory.
#[test]
fn adapters_loaded_and_evicted_mid_run_leave_running_requests_alone() {
    let reqs = || prompts().into_iter().map(|p| Request::greedy(p, 20)).collect::<Vec<_>>();
    let mut quiet = Engine::new(model(64, DType::F64), None, engine_config(96, 16)).unwrap();
    let want = run(&mut quiet, reqs());

    let mut busy = Engine::new(model(64, DType::F64), None, engine_config(96, 16)).unwrap();
    busy.load_adapter("early", adapters(1, 2)).unwrap();
    let ids: Vec<RequestId> = reqs().into_iter().map(|r| busy.add(r).unwrap()).collect();
    let mut got: BTreeMap<RequestId, Vec<u32>> = BTreeMap::new();
    for step in 0..10_000 {
        if busy.is_idle() {
            break;
        }
        match step {
            6 => busy.load_adapter("late", adapters(2, 4)).unwrap(),
            9 => busy.evict_adapter("early").unwrap(),
            _ => {}
        }
        for (id, e) in busy.step() {
            if let Event::Token { id: token, .. } = e {
                got.entry(id).or_default().push(token);
            }
        }
    }
    assert!(busy.stats().steps_ahead > 0, "no step was queued ahead: {:?}", busy.stats());
    assert_eq!(busy.adapters(), vec!["late".to_string()]);
    for (i, id) in ids.iter().enumerate() {
        assert_eq!(got[id], want[i].0, "request {i}: adapter traffic changed its tokens");
    }

    // Dropped mid-run, with a step queued ahead.
    let mut dropped = Engine::new(model(64, DType::F64), None, engine_config(96, 16)).unwrap();
    for r in reqs() {
        dropped.add(r).unwrap();
    }
    while dropped.stats().steps_ahead == 0 {
        dropped.step();
    }
    drop(dropped);
}
