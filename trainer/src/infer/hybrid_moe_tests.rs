//! The engine serving a Qwen3.5/3.6-MoE hybrid on the CPU: every layer's routed experts and its
//! sigmoid-gated shared expert (packed gate/up, per-row adapters) over the paged step, beside the
//! dense hybrid's recurrent and attention layers. The referee is dense decoding ([`generated`]).

use candle_core::DType;

use super::hybrid_tests::{generated, hybrid};
use super::tests::{adapters_on, engine_config, model_of, prompts, run};
use super::*;
use crate::model::{LmConfig, MoeShape};
use crate::recipe::TargetModule;

/// [`hybrid`] with every layer sparse: 4 experts of 5, 2 per token, and the shared expert of
/// the dense shape's MLP width.
pub(super) fn hybrid_moe(vocab: usize) -> LmConfig {
    let moe = MoeShape {
        num_experts: 4,
        num_experts_per_tok: 2,
        moe_intermediate_size: 5,
        norm_topk_prob: true,
        decoder_sparse_step: 1,
        mlp_only_layers: Vec::new(),
        router_aux_loss_coef: 0.0,
    };
    LmConfig { moe: Some(moe), ..hybrid(vocab) }
}

#[test]
fn moe_hybrid_requests_in_chunks_and_with_adapters_give_dense_decoding_s_tokens() {
    let c = hybrid_moe(64);
    let m = model_of(&c, DType::F64);
    let want: Vec<Vec<u32>> = prompts().iter().enumerate().map(|(i, p)| generated(&m, None, p, 4 + i)).collect();
    // Budgets that split prompts at odd points, decodes beside prefill chunks.
    for budget in [7, 64] {
        let config = EngineConfig { max_num_seqs: 6, ..engine_config(64, budget) };
        let mut engine = Engine::new(m.clone(), None, config).unwrap();
        let reqs = prompts().into_iter().enumerate().map(|(i, p)| Request::greedy(p, 4 + i)).collect();
        let got: Vec<Vec<u32>> = run(&mut engine, reqs).into_iter().map(|r| r.0).collect();
        assert_eq!(got, want, "budget {budget}");
    }
    // Adapters on the shared expert (PEFT's gate/up/down_proj match its projections) and on its
    // gate, one of them beside the base in the same steps.
    use TargetModule::*;
    let shared = adapters_on(&c, 5, 2, vec![GateProj, UpProj, DownProj, SharedExpertGate]);
    let mut engine = Engine::new(m.clone(), None, engine_config(64, 11)).unwrap();
    engine.load_adapter("shared", shared.clone()).unwrap();
    let prompt: Vec<u32> = (0..9).map(|i| (i * 13 + 2) % 64).collect();
    let which = [Some("shared"), None, Some("shared")];
    let reqs = which
        .iter()
        .map(|w| Request { adapter: w.map(str::to_string), ..Request::greedy(prompt.clone(), 8) })
        .collect();
    let together = run(&mut engine, reqs);
    let (adapted, base) = (generated(&m, Some(&shared), &prompt, 8), generated(&m, None, &prompt, 8));
    assert_eq!([&together[0].0, &together[1].0, &together[2].0], [&adapted, &base, &adapted]);
    assert_ne!(adapted, base, "the shared expert's adapters change the answer");
}
