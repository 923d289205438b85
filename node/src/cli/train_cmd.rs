//! `mindxtrain bench`, `train` and `eval`: the AOT plan, runs and evaluation.

use super::interrupt;
use super::output::Output;
use super::progress::Progress;
use super::{EXIT_INVALID_INPUT, plural, shell_words};
use anyhow::{Context, Result};
use clap::Args;
use indicatif::ProgressBar;
use mindxtrain_node::anchor::Deployment;
use mindxtrain_node::node;
use mindxtrain_node::training::launch::{self, Launch, RankCommand};
use mindxtrain_node::training::{
    self, Origin, PlanSource, RecipeInput, RecipeInputError, RecordedPlan, TrainError, TrainRequest, Trained,
};
use mindxtrain_trainer::data::{DataOptions, Dataset};
use mindxtrain_trainer::plan::Plan;
use mindxtrain_trainer::quantize::QUANTIZED_DIR;
use mindxtrain_trainer::run::{self, BaseRecord, RunError, RunSpec};
use serde_json::{Value, json};
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
    /// The layout the plan is for (a run on several ranks also gets the collective stage).
    #[command(flatten)]
    pub launch: LaunchArgs,
}

/// How a run is spread over ranks (docs/cli.md, "Several GPUs and nodes").
#[derive(Args, Debug, Clone, Default)]
pub struct LaunchArgs {
    /// Ranks (processes) on this node; default hardware.gpus (1 on a CPU recipe).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=64))]
    pub nproc_per_node: Option<u64>,
    /// Nodes taking part (each runs `train` with the same recipe and --rdzv).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=1024))]
    pub nnodes: u64,
    /// This node's index; node 0 records the run and hosts the rendezvous.
    #[arg(long, default_value_t = 0)]
    pub node_rank: u64,
    /// Node 0's rendezvous address HOST:PORT (default: loopback, a free port).
    #[arg(long, value_name = "HOST:PORT")]
    pub rdzv: Option<String>,
    /// Collective backend: nccl (GPUs) or tcp (CPU, or ranks sharing a GPU, host-staged). Given, even
    /// one rank runs through the distributed path.
    #[arg(long, value_name = "nccl|tcp")]
    pub collective: Option<mindxtrain_trainer::collective::Backend>,
    /// CUDA device of each local rank, comma-separated (default 0,1,…; `0,0` shares one GPU).
    #[arg(long, value_delimiter = ',')]
    pub devices: Option<Vec<usize>>,
}

impl LaunchArgs {
    pub fn options(&self) -> mindxtrain_node::training::launch::LaunchOptions {
        mindxtrain_node::training::launch::LaunchOptions {
            nproc_per_node: self.nproc_per_node.map(|n| n as usize),
            nnodes: self.nnodes as usize,
            node_rank: self.node_rank as usize,
            rdzv: self.rdzv.clone(),
            collective: self.collective,
            devices: self.devices.clone(),
        }
    }

    /// The flags as given, for the resume command a cancelled run prints.
    fn argv(&self) -> Vec<String> {
        let mut a = Vec::new();
        if let Some(n) = self.nproc_per_node {
            a.extend(["--nproc-per-node".into(), n.to_string()]);
        }
        if self.nnodes != 1 {
            a.extend(["--nnodes".into(), self.nnodes.to_string(), "--node-rank".into(), self.node_rank.to_string()]);
        }
        if let Some(r) = &self.rdzv {
            a.extend(["--rdzv".into(), r.clone()]);
        }
        if let Some(c) = self.collective {
            a.extend(["--collective".into(), c.name().into()]);
        }
        if let Some(d) = &self.devices {
            a.extend(["--devices".into(), d.iter().map(|d| d.to_string()).collect::<Vec<_>>().join(",")]);
        }
        a
    }
}

#[derive(Args, Debug)]
pub struct TrainArgs {
    pub recipe: PathBuf,
    /// The AOT plan from `mindxtrain bench`. Default: the recipe's autotune.plan, the run's
    /// own (OUT/plan.json) on --resume, else one measured now (within autotune.budget_seconds).
    #[arg(long)]
    pub plan: Option<PathBuf>,
    /// Run directory (checkpoints, final weights, eval.json); default runs/<meta.run_name>.
    /// Must be empty unless --resume or --force.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Continue the run in --out from its newest checkpoint (its plan and base as recorded).
    #[arg(long)]
    pub resume: bool,
    /// Replace an earlier run in --out (its files are deleted; its sealed manifest stays in the node).
    #[arg(long, conflicts_with = "resume")]
    pub force: bool,
    /// Start from this HF model directory (e.g. a previous run's final/); recorded as the run's base.
    #[arg(long)]
    pub init_from: Option<PathBuf>,
    /// With --resume: continue on --init-from even though it is not the recorded base.
    #[arg(long, requires = "init_from")]
    pub force_base: bool,
    /// Count and report malformed data lines instead of failing.
    #[arg(long)]
    pub skip_bad: bool,
    /// Holdout prompts generated and scored at each evaluation.
    #[arg(long, default_value_t = 64)]
    pub eval_prompts: usize,
    /// When stderr is not a terminal: one progress line every N steps (default: the recipe's
    /// train.log_every_steps).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub progress_every: Option<u64>,
    /// Also write TensorBoard event files (loss, lr, grad norm, tok/s, evals) to OUT/tensorboard.
    #[arg(long)]
    pub tensorboard: bool,
    #[command(flatten)]
    pub launch: LaunchArgs,
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
    /// Write the report here (eval.json format); an existing file is kept unless --force.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Replace an existing --out file.
    #[arg(long)]
    pub force: bool,
    /// The base an adapter applies to. Default: the base recorded beside the adapter
    /// (base_model.json); another one is refused unless --force-base.
    #[arg(long, visible_alias = "base")]
    pub init_from: Option<PathBuf>,
    /// Use --init-from even though it is not the adapter's recorded base.
    #[arg(long, requires = "init_from")]
    pub force_base: bool,
    #[arg(long, default_value_t = 64)]
    pub eval_prompts: usize,
}

/// Reads a recipe for a command; `Err` is the exit to return (the reason printed).
fn read_recipe(path: &Path, out: &Output) -> Result<std::result::Result<RecipeInput, ExitCode>> {
    match RecipeInput::from_file(path) {
        Ok(r) => Ok(Ok(r)),
        Err(RecipeInputError::Invalid(errs)) => {
            let msg = errs.iter().map(|e| e.to_string()).collect::<Vec<_>>().join("\n");
            Ok(Err(invalid(out, &msg)))
        }
        Err(e @ RecipeInputError::Io { .. }) => Ok(Err(invalid(out, &e.to_string()))),
    }
}

pub fn bench(args: BenchArgs, node_dir: &Path, out: &Output) -> Result<ExitCode> {
    let recipe = match read_recipe(&args.recipe, out)? {
        Ok(r) => r,
        Err(code) => return Ok(code),
    };
    // The probe times what the run will do, in the environment the run will have.
    training::env::reexec_with(&recipe.loaded.recipe.train.env).context("putting train.env in the environment")?;
    if args.out.exists() {
        let msg = format!("{}: already exists; a plan is never overwritten, choose another --out", args.out.display());
        return Ok(invalid(out, &msg));
    }
    let data = DataOptions { skip_bad: args.skip_bad, ..DataOptions::default() };
    let launch = match Launch::resolve(&args.launch.options(), &recipe.loaded.recipe) {
        Ok(l) => l,
        Err(e) => return Ok(invalid(out, &e)),
    };
    let spinner = spinner(out, &format!("measuring within {} s", recipe.loaded.recipe.autotune.budget_seconds));
    let mut plan = run::measure_plan(&recipe.loaded, &recipe.dir, None, data)
        .with_context(|| format!("autotune of {}", args.recipe.display()))?;
    if let Some(l) = &launch {
        let cmd = RankCommand::current(node_dir.to_path_buf(), args.recipe.clone(), recipe.dir.clone())?;
        let input = training::ProbeInput { loaded: &recipe.loaded, recipe_dir: &recipe.dir, init_from: None, data };
        let parallel = training::parallel_plan(input, l, &cmd, None)
            .with_context(|| format!("collective stage of {}", args.recipe.display()))?;
        plan.env.extend(parallel.collective.chosen.iter().map(|(k, v)| (k.clone(), Some(v.clone()))));
        plan.parallel = Some(parallel);
    }
    spinner.finish_and_clear();
    let recorded = RecordedPlan::write(plan, &args.out).with_context(|| format!("writing {}", args.out.display()))?;
    let digest = hex::encode(recorded.blake3);
    let seq = if node_dir.join("node.key").exists() {
        let (log, _, _) = node::open(node_dir)?;
        Some(recorded.record(&log)?)
    } else {
        None
    };
    // What --skip-bad left out of the data the plan was measured on.
    let skipped = if args.skip_bad {
        let r = &recipe.loaded.recipe;
        let tokenizer = run::base::tokenizer(r, &recipe.dir, None)?;
        Some(Dataset::from_recipe(r, &recipe.dir, &tokenizer, data)?.manifest.skipped_lines)
    } else {
        None
    };
    let plan = &recorded.plan;
    let c = plan.choices;
    out.emit(
        &json!({"plan": args.out, "blake3": digest, "choices": c, "seq": seq, "measurements": plan.measurements,
            "skipped_lines": skipped, "parallel": plan.parallel, "env": plan.env, "note": plan.note,
            "warnings": plan.warnings}),
        || {
            let mut lines = vec![format!(
                "plan {} (blake3 {digest}): threads {} micro-batch {} checkpointing {} gemm rows {} — {} candidates in {} ms{}",
                args.out.display(),
                c.threads,
                c.micro_batch,
                c.activation_checkpointing,
                c.gemm_rows,
                plan.measurements.len(),
                plan.elapsed_ms,
                if plan.truncated { " (budget spent before all were timed)" } else { "" }
            )];
            lines.extend(plan.note.iter().map(|n| format!("  {n}")));
            lines.extend(plan.warnings.iter().map(|w| format!("  warning: {w}")));
            for m in &plan.measurements {
                let t = m
                    .step_us
                    .map(|u| format!("{:.2} ms", u as f64 / 1000.0))
                    .unwrap_or_else(|| m.note.clone().unwrap_or_default());
                lines.push(format!(
                    "  threads {:>2} micro {:>3} ckpt {:<5} gemm rows {:>3} {t}",
                    m.choices.threads, m.choices.micro_batch, m.choices.activation_checkpointing, m.choices.gemm_rows
                ));
            }
            if let Some(p) = &plan.parallel {
                lines.push(format!(
                    "  {} rank(s) over {}, {} sharding, global batch {} ({} per device × {} accumulated × {})",
                    p.world_size,
                    p.backend.name(),
                    p.sharding.name(),
                    p.global_batch,
                    p.per_device,
                    p.grad_accum,
                    p.world_size
                ));
                match &p.collective.skipped {
                    Some(why) => lines.push(format!("  collective stage: skipped ({why})")),
                    None => {
                        for cand in &p.collective.candidates {
                            let env = if cand.env.is_empty() {
                                "(backend defaults)".to_string()
                            } else {
                                cand.env.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(" ")
                            };
                            let t = cand.score_us.map(|u| format!("{:.1} ms", u / 1000.0));
                            lines.push(format!("  {env}: {}", t.or(cand.note.clone()).unwrap_or_default()));
                        }
                    }
                }
            }
            if let Some(n) = skipped {
                lines.push(format!("  data: {} skipped ({})", plural(n, "malformed line"), "--skip-bad"));
            }
            lines.join("\n")
        },
    );
    Ok(ExitCode::SUCCESS)
}

pub fn train(args: TrainArgs, node_dir: &Path, out: &Output) -> Result<ExitCode> {
    let recipe = match read_recipe(&args.recipe, out)? {
        Ok(r) => r,
        Err(code) => return Ok(code),
    };
    training::env::reexec_with(&recipe.loaded.recipe.train.env).context("putting train.env in the environment")?;
    let r = &recipe.loaded.recipe;
    let out_dir = args.out.clone().unwrap_or_else(|| Path::new("runs").join(&r.meta.run_name));
    let launch = match Launch::resolve(&args.launch.options(), r) {
        Ok(l) => l,
        Err(e) => return Ok(invalid(out, &e)),
    };
    if let Some(l) = launch.as_ref().filter(|l| l.node_rank > 0) {
        // Another node's launcher: its ranks join node 0's run, which records everything.
        let cmd = RankCommand::current(node_dir.to_path_buf(), args.recipe.clone(), recipe.dir.clone())?;
        return match launch::follow(l, &cmd) {
            Ok(()) => {
                out.emit(&json!({"node_rank": l.node_rank, "ranks": l.ranks_per_node, "ok": true}), || {
                    format!("node {}: its {} rank(s) finished; node 0 recorded the run", l.node_rank, l.ranks_per_node)
                });
                Ok(ExitCode::SUCCESS)
            }
            Err(e) => Err(anyhow::anyhow!("node {}: {e}", l.node_rank)),
        };
    }
    let (log, key, _) = node::open(node_dir).with_context(|| format!("opening node {}", node_dir.display()))?;
    let every = args.progress_every.unwrap_or(u64::from(r.train.log_every_steps.max(1)));
    let tensorboard = args.tensorboard.then(|| out_dir.join("tensorboard"));
    let req = TrainRequest {
        recipe,
        plan: args.plan.clone(),
        out_dir: out_dir.clone(),
        resume: args.resume,
        force: args.force,
        init_from: args.init_from.clone(),
        force_base: args.force_base,
        data: DataOptions { skip_bad: args.skip_bad, ..DataOptions::default() },
        eval_prompts: args.eval_prompts,
        origin: Origin::Cli,
        launch,
        recipe_path: Some(args.recipe.clone()),
    };
    let guard = interrupt::Guard::install();
    let mut progress = Progress::new(out.json, every, tensorboard, &guard);
    let result = training::train_and_seal(&log, &key, node_dir, &req, &mut progress);
    if let Some(problem) = progress.finish() {
        eprintln!("warning: {problem}");
    }
    let tb = progress.tensorboard_dir().cloned();
    match result {
        Ok(trained) => {
            report(out, node_dir, &trained, &out_dir, tb.as_deref());
            Ok(ExitCode::SUCCESS)
        }
        Err(TrainError::Run(RunError::Cancelled { step })) => {
            let signal = guard.received().unwrap_or(interrupt::Signal::Interrupt);
            Ok(cancelled(out, &args, node_dir, &out_dir, step, signal))
        }
        Err(e) if e.is_invalid_input() => Ok(invalid(out, &e.to_string())),
        Err(e) => Err(anyhow::Error::new(e).context(format!("training {}", args.recipe.display()))),
    }
}

/// The command that continues the run: the recipe and directory as given, with `--resume`
/// (the plan and the base are the run's own, recorded in its directory).
fn resume_command(args: &TrainArgs, node_dir: &Path, out_dir: &Path) -> Vec<String> {
    let mut argv: Vec<String> = ["mindxtrain", "--node-dir"].map(String::from).to_vec();
    argv.push(node_dir.display().to_string());
    argv.extend(["train".into(), args.recipe.display().to_string(), "--out".into(), out_dir.display().to_string()]);
    argv.push("--resume".into());
    if args.skip_bad {
        argv.push("--skip-bad".into());
    }
    if args.eval_prompts != 64 {
        argv.extend(["--eval-prompts".into(), args.eval_prompts.to_string()]);
    }
    if let Some(n) = args.progress_every {
        argv.extend(["--progress-every".into(), n.to_string()]);
    }
    if args.tensorboard {
        argv.push("--tensorboard".into());
    }
    argv.extend(args.launch.argv());
    argv
}

fn cancelled(
    out: &Output,
    args: &TrainArgs,
    node_dir: &Path,
    out_dir: &Path,
    step: u64,
    signal: interrupt::Signal,
) -> ExitCode {
    let argv = resume_command(args, node_dir, out_dir);
    let command = shell_words(&argv);
    let checkpoint = out_dir.join("checkpoints").join(format!("step-{step:08}"));
    out.emit(
        &json!({"cancelled": true, "signal": signal.name(), "step": step, "checkpoint": checkpoint,
            "resume": {"argv": argv, "command": command}}),
        String::new,
    );
    eprintln!(
        "{}: stopped after step {step}; checkpoint {}, run.cancelled recorded\nresume with:\n  {command}",
        signal.name(),
        checkpoint.display()
    );
    ExitCode::from(signal.exit_code())
}

/// The end of a run: the losses side by side, the data, the base and where every output went.
fn report(out: &Output, node_dir: &Path, t: &Trained, out_dir: &Path, tensorboard: Option<&Path>) {
    let s = &t.summary;
    let held_out = s.eval.as_ref().and_then(|e| e.loss);
    let em = s.eval.as_ref().and_then(|e| e.exact_match);
    let manifest_b3 = hex::encode(t.sealed.digests.blake3);
    let latest = out_dir.join("checkpoints").join(format!("step-{:08}", s.steps));
    let eval_json = out_dir.join("eval.json");
    // What anchors it from here: the registry first when there is none yet.
    let anchor_steps: &[&str] = if Deployment::path(node_dir).exists() {
        &["mindxtrain anchor"]
    } else {
        &["mindxtrain chain deploy", "mindxtrain anchor"]
    };
    let anchor_hint = anchor_steps.iter().map(|c| format!("`{c}`")).collect::<Vec<_>>().join(", then ");
    let plan_source = match &t.plan.source {
        PlanSource::Given(p) => json!({"source": "given", "given": p}),
        PlanSource::Probed => json!({"source": "probed"}),
        PlanSource::Kept => json!({"source": "kept"}),
    };
    let d = &s.dataset;
    let value = json!({
        "run_id": s.run_id, "steps": s.steps, "start_step": s.start_step, "final_loss": s.final_loss,
        "held_out_loss": held_out, "tokens": s.tokens, "seconds": s.seconds, "final_dir": s.final_dir,
        "files": s.files, "eval": s.eval, "dataset_blake3": s.dataset_digest, "base": s.base,
        "data": {"read_examples": d.read_examples, "train_examples": d.train_examples,
            "holdout_examples": d.holdout_examples, "skipped_lines": d.skipped_lines, "skipped": d.skipped,
            "hub": d.hub_source()},
        "plan": {"file": t.plan.path, "blake3": hex::encode(t.plan.blake3), "choices": t.plan.plan.choices,
            "how": plan_source},
        "outputs": {"dir": out_dir, "final": s.final_dir, "checkpoint": latest, "eval": eval_json.is_file().then_some(&eval_json),
            "run": out_dir.join("run.json"), "dataset": out_dir.join("dataset.json"), "plan": t.plan.path,
            "tensorboard": tensorboard, "manifest": t.sealed.path, "receipt": t.receipt,
            "quantized": out_dir.join(QUANTIZED_DIR).is_dir().then(|| out_dir.join(QUANTIZED_DIR))},
        "manifest": {"file": t.sealed.path, "blake3": manifest_b3, "seq": t.sealed.seq},
        "energy": t.energy,
        "next": {"anchor": anchor_steps, "receipt": format!("mindxtrain receipt export {}", s.run_id)},
    });
    out.emit(&value, || {
        let f = |v: Option<f64>| v.map_or_else(|| "-".into(), |l| format!("{l:.4}"));
        let resumed = if s.start_step > 0 { format!(" (resumed at step {})", s.start_step) } else { String::new() };
        let mut lines =
            vec![format!("{}: {} steps in {}{resumed}", s.run_id, s.steps, super::progress::duration(s.seconds))];
        let exact = s.eval.as_ref().map_or_else(String::new, |e| {
            format!(
                ", exact match {}/{}{}",
                e.exact_match_correct,
                e.exact_match_total,
                em.map_or_else(String::new, |x| format!(" ({:.1}%)", x * 100.0))
            )
        });
        lines.push(format!("  loss      training {} (last step), held-out {}{exact}", f(s.final_loss), f(held_out)));
        let mut data = format!(
            "  data      {}, {} held out, {} skipped",
            plural(d.train_examples, "training example"),
            d.holdout_examples,
            plural(d.skipped_lines, "malformed line")
        );
        for skipped in d.skipped.iter().take(3) {
            data.push_str(&format!("\n              {skipped:?}"));
        }
        lines.push(data);
        lines.push(format!("  base      {}", s.base.describe()));
        let how = match &t.plan.source {
            PlanSource::Given(p) => format!("given as {}", p.display()),
            PlanSource::Probed => "measured for this run".into(),
            PlanSource::Kept => "the run's own".into(),
        };
        lines.push(format!("  plan      {} ({how})", t.plan.path.display()));
        lines.push(format!("  weights   {} (with tokenizer.json and the chat template)", s.final_dir.display()));
        lines.push(format!("  latest    {}", latest.display()));
        if eval_json.is_file() {
            lines.push(format!("  eval      {}", eval_json.display()));
        }
        lines.push(format!("  run       {} (run id, recipe, plan, base)", out_dir.join("run.json").display()));
        if let Some(tb) = tensorboard {
            lines.push(format!("  curves    {} (tensorboard --logdir {})", tb.display(), tb.display()));
        }
        lines.push(format!("  manifest  {} (blake3 {manifest_b3})", t.sealed.path.display()));
        lines.push(format!("  receipt   {} (not anchored yet)", t.receipt.display()));
        lines.push(match (t.energy.kwh, &t.energy.reason) {
            (Some(kwh), None) => format!("  energy    {kwh:.6} kWh"),
            (Some(kwh), Some(why)) => format!("  energy    {kwh:.6} kWh (partial: {why})"),
            (None, why) => format!("  energy    not measured: {}", why.as_deref().unwrap_or("no counter")),
        });
        lines.push(format!(
            "next: {anchor_hint} to anchor it on chain, then `mindxtrain receipt export {}` for the anchored receipt",
            s.run_id
        ));
        lines.join("\n")
    });
}

pub fn eval(args: EvalArgs, out: &Output) -> Result<ExitCode> {
    let recipe = match read_recipe(&args.recipe, out)? {
        Ok(r) => r,
        Err(code) => return Ok(code),
    };
    if let Some(path) = &args.out
        && path.exists()
        && !args.force
    {
        let msg = format!("{} exists: pass --force to replace it, or give another --out", path.display());
        return Ok(invalid(out, &msg));
    }
    let (plan, plan_blake3) = match args.plan.as_deref().map(Plan::read) {
        Some(Ok(p)) => p,
        Some(Err(e)) => return Ok(invalid(out, &e.to_string())),
        None => {
            let threads = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
            let choices = mindxtrain_trainer::plan::Choices::unmeasured(threads);
            (Plan::new(recipe.loaded.bytes_blake3, "cpu", choices, vec![], 0, 0, false), [0; 32])
        }
    };
    let base = match run::adapter_base(
        &recipe.loaded.recipe,
        &recipe.dir,
        &args.checkpoint,
        args.init_from.as_deref(),
        args.force_base,
    ) {
        Ok(b) => b,
        Err(e) if e.is_refusal() => return Ok(invalid(out, &e.to_string())),
        Err(e) => return Err(e).with_context(|| format!("reading {}", args.checkpoint.display())),
    };
    let spec = RunSpec {
        recipe: recipe.loaded,
        recipe_dir: recipe.dir,
        plan,
        plan_blake3,
        out_dir: PathBuf::new(),
        resume: false,
        data: DataOptions::default(),
        init_from: base.clone(),
        // Checked just above: the base to load is settled.
        force_base: true,
        eval_prompts: args.eval_prompts,
        context: Default::default(),
    };
    let spinner = spinner(out, "evaluating");
    // Benchmark tasks take a while: their progress lines replace the spinner's message.
    let report =
        match run::evaluate_checkpoint(&spec, &args.checkpoint, &mut |line| spinner.set_message(line.to_owned())) {
            Ok(r) => r,
            Err(e) if e.is_refusal() => return Ok(invalid(out, &e.to_string())),
            Err(e) => return Err(e).with_context(|| format!("evaluating {}", args.checkpoint.display())),
        };
    spinner.finish_and_clear();
    if let Some(path) = &args.out {
        let mut bytes = serde_json::to_vec_pretty(&report)?;
        bytes.push(b'\n');
        std::fs::write(path, bytes).with_context(|| format!("writing {}", path.display()))?;
    }
    let mut value = serde_json::to_value(&report)?;
    value["base"] = base.as_ref().map_or(Value::Null, |b| json!(b));
    out.emit(&value, || {
        let mut text = format!(
            "held-out loss {} (perplexity {}), exact match {}/{}",
            report.loss.map(|l| format!("{l:.4}")).unwrap_or_else(|| "-".into()),
            report.perplexity.map(|p| format!("{p:.2}")).unwrap_or_else(|| "-".into()),
            report.exact_match_correct,
            report.exact_match_total
        );
        for t in report.tasks.iter().flat_map(|t| &t.scores) {
            let stderr = t.stderr.map(|e| format!(" ± {e:.4}")).unwrap_or_default();
            text.push_str(&format!("\n  {} {} ({}): {:.4}{stderr} over {}", t.task, t.metric, t.filter, t.value, t.n));
        }
        if let Some(b) = &base {
            text.push_str(&format!("\n  adapter over {}", b.display()));
        } else if let Ok(Some(BaseRecord::RandomInit { seed })) = BaseRecord::read(&args.checkpoint) {
            text.push_str(&format!("\n  adapter over random weights from seed {seed} (as trained)"));
        }
        if let Some(path) = &args.out {
            text.push_str(&format!("\n  report written to {}", path.display()));
        }
        text
    });
    Ok(ExitCode::SUCCESS)
}

fn invalid(out: &Output, message: &str) -> ExitCode {
    out.emit(&json!({"ok": false, "error": message}), String::new);
    if !out.json {
        eprintln!("error: {message}");
    }
    ExitCode::from(EXIT_INVALID_INPUT)
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
