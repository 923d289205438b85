//! Each invariant is rejected at the right path and line:col, with a useful message.

mod common;

use common::{BASE, at, edit, errors, only_error};
use mindxtrain_trainer::recipe::{ErrorKind, Recipe};

#[test]
fn base_is_valid() {
    Recipe::from_str(BASE, "x.yaml").unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn mi300x_refuses_two_and_four_gpus_naming_xgmi() {
    for n in [2, 4, 3, 16] {
        let all = errors(&edit("gpus: 0", &format!("gpus: {n}")));
        let e = all.iter().find(|e| e.message().contains("asymmetric xGMI")).unwrap_or_else(|| panic!("{all}"));
        assert_eq!(at(e), (6, 3, "hardware.gpus"));
        assert_eq!(e.kind(), ErrorKind::Invariant);
    }
    let all = errors(&edit("gpus: 0", "gpus: 4"));
    assert_eq!(
        all.first().to_string(),
        "x.yaml:6:3 hardware.gpus: expected 0 (CPU), 1 or 8 on mi300x, found 4: 2- and 4-GPU groups \
         get asymmetric xGMI bandwidth on MI300-class boards"
    );
}

/// The board's own rule allows 0, 1 and 8; any GPU at all is refused today, because nothing
/// launches this build's HIP kernels on an AMD GPU.
#[test]
fn mi300x_takes_zero_gpus_and_refuses_gpus_it_cannot_launch_on() {
    Recipe::from_str(&edit("gpus: 0", "gpus: 0"), "x").unwrap_or_else(|e| panic!("{e}"));
    for n in [1, 8] {
        let e = only_error(&edit("gpus: 0", &format!("gpus: {n}")));
        assert_eq!(at(&e), (6, 3, "hardware.gpus"));
        assert!(e.message().contains("no launch path in this build"), "{e}");
    }
}

#[test]
fn nvidia_takes_one_two_four_or_eight() {
    for n in [0, 1, 2, 4, 8] {
        let src = edit("name: mi300x", "name: h100").replace("gpus: 0", &format!("gpus: {n}"));
        Recipe::from_str(&src, "x").unwrap_or_else(|e| panic!("gpus {n}: {e}"));
    }
    for n in [3, 5, 6, 7, 9, 16] {
        let e = only_error(&edit("name: mi300x", "name: h200").replace("gpus: 0", &format!("gpus: {n}")));
        assert_eq!(at(&e), (6, 3, "hardware.gpus"));
        assert_eq!(e.message(), format!("expected 0 (CPU), 1, 2, 4 or 8 on h200, found {n}"));
    }
}

#[test]
fn fsdp_is_zero3_and_the_distributed_knobs_have_ranges() {
    let h100 = |extra: &str| {
        edit("name: mi300x", "name: h100")
            .replace("gpus: 0", "gpus: 2")
            .replace("train:\n", &format!("train:\n{extra}"))
    };
    let r = Recipe::from_str(&h100("  fsdp: true\n"), "x").unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(r.recipe.train.distributed.sharding(r.recipe.train.fsdp), mindxtrain_trainer::recipe::Sharding::Zero3);
    let e = only_error(&h100("  fsdp: true\n  distributed:\n    sharding: zero1\n"));
    assert_eq!(e.path().to_string(), "train.distributed.sharding");
    let e = only_error(&h100("  distributed:\n    bucket_mb: 0\n"));
    assert_eq!(e.path().to_string(), "train.distributed.bucket_mb");
    let e = only_error(&h100("  distributed:\n    sharding: zero4\n"));
    assert_eq!(e.path().to_string(), "train.distributed.sharding");
    let r = Recipe::from_str(&h100("  distributed:\n    sharding: zero2\n    timeout_seconds: 60\n"), "x").unwrap();
    assert_eq!(r.recipe.train.distributed.timeout_seconds, 60);
}

#[test]
fn cpu_takes_no_gpus() {
    let e = only_error(&edit("name: mi300x", "name: cpu").replace("gpus: 0", "gpus: 1"));
    assert_eq!(at(&e), (6, 3, "hardware.gpus"));
}

#[test]
fn missing_mandatory_env_key_is_named() {
    let e = only_error(&edit("    NCCL_MIN_NCHANNELS: \"112\"\n", ""));
    assert_eq!(at(&e), (20, 3, "train.env.NCCL_MIN_NCHANNELS"));
    assert!(e.message().starts_with("missing mandatory ROCm env key NCCL_MIN_NCHANNELS"), "{e}");
}

#[test]
fn every_missing_env_key_is_reported_at_once() {
    let start = BASE.find("  env:").expect("env block");
    let all = errors(&BASE[..start]);
    assert_eq!(all.len(), 7, "{all}");
    for (e, key) in all.iter().zip(["HSA_NO_SCRATCH_RECLAIM", "NVTE_CK_USES_BWD_V3"]) {
        assert_eq!(at(e), (14, 1, format!("train.env.{key}").as_str()));
    }
}

#[test]
fn plan_arch_must_match_hardware() {
    let e = only_error(&edit("PYTORCH_ROCM_ARCH: gfx942", "PYTORCH_ROCM_ARCH: gfx950"));
    assert_eq!(at(&e), (27, 5, "train.env.PYTORCH_ROCM_ARCH"));
}

#[test]
fn jit_autotune_is_refused() {
    let e = only_error(&edit("policy: aot_only", "policy: jit"));
    assert_eq!(at(&e), (8, 3, "autotune.policy"));
    assert_eq!(e.kind(), ErrorKind::Schema);
    assert!(e.message().starts_with("policy `jit` is not allowed: only `aot_only`"), "{e}");
}

#[test]
fn unknown_field_at_depth() {
    let e = only_error(&edit("    r: 16\n", "    r: 16\n    rank: 8\n"));
    assert_eq!(at(&e), (18, 5, "train.method.rank"));
    assert!(e.message().starts_with("unknown field `rank`; expected one of `r`, `alpha`"), "{e}");
}

#[test]
fn unknown_top_level_section() {
    let e = only_error(&format!("{BASE}extras:\n  a: 1\n"));
    assert_eq!(at(&e), (28, 1, "extras"));
}

#[test]
fn float_for_integer() {
    let e = only_error(&edit("r: 16", "r: 1.5"));
    assert_eq!(e.to_string(), "x.yaml:17:5 train.method.r: expected an integer, found float `1.5`");
    let e = only_error(&edit("r: 16", "r: 16.0"));
    assert_eq!(e.message(), "expected an integer, found float `16.0`");
}

#[test]
fn integer_out_of_range() {
    let e = only_error(&edit("r: 16", "r: 600"));
    assert_eq!(e.to_string(), "x.yaml:17:5 train.method.r: expected integer 1..=512, found 600");
    let e = only_error(&edit("r: 16", "r: -1"));
    assert_eq!(at(&e), (17, 5, "train.method.r"));
}

#[test]
fn duplicate_key() {
    let e = only_error(&edit("    r: 16\n", "    r: 16\n    r: 8\n"));
    assert_eq!(at(&e), (18, 5, "train.method.r"));
    assert_eq!(e.message(), "duplicate key (first defined at line 17)");
    assert_eq!(e.kind(), ErrorKind::Syntax);
}

#[test]
fn wrong_method_kind() {
    let e = only_error(&edit("kind: lora", "kind: sft"));
    assert_eq!(at(&e), (16, 5, "train.method.kind"));
    assert!(e.message().starts_with("unknown value `sft`; expected one of `full`, `cpt`, `lora`"), "{e}");
}

#[test]
fn kind_may_come_after_the_method_fields() {
    let r = Recipe::from_str(&edit("    kind: lora\n    r: 16\n", "    r: 8\n    kind: lora\n"), "x")
        .unwrap_or_else(|e| panic!("{e}"))
        .recipe;
    assert_eq!(r.train.method.adapter().map(|l| l.r), Some(8));
}

#[test]
fn missing_method_kind() {
    let e = only_error(&edit("    kind: lora\n", ""));
    assert_eq!(at(&e), (15, 3, "train.method.kind"));
    assert_eq!(e.message(), "missing field `kind`");
}

#[test]
fn fields_of_another_method_kind() {
    let e = only_error(&edit("kind: lora", "kind: full"));
    assert_eq!(at(&e), (17, 5, "train.method.r"));
    assert!(e.message().contains("`kind: full` takes no other fields"), "{e}");
    let all = errors(&edit("kind: lora", "kind: dpo"));
    let e = all.iter().find(|e| e.path() == "train.method.r").expect("r refused for dpo");
    assert_eq!(at(e), (17, 5, "train.method.r"));
    assert!(e.message().contains("expected one of `beta`, `loss`"), "{e}");
}

#[test]
fn method_written_as_a_scalar() {
    let e = only_error(&edit("    kind: lora\n    r: 16\n", "").replace("  method:\n", "  method: lora\n"));
    assert_eq!(at(&e), (15, 3, "train.method"));
    assert!(e.message().contains("kind"), "{e}");
}

#[test]
fn betas_each_in_unit_interval() {
    let e = only_error(&edit("[0.9, 0.95]", "[0.9, 1.0]"));
    assert_eq!(at(&e), (19, 18, "train.optimizer.betas[1]"));
    assert_eq!(e.message(), "expected a number in [0, 1), found 1.0");
    let e = only_error(&edit("[0.9, 0.95]", "[0.9]"));
    assert_eq!(at(&e), (19, 5, "train.optimizer.betas"));
}

#[test]
fn missing_section_and_field() {
    let e = only_error(&edit("  run_name: r\n", ""));
    assert_eq!(at(&e), (1, 1, "meta.run_name"));
    let cut = BASE.find("train:").expect("train");
    let all = errors(&BASE[..cut]);
    assert_eq!(all.first().path(), "train");
}

#[test]
fn number_where_text_is_expected_says_quote_it() {
    let e = only_error(&edit("project: p", "project: 12"));
    assert_eq!(at(&e), (2, 3, "meta.project"));
    assert_eq!(e.message(), "expected a string, found integer `12`; quote it (\"12\") if text is meant");
    let e = only_error(&edit("HSA_NO_SCRATCH_RECLAIM: \"1\"", "HSA_NO_SCRATCH_RECLAIM: 1"));
    assert_eq!(at(&e), (21, 5, "train.env.HSA_NO_SCRATCH_RECLAIM"));
}

#[test]
fn ranges_are_checked() {
    let cases = [
        (
            "  hf_id: HuggingFaceH4/ultrachat_200k\n",
            "  hf_id: HuggingFaceH4/ultrachat_200k\n  seq_len: 8\n",
            "data.seq_len",
        ),
        ("policy: aot_only", "budget_seconds: 0", "autotune.budget_seconds"),
        ("policy: aot_only", "budget_seconds: 3601", "autotune.budget_seconds"),
        ("    r: 16\n", "    dropout: 1.5\n", "train.method.dropout"),
        ("    r: 16\n", "    alpha: 2000\n", "train.method.alpha"),
        ("    betas: [0.9, 0.95]\n", "    lr: 0\n", "train.optimizer.lr"),
        ("    betas: [0.9, 0.95]\n", "    lr: -1.0e-4\n", "train.optimizer.lr"),
        ("    betas: [0.9, 0.95]\n", "    lr: .nan\n", "train.optimizer.lr"),
        ("  optimizer:\n", "  schedule: {warmup_ratio: 1.5}\n  optimizer:\n", "train.schedule.warmup_ratio"),
    ];
    for (from, to, path) in cases {
        let e = only_error(&edit(from, to));
        assert_eq!(e.path(), path, "{e}");
        assert_eq!(e.kind(), ErrorKind::Invariant, "{e}");
    }
}

#[test]
fn all_problems_are_listed_in_file_order() {
    let src = edit("project: p", "project: p\n  colour: red")
        .replace("gpus: 0", "gpus: 4")
        .replace("policy: aot_only", "policy: jit")
        .replace("r: 16", "r: 1.5")
        .replace("    NCCL_MIN_NCHANNELS: \"112\"\n", "");
    let all = errors(&src);
    let got: Vec<_> = all.iter().map(|e| (e.location().map(|l| l.line), e.path().to_owned())).collect();
    let want = [
        (Some(3), "meta.colour"),
        (Some(7), "hardware.gpus"),
        (Some(7), "hardware.gpus"),
        (Some(9), "autotune.policy"),
        (Some(18), "train.method.r"),
        (Some(21), "train.env.NCCL_MIN_NCHANNELS"),
    ];
    let want: Vec<_> = want.iter().map(|(l, p)| (*l, (*p).to_owned())).collect();
    assert_eq!(got, want, "\n{all}");
    assert_eq!(all.to_string().lines().count(), 6);
}

#[test]
fn data_source_rules() {
    let all = errors(&edit("source: hf", "source: generated"));
    let got: Vec<_> = all.iter().map(|e| (at(e).0, e.path().to_owned())).collect();
    assert_eq!(got, [(11, "data.generator".to_owned()), (13, "data.hf_id".to_owned())], "{all}");
    let all = errors(&edit("source: hf", "source: jsonl"));
    let paths: Vec<_> = all.iter().map(|e| e.path()).collect();
    assert_eq!(paths, ["data.paths", "data.hf_id"], "{all}");
    // Column mapping is for Parquet/Arrow tables; JSONL keys are read as named, so a mapping
    // there would silently do nothing.
    let hf = "  hf_id: HuggingFaceH4/ultrachat_200k\n";
    let mapped = edit(hf, &format!("{hf}  columns: {{messages: conversations}}\n"));
    Recipe::from_str(&mapped, "x").unwrap_or_else(|e| panic!("{e}"));
    let all = errors(&mapped.replace("source: hf", "source: jsonl"));
    let paths: Vec<_> = all.iter().map(|e| e.path()).collect();
    assert!(paths.contains(&"data.columns"), "{all}");
    let e = only_error(&edit("kind: lora", "kind: dpo").replace("    r: 16\n", ""));
    assert_eq!(e.path(), "data.format");
    assert!(e.message().contains("preference"), "{e}");
}

#[test]
fn hub_data_needs_an_id_or_paths_and_revisions_need_something_to_pick_from() {
    // `source: hf` reads data.hf_id from the Hugging Face cache (BASE), or data.paths.
    let paths = edit("  hf_id: HuggingFaceH4/ultrachat_200k\n", "  paths: [ds]\n");
    Recipe::from_str(&paths, "x").unwrap_or_else(|e| panic!("{e}"));
    let e = only_error(&edit("  hf_id: HuggingFaceH4/ultrachat_200k\n", ""));
    assert_eq!(e.path(), "data.hf_id");
    assert!(e.message().contains("mindxtrain fetch") && e.message().contains("data.paths"), "{e}");
    // A revision picks a snapshot of the hub id; with nothing to pick from it would be ignored.
    let pinned =
        edit("  hf_id: HuggingFaceH4/ultrachat_200k\n", "  hf_id: HuggingFaceH4/ultrachat_200k\n  revision: v1\n")
            .replace("  name: Qwen/Qwen3-8B\n", "  name: Qwen/Qwen3-8B\n  revision: main\n");
    Recipe::from_str(&pinned, "x").unwrap_or_else(|e| panic!("{e}"));
    let e = only_error(&paths.replace("  paths: [ds]\n", "  paths: [ds]\n  revision: v1\n"));
    assert_eq!(e.path(), "data.revision");
    for model in ["  name: local-model\n  revision: main\n", "  name: Qwen/Qwen3-8B\n  revision: main\n  path: w\n"] {
        let e = only_error(&edit("  name: Qwen/Qwen3-8B\n", model));
        assert_eq!(e.path(), "model.revision", "{model}");
        assert!(e.message().contains("Hugging Face cache"), "{e}");
    }
}

#[test]
fn tensor_parallel_serving_is_refused() {
    for n in [2, 4, 8] {
        let e = only_error(&format!("{BASE}serve:\n  tensor_parallel: {n}\n"));
        assert_eq!(at(&e), (29, 3, "serve.tensor_parallel"));
        assert!(e.message().contains("tensor-parallel serving is not built"), "{e}");
    }
    Recipe::from_str(&format!("{BASE}serve:\n  tensor_parallel: 1\n"), "x").unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn random_init_needs_a_shape_and_no_weights_path() {
    // The flag goes on the line after `  name: Qwen/Qwen3-8B` (line 10 of the base).
    let e = only_error(&edit("  name: Qwen/Qwen3-8B\n", "  name: Qwen/Qwen3-8B\n  random_init: true\n"));
    assert_eq!(at(&e), (11, 3, "model.random_init"));
    assert!(e.message().contains("model.config"), "{e}");
    let with_path = edit("  name: Qwen/Qwen3-8B\n", "  name: Qwen/Qwen3-8B\n  path: /models/q\n  random_init: true\n");
    let all = errors(&with_path);
    assert!(all.iter().any(|e| e.message().contains("exclude each other")), "{all:?}");
    let shaped = edit(
        "  name: Qwen/Qwen3-8B\n",
        "  name: Qwen/Qwen3-8B\n  tokenizer: byte\n  random_init: true\n  config: {hidden_size: 64, num_layers: 1, \
         num_heads: 4, num_kv_heads: 2, head_dim: 16, intermediate_size: 64, vocab_size: 512}\n",
    );
    let r = Recipe::from_str(&shaped, "x").unwrap_or_else(|e| panic!("{e}")).recipe;
    assert!(r.model.random_init);
}

#[test]
fn generator_families_are_known_unrepeated_and_drawable() {
    // `data.generator` with these families, and `data.seq_len` when given.
    let generated = |families: &str, seq_len: Option<u32>| {
        let seq_len = seq_len.map(|n| format!("  seq_len: {n}\n")).unwrap_or_default();
        let generator = format!("  generator: {{kind: tasks, seed: 1, count: 10, families: {families}}}\n{seq_len}");
        edit("source: hf", "source: generated").replace("  hf_id: HuggingFaceH4/ultrachat_200k\n", &generator)
    };
    Recipe::from_str(&generated("[parity, weather]", None), "x").unwrap_or_else(|e| panic!("{e}"));
    let e = only_error(&generated("[parity, parity]", None));
    assert_eq!(e.path(), "data.generator.families[1]", "{e}");
    Recipe::from_str(&generated("[convert]", Some(192)), "x").unwrap_or_else(|e| panic!("{e}"));
    let e = only_error(&generated("[convert]", Some(128)));
    assert_eq!(e.path(), "data.generator.families", "{e}");
    assert!(e.message().contains("seq_len 192"), "{e}");
    let e = errors(&generated("[arithmetic]", None));
    assert!(e.to_string().contains("arithmetic"), "{e}");
}

/// A Qwen3-MoE model's MLP projections are its experts' stacked weights: gate and up are one
/// weight there (targeted together or not at all), and adapters on them take no dropout.
#[test]
fn qwen3_moe_lora_targets_gate_and_up_together_without_dropout() {
    let moe = |method: &str| {
        edit("name: Qwen/Qwen3-8B", "name: Qwen/Qwen3-30B-A3B\n  family: qwen3_moe")
            .replace("    kind: lora\n    r: 16\n", method)
    };
    let e = only_error(&moe("    kind: lora\n    r: 16\n    target_modules: [q_proj, up_proj, down_proj]\n"));
    assert_eq!(e.path().to_string(), "train.method.target_modules");
    assert!(e.message().contains("target both or neither"), "{e}");
    let e = only_error(&moe("    kind: lora\n    r: 16\n    dropout: 0.05\n"));
    assert_eq!(e.path().to_string(), "train.method.dropout");
    assert!(e.message().contains("takes no dropout"), "{e}");
    let ok = |src: &str| Recipe::from_str(src, "x").unwrap_or_else(|e| panic!("{e}"));
    ok(&moe("    kind: lora\n    r: 16\n    dropout: 0.05\n    target_modules: [q_proj, v_proj]\n"));
    ok(&moe("    kind: lora\n    r: 16\n    target_modules: [q_proj, gate_proj, up_proj]\n"));
    // A dense model adapts gate and up separately, with dropout.
    ok(&edit("    r: 16\n", "    r: 16\n    dropout: 0.05\n    target_modules: [q_proj, up_proj]\n"));
}

/// QLoRA on a Qwen3-MoE model (its experts' base in NF4, the router dense) is accepted under the
/// LoRA rules of a MoE model, and each refusal is located as before: gate and up targeted
/// together, no dropout with expert targets, `bits` 4 or 8.
#[test]
fn qwen3_moe_takes_qlora_under_the_moe_lora_rules() {
    use mindxtrain_trainer::recipe::{Method, TargetModule};
    let moe = |method: &str| {
        edit("name: Qwen/Qwen3-8B", "name: Qwen/Qwen3-30B-A3B\n  family: qwen3_moe")
            .replace("    kind: lora\n    r: 16\n", method)
    };
    let ok = |src: &str| Recipe::from_str(src, "x").unwrap_or_else(|e| panic!("{e}")).recipe;
    match ok(&moe("    kind: qlora\n    r: 16\n")).train.method {
        Method::Qlora(q) => assert_eq!((q.bits, q.lora.target_modules), (4, TargetModule::all())),
        other => panic!("{other:?}"),
    }
    ok(&moe("    kind: qlora\n    r: 16\n    target_modules: [q_proj, gate_proj, up_proj, down_proj]\n"));
    ok(&moe("    kind: qlora\n    r: 16\n    dropout: 0.05\n    target_modules: [q_proj, v_proj]\n"));
    // Line 19 is the field after `kind` and `r` (the family line moved everything down one).
    let e = only_error(&moe("    kind: qlora\n    r: 16\n    target_modules: [q_proj, gate_proj]\n"));
    assert_eq!(at(&e), (19, 5, "train.method.target_modules"));
    assert!(e.message().contains("target both or neither"), "{e}");
    let e = only_error(&moe("    kind: qlora\n    r: 16\n    dropout: 0.05\n"));
    assert_eq!(at(&e), (19, 5, "train.method.dropout"));
    assert!(e.message().contains("takes no dropout"), "{e}");
    let e = only_error(&moe("    kind: qlora\n    r: 16\n    bits: 3\n"));
    assert_eq!(
        (at(&e), e.message()),
        (
            (19, 5, "train.method.bits"),
            "expected 4, found 3: QLoRA holds the base in 4-bit NF4; 8-bit bases are not built"
        )
    );
}
