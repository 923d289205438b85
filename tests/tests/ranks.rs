//! Runs on several ranks through the `mindxtrain` binary, every rank a real process talking over
//! the CPU collective (TCP on loopback): 2 and 3 ranks end on the bytes of one process at the
//! same global batch, ZeRO-1/2/3 on the bytes of unsharded data parallel, a killed rank ends the
//! run with a clear error within the collective timeout, a run resumes at another world size, and
//! two "nodes" meet through `--rdzv`, and GRPO/GSPO/KTO refuse a distributed launch.
//!
//! Bitwise with one process holds when each rank computes one batch per step: the collective sums
//! in rank order, `((g0 + g1) + g2)`, which is the order one process accumulates them in. A rank
//! that accumulates several batches first (`g0 + g2` on rank 0 of 2) reassociates the sum: the
//! weights then differ from one process in the last bits and drift apart as training goes on.

use mindxtrain_tests::micro::{self, Node, ok_json, s};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

const STEPS: u64 = 12;

/// The micro recipe with 1 row per device, `accum` batches accumulated per rank (the global batch
/// is `accum × world size`), small gradient buckets (several per step) and `sharding`.
fn recipe(name: &str, sharding: &str, steps: u64, accum: u64) -> String {
    let text = micro::recipe(name, 5, micro::FULL, steps, "")
        .replace("    per_device: 2\n    grad_accum: 2", &format!("    per_device: 1\n    grad_accum: {accum}"))
        .replace(
            "  precision: fp32\n",
            &format!("  precision: fp32\n  distributed:\n    sharding: {sharding}\n    bucket_mb: 0.01\n    timeout_seconds: 20\n"),
        );
    assert!(text.contains("per_device: 1") && text.contains("sharding:"), "the micro recipe changed shape");
    text
}

/// A run long enough that a test sees it between a checkpoint (every 10 steps) and its end on a
/// loaded machine: at 12 steps the window after step 10 was two fast steps, and CI missed it.
const RESUME_STEPS: u64 = 60;

/// The final files of a finished run (names and digests), from `train --json`.
fn files(v: &Value) -> Value {
    files_after(v, STEPS)
}

fn files_after(v: &Value, steps: u64) -> Value {
    assert_eq!(v["steps"], steps, "{v}");
    v["files"].clone()
}

/// The digests of a finished run's weight files (runs of different recipes: `config.json` is
/// the same, the recipe is not in `final/`, but compare only what training produced).
fn weights(v: &Value) -> Vec<Value> {
    weights_after(v, STEPS)
}

fn weights_after(v: &Value, steps: u64) -> Vec<Value> {
    files_after(v, steps)
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["path"].as_str().unwrap().ends_with(".safetensors"))
        .map(|f| f["blake3"].clone())
        .collect()
}

fn train(node: &Node, recipe: &Path, out: &Path, extra: &[&str]) -> Value {
    let mut args = vec!["train", s(recipe), "--out", s(out), "--eval-prompts", "1"];
    args.extend_from_slice(extra);
    ok_json(&node.run(&args))
}

fn write(node: &Node, name: &str, sharding: &str, steps: u64, accum: u64) -> PathBuf {
    node.recipe(name, &recipe(name, sharding, steps, accum))
}

#[test]
fn two_and_three_ranks_end_on_the_bytes_of_one_process() {
    let node = Node::new();
    // Global batches of 2 and 3 rows: one process accumulates them, each rank computes one.
    let per_rank = write(&node, "dp", "none", STEPS, 1);
    let two_rows = write(&node, "dp2", "none", STEPS, 2);
    let three_rows = write(&node, "dp3", "none", STEPS, 3);
    let one2 = train(&node, &two_rows, &node.path("one2"), &[]);
    let one3 = train(&node, &three_rows, &node.path("one3"), &[]);
    let two = train(&node, &per_rank, &node.path("two"), &["--nproc-per-node", "2"]);
    let three = train(&node, &per_rank, &node.path("three"), &["--nproc-per-node", "3"]);
    assert_eq!(weights(&one2), weights(&two), "2 ranks differ from one process");
    assert_eq!(weights(&one3), weights(&three), "3 ranks differ from one process");
    // One rank through the distributed path is the one-process path.
    let one_rank = train(&node, &two_rows, &node.path("one-rank"), &["--collective", "tcp", "--nproc-per-node", "1"]);
    assert_eq!(files(&one_rank), files(&one2), "one rank differs from one process");

    // The plan and the run record the layout: world size, global batch, the collective stage.
    let plan: Value = serde_json::from_slice(&std::fs::read(node.path("three/plan.json")).unwrap()).unwrap();
    let p = &plan["parallel"];
    assert_eq!(
        (p["world_size"].as_u64(), p["global_batch"].as_u64(), p["grad_accum"].as_u64()),
        (Some(3), Some(3), Some(1))
    );
    assert_eq!(p["backend"], "tcp", "{p}");
    assert!(p["collective"]["candidates"].as_array().is_some_and(|c| !c.is_empty()), "{p}");
    let started = node.events("run.started");
    // One run.started per run: rank 0 alone writes the run's events.
    assert_eq!(started.len(), 5);
    let run_id = three["run_id"].as_str().unwrap();
    let ev = started.iter().find(|e| e["data"]["run_id"] == run_id).expect("the 3-rank run's run.started");
    let layout = &ev["data"]["parallel"];
    assert_eq!((layout["world_size"].as_u64(), layout["global_batch"].as_u64()), (Some(3), Some(3)), "{layout}");
    assert_eq!(layout["topology"]["ranks"].as_array().map(Vec::len), Some(3), "{layout}");

    // The manifest records world size, topology and the collective settings.
    let m = ok_json(&node.run(&["manifest", "show", three["manifest"]["file"].as_str().unwrap()]));
    let text = m.to_string();
    assert!(text.contains("\"world_size\":3") && text.contains("topology"), "{m}");
}

#[test]
fn zero_1_2_3_end_on_the_bytes_of_unsharded_data_parallel() {
    let node = Node::new();
    let mut runs = Vec::new();
    for sharding in ["none", "zero1", "zero2", "zero3"] {
        // Three batches per rank: the reduction overlaps the backward of the last one.
        let r = write(&node, &format!("z-{sharding}"), sharding, STEPS, 3);
        let v = train(&node, &r, &node.path(&format!("out-{sharding}")), &["--nproc-per-node", "2"]);
        runs.push((sharding, weights(&v)));
    }
    // Different recipes (the sharding is in the bytes), the same weights.
    for (sharding, w) in &runs[1..] {
        assert_eq!(w, &runs[0].1, "{sharding} differs from unsharded data parallel");
    }
}

/// The rank processes the launcher `pid` started (its children).
fn children(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    if let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) {
        for t in tasks.flatten() {
            let list = std::fs::read_to_string(t.path().join("children")).unwrap_or_default();
            out.extend(list.split_whitespace().filter_map(|p| p.parse::<u32>().ok()));
        }
    }
    out.sort_unstable();
    out
}

/// Starts `train` in the background; waits until `ranks` rank processes run and a checkpoint is
/// published. Returns the launcher and its ranks' pids.
fn start_and_wait(node: &Node, recipe: &Path, out: &Path, extra: &[&str], ranks: usize) -> (Child, Vec<u32>) {
    let mut args = vec!["--json", "train", s(recipe), "--out", s(out), "--eval-prompts", "1"];
    args.extend_from_slice(extra);
    let mut child =
        mindxtrain_tests::mindxtrain(&node.dir, &args).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        if Instant::now() > deadline || child.try_wait().ok().flatten().is_some() {
            let _ = child.kill();
            let o = child.wait_with_output().unwrap();
            panic!("no checkpoint within 120 s, or the run ended: {}", String::from_utf8_lossy(&o.stderr));
        }
        let pids = children(child.id());
        if pids.len() == ranks && out.join("checkpoints/latest").exists() {
            return (child, pids);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn kill(pid: u32) {
    let o = std::process::Command::new("kill").args(["-9", &pid.to_string()]).output().unwrap();
    assert!(o.status.success(), "kill -9 {pid}");
}

#[test]
fn a_killed_rank_ends_the_run_with_a_clear_error_within_the_timeout() {
    let node = Node::new();
    let r = write(&node, "kill", "zero2", 100_000, 2);
    let out = node.path("killed");
    let (child, ranks) = start_and_wait(&node, &r, &out, &["--nproc-per-node", "2"], 2);
    let killed_at = Instant::now();
    kill(ranks[1]);
    let o = child.wait_with_output().unwrap();
    let took = killed_at.elapsed();
    assert!(!o.status.success(), "the run succeeded with a rank killed");
    // Within the collective timeout (20 s in the recipe), not at it: the launcher saw the exit.
    assert!(took < Duration::from_secs(20), "the run took {took:?} to stop");
    let err = format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    assert!(err.contains("rank 1") && err.contains("SIGKILL"), "unclear error: {err}");
    // The run's failure is recorded, naming the rank.
    let failed = node.events("run.failed");
    assert_eq!(failed.len(), 1, "{failed:?}");
    assert!(failed[0]["data"]["error"].as_str().unwrap().contains("rank 1"), "{failed:?}");
    // No rank outlives the run.
    for pid in ranks {
        assert!(!Path::new(&format!("/proc/{pid}")).exists() || is_zombie(pid), "rank pid {pid} still runs");
    }
}

fn is_zombie(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| s.split_whitespace().nth(2) == Some("Z"))
}

#[test]
fn a_run_resumes_at_another_world_size_and_ends_on_the_same_bytes() {
    let node = Node::new();
    // A global batch of 2 rows: one process accumulating both, or two ranks of one.
    let whole = train(&node, &write(&node, "whole", "zero1", RESUME_STEPS, 2), &node.path("whole"), &[]);
    let r = write(&node, "resume", "zero1", RESUME_STEPS, 1);

    // Two ranks, the launcher killed after a checkpoint; its ranks stop when it goes away.
    let out = node.path("moved");
    let (child, ranks) = start_and_wait(&node, &r, &out, &["--nproc-per-node", "2"], 2);
    let mut child = child;
    child.kill().unwrap();
    child.wait().unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while ranks.iter().any(|p| Path::new(&format!("/proc/{p}")).exists() && !is_zombie(*p)) {
        assert!(Instant::now() < deadline, "ranks outlived their launcher by 30 s");
        std::thread::sleep(Duration::from_millis(50));
    }
    // Resumed in one process: the run's global batch (2 rows, in run.json), so it accumulates 2.
    let resumed = train(&node, &r, &out, &["--resume"]);
    let (resumed, whole) = (weights_after(&resumed, RESUME_STEPS), weights_after(&whole, RESUME_STEPS));
    assert_eq!(resumed, whole, "resumed in one process, the weights differ");
    // The plan of the old world size is kept beside the new one.
    let kept: Vec<_> = std::fs::read_dir(&out)
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("plan-"))
        .collect();
    assert_eq!(kept.len(), 1, "the 2-rank plan was not kept");
    let plan: Value = serde_json::from_slice(&std::fs::read(out.join("plan.json")).unwrap()).unwrap();
    assert!(plan["parallel"].is_null(), "the resumed run's plan is not a one-process plan: {plan}");
    let resumes = node.events("run.resumed");
    assert_eq!(resumes.len(), 1, "{resumes:?}");
}

#[test]
fn two_nodes_meet_through_rdzv_on_loopback() {
    let node = Node::new();
    let other = Node::new();
    let r = write(&node, "rdzv", "none", STEPS, 2);
    // Node 0 measures a plan before its rendezvous while node 1 already waits: on a loaded
    // 2-core machine (CI, every test binary's threads at once) that took past the 20 s the other
    // tests keep (a join timed out once). Joining is what this test checks, not how fast.
    let text = std::fs::read_to_string(&r).unwrap().replace("timeout_seconds: 20", "timeout_seconds: 90");
    std::fs::write(&r, text).unwrap();
    let reference = train(&node, &r, &node.path("ref"), &["--nproc-per-node", "2"]);
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let rdzv = format!("127.0.0.1:{port}");
    let common = ["--nnodes", "2", "--nproc-per-node", "1", "--rdzv", &rdzv];
    // Node 1 first: it waits for node 0's rendezvous.
    let mut args = vec!["--json", "train", s(&r), "--node-rank", "1"];
    args.extend_from_slice(&common);
    let follower = mindxtrain_tests::mindxtrain(&other.dir, &args).stdout(Stdio::piped()).spawn().unwrap();
    let mut extra = vec!["--node-rank", "0"];
    extra.extend_from_slice(&common);
    let leader = train(&node, &r, &node.path("two-nodes"), &extra);
    let f = follower.wait_with_output().unwrap();
    assert!(f.status.success(), "node 1: {}", String::from_utf8_lossy(&f.stdout));
    assert_eq!(files(&leader), files(&reference), "two nodes of one rank differ from one node of two");
    // Node 0 recorded the run; node 1 recorded nothing.
    assert!(other.events("run.").is_empty());
}

#[test]
fn rl_methods_refuse_a_distributed_launch_before_any_rank_starts() {
    let node = Node::new();
    let grpo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../recipes/tiny_cpu_grpo.yaml");
    let out = node.path("grpo");
    for extra in [&["--nproc-per-node", "2"][..], &["--collective", "tcp", "--nproc-per-node", "1"][..]] {
        let mut args = vec!["train", s(&grpo), "--out", s(&out)];
        args.extend_from_slice(extra);
        let o = node.run(&args);
        assert!(!o.status.success(), "{extra:?}: {}", String::from_utf8_lossy(&o.stdout));
        let v: Value = serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {o:?}"));
        let error = v["error"].as_str().unwrap_or_default();
        assert!(error.contains("train.method grpo trains in one process only"), "{extra:?}: {v}");
        assert!(!out.exists(), "{extra:?}: the refused run wrote {}", out.display());
    }
}
