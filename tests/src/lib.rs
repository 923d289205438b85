//! Helpers shared by mindxtrain's end-to-end tests and benchmark programs.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Path of a binary built from this workspace (the tests' own target dir).
pub fn workspace_bin(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    // target/<profile>/deps/test-xxxx → target/<profile>/<name>
    let dir = exe.parent().and_then(Path::parent).expect("target dir");
    dir.join(name)
}

/// `mindxtrain` with `--node-dir dir` and the given args.
pub fn mindxtrain(dir: &Path, args: &[&str]) -> Command {
    let mut c = Command::new(workspace_bin("mindxtrain"));
    c.arg("--node-dir").arg(dir).args(args);
    c
}

/// Benchmark programs' bodies (the binaries in src/bin parse arguments and call these).
pub mod bench {
    pub mod data;
    pub mod paid_serving;
    pub mod train;

    /// The `p` quantile (0..=1) of `sorted` by nearest rank; zero for no samples.
    pub fn percentile(sorted: &[std::time::Duration], p: f64) -> std::time::Duration {
        if sorted.is_empty() {
            return std::time::Duration::ZERO;
        }
        sorted[((sorted.len() - 1) as f64 * p).round() as usize]
    }
}

/// A Hugging Face hub cache holding a tiny model and chat dataset under hub names.
pub mod hub_cache;

/// Our model and transformers/PEFT side by side on tiny random models of each architecture.
pub mod interop;

/// The micro recipe and node the training tests share.
pub mod micro;

/// A trained micro model served by the binary.
pub mod served;

/// The paid test server, chain and signing helpers of the x402 tests and benchmark.
pub mod x402_env;

/// The python of `target/openai-venv`, with the OpenAI client pinned in
/// tests/python/openai.lock, created (or refreshed when the lock changed) on first use.
pub fn openai_python() -> anyhow::Result<PathBuf> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let lock = root.join("python/openai.lock");
    let venv = root.parent().map(|r| r.join("target/openai-venv")).unwrap_or_else(|| root.join("openai-venv"));
    let python = venv.join("bin/python");
    let stamp = venv.join(".lock.blake3");
    let want = blake3::hash(&std::fs::read(&lock)?).to_hex().to_string();
    if python.exists() && std::fs::read_to_string(&stamp).ok().as_deref() == Some(want.as_str()) {
        return Ok(python);
    }
    let run = |c: &mut Command| -> anyhow::Result<()> {
        let out = c.output()?;
        anyhow::ensure!(out.status.success(), "{:?}: {}", c, String::from_utf8_lossy(&out.stderr));
        Ok(())
    };
    let _ = std::fs::remove_dir_all(&venv);
    run(Command::new("python3").args(["-m", "venv"]).arg(&venv))?;
    run(Command::new(&python).args(["-m", "pip", "install", "-q", "--no-deps", "-r"]).arg(&lock))?;
    std::fs::write(&stamp, want)?;
    Ok(python)
}

/// The python of the CPU torch + transformers + PEFT venv (`scripts/setup-torch`), for the
/// interop tests. Absent: `None` (the caller skips, saying so), unless
/// MINDXTRAIN_REQUIRE_TORCH is set (CI sets it): then it is installed, and a failure panics.
pub fn torch_python() -> Option<PathBuf> {
    let setup = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/setup-torch");
    let print = || {
        let out = Command::new(&setup).arg("--print").output().expect("run scripts/setup-torch --print");
        out.status.success().then(|| PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
    };
    if let Some(p) = print() {
        return Some(p);
    }
    if std::env::var_os("MINDXTRAIN_REQUIRE_TORCH").is_none() {
        eprintln!("SKIP: no torch venv (run scripts/setup-torch, or set MINDXTRAIN_REQUIRE_TORCH=1)");
        return None;
    }
    let status = Command::new(&setup).status().expect("run scripts/setup-torch");
    assert!(status.success(), "scripts/setup-torch failed");
    Some(print().expect("venv installed but not usable"))
}

/// The python of a venv under `tmp` (a test's `CARGO_TARGET_TMPDIR`) with the pinned
/// requirements of the independent receipt verifier (tests/python/verify_receipt.py), or `None`
/// when Python/pip is unavailable (the caller skips), unless MINDXTRAIN_REQUIRE_PY is set.
pub fn receipt_python(tmp: &Path) -> Option<PathBuf> {
    let venv = tmp.join("receipt-venv");
    let py = venv.join("bin/python");
    let reqs = Path::new(env!("CARGO_MANIFEST_DIR")).join("python/receipt-requirements.txt");
    let stamp = venv.join("requirements.txt");
    if py.is_file() && std::fs::read(&stamp).ok() == std::fs::read(&reqs).ok() {
        return Some(py);
    }
    let made = Command::new("python3").args(["-m", "venv", "--clear"]).arg(&venv).status();
    let installed = made.is_ok_and(|s| s.success())
        && Command::new(&py)
            .args(["-m", "pip", "install", "--quiet", "--disable-pip-version-check", "-r"])
            .arg(&reqs)
            .status()
            .is_ok_and(|s| s.success());
    if installed {
        std::fs::copy(&reqs, &stamp).expect("stamp the verifier venv");
        return Some(py);
    }
    assert!(
        std::env::var_os("MINDXTRAIN_REQUIRE_PY").is_none(),
        "MINDXTRAIN_REQUIRE_PY is set but the verifier venv could not be set up"
    );
    eprintln!("skipping: python3 -m venv / pip install of {} failed", reqs.display());
    None
}
