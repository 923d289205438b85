//! The run's evaluations: held-out loss and answers, the recipe's benchmark tasks, `eval.json`;
//! and `mindxtrain eval`'s evaluation of a finished checkpoint.

use std::path::Path;

use candle_core::Device;
use serde_json::{Value, json};

use super::Session;
use crate::bench_eval::Scorer;
use crate::checkpoint::{self, FileDigest as SavedFile};
use crate::data::Dataset;
use crate::model::CausalLm;
use crate::run::base;
use crate::run::eval::{EvalReport, evaluate, score_tasks};
use crate::run::method::RlPlan;
use crate::run::{RunError, RunSpec};

impl Session<'_> {
    /// Evaluates on rank 0 (or the only process); `None` on the other ranks, which take part in
    /// gathering ZeRO-3 weights. With `tasks`, the recipe's benchmark tasks are scored too (the
    /// base's evaluation a gate compares with, and the final one); `note` hears their progress.
    pub(super) fn evaluate(&mut self, tasks: bool, note: &mut dyn FnMut(&str)) -> Result<Option<EvalReport>, RunError> {
        let per_device = self.spec.recipe.recipe.train.batch.per_device as usize;
        let gathered = match &self.ranks {
            Some(r) => r.gather_weights(&self.model)?,
            None => None,
        };
        if !self.writes() {
            return Ok(None);
        }
        let whole;
        let model = match gathered {
            Some(params) => {
                whole = CausalLm::new(self.model.config().clone(), params, self.model.device())?;
                &whole
            }
            None => &self.model,
        };
        let mut report = evaluate(
            model,
            self.adapters.as_ref(),
            &self.dataset,
            &self.tokenizer,
            per_device,
            self.spec.eval_prompts,
            self.step,
        )?;
        if tasks {
            let scorer = Scorer { model, adapters: self.adapters.as_ref(), tokenizer: &self.tokenizer };
            report.tasks = score_tasks(&self.spec.recipe.recipe, &scorer, note)?;
        }
        if let Some(RlPlan::Policy(policy)) = self.method.rl.clone() {
            report.rewards = Some(self.held_out_rewards(&policy, self.spec.eval_prompts)?);
        }
        Ok(Some(report))
    }

    pub(super) fn write_eval(&self, report: &EvalReport) -> Result<SavedFile, RunError> {
        let path = self.out.eval_json();
        self.out.write_json(&path, report)?;
        Ok(checkpoint::digest_file(&path, self.out.root())?)
    }
}

pub(super) fn eval_line(r: &EvalReport) -> String {
    let mut line = format!(
        "eval @ step {}: loss {} exact-match {}/{}",
        r.step,
        r.loss.map(|l| format!("{l:.4}")).unwrap_or_else(|| "-".into()),
        r.exact_match_correct,
        r.exact_match_total
    );
    for s in r.tasks.iter().flat_map(|t| &t.scores) {
        line.push_str(&format!(" {} {}({}) {:.4}", s.task, s.metric, s.filter, s.value));
    }
    line
}

pub(super) fn eval_data(run_id: &str, r: &EvalReport, file: Option<&SavedFile>) -> Value {
    json!({
        "run_id": run_id, "step": r.step, "loss": r.loss, "perplexity": r.perplexity,
        "exact_match": r.exact_match, "exact_match_correct": r.exact_match_correct,
        "exact_match_total": r.exact_match_total, "rewards": r.rewards, "file": file,
        "tasks": r.tasks,
    })
}

/// Evaluates a finished checkpoint directory (`mindxtrain eval`): base weights from the
/// recipe (or `init_from`), plus the adapter when the directory holds one; the held-out split
/// and the recipe's benchmark tasks (`note` hears their progress).
pub fn evaluate_checkpoint(
    spec: &RunSpec,
    checkpoint_dir: &Path,
    note: &mut (dyn FnMut(&str) + Send),
) -> Result<EvalReport, RunError> {
    crate::run::effective_env(spec)?;
    let kernels = crate::run::plan_kernels(&spec.plan)?;
    let pool = crate::run::thread_pool(spec.plan.choices.threads)?;
    pool.install(|| {
        let recipe = &spec.recipe.recipe;
        let base = crate::run::adapter_base(
            recipe,
            &spec.recipe_dir,
            checkpoint_dir,
            spec.init_from.as_deref(),
            spec.force_base,
        )?;
        let tokenizer = base::tokenizer(recipe, &spec.recipe_dir, base.as_deref())?;
        let dataset = Dataset::from_recipe(recipe, &spec.recipe_dir, &tokenizer, spec.data)?;
        let (mut model, adapters) = checkpoint::load_checkpoint(recipe, base.as_deref(), checkpoint_dir, &Device::Cpu)?;
        model.set_kernels(kernels);
        let per_device = recipe.train.batch.per_device as usize;
        let mut report = evaluate(&model, adapters.as_ref(), &dataset, &tokenizer, per_device, spec.eval_prompts, 0)?;
        let scorer = Scorer { model: &model, adapters: adapters.as_ref(), tokenizer: &tokenizer };
        report.tasks = score_tasks(recipe, &scorer, note)?;
        Ok(report)
    })
}
