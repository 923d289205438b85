//! Qwen3-MoE model tests: gradients (router, experts, attention, the load-balancing loss)
//! against finite differences in f64 and f32 against f64, LoRA over a model with sparse layers
//! (on the experts too: gradients, merge, names, refusals), determinism, per-expert checkpoint
//! names, and serving-path decode equal to the full forward.

use candle_core::{DType, Device, Tensor};
use mindxtrain_kernels::gradcheck::{Tolerance, check_scalar_at};

use super::moe::{down_name, expert_name, fuse_experts, gate_up_name, router_name, split_experts};
use super::rng::SplitMix64;
use super::tests::{bits, packed_batch};
use super::*;
use crate::batch::{IGNORE, PackedBatch};
use crate::recipe::TargetModule;

/// Two layers: layer 0 dense (`mlp_only_layers`), layer 1 sparse with 4 experts, 2 per token.
pub(super) fn tiny_moe() -> LmConfig {
    LmConfig {
        arch: crate::model::Arch::Qwen3,
        moe: Some(MoeShape {
            num_experts: 4,
            num_experts_per_tok: 2,
            moe_intermediate_size: 6,
            norm_topk_prob: true,
            decoder_sparse_step: 1,
            mlp_only_layers: vec![0],
            router_aux_loss_coef: 0.1,
        }),
        ..super::tests::tiny(false)
    }
}

/// Weights well away from HF's 0.02 so routing and curvature are real; norms (and a hybrid's
/// gate parameters) perturbed.
pub(super) fn model(config: &LmConfig, dtype: DType) -> CausalLm {
    let mut m = CausalLm::init_random(config, 5, dtype, &Device::Cpu).unwrap();
    let mut rng = SplitMix64::new(77);
    for (name, t) in m.params_mut().iter_mut() {
        let noise: Vec<f64> = (0..t.elem_count()).map(|_| rng.normal()).collect();
        let noise = Tensor::from_vec(noise, t.shape(), &Device::Cpu).unwrap().to_dtype(dtype).unwrap();
        *t = if super::tests::perturbed_by_offset(name) {
            (&*t + (noise * 0.3).unwrap()).unwrap()
        } else {
            (&*t * 20.0).unwrap()
        };
    }
    m
}

pub(super) fn probes(sizes: &[usize], per_tensor: usize) -> Vec<(usize, usize)> {
    let mut rng = SplitMix64::new(1234);
    sizes
        .iter()
        .enumerate()
        .flat_map(|(i, &n)| (0..per_tensor.min(n)).map(move |_| (i, n)))
        .map(|(i, n)| (i, (rng.next_u64() % n as u64) as usize))
        .collect()
}

pub(super) fn err(e: ModelError) -> candle_core::Error {
    candle_core::Error::Msg(e.to_string())
}

/// The objective the step differentiates: summed token loss plus the weighted balance loss.
pub(super) fn objective(config: &LmConfig, out: &StepOutput) -> f64 {
    let coef = config.moe.as_ref().map_or(0.0, |m| m.router_aux_loss_coef);
    out.loss_sum + coef * out.target_tokens as f64 * out.aux_loss
}

/// Every parameter's gradient of the step's objective (token loss and balance loss) at probes,
/// against finite differences; layer 1 is sparse.
pub(super) fn gradcheck_full(config: &LmConfig) {
    let m = model(config, DType::F64);
    let b = packed_batch();
    let out = m.forward_backward(&b, Trainable::Full, None, &StepOptions::default()).unwrap();
    let names: Vec<String> = m.params().keys().cloned().collect();
    assert_eq!(out.grads.keys().collect::<Vec<_>>(), names.iter().collect::<Vec<_>>(), "a gradient is missing");
    for name in [router_name(1), gate_up_name(1), down_name(1)] {
        assert!(names.contains(&name), "{name}");
    }
    assert!(!names.iter().any(|n| n.contains("layers.1.mlp.up_proj")), "a sparse layer has no dense MLP");
    let inputs: Vec<Tensor> = names.iter().map(|n| m.params()[n].clone()).collect();
    let analytic: Vec<Tensor> = names.iter().map(|n| out.grads[n].clone()).collect();
    let loss = |ts: &[Tensor]| -> candle_core::Result<f64> {
        let params: Params = names.iter().cloned().zip(ts.iter().cloned()).collect();
        let m = CausalLm::new(config.clone(), params, &Device::Cpu).map_err(err)?;
        let o = m.forward_backward(&b, Trainable::Full, None, &StepOptions::default()).map_err(err)?;
        Ok(objective(config, &o))
    };
    let sizes: Vec<usize> = inputs.iter().map(|t| t.elem_count()).collect();
    let tol = Tolerance { eps: 1e-5, atol: 1e-8, rtol: 1e-5 };
    check_scalar_at(loss, &inputs, &analytic, &probes(&sizes, 4), tol).unwrap();
    assert!(out.aux_loss > 0.0);
}

#[test]
fn full_moe_gradients_match_finite_differences_with_the_balance_loss() {
    gradcheck_full(&tiny_moe());
}

#[test]
fn full_moe_gradients_match_finite_differences_unnormalised_every_layer_sparse() {
    let mut c = tiny_moe();
    let moe = c.moe.as_mut().unwrap();
    moe.norm_topk_prob = false;
    moe.mlp_only_layers.clear();
    moe.router_aux_loss_coef = 0.0;
    gradcheck_full(&c);
}

#[test]
fn f32_gradients_match_the_f64_reference() {
    let c = tiny_moe();
    let (m64, m32) = (model(&c, DType::F64), model(&c, DType::F32));
    let b = packed_batch();
    let g64 = m64.forward_backward(&b, Trainable::Full, None, &StepOptions::default()).unwrap();
    let g32 = m32.forward_backward(&b, Trainable::Full, None, &StepOptions::default()).unwrap();
    assert!((g64.loss_sum - g32.loss_sum).abs() < 1e-4 * g64.loss_sum.abs().max(1.0));
    assert!((g64.aux_loss - g32.aux_loss).abs() < 1e-5);
    for (name, want) in &g64.grads {
        let got = g32.grads[name].to_dtype(DType::F64).unwrap();
        let scale = want.abs().unwrap().max_all().unwrap().to_scalar::<f64>().unwrap().max(1e-3);
        let diff = (got - want).unwrap().abs().unwrap().max_all().unwrap().to_scalar::<f64>().unwrap();
        assert!(diff < 2e-3 * scale, "{name}: {diff} against {scale}");
    }
}

/// Adapters over a MoE model with every B made non-zero, so each branch is live.
fn live_adapters(c: &LmConfig, cfg: &LoraConfig) -> Adapters {
    live_adapters_in(c, cfg, DType::F64)
}

pub(super) fn live_adapters_in(c: &LmConfig, cfg: &LoraConfig, dtype: DType) -> Adapters {
    let mut ad = Adapters::init(c, cfg, 3, dtype, &Device::Cpu).unwrap();
    let mut rng = SplitMix64::new(11);
    for (name, t) in ad.tensors.iter_mut() {
        if name.contains("lora_B") {
            let v: Vec<f64> = (0..t.elem_count()).map(|_| 0.3 * rng.normal()).collect();
            *t = Tensor::from_vec(v, t.shape(), &Device::Cpu).unwrap().to_dtype(dtype).unwrap();
        }
    }
    ad
}

pub(super) fn all_targets() -> LoraConfig {
    LoraConfig { r: 2, alpha: 4.0, dropout: 0.0, target_modules: TargetModule::all(), rslora: false }
}

/// LoRA over a MoE model: adapters on attention (both layers), the dense layer's MLP and the
/// sparse layer's experts (PEFT's `target_parameters` layout and names), none on the router;
/// every adapter's gradient, the experts' included, matches finite differences.
#[test]
fn lora_gradients_on_attention_and_experts_match_finite_differences() {
    let c = tiny_moe();
    let m = model(&c, DType::F64);
    let cfg = all_targets();
    let ad = live_adapters(&c, &cfg);
    assert!(ad.tensors.keys().any(|n| n.contains("layers.1.self_attn.q_proj")));
    assert!(ad.tensors.keys().any(|n| n.contains("layers.0.mlp.up_proj")));
    assert!(!ad.tensors.keys().any(|n| n.contains("mlp.gate.")), "no adapter on the router");
    // gate_up_proj (innermost in PEFT's nesting, at rank 2r) and down_proj (rank r):
    // A [E·r', in], B [out, r'·E].
    let gu_a = "base_model.model.model.layers.1.mlp.experts.base_layer.lora_A.weight";
    let gu_b = "base_model.model.model.layers.1.mlp.experts.base_layer.lora_B.weight";
    let down_b = "base_model.model.model.layers.1.mlp.experts.lora_B.weight";
    assert_eq!(ad.tensors[gu_a].dims(), [4 * 4, 8]);
    assert_eq!(ad.tensors[gu_b].dims(), [12, 4 * 4]);
    assert_eq!(ad.tensors[down_b].dims(), [8, 2 * 4]);
    assert_eq!(cfg.target_parameters(&c), ["gate_up_proj", "down_proj"]);
    adapter_gradients_match_finite_differences(&c, &m, &ad);
}

/// Every adapter gradient of one step of `m` (f64) at `ad` against central finite differences
/// of the step's objective, a few probes per tensor.
pub(super) fn adapter_gradients_match_finite_differences(c: &LmConfig, m: &CausalLm, ad: &Adapters) {
    let b = packed_batch();
    let out = m.forward_backward(&b, Trainable::Adapters, Some(ad), &StepOptions::default()).unwrap();
    let names: Vec<String> = ad.tensors.keys().cloned().collect();
    assert_eq!(out.grads.keys().collect::<Vec<_>>(), names.iter().collect::<Vec<_>>());
    let inputs: Vec<Tensor> = names.iter().map(|n| ad.tensors[n].clone()).collect();
    let analytic: Vec<Tensor> = names.iter().map(|n| out.grads[n].clone()).collect();
    let loss = |ts: &[Tensor]| -> candle_core::Result<f64> {
        let ad =
            Adapters { config: ad.config.clone(), tensors: names.iter().cloned().zip(ts.iter().cloned()).collect() };
        let o = m.forward_backward(&b, Trainable::Adapters, Some(&ad), &StepOptions::default()).map_err(err)?;
        Ok(objective(c, &o))
    };
    let sizes: Vec<usize> = inputs.iter().map(|t| t.elem_count()).collect();
    check_scalar_at(loss, &inputs, &analytic, &probes(&sizes, 3), Tolerance { eps: 1e-5, atol: 1e-8, rtol: 1e-5 })
        .unwrap();
}

/// Full fine-tuning with adapters on: the expert weights and their adapters both get gradients,
/// and folding the adapters into the experts (`merge_lora`) gives the adapted model's logits.
#[test]
fn expert_adapters_merge_into_the_experts() {
    let c = tiny_moe();
    let m = model(&c, DType::F64);
    let ad = live_adapters(&c, &all_targets());
    let b = packed_batch();
    let adapted = m.logits(&b, Some(&ad)).unwrap();
    let merged = CausalLm::new(c.clone(), merge_lora(m.params(), &c, &ad).unwrap(), &Device::Cpu).unwrap();
    let diff = (merged.logits(&b, None).unwrap() - &adapted).unwrap().abs().unwrap().max_all().unwrap();
    assert!(diff.to_scalar::<f64>().unwrap() < 1e-9, "merged experts differ from the adapted ones");
    let base = m.logits(&b, None).unwrap();
    let moved = (base - &adapted).unwrap().abs().unwrap().max_all().unwrap().to_scalar::<f64>().unwrap();
    assert!(moved > 1e-3, "the expert adapters change nothing");
}

/// Only `down_proj` targeted: one adapter per sparse layer, under `mlp.experts` itself; gate and
/// up alone adapt the fused weight at rank 2r; one of them alone is refused (PEFT refuses it:
/// they are one weight); attention alone leaves the experts be.
#[test]
fn expert_targets_follow_the_recipe_targets() {
    let c = tiny_moe();
    let only = |t: Vec<TargetModule>| LoraConfig { target_modules: t, ..all_targets() };
    let down = Adapters::init(&c, &only(vec![TargetModule::DownProj]), 1, DType::F32, &Device::Cpu).unwrap();
    assert_eq!(down.tensors["base_model.model.model.layers.1.mlp.experts.lora_A.weight"].dims(), [8, 6]);
    assert!(down.tensors.keys().any(|n| n.contains("layers.0.mlp.down_proj")));
    let gu = only(vec![TargetModule::GateProj, TargetModule::UpProj]);
    let up = Adapters::init(&c, &gu, 1, DType::F32, &Device::Cpu).unwrap();
    assert_eq!(up.tensors["base_model.model.model.layers.1.mlp.experts.lora_B.weight"].dims(), [12, 16]);
    assert_eq!(gu.expert_scaling(ExpertProj::GateUp), gu.scaling(), "2α over 2r");
    let rs = LoraConfig { rslora: true, ..gu };
    assert!((rs.expert_scaling(ExpertProj::GateUp) - 2.0 * 4.0 / 4f64.sqrt()).abs() < 1e-12, "2α over √(2r)");
    let e = Adapters::init(&c, &only(vec![TargetModule::UpProj]), 1, DType::F32, &Device::Cpu).unwrap_err();
    assert!(e.to_string().contains("target both or neither"), "{e}");
    let attn = only(vec![TargetModule::QProj, TargetModule::VProj]);
    assert!(attn.target_parameters(&c).is_empty());
    let ad = Adapters::init(&c, &attn, 1, DType::F32, &Device::Cpu).unwrap();
    assert!(!ad.adapts_experts(&c) && !ad.tensors.keys().any(|n| n.contains("experts")));
}

/// LoRA dropout cannot apply to the experts' gathered rows (PEFT refuses it there too): a
/// recipe asking for both is refused, naming what to change.
#[test]
fn dropout_with_expert_targets_is_refused() {
    let c = tiny_moe();
    let cfg = LoraConfig { dropout: 0.1, ..all_targets() };
    let e = Adapters::init(&c, &cfg, 1, DType::F32, &Device::Cpu).unwrap_err().to_string();
    assert!(e.contains("dropout") && e.contains("mlp.experts.gate_up_proj"), "{e}");
    let attn = LoraConfig { target_modules: vec![TargetModule::QProj], ..cfg };
    assert!(Adapters::init(&c, &attn, 1, DType::F32, &Device::Cpu).is_ok(), "dropout on attention alone is fine");
}

#[test]
fn steps_are_bitwise_deterministic_across_thread_counts_and_checkpointing() {
    let c = tiny_moe();
    let m = model(&c, DType::F32);
    let b = packed_batch();
    let run = |threads: usize, ckpt: bool| {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
        let opts = StepOptions { activation_checkpointing: ckpt, ..StepOptions::default() };
        pool.install(|| m.forward_backward(&b, Trainable::Full, None, &opts).unwrap())
    };
    let one = run(1, false);
    let many = run(3, false);
    let ckpt = run(2, true);
    assert_eq!(bits(&one.grads), bits(&many.grads));
    assert_eq!(bits(&one.grads), bits(&ckpt.grads));
    assert_eq!(one.loss_sum.to_bits(), many.loss_sum.to_bits());
}

#[test]
fn per_expert_checkpoint_names_load_and_split_back() -> Result<(), ModelError> {
    let c = tiny_moe();
    let m = model(&c, DType::F32);
    let hub = split_experts(&c, m.params())?;
    assert!(hub.contains_key(&expert_name(1, 3, "down_proj")) && !hub.contains_key(&gate_up_name(1)));
    assert_eq!(hub[&expert_name(1, 2, "gate_proj")].dims(), [6, 8]);
    // Expert 2's up projection is rows F..2F of its stacked gate/up.
    let want = m.params()[&gate_up_name(1)].get(2)?.narrow(0, 6, 6)?;
    assert_eq!(
        hub[&expert_name(1, 2, "up_proj")].flatten_all()?.to_vec1::<f32>()?,
        want.flatten_all()?.to_vec1::<f32>()?
    );
    let back = CausalLm::new(c.clone(), hub.clone(), &Device::Cpu)?;
    for (name, t) in m.params() {
        assert_eq!(back.params()[name].flatten_all()?.to_vec1::<f32>()?, t.flatten_all()?.to_vec1::<f32>()?, "{name}");
    }
    let mut partial = hub;
    partial.remove(&expert_name(1, 3, "up_proj"));
    match fuse_experts(&c, &mut partial) {
        Err(ModelError::MissingParam(n)) => assert_eq!(n, expert_name(1, 3, "up_proj")),
        other => panic!("expected the missing expert to be named, got {other:?}"),
    }
    Ok(())
}

/// Generation's cached decode runs the same sparse MLP as the full forward.
#[test]
fn cached_decode_matches_the_full_forward() {
    let c = tiny_moe();
    let m = model(&c, DType::F64);
    let ids = [1u32, 5, 7, 2, 3];
    let full = m.logits(&PackedBatch::single_row(&ids), None).unwrap();
    let mut cache = m.new_cache(16);
    for (i, &id) in ids.iter().enumerate() {
        let step = m.decode(&[id], &mut cache, None).unwrap().to_vec1::<f64>().unwrap();
        let want = full.get(0).unwrap().get(i).unwrap().to_vec1::<f64>().unwrap();
        for (a, b) in step.iter().zip(&want) {
            assert!((a - b).abs() < 1e-9, "token {i}: {a} vs {b}");
        }
    }
}

/// Padding (segment 0) is routed but, as in HF's `load_balancing_loss_func` with an attention
/// mask, does not count towards the balance: a document padded to a longer row gives the loss
/// and every gradient of the same document alone.
#[test]
fn padding_does_not_count_towards_the_balance_loss() {
    let c = tiny_moe();
    let m = model(&c, DType::F64);
    let ids = [1u32, 5, 7, 2, 3];
    let labels = vec![5, 7, 2, 3, IGNORE];
    let alone = PackedBatch { labels: labels.clone(), ..PackedBatch::single_row(&ids) };
    let padded = PackedBatch {
        batch: 1,
        seq_len: 8,
        input_ids: [&ids[..], &[0, 0, 0]].concat(),
        position_ids: vec![0, 1, 2, 3, 4, 0, 0, 0],
        segment_ids: vec![1, 1, 1, 1, 1, 0, 0, 0],
        labels: [labels, vec![IGNORE; 3]].concat(),
    };
    let step = |b: &PackedBatch| m.forward_backward(b, Trainable::Full, None, &StepOptions::default()).unwrap();
    let (a, p) = (step(&alone), step(&padded));
    assert!(a.aux_loss > 0.0);
    assert!((a.aux_loss - p.aux_loss).abs() < 1e-12, "balance loss {} alone, {} padded", a.aux_loss, p.aux_loss);
    assert!((a.loss_sum - p.loss_sum).abs() < 1e-10);
    for (name, g) in &a.grads {
        let gap = (g - &p.grads[name]).unwrap().abs().unwrap().max_all().unwrap().to_scalar::<f64>().unwrap();
        assert!(gap < 1e-10, "{name}: gradients differ by {gap} with padding");
    }
}
