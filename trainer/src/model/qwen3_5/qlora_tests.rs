//! QLoRA on the Qwen3.5/3.6 hybrids, dense and MoE: every projection PEFT targets (gated
//! attention's four, the Gated DeltaNet's five, the MLP's or the shared expert's three, and the
//! stacked experts) held in NF4 computes exactly what a dense model holding their dequantised
//! weights computes, and one adapter step follows the full-precision base's within NF4's rounding.

use std::collections::BTreeMap;

use candle_core::{DType, Device, Tensor};

use super::super::moe::{down_name, gate_up_name, router_name};
use super::super::moe_tests::{live_adapters_in, model};
use super::super::qlora_moe_tests::quantised_and_dequantised;
use super::super::tests::{bits, packed_batch};
use super::super::{CausalLm, LmConfig, ModelError, Proj, StepOptions, Trainable, base_weight_name};
use super::moe_tests::{every_target, tiny_hybrid_moe};
use super::tests::tiny_hybrid;

/// The cosine of two gradient sets over every tensor of `a`, as one flattened vector.
fn cosine(a: &BTreeMap<String, Tensor>, b: &BTreeMap<String, Tensor>) -> f64 {
    let v = |t: &Tensor| t.flatten_all().unwrap().to_dtype(DType::F64).unwrap().to_vec1::<f64>().unwrap();
    let (mut dot, mut na, mut nb) = (0.0, 0.0, 0.0);
    for (k, ta) in a {
        for (x, y) in v(ta).iter().zip(v(&b[k])) {
            (dot, na, nb) = (dot + x * y, na + x * x, nb + y * y);
        }
    }
    dot / (na.sqrt() * nb.sqrt())
}

fn qlora_step_matches_its_dequantised_base_and_follows_lora(c: &LmConfig) {
    let m = model(c, DType::F32);
    let (q, deq) = quantised_and_dequantised(&m);
    for layer in 0..c.num_hidden_layers {
        for proj in Proj::of_layer(c, layer) {
            let name = base_weight_name(layer, proj);
            // The shared expert's one-row gate logit stays dense, as the router does.
            let dense = proj == Proj::SharedExpertGate;
            assert_eq!(q.params().contains_key(&name), dense, "{name}: held dense is {}", !dense);
        }
        if c.moe.is_some() {
            assert!(!q.params().contains_key(&gate_up_name(layer)) && !q.params().contains_key(&down_name(layer)));
            assert!(q.params().contains_key(&router_name(layer)), "the router stays dense");
        }
    }
    let ad = live_adapters_in(c, &every_target(), DType::F32);
    let b = packed_batch();
    let opts = StepOptions::default();
    let got = q.forward_backward(&b, Trainable::Adapters, Some(&ad), &opts).unwrap();
    let want = deq.forward_backward(&b, Trainable::Adapters, Some(&ad), &opts).unwrap();
    assert_eq!(got.loss_sum.to_bits(), want.loss_sum.to_bits());
    assert_eq!(bits(&got.grads), bits(&want.grads));
    assert!(got.grads.keys().all(|k| k.contains("lora_")), "a frozen base takes no gradient");
    assert!(got.grads.keys().any(|k| k.contains("linear_attn.in_proj_qkv")), "the Gated DeltaNet's adapters train");
    assert!(matches!(q.forward_backward(&b, Trainable::Full, None, &opts), Err(ModelError::Lora(_))));

    // At transformers' init scale (the weights above are 20 times it, to make every product
    // count), the NF4 base's step follows the full-precision base's.
    let plain = CausalLm::init_random(c, 5, DType::F32, &Device::Cpu).unwrap();
    let (q, _) = quantised_and_dequantised(&plain);
    let got = q.forward_backward(&b, Trainable::Adapters, Some(&ad), &opts).unwrap();
    let lora = plain.forward_backward(&b, Trainable::Adapters, Some(&ad), &opts).unwrap();
    let rel = (got.loss_sum - lora.loss_sum).abs() / lora.loss_sum.abs();
    let cos = cosine(&lora.grads, &got.grads);
    eprintln!("NF4 vs dense base: loss rel {rel:.5}, gradient cosine {cos:.5}");
    assert!(rel < 2e-3, "the QLoRA loss parts from LoRA's by {rel}");
    assert!(cos > 0.9, "the QLoRA gradient points away from LoRA's (cosine {cos})");
}

#[test]
fn qlora_on_the_dense_hybrid_holds_both_layer_kinds_in_nf4() {
    qlora_step_matches_its_dequantised_base_and_follows_lora(&tiny_hybrid(false));
}

#[test]
fn qlora_on_the_moe_hybrid_holds_experts_and_shared_expert_in_nf4() {
    qlora_step_matches_its_dequantised_base_and_follows_lora(&tiny_hybrid_moe());
}
