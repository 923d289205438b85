//! A fine-tuning command line that never silently does the wrong thing, through the binary
//! on micro recipes: a run records the base it trained on and every later use of its adapter
//! (resume, eval, serve, export) takes that base or refuses another; a busy output directory
//! is refused; Ctrl-C checkpoints, records `run.cancelled` and prints the command that
//! resumes to the same bytes as an uninterrupted run; off a terminal, progress comes as
//! plain lines with a summary at the end; without a plan, one is measured and recorded.

use mindxtrain_tests::micro::{self, FULL, LORA, Node, b3, ok_json, s};
use mindxtrain_tests::{mindxtrain, workspace_bin};
use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

fn stderr(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn error_of(o: &std::process::Output) -> String {
    let v: Value = serde_json::from_slice(&o.stdout).unwrap_or(Value::Null);
    v["error"].as_str().map_or_else(|| stderr(o), str::to_string)
}

/// A full micro run (the base) trained into `out`.
fn train_base(node: &Node, name: &str, seed: u64, out: &Path) {
    let recipe = node.recipe(name, &micro::recipe(name, seed, FULL, 20, ""));
    ok_json(&node.run(&["train", s(&recipe), "--out", s(out), "--eval-prompts", "1"]));
}

#[test]
fn an_adapter_keeps_to_the_base_it_was_trained_on() {
    let node = Node::new();
    let (base, other) = (node.path("base"), node.path("other"));
    train_base(&node, "base", 5, &base);
    train_base(&node, "other", 6, &other);
    let lora = node.recipe("lora", &micro::recipe("lora", 5, LORA, 20, ""));
    let out = node.path("lora");

    // No base: refused before anything is written, naming both ways out.
    let o = node.run(&["train", s(&lora), "--out", s(&out)]);
    assert_eq!(o.status.code(), Some(4), "{}", stderr(&o));
    let e = error_of(&o);
    assert!(e.contains("--init-from") && e.contains("model.random_init: true"), "{e}");
    assert!(!out.exists(), "nothing written");
    // Saying so in the recipe is enough.
    let random = node.recipe("random", &micro::recipe("random", 5, LORA, 4, "  random_init: true\n"));
    let v = ok_json(&node.run(&["train", s(&random), "--out", s(&node.path("random")), "--eval-prompts", "1"]));
    assert_eq!(v["base"], serde_json::json!({"kind": "random_init", "seed": 5}));

    let v = ok_json(&node.run(&["train", s(&lora), "--out", s(&out), "--init-from", s(&base.join("final"))]));
    let base_dir = std::fs::canonicalize(base.join("final")).unwrap();
    let config_b3 = b3(&base_dir.join("config.json"));
    // The base by path and digests: in run.json, beside the adapter, in PEFT's config and
    // in the manifest.
    let run_json: Value = serde_json::from_slice(&std::fs::read(out.join("run.json")).unwrap()).unwrap();
    assert_eq!(run_json["base"]["kind"], "weights");
    assert_eq!(run_json["base"]["path"], s(&base_dir));
    let files = run_json["base"]["files"].as_array().unwrap();
    assert!(files.iter().any(|f| f["path"] == "config.json" && f["blake3"] == config_b3.as_str()), "{run_json}");
    let beside: Value = serde_json::from_slice(&std::fs::read(out.join("final/base_model.json")).unwrap()).unwrap();
    assert_eq!(beside, run_json["base"]);
    let peft: Value = serde_json::from_slice(&std::fs::read(out.join("final/adapter_config.json")).unwrap()).unwrap();
    assert_eq!(peft["base_model_name_or_path"], s(&base_dir));
    for f in ["tokenizer.json", "tokenizer_config.json"] {
        assert!(out.join("final").join(f).is_file(), "{f} beside the weights");
    }
    let receipt = node.path("lora.receipt.json");
    ok_json(&node.run(&["receipt", "export", v["run_id"].as_str().unwrap(), "--out", s(&receipt)]));
    let r: Value = serde_json::from_slice(&std::fs::read(&receipt).unwrap()).unwrap();
    let payload = String::from_utf8(base64_decode(r["manifest"]["payload"].as_str().unwrap())).unwrap();
    let statement: Value = serde_json::from_str(&payload).unwrap();
    let deps = statement["predicate"]["buildDefinition"]["resolvedDependencies"].as_array().unwrap();
    let dep = deps.iter().find(|d| d["name"] == "base/config.json").expect("the base in the manifest");
    assert_eq!(dep["digest"]["blake3"], config_b3.as_str());
    assert_eq!(dep["uri"], format!("file://{}", base_dir.display()));

    // eval: the recorded base by default, the same base given is fine, another one is refused.
    let final_dir = out.join("final");
    let recorded = ok_json(&node.run(&["eval", s(&lora), "--checkpoint", s(&final_dir), "--eval-prompts", "1"]));
    assert_eq!(recorded["base"], s(&base_dir));
    let given = ok_json(&node.run(&[
        "eval",
        s(&lora),
        "--checkpoint",
        s(&final_dir),
        "--init-from",
        s(&base.join("final")),
        "--eval-prompts",
        "1",
    ]));
    assert_eq!(given["loss"], recorded["loss"]);
    let other_final = other.join("final");
    let wrong = ["eval", s(&lora), "--checkpoint", s(&final_dir), "--base", s(&other_final)];
    let o = node.run(&[&wrong[..], &["--eval-prompts", "1"]].concat());
    assert_eq!(o.status.code(), Some(4), "{}", stderr(&o));
    let e = error_of(&o);
    assert!(e.contains("differs") && e.contains("--force-base"), "{e}");
    let forced = ok_json(&node.run(&[&wrong[..], &["--force-base", "--eval-prompts", "1"]].concat()));
    assert_ne!(forced["loss"], recorded["loss"], "another base, other losses");

    // serve and export refuse it the same way, before serving anything.
    let o = mindxtrain(&node.dir, &["serve", s(&lora), "--checkpoint", s(&final_dir), "--base"])
        .arg(other.join("final"))
        .args(["--free", "--listen", "127.0.0.1:0"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("differs"), "{}", stderr(&o));
    let hf = node.path("hf");
    let export = ["export", s(&lora), "--checkpoint", s(&final_dir), "--out", s(&hf)];
    let o = node.run(&export);
    assert_eq!(o.status.code(), Some(4), "an adapter needs --merge: {}", stderr(&o));
    let o = node.run(&[&export[..], &["--merge", "--base", s(&other_final)]].concat());
    assert_eq!(o.status.code(), Some(4), "{}", stderr(&o));
    let v = ok_json(&node.run(&[&export[..], &["--merge"]].concat()));
    let names: Vec<&str> = v["files"].as_array().unwrap().iter().map(|f| f["path"].as_str().unwrap()).collect();
    for f in ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "generation_config.json"] {
        assert!(names.contains(&f), "{f} in {names:?}");
    }
    // The run's model card comes along, now for merged full weights.
    let card = std::fs::read_to_string(hf.join("README.md")).unwrap();
    let own = std::fs::read_to_string(final_dir.join("README.md")).unwrap();
    assert!(own.contains("library_name: \"peft\"\n"), "{own}");
    assert!(card.contains("library_name: \"transformers\"\n") && card.contains("is merged into its base"), "{card}");
    // The merged weights are the base's plus the adapter: the exported model evaluates as
    // the adapter over its base does.
    let merged = ok_json(&node.run(&["eval", s(&lora), "--checkpoint", s(&hf), "--eval-prompts", "1"]));
    let (a, b) = (merged["loss"].as_f64().unwrap(), recorded["loss"].as_f64().unwrap());
    assert!((a - b).abs() < 1e-4, "merged {a} vs adapter {b}");
}

fn base64_decode(text: &str) -> Vec<u8> {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = Vec::new();
    let (mut acc, mut bits) = (0u32, 0);
    for c in text.bytes().filter(|&c| c != b'=') {
        acc = (acc << 6) | ALPHABET.iter().position(|&a| a == c).expect("base64") as u32;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
        }
    }
    out
}

/// SIGINT during `train` stops after a step with a checkpoint and `run.cancelled`, exits
/// 130 and prints the command that resumes it; that command (and nothing else: the plan
/// and base are the run's own) ends on the bytes of a run that was never interrupted.
#[test]
fn sigint_during_train_resumes_to_the_bytes_of_an_uninterrupted_run() {
    const STEPS: u64 = 400;
    let node = Node::new();
    let (base, other) = (node.path("base"), node.path("other"));
    train_base(&node, "base", 5, &base);
    train_base(&node, "other", 6, &other);
    let lora = node.recipe("lora", &micro::recipe("lora", 5, LORA, STEPS, ""));
    let plan = node.path("lora.plan.json");
    ok_json(&node.run(&["bench", s(&lora), "--out", s(&plan)]));
    let init = base.join("final");
    let common = |out: &Path| {
        vec![
            "train".to_string(),
            s(&lora).into(),
            "--plan".into(),
            s(&plan).into(),
            "--out".into(),
            s(out).into(),
            "--init-from".into(),
            s(&init).into(),
            "--eval-prompts".into(),
            "2".into(),
        ]
    };
    let whole = node.path("whole");
    let args = common(&whole);
    let a = ok_json(&node.run(&args.iter().map(String::as_str).collect::<Vec<_>>()));

    let cut = node.path("cut");
    let mut child = mindxtrain(&node.dir, &["--json"])
        .args(common(&cut))
        .args(["--progress-every", "1"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Off a terminal every step is a line: interrupt once a few have gone by.
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let mut seen = Vec::new();
    for line in lines.by_ref() {
        let line = line.unwrap();
        let started = line.starts_with("step 5/");
        seen.push(line);
        if started {
            let sent = Command::new("kill").args(["-INT", &child.id().to_string()]).status().unwrap();
            assert!(sent.success());
            break;
        }
    }
    seen.extend(lines.map(Result::unwrap));
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(130), "{seen:#?}");
    let told: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(told["cancelled"], true);
    let step = told["step"].as_u64().unwrap();
    assert!((5..STEPS).contains(&step), "{told}");
    let text = seen.join("\n");
    assert!(text.contains(&format!("SIGINT: stopped after step {step}")), "{text}");
    let command = told["resume"]["command"].as_str().unwrap();
    assert!(text.contains(&format!("resume with:\n  {command}")), "{text}");
    let latest = std::fs::read_to_string(cut.join("checkpoints/latest")).unwrap();
    assert_eq!(latest.trim(), format!("step-{step:08}"));
    let cancelled = node.events("run.cancelled");
    assert_eq!(cancelled.len(), 1);
    assert_eq!(cancelled[0]["data"]["step"], step);

    // Another base is refused on resume; the recorded one is used without being named.
    let o = node.run(&["train", s(&lora), "--out", s(&cut), "--resume", "--init-from", s(&other.join("final"))]);
    assert_eq!(o.status.code(), Some(4), "{}", stderr(&o));
    assert!(error_of(&o).contains("differs"), "{}", error_of(&o));

    let argv: Vec<String> =
        told["resume"]["argv"].as_array().unwrap().iter().map(|a| a.as_str().unwrap().into()).collect();
    assert_eq!(argv[0], "mindxtrain");
    assert!(!argv.contains(&"--plan".to_string()) && !argv.contains(&"--init-from".to_string()), "{argv:?}");
    let resumed = Command::new(workspace_bin("mindxtrain")).arg("--json").args(&argv[1..]).output().unwrap();
    let c = ok_json(&resumed);
    assert_eq!(c["start_step"], step);
    assert_eq!(c["files"], a["files"], "interrupted at step {step} and resumed, the final weights differ");
    let resumed = node.events("run.resumed");
    assert_eq!(resumed.len(), 1);
    assert_eq!(resumed[0]["data"]["context"]["plan"]["source"], "kept");
}

#[test]
fn a_busy_output_is_refused_and_nothing_sealed_is_lost() {
    let node = Node::new();
    let recipe = node.recipe("micro", &micro::recipe("micro", 5, FULL, 10, ""));
    let work = node.path("work");
    std::fs::create_dir_all(&work).unwrap();
    let train = |extra: &[&str]| {
        let mut c = mindxtrain(&node.dir, &["--json", "train", s(&recipe), "--eval-prompts", "1"]);
        c.args(extra).current_dir(&work).output().unwrap()
    };
    // The default directory is runs/<run_name>.
    let first = ok_json(&train(&[]));
    let out = work.join("runs/micro");
    let run_json = std::fs::read(out.join("run.json")).unwrap();
    let receipt = node.path("first.receipt.json");
    ok_json(&node.run(&["receipt", "export", first["run_id"].as_str().unwrap(), "--out", s(&receipt)]));
    let verify = || node.run(&["receipt", "verify", s(&receipt), "--files", s(&out), "--config", s(&recipe)]);
    ok_json(&verify());

    let o = train(&[]);
    assert_eq!(o.status.code(), Some(4));
    let e = error_of(&o);
    assert!(e.contains("not empty") && e.contains(first["run_id"].as_str().unwrap()), "{e}");
    assert!(e.contains("--resume") && e.contains("--force"), "{e}");
    assert_eq!(std::fs::read(out.join("run.json")).unwrap(), run_json, "the sealed run is untouched");
    ok_json(&verify());

    // --force replaces the run's files, and only a run's.
    std::fs::write(out.join("notes.txt"), "mine").unwrap();
    let o = train(&["--force"]);
    assert_eq!(o.status.code(), Some(4));
    assert!(error_of(&o).contains("notes.txt"), "{}", error_of(&o));
    ok_json(&verify());
    std::fs::remove_file(out.join("notes.txt")).unwrap();
    let second = ok_json(&train(&["--force"]));
    assert_ne!(second["run_id"], first["run_id"]);

    // eval --out keeps an existing file unless --force.
    let report = node.path("eval.json");
    std::fs::write(&report, "kept").unwrap();
    let final_dir = out.join("final");
    let eval = ["eval", s(&recipe), "--checkpoint", s(&final_dir), "--out", s(&report), "--eval-prompts", "1"];
    let o = node.run(&eval);
    assert_eq!(o.status.code(), Some(4));
    assert!(error_of(&o).contains("--force"), "{}", error_of(&o));
    assert_eq!(std::fs::read_to_string(&report).unwrap(), "kept");
    ok_json(&node.run(&[&eval[..], &["--force"]].concat()));
    let written: Value = serde_json::from_slice(&std::fs::read(&report).unwrap()).unwrap();
    assert!(written["loss"].is_number(), "{written}");
}

/// The TFRecord records of a TensorBoard event file, each checked against its masked CRCs.
fn tf_records(path: &Path) -> Vec<Vec<u8>> {
    let bytes = std::fs::read(path).unwrap();
    let mask = |b: &[u8]| mindxtrain_node::training::tensorboard::masked_crc(b);
    let (mut at, mut records) = (0, Vec::new());
    while at < bytes.len() {
        let len = u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap()) as usize;
        assert_eq!(u32::from_le_bytes(bytes[at + 8..at + 12].try_into().unwrap()), mask(&bytes[at..at + 8]));
        let data = bytes[at + 12..at + 12 + len].to_vec();
        assert_eq!(u32::from_le_bytes(bytes[at + 12 + len..at + 16 + len].try_into().unwrap()), mask(&data));
        records.push(data);
        at += 16 + len;
    }
    records
}

#[test]
fn off_a_terminal_train_prints_progress_lines_a_summary_and_tensorboard_curves() {
    let node = Node::new();
    let recipe = node.recipe("micro", &micro::recipe("micro", 5, FULL, 20, ""));
    let out = node.path("run");
    let o = mindxtrain(&node.dir, &["train", s(&recipe), "--out", s(&out), "--progress-every", "5", "--tensorboard"])
        .arg("--eval-prompts")
        .arg("1")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let progress: Vec<String> = stderr(&o).lines().filter(|l| l.starts_with("step ")).map(str::to_string).collect();
    assert_eq!(progress.len(), 4, "{progress:#?}");
    for (line, step) in progress.iter().zip([5, 10, 15, 20]) {
        let words: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(words[..2], ["step", &format!("{step}/20")], "{line}");
        assert_eq!((words[2], words[4], words[7], words[8]), ("loss", "lr", "tok/s", "eta"), "{line}");
        assert!(words[3].parse::<f64>().is_ok() && words[5].parse::<f64>().is_ok(), "{line}");
    }
    let summary = String::from_utf8_lossy(&o.stdout);
    for want in
        ["loss      training", "held-out", "0 malformed lines skipped", "292 training examples", "base      random"]
    {
        assert!(summary.contains(want), "{want:?} in\n{summary}");
    }
    for place in ["final", "eval.json", "run.json", "plan.json", "tensorboard"] {
        assert!(summary.contains(s(&out.join(place))), "{place} in\n{summary}");
    }
    assert!(summary.contains("/manifests/") && summary.contains("mindxtrain receipt export run-"), "{summary}");

    let tb: Vec<PathBuf> = std::fs::read_dir(out.join("tensorboard")).unwrap().map(|e| e.unwrap().path()).collect();
    assert_eq!(tb.len(), 1);
    assert!(tb[0].file_name().unwrap().to_str().unwrap().starts_with("events.out.tfevents."));
    let records = tf_records(&tb[0]);
    assert!(records[0].windows(13).any(|w| w == b"brain.Event:2"));
    let tagged = |tag: &[u8]| records.iter().filter(|r| r.windows(tag.len()).any(|w| w == tag)).count();
    assert_eq!(tagged(b"train/loss"), 20, "one loss per step");
    assert_eq!(tagged(b"eval/loss"), 1, "the final evaluation");
}

#[test]
fn without_a_plan_train_measures_one_and_records_how() {
    let node = Node::new();
    let recipe = node.recipe("micro", &micro::recipe("micro", 5, FULL, 10, ""));
    let out = node.path("probed");
    let v = ok_json(&node.run(&["train", s(&recipe), "--out", s(&out), "--eval-prompts", "1"]));
    let kept = out.join("plan.json");
    assert_eq!(v["plan"]["how"]["source"], "probed");
    assert_eq!(v["plan"]["file"], s(&kept));
    assert_eq!(v["plan"]["blake3"], b3(&kept).as_str());
    let emitted = node.events("plan.emitted");
    assert_eq!(emitted.len(), 1);
    assert_eq!(emitted[0]["data"]["file"], s(&kept));
    let started = node.events("run.started");
    assert_eq!(started[0]["data"]["context"]["plan"]["source"], "probed");
    assert_eq!(started[0]["data"]["context"]["origin"]["kind"], "cli");
    // The receipt checks against the plan the run kept.
    let receipt = node.path("receipt.json");
    ok_json(&node.run(&["receipt", "export", v["run_id"].as_str().unwrap(), "--out", s(&receipt)]));
    ok_json(&node.run(&[
        "receipt",
        "verify",
        s(&receipt),
        "--files",
        s(&out),
        "--config",
        s(&recipe),
        "--plan",
        s(&kept),
    ]));

    // A plan given is kept as it is, and recorded as given.
    let given = node.path("given");
    let v = ok_json(&node.run(&["train", s(&recipe), "--plan", s(&kept), "--out", s(&given), "--eval-prompts", "1"]));
    assert_eq!(v["plan"]["how"]["source"], "given");
    assert_eq!(std::fs::read(given.join("plan.json")).unwrap(), std::fs::read(&kept).unwrap());
    assert_eq!(node.events("plan.emitted").len(), 1, "nothing measured");
}
