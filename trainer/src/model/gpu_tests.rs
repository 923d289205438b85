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
fn config() -> LmConfig {
    LmConfig {
        arch: crate::model::Arch::Qwen3,
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
        moe: None,
        hybrid: None,
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
    compare_with_cpu(&config(), &[(DType::F32, 1e-5, 1e-4), (DType::BF16, 1e-2, 5e-2)]);
}

/// Instella at its 3B's head size, 80: q/k norms over the whole projection, and bf16 attention
/// on the mma.sync flash kernels instantiated for 80 (Hopper's wgmma ones take 64 and 128).
#[test]
fn gpu_instella_gradients_match_the_cpu_engine() {
    let c = LmConfig {
        arch: crate::model::Arch::Instella,
        hidden_size: 320,
        head_dim: 80,
        num_key_value_heads: 4,
        ..config()
    };
    compare_with_cpu(&c, &[(DType::F32, 1e-5, 1e-4), (DType::BF16, 1e-2, 5e-2)]);
}

/// A Qwen3.5/3.6 dense hybrid: a Gated DeltaNet layer (two key heads shared by four value heads
/// of 32, a 4-tap conv, as the released models' GQA ratio and kernel) then a gated attention
/// layer rotating a quarter of each head. Both paths of the packed batch: the delta rule's state
/// restarts where row 0's second document starts.
#[test]
fn gpu_hybrid_gradients_match_the_cpu_engine() {
    compare_with_cpu(&hybrid_config(), &[(DType::F32, 1e-5, 1e-4), (DType::BF16, 1e-2, 5e-2)]);
}

fn hybrid_config() -> LmConfig {
    use crate::model::{HybridShape, LayerKind};
    LmConfig {
        arch: crate::model::Arch::Qwen3_5,
        hybrid: Some(HybridShape {
            layer_types: vec![LayerKind::LinearAttention, LayerKind::Attention],
            linear_conv_kernel_dim: 4,
            linear_key_head_dim: 32,
            linear_value_head_dim: 32,
            linear_num_key_heads: 2,
            linear_num_value_heads: 4,
            partial_rotary_factor: 0.25,
        }),
        ..config()
    }
}

/// The dense hybrid's cached decoding on the GPU, with LoRA on every projection: a prefill of 5
/// tokens, single steps and chunks of 3 and 2 through the CUDA one-step conv and delta rule (the
/// state carried between calls on the device) and the gated attention's cache give the logits
/// of one full forward over the same tokens (the chunked training kernels) at each call's last
/// token, f32.
#[test]
fn gpu_hybrid_decode_steps_give_the_full_forward_s_last_logits() {
    let gpu = Device::new_cuda(0).expect("a CUDA device");
    let c = hybrid_config();
    let cpu_model = CausalLm::init_random(&c, 5, DType::F32, &Device::Cpu).unwrap();
    let m = CausalLm::new(c.clone(), to(cpu_model.params(), DType::F32, &gpu), &gpu).unwrap();
    let lora = LoraConfig { r: 4, alpha: 8.0, dropout: 0.0, target_modules: TargetModule::all(), rslora: false };
    let mut ad = Adapters::init(&c, &lora, 3, DType::F32, &gpu).unwrap();
    for (name, t) in ad.tensors.iter_mut() {
        if name.contains("lora_B") {
            *t = (t.ones_like().unwrap() * 0.02).unwrap();
        }
    }
    let seq: Vec<u32> = (0..12u32).map(|i| (i * 37 + 5) % 300).collect();
    let whole = PackedBatch::single_row(&seq);
    let full = m.logits(&whole, Some(&ad)).unwrap();
    let mut cache = m.new_cache(32);
    let mut at = 0;
    for len in [5, 1, 1, 3, 2] {
        let got = m.decode(&seq[at..at + len], &mut cache, Some(&ad)).unwrap();
        at += len;
        let want = full.get(0).unwrap().get(at - 1).unwrap();
        let err = rel_err(&got, &want);
        println!("hybrid decode on the GPU after {at} tokens: relative error {err:.2e}");
        assert!(err <= 1e-5, "after {at} tokens: decode logits off the full forward's by {err:e}");
    }
}

/// A Qwen3.5/3.6-MoE hybrid (the 35B-A3B's layout, shrunk): both layer kinds sparse, 8 routed
/// experts of 64, 2 per token through the grouped GEMMs, the sigmoid-gated shared expert of 64,
/// the balance loss on; LoRA on every module PEFT's `all-linear` reaches there (the shared
/// expert's projections and `shared_expert_gate` among them). The weights are bf16 values and
/// the router's are scaled up, so that bf16 activations do not flip a near-tie of the top-k (a
/// different, equally right routing, which the loose bf16 bound could not tell from an error).
/// The bf16 gradient bound is 1e-1, not 5e-2: the router's gradient comes through the softmax's
/// Jacobian, a difference of near-equal bf16 products (measured on an H200, full fine-tuning: the
/// worst tensor is `layers.1.mlp.gate`, at 5.1e-2).
#[test]
fn gpu_moe_hybrid_gradients_match_the_cpu_engine() {
    let cfg = LmConfig { intermediate_size: 64, moe: Some(small_moe(Vec::new())), ..hybrid_config() };
    let drawn = CausalLm::init_random(&cfg, 7, DType::F32, &Device::Cpu).unwrap();
    let mut params = to(drawn.params(), DType::BF16, &Device::Cpu);
    for layer in 0..cfg.num_hidden_layers {
        let router = super::moe::router_name(layer);
        params.insert(router.clone(), (&params[&router] * 16.0).unwrap());
    }
    let cpu_model = CausalLm::new(cfg.clone(), to(&params, DType::F32, &Device::Cpu), &Device::Cpu).unwrap();
    let every = TargetModule::EVERY.to_vec();
    compare_model_with_cpu(&cpu_model, every, &[(DType::F32, 1e-5, 1e-4), (DType::BF16, 1e-2, 1e-1)]);
}

/// Qwen3-MoE (layer 0 dense, layer 1 sparse: 8 experts, 2 per token, the balance loss on).
/// f32 only: bf16 rounding of the router's logits may flip a near-tie of the top-k, which is a
/// different (equally right) routing, not an error.
#[test]
fn gpu_moe_gradients_match_the_cpu_engine() {
    compare_with_cpu(&moe_config(), &[(DType::F32, 1e-5, 1e-4)]);
}

fn moe_config() -> LmConfig {
    LmConfig { arch: crate::model::Arch::Qwen3, moe: Some(small_moe(vec![0])), ..config() }
}

/// 8 experts of 64, 2 per token, the balance loss on; `mlp_only_layers` stay dense.
fn small_moe(mlp_only_layers: Vec<usize>) -> MoeShape {
    MoeShape {
        num_experts: 8,
        num_experts_per_tok: 2,
        moe_intermediate_size: 64,
        norm_topk_prob: true,
        decoder_sparse_step: 1,
        mlp_only_layers,
        router_aux_loss_coef: 0.01,
    }
}

/// QLoRA on a Qwen3-MoE model on the GPU: the sparse layer's stacked expert weights held in NF4
/// on the device and expanded by the dequantisation kernel before each grouped GEMM (forward and
/// input gradient), adapters on attention and experts. Fresh random weights each run (the seed
/// is printed), rounded to bf16 values first so that the f32 and bf16 copies quantise to the
/// same codes. f32: one LoRA step against the CPU engine's NF4 path (only summation order
/// differs). bf16: against the GPU's own dense model holding the host's dequantisation of the
/// same codes, bit for bit (the kernel rounds each f32 value to bf16 as the host does, and the
/// same products on the same bits give the same bits; routing cannot differ).
#[test]
fn gpu_qlora_moe_matches_the_cpu_engine() {
    let gpu = Device::new_cuda(0).expect("a CUDA device");
    let cfg = moe_config();
    let seed = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64;
    println!("seed {seed}");
    let drawn = CausalLm::init_random(&cfg, seed, DType::F32, &Device::Cpu).unwrap();
    let params = to(&to(drawn.params(), DType::BF16, &Device::Cpu), DType::F32, &Device::Cpu);
    let lora = LoraConfig { r: 8, alpha: 16.0, dropout: 0.0, target_modules: TargetModule::all(), rslora: false };
    let mut ad = Adapters::init(&cfg, &lora, seed, DType::F32, &Device::Cpu).unwrap();
    for (name, t) in ad.tensors.iter_mut() {
        if name.contains("lora_B") {
            *t = (t.ones_like().unwrap() * 0.01).unwrap();
        }
    }
    let quantised = |dtype: DType, dev: &Device| {
        let mut m = CausalLm::new(cfg.clone(), to(&params, dtype, dev), dev).unwrap();
        m.quantize_nf4().unwrap();
        m
    };
    let gate_up = super::moe::gate_up_name(1);
    let (b, opts) = (batch(), StepOptions::default());
    let step = |m: &CausalLm, ad: &Adapters| m.forward_backward(&b, Trainable::Adapters, Some(ad), &opts).unwrap();

    let cpu = quantised(DType::F32, &Device::Cpu);
    let gpu32 = quantised(DType::F32, &gpu);
    assert!(!gpu32.params().contains_key(&gate_up), "the experts stay dense on the GPU");
    let expanded = gpu32.nf4_experts(&gate_up).expect("NF4 experts").dequantize(DType::F32).unwrap();
    assert!(expanded.device().is_cuda(), "the experts are expanded off the GPU");
    let want = step(&cpu, &ad);
    let got = step(&gpu32, &Adapters { config: lora.clone(), tensors: to(&ad.tensors, DType::F32, &gpu) });
    let loss_err = ((got.loss_sum - want.loss_sum) / want.loss_sum).abs();
    assert!(loss_err <= 1e-5, "f32: loss {} vs {} on the CPU (seed {seed})", got.loss_sum, want.loss_sum);
    assert_eq!(got.grads.keys().collect::<Vec<_>>(), want.grads.keys().collect::<Vec<_>>());
    assert!(got.grads.keys().any(|k| k.contains("mlp.experts")));
    for (name, g) in &got.grads {
        let err = rel_err(g, &want.grads[name]);
        assert!(err <= 1e-4, "f32: gradient of {name} off by {err:e} (seed {seed})");
    }

    let gpu16 = quantised(DType::BF16, &gpu);
    let mut dense = gpu16.params().clone();
    for (name, w) in &params {
        if !gpu16.params().contains_key(name) {
            dense.insert(name.clone(), Nf4Tensor::quantize(w).unwrap().dequantize(DType::BF16, &gpu).unwrap());
        }
    }
    let values = |t: &Tensor| t.to_dtype(DType::F32).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
    let kernel = gpu16.nf4_experts(&gate_up).unwrap().dequantize(DType::BF16).unwrap();
    assert_eq!(
        values(&kernel),
        values(&dense[&gate_up]),
        "the kernel's bf16 expansion is not the host's (seed {seed})"
    );
    let dense = CausalLm::new(cfg.clone(), dense, &gpu).unwrap();
    let ad16 = Adapters { config: lora.clone(), tensors: to(&ad.tensors, DType::BF16, &gpu) };
    let (got, want) = (step(&gpu16, &ad16), step(&dense, &ad16));
    println!("bf16: loss {:.6} (NF4) vs {:.6} (dense)", got.loss_sum, want.loss_sum);
    assert_eq!(got.loss_sum.to_bits(), want.loss_sum.to_bits(), "bf16 loss (seed {seed})");
    for (name, g) in &got.grads {
        assert_eq!(values(g), values(&want.grads[name]), "bf16: gradient of {name} (seed {seed})");
    }

    // Read on the host and quantised onto the GPU, as a QLoRA run loads its base (so the dense
    // base never has to fit the card): the same model, every tensor on the GPU.
    let mut hosted = CausalLm::new(cfg.clone(), to(&params, DType::BF16, &Device::Cpu), &Device::Cpu).unwrap();
    hosted.quantize_nf4_onto(&gpu).unwrap();
    assert!(hosted.device().is_cuda() && hosted.params().values().all(|t| t.device().is_cuda()));
    let h = step(&hosted, &ad16);
    assert_eq!(h.loss_sum.to_bits(), got.loss_sum.to_bits(), "host-loaded NF4 base: loss (seed {seed})");
    for (name, g) in &h.grads {
        assert_eq!(values(g), values(&got.grads[name]), "host-loaded NF4 base: gradient of {name} (seed {seed})");
    }
}

/// One step of full fine-tuning and of LoRA on the GPU in each `(dtype, loss tolerance,
/// gradient tolerance)` against the f32 CPU engine.
fn compare_with_cpu(cfg: &LmConfig, dtypes: &[(DType, f64, f64)]) {
    let cpu_model = CausalLm::init_random(cfg, 7, DType::F32, &Device::Cpu).unwrap();
    compare_model_with_cpu(&cpu_model, TargetModule::all(), dtypes);
}

/// [`compare_with_cpu`] from the f32 CPU model given, LoRA on `targets`.
fn compare_model_with_cpu(cpu_model: &CausalLm, targets: Vec<TargetModule>, dtypes: &[(DType, f64, f64)]) {
    let gpu = Device::new_cuda(0).expect("a CUDA device");
    let cfg = cpu_model.config().clone();
    let lora = LoraConfig { r: 8, alpha: 16.0, dropout: 0.0, target_modules: targets, rslora: false };
    let mut cpu_ad = Adapters::init(&cfg, &lora, 3, DType::F32, &Device::Cpu).unwrap();
    // Non-zero B, so that A's gradient is informative.
    for (name, t) in cpu_ad.tensors.iter_mut() {
        if name.contains("lora_B") {
            *t = (t.ones_like().unwrap() * 0.01).unwrap();
        }
    }
    let b = batch();
    let opts = StepOptions::default();
    for &(dtype, loss_tol, grad_tol) in dtypes {
        let gpu_model = CausalLm::new(cfg.clone(), to(cpu_model.params(), dtype, &gpu), &gpu).unwrap();
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

/// The demo recipe (`recipes/tiny_cpu_lora.yaml`): its model with head size 64, so that bf16
/// attention runs the tensor-core flash kernels, and the first `n` micro-batches of its
/// generated task data.
fn demo(n: usize) -> (LmConfig, LoraConfig, Vec<PackedBatch>) {
    use crate::data::{DataCursor, DataOptions, Dataset, tokenizer::Tokenizer};
    // The GPU machine runs the carried binary from its copy of the repository's root.
    let cwd = std::env::current_dir().unwrap();
    let path = [cwd.as_path(), std::path::Path::new(env!("CARGO_MANIFEST_DIR"))]
        .into_iter()
        .flat_map(|d| d.ancestors())
        .map(|dir| dir.join("recipes/tiny_cpu_lora.yaml"))
        .find(|p| p.exists())
        .expect("recipes/tiny_cpu_lora.yaml above the working directory");
    let recipe = crate::recipe::Recipe::from_path(&path).unwrap().recipe;
    let dataset =
        Dataset::from_recipe(&recipe, path.parent().unwrap(), &Tokenizer::byte(), DataOptions::default()).unwrap();
    let mut it = dataset.batches(recipe.train.batch.per_device as usize, DataCursor::default()).unwrap();
    let batches = (0..n).map(|_| it.next_batch().unwrap()).collect();
    let shape = recipe.model.config.as_ref().expect("the demo recipe sets its model config");
    let mut cfg = LmConfig::from_recipe(shape, recipe.model.family).expect("a family the engine runs");
    cfg.head_dim = 64;
    let lora = LoraConfig { r: 8, alpha: 16.0, dropout: 0.0, target_modules: TargetModule::all(), rslora: false };
    (cfg, lora, batches)
}

/// LoRA steps with the trainer's AdamW from seeded inits; returns the per-token loss of each
/// step and the final adapters.
fn train(
    cfg: &LmConfig,
    lora: &LoraConfig,
    batches: &[PackedBatch],
    dtype: DType,
    dev: &Device,
) -> (Vec<f64>, BTreeMap<String, Tensor>) {
    use crate::optim::{AdamW, AdamWConfig};
    let model = CausalLm::init_random(cfg, 7, dtype, dev).unwrap();
    let mut ad = Adapters::init(cfg, lora, 7, dtype, dev).unwrap();
    let mut opt = AdamW::new(AdamWConfig { betas: [0.9, 0.999], eps: 1e-8, weight_decay: 0.0 });
    let mut losses = Vec::new();
    for (step, b) in batches.iter().enumerate() {
        let tokens = b.labels.iter().filter(|&&l| l != IGNORE).count().max(1);
        let opts = StepOptions { loss_scale: 1.0 / tokens as f64, dropout_seed: step as u64, ..StepOptions::default() };
        let out = model.forward_backward(b, Trainable::Adapters, Some(&ad), &opts).unwrap();
        losses.push(out.loss_sum / out.target_tokens as f64);
        opt.step(&mut ad.tensors, &out.grads, 2e-3).unwrap();
    }
    (losses, ad.tensors)
}

/// Seeded weights drawn on the GPU are the host's: every parameter, in f32 (one rounding of the
/// same f64 draws; the GPU's log/cos may move a value's last f64 bit, which f32 almost never
/// sees) and bf16, and the same bits on every draw.
#[test]
fn seeded_weights_drawn_on_the_gpu_are_the_hosts() {
    let gpu = Device::new_cuda(0).expect("a CUDA device");
    let cfg = config();
    for (dtype, bound) in [(DType::F32, 1e-7), (DType::BF16, 4e-3)] {
        let host = params::init_random(&cfg, 11, dtype, &Device::Cpu).unwrap();
        let drawn = params::init_random(&cfg, 11, dtype, &gpu).unwrap();
        assert_eq!(host.keys().collect::<Vec<_>>(), drawn.keys().collect::<Vec<_>>());
        for (name, want) in &host {
            let got = &drawn[name];
            assert!(got.device().is_cuda(), "{name} was not drawn on the GPU");
            assert_eq!((got.dims(), got.dtype()), (want.dims(), want.dtype()), "{name}");
            let err = rel_err(got, want);
            assert!(err <= bound, "{name} {dtype:?}: relative error {err:e} over {bound:e}");
        }
        let again = params::init_random(&cfg, 11, dtype, &gpu).unwrap();
        let bits = |t: &Tensor| t.to_dtype(DType::F32).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
        assert!(drawn.iter().all(|(n, t)| bits(t) == bits(&again[n])), "two GPU draws differ ({dtype:?})");
    }
}

#[test]
fn fifty_lora_steps_on_the_gpu_follow_the_cpu_loss_curve() {
    let gpu = Device::new_cuda(0).expect("a CUDA device");
    let (cfg, lora, batches) = demo(50);
    let (cpu, _) = train(&cfg, &lora, &batches, DType::F32, &Device::Cpu);
    let (bf16, _) = train(&cfg, &lora, &batches, DType::BF16, &gpu);
    let (f32_gpu, _) = train(&cfg, &lora, &batches, DType::F32, &gpu);
    let worst = |got: &[f64]| got.iter().zip(&cpu).map(|(g, c)| ((g - c) / c).abs()).fold(0f64, f64::max);
    for (step, ((c, b), f)) in cpu.iter().zip(&bf16).zip(&f32_gpu).enumerate() {
        if step % 10 == 0 || step == 49 {
            println!("step {step:>2}: CPU f32 {c:.5}  GPU bf16 {b:.5}  GPU f32 {f:.5}");
        }
    }
    println!("worst relative gap to the CPU curve: bf16 {:.2e}, f32 {:.2e}", worst(&bf16), worst(&f32_gpu));
    // Training must have happened, so equal curves are not two flat lines (6.22 → 5.27 on
    // the first run on an H200) ...
    assert!(cpu[49] < 0.9 * cpu[0], "the CPU run did not learn: {} → {}", cpu[0], cpu[49]);
    // ... and the GPU follows it: f32 to summation order, bf16 to its rounding.
    assert!(worst(&f32_gpu) <= 1e-3, "GPU f32 leaves the CPU curve by {:e}", worst(&f32_gpu));
    assert!(worst(&bf16) <= 3e-2, "GPU bf16 leaves the CPU curve by {:e}", worst(&bf16));
}

#[test]
fn two_gpu_runs_give_bitwise_identical_checkpoints() {
    use crate::checkpoint::safetensors_bytes;
    let gpu = Device::new_cuda(0).expect("a CUDA device");
    let (cfg, lora, batches) = demo(50);
    let meta = BTreeMap::new();
    let digest = |tensors: &BTreeMap<String, Tensor>| blake3::hash(&safetensors_bytes(tensors, None, &meta).unwrap());
    let (losses_a, a) = train(&cfg, &lora, &batches, DType::BF16, &gpu);
    let (losses_b, b) = train(&cfg, &lora, &batches, DType::BF16, &gpu);
    println!("two 50-step bf16 runs: adapter checkpoints {} and {}", digest(&a), digest(&b));
    assert_eq!(
        losses_a.iter().map(|l| l.to_bits()).collect::<Vec<_>>(),
        losses_b.iter().map(|l| l.to_bits()).collect::<Vec<_>>()
    );
    assert_eq!(digest(&a), digest(&b), "the checkpoints differ");
}
