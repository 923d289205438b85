//! Every recipe shipped in `recipes/` must load, and must survive `recipe show --json` and
//! back. The directory is walked, so a new recipe is covered without touching this file.

use std::path::{Path, PathBuf};

use mindxtrain_trainer::recipe::{ErrorKind, HardwareName, Recipe};

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

/// What each shipped recipe asks for that this build refuses, by field: a recipe either runs, or
/// `recipe check` says everything it cannot honour (nothing passes the check and then fails).
/// A feature that lands empties its rows; a new refusal that a shipped recipe meets shows here.
const REFUSED: &[(&str, &[&str])] = &[
    ("instella_3b_lora", &["hardware.gpus"]),
    ("qwen3_30b_a3b_lora", &["hardware.gpus"]),
    ("qwen3_32b_dpo", &["hardware.gpus", "train.fsdp"]),
    ("qwen3_32b_full_fsdp", &["hardware.gpus"]),
    ("qwen3_32b_grpo", &["hardware.gpus"]),
    ("qwen3_32b_orpo", &["hardware.gpus", "train.fsdp"]),
    // Qwen3.6 hybrids, dense and MoE, train on one GPU (several are not verified yet) and
    // evaluate and serve on the CPU.
    ("qwen3_6_27b_lora", &["hardware.gpus"]),
    ("qwen3_6_35b_a3b_lora", &["hardware.gpus"]),
    ("qwen3_8b_cpt", &["hardware.gpus"]),
    // Benchmark tasks: humaneval's sandbox is not built (refused at its index of eval.tasks);
    // mmlu, gsm8k and ifeval are.
    ("qwen3_8b_sft_full", &["eval.tasks[3]", "hardware.gpus"]),
    ("qwen3_8b_sft_lora", &["eval.tasks[3]", "hardware.gpus", "publish.enabled"]),
    ("qwen3_vl_8b_sft", &["hardware.gpus", "model.family"]),
];

fn refused(name: &str) -> &'static [&'static str] {
    REFUSED.iter().find(|(n, _)| *n == name).map_or(&[], |(_, paths)| paths)
}

fn stem(path: &Path) -> String {
    path.file_stem().unwrap_or_default().to_string_lossy().into_owned()
}

#[test]
fn every_recipe_runs_or_is_refused_for_exactly_what_is_not_built() {
    let files = recipe_files();
    assert!(files.len() >= 14, "expected the 14 shipped recipes, found {}", files.len());
    let mut wrong = Vec::new();
    for path in &files {
        let got: Vec<String> = match Recipe::check_path(path) {
            Ok(_) => Vec::new(),
            Err(errors) => {
                // Refusals only: a schema error or a broken range is a broken recipe.
                for e in errors.iter().filter(|e| e.kind() != ErrorKind::Invariant) {
                    wrong.push(format!("{e}"));
                }
                let mut paths: Vec<String> = errors.iter().map(|e| e.path().to_owned()).collect();
                paths.dedup();
                paths.sort();
                paths.dedup();
                paths
            }
        };
        let want: Vec<String> = refused(&stem(path)).iter().map(|p| (*p).to_owned()).collect();
        if got != want {
            wrong.push(format!("{}: refused at {got:?}, expected {want:?}", path.display()));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn every_recipe_that_runs_round_trips_through_show_json() {
    for path in recipe_files().into_iter().filter(|p| refused(&stem(p)).is_empty()) {
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

/// The seed recipes as shipped (refused today for what is not built): their method, board and
/// GPU count, read from the text.
#[test]
fn the_seed_recipes_keep_their_intent() {
    let expect = [
        ("instella_3b_lora", "lora", 1),
        ("qwen3_8b_sft_lora", "lora", 1),
        ("qwen3_8b_sft_full", "full", 1),
        ("qwen3_8b_cpt", "cpt", 8),
        ("qwen3_30b_a3b_lora", "lora", 8),
        ("qwen3_32b_full_fsdp", "full", 8),
        ("qwen3_32b_dpo", "dpo", 8),
        ("qwen3_32b_orpo", "orpo", 8),
        ("qwen3_32b_grpo", "grpo", 8),
        ("qwen3_6_27b_lora", "lora", 8),
        ("qwen3_6_35b_a3b_lora", "lora", 8),
        ("qwen3_vl_8b_sft", "lora", 1),
    ];
    for (name, kind, gpus) in expect {
        let text = std::fs::read_to_string(recipes_dir().join(format!("{name}.yaml"))).unwrap();
        let lines: Vec<&str> = text.lines().map(str::trim).collect();
        assert!(lines.contains(&format!("kind: {kind}").as_str()), "{name}");
        assert!(lines.contains(&"name: mi300x"), "{name}");
        assert!(lines.contains(&format!("gpus: {gpus}").as_str()), "{name}");
        assert!(!refused(name).is_empty(), "{name} runs now: move it out of this test's table");
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
    let path = recipes_dir().join("qwen3_8b_lora_h100.yaml");
    let text = std::fs::read_to_string(&path).unwrap();
    let r = Recipe::from_str(&text, "h100.yaml").unwrap_or_else(|e| panic!("{e}")).recipe;
    assert_eq!(r.eval.tasks, ["mmlu", "gsm8k", "ifeval"]);
    assert_eq!(r.hardware.name, HardwareName::H100);
    assert_eq!(r.hardware.arch, "sm_90");
    let lora = r.train.method.adapter().expect("lora");
    assert_eq!((lora.r, lora.alpha, lora.target_modules.len()), (16, 32, 7));
    assert_eq!((r.train.batch.per_device, r.data.seq_len), (2, 2048));
    assert!(r.train.env.is_empty(), "no ROCm keys on NVIDIA");
}

/// The benchmarks' recipes (`bench/recipes/`: the shipped ones' training sections on the one GPU
/// we have) pass the check as they are: a bench run never starts from a refused recipe.
#[test]
fn every_bench_recipe_passes_the_check() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../bench/recipes");
    let files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("bench/recipes/ is readable")
        .map(|e| e.expect("directory entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    assert!(files.iter().any(|p| stem(p) == "qwen3_6_35b_a3b_h200"), "{files:?}");
    for path in files {
        if let Err(errors) = Recipe::check_path(&path) {
            panic!("{}: {}", path.display(), errors.iter().map(|e| e.to_string()).collect::<Vec<_>>().join("; "));
        }
    }
}
