//! Under the `cuda` feature, compiles every `cuda/*.cu` to PTX (one module per file) with nvcc
//! for `CUDA_COMPUTE_CAP` (default 90, Hopper). Without the feature it does nothing, so CPU
//! builds (and CI) never need nvcc.

use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    println!("cargo::rerun-if-changed=cuda");
    println!("cargo::rerun-if-env-changed=CUDA_COMPUTE_CAP");
    if std::env::var_os("CARGO_FEATURE_CUDA").is_none() {
        return;
    }
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let cap = std::env::var("CUDA_COMPUTE_CAP").unwrap_or_else(|_| "90".into());
    let nvcc = std::env::var_os("CUDA_ROOT")
        .map(|root| Path::new(&root).join("bin/nvcc"))
        .filter(|p| p.exists())
        .unwrap_or_else(|| "nvcc".into());
    let mut sources: Vec<PathBuf> = std::fs::read_dir("cuda")
        .expect("kernels/cuda exists")
        .map(|e| e.expect("readable kernels/cuda").path())
        .filter(|p| p.extension().is_some_and(|e| e == "cu"))
        .collect();
    sources.sort();
    for src in sources {
        let stem = src.file_stem().expect("a .cu file has a stem").to_string_lossy().into_owned();
        let ptx = out.join(format!("{stem}.ptx"));
        // No fast-math: the f32 kernels are held to f32 rounding against the f64 reference.
        let status = Command::new(&nvcc)
            .args(["-ptx", "-O3", "-std=c++17", "-lineinfo", "-Icuda"])
            .arg(format!("-arch=compute_{cap}"))
            .arg("-o")
            .arg(&ptx)
            .arg(&src)
            .status()
            .unwrap_or_else(|e| panic!("cannot run {} ({e}): run scripts/build-gpu", nvcc.display()));
        assert!(status.success(), "nvcc failed on {}", src.display());
    }
}
