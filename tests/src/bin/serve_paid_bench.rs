//! The paid-load serving benchmark (issue 18): output tokens/s of the node's chat completions
//! under N concurrent streams, sold over x402 (in-process facilitator, anvil) against the same
//! route unpaid, in one run. One JSON line per metric on stdout (and appended to `--out`);
//! `ratio` is paid/unpaid. See `mindxtrain_tests::bench::paid_serving`.
//!
//! ```text
//! serve-paid-bench --device cpu --shape tiny --streams 4 --prompt 32 --gen 16 --rounds 2   (CPU smoke run)
//! MINDXTRAIN_ANVIL=/path/to/anvil serve-paid-bench --device cuda --shape 8B                (bench/serving-paid.sh)
//! ```

use std::io::Write;
use std::path::PathBuf;

use clap::Parser;
use mindxtrain_tests::bench::paid_serving::{PaidServing, run};

#[derive(Parser)]
#[command(about = "Serving throughput with every call paid over x402 against the same load unpaid")]
struct Args {
    /// `cpu`, `cuda` or `cuda:N` (a CUDA device needs a build with the `cuda` feature).
    #[arg(long, default_value = "cpu")]
    device: String,
    /// Model shape on random weights: tiny, 0.6B, 1.7B or 8B (bf16 on a GPU, f32 on the CPU).
    #[arg(long, default_value = "tiny")]
    shape: String,
    /// Streamed requests sent at once per load.
    #[arg(long, default_value_t = 64)]
    streams: usize,
    /// Prompt tokens per request, chat template included.
    #[arg(long, default_value_t = 512)]
    prompt: usize,
    /// Tokens generated per request.
    #[arg(long = "gen", default_value_t = 256)]
    new_tokens: usize,
    /// Measured rounds, each one unpaid and one paid load (their order alternating).
    #[arg(long, default_value_t = 4)]
    rounds: usize,
    /// Paying wallets, used in turn.
    #[arg(long, default_value_t = 8)]
    payers: usize,
    /// Also append the JSON lines to this file.
    #[arg(long)]
    out: Option<PathBuf>,
}

fn main() -> anyhow::Result<()> {
    let a = Args::parse();
    let load = PaidServing {
        device: a.device,
        shape: a.shape,
        streams: a.streams,
        prompt: a.prompt,
        new_tokens: a.new_tokens,
        rounds: a.rounds,
        payers: a.payers,
    };
    let report = run(&load)?;
    let mut out = match &a.out {
        Some(path) => Some(std::fs::OpenOptions::new().create(true).append(true).open(path)?),
        None => None,
    };
    for line in report.lines() {
        println!("{line}");
        if let Some(f) = out.as_mut() {
            writeln!(f, "{line}")?;
        }
    }
    eprintln!("paid/unpaid output tokens/s: {:.4} (goal: at least 0.98)", report.ratio());
    report.check()
}
