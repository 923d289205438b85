//! Receipts end to end, through the `mindxtrain` binary: seal a (fake) run, anchor it on a
//! real anvil, export the receipt, then verify it from a clean directory that has only
//! the receipt and the files — offline, online, and after every kind of tampering.

use mindxtrain_chain::anvil::{AnvilOptions, LocalAnvil};
use mindxtrain_tests::mindxtrain;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Output;

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

fn run(dir: &Path, args: &[&str]) -> Output {
    mindxtrain(dir, args).output().expect("run mindxtrain")
}

fn ok(o: Output) -> Output {
    assert!(
        o.status.success(),
        "stdout {}\nstderr {}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    o
}

fn json(o: &Output) -> Value {
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&o.stdout)))
}

/// A node with a sealed fake run, anchored on `anvil` when given. Returns the node dir.
struct Run {
    _tmp: tempfile::TempDir,
    node: PathBuf,
    out: PathBuf,
    recipe: PathBuf,
    plan: PathBuf,
    public_key: String,
}

fn sealed_run(anvil: Option<&LocalAnvil>) -> Run {
    let tmp = tempfile::tempdir().unwrap();
    let node = tmp.path().join("node");
    let init = json(&ok(run(&node, &["init", "--json"])));
    let out = tmp.path().join("out");
    std::fs::create_dir_all(out.join("adapter")).unwrap();
    let mut weights = vec![0u8; 3 << 20];
    getrandom_fill(&mut weights);
    std::fs::write(out.join("adapter/adapter_model.safetensors"), &weights).unwrap();
    std::fs::write(out.join("eval.json"), br#"{"loss":0.75,"exact_match":0.5}"#).unwrap();
    let recipe = tmp.path().join("run.yaml");
    std::fs::copy(repo_root().join("recipes/tiny_cpu_lora.yaml"), &recipe).unwrap();
    let plan = tmp.path().join("plan.json");
    std::fs::write(&plan, br#"{"attention":"sdpa"}"#).unwrap();
    ok(run(
        &node,
        &["log", "append", "--kind", "run.started", "--subject", "run-7", "--data", r#"{"run_id":"run-7"}"#],
    ));
    ok(run(
        &node,
        &["log", "append", "--kind", "run.finished", "--subject", "run-7", "--data", r#"{"run_id":"run-7"}"#],
    ));
    let s = |p: &Path| p.to_str().unwrap().to_string();
    let sealed = json(&ok(run(
        &node,
        &[
            "manifest",
            "seal",
            "run-7",
            "--recipe",
            &s(&recipe),
            "--plan",
            &s(&plan),
            "--output-dir",
            &s(&out),
            "--eval",
            &s(&out.join("eval.json")),
            "--hardware",
            r#"{"accelerator":"cpu"}"#,
            "--json",
        ],
    )));
    assert_eq!(sealed["subjects"], 2);
    if let Some(anvil) = anvil {
        ok(run(&node, &["chain", "deploy", "--rpc-url", &anvil.endpoint()]));
        ok(run(&node, &["anchor", "--batch", "--rpc-url", &anvil.endpoint()]));
    }
    Run { node, out, recipe, plan, public_key: init["public_key"].as_str().unwrap().to_string(), _tmp: tmp }
}

fn getrandom_fill(buf: &mut [u8]) {
    let mut xof = blake3::Hasher::new().update(&std::process::id().to_le_bytes()).finalize_xof();
    xof.fill(buf);
}

/// A clean directory holding only the receipt and copies of the files.
struct Clean {
    dir: tempfile::TempDir,
}

impl Clean {
    fn from(r: &Run) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let receipt = dir.path().join("receipt.json");
        ok(run(&r.node, &["receipt", "export", "run-7", "--out", receipt.to_str().unwrap()]));
        std::fs::create_dir_all(dir.path().join("files/adapter")).unwrap();
        for f in ["adapter/adapter_model.safetensors", "eval.json"] {
            std::fs::copy(r.out.join(f), dir.path().join("files").join(f)).unwrap();
        }
        std::fs::copy(&r.recipe, dir.path().join("run.yaml")).unwrap();
        std::fs::copy(&r.plan, dir.path().join("plan.json")).unwrap();
        Self { dir }
    }

    fn path(&self, p: &str) -> PathBuf {
        self.dir.path().join(p)
    }

    /// `receipt verify` run inside the clean dir, with a node dir that does not exist.
    fn verify(&self, extra: &[&str]) -> Output {
        let mut args = vec![
            "receipt",
            "verify",
            "receipt.json",
            "--files",
            "files",
            "--config",
            "run.yaml",
            "--plan",
            "plan.json",
            "--json",
        ];
        args.extend_from_slice(extra);
        let o = mindxtrain(&self.path("no-node-here"), &args).current_dir(self.dir.path()).output().unwrap();
        assert!(!self.path("no-node-here").exists(), "verification must not create a node dir");
        o
    }

    fn edit_receipt(&self, f: impl FnOnce(&mut Value)) {
        let mut v: Value = serde_json::from_slice(&std::fs::read(self.path("receipt.json")).unwrap()).unwrap();
        f(&mut v);
        std::fs::write(self.path("receipt.json"), serde_json::to_vec_pretty(&v).unwrap()).unwrap();
    }
}

fn failed(o: &Output) -> Vec<(String, String)> {
    json(o)["report"]["checks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["status"] != "pass" && c["status"] != "skipped")
        .map(|c| (c["name"].as_str().unwrap().to_string(), c["status"].as_str().unwrap().to_string()))
        .collect()
}

fn flip_byte(path: &Path, at: usize) {
    let mut b = std::fs::read(path).unwrap();
    b[at] ^= 0x80;
    std::fs::write(path, b).unwrap();
}

#[test]
fn anchored_receipt_verifies_offline_and_online_from_a_clean_directory() {
    let anvil = LocalAnvil::start(AnvilOptions::default()).unwrap();
    let r = sealed_run(Some(&anvil));
    let clean = Clean::from(&r);
    let o = clean.verify(&["--trusted-key", &r.public_key]);
    assert_eq!(o.status.code(), Some(0), "{}", String::from_utf8_lossy(&o.stdout));
    let v = json(&o);
    assert_eq!(v["outcome"], "verified");
    assert_eq!(v["report"]["anchored"], true);
    let online = clean.verify(&["--trusted-key", &r.public_key, "--rpc-url", &anvil.endpoint()]);
    assert_eq!(online.status.code(), Some(0), "{}", String::from_utf8_lossy(&online.stdout));
    let line = json(&online)["report"]["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "anchor.on_chain")
        .cloned()
        .unwrap();
    assert_eq!(line["status"], "pass", "{line}");

    // Human output names every check.
    let human = mindxtrain(&clean.path("x"), &["receipt", "verify", "receipt.json", "--files", "files"])
        .current_dir(clean.dir.path())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&human.stdout);
    assert!(
        text.contains("PASS")
            && text.contains("file:adapter/adapter_model.safetensors")
            && text.ends_with("VERIFIED\n"),
        "{text}"
    );

    // A root that verifies offline but was never anchored: the chain says no.
    clean.edit_receipt(|v| {
        let d = v["anchor"]["digest"].as_str().unwrap().to_string();
        let other = "ab".repeat(32);
        let digests =
            [mindxtrain_chain::batch::parse_hash(&d).unwrap(), mindxtrain_chain::batch::parse_hash(&other).unwrap()];
        let batch = mindxtrain_chain::Batch::new(digests).unwrap();
        let a = &v["anchor"];
        let at = mindxtrain_chain::AnchorPlace {
            chain_id: a["chain_id"].as_u64().unwrap(),
            registry: a["registry"].as_str().unwrap().parse().unwrap(),
            tx: a["tx"].as_str().unwrap().parse().unwrap(),
            block: a["block"].as_u64().unwrap(),
            timestamp: a["timestamp"].as_u64().unwrap(),
        };
        v["anchor"] = batch.proof(&digests[0], &at).unwrap().to_json();
    });
    let offline = clean.verify(&[]);
    assert_eq!(offline.status.code(), Some(0), "the forged batch proof is arithmetically fine offline");
    let o = clean.verify(&["--rpc-url", &anvil.endpoint()]);
    assert_eq!(o.status.code(), Some(3));
    assert_eq!(failed(&o), [("anchor.on_chain".to_string(), "fail".to_string())]);

    // The chain unreachable: its own exit code.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let o = clean.verify(&["--rpc-url", &format!("http://127.0.0.1:{port}")]);
    assert_eq!(o.status.code(), Some(5), "{}", String::from_utf8_lossy(&o.stdout));
    assert_eq!(json(&o)["outcome"], "chain_unreachable");
}

#[test]
fn every_kind_of_tampering_is_caught_and_named_by_the_cli() {
    let r = sealed_run(None);
    let fresh = || Clean::from(&r);

    let c = fresh();
    let o = c.verify(&[]);
    assert_eq!(o.status.code(), Some(0), "{}", String::from_utf8_lossy(&o.stdout));
    assert_eq!(json(&o)["report"]["anchored"], false);

    type Tamper = Box<dyn Fn(&Clean)>;
    let cases: Vec<(&str, Tamper, Vec<&str>)> = vec![
        (
            "weight byte",
            Box::new(|c| flip_byte(&c.path("files/adapter/adapter_model.safetensors"), 1 << 20)),
            vec!["file:adapter/adapter_model.safetensors"],
        ),
        ("recipe", Box::new(|c| flip_byte(&c.path("run.yaml"), 3)), vec!["recipe"]),
        ("plan", Box::new(|c| flip_byte(&c.path("plan.json"), 3)), vec!["plan"]),
        ("eval", Box::new(|c| flip_byte(&c.path("files/eval.json"), 9)), vec!["file:eval.json"]),
        (
            "signature",
            Box::new(|c| {
                c.edit_receipt(|v| {
                    let s = v["manifest"]["signatures"][0]["sig"].as_str().unwrap();
                    let swapped = match s.strip_prefix('A') {
                        Some(rest) => format!("B{rest}"),
                        None => format!("A{}", &s[1..]),
                    };
                    v["manifest"]["signatures"][0]["sig"] = Value::String(swapped);
                })
            }),
            // The digest covers the envelope's bytes, signature included, so the event's
            // record of it no longer matches either.
            vec!["manifest.signature", "event.manifest_digest"],
        ),
        (
            "proof hash",
            Box::new(|c| {
                c.edit_receipt(|v| {
                    let h = v["inclusion"][0].as_str().unwrap();
                    let swapped = match h.strip_prefix('0') {
                        Some(rest) => format!("1{rest}"),
                        None => format!("0{}", &h[1..]),
                    };
                    v["inclusion"][0] = Value::String(swapped);
                })
            }),
            vec!["log.inclusion"],
        ),
    ];
    for (what, tamper, names) in cases {
        let c = fresh();
        tamper(&c);
        let o = c.verify(&[]);
        assert_eq!(o.status.code(), Some(3), "{what}: {}", String::from_utf8_lossy(&o.stdout));
        let got: Vec<String> = failed(&o).into_iter().map(|(n, _)| n).collect();
        assert_eq!(got, names, "{what}");
    }

    // A different signing key pinned.
    let c = fresh();
    let o = c.verify(&["--trusted-key", &"11".repeat(32)]);
    assert_eq!(o.status.code(), Some(3));
    assert!(failed(&o).iter().any(|(n, _)| n == "manifest.signature"));

    // A missing file is missing input (4), a missing receipt too; a bad key is an input error.
    let c = fresh();
    std::fs::remove_file(c.path("files/eval.json")).unwrap();
    let o = c.verify(&[]);
    assert_eq!(o.status.code(), Some(4), "{}", String::from_utf8_lossy(&o.stdout));
    assert_eq!(failed(&o), [("file:eval.json".to_string(), "missing".to_string())]);
    std::fs::remove_file(c.path("receipt.json")).unwrap();
    assert_eq!(c.verify(&[]).status.code(), Some(4));
    let c = fresh();
    assert_eq!(c.verify(&["--trusted-key", "not-a-key"]).status.code(), Some(4));
    // Garbage instead of a receipt: tampered.
    std::fs::write(c.path("receipt.json"), b"{\"v\":1}").unwrap();
    assert_eq!(c.verify(&[]).status.code(), Some(3));
}

#[test]
fn the_seeds_form_checks_a_bare_manifest_against_its_recipe() {
    let r = sealed_run(None);
    let manifests: Vec<PathBuf> =
        std::fs::read_dir(r.node.join("manifests")).unwrap().map(|e| e.unwrap().path()).collect();
    assert_eq!(manifests.len(), 1);
    let m = manifests[0].to_str().unwrap();
    let o = run(&r.node, &["receipt", m, "--config", r.recipe.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", String::from_utf8_lossy(&o.stdout));
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(text.contains("PASS        recipe"), "{text}");
    let other = r.node.join("other.yaml");
    std::fs::write(&other, std::fs::read_to_string(&r.recipe).unwrap().replace("run_name", "run_name ")).unwrap();
    let o = run(&r.node, &["receipt", m, "--config", other.to_str().unwrap(), "--json"]);
    assert_eq!(o.status.code(), Some(3));
    assert_eq!(failed(&o), [("recipe".to_string(), "fail".to_string())]);
}

#[test]
fn the_independent_python_verifier_agrees() {
    let Some(py) = mindxtrain_tests::receipt_python(Path::new(env!("CARGO_TARGET_TMPDIR"))) else { return };
    let anvil = LocalAnvil::start(AnvilOptions::default()).unwrap();
    let r = sealed_run(Some(&anvil));
    let c = Clean::from(&r);
    let script = repo_root().join("tests/python/verify_receipt.py");
    let verify_py = |c: &Clean| {
        std::process::Command::new(&py)
            .arg(&script)
            .args([
                "receipt.json",
                "--files",
                "files",
                "--config",
                "run.yaml",
                "--plan",
                "plan.json",
                "--json",
                "--trusted-key",
                &r.public_key,
            ])
            .current_dir(c.dir.path())
            .output()
            .unwrap()
    };
    let o = verify_py(&c);
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    let py_report: Value = serde_json::from_slice(&o.stdout).unwrap();
    let rust_report = json(&c.verify(&[]));
    assert_eq!(py_report["manifest_blake3"], rust_report["report"]["manifest_blake3"]);
    let passed = |v: &Value| -> Vec<String> {
        v.as_array()
            .unwrap()
            .iter()
            .filter(|c| c["status"] == "pass")
            .map(|c| c["name"].as_str().unwrap().to_string())
            .collect()
    };
    // Every check the Python script passes, Rust passes too (Rust adds none beyond the chain).
    let (py_pass, rust_pass) = (passed(&py_report["checks"]), passed(&rust_report["report"]["checks"]));
    assert!(py_pass.contains(&"anchor.batch_proof".to_string()) && py_pass.len() >= 11, "{py_pass:?}");
    for name in &py_pass {
        assert!(rust_pass.contains(name), "{name} passes in Python only");
    }

    // The pinned key may be given as a node.pub file too; a file that holds no key is bad
    // input (4) that names the option, not a malformed bundle.
    let with_key = |key: &Path| {
        std::process::Command::new(&py)
            .arg(&script)
            .args(["receipt.json", "--files", "files", "--json", "--trusted-key"])
            .arg(key)
            .current_dir(c.dir.path())
            .output()
            .unwrap()
    };
    let o = with_key(&r.node.join("node.pub"));
    assert_eq!(o.status.code(), Some(0), "{}", String::from_utf8_lossy(&o.stderr));
    let junk = c.dir.path().join("not-a-key.txt");
    std::fs::write(&junk, "hello").unwrap();
    let o = with_key(&junk);
    assert_eq!(o.status.code(), Some(4));
    assert!(String::from_utf8_lossy(&o.stderr).contains("--trusted-key"), "{}", String::from_utf8_lossy(&o.stderr));

    flip_byte(&c.path("files/adapter/adapter_model.safetensors"), 77);
    let o = verify_py(&c);
    assert_eq!(o.status.code(), Some(3));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    let failed: Vec<&str> = v["checks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["status"] == "fail")
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(failed, ["file:adapter/adapter_model.safetensors"]);

    let c = Clean::from(&r);
    c.edit_receipt(|v| {
        let h = v["anchor"]["root"].as_str().unwrap();
        v["anchor"]["root"] = Value::String(format!("{}{}", if h.starts_with('f') { "e" } else { "f" }, &h[1..]));
    });
    let o = verify_py(&c);
    assert_eq!(o.status.code(), Some(3));
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("\"name\": \"anchor.batch_proof\", \"status\": \"fail\""),
        "{}",
        String::from_utf8_lossy(&o.stdout)
    );
}
