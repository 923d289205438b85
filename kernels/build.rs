//! Under the `cuda` feature, compiles every `cuda/*.cu` to PTX (one module per file) with nvcc
//! for `CUDA_COMPUTE_CAP` (default 90, Hopper). Under the `hip` feature, compiles the same files
//! with hipcc into one AMD code object bundle per file, for the targets `scripts/hip-targets`
//! names (`HIP_TARGETS`, else those of gfx90a gfx940 gfx942 that hipcc accepts). Without either
//! feature it does nothing, so CPU builds (and CI) never need nvcc or hipcc.
//!
//! A file named `*_sm90a.cu` uses Hopper-only instructions (wgmma): it is built for compute_90a,
//! only when `CUDA_COMPUTE_CAP` is 90, and then the crate is compiled with `cfg(sm90a)` (the
//! code that loads it also checks the device is sm_90).

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    println!("cargo::rerun-if-changed=cuda");
    println!("cargo::rerun-if-env-changed=CUDA_COMPUTE_CAP");
    println!("cargo::rustc-check-cfg=cfg(sm90a)");
    let cuda = std::env::var_os("CARGO_FEATURE_CUDA").is_some();
    let hip = std::env::var_os("CARGO_FEATURE_HIP").is_some();
    if !cuda && !hip {
        return;
    }
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let mut sources: Vec<PathBuf> = std::fs::read_dir("cuda")
        .expect("kernels/cuda exists")
        .map(|e| e.expect("readable kernels/cuda").path())
        .filter(|p| p.extension().is_some_and(|e| e == "cu"))
        .collect();
    sources.sort();
    if cuda {
        build_ptx(&out, &sources);
    }
    if hip {
        build_code_objects(&out, &sources);
    }
}

fn build_ptx(out: &Path, sources: &[PathBuf]) {
    let cap = std::env::var("CUDA_COMPUTE_CAP").unwrap_or_else(|_| "90".into());
    let nvcc = std::env::var_os("CUDA_ROOT")
        .map(|root| Path::new(&root).join("bin/nvcc"))
        .filter(|p| p.exists())
        .unwrap_or_else(|| "nvcc".into());
    // No fast-math: the f32 kernels are held to f32 rounding against the f64 reference.
    let args: Vec<String> = ["-ptx", "-O3", "-std=c++17", "-lineinfo", "-Icuda"].map(String::from).into();
    let hopper = cap == "90";
    if hopper {
        println!("cargo::rustc-cfg=sm90a");
    }
    for src in sources {
        let arch = match (stem(src).ends_with("_sm90a"), hopper) {
            (false, _) => format!("-arch=compute_{cap}"),
            (true, true) => "-arch=compute_90a".into(),
            (true, false) => continue,
        };
        let args: Vec<String> = args.iter().cloned().chain([arch]).collect();
        compile(nvcc.as_os_str(), &args, &out.join(format!("{}.ptx", stem(src))), src, "scripts/build-gpu");
    }
}

/// `{stem}.hipfb` per source: hipcc --genco with several targets writes a clang offload bundle
/// (one ELF code object per target), which hipModuleLoadData takes whole and picks the device's
/// target from. The targets also go to the crate as `MINDXTRAIN_HIP_TARGETS`.
fn build_code_objects(out: &Path, sources: &[PathBuf]) {
    println!("cargo::rerun-if-env-changed=HIP_TARGETS");
    let probe = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/hip-targets");
    println!("cargo::rerun-if-changed={}", probe.display());
    let listed =
        Command::new("bash").arg(&probe).output().unwrap_or_else(|e| panic!("cannot run {} ({e})", probe.display()));
    assert!(
        listed.status.success(),
        "{} found no HIP target: {}",
        probe.display(),
        String::from_utf8_lossy(&listed.stderr)
    );
    let targets = String::from_utf8(listed.stdout).expect("target names are ASCII");
    let targets: Vec<&str> = targets.split_whitespace().collect();
    println!("cargo::rustc-env=MINDXTRAIN_HIP_TARGETS={}", targets.join(" "));
    // No fast-math, as for nvcc: the device tests hold f32 kernels to f32 rounding.
    let mut args: Vec<String> = ["--genco", "-O3", "-std=c++17", "-Icuda"].map(String::from).into();
    args.extend(targets.iter().map(|t| format!("--offload-arch={t}")));
    for src in sources {
        compile(OsStr::new("hipcc"), &args, &out.join(format!("{}.hipfb", stem(src))), src, "scripts/build-hip");
    }
}

fn stem(src: &Path) -> String {
    src.file_stem().expect("a .cu file has a stem").to_string_lossy().into_owned()
}

/// `tool args… -o output src`, failing the build (with the tool's own diagnostics above) when it
/// fails; `setup` names the script that says how to install the tool.
fn compile(tool: &OsStr, args: &[String], output: &Path, src: &Path, setup: &str) {
    let status = Command::new(tool)
        .args(args)
        .arg("-o")
        .arg(output)
        .arg(src)
        .status()
        .unwrap_or_else(|e| panic!("cannot run {} ({e}): run {setup}", tool.display()));
    assert!(status.success(), "{} failed on {}", tool.display(), src.display());
}
