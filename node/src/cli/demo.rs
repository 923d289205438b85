//! `mindxtrain demo`: the whole flow on embedded defaults, in a temporary node.
//!
//! The flow: create a node, register every embedded recipe, measure plans and train
//! (pretraining, then LoRA), seal each run's manifest, sign a log checkpoint, anchor it
//! and the manifests in one batch on an embedded anvil, export and verify the LoRA run's
//! receipt, serve the LoRA model behind x402 on anvil (a paid chat completion, then a
//! rental used up), then audit the log read-only and prove every recipe event against
//! the checkpoint. Each later capability adds its step here.

use super::output::Output;
use anyhow::{Context, Result, bail, ensure};
use clap::Args;
use mindxtrain_chain::merkle;
use mindxtrain_node::anchor::session;
use mindxtrain_node::fsutil;
use mindxtrain_node::identity::Identity;
use mindxtrain_node::log::checkpoint::{self, Checkpoint};
use mindxtrain_node::log::verify::{self, TrustedKey};
use mindxtrain_node::log::{AppendRequest, LogReader};
use mindxtrain_node::node;
use mindxtrain_node::receipt;
use mindxtrain_node::recipes::{self, EMBEDDED_RECIPES};
use mindxtrain_node::training::{self, Origin, RecipeInput, TrainRequest};
use mindxtrain_trainer::run::{EvalReport, FamilyScore};
use serde_json::json;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

#[derive(Args, Debug)]
pub struct DemoArgs {
    /// Keep the node in this directory (must not exist yet) instead of a temporary one.
    #[arg(long)]
    keep: Option<PathBuf>,
    /// Serve the trained model for the paid calls from this device (cpu, cuda or cuda:N;
    /// training stays on the CPU). A CUDA device needs a binary built with the cuda feature.
    #[arg(long, value_parser = super::serve_cmd::parse_device, default_value = "cpu")]
    serve_device: super::serve_cmd::DeviceArg,
}

pub fn run(args: DemoArgs, out: &Output) -> Result<ExitCode> {
    let started = Instant::now();
    // Opened first: a missing GPU fails before a minute of training, not after it.
    let serve_device = args.serve_device.open()?;
    let temp;
    let dir = match &args.keep {
        Some(d) => {
            if d.exists() {
                bail!("{} already exists; pass a new directory to --keep", d.display());
            }
            d.clone()
        }
        None => {
            temp = tempfile::Builder::new().prefix("mindxtrain-demo-").tempdir()?;
            temp.path().join("node")
        }
    };
    let say = |s: String| {
        if !out.json {
            println!("{s}");
        }
    };

    say(format!("[1/6] initialising a node in {}", dir.display()));
    node::init(&dir)?;
    let (log, id, _) = node::open(&dir)?;
    let log = std::sync::Arc::new(log);

    say(format!("[2/6] checking {} embedded recipes, registering those this build runs", EMBEDDED_RECIPES.len()));
    let (mut registered, mut refused) = (Vec::new(), Vec::new());
    for (name, src) in EMBEDDED_RECIPES {
        // A recipe that asks for what this build does not carry out is refused by name, never
        // registered and then ignored (docs/recipes.md, "The field contract").
        if let Err(errors) = mindxtrain_trainer::recipe::Recipe::check_str(src, name) {
            let mut fields: Vec<&str> = errors.iter().map(|e| e.path()).collect();
            fields.dedup();
            say(format!("      refused  {name:<28} not built: {}", fields.join(", ")));
            refused.push(json!({"recipe": name, "fields": fields}));
            continue;
        }
        let r = recipes::register(&log, name, src).with_context(|| format!("registering embedded recipe {name}"))?;
        say(format!("      seq {:>3}  {name:<28} blake3 {}", r.seq, &hex::encode(r.loaded.bytes_blake3)[..16]));
        registered.push((name.to_string(), r.seq));
    }

    say("[3/6] training on the CPU: AOT plan, pretraining from scratch, LoRA, eval, sealed manifests".into());
    let work = dir.join("runs");
    let training = train_step(&log, &id, &dir, &work, &say)?;

    say("[4/6] signing a checkpoint of the log and recording it".into());
    let size = log.len();
    let root = log.read(|v| v.root(size))?;
    let cp = Checkpoint { origin: checkpoint::origin_for(&id.public_bytes()), size, root };
    let note = cp.sign(&id);
    log.append(AppendRequest::new(
        "log.checkpointed",
        cp.origin.clone(),
        json!({"size": size, "root": hex::encode(root), "note": note}),
    ))?;
    say("      anchoring it and both manifests on an embedded anvil: deploy Registry, one batch root, proof checked on chain".into());
    let anchored = super::anchor_cmd::demo_step(&dir, &log)?;
    let field = |k: &str| anchored[k].as_str().map(str::to_string).unwrap_or_else(|| anchored[k].to_string());
    say(format!("      tx {} in block {} (registry {})", field("tx"), field("block"), field("registry")));
    let receipt = demo_receipt(&dir, &training, &id)?;
    say(format!(
        "      receipt of {}: {} checks passed ({} file digests, recipe, plan, signatures, log inclusion, batch proof, root on chain)",
        receipt["run_id"].as_str().unwrap_or("-"),
        receipt["checks_passed"],
        receipt["files_checked"]
    ));

    say(format!(
        "[5/6] selling the LoRA model over x402 on anvil from {}: a paid chat completion, then a rental used up",
        mindxtrain_trainer::run::device_name(&serve_device)
    ));
    let market = super::market_demo::demo_step(&dir, &log, &id, &training, &serve_device, &say)?;
    let stats = log.stats();
    drop(log);

    say("[6/6] auditing the log read-only and proving every recipe against the checkpoint".into());
    let report = verify::verify(&dir, TrustedKey::pinned(id.verifying_key(), "node.pub"))?;
    ensure!(report.ok(), "log audit failed: {:?}", report.problems);
    let reader = LogReader::open(&dir)?;
    let verified_cp = Checkpoint::verify(&note, &id.verifying_key())?;
    for (name, seq) in &registered {
        let leaf = reader.view().leaf(*seq).context("registered event missing")?;
        let proof = reader.view().inclusion_proof(*seq, verified_cp.size)?;
        merkle::verify_inclusion(&leaf, *seq, verified_cp.size, &proof, &verified_cp.root)
            .with_context(|| format!("inclusion proof of {name}"))?;
    }
    let final_size = reader.view().len();
    let consistency = reader.view().consistency_proof(size, final_size)?;
    merkle::verify_consistency(size, final_size, &root, &reader.view().root(final_size)?, &consistency)?;

    let elapsed = started.elapsed().as_secs_f64();
    let summary = json!({
        "node_dir": dir,
        "kept": args.keep.is_some(),
        "public_key": hex::encode(id.public_bytes()),
        "recipes_registered": registered.len(),
        "recipes_refused": refused,
        "events": report.events,
        "syncs": stats.syncs,
        "root": report.root,
        "checkpoint": note,
        "log_verified": true,
        "inclusion_proofs_verified": registered.len(),
        "consistency_verified": {"from": size, "to": final_size},
        "anchor": anchored,
        "training": training,
        "receipt": receipt,
        "market": market,
        "seconds": elapsed,
    });
    out.emit(&summary, || {
        format!(
            "\nsummary\n  node        {}{}\n  public key  {}\n  events      {} ({} recipes, genesis, checkpoint, anchoring), {} fdatasync batches\n  log root    {}\n  audit       OK: crc, canonical form, chain links, signatures\n  proofs      {} inclusion proofs against the signed checkpoint, consistency {}→{}\n  time        {:.2}s\n\ncheckpoint (C2SP signed note):\n{}",
            dir.display(),
            if args.keep.is_some() { "" } else { " (temporary, removed on exit; keep it with --keep DIR)" },
            hex::encode(id.public_bytes()),
            report.events,
            registered.len(),
            stats.syncs,
            report.root,
            registered.len(),
            size,
            final_size,
            elapsed,
            note.trim_end()
        )
    });
    Ok(ExitCode::SUCCESS)
}

/// Exports the receipt of the demo's last run (the LoRA adapter) and verifies it against
/// the files, recipe and plan on disk, with the node key pinned, and against the chain.
fn demo_receipt(dir: &std::path::Path, training: &serde_json::Value, id: &Identity) -> Result<serde_json::Value> {
    let last = training.as_array().and_then(|p| p.last()).context("the demo trained nothing")?;
    let field = |k: &str| last[k].as_str().map(PathBuf::from).with_context(|| format!("demo phase has no {k}"));
    let run_id = last["run_id"].as_str().context("demo phase has no run id")?;
    let receipt = receipt::export(dir, run_id)?;
    let (out_dir, recipe, plan) = (field("out_dir")?, field("recipe_file")?, field("plan_file")?);
    let inputs = receipt::VerifyInputs {
        files: Some(&out_dir),
        recipe: Some(&recipe),
        plan: Some(&plan),
        trusted_key: Some(id.verifying_key()),
    };
    let mut report = receipt::verify::verify_receipt(&receipt, &inputs);
    // Online too: the embedded anvil again (from its saved state, read-only), asked whether
    // the registry holds the receipt's root at the claimed block.
    let mut anvil = session::start_embedded(dir, session::Access::Read)?;
    let rt = super::chain_cmd::runtime()?;
    rt.block_on(receipt::verify::check_on_chain(&mut report, receipt.anchor.as_ref(), &anvil.endpoint()));
    anvil.stop();
    ensure!(report.ok() && report.anchored, "the demo's receipt does not verify: {:?}", report.checks);
    let on_chain = report.checks.iter().any(|c| c.name == "anchor.on_chain" && c.status == receipt::Status::Pass);
    ensure!(on_chain, "the demo's receipt was not checked on chain: {:?}", report.checks);
    let path = out_dir.join("receipt.json");
    std::fs::write(&path, receipt.to_json_pretty()).with_context(|| format!("writing {}", path.display()))?;
    let files = report.checks.iter().filter(|c| c.name.starts_with("file:")).count();
    Ok(json!({"run_id": run_id, "file": path, "checks_passed": report.checks.len(), "files_checked": files,
        "anchored": report.anchored, "verified_on_chain": on_chain}))
}

/// The demo's training part: the tiny model trained from scratch, then LoRA-tuned on it,
/// each run given no plan (so it measures one) and sealed, through the same driver as
/// `train`. Uses the embedded recipes, so it needs no file from the repository. Returns
/// the summary the demo prints.
fn train_step(
    log: &mindxtrain_node::log::EventLog,
    key: &Identity,
    node_dir: &Path,
    work: &Path,
    say: &dyn Fn(String),
) -> Result<serde_json::Value> {
    std::fs::create_dir_all(work).with_context(|| format!("creating {}", work.display()))?;
    let mut phases = Vec::new();
    let mut init_from = None;
    for (name, label) in [
        ("tiny_cpu_pretrain.yaml", "pretrain from scratch (cpt)"),
        ("tiny_cpu_lora.yaml", "LoRA on the pretrained base"),
    ] {
        let src = EMBEDDED_RECIPES
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, s)| *s)
            .with_context(|| format!("embedded recipe {name} missing"))?;
        // The recipe as a file too, so the receipt can be checked against real bytes.
        let recipe_path = work.join(name);
        fsutil::write_new_durably(&recipe_path, src.as_bytes(), 0o644)?;
        let recipe = RecipeInput::from_file(&recipe_path)?;
        let out_dir = work.join(&recipe.loaded.recipe.meta.run_name);
        let req = TrainRequest {
            recipe,
            plan: None,
            out_dir: out_dir.clone(),
            resume: false,
            force: false,
            init_from: init_from.clone(),
            force_base: false,
            data: Default::default(),
            eval_prompts: 64,
            origin: Origin::Demo,
            launch: None,
            recipe_path: None,
        };
        let mut hooks = DemoHooks::default();
        let trained = training::train_and_seal(log, key, node_dir, &req, &mut hooks)?;
        let (s, plan) = (&trained.summary, &trained.plan.plan);
        let c = plan.choices;
        say(format!(
            "      {label}: plan threads {} micro-batch {} checkpointing {} gemm rows {} ({} candidates timed in {} ms)",
            c.threads,
            c.micro_batch,
            c.activation_checkpointing,
            c.gemm_rows,
            plan.measurements.len(),
            plan.elapsed_ms
        ));
        let em = s.eval.as_ref().and_then(|e| e.exact_match);
        say(format!(
            "      {}: {} steps in {:.1} s, loss {}, exact match {}",
            s.run_id,
            s.steps,
            s.seconds,
            s.final_loss.map(|l| format!("{l:.3}")).unwrap_or_else(|| "-".into()),
            em.map(|e| format!("{:.1}%", e * 100.0)).unwrap_or_else(|| "-".into())
        ));
        // The evaluation before the first step (the base, as the adapter starts at zero) beside
        // the final one: what tuning taught, task family by task family.
        let before = hooks.evals.iter().find(|e| e.step == 0);
        let by_family = match (before, s.eval.as_ref()) {
            (Some(b), Some(a)) => {
                for line in family_table(b, a) {
                    say(line);
                }
                json!(
                    a.by_family
                        .iter()
                        .map(|(f, after)| {
                            let before = b.by_family.get(f).copied().unwrap_or_default();
                            (f.clone(), json!({"before": before, "after": after}))
                        })
                        .collect::<serde_json::Map<_, _>>()
                )
            }
            _ => serde_json::Value::Null,
        };
        phases.push(json!({"recipe": name, "run_id": s.run_id, "steps": s.steps, "final_loss": s.final_loss,
            "seconds": s.seconds, "exact_match": em, "exact_match_before": before.and_then(|b| b.exact_match),
            "exact_match_by_family": by_family, "final_dir": s.final_dir, "files": s.files,
            "plan_blake3": hex::encode(trained.plan.blake3), "out_dir": out_dir, "recipe_file": recipe_path,
            "plan_file": trained.plan.path, "base": s.base,
            "manifest": {"file": trained.sealed.path, "blake3": hex::encode(trained.sealed.digests.blake3),
                "seq": trained.sealed.seq}}));
        init_from = Some(s.final_dir.clone());
    }
    Ok(json!(phases))
}

/// Lines of held-out exact match per task family, before and after a run.
fn family_table(before: &EvalReport, after: &EvalReport) -> Vec<String> {
    let score = |s: Option<&FamilyScore>| {
        let s = s.copied().unwrap_or_default();
        format!("{}/{}", s.correct, s.total)
    };
    let mut lines = vec!["      held-out exact match by task family, before -> after tuning:".to_owned()];
    for (family, a) in &after.by_family {
        lines.push(format!("        {family:<14} {:>7} -> {}", score(before.by_family.get(family)), score(Some(a))));
    }
    let pct = |r: &EvalReport| r.exact_match.map(|e| format!("{:.1}%", e * 100.0)).unwrap_or_else(|| "-".into());
    let all = |r: &EvalReport| FamilyScore { total: r.exact_match_total, correct: r.exact_match_correct };
    lines.push(format!(
        "        {:<14} {:>7} -> {:<7} ({} -> {})",
        "all",
        score(Some(&all(before))),
        score(Some(&all(after))),
        pct(before),
        pct(after)
    ));
    lines
}

/// The demo prints its own summary of each run; it keeps the evaluations to compare them.
#[derive(Default)]
struct DemoHooks {
    evals: Vec<EvalReport>,
}
impl mindxtrain_trainer::run::Observer for DemoHooks {
    fn evaluated(&mut self, report: &EvalReport) {
        self.evals.push(report.clone());
    }
}
impl training::Hooks for DemoHooks {}
