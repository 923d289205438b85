//! QLoRA on a Qwen3-MoE model: the experts' stacked weights held in NF4 (the router dense)
//! compute exactly what a dense model holding their dequantised weights computes, the adapters'
//! gradients through them match finite differences, and what an expert weight costs in NF4.

use candle_core::{DType, Device, Tensor};

use super::moe::{down_name, gate_up_name, router_name};
use super::moe_tests::{adapter_gradients_match_finite_differences, all_targets, live_adapters_in, model, tiny_moe};
use super::nf4::Nf4Experts;
use super::tests::{bits, packed_batch};
use super::*;

/// `m` quantised for QLoRA, and a dense model holding each weight the quantised one keeps in
/// NF4 as the dense layers' storage ([`Nf4Tensor`]) gives it back.
pub(super) fn quantised_and_dequantised(m: &CausalLm) -> (CausalLm, CausalLm) {
    let mut q = m.clone();
    q.quantize_nf4().unwrap();
    let mut deq = m.params().clone();
    for (name, w) in m.params() {
        if !q.params().contains_key(name) {
            deq.insert(name.clone(), Nf4Tensor::quantize(w).unwrap().dequantize(w.dtype(), &Device::Cpu).unwrap());
        }
    }
    (q, CausalLm::new(m.config().clone(), deq, &Device::Cpu).unwrap())
}

/// Layer 1 is sparse: its experts go to NF4 beside the attention projections and layer 0's
/// dense MLP, its router stays dense. One LoRA step over the NF4 model (adapters on attention,
/// the dense MLP and the experts) gives the loss, balance loss and every adapter gradient of the
/// dense model bit for bit, and so does the forward alone and generation's cached decode.
#[test]
fn nf4_experts_compute_what_their_dequantised_weights_do() {
    let c = tiny_moe();
    let m = model(&c, DType::F32);
    let (q, deq) = quantised_and_dequantised(&m);
    for name in [gate_up_name(1), down_name(1), base_weight_name(0, Proj::Up), base_weight_name(1, Proj::Q)] {
        assert!(!q.params().contains_key(&name), "{name} is still held dense");
    }
    assert!(q.params().contains_key(&router_name(1)), "the router stays dense");
    assert!(q.is_quantized());
    // What the model hands out for an NF4 expert weight is its dequantisation.
    let held = q.weight(&gate_up_name(1)).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
    assert_eq!(held, deq.params()[&gate_up_name(1)].flatten_all().unwrap().to_vec1::<f32>().unwrap());

    let ad = live_adapters_in(&c, &all_targets(), DType::F32);
    let b = packed_batch();
    let opts = StepOptions::default();
    let got = q.forward_backward(&b, Trainable::Adapters, Some(&ad), &opts).unwrap();
    let want = deq.forward_backward(&b, Trainable::Adapters, Some(&ad), &opts).unwrap();
    assert_eq!(got.loss_sum.to_bits(), want.loss_sum.to_bits());
    assert_eq!(got.aux_loss.to_bits(), want.aux_loss.to_bits());
    assert_eq!(bits(&got.grads), bits(&want.grads));
    assert!(got.grads.keys().all(|k| k.contains("lora_")), "a frozen base takes no gradient");
    assert!(got.grads.keys().any(|k| k.contains("layers.1.mlp.experts")), "the experts' adapters train");
    let same = |a: &Tensor, b: &Tensor| {
        let v = |t: &Tensor| t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        assert_eq!(v(a), v(b));
    };
    same(&q.logits(&b, None).unwrap(), &deq.logits(&b, None).unwrap());
    let (mut qc, mut dc) = (q.new_cache(8), deq.new_cache(8));
    for id in [1u32, 5, 7] {
        same(&q.decode(&[id], &mut qc, Some(&ad)).unwrap(), &deq.decode(&[id], &mut dc, Some(&ad)).unwrap());
    }
    assert!(matches!(q.forward_backward(&b, Trainable::Full, None, &opts), Err(ModelError::Lora(_))));
}

/// The adapters' gradients through NF4 experts (each grouped product expanding its weight, the
/// input gradient through the expanded weight, no weight gradient) against central finite
/// differences in f64.
#[test]
fn adapter_gradients_through_nf4_experts_match_finite_differences() {
    let c = tiny_moe();
    let mut m = model(&c, DType::F64);
    m.quantize_nf4().unwrap();
    assert!(!m.params().contains_key(&gate_up_name(1)) && !m.params().contains_key(&down_name(1)));
    let cfg = all_targets();
    let ad = live_adapters_in(&c, &cfg, DType::F64);
    adapter_gradients_match_finite_differences(&c, &m, &ad);
}

/// An expert weight in NF4 holds half a byte per value and an f32 scale per block of 64: 0.5625
/// bytes per value against 2 in bf16 and 4 in f32, and nothing of it stays dense. It expands to
/// what the dense layers' NF4 storage gives back, expert by expert in place.
#[test]
fn an_nf4_expert_weight_holds_0_5625_bytes_per_value() {
    let c = tiny_moe();
    let m = model(&c, DType::F32);
    let w = &m.params()[&gate_up_name(1)];
    let q = Nf4Experts::quantize(w, &Device::Cpu).unwrap();
    assert_eq!(q.dims(), (4, 12, 8));
    let n = w.elem_count();
    assert_eq!(q.storage_bytes(), n / 2 + 4 * n.div_ceil(64));
    assert_eq!(q.storage_bytes() as f64 / n as f64, 0.5625);
    let back = q.dequantize(DType::F32).unwrap();
    let dense = Nf4Tensor::quantize(w).unwrap().dequantize(DType::F32, &Device::Cpu).unwrap();
    assert_eq!(back.dims(), w.dims());
    let v = |t: &Tensor| t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
    assert_eq!(v(&back), v(&dense));
    assert_eq!(v(&back.get(2).unwrap()), v(&dense.get(2).unwrap()), "expert 2 is its own rows");

    // The whole model: each quantised weight leaves `params`; its NF4 copy is all that is held.
    let mut qm = m.clone();
    qm.quantize_nf4().unwrap();
    let gone: Vec<usize> =
        m.params().iter().filter(|(k, _)| !qm.params().contains_key(*k)).map(|(_, t)| t.elem_count()).collect();
    assert_eq!(qm.nf4_bytes(), gone.iter().map(|n| n.div_ceil(2) + 4 * n.div_ceil(64)).sum::<usize>());
}

/// The probe's QLoRA model: drawn weight by weight with each NF4 target quantised as it is
/// drawn, it holds what `quantize_nf4` would (no target left dense, the router dense) and trains.
#[test]
fn the_timing_model_of_a_qlora_recipe_holds_its_base_in_nf4() {
    let c = tiny_moe();
    let m = CausalLm::init_for_timing_nf4(&c, DType::F32, &Device::Cpu).unwrap();
    let mut want = model(&c, DType::F32);
    want.quantize_nf4().unwrap();
    assert!(m.is_quantized());
    assert_eq!(m.params().keys().collect::<Vec<_>>(), want.params().keys().collect::<Vec<_>>());
    assert_eq!(m.nf4_bytes(), want.nf4_bytes());
    assert!(m.params().contains_key(&router_name(1)) && !m.params().contains_key(&gate_up_name(1)));
    let ad = live_adapters_in(&c, &all_targets(), DType::F32);
    let out = m.forward_backward(&packed_batch(), Trainable::Adapters, Some(&ad), &StepOptions::default()).unwrap();
    assert!(out.loss_sum.is_finite() && out.grads.len() == ad.tensors.len());
}
