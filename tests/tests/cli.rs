//! The `mindxtrain` binary as a user drives it: exit codes, messages, JSON.

use mindxtrain_tests::mindxtrain;
use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Output, Stdio};

fn run(dir: &Path, args: &[&str]) -> Output {
    mindxtrain(dir, args).output().expect("run mindxtrain")
}

fn json(o: &Output) -> Value {
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&o.stdout)))
}

fn repo_root() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

#[test]
fn init_append_show_verify_and_tamper() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("node");
    let o = run(&dir, &["init", "--json"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let mode = std::fs::metadata(dir.join("node.key")).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    assert_token_made_quietly(&dir, &o);
    let again = run(&dir, &["init"]);
    assert_eq!(again.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&again.stderr).contains("already a node directory"));

    for i in 0..5 {
        let data = format!("{{\"i\":{i}}}");
        let o = run(&dir, &["log", "append", "--kind", "note.added", "--subject", "ops", "--data", &data, "--json"]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        assert_eq!(json(&o)["seq"], i + 1);
    }
    // Idempotent id and optimistic concurrency from the command line.
    let a = json(&run(&dir, &["log", "append", "--kind", "x.y", "--id", "k1", "--json"]));
    let b = json(&run(&dir, &["log", "append", "--kind", "x.y", "--id", "k1", "--json"]));
    assert_eq!(a["seq"], b["seq"]);
    assert_eq!(b["duplicate"], true);
    let stale = run(&dir, &["log", "append", "--kind", "x.y", "--expected-seq", "3"]);
    assert_eq!(stale.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&stale.stderr).contains("expected to append at seq 3"));

    let shown = json(&run(&dir, &["log", "show", "--json", "--kind", "note.added"]));
    assert_eq!(shown.as_array().unwrap().len(), 5);
    let v = run(&dir, &["log", "verify", "--json"]);
    assert_eq!(v.status.code(), Some(0));
    assert_eq!(json(&v)["ok"], true);

    // Proofs and checkpoint are self-consistent JSON.
    let p = json(&run(&dir, &["log", "proof", "2", "--json"]));
    assert_eq!(p["tree_size"], 7);
    let c = json(&run(&dir, &["log", "consistency", "3", "--json"]));
    assert_eq!(c["new_size"], 7);
    let cp = json(&run(&dir, &["log", "checkpoint", "--json"]));
    assert_eq!(cp["root"], p["root"]);
    assert!(cp["note"].as_str().unwrap().contains("\n7\n"));
    let bad = run(&dir, &["log", "proof", "99"]);
    assert_eq!(bad.status.code(), Some(4));

    // One flipped byte: verify fails with exit 3 and names the place.
    let seg = std::fs::read_dir(dir.join("log"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "seg"))
        .unwrap();
    let mut bytes = std::fs::read(&seg).unwrap();
    // In the middle of the records, not in the zeros pre-written after them.
    let records_end = bytes.iter().rposition(|&b| b != 0).unwrap() + 1;
    let pos = records_end / 2;
    bytes[pos] ^= 0x20;
    std::fs::write(&seg, &bytes).unwrap();
    let v = run(&dir, &["log", "verify"]);
    assert_eq!(v.status.code(), Some(3));
    let text = String::from_utf8_lossy(&v.stdout);
    assert!(text.contains("FAILED") && text.contains("offset") && text.contains("seq"), "{text}");
    // The damaged log refuses to open for writing and loses nothing.
    let w = run(&dir, &["log", "append", "--kind", "x.z"]);
    assert_eq!(w.status.code(), Some(1));
    assert_eq!(std::fs::read(&seg).unwrap(), bytes);
}

/// `init` made the operator API token: `api.token`, mode 0600, whose secret it does not print.
fn assert_token_made_quietly(dir: &Path, init: &Output) {
    let path = dir.join("api.token");
    let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "api.token mode {mode:o}");
    let token = std::fs::read_to_string(&path).unwrap();
    let token = token.trim();
    assert!(token.len() >= 32, "api.token holds {} bytes", token.len());
    // Neither the whole token nor its random part appears in what init wrote.
    let secret = token.rsplit('.').next().unwrap();
    for shown in [&init.stdout, &init.stderr] {
        let shown = String::from_utf8_lossy(shown);
        assert!(!shown.contains(token) && !shown.contains(secret), "init printed the token: {shown}");
    }
}

#[test]
fn init_makes_the_api_token_without_printing_it() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("node");
    let o = run(&dir, &["init"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_token_made_quietly(&dir, &o);
}

#[test]
fn commands_on_a_missing_node_say_what_to_do() {
    let tmp = tempfile::tempdir().unwrap();
    let o = run(&tmp.path().join("nope"), &["log", "verify"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("mindxtrain init"));
}

#[test]
fn recipes_check_register_and_report_locations() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("node");
    assert!(run(&dir, &["init"]).status.success());
    let all: Vec<String> = std::fs::read_dir(repo_root().join("recipes"))
        .unwrap()
        .map(|e| e.unwrap().path().display().to_string())
        .filter(|p| p.ends_with(".yaml"))
        .collect();
    assert!(all.len() >= 14);
    let mut args = vec!["recipe", "check", "--json"];
    args.extend(all.iter().map(String::as_str));
    let o = run(&dir, &args);
    // The seed recipes ask for what this build does not carry out yet (trainer/tests/recipes_dir.rs
    // lists each refusal): they are refused by name; the tiny ones run.
    assert_eq!(o.status.code(), Some(4), "{}", String::from_utf8_lossy(&o.stdout));
    for f in json(&o)["files"].as_array().unwrap() {
        let name = f["file"].as_str().unwrap();
        if name.contains("/tiny_") {
            assert_eq!(f["ok"], true, "{f}");
        } else if f["ok"] == false {
            assert!(!f["errors"].as_array().unwrap().is_empty(), "{f}");
        }
    }

    let good = repo_root().join("recipes/tiny_cpu_lora.yaml");
    let src = std::fs::read_to_string(&good).unwrap();
    let bad_path = tmp.path().join("bad.yaml");
    std::fs::write(&bad_path, src.replacen("autotune:\n", "autotune:\n  policy: jit\n", 1)).unwrap();
    let o = run(&dir, &["recipe", "check", bad_path.to_str().unwrap(), "--json"]);
    assert_eq!(o.status.code(), Some(4));
    let err = &json(&o)["files"][0]["errors"][0];
    assert_eq!(err["path"], "autotune.policy");
    assert!(err["line"].as_u64().unwrap() > 1);
    assert!(err["display"].as_str().unwrap().starts_with(&format!("{}:", bad_path.display())));

    let r1 = json(&run(&dir, &["recipe", "register", good.to_str().unwrap(), "--json"]));
    let r2 = json(&run(&dir, &["recipe", "register", good.to_str().unwrap(), "--json"]));
    assert_eq!(r1["files"][0]["seq"], r2["files"][0]["seq"]);
    assert_eq!(r2["files"][0]["already"], true);
    let reg = run(&dir, &["recipe", "register", bad_path.to_str().unwrap()]);
    assert_eq!(reg.status.code(), Some(4));
    let shown = json(&run(&dir, &["log", "show", "--json", "--kind", "recipe.registered"]));
    assert_eq!(shown.as_array().unwrap().len(), 1, "invalid recipe must not be recorded");
    assert_eq!(shown[0]["data"]["blake3"], r1["files"][0]["blake3"]);

    let show = json(&run(&dir, &["recipe", "show", good.to_str().unwrap(), "--json"]));
    assert_eq!(show["recipe"]["autotune"]["policy"], "aot_only");
}

#[test]
fn tail_follow_sees_appends_from_another_process() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("node");
    assert!(run(&dir, &["init"]).status.success());
    let mut follower =
        mindxtrain(&dir, &["log", "tail", "-n", "0", "--follow", "--json"]).stdout(Stdio::piped()).spawn().unwrap();
    let mut lines = BufReader::new(follower.stdout.take().unwrap()).lines();
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert!(run(&dir, &["log", "append", "--kind", "live.event", "--subject", "s"]).status.success());
    let line = lines.next().unwrap().unwrap();
    follower.kill().unwrap();
    let _ = follower.wait();
    let ev: Value = serde_json::from_str(&line).unwrap();
    assert_eq!(ev["kind"], "live.event");
    assert_eq!(ev["seq"], 1);
}

#[test]
fn demo_runs_and_verifies_its_own_log() {
    let tmp = tempfile::tempdir().unwrap();
    let keep = tmp.path().join("demo");
    let o = mindxtrain(tmp.path(), &["demo", "--json", "--keep", keep.to_str().unwrap()]).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let s = json(&o);
    assert_eq!(s["log_verified"], true);
    // Every shipped recipe is either registered or refused naming the fields this build
    // does not carry out; the CPU recipes the demo and the tests run are all registered.
    let refused = s["recipes_refused"].as_array().unwrap();
    let shipped = std::fs::read_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/../recipes")).unwrap().count();
    assert_eq!(s["recipes_registered"].as_u64().unwrap() as usize + refused.len(), shipped, "{s}");
    assert!(refused.iter().all(|r| !r["fields"].as_array().unwrap().is_empty()), "{s}");
    assert!(refused.iter().all(|r| !r["recipe"].as_str().unwrap().starts_with("tiny_cpu")), "{s}");
    // It learns: the levels stated in docs/benchmarks.md. A run is bitwise deterministic for
    // its plan, but the plan is measured on this machine, and another micro-batch split sums
    // gradients in another order: the pretrained base has landed at 94-97% of 64 held-out
    // prompts, the LoRA run at 87-94%; these bounds leave room for that and nothing more.
    let phases = s["training"].as_array().unwrap();
    let em = |i: usize| phases[i]["exact_match"].as_f64().unwrap();
    let loss = |i: usize| phases[i]["final_loss"].as_f64().unwrap();
    // LoRA's loss is over answer tokens only, most of them in tool calls the base never saw.
    assert!(loss(0) < 0.5 && loss(1) < 2.0, "{phases:?}");
    assert!(em(0) >= 0.8, "pretrained exact match {}", em(0));
    assert!(em(1) >= 0.75, "LoRA exact match {} after pretraining's {}", em(1), em(0));
    // Before and after tuning, family by family, on the same held-out prompts: the LoRA run
    // evaluates its base at step 0 (the adapter starts at zero). The base never saw a tool
    // call (its corpus leaves those families out); tuning teaches them and keeps the rest.
    let before = phases[1]["exact_match_before"].as_f64().expect("the LoRA phase reports its base");
    assert!(em(1) > before + 0.2, "LoRA exact match {} against its base's {before}", em(1));
    let families = phases[1]["exact_match_by_family"].as_object().expect("exact match by family");
    assert_eq!(families.len(), 7, "{families:?}");
    let count = |f: &Value, when: &str, what: &str| f[when][what].as_u64().unwrap();
    let total = |when: &str| families.values().map(|f| count(f, when, "total")).sum::<u64>();
    let correct = |when: &str| families.values().map(|f| count(f, when, "correct")).sum::<u64>();
    assert_eq!((total("before"), total("after")), (64, 64), "every held-out prompt has a family: {families:?}");
    assert_eq!(correct("after") as f64 / 64.0, em(1), "{families:?}");
    assert_eq!(correct("before") as f64 / 64.0, before, "{families:?}");
    for tool in ["weather", "time", "news"] {
        let f = &families[tool];
        assert_eq!(count(f, "before", "correct"), 0, "{tool}: {f}");
        assert!(count(f, "after", "correct") * 2 > count(f, "after", "total"), "{tool}: {f}");
    }
    // The paid completion is a held-out question, answered right.
    assert_eq!(s["market"]["paid_call"]["question"], "Is 2026 even or odd?");
    assert_eq!(s["market"]["paid_call"]["answer"], "even", "{}", s["market"]["paid_call"]);
    // Every run is sealed; the manifests are anchored with the checkpoint, and the LoRA
    // run's receipt verifies offline (files, recipe, plan, signatures, proofs).
    for p in phases {
        assert_eq!(p["manifest"]["blake3"].as_str().map(str::len), Some(64), "{p}");
    }
    assert_eq!(s["anchor"]["items"], 3, "checkpoint + two manifests in one batch");
    assert_eq!(s["receipt"]["anchored"], true);
    assert_eq!(s["receipt"]["verified_on_chain"], true);
    assert!(s["receipt"]["files_checked"].as_u64().unwrap() >= 5, "{}", s["receipt"]);
    // The whole demo fits the budget the issue sets: under 10 minutes on 2 cores.
    let seconds = s["seconds"].as_f64().expect("the summary reports its total seconds");
    assert!(seconds > 0.0 && seconds < 600.0, "the demo took {seconds:.1}s, over 10 minutes");
    // The kept node audits clean with the CLI too.
    let v = run(&keep, &["log", "verify", "--json"]);
    assert_eq!(json(&v)["ok"], true);
}

/// Small promises of the docs and the help: `recipe show` prints a loadable recipe, `log
/// show --kind` takes a prefix as the API does, counts read right, and the `manifest seal`
/// example of `--help` works as written.
#[test]
fn what_the_docs_and_the_help_promise_holds() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("node");
    assert!(run(&dir, &["init"]).status.success());
    let v = run(&dir, &["log", "verify"]);
    assert!(
        String::from_utf8_lossy(&v.stdout).starts_with("1 event in 1 segment,"),
        "{}",
        String::from_utf8_lossy(&v.stdout)
    );

    let shown = run(&dir, &["recipe", "show", repo_root().join("recipes/tiny_cpu_lora.yaml").to_str().unwrap()]);
    assert!(shown.status.success());
    let resolved = tmp.path().join("resolved.json");
    std::fs::write(&resolved, &shown.stdout).unwrap();
    let checked = run(&dir, &["recipe", "check", resolved.to_str().unwrap()]);
    assert!(checked.status.success(), "recipe show's output is a recipe: {}", String::from_utf8_lossy(&checked.stdout));

    // The --help example, command by command, in a directory holding its files.
    let help = String::from_utf8_lossy(&run(&dir, &["manifest", "--help"]).stdout).into_owned();
    let example: Vec<&str> = help.lines().map(str::trim).filter(|l| l.starts_with("mindxtrain log append")).collect();
    let seal: Vec<&str> = help.lines().map(str::trim).filter(|l| l.starts_with("mindxtrain manifest seal")).collect();
    assert_eq!((example.len(), seal.len()), (1, 1), "{help}");
    let work = tmp.path().join("work");
    std::fs::create_dir_all(work.join("out")).unwrap();
    std::fs::copy(repo_root().join("recipes/tiny_cpu_lora.yaml"), work.join("run.yaml")).unwrap();
    std::fs::write(work.join("out/weights.bin"), b"weights").unwrap();
    for line in [example[0], seal[0]] {
        let o = Command::new("bash")
            .arg("-c")
            .arg(format!(
                "{} --node-dir {}",
                line.replacen("mindxtrain", mindxtrain_path().to_str().unwrap(), 1),
                dir.display()
            ))
            .current_dir(&work)
            .output()
            .unwrap();
        assert!(o.status.success(), "{line}: {}", String::from_utf8_lossy(&o.stderr));
    }

    // A kind prefix, as `GET /api/log?kind=` takes it.
    let prefixed = json(&run(&dir, &["--json", "log", "show", "--kind", "manifest."]));
    let kinds: Vec<&str> = prefixed.as_array().unwrap().iter().map(|e| e["kind"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["manifest.sealed"]);
    let exact = json(&run(&dir, &["--json", "log", "show", "--kind", "run.finished"]));
    assert_eq!(exact.as_array().unwrap().len(), 1);
}

fn mindxtrain_path() -> std::path::PathBuf {
    mindxtrain_tests::workspace_bin("mindxtrain")
}
