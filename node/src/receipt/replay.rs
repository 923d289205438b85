//! `receipt verify --replay`: reproducibility as a checkable claim. The recipe is trained
//! again with the plan (and the base weights it started from) in a temporary directory,
//! and the final weights must equal the manifest's `final/…` subjects byte for byte.
//!
//! Runs are bitwise deterministic for a recipe, plan and seed on one machine; on another
//! CPU the GEMM kernels may sum in another order, and the check says so when it fails.
//! The model card (`final/README.md`) is not compared: it holds the run's evaluation, which
//! the replay runs on one prompt only (the weights do not depend on it).

use super::verify::{Report, Status};
use crate::manifest::statement::Statement;
use crate::manifest::{self, Envelope};
use mindxtrain_trainer::checkpoint::FileDigest;
use mindxtrain_trainer::data::DataOptions;
use mindxtrain_trainer::events::Discard;
use mindxtrain_trainer::plan::Plan;
use mindxtrain_trainer::recipe::Recipe;
use mindxtrain_trainer::run::{self, MODEL_CARD_FILE, RunSpec};
use std::collections::BTreeMap;
use std::path::Path;

/// The manifest subjects under `final/` are what a replay must reproduce.
const FINAL: &str = "final/";

/// Adds the `replay` check to `report`: missing input without a recipe or plan, a failure
/// naming the first file that differs, or a pass with the number of files reproduced.
pub fn check(
    envelope: &Envelope,
    recipe: Option<&Path>,
    plan: Option<&Path>,
    base: Option<&Path>,
    report: &mut Report,
) {
    let (Some(recipe), Some(plan)) = (recipe, plan) else {
        report.push("replay", Status::Missing, "--replay needs the recipe (--config) and the plan (--plan)");
        return;
    };
    match replay(envelope, recipe, plan, base) {
        Ok(Ok(n)) => {
            report.push("replay", Status::Pass, format!("retrained: all {n} final files equal the manifest's"))
        }
        Ok(Err(diff)) => report.push("replay", Status::Fail, diff),
        Err(e) => report.push("replay", Status::Missing, e),
    }
}

/// `Err` when the replay could not run (bad input); `Ok(Err)` when it ran and differs.
fn replay(
    envelope: &Envelope,
    recipe: &Path,
    plan_path: &Path,
    base: Option<&Path>,
) -> Result<Result<usize, String>, String> {
    let payload = envelope.payload_bytes().map_err(|e| e.to_string())?;
    let statement = manifest::parse_statement(&payload).map_err(|e| e.to_string())?;
    let claimed: BTreeMap<&str, Option<&str>> = statement
        .subject
        .iter()
        .filter_map(|s| s.name.strip_prefix(FINAL).map(|n| (n, s.digest.blake3.as_deref())))
        .filter(|(n, _)| *n != MODEL_CARD_FILE)
        .collect();
    if claimed.is_empty() {
        return Err("the manifest names no final/ files to reproduce".into());
    }
    let loaded =
        Recipe::check_path(recipe).map_err(|errs| errs.iter().map(|e| e.to_string()).collect::<Vec<_>>().join("; "))?;
    let (plan, plan_blake3) = Plan::read(plan_path).map_err(|e| e.to_string())?;
    plan.check_recipe(&loaded.bytes_blake3, &plan_path.display().to_string()).map_err(|e| e.to_string())?;
    let tmp = tempfile::tempdir().map_err(|e| format!("temporary directory: {e}"))?;
    let spec = RunSpec {
        recipe: loaded,
        recipe_dir: recipe.parent().map(Path::to_path_buf).unwrap_or_default(),
        plan,
        plan_blake3,
        out_dir: tmp.path().join("run"),
        resume: false,
        data: DataOptions::default(),
        init_from: base.map(Path::to_path_buf),
        force_base: false,
        // The held-out evaluation does not touch the weights; one prompt keeps it short.
        eval_prompts: 1,
        context: Default::default(),
    };
    let summary = run::train(&spec, &mut Discard, &mut run::Quiet).map_err(|e| format!("the replay failed: {e}"))?;
    let files = relocated_files(&statement, &summary)?;
    let got: BTreeMap<&str, &str> =
        files.iter().filter(|f| f.path != MODEL_CARD_FILE).map(|f| (f.path.as_str(), f.blake3.as_str())).collect();
    for (name, want) in &claimed {
        match (got.get(name), want) {
            (Some(g), Some(w)) if g == w => {}
            (Some(g), w) => {
                return Ok(Err(format!(
                    "final/{name}: retrained blake3 {g}, manifest {}{}",
                    w.unwrap_or("none"),
                    " (same recipe, plan and seed; another CPU's GEMM kernels may sum in another order)"
                )));
            }
            (None, _) => return Ok(Err(format!("final/{name}: the replay did not produce it"))),
        }
    }
    if let Some(extra) = got.keys().find(|k| !claimed.contains_key(*k)) {
        return Ok(Err(format!("final/{extra}: produced by the replay, absent from the manifest")));
    }
    Ok(Ok(claimed.len()))
}

/// The replay's `final/` files as the run would have written them had its base lain where
/// the original run's did (the manifest's base URI): an adapter names its base's place in
/// `adapter_config.json` and `base_model.json`, and a third party's copy of the base lies
/// elsewhere. Everything else in those files is still compared.
fn relocated_files(statement: &Statement, summary: &run::RunSummary) -> Result<Vec<FileDigest>, String> {
    let recorded = statement
        .predicate
        .build_definition
        .resolved_dependencies
        .iter()
        .filter(|d| d.name.as_deref().is_some_and(|n| n.starts_with("base/")))
        .find_map(|d| d.uri.as_deref().and_then(|u| u.strip_prefix("file://")).map(str::to_string));
    let (Some(recorded), Some(here)) = (recorded, summary.base.path()) else { return Ok(summary.files.clone()) };
    if Path::new(&recorded) == here {
        return Ok(summary.files.clone());
    }
    run::base::relocate_base(&summary.final_dir, &recorded).map_err(|e| e.to_string())?;
    summary
        .files
        .iter()
        .map(|f| {
            let path = summary.final_dir.join(&f.path);
            let bytes = std::fs::read(&path).map_err(|e| format!("{}: {e}", path.display()))?;
            Ok(FileDigest { blake3: blake3::hash(&bytes).to_hex().to_string(), bytes: bytes.len() as u64, ..f.clone() })
        })
        .collect()
}
