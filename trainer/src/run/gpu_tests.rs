//! `mindxtrain bench` and `mindxtrain train` on a GPU, through the same `run` API the node
//! calls. Needs a CUDA device: built with the `cuda` feature by scripts/build-gpu and run there
//! by scripts/gpu-test.

use super::*;
use crate::data::DataOptions;
use crate::events::Discard;
use crate::recipe::Recipe;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// `recipes/NAME` edited by `edit`, parsed; and the recipes folder.
fn recipe(name: &str, edit: impl Fn(String) -> String) -> (LoadedRecipe, PathBuf) {
    // The GPU machine runs the carried binary from its copy of the repository's root.
    let cwd = std::env::current_dir().unwrap();
    let dir = [cwd.as_path(), Path::new(env!("CARGO_MANIFEST_DIR"))]
        .into_iter()
        .flat_map(|d| d.ancestors())
        .map(|d| d.join("recipes"))
        .find(|d| d.join(name).exists())
        .unwrap_or_else(|| panic!("recipes/{name} above the working directory"));
    let text = edit(std::fs::read_to_string(dir.join(name)).unwrap());
    (Recipe::from_str(&text, "gpu test recipe").unwrap(), dir)
}

/// The demo on one GPU (`recipes/tiny_gpu_lora.yaml`: bf16, head size 64, so the flash
/// kernels), 40 steps.
fn demo_on_gpu() -> (LoadedRecipe, PathBuf) {
    recipe("tiny_gpu_lora.yaml", |text| {
        let out = text
            .replace("    max_steps: 300", "    max_steps: 40")
            .replace("    every_steps: 100", "    every_steps: 20");
        assert_ne!(out, text);
        out
    })
}

fn spec(recipe: &LoadedRecipe, dir: &Path, plan: &Plan, out: &Path) -> RunSpec {
    RunSpec { eval_prompts: 4, ..RunSpec::new(recipe.clone(), dir, plan.clone(), out) }
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
    let (recipe, dir) = demo_on_gpu();
    let t0 = Instant::now();
    let plan = measure_plan(&recipe, &dir, None, DataOptions::default()).unwrap();
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

/// The bound: `mindxtrain bench` of the 8B-shape recipe within a minute, every GPU axis
/// included. One run of an earlier build (before probe steps synchronised the device and before
/// the attention and GEMM stages) was still going after 6 minutes with the GPU idle; the cause
/// was not pinned down, and every run since has passed in about 12 s.
#[test]
fn the_probe_at_the_8b_shape_fits_in_a_minute() {
    let (recipe, dir) = recipe("qwen3_8b_shape_lora_h100.yaml", |text| text);
    let t0 = Instant::now();
    let plan = measure_plan(&recipe, &dir, None, DataOptions::default()).unwrap();
    let secs = t0.elapsed().as_secs_f64();
    print_plan(&plan);
    println!("8B-shape probe: {secs:.1} s in all ({} ms timing)", plan.elapsed_ms);
    assert!(secs < 60.0, "the 8B-shape probe took {secs:.1} s");
    assert!(!plan.truncated, "the budget ran out before every candidate was timed");
}
