//! Sealing a fake run in a real node directory.

use super::*;
use crate::identity::Identity;
use crate::log::{AppendRequest, EventLog};
use crate::manifest::statement::ReceiptItem;
use serde_json::json;
use std::path::Path;
use std::time::{Duration, SystemTime};

pub(crate) const RECIPE: &str = include_str!("../../../recipes/tiny_cpu_lora.yaml");

/// A node with a finished fake run: random "checkpoint" files, an eval report, a plan.
pub(crate) struct Fixture {
    pub dir: tempfile::TempDir,
    pub log: EventLog,
    pub key: Identity,
    pub sealed: Sealed,
}

impl Fixture {
    pub fn node(&self) -> &Path {
        self.dir.path()
    }
    pub fn out(&self) -> std::path::PathBuf {
        self.dir.path().join("run-out")
    }
}

/// The shipped LoRA recipe asking its receipt for recipe_hash alone.
pub(crate) fn recipe_hash_only() -> String {
    format!("{RECIPE}\nreceipt:\n  include: [recipe_hash]\n")
}

pub(crate) fn write_run(
    root: &Path,
    recipe_text: &str,
) -> (std::path::PathBuf, std::path::PathBuf, std::path::PathBuf) {
    let out = root.join("run-out");
    std::fs::create_dir_all(out.join("adapter")).unwrap();
    std::fs::create_dir_all(out.join("checkpoints/step-00000010")).unwrap();
    std::fs::write(out.join("checkpoints/step-00000010/adapter_config.json"), br#"{"r":8}"#).unwrap();
    let mut bytes = vec![0u8; (1 << 20) + 333];
    getrandom::fill(&mut bytes).unwrap();
    std::fs::write(out.join("adapter/adapter_model.safetensors"), &bytes).unwrap();
    std::fs::write(out.join("adapter/adapter_config.json"), br#"{"r":8}"#).unwrap();
    std::fs::write(out.join("eval.json"), br#"{"loss":1.25,"accuracy":0.5,"per_task":{"a":1}}"#).unwrap();
    let recipe = root.join("recipe.yaml");
    std::fs::write(&recipe, recipe_text).unwrap();
    let plan = root.join("plan.json");
    std::fs::write(&plan, br#"{"attention":"sdpa","gemm":{"tile":128}}"#).unwrap();
    (out, recipe, plan)
}

pub(crate) fn sealed_run() -> Fixture {
    sealed_run_of(RECIPE)
}

/// A fake run of `recipe_text` sealed in a fresh node.
pub(crate) fn sealed_run_of(recipe_text: &str) -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let (key, _) = crate::node::init(dir.path()).unwrap();
    let (log, _) = EventLog::open(dir.path(), key.clone(), crate::log::LogOptions::default()).unwrap();
    let (out, recipe, plan) = write_run(dir.path(), recipe_text);
    let first = log.append(AppendRequest::new("run.started", "run-1", json!({"run_id": "run-1"}))).unwrap().seq;
    let last = log.append(AppendRequest::new("run.finished", "run-1", json!({"run_id": "run-1"}))).unwrap().seq;
    let base = dir.path().join("base.bin");
    std::fs::write(&base, b"base model weights").unwrap();
    let facts = RunFacts {
        run_id: "run-1".into(),
        recipe: NamedBytes { name: "recipe.yaml".into(), bytes: std::fs::read(&recipe).unwrap() },
        plan: Some(NamedBytes { name: "plan.json".into(), bytes: std::fs::read(&plan).unwrap() }),
        output_dir: out.clone(),
        base_model: vec![NamedFile { name: "model.safetensors".into(), path: base }],
        base_model_uri: Some("hf://example/tiny".into()),
        base_model_annotations: Some(json!({"hf_commit": "c".repeat(40)})),
        dataset: Some(statement::ResourceDescriptor {
            name: Some("dataset".into()),
            digest: Some(Digests::of_bytes(b"dataset manifest").to_set()),
            ..Default::default()
        }),
        source: Some(SourceRef {
            repository: "git+https://example.invalid/mindxtrain".into(),
            commit: "ab".repeat(20),
        }),
        eval_json: Some(out.join("eval.json")),
        hardware: json!({"accelerator": "cpu"}),
        energy: crate::energy::Energy::unmeasured("a fake run"),
        started: SystemTime::UNIX_EPOCH + Duration::from_secs(1_795_000_000),
        finished: SystemTime::UNIX_EPOCH + Duration::from_secs(1_795_000_600),
        events: EventRange { first, last },
    };
    let sealed = seal(&log, &key, dir.path(), &facts, HashOptions { progress: false, ..Default::default() }).unwrap();
    Fixture { dir, log, key, sealed }
}

#[test]
fn sealing_signs_every_file_and_records_the_digest() {
    let f = sealed_run();
    let s = &f.sealed;
    // The file on disk is the canonical envelope, named by its BLAKE3.
    assert_eq!(std::fs::read(&s.path).unwrap(), s.bytes);
    assert_eq!(s.path, manifest_path(f.node(), &s.digests.blake3));
    let payload = s.envelope.verify(&f.key.verifying_key()).unwrap();
    let st = parse_statement(&payload).unwrap();
    let names: Vec<&str> = st.subject.iter().map(|x| x.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "adapter/adapter_config.json",
            "adapter/adapter_model.safetensors",
            "checkpoints/step-00000010/adapter_config.json",
            "eval.json"
        ]
    );
    let weights = std::fs::read(f.out().join("adapter/adapter_model.safetensors")).unwrap();
    assert_eq!(st.subject[1].digest, Digests::of_bytes(&weights).to_set());
    let recipe = &st.predicate.build_definition.external_parameters.recipe;
    assert_eq!(recipe.digest, Digests::of_bytes(RECIPE.as_bytes()).to_set());
    assert!(recipe.content.get("meta").is_some(), "parsed recipe: {}", recipe.content);
    let plan = st.predicate.build_definition.internal_parameters.plan.as_ref().unwrap();
    assert_eq!(plan.content["attention"], "sdpa");
    let deps = &st.predicate.build_definition.resolved_dependencies;
    assert_eq!(deps.len(), 3);
    // What is known of the base beyond its files (its hub commit) travels on its descriptor.
    assert_eq!(deps[0].annotations.as_ref().unwrap()["hf_commit"], "c".repeat(40));
    assert_eq!(deps[2].digest.as_ref().unwrap().other["gitCommit"], "ab".repeat(20));
    let eval = st.eval().unwrap();
    assert_eq!(eval.annotations.as_ref().unwrap()["summary"], json!({"loss": 1.25, "accuracy": 0.5}));
    assert_eq!(st.predicate.run_details.metadata.started_on, "2026-11-18T11:06:40Z");
    // The log has manifest.sealed and the anchoring request, in that order.
    let ev = f.log.get(s.seq).unwrap();
    assert_eq!(ev.envelope.kind, KIND_SEALED);
    assert_eq!(ev.envelope.data["blake3"], hex::encode(s.digests.blake3));
    let req = f.log.get(s.seq + 1).unwrap();
    assert_eq!(
        (req.envelope.kind.as_str(), req.envelope.subject.clone()),
        ("anchor.requested", hex::encode(s.digests.blake3))
    );
    let pending = crate::anchor::state_of_log(&f.log).unwrap().items;
    assert!(pending.iter().any(|i| i.digest == s.digests.blake3 && i.label == "manifest"));
}

#[test]
fn bad_facts_are_refused_with_reasons() {
    let f = sealed_run();
    let base = RunFacts {
        run_id: "run-2".into(),
        recipe: NamedBytes { name: "r.yaml".into(), bytes: b"meta: {}\n".to_vec() },
        plan: None,
        output_dir: f.out(),
        base_model: vec![],
        base_model_uri: None,
        base_model_annotations: None,
        dataset: None,
        source: None,
        eval_json: None,
        hardware: json!(null),
        energy: crate::energy::Energy::unmeasured("a fake run"),
        started: SystemTime::UNIX_EPOCH,
        finished: SystemTime::UNIX_EPOCH,
        events: EventRange { first: 0, last: 1 },
    };
    let opts = HashOptions { progress: false, ..Default::default() };
    let err = seal(&f.log, &f.key, f.node(), &base, opts).unwrap_err();
    assert!(err.to_string().contains("recipe"), "{err}");
    let bad_id = RunFacts { run_id: "../x".into(), ..base.clone() };
    assert!(seal(&f.log, &f.key, f.node(), &bad_id, opts).unwrap_err().to_string().contains("run id"));
    let bad_range = RunFacts { events: EventRange { first: 0, last: 10_000 }, ..base.clone() };
    assert!(seal(&f.log, &f.key, f.node(), &bad_range, opts).unwrap_err().to_string().contains("event range"));
    let empty = tempfile::tempdir().unwrap();
    let no_files = RunFacts {
        output_dir: empty.path().to_path_buf(),
        recipe: NamedBytes { name: "r.yaml".into(), bytes: RECIPE.as_bytes().to_vec() },
        ..base
    };
    assert!(seal(&f.log, &f.key, f.node(), &no_files, opts).unwrap_err().to_string().contains("no files"));
}

#[test]
fn receipt_include_decides_what_the_statement_carries() {
    let all = sealed_run();
    let st = &all.sealed.statement;
    let items = st.predicate.run_details.mindxtrain_receipt.as_ref().unwrap();
    assert!(items.omitted.is_empty() && items.include.len() == 9, "{items:?}");
    for item in ReceiptItem::all() {
        assert!(st.carries(item), "by default the manifest carries {item:?}");
    }
    let meta = st.predicate.build_definition.external_parameters.meta.as_ref().unwrap();
    assert_eq!((meta.license.as_str(), meta.project.as_str()), ("apache-2.0", "mindxtrain-smoke"));
    assert_eq!(st.predicate.run_details.builder.version["mindxtrain-trainer"], mindxtrain_trainer::VERSION);
    let energy = st.predicate.run_details.mindxtrain_energy.as_ref().unwrap();
    assert_eq!((energy.kwh, energy.reason.as_deref()), (None, Some("a fake run")));

    let f = sealed_run_of(&recipe_hash_only());
    let st = &f.sealed.statement;
    let items = st.predicate.run_details.mindxtrain_receipt.as_ref().unwrap();
    assert_eq!(items.include, [ReceiptItem::RecipeHash]);
    assert_eq!(items.omitted.len(), 8);
    for item in ReceiptItem::all().into_iter().filter(|i| *i != ReceiptItem::RecipeHash) {
        assert!(!st.carries(item), "include: [recipe_hash] carries {item:?}");
    }
    // Digests only: the dataset manifest, the plan and eval.json are still files of the run.
    let names: Vec<&str> = st.subject.iter().map(|x| x.name.as_str()).collect();
    assert_eq!(names, ["adapter/adapter_config.json", "adapter/adapter_model.safetensors", "eval.json"]);
    let deps: Vec<&str> =
        st.predicate.build_definition.resolved_dependencies.iter().filter_map(|d| d.name.as_deref()).collect();
    assert_eq!(deps, ["base/model.safetensors"], "no dataset digest, no source");
    assert_eq!(
        st.predicate.build_definition.external_parameters.recipe.digest,
        Digests::of_bytes(recipe_hash_only().as_bytes()).to_set()
    );
    // The statement's JSON has none of the extension fields it was not asked for.
    let json = serde_json::to_value(st).unwrap();
    let details = json["predicate"]["runDetails"].as_object().unwrap();
    for absent in ["mindxtrain_hardware", "mindxtrain_log", "mindxtrain_energy"] {
        assert!(!details.contains_key(absent), "{absent} in {details:?}");
    }
    assert_eq!(details["builder"]["version"], json!({}));
    assert!(json["predicate"]["buildDefinition"]["internalParameters"].as_object().unwrap().is_empty());
    // Nor does manifest.sealed name the run's events (the receipt carries that event).
    let ev = f.log.get(f.sealed.seq).unwrap();
    assert!(ev.envelope.data.get("first_seq").is_none() && ev.envelope.data.get("blake3").is_some());
}
