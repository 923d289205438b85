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
    pub mod train;
}

/// The paid test server, chain and signing helpers of the x402 tests and benchmark.
pub mod x402_env;
