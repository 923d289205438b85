//! LoRA training steps of our engine on the GPU at a Qwen3 or Instella shape, timed: random-init base in
//! bf16, LoRA r16 α32 on all seven projections, labels = inputs shifted, AdamW on the adapters
//! (the fused `kernels::adamw` update, moments on the device). Prints one JSON line per batch
//! kind (tok/s as the median of the steps after two warm-ups, peak memory from the driver, model
//! FLOPs per step and the bf16 GEMM ceiling measured here, for MFU) for bench/run.sh, which runs
//! the peers beside it. Built by scripts/build-gpu (cuda feature).
//!
//! `gpu_step SHAPE BATCH SEQ STEPS [PACKING]` with SHAPE one of 0.6B, 1.7B, 8B, instella-3b, qwen3.6-27b
//! (the Gated DeltaNet hybrid: LoRA on all twelve projections, as PEFT's `all-linear`), qwen3.6-35b-a3b
//! (its MoE: the same plus the shared expert's gate; the routed experts stay frozen, as PEFT leaves
//! them), 30B-A3B (Qwen3-MoE:
//! LoRA on attention and on every expert's weights, as PEFT adapts them): STEPS steps of
//! one long document per row (`"kind":"uniform"`), then, given PACKING (a file of BATCH lines,
//! each the lengths of the documents packed into one row, summing to SEQ: bench/run.sh writes
//! it for every peer), STEPS steps of that packed batch (`"kind":"packed"`), attention kept
//! inside each document by the engine's segment masks.

use std::collections::BTreeMap;
use std::time::Instant;

use candle_core::{DType, Device, Tensor};
use mindxtrain_kernels::adamw::{self, Coefficients};
use mindxtrain_kernels::profile;
use mindxtrain_trainer::batch::{IGNORE, PackedBatch};
use mindxtrain_trainer::model::{
    Adapters, CausalLm, LayerKind, LmConfig, LoraConfig, MoeShape, StepOptions, Trainable,
};
use mindxtrain_trainer::recipe::TargetModule;

/// The benchmarks' shape table ([`LmConfig::timing_shape`]), plus Qwen3-30B-A3B: every layer
/// sparse, top-8 renormalised, no balance loss in the objective (its config leaves
/// `output_router_logits` off).
fn config(shape: &str) -> LmConfig {
    if shape == "30B-A3B" {
        return LmConfig {
            hidden_size: 2048,
            num_hidden_layers: 48,
            num_attention_heads: 32,
            num_key_value_heads: 4,
            intermediate_size: 6144,
            tie_word_embeddings: false,
            moe: Some(MoeShape {
                num_experts: 128,
                num_experts_per_tok: 8,
                moe_intermediate_size: 768,
                norm_topk_prob: true,
                decoder_sparse_step: 1,
                mlp_only_layers: vec![],
                router_aux_loss_coef: 0.0,
            }),
            ..LmConfig::timing_shape("8B").expect("the 8B shape")
        };
    }
    LmConfig::timing_shape(shape).unwrap_or_else(|| {
        panic!("unknown shape {shape} (0.6B, 1.7B, 8B, instella-3b, 30B-A3B, qwen3.6-27b, qwen3.6-35b-a3b)")
    })
}

/// Random tokens in `b` rows of `t`, each row the documents `docs[row]` (lengths summing to
/// `t`): positions restart and segment ids change at each document, and the last token of a
/// document predicts nothing (the next document is not its continuation).
fn batch(docs: &[Vec<usize>], t: usize, vocab: usize, step: u64) -> PackedBatch {
    let b = docs.len();
    let mut state = 0x9E37_79B9_7F4A_7C15u64 ^ step;
    let mut next = || {
        state = state.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        ((state >> 33) % vocab as u64) as u32
    };
    let input_ids: Vec<u32> = (0..b * t).map(|_| next()).collect();
    let (mut position_ids, mut segment_ids, mut labels) = (vec![], vec![], vec![]);
    for lengths in docs {
        for (doc, &len) in lengths.iter().enumerate() {
            for p in 0..len {
                let i = position_ids.len();
                position_ids.push(p as u32);
                segment_ids.push(doc as u32 + 1);
                labels.push(if p + 1 < len { input_ids[i + 1] as i64 } else { IGNORE });
            }
        }
    }
    PackedBatch { batch: b, seq_len: t, input_ids, position_ids, segment_ids, labels }
}

/// The document lengths of each row: one document per row, or the lines of a packing file.
fn documents(b: usize, t: usize, packing: Option<&str>) -> Result<Vec<Vec<usize>>, String> {
    let Some(path) = packing else { return Ok(vec![vec![t]; b]) };
    let text = std::fs::read_to_string(path).map_err(|e| format!("packing file {path}: {e}"))?;
    let rows = text
        .lines()
        .map(|l| l.split_whitespace().map(|n| n.parse::<usize>().map_err(|e| format!("{path}: {n:?}: {e}"))).collect())
        .collect::<Result<Vec<Vec<usize>>, String>>()?;
    if rows.len() != b || rows.iter().any(|r| r.iter().sum::<usize>() != t || r.contains(&0)) {
        return Err(format!("{path}: want {b} lines of positive document lengths summing to {t}"));
    }
    Ok(rows)
}

fn used_gib() -> f64 {
    let out = std::process::Command::new("nvidia-smi")
        .args(["--query-gpu=memory.used", "--format=csv,noheader,nounits"])
        .output();
    out.ok()
        .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse::<f64>().ok())
        .map_or(f64::NAN, |mib| mib / 1024.0)
}

/// Model FLOPs of one LoRA step (no recomputation counted, the adapters' small GEMMs left out):
/// every base GEMM forward and its input gradient (4·active params per token, the lm_head included),
/// causal attention forward (2 GEMMs over half the T×T scores) and backward (2.5× forward).
fn step_flops(c: &LmConfig, b: usize, t: usize) -> f64 {
    let (h, f, hd) = (c.hidden_size as f64, c.intermediate_size as f64, c.head_dim as f64);
    let (heads, kv) = (c.num_attention_heads as f64, c.num_key_value_heads as f64);
    // A sparse layer's MLP counts the experts a token visits (and the router): MFU on the
    // active parameters.
    // On Qwen3.5-MoE the shared expert (`f` wide) and its one-logit gate come on top.
    let mlp = match &c.moe {
        Some(m) => {
            let shared = if c.arch.shared_expert() { 3.0 * h * f + h } else { 0.0 };
            3.0 * h * m.moe_intermediate_size as f64 * m.num_experts_per_tok as f64 + h * m.num_experts as f64 + shared
        }
        None => 3.0 * h * f,
    };
    let tokens = (b * t) as f64;
    let attention_proj = h * hd * (2.0 * heads + 2.0 * kv);
    let scores = 3.5 * 4.0 * (b as f64) * heads * (t * t) as f64 / 2.0 * hd;
    let Some(hy) = &c.hybrid else {
        let linear = (attention_proj + mlp) * c.num_hidden_layers as f64 + h * c.vocab_size as f64;
        return 4.0 * linear * tokens + scores * c.num_hidden_layers as f64;
    };
    // A hybrid: the gated attention's q projection is doubled (query | gate); a Gated DeltaNet
    // layer projects q/k/v, z, β and a, and its delta rule costs per token and value head about
    // 3 products of a d_k × d_v state (recall, update, read) forward, twice that backward.
    let gated_attention = attention_proj + h * hd * heads;
    let (dk, dv, hv) =
        (hy.linear_key_head_dim as f64, hy.linear_value_head_dim as f64, hy.linear_num_value_heads as f64);
    let delta_net = h * (hy.conv_dim() + 2 * hy.value_dim() + 2 * hy.linear_num_value_heads) as f64;
    let rule = 3.0 * 3.0 * 2.0 * dk * dv * hv * tokens;
    let n_attn = hy.layer_types.iter().filter(|k| **k == LayerKind::Attention).count() as f64;
    let n_linear = c.num_hidden_layers as f64 - n_attn;
    let linear = (gated_attention + mlp) * n_attn + (delta_net + mlp) * n_linear + h * c.vocab_size as f64;
    4.0 * linear * tokens + scores * n_attn + rule * n_linear
}

/// A bf16 8192³ GEMM's rate on this device (median of 5), the MFU denominator.
fn gemm_ceiling(dev: &Device) -> candle_core::Result<f64> {
    let n = 8192;
    let a = Tensor::randn(0f32, 1.0, (n, n), dev)?.to_dtype(DType::BF16)?;
    let mut times = Vec::new();
    for _ in 0..6 {
        dev.synchronize()?;
        let t0 = Instant::now();
        drop(a.matmul(&a)?);
        dev.synchronize()?;
        times.push(t0.elapsed().as_secs_f64());
    }
    times.remove(0);
    times.sort_by(f64::total_cmp);
    Ok(2.0 * (n as f64).powi(3) / times[times.len() / 2])
}

/// `GPU_STEP_CHECKPOINTING=1`: each block keeps only its input and recomputes the rest in the
/// backward, as a recipe's `train.gradient_checkpointing: true` (the peers' `HF_PEER_GRAD_CKPT=1`).
fn checkpointing() -> bool {
    std::env::var("GPU_STEP_CHECKPOINTING").is_ok_and(|v| v == "1")
}

/// The optimizer moments of the adapters, on the device.
type Moments = BTreeMap<String, (Tensor, Tensor)>;

/// `steps` timed steps on the rows `docs`, the first two untimed; returns the median seconds per
/// step and the driver's peak memory. With MINDXTRAIN_PROFILE, prints the last step's ops.
fn measure(
    model: &CausalLm,
    ad: &mut Adapters,
    moments: &mut Moments,
    docs: &[Vec<usize>],
    steps: u64,
    label: &str,
) -> candle_core::Result<(f64, f64)> {
    let err = |e: mindxtrain_trainer::model::ModelError| candle_core::Error::Msg(e.to_string());
    let dev = model.device().clone();
    let t = docs[0].iter().sum::<usize>();
    let (mut peak, mut timed) = (0f64, Vec::new());
    for step in 1..=steps {
        let pb = batch(docs, t, model.config().vocab_size, step);
        if step == steps {
            // MINDXTRAIN_PROFILE: attribute the last step only (the first ones load kernels).
            drop(profile::take());
        }
        let t0 = Instant::now();
        let opts = StepOptions {
            loss_scale: 1.0 / pb.target_tokens().max(1) as f64,
            activation_checkpointing: checkpointing(),
            ..StepOptions::default()
        };
        let out = model.forward_backward(&pb, Trainable::Adapters, Some(ad), &opts).map_err(err)?;
        let _profile = profile::scope("optimizer (glue)", &dev);
        let k = Coefficients::new([0.9, 0.999], 1e-8, 0.0, 1e-4, step);
        for (name, p) in ad.tensors.iter_mut() {
            let g = &out.grads[name];
            let (m, v) = match moments.remove(name) {
                Some(mv) => mv,
                None => (p.to_dtype(DType::F32)?.zeros_like()?, p.to_dtype(DType::F32)?.zeros_like()?),
            };
            let (np, nm, nv) = adamw::step(&k, true, p, g, &m, &v)?;
            *p = np;
            moments.insert(name.clone(), (nm, nv));
        }
        drop(_profile);
        dev.synchronize()?;
        let s = t0.elapsed().as_secs_f64();
        peak = peak.max(used_gib());
        eprintln!("ours {label} step {step}: {s:.3} s, loss {:.4}", out.loss_sum / out.target_tokens as f64);
        if step > 2 {
            timed.push(s);
        }
    }
    let ops = profile::take();
    if !ops.is_empty() {
        let last = *timed.last().unwrap_or(&f64::NAN);
        let attributed: f64 = ops.iter().map(|o| o.2).sum();
        eprintln!("profile of {label} step {steps} ({last:.3} s, synchronised after every op):");
        for (op, calls, secs) in ops {
            eprintln!("  {op:<22} {calls:>5} calls {:>9.1} ms {:>5.1}%", secs * 1e3, 100.0 * secs / last);
        }
        eprintln!(
            "  {:<22} {:>5}       {:>9.1} ms {:>5.1}%",
            "(outside these ops)",
            "",
            (last - attributed) * 1e3,
            100.0 * (last - attributed) / last
        );
    }
    if timed.is_empty() {
        candle_core::bail!("gpu_step: {steps} steps leave none to time after the two warm-ups");
    }
    timed.sort_by(f64::total_cmp);
    Ok((timed[timed.len() / 2], peak))
}

fn main() -> candle_core::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    if args.len() < 5 {
        candle_core::bail!("usage: gpu_step SHAPE BATCH SEQ STEPS [PACKING]");
    }
    let num = |i: usize| args[i].parse::<usize>().map_err(|e| candle_core::Error::Msg(format!("{}: {e}", args[i])));
    let (shape, b, t, steps) = (args[1].as_str(), num(2)?, num(3)?, num(4)? as u64);
    let mut kinds = vec![("uniform", documents(b, t, None).map_err(candle_core::Error::Msg)?)];
    if let Some(path) = args.get(5) {
        kinds.push(("packed", documents(b, t, Some(path)).map_err(candle_core::Error::Msg)?));
    }
    let dev = Device::new_cuda(0)?;
    let cfg = config(shape);
    let err = |e: mindxtrain_trainer::model::ModelError| candle_core::Error::Msg(e.to_string());
    let t0 = Instant::now();
    let model = CausalLm::init_random(&cfg, 1, DType::BF16, &dev).map_err(err)?;
    // The pool still has its default release threshold here, so the draws' f64 scratch (5 GB
    // for the 8B embedding) goes back to the driver at this sync and never counts as peak.
    dev.synchronize()?;
    let init_s = t0.elapsed().as_secs_f64();
    mindxtrain_kernels::cache_freed_memory(&dev)?;
    let ceiling = gemm_ceiling(&dev)?;
    eprintln!("ours {shape}: seeded weights in {init_s:.1} s");
    // The hybrids: every module PEFT's `all-linear` reaches, as the peers adapt (bench/qwen3_6_shapes.py).
    let targets = if cfg.hybrid.is_some() { TargetModule::EVERY.to_vec() } else { TargetModule::all() };
    let lora = LoraConfig { r: 16, alpha: 32.0, dropout: 0.0, target_modules: targets, rslora: false };
    let mut ad = Adapters::init(&cfg, &lora, 2, DType::BF16, &dev).map_err(err)?;
    let mut moments = Moments::new();
    for (kind, docs) in kinds {
        let (median, peak) = measure(&model, &mut ad, &mut moments, &docs, steps, &format!("{shape} {kind}"))?;
        // The packed kind's FLOPs are those of one document per row, as for the peers: tok/s is
        // what compares, and the MFU of a packed batch counts the attention it skips.
        println!(
            "{{\"who\":\"ours\",\"shape\":\"{shape}\",\"kind\":\"{kind}\",\"batch\":{b},\"seq\":{t},\"documents\":{},\"s_per_step\":{median:.4},\"tok_per_s\":{:.0},\"peak_gib\":{peak:.1},\"step_flops\":{:.4e},\"gemm_flops_per_s\":{ceiling:.4e},\"init_s\":{init_s:.1},\"gradient_checkpointing\":{}}}",
            docs.iter().map(Vec::len).sum::<usize>(),
            (b * t) as f64 / median,
            step_flops(&cfg, b, t),
            checkpointing()
        );
    }
    Ok(())
}
