//! `mindxtrain export`: a run's result as a Hugging Face model directory that transformers
//! loads on its own (an adapter merged into the base it was trained on).

use super::EXIT_INVALID_INPUT;
use super::output::Output;
use anyhow::{Context, Result};
use clap::Args;
use mindxtrain_node::training::RecipeInput;
use mindxtrain_trainer::checkpoint::ADAPTER_CONFIG_FILE;
use mindxtrain_trainer::run;
use serde_json::json;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

#[derive(Args, Debug)]
pub struct ExportArgs {
    /// The recipe the model was trained with (its tokenizer and chat template).
    pub recipe: PathBuf,
    /// The run's final/ (or a checkpoint) directory: full weights or a PEFT adapter.
    #[arg(long)]
    pub checkpoint: PathBuf,
    /// The HF model directory to write (must not exist, or be empty).
    #[arg(long)]
    pub out: PathBuf,
    /// Fold an adapter into its base's weights (needed to export an adapter).
    #[arg(long)]
    pub merge: bool,
    /// The base an adapter applies to. Default: the base recorded beside the adapter;
    /// another one is refused unless --force-base.
    #[arg(long)]
    pub base: Option<PathBuf>,
    /// Use --base even though it is not the adapter's recorded base.
    #[arg(long, requires = "base")]
    pub force_base: bool,
}

pub fn run(args: ExportArgs, out: &Output) -> Result<ExitCode> {
    let refuse = |message: String| {
        out.emit(&json!({"ok": false, "error": message}), String::new);
        if !out.json {
            eprintln!("error: {message}");
        }
        Ok(ExitCode::from(EXIT_INVALID_INPUT))
    };
    let recipe = match RecipeInput::from_file(&args.recipe) {
        Ok(r) => r,
        Err(e) => return refuse(e.to_string()),
    };
    let adapter = args.checkpoint.join(ADAPTER_CONFIG_FILE).exists();
    if adapter && !args.merge {
        return refuse(format!(
            "{} is a LoRA adapter: pass --merge to fold it into its base, or load the directory as it is with \
             PEFT (PeftModel.from_pretrained over its base)",
            args.checkpoint.display()
        ));
    }
    if !args.checkpoint.join("config.json").exists() && !adapter {
        return refuse(format!("{}: neither HF weights (config.json) nor a PEFT adapter", args.checkpoint.display()));
    }
    if let Some(why) = occupied(&args.out) {
        return refuse(why);
    }
    let r = &recipe.loaded.recipe;
    let base = match run::adapter_base(r, &recipe.dir, &args.checkpoint, args.base.as_deref(), args.force_base) {
        Ok(b) => b,
        Err(e) if e.is_refusal() => return refuse(e.to_string()),
        Err(e) => return Err(e).with_context(|| format!("reading {}", args.checkpoint.display())),
    };
    // An empty directory is replaced: the export appears complete or not at all.
    if args.out.exists() {
        std::fs::remove_dir(&args.out).with_context(|| format!("replacing {}", args.out.display()))?;
    }
    let files = run::export_hf(r, &recipe.dir, &args.checkpoint, base.as_deref(), &args.out)
        .with_context(|| format!("exporting {} to {}", args.checkpoint.display(), args.out.display()))?;
    out.emit(&json!({"out": args.out, "merged": adapter, "base": base, "files": files}), || {
        let mut lines = vec![format!(
            "{}: an HF model directory ({})",
            args.out.display(),
            match &base {
                Some(b) if adapter => format!("the adapter merged into {}", b.display()),
                _ if adapter => "the adapter merged into its random-weight base".into(),
                _ => "the run's full weights".into(),
            }
        )];
        for f in &files {
            lines.push(format!("  {:<28} {:>12} bytes  blake3 {}", f.path, f.bytes, &f.blake3[..16]));
        }
        lines.push(format!(
            "load it with: AutoModelForCausalLM.from_pretrained(\"{0}\"), AutoTokenizer.from_pretrained(\"{0}\")",
            args.out.display()
        ));
        lines.join("\n")
    });
    Ok(ExitCode::SUCCESS)
}

/// Why `dir` cannot take an export: it holds something.
fn occupied(dir: &Path) -> Option<String> {
    match std::fs::read_dir(dir) {
        Ok(mut entries) => {
            entries.next().is_some().then(|| format!("{} is not empty: give a new directory for --out", dir.display()))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => Some(format!("--out {}: {e}", dir.display())),
    }
}
