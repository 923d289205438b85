//! `mindxtrain bench` and `mindxtrain train` on a GPU, through the same `run` API the node
//! calls. Needs a CUDA device: built with the `cuda` feature by scripts/build-gpu and run there
//! by scripts/gpu-test.

use super::*;
use crate::data::DataOptions;
use crate::events::Discard;
use crate::recipe::Recipe;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// `recipes/tiny_cpu_lora.yaml` edited by `edit`, parsed; and the recipes folder.
fn recipe(edit: impl Fn(String) -> String) -> (LoadedRecipe, PathBuf) {
    // The GPU machine runs the carried binary from its copy of the repository's root.
    let cwd = std::env::current_dir().unwrap();
    let dir = [cwd.as_path(), Path::new(env!("CARGO_MANIFEST_DIR"))]
        .into_iter()
        .flat_map(|d| d.ancestors())
        .map(|d| d.join("recipes"))
        .find(|d| d.join("tiny_cpu_lora.yaml").exists())
        .expect("recipes/tiny_cpu_lora.yaml above the working directory");
    let text = edit(std::fs::read_to_string(dir.join("tiny_cpu_lora.yaml")).unwrap());
    (Recipe::from_str(&text, "gpu test recipe").unwrap(), dir)
}

/// The demo on one H100-class GPU in bf16, head size 64 (the flash kernels), 40 steps.
fn demo_on_gpu(text: String) -> String {
    let out = text
        .replace("hardware:\n  name: cpu\n  gpus: 0", "hardware:\n  name: h100\n  gpus: 1")
        .replace("  dtype: fp32", "  dtype: bf16")
        .replace("  precision: fp32", "  precision: bf16")
        .replace("    head_dim: 16", "    head_dim: 64")
        .replace("    max_steps: 300", "    max_steps: 40")
        .replace("    every_steps: 100", "    every_steps: 20");
    assert_ne!(out, text);
    out
}

fn spec(recipe: &LoadedRecipe, dir: &Path, plan: &Plan, out: &Path) -> RunSpec {
    RunSpec {
        recipe: recipe.clone(),
        recipe_dir: dir.to_path_buf(),
        plan: plan.clone(),
        plan_blake3: *blake3::hash(&plan.to_bytes()).as_bytes(),
        out_dir: out.to_path_buf(),
        resume: false,
        data: DataOptions::default(),
        init_from: None,
        eval_prompts: 4,
    }
}

/// Every timing of a plan, and what it chose.
fn print_plan(plan: &Plan) {
    for m in &plan.measurements {
        println!("  {:?}: {:?} µs {}", m.choices, m.step_us, m.note.as_deref().unwrap_or(""));
    }
    for g in &plan.gemms {
        let t: Vec<String> =
            g.timings.iter().map(|t| format!("{} {:.1}", t.algo.label(), t.us.unwrap_or(f64::NAN))).collect();
        println!("  gemm {:?}: chose {} of [{}]", g.shape, g.chosen.label(), t.join(", "));
    }
    println!("chose {:?}, truncated {}", plan.choices, plan.truncated);
}

#[test]
fn the_gpu_plan_replayed_twice_gives_identical_checkpoints() {
    let (recipe, dir) = recipe(demo_on_gpu);
    let t0 = Instant::now();
    let plan = measure_plan(&recipe, &dir, DataOptions::default()).unwrap();
    println!(
        "probe on {}: {} candidates in {:.1} s, chose {:?}",
        plan.machine.device,
        plan.measurements.len(),
        t0.elapsed().as_secs_f64(),
        plan.choices
    );
    assert_eq!(plan.machine.device, "cuda:0");
    print_plan(&plan);
    // Every GPU axis was measured: the attention kernels and the GEMM algorithms.
    assert!(plan.measurements.iter().any(|m| m.choices.attention.key_tile == 32 && m.step_us.is_some()));
    assert!(!plan.gemms.is_empty() && plan.gemms.iter().all(|g| g.timings.len() > 1), "{:?}", plan.gemms);
    let tmp = std::env::temp_dir().join(format!("mindxtrain-gpu-run-{}", std::process::id()));
    let mut digests = Vec::new();
    for name in ["a", "b"] {
        let out = tmp.join(name);
        let t = Instant::now();
        let summary = train(&spec(&recipe, &dir, &plan, &out), &mut Discard, &mut Quiet).unwrap();
        let files: Vec<String> = summary.files.iter().map(|f| format!("{} {}", f.path, f.blake3)).collect();
        println!(
            "run {name}: {} steps in {:.1} s, final loss {:?}, files {files:?}",
            summary.steps,
            t.elapsed().as_secs_f64(),
            summary.final_loss
        );
        assert_eq!(summary.steps, 40);
        digests.push(files);
    }
    let _ = std::fs::remove_dir_all(&tmp);
    assert!(!digests[0].is_empty());
    assert_eq!(digests[0], digests[1], "two runs of one recipe, plan and seed wrote different checkpoints");
}

#[test]
#[ignore = "its one run on an H200 (2026-11-21) was still going after 6 minutes, cause not found \
            yet; run it with --ignored: it prints how long the weights and the data take"]
fn the_probe_at_the_8b_shape_fits_in_a_minute() {
    let (recipe, dir) = recipe(|text| {
        let cfg = "    hidden_size: 4096\n    num_layers: 36\n    num_heads: 32\n    num_kv_heads: 8\n    head_dim: 128\n    intermediate_size: 12288\n    vocab_size: 151936\n    max_position_embeddings: 40960\n    tie_word_embeddings: false\n";
        let start = text.find("    hidden_size: 64").unwrap();
        let end = text.find("    tie_word_embeddings: true\n").unwrap() + "    tie_word_embeddings: true\n".len();
        let text = format!("{}{cfg}{}", &text[..start], &text[end..]);
        demo_on_gpu(text)
            .replace("  seq_len: 128", "  seq_len: 2048")
            .replace("    per_device: 8", "    per_device: 2")
            .replace("  budget_seconds: 10", "  budget_seconds: 40")
    });
    // Where the time goes, before the probe itself: the weights, then the data.
    let r = &recipe.recipe;
    let t = Instant::now();
    let device = run_device(r).unwrap();
    let cfg = crate::model::Qwen3Config::from(r.model.config.as_ref().unwrap());
    drop(crate::model::Qwen3::init_for_timing(&cfg, candle_core::DType::BF16, &device).unwrap());
    device.synchronize().unwrap();
    eprintln!("8B weights on the device: {:.1} s", t.elapsed().as_secs_f64());
    let t = Instant::now();
    let tokenizer = crate::data::Tokenizer::from_recipe(&r.model, &dir).unwrap();
    let dataset = crate::data::Dataset::from_recipe(r, &dir, &tokenizer, DataOptions::default()).unwrap();
    drop(dataset.batches(2, crate::data::DataCursor::default()).unwrap().next_batch());
    eprintln!("data: {:.1} s", t.elapsed().as_secs_f64());
    let t0 = Instant::now();
    let plan = measure_plan(&recipe, &dir, DataOptions::default()).unwrap();
    let secs = t0.elapsed().as_secs_f64();
    print_plan(&plan);
    println!("8B-shape probe: {secs:.1} s in all ({} ms timing)", plan.elapsed_ms);
    assert!(secs < 60.0, "the 8B-shape probe took {secs:.1} s");
}
