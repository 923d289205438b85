//! The engine serving a Qwen3.5/3.6 dense hybrid on the CPU: Gated DeltaNet layers whose
//! recurrent state lives in a slot per running sequence, beside gated attention over the paged
//! cache. The referee is the model's dense decoding ([`generate`]), one request at a time.

use std::collections::BTreeMap;
use std::ops::ControlFlow;

use candle_core::DType;

use super::tests::{adapters_on, config_with_head_dim, engine_config, model_of, prompts, run};
use super::*;
use crate::generate::{Limits, Sampling, generate};
use crate::model::{Adapters, Arch, CausalLm, HybridShape, LayerKind, LmConfig};
use crate::recipe::TargetModule;

/// Linear, attention, linear: two key heads of 4 shared by four value heads of 3, a 4-tap conv,
/// and attention rotating half of each head of 4.
pub(super) fn hybrid(vocab: usize) -> LmConfig {
    hybrid_with(vocab, 4, (4, 3))
}

/// [`hybrid`] with attention heads of `head_dim` and linear-attention key and value heads of
/// `(key_dim, value_dim)`.
pub(super) fn hybrid_with(vocab: usize, head_dim: usize, (key_dim, value_dim): (usize, usize)) -> LmConfig {
    let linear = LayerKind::LinearAttention;
    LmConfig {
        arch: Arch::Qwen3_5,
        num_hidden_layers: 3,
        hybrid: Some(HybridShape {
            layer_types: vec![linear, LayerKind::Attention, linear],
            linear_conv_kernel_dim: 4,
            linear_key_head_dim: key_dim,
            linear_value_head_dim: value_dim,
            linear_num_key_heads: 2,
            linear_num_value_heads: 4,
            partial_rotary_factor: 0.5,
        }),
        ..config_with_head_dim(vocab, head_dim)
    }
}

/// What dense decoding generates greedily for `prompt`.
pub(super) fn generated(m: &CausalLm, adapters: Option<&Adapters>, prompt: &[u32], max_tokens: usize) -> Vec<u32> {
    let mut out = Vec::new();
    let limits = Limits { max_tokens, vocab: m.config().vocab_size, stop_ids: &[] };
    generate(m, adapters, prompt, limits, &Sampling::greedy(), |t| {
        out.push(t);
        ControlFlow::Continue(())
    })
    .unwrap();
    out
}

/// Requests arriving at different steps (each `(step, request)`) until all ended; each one's
/// tokens, in the order of `arrivals`.
pub(super) fn run_arrivals(engine: &mut Engine, arrivals: Vec<(usize, Request)>) -> Vec<Vec<u32>> {
    let mut ids = vec![0; arrivals.len()];
    let mut tokens: BTreeMap<RequestId, Vec<u32>> = BTreeMap::new();
    let last = arrivals.iter().map(|a| a.0).max().unwrap_or(0);
    for step in 0..10_000 {
        for (i, (_, req)) in arrivals.iter().enumerate().filter(|(_, a)| a.0 == step) {
            ids[i] = engine.add(req.clone()).unwrap();
        }
        if step > last && engine.is_idle() {
            break;
        }
        for (id, e) in engine.step() {
            match e {
                Event::Token { id: t, .. } => tokens.entry(id).or_default().push(t),
                Event::Failed(m) => panic!("request {id} failed: {m}"),
                Event::Finished { .. } => {}
            }
        }
        engine.check().unwrap();
    }
    assert_eq!(engine.stats().kv_used_blocks, 0);
    ids.iter().map(|id| tokens.remove(id).unwrap_or_default()).collect()
}

#[test]
fn hybrid_requests_joining_and_leaving_at_different_steps_give_dense_decoding_s_tokens() {
    let m = model_of(&hybrid(64), DType::F64);
    let want: Vec<Vec<u32>> = prompts().iter().enumerate().map(|(i, p)| generated(&m, None, p, 5 + 2 * i)).collect();
    let arrivals = |at: &[usize]| -> Vec<(usize, Request)> {
        prompts().into_iter().enumerate().map(|(i, p)| (at[i], Request::greedy(p, 5 + 2 * i))).collect()
    };
    // A budget of 7 tokens a step splits the prompts at odd points (23 = 7 + 7 + 7 + 2 beside
    // decodes), and sequences join while others decode or prefill.
    for (budget, at) in [(7, [0, 0, 1, 3, 4, 9]), (64, [2, 0, 5, 5, 1, 0]), (13, [0, 1, 2, 3, 4, 5])] {
        let config = EngineConfig { max_num_seqs: 6, ..engine_config(64, budget) };
        let mut engine = Engine::new(m.clone(), None, config).unwrap();
        assert_eq!(run_arrivals(&mut engine, arrivals(&at)), want, "budget {budget}, arrivals {at:?}");
    }
    // A cache so small that sequences are preempted: each recomputes from a zeroed state.
    let mut tight = Engine::new(m.clone(), None, engine_config(24, 16)).unwrap();
    let got: Vec<Vec<u32>> =
        run(&mut tight, arrivals(&[0; 6]).into_iter().map(|a| a.1).collect()).into_iter().map(|r| r.0).collect();
    assert_eq!(got, want, "with preemption");
    // Fewer state slots than requests: they wait for one, then run from a zeroed state.
    let few = EngineConfig { max_num_seqs: 2, max_batched_tokens: 9, ..engine_config(64, 9) };
    let mut engine = Engine::new(m.clone(), None, few).unwrap();
    assert_eq!(run_arrivals(&mut engine, arrivals(&[0; 6])), want, "two slots");
}

#[test]
fn hybrid_adapters_in_one_batch_answer_as_each_does_alone() {
    let c = hybrid(64);
    let base = model_of(&c, DType::F64);
    let targets = |t: &[TargetModule]| t.to_vec();
    use TargetModule::*;
    let named = [
        ("linear", adapters_on(&c, 1, 2, targets(&[InProjQkv, InProjZ, InProjB, InProjA, OutProj]))),
        ("both", adapters_on(&c, 2, 3, targets(&[QProj, OProj, InProjQkv, DownProj]))),
    ];
    let mut engine = Engine::new(base.clone(), None, engine_config(64, 11)).unwrap();
    for (name, ad) in &named {
        engine.load_adapter(name, ad.clone()).unwrap();
    }
    let prompt: Vec<u32> = (0..9).map(|i| (i * 17 + 4) % 64).collect();
    let which = [Some("both"), None, Some("linear"), Some("linear")];
    let reqs = which
        .iter()
        .map(|w| Request { adapter: w.map(str::to_string), ..Request::greedy(prompt.clone(), 8) })
        .collect();
    let together = run(&mut engine, reqs);
    for (w, (got, _)) in which.iter().zip(&together) {
        let ad = w.map(|n| &named.iter().find(|(m, _)| *m == n).unwrap().1);
        assert_eq!(got, &generated(&base, ad, &prompt, 8), "adapter {w:?}");
    }
    assert_ne!(together[0].0, together[1].0, "the adapters change the answer");
    assert_ne!(together[2].0, together[1].0, "the linear-attention adapters change the answer");
}

#[test]
fn a_hybrid_engine_reuses_no_prefix_and_says_so() {
    let m = model_of(&hybrid(64), DType::F64);
    let mut engine = Engine::new(m.clone(), None, engine_config(64, 64)).unwrap();
    assert!(engine.config().prefix_caching, "asked for");
    assert!(!engine.prefix_caching(), "a recurrent state at a prefix's end is in no cached block");
    let prompt: Vec<u32> = (0..14).map(|i| (i * 11 + 5) % 64).collect();
    let first = run(&mut engine, vec![Request::greedy(prompt.clone(), 6)]).remove(0);
    let again = run(&mut engine, vec![Request::greedy(prompt.clone(), 6)]).remove(0);
    assert_eq!(first.0, again.0);
    assert_eq!(first.0, generated(&m, None, &prompt, 6));
    let Event::Finished { usage, .. } = again.1 else { panic!("{:?}", again.1) };
    assert_eq!(usage.cached_tokens, 0);
    // An attention-only model keeps the prefix cache.
    let dense = Engine::new(model_of(&config_with_head_dim(64, 4), DType::F64), None, engine_config(64, 64)).unwrap();
    assert!(dense.prefix_caching());
}
