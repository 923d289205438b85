//! Sealing a fake run in a real node directory.

use super::*;
use crate::identity::Identity;
use crate::log::{AppendRequest, EventLog};
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

pub(crate) fn write_run(root: &Path) -> (std::path::PathBuf, std::path::PathBuf, std::path::PathBuf) {
    let out = root.join("run-out");
    std::fs::create_dir_all(out.join("adapter")).unwrap();
    let mut bytes = vec![0u8; (1 << 20) + 333];
    getrandom::fill(&mut bytes).unwrap();
    std::fs::write(out.join("adapter/adapter_model.safetensors"), &bytes).unwrap();
    std::fs::write(out.join("adapter/adapter_config.json"), br#"{"r":8}"#).unwrap();
    std::fs::write(out.join("eval.json"), br#"{"loss":1.25,"accuracy":0.5,"per_task":{"a":1}}"#).unwrap();
    let recipe = root.join("recipe.yaml");
    std::fs::write(&recipe, RECIPE).unwrap();
    let plan = root.join("plan.json");
    std::fs::write(&plan, br#"{"attention":"sdpa","gemm":{"tile":128}}"#).unwrap();
    (out, recipe, plan)
}

pub(crate) fn sealed_run() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let (key, _) = crate::node::init(dir.path()).unwrap();
    let (log, _) = EventLog::open(dir.path(), key.clone(), crate::log::LogOptions::default()).unwrap();
    let (out, recipe, plan) = write_run(dir.path());
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
    assert_eq!(names, ["adapter/adapter_config.json", "adapter/adapter_model.safetensors", "eval.json"]);
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
