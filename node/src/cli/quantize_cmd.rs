//! `mindxtrain quantize`: a run's final model (or any HF model directory) as FP8 E4M3 in the
//! compressed-tensors format, recorded in the node's log as `model.quantized` with its digests.
//! A run whose recipe sets `quantize.enabled` does this itself, into its sealed run directory.

use super::EXIT_INVALID_INPUT;
use super::output::Output;
use anyhow::{Context, Result};
use clap::Args;
use mindxtrain_node::log::AppendRequest;
use mindxtrain_node::node;
use mindxtrain_trainer::quantize::{
    Fp8Options, Granularity, MODEL_QUANTIZED, QUANTIZED_DIR, QuantizeError, event_data, quantize_dir,
};
use mindxtrain_trainer::run::OutDir;
use serde_json::json;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

#[derive(Args, Debug)]
pub struct QuantizeArgs {
    /// A run directory (its final/ is quantized) or an HF model directory (config.json + safetensors).
    pub path: PathBuf,
    /// The directory to write, which must not exist. Default: RUN/quantized for a run, PATH-fp8
    /// beside a model directory.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// One weight scale per tensor instead of one per output channel.
    #[arg(long)]
    pub per_tensor: bool,
}

pub fn run(args: QuantizeArgs, node_dir: &Path, out: &Output) -> Result<ExitCode> {
    let refuse = |message: String| {
        out.emit(&json!({"ok": false, "error": message}), String::new);
        if !out.json {
            eprintln!("error: {message}");
        }
        Ok(ExitCode::from(EXIT_INVALID_INPUT))
    };
    let run = OutDir::new(&args.path);
    let record = run.read_record().ok().flatten();
    let (source, default_out, subject) = match &record {
        Some(r) => (run.final_dir(), args.path.join(QUANTIZED_DIR), r.run_id.clone()),
        None => {
            let name = format!("{}-fp8", super::file_name(&args.path));
            let beside = args.path.parent().map_or_else(|| PathBuf::from(&name), |p| p.join(&name));
            (args.path.clone(), beside, format!("model:{}", args.path.display()))
        }
    };
    let target = args.out.clone().unwrap_or(default_out);
    if target.exists() {
        return refuse(format!("{} exists: give a new directory with --out", target.display()));
    }
    // The log first: a node that cannot record the result writes nothing.
    let (log, _, _) = node::open(node_dir)?;
    let weights = if args.per_tensor { Granularity::Tensor } else { Granularity::Channel };
    let done = match quantize_dir(&source, &target, Fp8Options { weights }, &mut |line| eprintln!("{line}")) {
        Ok(q) => q,
        Err(
            e @ (QuantizeError::Adapter { .. } | QuantizeError::AlreadyQuantized { .. } | QuantizeError::NotBuilt(_)),
        ) => {
            return refuse(e.to_string());
        }
        Err(QuantizeError::Checkpoint(e)) if !source.join("config.json").is_file() => {
            return refuse(format!("{}: not a run directory nor an HF model directory ({e})", args.path.display()));
        }
        Err(e) => return Err(e).with_context(|| format!("quantizing {}", source.display())),
    };
    let data = event_data(&subject, &source.display().to_string(), &target, &done);
    let seq = log.append(AppendRequest::new(MODEL_QUANTIZED, subject.as_str(), data.clone()))?.seq;
    out.emit(&json!({"ok": true, "seq": seq, "event": data}), || {
        let mut lines = vec![format!(
            "{}: FP8 E4M3 ({} scales, activations per token at run time), compressed-tensors; {} weights to FP8, \
             kept: lm_head{}",
            target.display(),
            done.strategy,
            done.fp8_tensors,
            done.ignored.iter().map(|n| format!(", {n}")).collect::<String>()
        )];
        for f in &done.files {
            lines.push(format!("  {:<28} {:>12} bytes  blake3 {}", f.path, f.bytes, &f.blake3[..16]));
        }
        lines.push(format!("recorded as {MODEL_QUANTIZED} (seq {seq}) for {subject}"));
        lines.join("\n")
    });
    Ok(ExitCode::SUCCESS)
}
