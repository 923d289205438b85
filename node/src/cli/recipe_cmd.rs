//! `mindxtrain recipe check|show|register|fields`.

use super::EXIT_INVALID_INPUT;
use super::output::Output;
use anyhow::{Context, Result};
use clap::Subcommand;
use mindxtrain_node::node;
use mindxtrain_node::recipes::{self, RegisterError};
use mindxtrain_trainer::recipe::{Recipe, RecipeError, RecipeErrors, contract};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

#[derive(Subcommand, Debug)]
pub enum RecipeCommand {
    /// Validate recipe files; every problem is listed as file:line:col path: message.
    #[command(
        after_help = "Exit code 0 when every file is valid, 4 otherwise.\n\nExample:\n  mindxtrain recipe check recipes/*.yaml"
    )]
    Check {
        #[arg(required = true)]
        files: Vec<PathBuf>,
    },
    /// Print a recipe resolved with every default filled in: itself a loadable recipe (with --json:
    /// `{file, blake3, recipe}`).
    #[command(
        after_help = "Examples:\n  mindxtrain recipe show recipes/tiny_cpu_lora.yaml > resolved.json\n  mindxtrain recipe show recipes/tiny_cpu_lora.yaml --json"
    )]
    Show { file: PathBuf },
    /// Validate and record recipes in the node's log (`recipe.registered`, with the BLAKE3 of the bytes).
    #[command(
        after_help = "Registering the same bytes twice returns the original event.\n\nExample:\n  mindxtrain recipe register recipes/tiny_cpu_lora.yaml"
    )]
    Register {
        #[arg(required = true)]
        files: Vec<PathBuf>,
    },
    /// Every field of the schema: its type, what carries it out, and the values `recipe check`
    /// refuses because nothing honours them yet (the table of docs/recipes.md).
    #[command(after_help = "Examples:\n  mindxtrain recipe fields\n  mindxtrain recipe fields --json")]
    Fields,
}

pub fn run(cmd: RecipeCommand, dir: &Path, out: &Output) -> Result<ExitCode> {
    match cmd {
        RecipeCommand::Check { files } => check(&files, out),
        RecipeCommand::Show { file } => show(&file, out),
        RecipeCommand::Register { files } => register(&files, dir, out),
        RecipeCommand::Fields => fields(out),
    }
}

fn fields(out: &Output) -> Result<ExitCode> {
    let types = contract::schema();
    let list: Vec<Value> = contract::fields()
        .iter()
        .map(|f| {
            json!({
                "path": f.path,
                "type": types.get(f.path),
                "does": f.does,
                "test": (!f.test.is_empty()).then_some(f.test),
                "proven_by_a_differential_run": f.differs.is_some(),
                "refused": f.refused.iter().map(|r| json!({"value": r.value, "says": r.says})).collect::<Vec<_>>(),
                "inert_unless": f.inert_unless,
            })
        })
        .collect();
    out.emit(&json!({"fields": list}), contract::markdown);
    Ok(ExitCode::SUCCESS)
}

pub fn error_json(e: &RecipeError) -> Value {
    json!({
        "file": e.source_name(),
        "line": e.location().map(|l| l.line),
        "column": e.location().map(|l| l.column),
        "path": e.path(),
        "message": e.message(),
        "display": e.to_string(),
    })
}

/// The problems, one indented line each (and how many more were left out).
fn listed(errs: &RecipeErrors) -> String {
    errs.to_string().lines().map(|l| format!("  {l}")).collect::<Vec<_>>().join("\n")
}

/// `{file, ok: false, errors, omitted}`.
fn invalid_json(file: &Path, errs: &RecipeErrors) -> Value {
    json!({"file": file, "ok": false, "errors": errs.iter().map(error_json).collect::<Vec<_>>(), "omitted": errs.omitted()})
}

fn check(files: &[PathBuf], out: &Output) -> Result<ExitCode> {
    let mut results = Vec::new();
    let mut text = Vec::new();
    let mut all_ok = true;
    for f in files {
        match Recipe::check_path(f) {
            Ok(l) => {
                let digest = hex::encode(l.bytes_blake3);
                text.push(format!("ok      {}  blake3 {digest}", f.display()));
                results.push(json!({"file": f, "ok": true, "blake3": digest}));
            }
            Err(errs) => {
                all_ok = false;
                text.push(format!("invalid {} ({} problem(s))", f.display(), errs.len() + errs.omitted()));
                text.push(listed(&errs));
                results.push(invalid_json(f, &errs));
            }
        }
    }
    out.emit(&json!({"ok": all_ok, "files": results}), || text.join("\n"));
    Ok(if all_ok { ExitCode::SUCCESS } else { ExitCode::from(EXIT_INVALID_INPUT) })
}

fn show(file: &Path, out: &Output) -> Result<ExitCode> {
    match Recipe::check_path(file) {
        Ok(l) => {
            let recipe = serde_json::to_value(&l.recipe).context("serialising the recipe")?;
            let v = json!({"file": file, "blake3": hex::encode(l.bytes_blake3), "recipe": recipe});
            // Without --json: the resolved recipe alone, itself a loadable recipe (JSON is YAML),
            // so `recipe show a.yaml > b.json` gives a file `train` accepts.
            out.emit(&v, || serde_json::to_string_pretty(&recipe).unwrap_or_default());
            Ok(ExitCode::SUCCESS)
        }
        Err(errs) => {
            eprintln!("{errs}");
            Ok(ExitCode::from(EXIT_INVALID_INPUT))
        }
    }
}

fn register(files: &[PathBuf], dir: &Path, out: &Output) -> Result<ExitCode> {
    let (log, _, _) = node::open(dir)?;
    let mut results = Vec::new();
    let mut text = Vec::new();
    let mut all_ok = true;
    for f in files {
        let src = std::fs::read_to_string(f).with_context(|| format!("reading {}", f.display()))?;
        match recipes::register(&log, &f.display().to_string(), &src) {
            Ok(r) => {
                let digest = hex::encode(r.loaded.bytes_blake3);
                let verb = if r.already { "already registered" } else { "registered" };
                text.push(format!("{verb} {} at seq {} (blake3 {digest})", f.display(), r.seq));
                results.push(json!({"file": f, "ok": true, "seq": r.seq, "blake3": digest, "already": r.already}));
            }
            Err(RegisterError::Invalid(errs)) => {
                all_ok = false;
                text.push(format!("not registered {}: invalid", f.display()));
                text.push(listed(&errs));
                results.push(invalid_json(f, &errs));
            }
            Err(e) => return Err(e.into()),
        }
    }
    out.emit(&json!({"ok": all_ok, "files": results}), || text.join("\n"));
    Ok(if all_ok { ExitCode::SUCCESS } else { ExitCode::from(EXIT_INVALID_INPUT) })
}
