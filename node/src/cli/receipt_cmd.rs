//! `mindxtrain receipt export|verify`, and the seeds' `mindxtrain receipt <file> --config run.yaml`.

use super::output::Output;
use super::{EXIT_CHAIN_UNREACHABLE, EXIT_INVALID_INPUT, EXIT_VERIFY_FAILED};
use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use mindxtrain_node::identity;
use mindxtrain_node::manifest::Envelope;
use mindxtrain_node::receipt::verify::{self, Status};
use mindxtrain_node::receipt::{self, Outcome, Receipt, Report, VerifyInputs};
use serde_json::json;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

const VERIFY_HELP: &str = "Exit codes: 0 every check passed; 3 tampered (a signature, digest or proof does not \
match); 4 missing or invalid input (a subject file absent from --files, an unreadable file, a bad key); \
5 the chain could not be reached (--rpc-url).\n\nExamples:\n  mindxtrain receipt verify receipt.json\n  \
mindxtrain receipt verify receipt.json --files ./run-out --config run.yaml --plan plan.json \
--trusted-key node.pub --rpc-url http://127.0.0.1:8545 --json\n  mindxtrain receipt manifest.json --config run.yaml";

#[derive(Args, Debug)]
#[command(args_conflicts_with_subcommands = true, after_help = VERIFY_HELP)]
pub struct ReceiptArgs {
    #[command(subcommand)]
    cmd: Option<ReceiptCommand>,
    /// A receipt bundle or a bare manifest envelope to verify (same as `receipt verify FILE`).
    file: Option<PathBuf>,
    #[command(flatten)]
    check: CheckArgs,
}

#[derive(Args, Debug, Default)]
pub struct CheckArgs {
    /// Directory with the run's files (subjects by their relative names, eval.json).
    #[arg(long, value_name = "DIR")]
    files: Option<PathBuf>,
    /// The recipe file the run claims to have used (compared byte for byte).
    #[arg(long, value_name = "RECIPE")]
    config: Option<PathBuf>,
    /// The autotune plan file (compared byte for byte).
    #[arg(long, value_name = "PLAN")]
    plan: Option<PathBuf>,
    /// Also ask this chain's registry whether it holds the anchored root at the claimed block.
    #[arg(long, value_name = "URL")]
    rpc_url: Option<String>,
    /// Public key (hex, or a node.pub file) that must have signed everything.
    #[arg(long, value_name = "KEY")]
    trusted_key: Option<String>,
    /// Train the recipe again with the plan (CPU-sized runs) and require the final weights
    /// to equal the manifest's, byte for byte. Needs --config and --plan.
    #[arg(long)]
    replay: bool,
    /// With --replay: the weights the run started from (its --init-from directory).
    #[arg(long, value_name = "DIR", requires = "replay")]
    base: Option<PathBuf>,
}

#[derive(Subcommand, Debug)]
enum ReceiptCommand {
    /// Write the receipt bundle of a sealed run: manifest, its log event with an inclusion
    /// proof, a signed checkpoint, and the anchor's batch proof once anchored.
    #[command(
        after_help = "Examples:\n  mindxtrain receipt export runs/lora --out receipt.json\n  mindxtrain receipt export run-0123456789abcdef"
    )]
    Export {
        /// The run id, or the run's directory (its run.json names it).
        run: String,
        /// Where to write it (default: stdout).
        #[arg(long)]
        out: Option<PathBuf>,
        /// Replace --out if it exists.
        #[arg(long)]
        force: bool,
    },
    /// Check a receipt (or a bare manifest) without the node: each check is a named line.
    #[command(after_help = VERIFY_HELP)]
    Verify {
        file: PathBuf,
        #[command(flatten)]
        check: CheckArgs,
    },
}

pub fn run(args: ReceiptArgs, dir: &Path, out: &Output) -> Result<ExitCode> {
    match (args.cmd, args.file) {
        (Some(ReceiptCommand::Export { run, out: file, force }), _) => export(dir, &run, file.as_deref(), force, out),
        (Some(ReceiptCommand::Verify { file, check }), _) => verify_file(&file, &check, out),
        (None, Some(file)) => verify_file(&file, &args.check, out),
        (None, None) => {
            eprintln!("error: give `export RUN`, `verify FILE`, or a FILE to verify (see --help)");
            Ok(ExitCode::from(2))
        }
    }
}

fn export(dir: &Path, run: &str, file: Option<&Path>, force: bool, out: &Output) -> Result<ExitCode> {
    let run_dir = Path::new(run);
    let run = &if run_dir.join("run.json").is_file() {
        match mindxtrain_trainer::run::OutDir::new(run_dir).read_record() {
            Ok(Some(record)) => record.run_id,
            Ok(None) => run.to_string(),
            Err(e) => {
                eprintln!("error: {e}");
                return Ok(ExitCode::from(EXIT_INVALID_INPUT));
            }
        }
    } else {
        run.to_string()
    };
    let r = receipt::export(dir, run)?;
    let Some(file) = file else {
        print!("{}", String::from_utf8_lossy(&r.to_json_pretty()));
        return Ok(ExitCode::SUCCESS);
    };
    if file.exists() && !force {
        eprintln!("error: {} exists; pass --force to replace it", file.display());
        return Ok(ExitCode::from(EXIT_INVALID_INPUT));
    }
    receipt::write(file, &r).with_context(|| format!("writing {}", file.display()))?;
    let digest = hex::encode(r.manifest_digests().blake3);
    let anchored = r.anchor.as_ref().map(|a| json!({"chain_id": a.chain_id, "registry": a.registry, "root": hex::encode(a.root), "tx": a.tx, "block": a.block}));
    out.emit(
        &json!({"run_id": run, "file": file, "manifest_blake3": digest, "event_seq": r.event.seq, "anchor": anchored}),
        || {
            format!(
                "wrote {} for run {run}\n  manifest blake3 {digest}\n  manifest.sealed at seq {}\n  {}",
                file.display(),
                r.event.seq,
                match &r.anchor {
                    Some(a) => format!("anchored on chain {} in block {} (tx {:#x})", a.chain_id, a.block, a.tx),
                    None if mindxtrain_node::anchor::Deployment::path(dir).exists() => {
                        "not anchored yet: run `mindxtrain anchor`, then export again".into()
                    }
                    None =>
                        "not anchored yet: run `mindxtrain chain deploy` and `mindxtrain anchor`, then export again"
                            .into(),
                }
            )
        },
    );
    Ok(ExitCode::SUCCESS)
}

enum Input {
    Receipt(Box<Receipt>),
    Manifest(Envelope),
}

fn verify_file(file: &Path, check: &CheckArgs, out: &Output) -> Result<ExitCode> {
    let bytes = match std::fs::read(file) {
        Ok(b) => b,
        Err(e) => return input_error(out, format!("{}: {e}", file.display())),
    };
    let trusted_key = match &check.trusted_key {
        Some(k) => match identity::read_public_key(k) {
            Ok(k) => Some(k),
            Err(e) => return input_error(out, format!("--trusted-key {e}")),
        },
        None => None,
    };
    let input = match Receipt::from_json(&bytes) {
        Ok(r) => Input::Receipt(Box::new(r)),
        Err(receipt_err) => match Envelope::from_json(&bytes) {
            Ok(env) => Input::Manifest(env),
            Err(_) => {
                let mut report = Report::default();
                report.checks.push(verify::Check {
                    name: "receipt.format".into(),
                    status: Status::Fail,
                    detail: format!(
                        "{}: neither a receipt bundle nor a manifest envelope ({receipt_err})",
                        file.display()
                    ),
                });
                return finish(out, &report);
            }
        },
    };
    let inputs = VerifyInputs {
        files: check.files.as_deref(),
        recipe: check.config.as_deref(),
        plan: check.plan.as_deref(),
        trusted_key,
    };
    let mut report = match &input {
        Input::Receipt(r) => verify::verify_receipt(r, &inputs),
        Input::Manifest(env) => verify::verify_manifest(env, &inputs),
    };
    if check.replay {
        let envelope = match &input {
            Input::Receipt(r) => &r.manifest,
            Input::Manifest(env) => env,
        };
        let spinner = super::train_cmd::spinner(out, "replaying the run");
        receipt::replay::check(
            envelope,
            check.config.as_deref(),
            check.plan.as_deref(),
            check.base.as_deref(),
            &mut report,
        );
        spinner.finish_and_clear();
    }
    let anchor = match &input {
        Input::Receipt(r) => r.anchor.as_ref(),
        Input::Manifest(_) => None,
    };
    match &check.rpc_url {
        Some(url) => {
            let rt = super::chain_cmd::runtime()?;
            rt.block_on(verify::check_on_chain(&mut report, anchor, url));
        }
        None if anchor.is_some() => report.checks.push(verify::Check {
            name: "anchor.on_chain".into(),
            status: Status::Skipped,
            detail: "the chain was not asked (pass --rpc-url URL)".into(),
        }),
        None => {}
    }
    finish(out, &report)
}

fn input_error(out: &Output, message: String) -> Result<ExitCode> {
    out.emit(&json!({"ok": false, "outcome": "missing_input", "error": message}), || format!("error: {message}"));
    Ok(ExitCode::from(EXIT_INVALID_INPUT))
}

fn finish(out: &Output, report: &Report) -> Result<ExitCode> {
    let outcome = report.outcome();
    let code = match outcome {
        Outcome::Verified => 0,
        Outcome::Tampered => EXIT_VERIFY_FAILED,
        Outcome::MissingInput => EXIT_INVALID_INPUT,
        Outcome::ChainUnreachable => EXIT_CHAIN_UNREACHABLE,
    };
    out.emit(&json!({"ok": report.ok(), "outcome": outcome, "exit_code": code, "report": report}), || {
        human(report, outcome)
    });
    Ok(if code == 0 { ExitCode::SUCCESS } else { ExitCode::from(code) })
}

fn human(report: &Report, outcome: Outcome) -> String {
    let mut s = String::new();
    if let Some(run) = &report.run_id {
        s.push_str(&format!("run {run}, manifest blake3 {}\n", report.manifest_blake3.as_deref().unwrap_or("?")));
    }
    for c in &report.checks {
        let tag = match c.status {
            Status::Pass => "PASS",
            Status::Fail => "FAIL",
            Status::Missing => "MISSING",
            Status::Unreachable => "UNREACHABLE",
            Status::Skipped => "skip",
        };
        s.push_str(&format!("{tag:<11} {:<22} {}\n", c.name, c.detail));
    }
    let failed = report.checks.iter().filter(|c| !matches!(c.status, Status::Pass | Status::Skipped)).count();
    s.push_str(&match outcome {
        Outcome::Verified if report.anchored => "VERIFIED".to_string(),
        Outcome::Verified => "VERIFIED (not anchored)".to_string(),
        Outcome::Tampered => format!("TAMPERED: {failed} check(s) did not pass"),
        Outcome::MissingInput => format!("INCOMPLETE: {failed} input(s) missing"),
        Outcome::ChainUnreachable => "UNVERIFIED: the chain could not be reached".to_string(),
    });
    s
}
