//! The Coach UI in a real browser: headless Debian Chromium driven by playwright-core
//! (`tests/js/bin/coach.mjs`) against a node serving on loopback. It loads the UI, sees a
//! recipe error on its line, launches a tiny run, watches the loss chart grow from live
//! events, verifies the sealed run's receipt check by check and finds the log's hash chain
//! intact. Screenshots go to `artifacts/coach/`.
//!
//! Needs `/usr/bin/chromium` (scripts/setup-browser installs it). Without it the test says so
//! and passes, unless MINDXTRAIN_REQUIRE_BROWSER is set (CI sets it): then it fails.

use std::path::{Path, PathBuf};

use mindxtrain_tests::mindxtrain;
use mindxtrain_tests::served::Server;
use mindxtrain_tests::x402_env::{ensure_js, js_dir};
use serde_json::Value;

const CHROMIUM: &str = "/usr/bin/chromium";

#[test]
fn the_coach_launches_a_run_charts_it_live_and_verifies_its_receipt_in_chromium() {
    if !Path::new(CHROMIUM).exists() {
        assert!(
            std::env::var_os("MINDXTRAIN_REQUIRE_BROWSER").is_none(),
            "{CHROMIUM} is missing: run scripts/setup-browser"
        );
        eprintln!("skipping: {CHROMIUM} is missing (scripts/setup-browser installs it)");
        return;
    }
    ensure_js().expect("tests/js packages installed");
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("node");
    assert!(mindxtrain(&dir, &["init"]).status().unwrap().success());
    let node = Server::run(&dir, &["serve"]);
    let (url, token) = (node.url.clone(), Server::token(&dir));
    let shots = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../artifacts/coach");

    let out = std::process::Command::new("node")
        .current_dir(js_dir())
        .arg("bin/coach.mjs")
        .args([url.as_str(), token.trim()])
        .arg(&shots)
        .output()
        .unwrap();
    drop(node);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "the browser run failed:\n{stdout}\n{stderr}");
    let seen: Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();

    assert!(seen["loaded"].as_str().unwrap().ends_with("/ui/"), "/ redirects to the UI: {seen}");
    let error = seen["recipe_error"].as_str().unwrap();
    assert!(error.contains("train.method.r"), "the error names the field: {error}");
    let good = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../recipes/tiny_cpu_lora.yaml")).unwrap();
    let line = good.lines().position(|l| l.trim() == "r: 8").unwrap() + 1;
    assert_eq!(seen["error_line"], line.to_string(), "shown on its line");
    assert_eq!(seen["phase_while_training"], "training", "the chart grew while the run trained: {seen}");
    assert!(seen["points"].as_u64() > seen["points_while_training"].as_u64(), "and kept growing: {seen}");
    assert!(seen["receipt_outcome"].as_str().unwrap().contains("verified"), "{seen}");
    let checks = seen["checks"].as_array().unwrap();
    let status = |name: &str| checks.iter().find(|c| c["name"] == name).map(|c| c["status"].as_str().unwrap());
    for name in ["manifest.signature", "event.signature", "log.inclusion", "recipe", "plan"] {
        assert_eq!(status(name), Some("pass"), "{name}: {seen}");
    }
    let files: Vec<_> = checks.iter().filter(|c| c["name"].as_str().unwrap().starts_with("file:")).collect();
    assert!(files.len() >= 3 && files.iter().all(|c| c["status"] == "pass"), "each file checked: {seen}");
    assert!(checks.iter().all(|c| c["status"] != "fail"), "{seen}");
    assert!(seen["checkpoints"].as_u64() >= Some(1));
    assert!(seen["chain"].as_str().unwrap().starts_with("intact"), "{seen}");
    for shot in ["recipes", "run-live", "run-sealed", "log", "anchors", "market"] {
        assert!(shots.join(format!("{shot}.png")).metadata().unwrap().len() > 1000, "{shot}.png");
    }
}
