//! Every recipe shipped in `recipes/` must load, and must survive `recipe show --json` and
//! back. The directory is walked, so a new recipe is covered without touching this file.

use std::path::{Path, PathBuf};

use mindxtrain_trainer::recipe::{HardwareName, MethodKind, Recipe};

fn recipes_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../recipes")
}

fn recipe_files() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(recipes_dir())
        .expect("recipes/ is readable")
        .map(|e| e.expect("directory entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml" || e == "yml"))
        .collect();
    files.sort();
    files
}

#[test]
fn every_recipe_in_the_directory_validates() {
    let files = recipe_files();
    assert!(files.len() >= 14, "expected the 14 shipped recipes, found {}", files.len());
    let mut failures = Vec::new();
    for path in &files {
        if let Err(errors) = Recipe::check_path(path) {
            failures.push(errors.to_string());
        }
    }
    assert!(failures.is_empty(), "invalid recipes:\n{}", failures.join("\n"));
}

#[test]
fn every_recipe_round_trips_through_show_json() {
    for path in recipe_files() {
        let loaded = Recipe::from_path(&path).unwrap_or_else(|e| panic!("{e}"));
        let shown = serde_json::to_string_pretty(&loaded.recipe).expect("a recipe serializes");
        let again =
            Recipe::from_str(&shown, "show.json").unwrap_or_else(|e| panic!("{}: {e}\n{shown}", path.display()));
        assert_eq!(again.recipe, loaded.recipe, "{} changed through show --json", path.display());
    }
}

#[test]
fn the_digest_is_of_the_exact_bytes() {
    let path = recipes_dir().join("tiny_cpu_lora.yaml");
    let bytes = std::fs::read(&path).expect("tiny recipe exists");
    let loaded = Recipe::from_path(&path).expect("tiny recipe loads");
    assert_eq!(loaded.bytes_blake3, *blake3::hash(&bytes).as_bytes());
    let with_comment = format!("# a comment changes the digest, not the recipe\n{}", String::from_utf8_lossy(&bytes));
    let other = Recipe::from_str(&with_comment, "x").expect("still valid");
    assert_eq!(other.recipe, loaded.recipe);
    assert_ne!(other.bytes_blake3, loaded.bytes_blake3);
}

#[test]
fn the_seed_recipes_keep_their_intent() {
    let expect = [
        ("instella_3b_lora", MethodKind::Lora, 1),
        ("qwen3_8b_sft_lora", MethodKind::Lora, 1),
        ("qwen3_8b_sft_full", MethodKind::Full, 1),
        ("qwen3_8b_cpt", MethodKind::Cpt, 8),
        ("qwen3_30b_a3b_lora", MethodKind::Lora, 8),
        ("qwen3_32b_full_fsdp", MethodKind::Full, 8),
        ("qwen3_32b_dpo", MethodKind::Dpo, 8),
        ("qwen3_32b_orpo", MethodKind::Orpo, 8),
        ("qwen3_32b_grpo", MethodKind::Grpo, 8),
        ("qwen3_6_27b_lora", MethodKind::Lora, 8),
        ("qwen3_6_35b_a3b_lora", MethodKind::Lora, 8),
        ("qwen3_vl_8b_sft", MethodKind::Lora, 1),
    ];
    for (name, kind, gpus) in expect {
        let loaded = Recipe::from_path(&recipes_dir().join(format!("{name}.yaml"))).unwrap_or_else(|e| panic!("{e}"));
        let r = loaded.recipe;
        assert_eq!(r.train.method.kind(), kind, "{name}");
        assert_eq!(r.hardware.name, HardwareName::Mi300x, "{name}");
        assert_eq!(r.hardware.gpus, gpus, "{name}");
        if let Some(x402) = &r.publish.billing.x402 {
            assert!(["eip155:8453", "eip155:84532"].contains(&x402.network.caip2().as_str()), "{name}");
        }
    }
}

#[test]
fn the_tiny_cpu_recipe_is_self_contained() {
    let r = Recipe::from_path(&recipes_dir().join("tiny_cpu_lora.yaml")).expect("loads").recipe;
    assert_eq!(r.hardware.name, HardwareName::Cpu);
    assert_eq!(r.hardware.gpus, 0);
    let cfg = r.model.config.as_ref().expect("inline shape");
    assert_eq!((cfg.hidden_size, cfg.num_layers, cfg.num_heads, cfg.num_kv_heads), (64, 2, 4, 2));
    assert_eq!((cfg.head_dim, cfg.intermediate_size), (16, 128));
    assert_eq!(r.model.path, None, "the base is the pretraining run's final/, given at run time");
    assert!(!r.model.random_init, "a LoRA on random weights must not run by default");
    assert!(r.data.generator.is_some());
    assert_eq!(r.data.seq_len, 128);
    assert_eq!(r.train.method.adapter().map(|l| l.r), Some(8));
    assert_eq!(r.train.budget.max_steps, Some(300));
}

#[test]
fn the_h100_recipe_matches_its_description() {
    let r = Recipe::from_path(&recipes_dir().join("qwen3_8b_lora_h100.yaml")).expect("loads").recipe;
    assert_eq!(r.hardware.name, HardwareName::H100);
    assert_eq!(r.hardware.arch, "sm_90");
    let lora = r.train.method.adapter().expect("lora");
    assert_eq!((lora.r, lora.alpha, lora.target_modules.len()), (16, 32, 7));
    assert_eq!((r.train.batch.per_device, r.data.seq_len), (2, 2048));
    assert!(r.train.env.is_empty(), "no ROCm keys on NVIDIA");
}
