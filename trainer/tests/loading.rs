//! Syntax, files, error format, x402 billing values and plan env overrides.

mod common;

use std::collections::BTreeMap;

use common::{BASE, at, edit, errors, only_error};
use mindxtrain_trainer::recipe::{
    EnvOverrideError, ErrorKind, Kto, Location, Method, MethodKind, Recipe, apply_plan_env, mandatory_rocm_env_keys,
};

fn with_billing(x402: &str) -> String {
    format!("{BASE}publish:\n  billing:\n    x402:\n{x402}")
}

#[test]
fn display_is_file_line_col_path_message() {
    let broken = [
        edit("gpus: 0", "gpus: 4"),
        edit("r: 16", "r: x"),
        edit("kind: lora", "kind: nope"),
        format!("{BASE}: bad\n"),
        "meta: [1, 2\nb: 3\n".to_owned(),
    ];
    for src in broken {
        for e in errors(&src).iter() {
            let loc = e.location().expect("located");
            let want = format!("x.yaml:{}:{} {}: {}", loc.line, loc.column, e.path(), e.message());
            assert_eq!(e.to_string(), want);
            assert!(!e.path().is_empty() && !e.message().is_empty());
            assert_eq!(e.source_name(), "x.yaml");
        }
    }
}

#[test]
fn malformed_yaml_is_a_located_syntax_error() {
    let e = only_error("meta:\n  project: [p, q\nhardware: {}\n");
    assert_eq!(e.kind(), ErrorKind::Syntax);
    assert_eq!(e.location().map(|l| l.line), Some(3));
    assert!(e.message().starts_with("invalid YAML"), "{e}");
    let e = only_error("meta:\n\tproject: p\n");
    assert_eq!(e.kind(), ErrorKind::Syntax);
}

#[test]
fn anchors_aliases_and_tags_are_refused() {
    let e = only_error(&edit("project: p", "project: &name p").replace("run_name: r", "run_name: *name"));
    assert_eq!(at(&e), (2, 12, "meta.project"));
    assert!(e.message().contains("anchors"), "{e}");
    let e = only_error(&edit("project: p", "project: !!str p"));
    assert!(e.message().contains("tags"), "{e}");
}

#[test]
fn billion_laughs_is_refused_before_expansion() {
    let mut src = String::from("a: &a [\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\"]\n");
    for (prev, next) in ('a'..='h').zip('b'..='i') {
        src.push_str(&format!(
            "{next}: &{next} [*{prev},*{prev},*{prev},*{prev},*{prev},*{prev},*{prev},*{prev},*{prev}]\n"
        ));
    }
    let e = only_error(&src);
    assert_eq!(e.kind(), ErrorKind::Syntax);
    assert_eq!(e.location(), Some(Location { line: 1, column: 4 }));
}

#[test]
fn a_second_document_is_refused() {
    let e = only_error(&format!("{BASE}---\nmeta: {{}}\n"));
    assert_eq!(e.location().map(|l| l.line), Some(28));
}

#[test]
fn empty_and_non_mapping_documents() {
    for src in ["", "# only a comment\n", "\n\n"] {
        let e = only_error(src);
        assert_eq!((at(&e).0, at(&e).1, e.path()), (1, 1, "(root)"));
        assert!(e.message().starts_with("empty recipe"), "{e}");
    }
    let e = only_error("- a\n- b\n");
    assert_eq!(e.path(), "(root)");
    assert!(e.message().starts_with("expected a mapping with fields `meta`"), "{e}");
    let e = only_error("42\n");
    assert_eq!(e.message().split(',').next(), Some("expected a mapping with fields `meta`"));
}

#[test]
fn files_are_read_and_named() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("r.yaml");
    std::fs::write(&path, BASE).expect("write");
    let loaded = Recipe::from_path(&path).expect("loads");
    assert_eq!(loaded.source_name, path.display().to_string());
    assert_eq!(loaded.bytes_blake3, *blake3::hash(BASE.as_bytes()).as_bytes());

    std::fs::write(&path, edit("gpus: 0", "gpus: 2")).expect("write");
    let e = Recipe::from_path(&path).unwrap_err();
    assert!(e.to_string().starts_with(&format!("{}:6:3 hardware.gpus: ", path.display())), "{e}");

    let missing = dir.path().join("absent.yaml");
    let e = Recipe::from_path(&missing).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Io);
    assert_eq!(e.location(), None);
    assert!(e.to_string().starts_with(&format!("{}: cannot read recipe: ", missing.display())), "{e}");
}

#[test]
fn non_utf8_is_located() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("bad.yaml");
    std::fs::write(&path, b"meta:\n  project: p\xff\n").expect("write");
    let e = Recipe::from_path(&path).unwrap_err();
    assert_eq!(e.location(), Some(Location { line: 2, column: 13 }));
    assert!(e.message().contains("UTF-8"), "{e}");
}

#[test]
fn oversized_files_are_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("big.yaml");
    let big = format!("{BASE}# {}\n", "x".repeat(2 << 20));
    std::fs::write(&path, big).expect("write");
    let e = Recipe::from_path(&path).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Io);
    assert!(e.message().contains("larger than"), "{e}");
}

#[test]
fn x402_accepts_networks_by_name_or_caip2() {
    for (network, caip2) in [
        ("base", "eip155:8453"),
        ("base-sepolia", "eip155:84532"),
        ("anvil", "eip155:31337"),
        ("\"eip155:10\"", "eip155:10"),
    ] {
        let src = with_billing(&format!("      network: {network}\n      pricing: {{per_call: \"0.001\"}}\n"));
        let r = Recipe::from_str(&src, "x").unwrap_or_else(|e| panic!("{e}")).recipe;
        let x = r.publish.billing.x402.expect("billing");
        assert_eq!(x.network.caip2(), caip2);
        assert_eq!(x.pricing.per_call.map(|u| u.atomic()), Some(1_000));
    }
}

#[test]
fn x402_refuses_non_evm_networks() {
    let e = only_error(&with_billing("      network: algorand\n      pricing: {per_call: \"0.001\"}\n"));
    assert_eq!(at(&e), (31, 7, "publish.billing.x402.network"));
    assert!(e.message().contains("not an EVM network"), "{e}");
}

#[test]
fn x402_amounts_are_exact_decimal_strings() {
    let e = only_error(&with_billing("      network: base\n      pricing: {per_call: \"0.0000001\"}\n"));
    assert_eq!(at(&e), (32, 17, "publish.billing.x402.pricing.per_call"));
    assert!(e.message().contains("at most 6"), "{e}");
    let e = only_error(&with_billing("      network: base\n      pricing: {per_call: 0.001}\n"));
    assert!(e.message().starts_with("expected a string, found float `0.001`; quote it"), "{e}");
    let e = only_error(&with_billing("      network: base\n      pricing: {per_1k_tokens: \"0.0002\"}\n"));
    assert_eq!(e.path(), "publish.billing.x402.pricing.max_charge");
    let e = only_error(&with_billing(
        "      network: base\n      pricing: {per_call: \"0.001\", per_1k_tokens: \"0.0002\", max_charge: \"1\"}\n",
    ));
    assert_eq!(e.path(), "publish.billing.x402.pricing.per_1k_tokens");
    let ok = with_billing(
        "      network: base\n      asset: \"0x833589fCD6eDb6E08f4c7C32D4f71b54bdA02913\"\n      pay_to: \"0x00000000000000000000000000000000000000aa\"\n      pricing: {per_1k_tokens: \"0.0002\", max_charge: \"0.05\"}\n      rental: {per_hour: \"2.5\"}\n",
    );
    let x = Recipe::from_str(&ok, "x").unwrap_or_else(|e| panic!("{e}")).recipe.publish.billing.x402.expect("x402");
    assert_eq!(x.pricing.max_charge.map(|u| u.atomic()), Some(50_000));
    assert_eq!(x.rental.map(|r| r.per_hour.atomic()), Some(2_500_000));
}

fn overrides(pairs: &[(&str, Option<&str>)]) -> BTreeMap<String, Option<String>> {
    pairs.iter().map(|(k, v)| ((*k).to_owned(), v.map(str::to_owned))).collect()
}

#[test]
fn plan_may_retune_but_never_drop_mandatory_env() {
    let recipe = Recipe::from_str(BASE, "x").expect("valid").recipe;
    let env =
        apply_plan_env(&recipe, &overrides(&[("NCCL_MIN_NCHANNELS", Some("64")), ("EXTRA", Some("1"))])).expect("ok");
    assert_eq!(env["NCCL_MIN_NCHANNELS"], "64");
    assert_eq!(env["EXTRA"], "1");
    for key in mandatory_rocm_env_keys() {
        assert!(env.contains_key(*key));
        let err = apply_plan_env(&recipe, &overrides(&[(key, None)])).unwrap_err();
        assert_eq!(err, EnvOverrideError::RemovesMandatoryKey { key: (*key).to_owned() });
        let err = apply_plan_env(&recipe, &overrides(&[(key, Some(" "))])).unwrap_err();
        assert_eq!(err, EnvOverrideError::EmptiesMandatoryKey { key: (*key).to_owned() });
    }
    let bad = apply_plan_env(&recipe, &overrides(&[("bad-key", Some("1"))])).unwrap_err();
    assert!(matches!(bad, EnvOverrideError::InvalidKey { .. }));
    // The arch list may grow, never lose the hardware's own arch.
    let env = apply_plan_env(&recipe, &overrides(&[("PYTORCH_ROCM_ARCH", Some("gfx90a;gfx942"))])).expect("ok");
    assert_eq!(env["PYTORCH_ROCM_ARCH"], "gfx90a;gfx942");
    let err = apply_plan_env(&recipe, &overrides(&[("PYTORCH_ROCM_ARCH", Some("gfx90a"))])).unwrap_err();
    assert_eq!(err, EnvOverrideError::DropsHardwareArch { value: "gfx90a".into(), arch: "gfx942".into() });
}

#[test]
fn plan_may_drop_keys_where_none_are_mandatory() {
    let src = edit("name: mi300x", "name: h100");
    let recipe = Recipe::from_str(&src, "x").expect("valid").recipe;
    let env = apply_plan_env(&recipe, &overrides(&[("HSA_NO_SCRATCH_RECLAIM", None)])).expect("ok");
    assert!(!env.contains_key("HSA_NO_SCRATCH_RECLAIM"));
    assert_eq!(env.len(), 6);
}

#[test]
fn defaults_are_resolved_and_shown() {
    let r = Recipe::from_str(BASE, "x").expect("valid").recipe;
    assert_eq!(r.hardware.arch, "gfx942");
    let shown = serde_json::to_value(&r).expect("serializes");
    assert_eq!(shown["autotune"]["budget_seconds"], 60);
    assert_eq!(shown["train"]["method"]["kind"], "lora");
    assert_eq!(shown["train"]["method"]["alpha"], 32);
    assert_eq!(shown["train"]["method"]["target_modules"].as_array().map(Vec::len), Some(7));
    assert_eq!(shown["data"]["seq_len"], 4096);
    assert_eq!(shown["receipt"]["include"][0], "recipe_hash");
}

/// `BASE` with its LoRA method replaced by `method` (indented fields after `kind`) and
/// `data.format: {format}` inserted, which moves `train.method.kind` to line 17.
fn with_method(method: &str, format: &str) -> String {
    edit("    kind: lora\n    r: 16\n", method).replacen(
        "  hf_id: HuggingFaceH4/ultrachat_200k\n",
        &format!("  hf_id: HuggingFaceH4/ultrachat_200k\n  format: {format}\n"),
        1,
    )
}

#[test]
fn kto_parses_with_its_fields_and_defaults() {
    let src = with_method("    kind: kto\n    desirable_weight: 1.5\n", "preference");
    let r = Recipe::from_str(&src, "x.yaml").unwrap_or_else(|e| panic!("{e}")).recipe;
    assert_eq!(r.train.method.kind(), MethodKind::Kto);
    assert_eq!(
        r.train.method,
        Method::Kto(Kto { beta: 0.1, desirable_weight: 1.5, undesirable_weight: 1.0, lora: None })
    );
    assert!(r.train.method.adapter().is_none());

    let src = with_method("    kind: kto\n    beta: 0.3\n    undesirable_weight: 2\n    lora: {r: 8}\n", "preference");
    let r = Recipe::from_str(&src, "x.yaml").unwrap_or_else(|e| panic!("{e}")).recipe;
    let Method::Kto(k) = &r.train.method else { panic!("{:?}", r.train.method) };
    assert_eq!((k.beta, k.desirable_weight, k.undesirable_weight), (0.3, 1.0, 2.0));
    assert_eq!(k.lora.as_ref().map(|l| l.r), Some(8));
    let shown = serde_json::to_value(&r).expect("serializes");
    assert_eq!(shown["train"]["method"]["kind"], "kto");
}

#[test]
fn kto_wrong_fields_are_located() {
    let e = only_error(&with_method("    kind: kto\n    gamma: 0.5\n", "preference"));
    assert_eq!(at(&e), (18, 5, "train.method.gamma"));
    assert!(e.message().contains("`desirable_weight`"), "{e}");
    assert!(e.to_string().starts_with("x.yaml:18:5 train.method.gamma: "), "{e}");

    let e = only_error(&with_method("    kind: kto\n    beta: 0.1\n    undesirable_weight: high\n", "preference"));
    assert_eq!(at(&e), (19, 5, "train.method.undesirable_weight"));
    assert!(e.to_string().starts_with("x.yaml:19:5 train.method.undesirable_weight: expected"), "{e}");

    let e = only_error(&with_method("    kind: kto\n    desirable_weight: 0\n", "preference"));
    assert_eq!(at(&e).2, "train.method.desirable_weight");
    assert!(e.message().contains("> 0"), "{e}");

    let e = only_error(&with_method("    kind: kto\n", "chat"));
    assert_eq!(e.path(), "data.format");
    assert!(e.message().contains("`kind: kto` needs"), "{e}");
}

#[test]
fn gspo_parses_with_its_fields_and_defaults() {
    let src = with_method("    kind: gspo\n    num_generations: 8\n", "chat");
    let r = Recipe::from_str(&src, "x.yaml").unwrap_or_else(|e| panic!("{e}")).recipe;
    assert_eq!(r.train.method.kind(), MethodKind::Gspo);
    let Method::Gspo(g) = &r.train.method else { panic!("{:?}", r.train.method) };
    assert_eq!(g.num_generations, 8);
    // Sequence-level clipping: a much smaller range than GRPO's, and no KL term by default.
    assert_eq!((g.kl_coef, g.clip_epsilon, g.temperature), (0.0, 4e-4, 1.0));
    assert_eq!(g.max_new_tokens, 512);
    assert!(g.lora.is_none());
    let shown = serde_json::to_value(&r).expect("serializes");
    assert_eq!(shown["train"]["method"]["kind"], "gspo");
    assert_eq!(shown["train"]["method"]["rewards"], serde_json::json!(["numeric_match", "format"]));

    let src = with_method(
        "    kind: gspo\n    clip_epsilon: 0.001\n    kl_coef: 0.01\n    rewards: [exact_match]\n    lora: {r: 8}\n",
        "instruction",
    );
    let r = Recipe::from_str(&src, "x.yaml").unwrap_or_else(|e| panic!("{e}")).recipe;
    let Method::Gspo(g) = &r.train.method else { panic!("{:?}", r.train.method) };
    assert_eq!((g.clip_epsilon, g.kl_coef), (0.001, 0.01));
    assert_eq!(g.lora.as_ref().map(|l| l.r), Some(8));
    let shown = serde_json::to_value(&r).expect("serializes");
    assert_eq!(shown["train"]["method"]["rewards"], serde_json::json!(["exact_match"]));
}

#[test]
fn gspo_wrong_fields_are_located() {
    let e = only_error(&with_method("    kind: gspo\n    clip_range: 0.1\n", "chat"));
    assert_eq!(at(&e), (18, 5, "train.method.clip_range"));
    assert!(e.message().contains("`clip_epsilon`"), "{e}");
    assert!(e.to_string().starts_with("x.yaml:18:5 train.method.clip_range: "), "{e}");

    let e = only_error(&with_method("    kind: gspo\n    num_generations: 1\n", "chat"));
    assert_eq!(at(&e), (18, 5, "train.method.num_generations"));
    assert_eq!(e.message(), "expected integer 2..=64, found 1");

    let e = only_error(&with_method("    kind: gspo\n    rewards: [format, vibes]\n", "chat"));
    assert_eq!((at(&e).0, at(&e).2), (18, "train.method.rewards[1]"));
    assert!(e.message().contains("vibes"), "{e}");

    let e = only_error(&with_method("    kind: gspo\n", "preference"));
    assert_eq!(e.path(), "data.format");
    assert!(e.message().contains("`kind: gspo` needs"), "{e}");
}
