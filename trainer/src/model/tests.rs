//! Whole-model tests: gradient checks against finite differences in f64, packing, causality,
//! tying, determinism, checkpointing, LoRA, QLoRA, preferences and generation.

use std::collections::BTreeMap;

use candle_core::{DType, Device, Tensor};
use mindxtrain_kernels::gradcheck::{Tolerance, check_scalar_at};

use super::rng::SplitMix64;
use super::*;
use crate::batch::{IGNORE, PackedBatch, PreferenceBatch};
use crate::generate::{Limits, Sampling, generate};
use crate::recipe::TargetModule;

pub(super) fn tiny(tied: bool) -> LmConfig {
    LmConfig {
        arch: crate::model::Arch::Qwen3,
        vocab_size: 11,
        hidden_size: 8,
        intermediate_size: 12,
        num_hidden_layers: 2,
        num_attention_heads: 2,
        num_key_value_heads: 1,
        head_dim: 4,
        rms_norm_eps: 1e-6,
        rope_theta: 10_000.0,
        tie_word_embeddings: tied,
        max_position_embeddings: 64,
        moe: None,
        hybrid: None,
    }
}

/// Whether a test model moves parameter `name` off its init by adding noise (gains and Qwen3.5's
/// per-head gate parameters, whose scale is meaningful) rather than scaling it.
pub(super) fn perturbed_by_offset(name: &str) -> bool {
    ["norm.weight", "A_log", "dt_bias"].iter().any(|s| name.ends_with(s))
}

/// A model whose norms are not all ones (so their gradients are exercised off the identity).
fn model(config: &LmConfig, dtype: DType) -> CausalLm {
    let mut m = CausalLm::init_random(config, 5, dtype, &Device::Cpu).unwrap();
    let mut rng = SplitMix64::new(77);
    for (name, t) in m.params_mut().iter_mut() {
        // Gains and per-head gate parameters (Qwen3.5's A_log, dt_bias) are moved off their
        // init by noise; weights are made larger than HF's 0.02 so the check sees real
        // curvature, not a near-linear net.
        let offset = perturbed_by_offset(name);
        let scale = if offset { 0.3 } else { 0.4 / 0.02 };
        let n = t.elem_count();
        let noise: Vec<f64> = (0..n).map(|_| rng.normal()).collect();
        let noise = Tensor::from_vec(noise, t.shape(), &Device::Cpu).unwrap().to_dtype(dtype).unwrap();
        *t = if offset { (&*t + (noise * scale).unwrap()).unwrap() } else { (&*t * scale).unwrap() };
    }
    m
}

/// Two rows of 7: row 0 packs two documents (4 + 3 tokens), row 1 one document and padding.
pub(super) fn packed_batch() -> PackedBatch {
    PackedBatch {
        batch: 2,
        seq_len: 7,
        input_ids: vec![1, 5, 7, 2, 3, 9, 4, 6, 6, 10, 0, 8, 0, 0],
        position_ids: vec![0, 1, 2, 3, 0, 1, 2, 0, 1, 2, 3, 4, 0, 0],
        segment_ids: vec![1, 1, 1, 1, 2, 2, 2, 1, 1, 1, 1, 1, 0, 0],
        labels: vec![5, 7, 2, IGNORE, 9, 4, IGNORE, IGNORE, 10, 0, 8, IGNORE, IGNORE, IGNORE],
    }
}

/// Adapters on every projection a model has (a hybrid's linear-attention ones too).
fn lora(dropout: f64) -> LoraConfig {
    LoraConfig { r: 2, alpha: 4.0, dropout, target_modules: TargetModule::EVERY.to_vec(), rslora: false }
}

/// Adapters with non-zero B, so both A and B gradients are informative.
fn adapters(config: &LmConfig, dropout: f64, dtype: DType) -> Adapters {
    let mut ad = Adapters::init(config, &lora(dropout), 3, dtype, &Device::Cpu).unwrap();
    let mut rng = SplitMix64::new(11);
    for (name, t) in ad.tensors.iter_mut() {
        if name.contains("lora_B") {
            let v: Vec<f64> = (0..t.elem_count()).map(|_| 0.3 * rng.normal()).collect();
            *t = Tensor::from_vec(v, t.shape(), &Device::Cpu).unwrap().to_dtype(dtype).unwrap();
        }
    }
    ad
}

/// A few probes per tensor, chosen by a seeded stream.
fn probes(sizes: &[usize], per_tensor: usize) -> Vec<(usize, usize)> {
    let mut rng = SplitMix64::new(1234);
    let mut out = Vec::new();
    for (i, &n) in sizes.iter().enumerate() {
        for _ in 0..per_tensor.min(n) {
            out.push((i, (rng.next_u64() % n as u64) as usize));
        }
    }
    out
}

fn tol() -> Tolerance {
    Tolerance { eps: 1e-5, atol: 1e-8, rtol: 1e-5 }
}

/// Gradient of the summed loss w.r.t. base parameters, checked at probes of every parameter.
pub(super) fn gradcheck_full(config: &LmConfig) {
    let m = model(config, DType::F64);
    let batch = packed_batch();
    let opts = StepOptions::default();
    let out = m.forward_backward(&batch, Trainable::Full, None, &opts).unwrap();
    let names: Vec<String> = m.params().keys().cloned().collect();
    assert_eq!(out.grads.keys().collect::<Vec<_>>(), names.iter().collect::<Vec<_>>(), "a gradient is missing");
    let inputs: Vec<Tensor> = names.iter().map(|n| m.params()[n].clone()).collect();
    let analytic: Vec<Tensor> = names.iter().map(|n| out.grads[n].clone()).collect();
    let loss = |ts: &[Tensor]| -> candle_core::Result<f64> {
        let params: Params = names.iter().cloned().zip(ts.iter().cloned()).collect();
        let m =
            CausalLm::new(config.clone(), params, &Device::Cpu).map_err(|e| candle_core::Error::Msg(e.to_string()))?;
        let l = m.token_losses(&batch, None).map_err(|e| candle_core::Error::Msg(e.to_string()))?;
        l.sum_all()?.to_scalar::<f64>()
    };
    let sizes: Vec<usize> = inputs.iter().map(|t| t.elem_count()).collect();
    check_scalar_at(loss, &inputs, &analytic, &probes(&sizes, 4), tol()).unwrap();
    let direct = loss(&inputs).unwrap();
    assert!((direct - out.loss_sum).abs() < 1e-12);
    assert_eq!(out.target_tokens, 8);
}

#[test]
fn full_model_gradients_match_finite_differences_untied() {
    gradcheck_full(&tiny(false));
}

#[test]
fn full_model_gradients_match_finite_differences_tied() {
    gradcheck_full(&tiny(true));
}

fn adapter_loss(
    m: &CausalLm,
    batch: &PackedBatch,
    names: &[String],
    cfg: &LoraConfig,
    ts: &[Tensor],
    seed: u64,
) -> candle_core::Result<f64> {
    let tensors: BTreeMap<String, Tensor> = names.iter().cloned().zip(ts.iter().cloned()).collect();
    let ad = Adapters { config: cfg.clone(), tensors };
    let err = |e: ModelError| candle_core::Error::Msg(e.to_string());
    let ctx = m.step_ctx(batch, Trainable::Adapters, Some(&ad), Some(seed), &super::NoHooks).map_err(err)?;
    let (_, losses) = m.forward_tape(&ctx, batch, false).map_err(err)?;
    losses.sum_all()?.to_scalar::<f64>()
}

#[test]
fn lora_gradients_match_finite_differences_with_dropout_and_no_base_grads() {
    lora_gradcheck(&tiny(false));
}

/// LoRA gradients (dropout on) at probes of every adapter tensor; the base gets none.
pub(super) fn lora_gradcheck(config: &LmConfig) {
    let config = config.clone();
    let m = model(&config, DType::F64);
    let ad = adapters(&config, 0.25, DType::F64);
    let batch = packed_batch();
    let opts = StepOptions { dropout_seed: 42, ..Default::default() };
    let out = m.forward_backward(&batch, Trainable::Adapters, Some(&ad), &opts).unwrap();
    let names: Vec<String> = ad.tensors.keys().cloned().collect();
    let projections: usize = (0..config.num_hidden_layers).map(|l| Proj::of_layer(&config, l).len()).sum();
    assert_eq!(names.len(), 2 * projections);
    assert_eq!(out.grads.keys().collect::<Vec<_>>(), names.iter().collect::<Vec<_>>(), "only and all adapter grads");
    let inputs: Vec<Tensor> = names.iter().map(|n| ad.tensors[n].clone()).collect();
    let analytic: Vec<Tensor> = names.iter().map(|n| out.grads[n].clone()).collect();
    let f = |ts: &[Tensor]| adapter_loss(&m, &batch, &names, &ad.config, ts, 42);
    let sizes: Vec<usize> = inputs.iter().map(|t| t.elem_count()).collect();
    check_scalar_at(f, &inputs, &analytic, &probes(&sizes, 3), tol()).unwrap();
    // Another dropout seed draws other masks, so another loss.
    let l42 = adapter_loss(&m, &batch, &names, &ad.config, &inputs, 42).unwrap();
    let l43 = adapter_loss(&m, &batch, &names, &ad.config, &inputs, 43).unwrap();
    assert!((l42 - out.loss_sum).abs() < 1e-12 && (l42 - l43).abs() > 1e-6);
}

fn single(ids: &[u32], labels: &[i64]) -> PackedBatch {
    PackedBatch { labels: labels.to_vec(), ..PackedBatch::single_row(ids) }
}

#[test]
fn a_packed_row_trains_like_its_documents_alone() {
    let config = tiny(false);
    let m = model(&config, DType::F64);
    let batch = packed_batch();
    let logits = m.logits(&batch, None).unwrap().to_vec3::<f64>().unwrap();
    let doc_a = single(&[1, 5, 7, 2], &[5, 7, 2, IGNORE]);
    let doc_b = single(&[3, 9, 4], &[9, 4, IGNORE]);
    let la = m.logits(&doc_a, None).unwrap().to_vec3::<f64>().unwrap();
    let lb = m.logits(&doc_b, None).unwrap().to_vec3::<f64>().unwrap();
    for t in 0..4 {
        for v in 0..11 {
            assert!((logits[0][t][v] - la[0][t][v]).abs() < 1e-12);
        }
    }
    for t in 0..3 {
        for v in 0..11 {
            assert!((logits[0][4 + t][v] - lb[0][t][v]).abs() < 1e-12);
        }
    }
    let row0 = PackedBatch { batch: 1, seq_len: 7, ..batch.clone() };
    let row0 = PackedBatch {
        input_ids: row0.input_ids[..7].to_vec(),
        position_ids: row0.position_ids[..7].to_vec(),
        segment_ids: row0.segment_ids[..7].to_vec(),
        labels: row0.labels[..7].to_vec(),
        ..row0
    };
    let opts = StepOptions::default();
    let packed = m.forward_backward(&row0, Trainable::Full, None, &opts).unwrap();
    let a = m.forward_backward(&doc_a, Trainable::Full, None, &opts).unwrap();
    let b = m.forward_backward(&doc_b, Trainable::Full, None, &opts).unwrap();
    assert!((packed.loss_sum - a.loss_sum - b.loss_sum).abs() < 1e-12);
    assert_eq!(packed.target_tokens, a.target_tokens + b.target_tokens);
    for (name, g) in &packed.grads {
        let sum = (&a.grads[name] + &b.grads[name]).unwrap();
        let diff = (g - sum).unwrap().abs().unwrap().max_all().unwrap().to_scalar::<f64>().unwrap();
        assert!(diff < 1e-12, "{name}: {diff}");
    }
}

#[test]
fn later_tokens_do_not_change_earlier_logits() {
    let m = model(&tiny(false), DType::F64);
    let a = m.logits(&single(&[1, 2, 3, 4, 5], &[IGNORE; 5]), None).unwrap().to_vec3::<f64>().unwrap();
    let b = m.logits(&single(&[1, 2, 3, 9, 0], &[IGNORE; 5]), None).unwrap().to_vec3::<f64>().unwrap();
    assert_eq!(a[0][..3], b[0][..3]);
    assert_ne!(a[0][3], b[0][3]);
}

#[test]
fn a_tied_head_equals_an_untied_copy_and_sums_both_gradients() {
    let tied = model(&tiny(true), DType::F64);
    assert!(!tied.params().contains_key(LM_HEAD));
    let mut params = tied.params().clone();
    params.insert(LM_HEAD.to_string(), params[EMBED].clone());
    let untied = CausalLm::new(tiny(false), params, &Device::Cpu).unwrap();
    let batch = packed_batch();
    let lt = tied.logits(&batch, None).unwrap().to_vec3::<f64>().unwrap();
    let lu = untied.logits(&batch, None).unwrap().to_vec3::<f64>().unwrap();
    assert_eq!(lt, lu);
    let opts = StepOptions::default();
    let gt = tied.forward_backward(&batch, Trainable::Full, None, &opts).unwrap().grads;
    let gu = untied.forward_backward(&batch, Trainable::Full, None, &opts).unwrap().grads;
    let sum = (&gu[EMBED] + &gu[LM_HEAD]).unwrap();
    let diff = (&gt[EMBED] - sum).unwrap().abs().unwrap().max_all().unwrap().to_scalar::<f64>().unwrap();
    assert!(diff < 1e-14, "{diff}");
}

pub(super) fn bits(grads: &BTreeMap<String, Tensor>) -> BTreeMap<String, Vec<u32>> {
    grads
        .iter()
        .map(|(k, v)| {
            (k.clone(), v.flatten_all().unwrap().to_vec1::<f32>().unwrap().iter().map(|x| x.to_bits()).collect())
        })
        .collect()
}

#[test]
fn same_seed_gives_bitwise_identical_weights_and_gradients() {
    let config = tiny(false);
    let a = CausalLm::init_random(&config, 9, DType::F32, &Device::Cpu).unwrap();
    let b = CausalLm::init_random(&config, 9, DType::F32, &Device::Cpu).unwrap();
    let c = CausalLm::init_random(&config, 10, DType::F32, &Device::Cpu).unwrap();
    assert_eq!(bits(a.params()), bits(b.params()));
    assert_ne!(bits(a.params()), bits(c.params()));
    let ad = Adapters::init(&config, &lora(0.1), 4, DType::F32, &Device::Cpu).unwrap();
    let batch = packed_batch();
    let opts = StepOptions { dropout_seed: 8, ..Default::default() };
    for trainable in [Trainable::Full, Trainable::Adapters] {
        let g1 = a.forward_backward(&batch, trainable, Some(&ad), &opts).unwrap();
        let g2 = b.forward_backward(&batch, trainable, Some(&ad), &opts).unwrap();
        assert_eq!(bits(&g1.grads), bits(&g2.grads));
        assert_eq!(g1.loss_sum.to_bits(), g2.loss_sum.to_bits());
    }
}

#[test]
fn activation_checkpointing_gives_identical_gradients() {
    // Both layer kinds: the hybrid's Gated DeltaNet layers recompute from the block input too.
    for config in [tiny(false), super::qwen3_5::tests::tiny_hybrid(false)] {
        checkpointing_gives_identical_gradients(&config);
    }
}

/// A bf16 model (every parameter bf16, as a bf16 recipe loads it) steps on the CPU within bf16
/// rounding of the f32 model, for both layer kinds: mixed dtypes inside a layer (the hybrid's
/// f32 gates and state) must meet the bf16 activations at the right casts.
#[test]
fn bf16_steps_follow_f32_for_every_layer_kind() {
    for config in [tiny(false), super::qwen3_5::tests::tiny_hybrid(false)] {
        let m32 = model(&config, DType::F32);
        let params: BTreeMap<String, Tensor> =
            m32.params().iter().map(|(n, t)| (n.clone(), t.to_dtype(DType::BF16).unwrap())).collect();
        let m16 = CausalLm::new(config.clone(), params, &Device::Cpu).unwrap();
        let batch = packed_batch();
        let opts = StepOptions::default();
        let a = m32.forward_backward(&batch, Trainable::Full, None, &opts).unwrap();
        let b = m16.forward_backward(&batch, Trainable::Full, None, &opts).unwrap();
        let rel = ((b.loss_sum - a.loss_sum) / a.loss_sum).abs();
        assert!(rel < 2e-2, "{:?}: loss {} in bf16 vs {} in f32", config.arch, b.loss_sum, a.loss_sum);
        assert_eq!(a.grads.keys().collect::<Vec<_>>(), b.grads.keys().collect::<Vec<_>>());
        for (name, g) in &b.grads {
            assert_eq!(g.dtype(), DType::BF16, "{name}");
        }
    }
}

fn checkpointing_gives_identical_gradients(config: &LmConfig) {
    let m = model(config, DType::F32);
    let ad = adapters(config, 0.2, DType::F32);
    let batch = packed_batch();
    for trainable in [Trainable::Full, Trainable::Adapters] {
        let off = StepOptions { dropout_seed: 3, ..Default::default() };
        let on = StepOptions { activation_checkpointing: true, ..off };
        let a = m.forward_backward(&batch, trainable, Some(&ad), &off).unwrap();
        let b = m.forward_backward(&batch, trainable, Some(&ad), &on).unwrap();
        assert_eq!(bits(&a.grads), bits(&b.grads));
        assert_eq!(a.loss_sum.to_bits(), b.loss_sum.to_bits());
    }
}

#[test]
fn loss_scale_scales_gradients_not_the_reported_loss() {
    let m = model(&tiny(false), DType::F64);
    let batch = packed_batch();
    let one = m.forward_backward(&batch, Trainable::Full, None, &StepOptions::default()).unwrap();
    let scaled = StepOptions { loss_scale: 0.25, ..Default::default() };
    let quarter = m.forward_backward(&batch, Trainable::Full, None, &scaled).unwrap();
    assert_eq!(one.loss_sum, quarter.loss_sum);
    let want = (&one.grads[EMBED] * 0.25).unwrap();
    let diff = (&quarter.grads[EMBED] - want).unwrap().abs().unwrap().max_all().unwrap().to_scalar::<f64>().unwrap();
    assert!(diff < 1e-15);
}

#[test]
fn fresh_adapters_leave_the_base_logits_exactly_and_merging_matches_the_adapted_model() {
    let config = tiny(false);
    let m = model(&config, DType::F64);
    let batch = packed_batch();
    let fresh = Adapters::init(&config, &lora(0.0), 1, DType::F64, &Device::Cpu).unwrap();
    let base = m.logits(&batch, None).unwrap().to_vec3::<f64>().unwrap();
    assert_eq!(m.logits(&batch, Some(&fresh)).unwrap().to_vec3::<f64>().unwrap(), base);
    let a = fresh.tensors[&adapter_name(1, Proj::Up, 'A')].to_vec2::<f64>().unwrap();
    let bound = 1.0 / (config.hidden_size as f64).sqrt();
    assert!(a.iter().flatten().all(|x| x.abs() <= bound) && a.iter().flatten().any(|x| x.abs() > bound / 2.0));

    let ad = adapters(&config, 0.0, DType::F64);
    let adapted = m.logits(&batch, Some(&ad)).unwrap();
    let merged = CausalLm::new(config.clone(), merge_lora(m.params(), &config, &ad).unwrap(), &Device::Cpu).unwrap();
    let diff = (adapted - merged.logits(&batch, None).unwrap()).unwrap().abs().unwrap().max_all().unwrap();
    assert!(diff.to_scalar::<f64>().unwrap() < 1e-12);
    assert!(base != m.logits(&batch, Some(&ad)).unwrap().to_vec3::<f64>().unwrap());
}

#[test]
fn only_targeted_modules_get_adapters() {
    let config = tiny(false);
    let cfg = LoraConfig { target_modules: vec![TargetModule::QProj, TargetModule::VProj], ..lora(0.0) };
    let ad = Adapters::init(&config, &cfg, 1, DType::F32, &Device::Cpu).unwrap();
    let names: Vec<&String> = ad.tensors.keys().collect();
    assert_eq!(names.len(), 8);
    assert!(names.contains(&&"base_model.model.model.layers.1.self_attn.v_proj.lora_B.weight".to_string()));
    assert_eq!(ad.tensors["base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"].dims(), &[2, 8]);
    assert_eq!(ad.tensors["base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight"].dims(), &[8, 2]);
    assert!(Adapters::new(&config, cfg.clone(), ad.tensors.clone()).is_ok());
    let mut missing = ad.tensors.clone();
    missing.remove("base_model.model.model.layers.1.self_attn.v_proj.lora_B.weight");
    assert!(matches!(Adapters::new(&config, cfg, missing), Err(ModelError::MissingParam(_))));
    assert_eq!(LoraConfig { rslora: true, r: 4, ..lora(0.0) }.scaling(), 2.0);
}

#[test]
fn new_rejects_missing_extra_and_misshapen_parameters() {
    let config = tiny(false);
    let good = params::init_random(&config, 1, DType::F32, &Device::Cpu).unwrap();
    let mut p = good.clone();
    p.remove("model.layers.1.self_attn.k_norm.weight");
    assert!(
        matches!(CausalLm::new(config.clone(), p, &Device::Cpu), Err(ModelError::MissingParam(n)) if n.contains("k_norm"))
    );
    let mut p = good.clone();
    p.insert("model.layers.2.mlp.up_proj.weight".into(), Tensor::zeros((12, 8), DType::F32, &Device::Cpu).unwrap());
    assert!(matches!(CausalLm::new(config.clone(), p, &Device::Cpu), Err(ModelError::UnexpectedParam(_))));
    let mut p = good.clone();
    p.insert("model.layers.0.mlp.up_proj.weight".into(), Tensor::zeros((8, 12), DType::F32, &Device::Cpu).unwrap());
    assert!(matches!(CausalLm::new(config.clone(), p, &Device::Cpu), Err(ModelError::Shape { .. })));
    let mut p = good;
    p.insert(FINAL_NORM.into(), Tensor::ones(8, DType::F64, &Device::Cpu).unwrap());
    assert!(matches!(CausalLm::new(config, p, &Device::Cpu), Err(ModelError::DType { .. })));
}

#[test]
fn malformed_batches_are_typed_errors() {
    let m = model(&tiny(false), DType::F32);
    let opts = StepOptions::default();
    let mut b = packed_batch();
    b.input_ids[3] = 11;
    assert!(matches!(m.forward_backward(&b, Trainable::Full, None, &opts), Err(ModelError::Batch(_))));
    let mut b = packed_batch();
    b.labels[0] = 11;
    assert!(matches!(m.forward_backward(&b, Trainable::Full, None, &opts), Err(ModelError::Batch(_))));
    let mut b = packed_batch();
    b.segment_ids.pop();
    assert!(matches!(m.forward_backward(&b, Trainable::Full, None, &opts), Err(ModelError::Batch(_))));
    assert!(matches!(m.forward_backward(&packed_batch(), Trainable::Adapters, None, &opts), Err(ModelError::Lora(_))));
}

#[test]
fn qlora_trains_adapters_over_an_nf4_base_equal_to_its_dequantised_weights() {
    let config = tiny(false);
    let dense = model(&config, DType::F32);
    let mut q = dense.clone();
    q.quantize_nf4().unwrap();
    assert!(q.is_quantized() && !q.params().contains_key("model.layers.0.mlp.up_proj.weight"));
    // A dense model holding the dequantised weights computes the same thing.
    let mut deq = dense.params().clone();
    for layer in 0..2 {
        for proj in Proj::ALL {
            let name = base_weight_name(layer, proj);
            let w = Nf4Tensor::quantize(&deq[&name]).unwrap().dequantize(DType::F32, &Device::Cpu).unwrap();
            deq.insert(name, w);
        }
    }
    let deq = CausalLm::new(config.clone(), deq, &Device::Cpu).unwrap();
    let ad = adapters(&config, 0.0, DType::F32);
    let batch = packed_batch();
    let opts = StepOptions::default();
    let a = q.forward_backward(&batch, Trainable::Adapters, Some(&ad), &opts).unwrap();
    let b = deq.forward_backward(&batch, Trainable::Adapters, Some(&ad), &opts).unwrap();
    assert_eq!(bits(&a.grads), bits(&b.grads));
    assert!(a.grads.keys().all(|k| k.contains("lora_")));
    assert!(matches!(q.forward_backward(&batch, Trainable::Full, None, &opts), Err(ModelError::Lora(_))));
}

fn preference_batch() -> PreferenceBatch {
    let row = |ids: &[u32], labels: &[i64]| single(ids, labels);
    let join = |a: PackedBatch, b: PackedBatch| PackedBatch {
        batch: 2,
        seq_len: a.seq_len,
        input_ids: [a.input_ids, b.input_ids].concat(),
        position_ids: [a.position_ids, b.position_ids].concat(),
        segment_ids: [a.segment_ids, b.segment_ids].concat(),
        labels: [a.labels, b.labels].concat(),
    };
    PreferenceBatch {
        chosen: join(row(&[1, 2, 3, 4, 5], &[IGNORE, 3, 4, 5, 6]), row(&[7, 2, 8, 8, 1], &[IGNORE, IGNORE, 8, 1, 2])),
        rejected: join(
            row(&[1, 2, 9, 0, 0], &[IGNORE, 9, 0, 0, IGNORE]),
            row(&[7, 2, 3, 3, 3], &[IGNORE, IGNORE, 3, 3, 4]),
        ),
    }
}

fn preference_gradcheck(loss: PreferenceLoss) {
    let config = tiny(false);
    let m = model(&config, DType::F64);
    let ad = adapters(&config, 0.0, DType::F64);
    let batch = preference_batch();
    let opts = StepOptions::default();
    let out = m.forward_backward_preference(&batch, loss, None, Trainable::Adapters, Some(&ad), &opts).unwrap();
    let names: Vec<String> = ad.tensors.keys().cloned().collect();
    assert_eq!(out.grads.len(), names.len());
    let inputs: Vec<Tensor> = names.iter().map(|n| ad.tensors[n].clone()).collect();
    let analytic: Vec<Tensor> = names.iter().map(|n| out.grads[n].clone()).collect();
    let f = |ts: &[Tensor]| -> candle_core::Result<f64> {
        let tensors: BTreeMap<String, Tensor> = names.iter().cloned().zip(ts.iter().cloned()).collect();
        let ad = Adapters { config: ad.config.clone(), tensors };
        let out = m
            .forward_backward_preference(&batch, loss, None, Trainable::Adapters, Some(&ad), &opts)
            .map_err(|e| candle_core::Error::Msg(e.to_string()))?;
        Ok(out.loss_sum)
    };
    let sizes: Vec<usize> = inputs.iter().map(|t| t.elem_count()).collect();
    check_scalar_at(f, &inputs, &analytic, &probes(&sizes, 3), tol()).unwrap();
    assert_eq!(out.pairs, 2);
    // The policy's log-probs are what sequence_logps reports for the same rows.
    let lp = m.sequence_logps(&batch.chosen, Some(&ad)).unwrap();
    assert!((lp[1] - out.chosen_logps[1]).abs() < 1e-12);
}

#[test]
fn dpo_gradients_match_finite_differences() {
    preference_gradcheck(PreferenceLoss::Dpo { beta: 0.5, label_smoothing: 0.1, form: DpoForm::Sigmoid });
    preference_gradcheck(PreferenceLoss::Dpo { beta: 0.5, label_smoothing: 0.0, form: DpoForm::Ipo });
    // Inside the margin (1 − βh > 0, as at these small adapters) the hinge is linear in h.
    preference_gradcheck(PreferenceLoss::Dpo { beta: 0.5, label_smoothing: 0.0, form: DpoForm::Hinge });
}

/// At the reference (h = 0) each form has its own value: log 2 (DPO starts there), 1 and 1/(4β²)
/// per pair, so a run that read `loss: ipo` or `hinge` as sigmoid would not pass.
#[test]
fn each_dpo_loss_form_starts_at_its_own_value_when_the_policy_is_the_reference() {
    let config = tiny(false);
    let m = model(&config, DType::F64);
    let fresh = Adapters::init(&config, &lora(0.0), 1, DType::F64, &Device::Cpu).unwrap();
    let beta = 0.1;
    for (form, per_pair) in
        [(DpoForm::Sigmoid, 2f64.ln()), (DpoForm::Hinge, 1.0), (DpoForm::Ipo, 1.0 / (4.0 * beta * beta))]
    {
        let loss = PreferenceLoss::Dpo { beta, label_smoothing: 0.0, form };
        let out = m
            .forward_backward_preference(
                &preference_batch(),
                loss,
                None,
                Trainable::Adapters,
                Some(&fresh),
                &StepOptions::default(),
            )
            .unwrap();
        assert!((out.loss_sum - 2.0 * per_pair).abs() < 1e-9, "{form:?}: {}", out.loss_sum);
    }
}

#[test]
fn orpo_gradients_match_finite_differences() {
    preference_gradcheck(PreferenceLoss::Orpo { lambda: 0.7 });
}

#[test]
fn greedy_generation_follows_the_argmax_and_stops() {
    let m = model(&tiny(false), DType::F64);
    let run = |stop: &[u32]| {
        let mut out = vec![];
        let greedy = Sampling::greedy();
        let limits = Limits { max_tokens: 6, vocab: usize::MAX, stop_ids: stop };
        generate(&m, None, &[1, 2], limits, &greedy, |t| {
            out.push(t);
            std::ops::ControlFlow::Continue(())
        })
        .unwrap();
        out
    };
    let out = run(&[]);
    assert_eq!(out.len(), 6);
    let mut seq = vec![1u32, 2];
    for &tok in &out {
        let logits = m.logits(&single(&seq, &vec![IGNORE; seq.len()]), None).unwrap().to_vec3::<f64>().unwrap();
        let last = &logits[0][seq.len() - 1];
        let argmax = (0..last.len()).fold(0, |b, i| if last[i] > last[b] { i } else { b });
        assert_eq!(tok as usize, argmax);
        seq.push(tok);
    }
    // A stop token ends generation and is not handed over.
    let stopped = run(&[out[1]]);
    assert_eq!(stopped, out[..stopped.len()].to_vec());
    assert!(stopped.len() <= 1);
}

#[test]
fn sampling_never_draws_ids_beyond_the_tokenizers_vocabulary() {
    let m = model(&tiny(true), DType::F64);
    let hot = Sampling { temperature: 2.0, top_p: 1.0, seed: 4 };
    let mut drawn = vec![];
    let limits = Limits { max_tokens: 40, vocab: 3, stop_ids: &[] };
    generate(&m, None, &[1, 2], limits, &hot, |t| {
        drawn.push(t);
        std::ops::ControlFlow::Continue(())
    })
    .unwrap();
    assert!(!drawn.is_empty() && drawn.iter().all(|&t| t < 3), "{drawn:?}");
}

#[test]
fn cached_decoding_gives_the_full_forward_logits_with_adapters() {
    cached_decoding_matches_the_full_forward(&tiny(false));
}

/// Decoding with a cache, in chunks of 3, 1, 1 and 2 tokens, gives the logits of one forward.
pub(super) fn cached_decoding_matches_the_full_forward(config: &LmConfig) {
    let config = config.clone();
    let m = model(&config, DType::F64);
    let ad = adapters(&config, 0.0, DType::F64);
    let seq = [3u32, 1, 4, 1, 5, 9, 2];
    let full = m.logits(&single(&seq, &[IGNORE; 7]), Some(&ad)).unwrap().to_vec3::<f64>().unwrap();
    let mut cache = m.new_cache(16);
    // A prompt of three, then one token at a time, then two at once.
    let mut at = 0;
    for n in [3usize, 1, 1, 2] {
        let logits = m.decode(&seq[at..at + n], &mut cache, Some(&ad)).unwrap().to_vec1::<f64>().unwrap();
        at += n;
        assert_eq!(cache.len(), at);
        let want = &full[0][at - 1];
        let diff = logits.iter().zip(want).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);
        assert!(diff < 1e-10, "after {at} tokens: max |Δ| {diff}");
    }
}

#[test]
fn a_full_cache_refuses_more_tokens_and_stays_usable() {
    let m = model(&tiny(true), DType::F64);
    let mut cache = m.new_cache(4);
    m.decode(&[1, 2, 3], &mut cache, None).unwrap();
    let err = m.decode(&[4, 5], &mut cache, None).unwrap_err().to_string();
    assert!(err.contains("exceed the context of 4"), "{err}");
    assert_eq!(cache.len(), 3);
    assert!(m.decode(&[4], &mut cache, None).is_ok());
    assert!(m.decode(&[], &mut m.new_cache(4), None).is_err());
}

/// One fwd+bwd step at the tiny recipe shape (hidden 64, 2 layers, 4/2 heads, head_dim 16,
/// ffn 128, vocab 512, 8×128 tokens, f32). Run with
/// `cargo test -p mindxtrain-trainer --lib model::tests::step_timing -- --ignored --nocapture`.
#[test]
#[ignore = "timing, not a check"]
fn step_timing() {
    let config = LmConfig {
        arch: crate::model::Arch::Qwen3,
        vocab_size: 512,
        hidden_size: 64,
        intermediate_size: 128,
        num_hidden_layers: 2,
        num_attention_heads: 4,
        num_key_value_heads: 2,
        head_dim: 16,
        rms_norm_eps: 1e-6,
        rope_theta: 1e6,
        tie_word_embeddings: true,
        max_position_embeddings: 1024,
        moe: None,
        hybrid: None,
    };
    let m = CausalLm::init_random(&config, 1, DType::F32, &Device::Cpu).unwrap();
    let ad =
        Adapters::init(&config, &LoraConfig { r: 16, alpha: 32.0, ..lora(0.0) }, 2, DType::F32, &Device::Cpu).unwrap();
    let (b, t) = (8, 128);
    let mut rng = SplitMix64::new(3);
    let ids: Vec<u32> = (0..b * t).map(|_| (rng.next_u64() % 512) as u32).collect();
    let batch = PackedBatch {
        batch: b,
        seq_len: t,
        input_ids: ids.clone(),
        position_ids: (0..b * t).map(|i| (i % t) as u32).collect(),
        segment_ids: vec![1; b * t],
        labels: ids.iter().skip(1).map(|&i| i as i64).chain([IGNORE]).collect(),
    };
    for (label, trainable, adapters) in
        [("full", Trainable::Full, None), ("lora r16 all modules", Trainable::Adapters, Some(&ad))]
    {
        for checkpointing in [false, true] {
            let opts = StepOptions { activation_checkpointing: checkpointing, ..Default::default() };
            for _ in 0..2 {
                m.forward_backward(&batch, trainable, adapters, &opts).unwrap();
            }
            let steps = 10;
            let start = std::time::Instant::now();
            for _ in 0..steps {
                m.forward_backward(&batch, trainable, adapters, &opts).unwrap();
            }
            let ms = start.elapsed().as_secs_f64() * 1e3 / steps as f64;
            let tok_s = (b * t) as f64 / (ms / 1e3);
            println!("{label}, checkpointing {checkpointing}: {ms:.1} ms/step, {tok_s:.0} tok/s");
        }
    }
}

/// Per-kernel times at the tiny recipe shape, to see where a step goes.
#[test]
#[ignore = "timing, not a check"]
fn op_timing() {
    use mindxtrain_kernels::{attention, cross_entropy, linear, rmsnorm, rope, swiglu};
    let dev = Device::Cpu;
    let (b, t, h, nh, nkv, hd, f, v) = (8usize, 128usize, 64usize, 4usize, 2usize, 16usize, 128usize, 512usize);
    let n = b * t;
    let r = |shape: &[usize], seed: u64| {
        mindxtrain_kernels::gradcheck::random(shape, seed, &dev).unwrap().to_dtype(DType::F32).unwrap()
    };
    let time = |label: &str, f: &mut dyn FnMut()| {
        f();
        let start = std::time::Instant::now();
        for _ in 0..20 {
            f();
        }
        println!("{label}: {:.3} ms", start.elapsed().as_secs_f64() * 1e3 / 20.0);
    };
    let x = r(&[n, h], 1);
    let w = r(&[f, h], 2);
    let dy = r(&[n, f], 3);
    let cfg = mindxtrain_kernels::KernelConfig::default();
    time("linear fwd 1024x64→128", &mut || drop(linear::forward(&cfg, &x, &w).unwrap()));
    time("linear bwd dx+dw", &mut || drop(linear::backward(&cfg, &dy, &x, &w, true).unwrap()));
    let nw = r(&[h], 4);
    time("rmsnorm fwd", &mut || drop(rmsnorm::forward(&x, &nw, 1e-6).unwrap()));
    let (_, rstd) = rmsnorm::forward(&x, &nw, 1e-6).unwrap();
    time("rmsnorm bwd", &mut || drop(rmsnorm::backward(&x, &x, &nw, &rstd, true).unwrap()));
    let q = r(&[b, nh, t, hd], 5);
    let k = r(&[b, nkv, t, hd], 6);
    let vv = r(&[b, nkv, t, hd], 7);
    let mask = attention::Mask::new(&vec![1; n], b, t).unwrap();
    time("attention fwd", &mut || drop(attention::forward(&cfg, &q, &k, &vv, &mask, 0.25).unwrap()));
    let (o, lse) = attention::forward(&cfg, &q, &k, &vv, &mask, 0.25).unwrap();
    time("attention bwd", &mut || drop(attention::backward(&cfg, &q, &q, &k, &vv, &o, &lse, &mask, 0.25).unwrap()));
    let pos: Vec<u32> = (0..n as u32).map(|i| i % t as u32).collect();
    time("rope tables", &mut || drop(rope::tables(&pos, hd, 1e6, DType::F32, &dev).unwrap()));
    let (cos, sin) = rope::tables(&pos, hd, 1e6, DType::F32, &dev).unwrap();
    let (cos, sin) = (cos.reshape((b, t, 1, hd)).unwrap(), sin.reshape((b, t, 1, hd)).unwrap());
    let qx = r(&[b, t, nh, hd], 8);
    time("rope fwd", &mut || drop(rope::forward(&qx, &cos, &sin).unwrap()));
    time("rope bwd", &mut || drop(rope::backward(&qx, &cos, &sin).unwrap()));
    let g = r(&[n, f], 9);
    time("swiglu fwd", &mut || drop(swiglu::forward(&g, &dy).unwrap()));
    time("swiglu bwd", &mut || drop(swiglu::backward(&g, &g, &dy).unwrap()));
    let logits = r(&[n, v], 10);
    let labels: Vec<i64> = (0..n as i64).map(|i| i % v as i64).collect();
    let labels = cross_entropy::Labels::new(&labels, v, DType::F32, &dev).unwrap();
    time("ce fwd", &mut || drop(cross_entropy::forward(&logits, &labels).unwrap()));
    let (losses, lse) = cross_entropy::forward(&logits, &labels).unwrap();
    let ones = losses.ones_like().unwrap();
    time("ce bwd", &mut || drop(cross_entropy::backward(&ones, &logits, &lse, &labels).unwrap()));
    let qt = qx.transpose(1, 2).unwrap();
    time("transpose+contiguous q", &mut || drop(qt.contiguous().unwrap()));
}
