//! QLoRA runs of a Qwen3-MoE recipe on the CPU: the experts' base in NF4, adapters on attention
//! and every expert trained and saved in PEFT's layout, and the merged export.

use std::path::Path;

use candle_core::{DType, Device, Tensor};
use serde_json::Value;

use super::tests::Collect;
use super::*;
use crate::model::merge_lora;
use crate::plan::Choices;
use crate::recipe::Recipe;

/// `recipes/tiny_cpu_moe.yaml` (2 sparse layers of 4 experts, 2 active) as a short QLoRA run
/// over its seeded random weights.
fn tiny_moe_qlora() -> LoadedRecipe {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../recipes/tiny_cpu_moe.yaml");
    let mut text = std::fs::read_to_string(&path).unwrap();
    for (from, to) in [
        ("    kind: cpt\n", "    kind: qlora\n    r: 8\n    alpha: 16\n"),
        ("  tokenizer: byte\n", "  tokenizer: byte\n  random_init: true\n"),
        ("    max_steps: 120\n", "    max_steps: 60\n"),
        ("    lr: 3.0e-3\n", "    lr: 1.0e-2\n"),
        ("    count: 4000\n", "    count: 800\n"),
        ("  log_every_steps: 20\n", "  log_every_steps: 1\n"),
    ] {
        assert!(text.contains(from), "tiny_cpu_moe.yaml no longer has {from:?}");
        text = text.replace(from, to);
    }
    Recipe::from_str(&text, "tiny_moe_qlora.yaml").unwrap_or_else(|e| panic!("{e}"))
}

/// The run trains (the per-token loss falls), saves adapters on attention and on both stacked
/// expert weights under PEFT's names with `target_parameters`, none on the router; `export`
/// merges them, as for a dense QLoRA run, into the full-precision base the run was given (the
/// NF4 codes are the run's working copy, not the model): the exported weights are exactly that
/// base with the adapters folded in, and compute what base and adapters compute.
#[test]
fn a_qwen3_moe_qlora_recipe_trains_adapters_over_nf4_experts_and_exports_merged() {
    let dir = tempfile::tempdir().unwrap();
    let recipe = tiny_moe_qlora();
    let recipe_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../recipes");
    let plan = Plan::new(recipe.bytes_blake3, "cpu", Choices::unmeasured(1), vec![], 0, 0, false);
    let spec = RunSpec { eval_prompts: 1, ..RunSpec::new(recipe, &recipe_dir, plan, dir.path().join("run")) };
    assert!(MethodPlan::from_recipe(&spec.recipe.recipe.train.method).unwrap().nf4_base);
    let mut sink = Collect(Vec::new());
    let summary = train(&spec, &mut sink, &mut Quiet).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(summary.steps, 60);
    let losses: Vec<f64> =
        sink.0.iter().filter(|e| e.kind == "train.progress").map(|e| e.data["loss"].as_f64().unwrap()).collect();
    assert_eq!(losses.len(), 60);
    let mean = |l: &[f64]| l.iter().sum::<f64>() / l.len() as f64;
    let (first, last) = (mean(&losses[..4]), mean(&losses[56..]));
    // Random weights under a frozen tied head: about 6.15 falls to 5.4 (a run is deterministic).
    assert!(last < 0.92 * first, "the loss did not fall: {first:.3} over the first 4 steps, {last:.3} over the last 4");

    let (config, tensors) = crate::checkpoint::load_peft_adapter(&summary.final_dir, &Device::Cpu).unwrap();
    assert_eq!(config.target_parameters.as_deref(), Some(&["gate_up_proj".to_string(), "down_proj".to_string()][..]));
    assert!(!tensors.keys().any(|n| n.contains("mlp.gate.")), "no adapter on the router");
    for layer in 0..2 {
        for path in ["mlp.experts.base_layer", "mlp.experts", "self_attn.q_proj"] {
            let b = &tensors[&format!("base_model.model.model.layers.{layer}.{path}.lora_B.weight")];
            let moved = b.abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap();
            assert!(moved > 0.0, "layer {layer} {path}: the adapter did not train");
        }
    }

    let out = dir.path().join("export");
    export_hf(&spec.recipe.recipe, &recipe_dir, &summary.final_dir, None, &out).unwrap();
    let (exported, _) = crate::checkpoint::load_hf_model(&out, DType::F32, &Device::Cpu).unwrap();
    let (base, _) = crate::checkpoint::load_base(&spec.recipe.recipe, None, &Device::Cpu).unwrap();
    let adapters =
        crate::checkpoint::load_adapter(&summary.final_dir, base.config(), DType::F32, &Device::Cpu).unwrap();
    let merged = merge_lora(base.params(), base.config(), &adapters).unwrap();
    let values = |t: &Tensor| t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
    assert_eq!(exported.params().keys().collect::<Vec<_>>(), merged.keys().collect::<Vec<_>>());
    for (name, want) in &merged {
        assert_eq!(values(&exported.params()[name]), values(want), "{name}");
    }
    let batch = crate::batch::PackedBatch {
        batch: 1,
        seq_len: 6,
        input_ids: vec![72, 105, 32, 116, 104, 101],
        position_ids: (0..6).collect(),
        segment_ids: vec![1; 6],
        labels: vec![crate::batch::IGNORE; 6],
    };
    let adapted = base.logits(&batch, Some(&adapters)).unwrap();
    let gap = (exported.logits(&batch, None).unwrap() - &adapted).unwrap().abs().unwrap().max_all().unwrap();
    assert!(gap.to_scalar::<f32>().unwrap() < 1e-4, "the export computes other logits");
    let config: Value = serde_json::from_slice(&std::fs::read(out.join("config.json")).unwrap()).unwrap();
    assert_eq!(config["model_type"], "qwen3_moe");
}
