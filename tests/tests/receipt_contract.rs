//! The recipe's `receipt` and `meta` sections are carried out, through the binary on micro runs:
//! `receipt.include` decides what the sealed manifest (and so the receipt) carries, and both
//! verifiers pass a receipt that leaves items out, naming them; the sealed run's receipt is
//! written to `receipt.output` and never over another run's; `meta.license` reaches the manifest
//! and the model card in `final/` (a subject, parsed by `huggingface_hub.ModelCard`); the
//! energy is null with its reason on a machine without counters.

use mindxtrain_tests::micro::{self, FULL, Node, ok_json, s};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;

/// A full micro run of 20 steps with `receipt` (YAML lines under `receipt:`, if any) and
/// `meta` lines added.
fn write_recipe(node: &Node, name: &str, receipt: &str, meta: &str) -> PathBuf {
    let mut text = micro::recipe(name, 5, FULL, 20, "").replacen("meta:\n", &format!("meta:\n{meta}"), 1);
    if !receipt.is_empty() {
        text.push_str(&format!("receipt:\n{receipt}"));
    }
    node.recipe(name, &text)
}

/// Trains `recipe` into `out`; the command's JSON.
fn train(node: &Node, recipe: &Path, out: &Path) -> Value {
    ok_json(&node.run(&["train", s(recipe), "--out", s(out), "--eval-prompts", "2"]))
}

/// The sealed statement, decoded from the run's manifest file.
fn statement(node: &Node, run: &Value) -> Value {
    let shown = ok_json(&node.run(&["manifest", "show", run["manifest"]["file"].as_str().unwrap()]));
    shown["statement"].clone()
}

fn check<'a>(report: &'a Value, name: &str) -> &'a Value {
    report["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("{name}: {report}"))
}

const LEFT_OUT: [&str; 8] =
    ["dataset_hashes", "code_version", "hardware", "plan", "eval_report", "energy_kwh", "event_log", "checkpoints"];

#[test]
fn receipt_include_recipe_hash_only_seals_that_alone_and_both_verifiers_name_what_is_left_out() {
    let node = Node::new();
    let recipe = write_recipe(&node, "only_hash", "  include: [recipe_hash]\n", "");
    let out = node.path("only-hash");
    let run = train(&node, &recipe, &out);
    // Unset receipt.output: OUT/receipt.json, written when the run was sealed.
    let receipt = out.join("receipt.json");
    assert_eq!(run["outputs"]["receipt"], s(&receipt));
    let st = statement(&node, &run);
    let bd = &st["predicate"]["buildDefinition"];
    let rd = &st["predicate"]["runDetails"];
    assert_eq!(rd["mindxtrain_receipt"]["include"], serde_json::json!(["recipe_hash"]));
    assert_eq!(rd["mindxtrain_receipt"]["omitted"], serde_json::json!(LEFT_OUT));
    assert_eq!(bd["externalParameters"]["recipe"]["digest"]["blake3"], micro::b3(&recipe));
    let deps: Vec<&str> =
        bd["resolvedDependencies"].as_array().unwrap().iter().map(|d| d["name"].as_str().unwrap()).collect();
    assert!(!deps.contains(&"dataset"), "no dataset digest: {deps:?}");
    assert!(bd["internalParameters"].get("plan").is_none(), "no plan: {bd}");
    assert_eq!(rd["byproducts"], serde_json::json!([]), "no eval report");
    assert_eq!(rd["builder"]["version"], serde_json::json!({}), "no code version");
    for absent in ["mindxtrain_hardware", "mindxtrain_energy", "mindxtrain_log"] {
        assert!(rd.get(absent).is_none(), "{absent}: {rd}");
    }
    let subjects: Vec<&str> = st["subject"].as_array().unwrap().iter().map(|x| x["name"].as_str().unwrap()).collect();
    assert!(subjects.iter().all(|n| !n.starts_with("checkpoints/")), "no step checkpoint: {subjects:?}");
    assert!(subjects.contains(&"final/model.safetensors") && subjects.contains(&"eval.json"), "{subjects:?}");

    // The CLI's verifier passes it, naming what the recipe left out.
    let plan = out.join("plan.json");
    let v =
        node.run(&["receipt", "verify", s(&receipt), "--files", s(&out), "--config", s(&recipe), "--plan", s(&plan)]);
    let v: Value = serde_json::from_slice(&v.stdout).unwrap();
    assert_eq!(v["outcome"], "verified", "{v}");
    let include = check(&v["report"], "manifest.include");
    assert_eq!(include["status"], "pass");
    for item in LEFT_OUT {
        assert!(include["detail"].as_str().unwrap().contains(item), "{item}: {include}");
    }
    assert_eq!(check(&v["report"], "manifest.log_checkpoint")["status"], "skipped");
    assert_eq!(check(&v["report"], "plan")["status"], "skipped");
    assert_eq!(check(&v["report"], "file:final/README.md")["status"], "pass");

    // So does the independent one.
    let Some(py) = mindxtrain_tests::receipt_python(Path::new(env!("CARGO_TARGET_TMPDIR"))) else { return };
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("python/verify_receipt.py");
    let o = Command::new(py)
        .arg(script)
        .args([s(&receipt), "--files", s(&out), "--config", s(&recipe), "--plan", s(&plan), "--json"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(0), "{stdout}{}", String::from_utf8_lossy(&o.stderr));
    let py: Value = serde_json::from_slice(&o.stdout).unwrap();
    let include = check(&py, "manifest.include");
    assert_eq!(include["status"], "pass");
    for item in LEFT_OUT {
        assert!(include["detail"].as_str().unwrap().contains(item), "{item}: {include}");
    }
    assert_eq!(check(&py, "manifest.log_checkpoint")["status"], "skipped");
}

#[test]
fn receipt_output_is_where_the_sealed_run_writes_its_receipt_and_never_over_another_runs() {
    let node = Node::new();
    let recipe = write_recipe(&node, "placed", "  output: sub/r.json\n", "");
    let out = node.path("placed");
    let run = train(&node, &recipe, &out);
    let receipt = out.join("sub/r.json");
    assert_eq!(run["outputs"]["receipt"], s(&receipt));
    assert!(!out.join("receipt.json").exists(), "not at the default place");
    let bundle: Value = serde_json::from_slice(&std::fs::read(&receipt).unwrap()).unwrap();
    assert_eq!(bundle["anchor"], Value::Null, "sealed, not anchored yet");
    let v = ok_json(&node.run(&["receipt", "verify", s(&receipt), "--files", s(&out), "--config", s(&recipe)]));
    assert_eq!(v["report"]["run_id"], run["run_id"]);
    // It is the receipt `receipt export` builds for the run (its checkpoint is signed anew).
    let exported = ok_json(&node.run(&["receipt", "export", run["run_id"].as_str().unwrap()]));
    assert_eq!(exported["manifest"], bundle["manifest"]);
    assert_eq!(exported["event"], bundle["event"]);

    // Another run told to put its receipt there is refused before it trains, naming the owner.
    let absolute = format!("  output: {}\n", s(&receipt));
    let second = write_recipe(&node, "second", &absolute, "");
    let o = node.run(&["train", s(&second), "--out", s(&node.path("second")), "--eval-prompts", "2"]);
    assert_eq!(o.status.code(), Some(4), "{}", String::from_utf8_lossy(&o.stderr));
    let e: Value = serde_json::from_slice(&o.stdout).unwrap_or(Value::Null);
    let text = format!("{e}{}", String::from_utf8_lossy(&o.stderr));
    assert!(text.contains(&format!("the receipt of run {}", run["run_id"].as_str().unwrap())), "{text}");
    assert!(!node.path("second").join("final").exists(), "nothing trained");
    assert_eq!(serde_json::from_slice::<Value>(&std::fs::read(&receipt).unwrap()).unwrap(), bundle);
}

#[test]
fn meta_license_reaches_the_manifest_and_the_model_card_and_energy_is_null_with_its_reason() {
    let node = Node::new();
    let meta = "  license: mit\n  description: A micro model for the receipt contract.\n";
    let recipe = write_recipe(&node, "licensed", "", meta);
    let out = node.path("licensed");
    let run = train(&node, &recipe, &out);
    let st = statement(&node, &run);
    let meta = &st["predicate"]["buildDefinition"]["externalParameters"]["meta"];
    assert_eq!(meta["license"], "mit", "{meta}");
    assert_eq!(meta["description"], "A micro model for the receipt contract.");
    assert_eq!(meta["project"], "mindxtrain-tests");

    // The card is a file of the sealed run.
    let card_path = out.join("final/README.md");
    let card = std::fs::read_to_string(&card_path).unwrap();
    let subject = st["subject"].as_array().unwrap().iter().find(|x| x["name"] == "final/README.md").cloned();
    assert_eq!(subject.map(|x| x["digest"]["blake3"].clone()), Some(Value::from(micro::b3(&card_path))));
    assert!(card.contains("license: \"mit\"\n") && card.contains("A micro model for the receipt contract."), "{card}");
    assert!(card.contains("library_name: \"transformers\"\n") && card.contains("| held-out loss |"), "{card}");
    // The model's export carries it.
    let hf = node.path("hf");
    ok_json(&node.run(&["export", s(&recipe), "--checkpoint", s(&out.join("final")), "--out", s(&hf)]));
    assert_eq!(std::fs::read_to_string(hf.join("README.md")).unwrap(), card);

    // Energy: this machine has no counter for a CPU run, so the manifest says null and why.
    let energy = &st["predicate"]["runDetails"]["mindxtrain_energy"];
    assert_eq!(energy, &run["energy"], "the manifest holds what the run measured");
    if !Path::new("/sys/class/powercap").exists() {
        assert_eq!(energy["kwh"], Value::Null, "{energy}");
        let reason = energy["reason"].as_str().unwrap_or_default();
        assert!(reason.contains("CPU packages not counted: no RAPL counters"), "{energy}");
    } else {
        assert!(energy["kwh"].is_f64() || energy["reason"].is_string(), "a number or a reason: {energy}");
    }

    // huggingface_hub reads the card's metadata as the hub would.
    let Some(py) = mindxtrain_tests::torch_python() else { return };
    let code = "import json, sys\nfrom huggingface_hub import ModelCard\nc = ModelCard.load(sys.argv[1])\n\
                print(json.dumps({'data': c.data.to_dict(), 'text': c.text}))";
    let o = Command::new(py).args(["-c", code, s(&card_path)]).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let parsed: Value = serde_json::from_slice(&o.stdout).unwrap();
    let data = &parsed["data"];
    assert_eq!(data["license"], "mit", "{data}");
    assert_eq!(data["library_name"], "transformers");
    assert_eq!(data["tags"], serde_json::json!(["mindxtrain", "full", "qwen3"]));
    assert_eq!(data["mindxtrain"]["project"], "mindxtrain-tests");
    assert!(data.get("base_model").is_none(), "trained from random weights: no base to name: {data}");
    assert!(parsed["text"].as_str().unwrap().contains("## Verify"), "{parsed}");
}
