//! One run from preparation to the last checkpoint.

mod evaluation;
mod kto_step;
mod reinforce;
mod weights;

use super::base::{self, BASE_FILE, BaseRecord};
use super::eval::{BASELINE_FILE, Baseline, EvalReport, check_regression, read_report};
use super::layout::{OutDir, RunRecord};
use super::method::{MethodPlan, RlPlan};
use super::ranks::RankState;
use super::{Observer, RunError, RunSpec, RunSummary, StepReport};
use crate::checkpoint::{self, FileDigest as SavedFile, StagedDir, TrainingState};
use crate::data::{DataCursor, Dataset, Tokenizer};
use crate::events::{EventSink, TrainerEvent};
use crate::model::{Adapters, CausalLm};
use crate::optim::{LrSchedule, OptimError, Optimizer};
use crate::parallel::Distributed;
use crate::recipe::Recipe;
use candle_core::{DType, Device};
pub use evaluation::evaluate_checkpoint;
use evaluation::{eval_data, eval_line};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::path::Path;
use std::time::Instant;

use reinforce::RolloutState;
use weights::load_base_model;
pub(super) use weights::save_model;

/// One optimizer step's gradients and what it reports.
pub(super) struct StepGrads {
    pub grads: BTreeMap<String, candle_core::Tensor>,
    /// The step's mean loss.
    pub loss: f64,
    pub tokens: u64,
    /// What an RL step adds to `train.progress` (rewards, KL, clipping, timings).
    pub rl: Option<Value>,
}

/// A prepared run: everything loaded, positioned at `step`.
pub struct Session<'a> {
    pub(super) spec: &'a RunSpec,
    out: OutDir,
    record: RunRecord,
    pub(super) method: MethodPlan,
    tokenizer: Tokenizer,
    pub(super) dataset: Dataset,
    pub(super) model: CausalLm,
    pub(super) adapters: Option<Adapters>,
    pub(super) optimizer: Optimizer,
    pub(super) schedule: LrSchedule,
    pub(super) step: u64,
    total_steps: u64,
    pub(super) cursor: DataCursor,
    base: BaseRecord,
    start_step: u64,
    /// The reference policy of DPO, KTO and GRPO's KL term when all weights train: a frozen
    /// copy of the starting weights (with adapters, the reference is the base with adapters
    /// off: no second model in memory).
    pub(super) reference: Option<CausalLm>,
    /// GRPO and GSPO: the prompts, rewards and rollout engine.
    rollouts: Option<RolloutState>,
    /// The recipe's `train.env` with the plan's overrides applied, as `run.started` records it.
    env: BTreeMap<String, String>,
    /// Batches this rank accumulates per optimizer step (the recipe's `grad_accum` unless a
    /// resume at another world size changed it to keep the global batch).
    pub(super) accum: u64,
    /// The distributed side of a rank of a multi-rank run.
    pub(super) ranks: Option<RankState>,
    /// What `eval.regression` compares the final evaluation with: a report read before the run
    /// started, or the base's own (evaluated before the first step, kept as `BASELINE_FILE`).
    gate: Option<(String, Option<EvalReport>)>,
    /// The released Qwen3.5/3.6 checkpoint the base came from: full weights are written back
    /// into its layout, and adapters named as PEFT names them over it.
    released: Option<checkpoint::ReleasedLayout>,
}

fn emit(sink: &mut impl EventSink, kind: &str, run_id: &str, data: Value) -> Result<(), RunError> {
    sink.emit(TrainerEvent { kind: kind.to_string(), subject: run_id.to_string(), data })
        .map_err(|e| RunError::Events(e.to_string()))
}

fn hex(b: &[u8; 32]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

impl<'a> Session<'a> {
    /// Prepares the run, resuming when asked, and records `run.started`. A rank of a distributed
    /// run passes its collective in `dist`: only rank 0 writes the run directory, every rank
    /// checks it trains what rank 0 trains.
    pub fn open(
        spec: &'a RunSpec,
        dist: Option<(Distributed, Device)>,
        sink: &mut impl EventSink,
    ) -> Result<Session<'a>, RunError> {
        let recipe = &spec.recipe.recipe;
        let env = super::effective_env(spec)?;
        let writer = dist.as_ref().is_none_or(|(d, _)| d.collective.rank() == 0);
        if !spec.resume {
            // Before anything is written; a resume finds its base in run.json.
            base::check_base_choice(recipe, &spec.recipe_dir, spec.init_from.as_deref())?;
        }
        let out = OutDir::new(&spec.out_dir);
        if writer {
            std::fs::create_dir_all(out.root())
                .map_err(|e| RunError::Io { path: spec.out_dir.display().to_string(), message: e.to_string() })?;
        }
        let method = MethodPlan::from_recipe(&recipe.train.method)?;
        // A baseline report that is missing or unreadable stops the run here, before it trains.
        let gate = match Baseline::of(recipe, &spec.recipe_dir)? {
            Some(Baseline::Report { path, report }) => Some((path, Some(*report))),
            // The base's own evaluation: kept from the first start, made at step 0 otherwise.
            Some(Baseline::Base) => {
                let kept = out.root().join(BASELINE_FILE);
                let report = if spec.resume && kept.exists() { Some(read_report(&kept)?) } else { None };
                Some((kept.display().to_string(), report))
            }
            None => None,
        };
        if dist.is_some()
            && let Some(why) = MethodPlan::single_process_only(&recipe.train.method)
        {
            return Err(RunError::Recipe(why));
        }
        let (device, mut ranks) = match dist {
            Some((d, device)) => {
                let r = RankState::new(d, recipe, &device)?;
                (device, Some(r))
            }
            None => (super::run_device(recipe)?, None),
        };
        // Rank 0 reads the run directory; the others take its word (they may be on another node).
        let mut existing = if writer { out.read_record()? } else { None };
        if let Some(r) = &ranks {
            let bytes = serde_json::to_vec(&existing).unwrap_or_default();
            existing = serde_json::from_slice(&r.rank0_value(&bytes)?)
                .map_err(|e| RunError::Recipe(format!("rank 0's run record: {e}")))?;
            r.agree("plan", &hex(&spec.plan_blake3))?;
        }
        // A resume continues on the base the run recorded, unless told otherwise.
        let recorded = existing.as_ref().filter(|_| spec.resume).and_then(|r| r.base.clone());
        let on_recorded = spec.init_from.is_none() && recorded.as_ref().is_some_and(|b| b.path().is_some());
        let init_from = match (&spec.init_from, &recorded) {
            (Some(dir), _) => Some(dir.clone()),
            (None, Some(r)) => r.locate()?,
            (None, None) => None,
        };
        let base_dir = base::check_base_choice(recipe, &spec.recipe_dir, init_from.as_deref())?;
        let tokenizer = base::tokenizer(recipe, &spec.recipe_dir, base_dir.as_ref().map(|b| b.dir.as_path()))?;
        let dataset = Dataset::from_recipe(recipe, &spec.recipe_dir, &tokenizer, spec.data)?;
        if writer {
            out.write_json(&out.dataset_json(), &dataset.manifest.to_json())?;
        }
        if let Some(r) = &ranks {
            r.agree("dataset", &dataset.manifest.digest())?;
        }
        // QLoRA's base is read on the host and quantised onto the device (below): its dense form
        // need not fit there.
        let load_on = if method.nf4_base { Device::Cpu } else { device.clone() };
        let (mut model, mut base) = load_base_model(recipe, base_dir.as_ref(), &load_on)?;
        let released = checkpoint::released_source(base_dir.as_ref().map(|b| b.dir.as_path()))?;
        if let Some(recorded) = &recorded
            && let Some(why) = base::difference(recorded, &base)
            && !spec.force_base
        {
            return Err(RunError::Base(format!(
                "--resume: the run started from {}; {} differs ({why}): leave --init-from out to use the \
                 recorded base, or pass --force-base to continue on this one",
                recorded.describe(),
                base.path().map_or_else(|| base.describe(), |p| p.display().to_string())
            )));
        }
        // Resumed on the recorded base: it is still the hub snapshot it was found as.
        if on_recorded
            && recorded.as_ref().is_some_and(|r| base::difference(r, &base).is_none())
            && let (BaseRecord::Weights { hub, .. }, Some(BaseRecord::Weights { hub: was, .. })) =
                (&mut base, &recorded)
        {
            hub.clone_from(was);
        }
        model.set_kernels(super::plan_kernels(&spec.plan)?);
        if let Some(r) = &ranks {
            r.agree("base", &String::from_utf8_lossy(&base.to_bytes()))?;
        }
        let mut adapters = match &method.lora {
            Some(l) => Some(Adapters::init(model.config(), l, recipe.meta.seed, model.dtype(), &device)?),
            None => None,
        };
        if method.nf4_base {
            model.quantize_nf4_onto(&device)?;
        }
        let needs_reference = matches!(method.preference, Some(crate::model::PreferenceLoss::Dpo { .. }))
            || method.rl.as_ref().is_some_and(RlPlan::needs_reference);
        let reference = (needs_reference && adapters.is_none()).then(|| model.clone());
        let rollouts = match &method.rl {
            Some(RlPlan::Policy(p)) => {
                Some(RolloutState::new(dataset.train_prompts(&tokenizer)?, recipe.data.seq_len as usize, p)?)
            }
            _ => None,
        };
        let world = ranks.as_ref().map_or(1, |r| r.world()) as u64;
        let per_device = u64::from(recipe.train.batch.per_device);
        let resume_from = match (spec.resume, writer) {
            (true, true) => checkpoint::latest(&out.checkpoints_root())?,
            _ => None,
        };
        let resume_from = match &ranks {
            Some(r) => {
                let path = resume_from.as_ref().map(|p| p.display().to_string()).unwrap_or_default();
                let path = String::from_utf8_lossy(&r.rank0_value(path.as_bytes())?).into_owned();
                (!path.is_empty()).then(|| std::path::PathBuf::from(path))
            }
            None => resume_from,
        };
        let record = match (&existing, &resume_from) {
            (Some(r), Some(_)) => RunRecord { base: Some(base.clone()), ..r.clone() },
            _ => RunRecord {
                run_id: new_run_id(spec),
                recipe_blake3: hex(&spec.recipe.bytes_blake3),
                plan_blake3: hex(&spec.plan_blake3),
                method: method.name.to_string(),
                seed: recipe.meta.seed,
                base: Some(base.clone()),
                global_batch: Some(per_device * u64::from(recipe.train.batch.grad_accum) * world),
            },
        };
        // Rank 0's record (its run id) everywhere.
        let record = match &ranks {
            Some(r) => serde_json::from_slice(&r.rank0_value(&serde_json::to_vec(&record).unwrap_or_default())?)
                .map_err(|e| RunError::Recipe(format!("rank 0's run record: {e}")))?,
            None => record,
        };
        // The global batch a run started with stays; runs recorded before it was are 1-process runs.
        let global_batch = record.global_batch.unwrap_or(per_device * u64::from(recipe.train.batch.grad_accum));
        let accum = match ranks.as_mut() {
            Some(r) => r.set_batch(global_batch)?,
            None => crate::parallel::accumulation(global_batch, per_device, 1).map_err(RunError::Recipe)?,
        };
        let total_steps = total_steps(spec, &dataset, global_batch, rollouts.as_ref().map(|r| r.prompts.len()))?;
        let schedule = LrSchedule::from_recipe(&recipe.train.optimizer, &recipe.train.schedule, total_steps)?;
        let mut optimizer = Optimizer::from_recipe(&recipe.train.optimizer)?;
        let (mut step, mut cursor) = (0, DataCursor::default());
        if let Some(dir) = &resume_from {
            let state = checkpoint::load_training_state(dir)?;
            // Checked before the recipe's hash, which another optimizer changes too: this error
            // says what changed. A sharded rank keeps its own share of the state: filtered once
            // the owners are known.
            optimizer =
                Optimizer::restore(&recipe.train.optimizer, &state.optimizer_name, &state.optimizer).map_err(|e| {
                    match e {
                        OptimError::OtherOptimizer { .. } => {
                            RunError::Recipe(format!("--resume from {}: {e}", dir.display()))
                        }
                        e => e.into(),
                    }
                })?;
            let same_world = state.world_size == world;
            if state.recipe_hash != hex(&spec.recipe.bytes_blake3)
                || (same_world && state.plan_hash != hex(&spec.plan_blake3))
            {
                return Err(RunError::Recipe(format!(
                    "--resume: checkpoint {} was made with recipe {} and plan {}, not this recipe and plan",
                    dir.display(),
                    state.recipe_hash,
                    state.plan_hash
                )));
            }
            step = state.step;
            cursor = serde_json::from_value(state.data_cursor)
                .map_err(|e| RunError::Io { path: dir.display().to_string(), message: format!("data cursor: {e}") })?;
            match adapters.as_mut() {
                Some(a) => a.tensors = checkpoint::load_adapter_tensors(dir, model.dtype(), &device)?,
                None => *model.params_mut() = checkpoint::load_hf_weights(dir, model.dtype(), &device)?,
            }
        } else if spec.resume {
            return Err(RunError::Io {
                path: out.root().display().to_string(),
                message: "--resume: no complete checkpoint to resume from".into(),
            });
        }
        if let Some(r) = ranks.as_mut() {
            r.agree("step", &step.to_string())?;
            let trained = match (method.trainable, adapters.as_ref()) {
                (crate::model::Trainable::Adapters, Some(a)) => a.tensors.clone(),
                _ => model.params().clone(),
            };
            r.shard(&mut model, &trained)?;
            if r.sharding() != crate::parallel::Sharding::None {
                optimizer = optimizer.with_state(&r.own_optimizer_state(optimizer.state_tensors()?))?;
            }
        }
        if writer {
            out.write_json(&out.run_json(), &record)?;
            if let Some(rl) = rl_record(&method, rollouts.as_ref(), recipe.meta.seed) {
                out.write_json(&out.root().join(RL_JSON), &rl)?;
            }
        }
        let session = Session {
            spec,
            out,
            record,
            method,
            tokenizer,
            dataset,
            model,
            adapters,
            optimizer,
            schedule,
            step,
            total_steps,
            cursor,
            base,
            start_step: step,
            reference,
            rollouts,
            env,
            accum,
            ranks,
            gate,
            released,
        };
        emit(
            sink,
            if session.step > 0 { "run.resumed" } else { "run.started" },
            &session.record.run_id,
            session.started_data(),
        )?;
        Ok(session)
    }

    fn started_data(&self) -> Value {
        let recipe = &self.spec.recipe.recipe;
        json!({
            "run_id": self.record.run_id,
            "recipe_blake3": self.record.recipe_blake3,
            "recipe_file": self.spec.recipe.source_name,
            "plan_blake3": self.record.plan_blake3,
            "plan": self.spec.plan.choices,
            "env": self.env,
            "method": self.method.name,
            "model": recipe.model.name,
            "dataset_blake3": self.dataset.manifest.digest(),
            "base": self.base,
            "base_files": match &self.base {
                BaseRecord::Weights { files, .. } => files.as_slice(),
                BaseRecord::RandomInit { .. } => &[],
            },
            "seed": recipe.meta.seed,
            "start_step": self.step,
            "total_steps": self.total_steps,
            "out_dir": self.out.root().display().to_string(),
            "context": self.spec.context,
            "global_batch": self.global_batch(),
            "parallel": self.ranks.as_ref().map(|r| &r.layout),
            "rl": rl_record(&self.method, self.rollouts.as_ref(), recipe.meta.seed),
        })
    }

    /// Steps to the end; on error records `run.failed` before returning it.
    pub fn run(mut self, sink: &mut impl EventSink, observer: &mut dyn Observer) -> Result<RunSummary, RunError> {
        match self.steps(sink, observer) {
            Ok(summary) => Ok(summary),
            Err(e) => {
                let data = json!({"run_id": self.record.run_id, "step": self.step, "error": e.to_string()});
                let kind = if matches!(e, RunError::Cancelled { .. }) { "run.cancelled" } else { "run.failed" };
                // The run's own error is the one to report; a failing sink was already
                // the cause if this emit fails too.
                let _ = emit(sink, kind, &self.record.run_id, data);
                Err(e)
            }
        }
    }

    fn steps(&mut self, sink: &mut impl EventSink, observer: &mut dyn Observer) -> Result<RunSummary, RunError> {
        let train = &self.spec.recipe.recipe.train;
        let started = Instant::now();
        let mut tokens = 0u64;
        let mut last_loss = None;
        let log_every = u64::from(train.log_every_steps.max(1));
        observer.started(self.step, self.total_steps);
        let eval = &self.spec.recipe.recipe.eval;
        let curve = eval.every_steps.is_some() || self.rollouts.is_some();
        let base_gate = self.gate.as_ref().is_some_and(|(_, report)| report.is_none());
        if self.step == 0 && eval.enabled && (curve || base_gate) && self.total_steps > 0 {
            // The curve starts where the run starts: the base (a fresh adapter adds nothing),
            // so the evaluations that follow (an RL run's held-out rewards too) read as what
            // training changed. It is also what a regression gate on the base compares with.
            if let Some(report) = self.evaluate(base_gate, &mut |line| observer.note(line))? {
                observer.note(&eval_line(&report));
                observer.evaluated(&report);
                emit(sink, "eval.completed", &self.record.run_id, eval_data(&self.record.run_id, &report, None))?;
                if let Some((kept, baseline @ None)) = self.gate.as_mut() {
                    self.out.write_json(Path::new(kept.as_str()), &report)?;
                    *baseline = Some(report);
                }
            }
        }
        while self.step < self.total_steps {
            let t0 = Instant::now();
            let super::step::Stepped { loss, tokens: n_tokens, grad_norm, lr, rl } = self.one_step()?;
            if !loss.is_finite() {
                return Err(RunError::Diverged { step: self.step, value: loss });
            }
            tokens += n_tokens;
            last_loss = Some(loss);
            let report = StepReport {
                step: self.step,
                total_steps: self.total_steps,
                loss,
                lr,
                grad_norm,
                tokens_per_s: n_tokens as f64 / t0.elapsed().as_secs_f64().max(1e-9),
                elapsed_s: started.elapsed().as_secs_f64(),
            };
            observer.step(&report);
            if self.step.is_multiple_of(log_every) || self.step == self.total_steps {
                let mut data = json!({
                    "run_id": self.record.run_id, "step": self.step, "total_steps": self.total_steps,
                    "loss": loss, "lr": lr, "grad_norm": grad_norm,
                    "tokens_per_s": tokens as f64 / started.elapsed().as_secs_f64().max(1e-9),
                });
                if let Some(rl) = rl {
                    data["rl"] = rl;
                }
                emit(sink, "train.progress", &self.record.run_id, data)?;
            }
            if let Some(every) = train.checkpoint.every_steps
                && self.step.is_multiple_of(every.max(1))
                && self.step < self.total_steps
            {
                self.save_checkpoint(sink)?;
            }
            if let Some(every) = self.spec.recipe.recipe.eval.every_steps
                && self.spec.recipe.recipe.eval.enabled
                && self.step.is_multiple_of(every.max(1))
                && self.step < self.total_steps
                // Benchmark tasks are scored at the start and the end, not on the curve.
                && let Some(report) = self.evaluate(false, &mut |line| observer.note(line))?
            {
                observer.note(&eval_line(&report));
                observer.evaluated(&report);
                emit(sink, "eval.completed", &self.record.run_id, eval_data(&self.record.run_id, &report, None))?;
            }
            if self.agree_stop(observer.cancelled())? && self.step < self.total_steps {
                self.save_checkpoint(sink)?;
                return Err(RunError::Cancelled { step: self.step });
            }
        }
        self.save_checkpoint(sink)?;
        // Evaluated before final/ is written: its model card carries the results.
        let report = if self.spec.recipe.recipe.eval.enabled {
            self.evaluate(true, &mut |line| observer.note(line))?
        } else {
            None
        };
        let files = self.save_final(report.as_ref())?;
        let eval = if let Some(report) = report {
            observer.evaluated(&report);
            let eval_file = self.write_eval(&report)?;
            emit(
                sink,
                "eval.completed",
                &self.record.run_id,
                eval_data(&self.record.run_id, &report, Some(&eval_file)),
            )?;
            if let (Some(reg), Some((path, baseline))) = (&self.spec.recipe.recipe.eval.regression, &self.gate) {
                let baseline = baseline.as_ref().ok_or_else(|| {
                    RunError::Recipe(format!("eval.regression: the base's evaluation ({path}) was never made"))
                })?;
                check_regression(&report, baseline, path, reg.threshold_pct)?;
            }
            Some(report)
        } else {
            None
        };
        if self.writes() {
            crate::quantize::after_training(self.spec, &self.out.final_dir(), &self.record.run_id, sink, observer)?;
        }
        let summary = RunSummary {
            run_id: self.record.run_id.clone(),
            steps: self.step,
            final_loss: last_loss,
            tokens,
            seconds: started.elapsed().as_secs_f64(),
            final_dir: self.out.final_dir(),
            files,
            eval,
            dataset_digest: self.dataset.manifest.digest(),
            dataset: self.dataset.manifest.clone(),
            base: self.base.clone(),
            start_step: self.start_step,
            parallel: self.ranks.as_ref().map(|r| r.layout.clone()),
        };
        emit(
            sink,
            "run.finished",
            &self.record.run_id,
            json!({
                "run_id": summary.run_id, "steps": summary.steps, "final_loss": summary.final_loss,
                "tokens": summary.tokens, "seconds": summary.seconds,
                "final_dir": summary.final_dir.display().to_string(), "files": summary.files,
                "exact_match": summary.eval.as_ref().and_then(|e| e.exact_match),
            }),
        )?;
        Ok(summary)
    }

    /// Rows per optimizer step, over every rank.
    pub(super) fn global_batch(&self) -> u64 {
        let per_device = u64::from(self.spec.recipe.recipe.train.batch.per_device);
        per_device * self.accum * self.ranks.as_ref().map_or(1, |r| r.world()) as u64
    }

    /// The reference policy: the frozen starting weights when all weights train, else the
    /// base with the adapters off.
    fn reference_policy(&self) -> (&CausalLm, Option<&Adapters>) {
        (self.reference.as_ref().unwrap_or(&self.model), None)
    }

    /// Whether this process writes the run directory and records events (rank 0, or the only one).
    fn writes(&self) -> bool {
        self.ranks.as_ref().is_none_or(|r| r.rank() == 0)
    }

    /// Rank 0's answer to "stop after this step?", on every rank.
    fn agree_stop(&self, stop: bool) -> Result<bool, RunError> {
        match &self.ranks {
            None => Ok(stop),
            Some(r) => {
                let mine = [u8::from(stop)];
                let all = r.rank0_value(&mine)?;
                Ok(all.first() == Some(&1))
            }
        }
    }
}

fn total_steps(spec: &RunSpec, dataset: &Dataset, global_batch: u64, prompts: Option<usize>) -> Result<u64, RunError> {
    let rows = prompts.unwrap_or_else(|| dataset.train_rows_per_epoch()) as u64;
    super::budget::total_steps(&spec.recipe.recipe.train.budget, rows, global_batch)
}

/// A run id unique to this start: recipe, plan and the clock.
fn new_run_id(spec: &RunSpec) -> String {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos();
    let mut h = blake3::Hasher::new();
    h.update(&spec.recipe.bytes_blake3);
    h.update(&spec.plan_blake3);
    h.update(&nanos.to_le_bytes());
    format!("run-{}", &h.finalize().to_hex()[..16])
}

/// Sequence log-probs of chosen and rejected answers under a frozen reference model.
pub(super) fn reference_logps(
    frozen: &CausalLm,
    batch: &crate::batch::PreferenceBatch,
) -> Result<Vec<(f64, f64)>, RunError> {
    let chosen = frozen.sequence_logps(&batch.chosen, None)?;
    let rejected = frozen.sequence_logps(&batch.rejected, None)?;
    Ok(chosen.into_iter().zip(rejected).collect())
}

/// `OUT/rl.json`: what an RL run learns from (the reward functions with the digests of their
/// definitions, the sampling settings); a file of the run, so the sealed manifest covers it.
pub const RL_JSON: &str = "rl.json";

fn rl_record(method: &MethodPlan, rollouts: Option<&RolloutState>, seed: u64) -> Option<Value> {
    match (&method.rl, rollouts) {
        (Some(RlPlan::Policy(p)), Some(r)) => Some(json!({
            "method": method.name,
            "rewards": r.rewards.records(),
            "sampling": {
                "num_generations": p.num_generations, "max_new_tokens": p.max_new_tokens,
                "temperature": p.temperature, "top_p": 1.0, "top_k": 0, "seed": seed,
            },
            "loss": {
                "ratio": match p.loss.ratio { crate::rl::policy_loss::Ratio::Token => "token", crate::rl::policy_loss::Ratio::Sequence => "sequence" },
                "clip_epsilon": p.loss.clip_epsilon, "kl_coef": p.loss.kl_coef,
            },
            "prompts": r.prompts.len(),
            "prompts_too_long": r.too_long,
        })),
        (Some(RlPlan::Kto(k)), _) => Some(json!({
            "method": method.name,
            "loss": {"beta": k.beta, "desirable_weight": k.desirable_weight, "undesirable_weight": k.undesirable_weight},
        })),
        _ => None,
    }
}
