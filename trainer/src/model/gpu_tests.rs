//! The whole engine on a CUDA device against the same engine on the CPU: one micro-batch's
//! loss and every gradient, full fine-tuning and LoRA, f32 (both sides f32: only summation
//! order differs) and bf16 on the GPU (against the f32 CPU run). Needs a GPU: built with the
//! `cuda` feature by scripts/build-gpu and run there by scripts/gpu-test.

use std::collections::BTreeMap;

use candle_core::{DType, Device, Tensor};

use super::*;
use crate::batch::{IGNORE, PackedBatch};
use crate::recipe::TargetModule;

/// Head size 32: the fused attention kernel's smallest (multiple of the warp); GQA 4 over 2.
fn config() -> Qwen3Config {
    Qwen3Config {
        vocab_size: 300,
        hidden_size: 128,
        intermediate_size: 256,
        num_hidden_layers: 2,
        num_attention_heads: 4,
        num_key_value_heads: 2,
        head_dim: 32,
        rms_norm_eps: 1e-6,
        rope_theta: 1e6,
        tie_word_embeddings: false,
        max_position_embeddings: 512,
    }
}

/// Two rows of 96 tokens: row 0 packs two documents, row 1 ends in padding.
fn batch() -> PackedBatch {
    let (b, t) = (2, 96);
    let mut input_ids = Vec::new();
    let (mut position_ids, mut segment_ids, mut labels) = (Vec::new(), Vec::new(), Vec::new());
    for r in 0..b {
        for i in 0..t {
            let (seg, pos) = match (r, i) {
                (0, i) if i < 40 => (1, i),
                (0, i) => (2, i - 40),
                (_, i) if i < 80 => (1, i),
                _ => (0, 0),
            };
            input_ids.push(((r * 131 + i * 17) % 300) as u32);
            position_ids.push(pos as u32);
            segment_ids.push(seg);
            labels.push(if seg == 0 || i % 11 == 5 { IGNORE } else { ((r * 7 + i * 29) % 300) as i64 });
        }
    }
    PackedBatch { batch: b, seq_len: t, input_ids, position_ids, segment_ids, labels }
}

fn to(ts: &BTreeMap<String, Tensor>, dtype: DType, dev: &Device) -> BTreeMap<String, Tensor> {
    ts.iter().map(|(n, t)| (n.clone(), t.to_dtype(dtype).unwrap().to_device(dev).unwrap())).collect()
}

/// ‖a − b‖ / ‖b‖ in f64 (NaN if `a` has a NaN, failing every bound).
fn rel_err(a: &Tensor, b: &Tensor) -> f64 {
    let f = |t: &Tensor| t.to_device(&Device::Cpu).unwrap().to_dtype(DType::F64).unwrap().flatten_all().unwrap();
    let (a, b) = (f(a), f(b));
    let diff = (&a - &b).unwrap().sqr().unwrap().sum_all().unwrap().to_scalar::<f64>().unwrap();
    let norm = b.sqr().unwrap().sum_all().unwrap().to_scalar::<f64>().unwrap();
    (diff / norm).sqrt()
}

#[test]
fn gpu_gradients_match_the_cpu_engine() {
    let gpu = Device::new_cuda(0).expect("a CUDA device");
    let cfg = config();
    let cpu_model = Qwen3::init_random(&cfg, 7, DType::F32, &Device::Cpu).unwrap();
    let lora = LoraConfig { r: 8, alpha: 16.0, dropout: 0.0, target_modules: TargetModule::all(), rslora: false };
    let mut cpu_ad = Adapters::init(&cfg, &lora, 3, DType::F32, &Device::Cpu).unwrap();
    // Non-zero B, so that A's gradient is informative.
    for (name, t) in cpu_ad.tensors.iter_mut() {
        if name.contains("lora_B") {
            *t = (t.ones_like().unwrap() * 0.01).unwrap();
        }
    }
    let b = batch();
    let opts = StepOptions::default();
    for (dtype, loss_tol, grad_tol) in [(DType::F32, 1e-5, 1e-4), (DType::BF16, 1e-2, 5e-2)] {
        let gpu_model = Qwen3::new(cfg.clone(), to(cpu_model.params(), dtype, &gpu), &gpu).unwrap();
        let gpu_ad = Adapters { config: lora.clone(), tensors: to(&cpu_ad.tensors, dtype, &gpu) };
        for (trainable, ad) in [(Trainable::Full, None), (Trainable::Adapters, Some((&cpu_ad, &gpu_ad)))] {
            let want = cpu_model.forward_backward(&b, trainable, ad.map(|a| a.0), &opts).unwrap();
            let got = gpu_model.forward_backward(&b, trainable, ad.map(|a| a.1), &opts).unwrap();
            let tag = format!("{dtype:?} {trainable:?}");
            let loss_err = ((got.loss_sum - want.loss_sum) / want.loss_sum).abs();
            assert!(loss_err <= loss_tol, "{tag}: loss {} vs {} on the CPU", got.loss_sum, want.loss_sum);
            assert_eq!(got.target_tokens, want.target_tokens);
            assert_eq!(got.grads.keys().collect::<Vec<_>>(), want.grads.keys().collect::<Vec<_>>(), "{tag}");
            let worst = got
                .grads
                .iter()
                .map(|(n, g)| (rel_err(g, &want.grads[n]), n))
                .fold((0f64, ""), |m, (e, n)| if e.is_nan() || e > m.0 { (e, n.as_str()) } else { m });
            println!(
                "{tag}: loss {:.6} vs {:.6}, worst gradient {} at {:.2e}",
                got.loss_sum, want.loss_sum, worst.1, worst.0
            );
            assert!(worst.0 <= grad_tol, "{tag}: gradient of {} off by {:e}", worst.1, worst.0);
        }
    }
}
