//! `hash-bench`: manifest sealing's one-pass SHA-256 + BLAKE3 against `sha256sum` and
//! `b3sum` on the same multi-GB file, in the same run.
//!
//! Targets (issue "Manifests and receipt"): our combined pass takes ≤ 1.05× the time of
//! `sha256sum` alone; our BLAKE3-only pass reaches ≥ 0.95× the throughput of `b3sum`.
//! The file is generated (pseudo-random bytes from BLAKE3's XOF) unless `--file` is given,
//! and deleted afterwards unless `--keep`. Every tool reads it from the page cache: one
//! warm-up round, then `--rounds` rounds with the tools interleaved; the median counts.

use anyhow::{Context, Result, bail};
use clap::Parser;
use mindxtrain_node::manifest::digest::{Algorithms, HashOptions, hash_file};
use serde_json::json;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

#[derive(Parser, Debug)]
#[command(about = "One-pass sha256+blake3 vs sha256sum and b3sum on a multi-GB file")]
struct Args {
    /// Size of the generated file in GiB.
    #[arg(long, default_value_t = 3.0)]
    size_gib: f64,
    /// Use this file instead of generating one (it is never deleted).
    #[arg(long)]
    file: Option<PathBuf>,
    /// Directory for the generated file.
    #[arg(long, default_value = ".")]
    dir: PathBuf,
    /// Keep the generated file.
    #[arg(long)]
    keep: bool,
    /// Measured rounds (after one warm-up round).
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// The b3sum binary (default: target/tools/bin/b3sum, else b3sum on PATH).
    #[arg(long)]
    b3sum: Option<PathBuf>,
    #[arg(long)]
    json: bool,
}

fn main() -> Result<()> {
    let args = Args::parse();
    let b3sum =
        args.b3sum.clone().or_else(find_b3sum).context("b3sum not found: cargo install b3sum --root target/tools")?;
    let (path, generated) = match &args.file {
        Some(f) => (f.clone(), false),
        None => (generate(&args.dir, (args.size_gib * (1u64 << 30) as f64) as u64)?, true),
    };
    let result = run(&args, &path, &b3sum);
    if generated && !args.keep {
        let _ = std::fs::remove_file(&path);
    }
    result
}

fn find_b3sum() -> Option<PathBuf> {
    let local = Path::new("target/tools/bin/b3sum");
    if local.is_file() {
        return Some(local.to_path_buf());
    }
    let out = Command::new("sh").args(["-c", "command -v b3sum"]).output().ok()?;
    let p = String::from_utf8(out.stdout).ok()?;
    (!p.trim().is_empty()).then(|| PathBuf::from(p.trim()))
}

fn generate(dir: &Path, size: u64) -> Result<PathBuf> {
    let path = dir.join(format!("hash-bench-{}.bin", std::process::id()));
    let mut f = std::io::BufWriter::with_capacity(8 << 20, std::fs::File::create(&path)?);
    let mut xof = blake3::Hasher::new().update(b"mindxtrain hash-bench").finalize_xof();
    let mut buf = vec![0u8; 8 << 20];
    let mut left = size;
    while left > 0 {
        let n = left.min(buf.len() as u64) as usize;
        xof.fill(&mut buf[..n]);
        f.write_all(&buf[..n])?;
        left -= n as u64;
    }
    f.flush()?;
    Ok(path)
}

/// Seconds taken by an external tool; its output must start with `expect_hex`.
fn time_tool(bin: &Path, path: &Path, expect_hex: &str) -> Result<f64> {
    let t = Instant::now();
    let out = Command::new(bin).arg(path).output().with_context(|| format!("running {}", bin.display()))?;
    let secs = t.elapsed().as_secs_f64();
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() || !text.starts_with(expect_hex) {
        bail!("{} printed {text:?}, expected {expect_hex}", bin.display());
    }
    Ok(secs)
}

fn time_ours(path: &Path, algorithms: Algorithms) -> Result<(f64, [u8; 32], [u8; 32])> {
    let t = Instant::now();
    let d = hash_file(path, HashOptions { progress: false, algorithms })?;
    Ok((t.elapsed().as_secs_f64(), d.digests.sha256, d.digests.blake3))
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

fn run(args: &Args, path: &Path, b3sum: &Path) -> Result<()> {
    let size = std::fs::metadata(path)?.len();
    let load_before = loadavg();
    // Warm-up: fills the page cache and gives the reference digests.
    let (_, sha, b3) = time_ours(path, Algorithms::Both)?;
    let (sha_hex, b3_hex) = (hex::encode(sha), hex::encode(b3));
    let sha256sum = PathBuf::from("sha256sum");
    time_tool(&sha256sum, path, &sha_hex)?;
    time_tool(b3sum, path, &b3_hex)?;
    let (mut t_sha, mut t_b3sum, mut t_both, mut t_b3) = (vec![], vec![], vec![], vec![]);
    for _ in 0..args.rounds.max(1) {
        t_sha.push(time_tool(&sha256sum, path, &sha_hex)?);
        t_both.push(time_ours(path, Algorithms::Both)?.0);
        t_b3sum.push(time_tool(b3sum, path, &b3_hex)?);
        t_b3.push(time_ours(path, Algorithms::Blake3Only)?.0);
    }
    let (sha_s, b3sum_s, both_s, b3_s) =
        (median(&mut t_sha), median(&mut t_b3sum), median(&mut t_both), median(&mut t_b3));
    let gbs = |s: f64| size as f64 / s / 1e9;
    let combined_ratio = both_s / sha_s;
    let b3_ratio = gbs(b3_s) / gbs(b3sum_s);
    let load_after = loadavg();
    if args.json {
        println!(
            "{}",
            json!({
                "bytes": size, "rounds": args.rounds, "cpus": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
                "load_before": load_before, "load_after": load_after,
                "sha256sum_s": sha_s, "b3sum_s": b3sum_s, "ours_both_s": both_s, "ours_blake3_s": b3_s,
                "combined_over_sha256sum": combined_ratio, "blake3_throughput_over_b3sum": b3_ratio,
                "targets_met": combined_ratio <= 1.05 && b3_ratio >= 0.95,
            })
        );
        return Ok(());
    }
    println!(
        "file {} ({:.2} GiB), median of {} rounds, page cache warm",
        path.display(),
        size as f64 / (1u64 << 30) as f64,
        args.rounds
    );
    println!("load average before {load_before}, after {load_after}");
    println!("{:<34} {:>9} {:>9}", "pass", "seconds", "GB/s");
    for (name, s) in [
        ("sha256sum", sha_s),
        ("ours: sha256 + blake3, one pass", both_s),
        ("b3sum", b3sum_s),
        ("ours: blake3 only", b3_s),
    ] {
        println!("{name:<34} {s:>9.3} {:>9.2}", gbs(s));
    }
    println!(
        "combined / sha256sum time = {combined_ratio:.3} (target <= 1.05: {})",
        if combined_ratio <= 1.05 { "met" } else { "NOT met" }
    );
    println!(
        "blake3 / b3sum throughput = {b3_ratio:.3} (target >= 0.95: {})",
        if b3_ratio >= 0.95 { "met" } else { "NOT met" }
    );
    Ok(())
}
