//! The field contract, enforced: the registry covers the schema exactly, every proof it names
//! exists and holds, and docs/recipes.md shows the generated table.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use serde_json::Value;

use super::*;
use crate::events::{EventSink, TrainerEvent};
use crate::plan::{Choices, Plan};
use crate::run::{Quiet, RunSpec};

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Leaves of the schema: every field that is not a section of fields.
fn schema_leaves() -> BTreeSet<String> {
    let all = schema();
    all.iter()
        .filter(|(_, shape)| *shape != "section" && !shape.starts_with("mapping with `kind`"))
        .map(|(path, _)| path.clone())
        .collect()
}

#[test]
fn maximal_writes_every_declared_field() {
    let read: BTreeSet<String> = schema().into_keys().collect();
    let unwritten: Vec<String> = declared().into_iter().filter(|d| !read.contains(d)).collect();
    assert!(unwritten.is_empty(), "contract/maximal.yaml does not write {unwritten:?}: add them");
}

#[test]
fn every_schema_field_has_a_contract_and_every_contract_a_field() {
    let leaves = schema_leaves();
    let listed: Vec<&str> = fields().iter().map(|f| f.path).collect();
    let mut seen = BTreeSet::new();
    for p in &listed {
        assert!(seen.insert(*p), "{p} is listed twice in the field contract");
    }
    let unlisted: Vec<&String> = leaves.iter().filter(|l| !seen.contains(l.as_str())).collect();
    assert!(unlisted.is_empty(), "fields without a contract (add them to contract/fields.rs): {unlisted:?}");
    let unknown: Vec<&&str> = listed.iter().filter(|p| !leaves.contains(**p)).collect();
    assert!(unknown.is_empty(), "contracts for fields the schema does not have: {unknown:?}");
}

#[test]
fn every_field_is_proven_carried_out_refused_or_switched_off() {
    let all = fields();
    for f in &all {
        let proven = !f.test.is_empty() || f.differs.is_some();
        match (proven, f.refused.is_empty(), f.inert_unless) {
            (true, _, None) | (false, false, None) => {}
            (false, true, Some(switch)) => {
                let s = all.iter().find(|g| g.path == switch);
                assert!(
                    s.is_some_and(|s| !s.refused.is_empty()),
                    "{}: its switch {switch} must be a field whose turning on is refused",
                    f.path
                );
            }
            _ => panic!("{}: give a test or a differs patch, refusals, or the refused switch it waits on", f.path),
        }
        if f.does.is_empty() {
            assert!(!proven && !f.refused.is_empty(), "{}: a field that does something says what", f.path);
        }
    }
}

#[test]
fn every_refused_value_is_refused_by_the_check_at_its_field() {
    for f in fields() {
        // `train.method[qlora].bits` is written `train.method.bits`.
        let written = match (f.path.split_once('['), f.path.split_once(']')) {
            (Some((at, _)), Some((_, rest))) => format!("{at}{rest}"),
            _ => f.path.to_owned(),
        };
        for r in f.refused {
            let mut recipe = base_recipe();
            merge_patch(&mut recipe, &serde_json::from_str(r.patch).unwrap_or_else(|e| panic!("{}: {e}", r.patch)));
            let errors = match Recipe::check_str(&recipe.to_string(), "contract.json") {
                Ok(_) => panic!("{} = {}: the check accepts it", f.path, r.value),
                Err(e) => e,
            };
            assert!(
                errors.iter().any(|e| {
                    let at = e.path() == written || e.path().starts_with(&format!("{written}["));
                    at && e.message().contains(r.says)
                }),
                "{} = {}: no error at {written} saying {:?}; got:\n{errors}",
                f.path,
                r.value,
                r.says
            );
        }
    }
}

/// Every `#[test]` function name in the workspace's Rust sources.
fn workspace_tests() -> BTreeSet<String> {
    fn walk(dir: &Path, out: &mut BTreeSet<String>) {
        let Ok(entries) = std::fs::read_dir(dir) else { return };
        for e in entries.flatten() {
            let path = e.path();
            let name = e.file_name().to_string_lossy().into_owned();
            if path.is_dir() && !name.starts_with('.') && name != "target" && name != "node_modules" {
                walk(&path, out);
            } else if name.ends_with(".rs")
                && let Ok(text) = std::fs::read_to_string(&path)
            {
                let mut test_attr = false;
                for line in text.lines().map(str::trim) {
                    if line.starts_with("#[test]") || line.starts_with("#[tokio::test") {
                        test_attr = true;
                    } else if test_attr && let Some(rest) = line.strip_prefix("fn ").or(line.strip_prefix("async fn "))
                    {
                        out.insert(rest.split('(').next().unwrap_or_default().to_owned());
                        test_attr = false;
                    }
                }
            }
        }
    }
    let mut out = BTreeSet::new();
    for crate_dir in ["trainer", "node", "kernels", "chain", "x402", "tests"] {
        walk(&repo_root().join(crate_dir), &mut out);
    }
    out
}

#[test]
fn every_named_test_exists() {
    let tests = workspace_tests();
    let missing: Vec<(&str, &str)> =
        fields().iter().filter(|f| !f.test.is_empty() && !tests.contains(f.test)).map(|f| (f.path, f.test)).collect();
    assert!(missing.is_empty(), "contracts naming tests that do not exist: {missing:?}");
}

#[test]
fn docs_recipes_md_holds_the_generated_table() {
    let path = repo_root().join("docs/recipes.md");
    let text = std::fs::read_to_string(&path).unwrap();
    let (begin, end) = ("<!-- contract:begin -->\n", "<!-- contract:end -->");
    let table = markdown();
    let (Some(a), Some(b)) = (text.find(begin), text.find(end)) else {
        panic!("docs/recipes.md lacks the {begin:?} … {end:?} markers around the field table");
    };
    let shown = &text[a + begin.len()..b];
    if shown != table {
        if std::env::var_os("MINDXTRAIN_BLESS").is_some() {
            let updated = format!("{}{table}{}", &text[..a + begin.len()], &text[b..]);
            std::fs::write(&path, updated).unwrap();
            return;
        }
        panic!("docs/recipes.md's field table is not the generated one: rerun with MINDXTRAIN_BLESS=1");
    }
}

// ---- the differential runs ----

/// A micro LoRA run on the CPU: every training field's `differs` patch applies to this.
const TRAINING_BASE: &str = r#"
meta: {project: contract, run_name: contract, seed: 5}
hardware: {name: cpu, gpus: 0}
model:
  name: mindxtrain/contract-micro
  family: qwen3
  tokenizer: byte
  dtype: fp32
  random_init: true
  config: {hidden_size: 32, num_layers: 1, num_heads: 2, num_kv_heads: 1, head_dim: 16,
           intermediate_size: 64, vocab_size: 512, max_position_embeddings: 160, tie_word_embeddings: true}
data:
  source: generated
  format: instruction
  generator: {kind: tasks, seed: 5, count: 64}
  seq_len: 128
train:
  method: {kind: lora, r: 8, alpha: 16}
  optimizer: {lr: 0.01, weight_decay: 0.1}
  schedule: {kind: cosine, warmup_ratio: 0.25}
  budget: {max_steps: 4}
  batch: {per_device: 4}
  precision: fp32
  log_every_steps: 1
eval:
  holdout: {fraction: 0.1, max_samples: 4}
serve: {max_model_len: 128}
"#;

/// A JSONL file with repeated examples, beside the recipe, for the fields that need files.
const DUPLICATES: &str = "dup.jsonl";

struct Events(Vec<TrainerEvent>);

impl EventSink for Events {
    type Error = std::convert::Infallible;
    fn emit(&mut self, event: TrainerEvent) -> Result<(), Self::Error> {
        self.0.push(event);
        Ok(())
    }
}

/// What a run ended with, free of clocks and ids: every file it left (path and contents'
/// digest) and every event's kind with its deterministic members.
fn fingerprint(patches: &[&str], dir: &Path, name: &str) -> BTreeMap<String, String> {
    let resolved = Recipe::from_str(TRAINING_BASE, "base.yaml").unwrap_or_else(|e| panic!("{e}")).recipe;
    let mut recipe = serde_json::to_value(&resolved).unwrap();
    for p in patches {
        merge_patch(&mut recipe, &serde_json::from_str(p).unwrap_or_else(|e| panic!("{p}: {e}")));
    }
    let loaded = Recipe::from_str(&recipe.to_string(), name).unwrap_or_else(|e| panic!("{patches:?}: {e}"));
    let plan = Plan::new(loaded.bytes_blake3, "cpu", Choices::unmeasured(1), vec![], 0, 0, false);
    let out = dir.join(name);
    let spec = RunSpec::new(loaded, dir, plan, &out);
    let mut events = Events(Vec::new());
    crate::run::train(&spec, &mut events, &mut Quiet).unwrap_or_else(|e| panic!("{patches:?}: {e}"));
    let mut print = BTreeMap::new();
    let mut stack = vec![out.clone()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            let rel = p.strip_prefix(&out).unwrap().display().to_string();
            if p.is_dir() {
                stack.push(p);
            } else if rel != "run.json" {
                print.insert(format!("file {rel}"), blake3::hash(&std::fs::read(&p).unwrap()).to_hex().to_string());
            }
        }
    }
    let volatile = ["run_id", "tokens_per_s", "elapsed_s", "seconds", "out_dir", "context", "time", "recipe_file"];
    for (i, e) in events.0.iter().enumerate() {
        let mut data = e.data.clone();
        if let Value::Object(m) = &mut data {
            m.retain(|k, _| !volatile.contains(&k.as_str()));
        }
        print.insert(format!("event {i:03} {}", e.kind), data.to_string());
    }
    print
}

#[test]
fn every_training_field_changes_the_run() {
    let dir = tempfile::tempdir().unwrap();
    // Twenty distinct examples, each written three times.
    let lines: String = (0..60)
        .map(|i| format!("{{\"instruction\":\"Add {} and 1\",\"output\":\"{}\"}}\n", i % 20, i % 20 + 1))
        .collect();
    std::fs::write(dir.path().join(DUPLICATES), lines).unwrap();
    // A template of the same turn markers, without ChatML's system turn and think block.
    let plain = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}\
                 {% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";
    std::fs::write(dir.path().join("plain.jinja"), plain).unwrap();
    let mut baselines: BTreeMap<&str, BTreeMap<String, String>> = BTreeMap::new();
    let mut same = Vec::new();
    for (i, f) in fields().into_iter().enumerate() {
        let Some((base, change)) = f.differs else { continue };
        let without = baselines.entry(base).or_insert_with(|| fingerprint(&[base], dir.path(), &format!("base-{i}")));
        let with = fingerprint(&[base, change], dir.path(), &format!("run-{i}"));
        if *without == with {
            same.push(f.path);
        }
    }
    assert!(same.is_empty(), "changing these fields changed nothing in the run: {same:?}");
}
