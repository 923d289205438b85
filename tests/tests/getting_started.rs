//! docs/getting-started.md, executed: every `sh` block (but the `# setup` one) and every
//! `python` block, in order, in one bash session, in a fresh directory holding the
//! repository's recipes, with the workspace's `mindxtrain` on the PATH. Python blocks run in
//! the venv their first line names (`# pip install openai`: target/openai-venv; `# pip
//! install torch ...`: the torch venv of scripts/setup-torch, skipped when it is absent unless
//! MINDXTRAIN_REQUIRE_TORCH is set). The only edit: the page's ports (8080, 8545) become free
//! ones, so tests can run side by side.

use mindxtrain_tests::{openai_python, torch_python, workspace_bin};
use std::path::{Path, PathBuf};
use std::process::Command;

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

/// The page's fenced blocks: (info string, body).
fn blocks(markdown: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut lines = markdown.lines();
    while let Some(line) = lines.next() {
        let Some(info) = line.strip_prefix("```") else { continue };
        let body: Vec<&str> = lines.by_ref().take_while(|l| !l.starts_with("```")).collect();
        out.push((info.trim().to_string(), body.join("\n") + "\n"));
    }
    out
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

#[test]
fn the_getting_started_page_runs_as_written() {
    let page = std::fs::read_to_string(repo_root().join("docs/getting-started.md")).unwrap();
    let (api_port, chain_port) = (free_port(), free_port());
    let ported = |text: &str| {
        text.replace("127.0.0.1:8080", &format!("127.0.0.1:{api_port}"))
            .replace("--port 8545", &format!("--port {chain_port}"))
            .replace("127.0.0.1:8545", &format!("127.0.0.1:{chain_port}"))
    };
    let openai = openai_python().expect("the OpenAI client venv");
    let torch = torch_python();
    let mut script = String::from("set -euo pipefail\n");
    let mut ran = (0, 0);
    for (info, body) in blocks(&page) {
        let first = body.lines().next().unwrap_or_default();
        match info.as_str() {
            "sh" if first.starts_with("# setup") => {}
            "sh" => {
                script.push_str(&ported(&body));
                ran.0 += body.lines().filter(|l| l.starts_with("mindxtrain ")).count();
            }
            "python" => {
                let python = if first.contains("openai") {
                    Some(openai.clone())
                } else {
                    assert!(first.contains("transformers"), "which venv runs this block? {first}");
                    torch.clone()
                };
                match python {
                    Some(py) => {
                        script.push_str(&format!("{} - <<'PYTHON'\n{}PYTHON\n", py.display(), ported(&body)));
                        ran.1 += 1;
                    }
                    None => script.push_str("echo 'SKIP transformers: no torch venv (scripts/setup-torch)'\n"),
                }
            }
            _ => {}
        }
    }
    // init, train ×2, eval, chain up/deploy, anchor, receipt export/verify, serve, export, chain down.
    assert!(ran.0 >= 12 && ran.1 >= 1, "the page lost its commands: {ran:?}");

    let work = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(repo_root().join("recipes"), work.path().join("recipes")).unwrap();
    let bin = workspace_bin("mindxtrain");
    let path = format!("{}:{}", bin.parent().unwrap().display(), std::env::var("PATH").unwrap_or_default());
    // Whatever happens, the background server and chain of the page do not outlive it.
    // (`set +e` first: errexit applies inside a trap too, and `kill` of no job fails.)
    let cleanup = "set +e; kill $(jobs -p) 2>/dev/null; mindxtrain chain down >/dev/null 2>&1";
    let guarded = format!("trap '{cleanup}' EXIT\n{script}");
    let out = Command::new("bash")
        .arg("-c")
        .arg(&guarded)
        .current_dir(work.path())
        .env("PATH", path)
        .env_remove("MINDXTRAIN_NODE_DIR")
        .output()
        .unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(
        out.status.success(),
        "the page failed ({}):\n--- script\n{guarded}\n--- stdout\n{stdout}\n--- stderr\n{stderr}",
        out.status
    );
    // What a reader sees at each step.
    for want in [
        "initialised",
        "held-out",
        "base      ",
        "deployed Registry",
        "TestUSDC",
        "VERIFIED",
        "anchor.on_chain",
        "the model says:",
        "an HF model directory",
        "stopped the embedded anvil",
    ] {
        assert!(stdout.contains(want), "{want:?} missing from what the page printed:\n{stdout}\n{stderr}");
    }
    if torch.is_some() {
        assert!(stdout.contains("transformers says:"), "{stdout}");
    }
    let node = work.path().join("my-node");
    assert!(node.join("node.key").is_file() && work.path().join("hf-lora/model.safetensors").is_file());
}
