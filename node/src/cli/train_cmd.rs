//! `mindxtrain bench`, `train` and `eval`: the AOT plan, runs and evaluation.

use super::output::Output;
use super::{EXIT_INVALID_INPUT, file_name};
use anyhow::{Context, Result};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use mindxtrain_node::log::AppendRequest;
use mindxtrain_node::manifest::NamedBytes;
use mindxtrain_node::training::{self, FinishedRun, LogSink, PLAN_EMITTED};
use mindxtrain_node::{fsutil, node, recipes};
use mindxtrain_trainer::data::DataOptions;
use mindxtrain_trainer::plan::Plan;
use mindxtrain_trainer::recipe::{LoadedRecipe, Recipe};
use mindxtrain_trainer::run::{self, Observer, RunSpec, StepReport};
use serde_json::json;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

#[derive(Args, Debug)]
pub struct BenchArgs {
    /// The recipe whose shapes and data are measured.
    pub recipe: PathBuf,
    /// Where the plan is written (refuses to overwrite: a plan's identity is its bytes).
    #[arg(long)]
    pub out: PathBuf,
    /// Count and report malformed data lines instead of failing.
    #[arg(long)]
    pub skip_bad: bool,
}

#[derive(Args, Debug)]
pub struct TrainArgs {
    pub recipe: PathBuf,
    /// The AOT plan from `mindxtrain bench` (default: the recipe's autotune.plan).
    #[arg(long)]
    pub plan: Option<PathBuf>,
    /// Run directory (checkpoints, final weights, eval.json).
    #[arg(long, default_value = "runs/latest")]
    pub out: PathBuf,
    /// Continue from the newest complete checkpoint in --out.
    #[arg(long)]
    pub resume: bool,
    /// Start from this HF checkpoint directory (e.g. a previous run's final/).
    #[arg(long)]
    pub init_from: Option<PathBuf>,
    /// Count and report malformed data lines instead of failing.
    #[arg(long)]
    pub skip_bad: bool,
    /// Holdout prompts generated and scored at each evaluation.
    #[arg(long, default_value_t = 64)]
    pub eval_prompts: usize,
}

#[derive(Args, Debug)]
pub struct EvalArgs {
    pub recipe: PathBuf,
    /// A run's final/ or checkpoint directory (HF weights or PEFT adapter).
    #[arg(long)]
    pub checkpoint: PathBuf,
    /// Plan for the thread count (default: all cores).
    #[arg(long)]
    pub plan: Option<PathBuf>,
    /// Write the report here (eval.json format).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Base weights for an adapter checkpoint (HF directory), when the recipe has no model.path.
    #[arg(long)]
    pub init_from: Option<PathBuf>,
    #[arg(long, default_value_t = 64)]
    pub eval_prompts: usize,
}

fn load_recipe(path: &Path) -> Result<std::result::Result<LoadedRecipe, String>> {
    Ok(Recipe::check_path(path).map_err(|errs| errs.iter().map(|e| e.to_string()).collect::<Vec<_>>().join("\n")))
}

fn recipe_dir(path: &Path) -> PathBuf {
    path.parent().map(Path::to_path_buf).unwrap_or_default()
}

pub fn bench(args: BenchArgs, node_dir: &Path, out: &Output) -> Result<ExitCode> {
    let loaded = match load_recipe(&args.recipe)? {
        Ok(l) => l,
        Err(msg) => return invalid(out, &msg),
    };
    if args.out.exists() {
        return invalid(
            out,
            &format!("{}: already exists; a plan is never overwritten, choose another --out", args.out.display()),
        );
    }
    let spinner = spinner(out, &format!("measuring within {} s", loaded.recipe.autotune.budget_seconds));
    let plan = run::measure_plan(&loaded, &recipe_dir(&args.recipe), DataOptions { skip_bad: args.skip_bad })
        .with_context(|| format!("autotune of {}", args.recipe.display()))?;
    spinner.finish_and_clear();
    let bytes = plan.to_bytes();
    fsutil::write_new_durably(&args.out, &bytes, 0o644).with_context(|| format!("writing {}", args.out.display()))?;
    let digest = hex::encode(blake3::hash(&bytes).as_bytes());
    let seq = if node_dir.join("node.key").exists() {
        let (log, _, _) = node::open(node_dir)?;
        let data = json!({"plan_blake3": digest, "recipe_blake3": plan.recipe_blake3, "choices": plan.choices,
            "file": args.out.display().to_string(), "elapsed_ms": plan.elapsed_ms, "truncated": plan.truncated});
        Some(log.append(AppendRequest::new(PLAN_EMITTED, digest.clone(), data).with_id(format!("plan:{digest}")))?.seq)
    } else {
        None
    };
    let c = plan.choices;
    out.emit(
        &json!({"plan": args.out, "blake3": digest, "choices": c, "seq": seq, "measurements": plan.measurements}),
        || {
            let mut lines = vec![format!(
                "plan {} (blake3 {digest}): threads {} micro-batch {} checkpointing {} — {} candidates in {} ms{}",
                args.out.display(),
                c.threads,
                c.micro_batch,
                c.activation_checkpointing,
                plan.measurements.len(),
                plan.elapsed_ms,
                if plan.truncated { " (budget spent before all were timed)" } else { "" }
            )];
            for m in &plan.measurements {
                let t = m
                    .step_us
                    .map(|u| format!("{:.2} ms", u as f64 / 1000.0))
                    .unwrap_or_else(|| m.note.clone().unwrap_or_default());
                lines.push(format!(
                    "  threads {:>2} micro {:>3} ckpt {:<5} {t}",
                    m.choices.threads, m.choices.micro_batch, m.choices.activation_checkpointing
                ));
            }
            lines.join("\n")
        },
    );
    Ok(ExitCode::SUCCESS)
}

/// A plan read for a run: the plan, the BLAKE3 of its bytes, and where it was read.
type ReadPlan = (Plan, [u8; 32], PathBuf);

fn read_plan(
    explicit: Option<&PathBuf>,
    loaded: &LoadedRecipe,
    recipe: &Path,
) -> Result<std::result::Result<ReadPlan, String>> {
    let path = match (explicit, &loaded.recipe.autotune.plan) {
        (Some(p), _) => p.clone(),
        (None, Some(p)) => recipe_dir(recipe).join(p),
        (None, None) => {
            return Ok(Err(format!(
                "no plan: run `mindxtrain bench {} --out plan.json` first and pass --plan plan.json",
                recipe.display()
            )));
        }
    };
    Ok(Plan::read(&path).map(|(plan, hash)| (plan, hash, path)).map_err(|e| e.to_string()))
}

pub fn train(args: TrainArgs, node_dir: &Path, out: &Output) -> Result<ExitCode> {
    let loaded = match load_recipe(&args.recipe)? {
        Ok(l) => l,
        Err(msg) => return invalid(out, &msg),
    };
    let (plan, plan_blake3, plan_path) = match read_plan(args.plan.as_ref(), &loaded, &args.recipe)? {
        Ok(p) => p,
        Err(msg) => return invalid(out, &msg),
    };
    if let Err(e) = plan
        .check_recipe(&loaded.bytes_blake3, &args.plan.as_ref().map(|p| p.display().to_string()).unwrap_or_default())
    {
        return invalid(out, &e.to_string());
    }
    let (log, key, _) = node::open(node_dir).with_context(|| format!("opening node {}", node_dir.display()))?;
    let src = std::fs::read_to_string(&args.recipe).with_context(|| format!("reading {}", args.recipe.display()))?;
    recipes::register(&log, &args.recipe.display().to_string(), &src)?;
    let plan_bytes = std::fs::read(&plan_path).with_context(|| format!("reading {}", plan_path.display()))?;
    let hardware = serde_json::to_value(&plan.machine)?;
    let spec = RunSpec {
        recipe: loaded,
        recipe_dir: recipe_dir(&args.recipe),
        plan,
        plan_blake3,
        out_dir: args.out.clone(),
        resume: args.resume,
        data: DataOptions { skip_bad: args.skip_bad },
        init_from: args.init_from.clone(),
        eval_prompts: args.eval_prompts,
    };
    let mut bar = Bar::new(out);
    let summary = run::train(&spec, &mut LogSink::new(&log), &mut bar)
        .with_context(|| format!("training {}", args.recipe.display()))?;
    bar.finish();
    let run = FinishedRun {
        summary: &summary,
        recipe: NamedBytes { name: file_name(&args.recipe), bytes: src.into_bytes() },
        plan: Some(NamedBytes { name: file_name(&plan_path), bytes: plan_bytes }),
        out_dir: &args.out,
        base_dir: args.init_from.as_deref(),
        hardware,
    };
    let sealed = training::seal_run(&log, &key, node_dir, run).context("sealing the run's manifest")?;
    let manifest_b3 = hex::encode(sealed.digests.blake3);
    let em = summary.eval.as_ref().and_then(|e| e.exact_match);
    out.emit(
        &json!({"run_id": summary.run_id, "steps": summary.steps, "final_loss": summary.final_loss, "tokens": summary.tokens,
            "seconds": summary.seconds, "final_dir": summary.final_dir, "files": summary.files, "eval": summary.eval,
            "dataset_blake3": summary.dataset_digest, "manifest": {"file": sealed.path, "blake3": manifest_b3, "seq": sealed.seq}}),
        || {
            format!(
                "{}: {} steps in {:.1} s, final loss {}, exact match {}\n  weights: {}\n  manifest: {} (blake3 {manifest_b3}, requested for anchoring)",
                summary.run_id,
                summary.steps,
                summary.seconds,
                summary.final_loss.map(|l| format!("{l:.4}")).unwrap_or_else(|| "-".into()),
                em.map(|e| format!("{:.1}%", e * 100.0)).unwrap_or_else(|| "-".into()),
                summary.final_dir.display(),
                sealed.path.display()
            )
        },
    );
    Ok(ExitCode::SUCCESS)
}

pub fn eval(args: EvalArgs, out: &Output) -> Result<ExitCode> {
    let loaded = match load_recipe(&args.recipe)? {
        Ok(l) => l,
        Err(msg) => return invalid(out, &msg),
    };
    let (plan, plan_blake3) = match args.plan.as_deref().map(Plan::read) {
        Some(Ok(p)) => p,
        Some(Err(e)) => return invalid(out, &e.to_string()),
        None => {
            let threads = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
            let choices = mindxtrain_trainer::plan::Choices::unmeasured(threads);
            (Plan::new(loaded.bytes_blake3, "cpu", choices, vec![], 0, 0, false), [0; 32])
        }
    };
    let spec = RunSpec {
        recipe: loaded,
        recipe_dir: recipe_dir(&args.recipe),
        plan,
        plan_blake3,
        out_dir: PathBuf::new(),
        resume: false,
        data: DataOptions::default(),
        init_from: args.init_from.clone(),
        eval_prompts: args.eval_prompts,
    };
    let spinner = spinner(out, "evaluating");
    let report = run::evaluate_checkpoint(&spec, &args.checkpoint)
        .with_context(|| format!("evaluating {}", args.checkpoint.display()))?;
    spinner.finish_and_clear();
    if let Some(path) = &args.out {
        let mut bytes = serde_json::to_vec_pretty(&report)?;
        bytes.push(b'\n');
        std::fs::write(path, bytes).with_context(|| format!("writing {}", path.display()))?;
    }
    out.emit(&serde_json::to_value(&report)?, || {
        format!(
            "held-out loss {} (perplexity {}), exact match {}/{}",
            report.loss.map(|l| format!("{l:.4}")).unwrap_or_else(|| "-".into()),
            report.perplexity.map(|p| format!("{p:.2}")).unwrap_or_else(|| "-".into()),
            report.exact_match_correct,
            report.exact_match_total
        )
    });
    Ok(ExitCode::SUCCESS)
}

fn invalid(out: &Output, message: &str) -> Result<ExitCode> {
    out.emit(&json!({"ok": false, "error": message}), String::new);
    if !out.json {
        eprintln!("error: {message}");
    }
    Ok(ExitCode::from(EXIT_INVALID_INPUT))
}

pub(super) fn spinner(out: &Output, message: &str) -> ProgressBar {
    if out.json {
        return ProgressBar::hidden();
    }
    let pb = ProgressBar::new_spinner();
    pb.set_message(message.to_string());
    pb.enable_steady_tick(std::time::Duration::from_millis(120));
    pb
}

/// The training progress bar: loss, lr, tok/s and ETA (hidden under --json).
struct Bar {
    pb: ProgressBar,
}

impl Bar {
    fn new(out: &Output) -> Bar {
        let pb = if out.json { ProgressBar::hidden() } else { ProgressBar::new(0) };
        pb.set_style(
            ProgressStyle::with_template("{bar:30} {pos}/{len} steps  {msg}  eta {eta}")
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        Bar { pb }
    }

    fn finish(&self) {
        self.pb.finish_and_clear();
    }
}

impl Observer for Bar {
    fn started(&mut self, first_step: u64, total_steps: u64) {
        self.pb.set_length(total_steps);
        self.pb.set_position(first_step);
    }

    fn step(&mut self, r: &StepReport) {
        self.pb.set_position(r.step);
        self.pb.set_message(format!("loss {:.4}  lr {:.2e}  {:.0} tok/s", r.loss, r.lr, r.tokens_per_s));
    }

    fn note(&mut self, message: &str) {
        self.pb.println(message);
    }
}

/// The demo's training part: measure a plan and train the tiny model from scratch, then
/// measure again and LoRA-tune it, then evaluate. Uses the embedded recipes, so it needs
/// no file from the repository. Returns the summary the demo prints.
pub fn demo_step(
    log: &mindxtrain_node::log::EventLog,
    key: &mindxtrain_node::identity::Identity,
    node_dir: &Path,
    work: &Path,
    say: &dyn Fn(String),
) -> Result<serde_json::Value> {
    let recipe = |name: &str| -> Result<(LoadedRecipe, &'static str)> {
        let src = recipes::EMBEDDED_RECIPES
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, s)| *s)
            .with_context(|| format!("embedded recipe {name} missing"))?;
        Ok((Recipe::check_str(src, name).map_err(|e| anyhow::anyhow!("{e}"))?, src))
    };
    std::fs::create_dir_all(work).with_context(|| format!("creating {}", work.display()))?;
    let mut phases = Vec::new();
    let mut init_from = None;
    for (name, label) in [
        ("tiny_cpu_pretrain.yaml", "pretrain from scratch (cpt)"),
        ("tiny_cpu_lora.yaml", "LoRA on the pretrained base"),
    ] {
        let (loaded, src) = recipe(name)?;
        // The recipe as a file too, so the receipt can be checked against real bytes.
        let recipe_path = work.join(name);
        fsutil::write_new_durably(&recipe_path, src.as_bytes(), 0o644)?;
        let plan_path = work.join(format!("{}.plan.json", loaded.recipe.meta.run_name));
        let training::RecordedPlan { plan, bytes, blake3: plan_blake3, .. } =
            training::measure_and_record_plan(log, &loaded, work, &plan_path)?;
        let digest = hex::encode(plan_blake3);
        let c = plan.choices;
        say(format!(
            "      {label}: plan threads {} micro-batch {} checkpointing {} ({} candidates timed in {} ms)",
            c.threads,
            c.micro_batch,
            c.activation_checkpointing,
            plan.measurements.len(),
            plan.elapsed_ms
        ));
        let out_dir = work.join(&loaded.recipe.meta.run_name);
        let spec = RunSpec {
            recipe: loaded,
            recipe_dir: work.to_path_buf(),
            plan,
            plan_blake3,
            out_dir,
            resume: false,
            data: DataOptions::default(),
            init_from: init_from.clone(),
            eval_prompts: 64,
        };
        let summary = run::train(&spec, &mut LogSink::new(log), &mut run::Quiet)?;
        let finished = FinishedRun {
            summary: &summary,
            recipe: NamedBytes { name: name.to_string(), bytes: src.as_bytes().to_vec() },
            plan: Some(NamedBytes { name: file_name(&plan_path), bytes: bytes.clone() }),
            out_dir: &spec.out_dir,
            base_dir: init_from.as_deref(),
            hardware: serde_json::to_value(&spec.plan.machine)?,
        };
        let sealed = training::seal_run(log, key, node_dir, finished)?;
        let em = summary.eval.as_ref().and_then(|e| e.exact_match);
        say(format!(
            "      {}: {} steps in {:.1} s, loss {}, exact match {}",
            summary.run_id,
            summary.steps,
            summary.seconds,
            summary.final_loss.map(|l| format!("{l:.3}")).unwrap_or_else(|| "-".into()),
            em.map(|e| format!("{:.1}%", e * 100.0)).unwrap_or_else(|| "-".into())
        ));
        phases.push(json!({"recipe": name, "run_id": summary.run_id, "steps": summary.steps, "final_loss": summary.final_loss,
            "seconds": summary.seconds, "exact_match": em, "final_dir": summary.final_dir, "files": summary.files, "plan_blake3": digest,
            "out_dir": spec.out_dir, "recipe_file": recipe_path, "plan_file": plan_path,
            "manifest": {"file": sealed.path, "blake3": hex::encode(sealed.digests.blake3), "seq": sealed.seq}}));
        init_from = Some(summary.final_dir.clone());
    }
    Ok(json!(phases))
}
