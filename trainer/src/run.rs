//! Training runs: recipe + plan in, checkpoints, eval and events out.
//!
//! [`train`] prepares everything a run needs (tokenizer, data, model, adapters,
//! optimizer, schedule), resumes from the newest complete checkpoint when asked, then
//! steps until the budget is spent. It reports through the [`EventSink`]: `run.started`,
//! `train.progress` every `log_every_steps`, `checkpoint.saved` with file digests,
//! `eval.completed`, and `run.finished` or `run.failed` with the error. Nothing is
//! re-tuned while it runs: thread count, micro-batch split and activation checkpointing
//! come from the plan verbatim.
//!
//! Everything random is derived from the recipe seed and the step (dropout masks) or the
//! epoch (data order), so the state a resume needs is the step, the data cursor, the
//! optimizer moments and the weights — and a resumed run is bitwise identical to an
//! uninterrupted one.

mod autotune;
pub mod base;
mod budget;
pub mod card;
mod device;
pub mod eval;
mod export;
#[cfg(all(test, feature = "cuda"))]
mod gpu_tests;
mod layout;
mod method;
mod microbatch;
#[cfg(test)]
mod qlora_tests;
mod ranks;
#[cfg(test)]
mod rl_tests;
mod sequences;
mod session;
mod step;
mod threads;

pub use autotune::{gradient_buckets, measure_plan};
pub use base::{BaseDir, BaseRecord, adapter_base, check_base_choice};
pub use card::{CardError, DEFAULT_RECEIPT_FILE, MODEL_CARD_FILE};
pub use device::{device_name, named_device, run_device};
pub use eval::{EvalReport, FamilyScore, check_regression, evaluate, score_tasks};
pub use export::{GENERATION_CONFIG_FILE, export_hf};
pub use layout::{OutDir, PLAN_FILE, RUN_FILES, RunRecord};
pub use method::{GroupPolicy, MethodPlan, RlPlan};
pub use session::{Session, evaluate_checkpoint};
pub use threads::{plan_kernels, thread_pool};

use crate::checkpoint::{CheckpointError, FileDigest as SavedFile};
use crate::data::{DataError, DataOptions, DatasetManifest};
use crate::events::EventSink;
use crate::model::ModelError;
use crate::optim::OptimError;
use crate::plan::Plan;
use crate::recipe::{EnvOverrideError, LoadedRecipe, apply_plan_env};
use std::collections::BTreeMap;
use std::path::PathBuf;
use thiserror::Error;

/// Everything a run is made from.
#[derive(Debug, Clone)]
pub struct RunSpec {
    pub recipe: LoadedRecipe,
    /// Relative paths in the recipe are taken from here.
    pub recipe_dir: PathBuf,
    pub plan: Plan,
    pub plan_blake3: [u8; 32],
    pub out_dir: PathBuf,
    /// Continue from the newest complete checkpoint in `out_dir`.
    pub resume: bool,
    pub data: DataOptions,
    /// Start from this HF checkpoint directory instead of `model.path` / random init. On a
    /// resume, `None` means the base recorded in `run.json`.
    pub init_from: Option<PathBuf>,
    /// On a resume, accept a base other than the recorded one (it is recorded instead).
    pub force_base: bool,
    /// Prompts generated and scored per evaluation.
    pub eval_prompts: usize,
    /// What the driver says about the run (who launched it, how its plan was obtained),
    /// recorded as `context` in `run.started` / `run.resumed`.
    pub context: serde_json::Map<String, serde_json::Value>,
}

impl RunSpec {
    /// A fresh run of `recipe` with `plan` (its digest taken over the plan's bytes) into
    /// `out_dir`: no resume, default data options, the recipe's own base, no evaluation
    /// prompts, no driver context. Set what differs with struct update syntax.
    pub fn new(
        recipe: LoadedRecipe,
        recipe_dir: impl Into<PathBuf>,
        plan: Plan,
        out_dir: impl Into<PathBuf>,
    ) -> RunSpec {
        RunSpec {
            recipe,
            recipe_dir: recipe_dir.into(),
            plan_blake3: *blake3::hash(&plan.to_bytes()).as_bytes(),
            plan,
            out_dir: out_dir.into(),
            resume: false,
            data: DataOptions::default(),
            init_from: None,
            force_base: false,
            eval_prompts: 0,
            context: Default::default(),
        }
    }
}

/// What a finished run produced.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct RunSummary {
    pub run_id: String,
    pub steps: u64,
    pub final_loss: Option<f64>,
    pub tokens: u64,
    pub seconds: f64,
    /// The trained weights (HF layout) or adapter (PEFT layout).
    pub final_dir: PathBuf,
    pub files: Vec<SavedFile>,
    pub eval: Option<EvalReport>,
    pub dataset_digest: String,
    /// What went into the data: examples read, skipped lines, held out.
    pub dataset: DatasetManifest,
    /// The weights the run started from.
    pub base: BaseRecord,
    /// The step the run (re)started at in this process.
    pub start_step: u64,
    /// How a distributed run was laid out: world size, backend, sharding, batch, topology.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parallel: Option<crate::parallel::Layout>,
}

/// One optimizer step, for progress displays.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct StepReport {
    pub step: u64,
    pub total_steps: u64,
    /// Per-token mean loss of the step.
    pub loss: f64,
    pub lr: f64,
    pub grad_norm: f64,
    pub tokens_per_s: f64,
    pub elapsed_s: f64,
}

/// Sees every step (the event log only gets every `log_every_steps`-th); the node draws
/// its progress bar here.
pub trait Observer {
    fn started(&mut self, _first_step: u64, _total_steps: u64) {}
    fn step(&mut self, _report: &StepReport) {}
    fn note(&mut self, _message: &str) {}
    /// Every evaluation on the held-out data, in the middle of the run and at its end.
    fn evaluated(&mut self, _report: &EvalReport) {}
    /// Asked after every step: `true` stops the run there, after a checkpoint (so
    /// `--resume` continues from it), with `run.cancelled` and [`RunError::Cancelled`].
    fn cancelled(&mut self) -> bool {
        false
    }
}

/// An observer that ignores everything.
pub struct Quiet;
impl Observer for Quiet {}

#[derive(Debug, Error)]
pub enum RunError {
    #[error(transparent)]
    Data(#[from] DataError),
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error(transparent)]
    Optim(#[from] OptimError),
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    /// Boxed: a load error is rare and large, and every `Result` of a run carries its size.
    #[error(transparent)]
    Load(Box<crate::checkpoint::LoadError>),
    #[error(transparent)]
    Plan(#[from] crate::plan::PlanError),
    #[error(transparent)]
    Eval(#[from] eval::EvalError),
    /// Boxed for the same reason as `Load`.
    #[error("quantize: {0}")]
    Quantize(Box<crate::quantize::QuantizeError>),
    #[error("tensor: {0}")]
    Tensor(#[from] candle_core::Error),
    /// Boxed for the same reason as `Load`.
    #[error(transparent)]
    Rollout(Box<crate::rl::rollout::RolloutError>),
    #[error("recipe: {0}")]
    Recipe(String),
    /// The plan's `env` overrides would drop, empty or misname a key of the recipe's
    /// `train.env` (see [`crate::recipe::apply_plan_env`]); refused before training starts.
    #[error(transparent)]
    Env(#[from] EnvOverrideError),
    #[error("{path}: {message}")]
    Io { path: String, message: String },
    #[error(transparent)]
    Card(#[from] CardError),
    #[error("recording an event failed, so the run stopped: {0}")]
    Events(String),
    #[error("loss became {value} at step {step}: the run diverged (lower the learning rate?)")]
    Diverged { step: u64, value: f64 },
    /// The base weights: not the ones recorded, contradicted by `model.config`, or none at all.
    #[error("{0}")]
    Base(String),
    /// An adapter would train on random weights the recipe did not ask for.
    #[error(
        "train.method trains an adapter, but its base would be random weights (no model.path, and no base given \
         with --init-from or --base): give the base DIR (an HF model directory, such as the final/ of a \
         tiny_cpu_pretrain.yaml run), or set model.random_init: true in the recipe to train on random weights on \
         purpose"
    )]
    RandomBase,
    /// A model or dataset named by hub id that the Hugging Face cache does not hold (boxed
    /// for the same reason as `Load`).
    #[error(transparent)]
    Hub(Box<crate::hub::HubError>),
    #[error("cancelled after step {step} (checkpointed: resume continues from there)")]
    Cancelled { step: u64 },
    /// Another rank failed, hung or went away, or the ranks disagree.
    #[error("{0}")]
    Collective(crate::collective::CollectiveError),
}

impl RunError {
    /// Whether the run was refused for what it was given (its base, model or dataset), before
    /// it trained: bad input rather than a failure.
    pub fn is_refusal(&self) -> bool {
        matches!(self, RunError::Base(_) | RunError::RandomBase | RunError::Hub(_) | RunError::Data(DataError::Hub(_)))
    }
}

impl From<crate::rl::rollout::RolloutError> for RunError {
    fn from(e: crate::rl::rollout::RolloutError) -> Self {
        RunError::Rollout(Box::new(e))
    }
}

impl From<crate::quantize::QuantizeError> for RunError {
    fn from(e: crate::quantize::QuantizeError) -> Self {
        RunError::Quantize(Box::new(e))
    }
}

impl From<crate::hub::HubError> for RunError {
    fn from(e: crate::hub::HubError) -> Self {
        RunError::Hub(Box::new(e))
    }
}

impl From<crate::checkpoint::LoadError> for RunError {
    fn from(e: crate::checkpoint::LoadError) -> Self {
        RunError::Load(Box::new(e))
    }
}

/// Runs `spec` to the end, reporting to `sink` and `observer`.
pub fn train(
    spec: &RunSpec,
    sink: &mut (impl EventSink + Send),
    observer: &mut (dyn Observer + Send),
) -> Result<RunSummary, RunError> {
    run_session(spec, None, sink, observer)
}

/// Runs `spec` as one rank of a distributed run on `device`: every rank trains its share of each
/// step's batches, gradients are reduced through `dist`'s collective, and rank 0 writes the run
/// directory and emits the events (give the other ranks a sink that drops them).
pub fn train_rank(
    spec: &RunSpec,
    dist: crate::parallel::Distributed,
    device: candle_core::Device,
    sink: &mut (impl EventSink + Send),
    observer: &mut (dyn Observer + Send),
) -> Result<RunSummary, RunError> {
    run_session(spec, Some((dist, device)), sink, observer)
}

/// One process's session: alone (`None`), or one rank of a distributed run.
fn run_session(
    spec: &RunSpec,
    rank: Option<(crate::parallel::Distributed, candle_core::Device)>,
    sink: &mut (impl EventSink + Send),
    observer: &mut (dyn Observer + Send),
) -> Result<RunSummary, RunError> {
    spec.plan.check_recipe(&spec.recipe.bytes_blake3, "plan")?;
    spec.plan.check_constraints(&spec.recipe.recipe, "plan")?;
    effective_env(spec)?;
    let pool = thread_pool(spec.plan.choices.threads)?;
    pool.install(|| Session::open(spec, rank, sink)?.run(sink, observer))
}

/// The environment the run asks for: the recipe's `train.env` with the plan's `env`
/// overrides applied. A plan that would drop or empty a mandatory ROCm key on MI300-class
/// hardware is refused ([`RunError::Env`]). The result is recorded in `run.started`; it is
/// not exported into the trainer's own process.
pub fn effective_env(spec: &RunSpec) -> Result<BTreeMap<String, String>, RunError> {
    Ok(apply_plan_env(&spec.recipe.recipe, &spec.plan.env)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::{Discard, TrainerEvent};
    use crate::plan::Choices;
    use crate::recipe::Recipe;
    use std::path::Path;

    /// Keeps every event (the RL tests read them too).
    pub(super) struct Collect(pub Vec<TrainerEvent>);

    impl EventSink for Collect {
        type Error = std::convert::Infallible;

        fn emit(&mut self, event: TrainerEvent) -> Result<(), Self::Error> {
            self.0.push(event);
            Ok(())
        }
    }

    fn spec(recipe: LoadedRecipe, env: &[(&str, Option<&str>)], out: &Path) -> RunSpec {
        let mut plan = Plan::new(recipe.bytes_blake3, "cpu", Choices::unmeasured(1), vec![], 0, 0, false);
        plan.env = env.iter().map(|(k, v)| ((*k).to_string(), v.map(str::to_string))).collect();
        RunSpec {
            eval_prompts: 1,
            ..RunSpec::new(recipe, Path::new(env!("CARGO_MANIFEST_DIR")).join("../recipes"), plan, out)
        }
    }

    /// The tiny CPU recipe on an MI300X board's rules: the mandatory ROCm env keys.
    fn mi300() -> LoadedRecipe {
        tiny_lora(|t| {
            t.replace("  name: cpu\n", "  name: mi300x\n").replace(
                "  log_every_steps: 10\n",
                "  log_every_steps: 10\n  env:\n    HSA_NO_SCRATCH_RECLAIM: \"1\"\n    NVTE_CK_USES_BWD_V3: \"1\"\n    \
                 NVTE_CK_IS_V3_ATOMIC_FP32: \"1\"\n    PRIMUS_TURBO_ATTN_V3_ATOMIC_FP32: \"1\"\n    \
                 NCCL_MIN_NCHANNELS: \"112\"\n    HIP_FORCE_DEV_KERNARG: \"1\"\n    PYTORCH_ROCM_ARCH: gfx942\n",
            )
        })
    }

    #[test]
    fn a_plan_env_override_is_applied_to_the_run_environment() {
        let dir = tempfile::tempdir().unwrap();
        let s = spec(mi300(), &[("NCCL_MIN_NCHANNELS", Some("64")), ("EXTRA_FLAG", Some("1"))], dir.path());
        let env = effective_env(&s).unwrap();
        assert_eq!(env["NCCL_MIN_NCHANNELS"], "64");
        assert_eq!(env["EXTRA_FLAG"], "1");
        assert_eq!(env["HSA_NO_SCRATCH_RECLAIM"], "1");
        assert_eq!(env.len(), 8);

        // No overrides: the recipe's env as it is.
        let s = spec(mi300(), &[], dir.path());
        assert_eq!(effective_env(&s).unwrap(), s.recipe.recipe.train.env);
    }

    #[test]
    fn a_plan_that_drops_a_mandatory_env_key_is_refused_before_training() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("out");
        for (env, want) in [
            (None, EnvOverrideError::RemovesMandatoryKey { key: "HSA_NO_SCRATCH_RECLAIM".into() }),
            (Some(""), EnvOverrideError::EmptiesMandatoryKey { key: "HSA_NO_SCRATCH_RECLAIM".into() }),
        ] {
            let s = spec(mi300(), &[("HSA_NO_SCRATCH_RECLAIM", env)], &out);
            let err = train(&s, &mut Discard, &mut Quiet).unwrap_err();
            match &err {
                RunError::Env(e) => assert_eq!(e, &want),
                other => panic!("expected RunError::Env, got {other:?}"),
            }
            assert!(err.to_string().contains("mandatory ROCm env key HSA_NO_SCRATCH_RECLAIM"), "{err}");
            assert!(!out.exists(), "nothing may be written before the refusal");
            assert!(matches!(evaluate_checkpoint(&s, dir.path(), &mut |_| {}), Err(RunError::Env(_))));
        }
    }

    #[test]
    fn run_started_records_the_effective_env() {
        let dir = tempfile::tempdir().unwrap();
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../recipes/tiny_cpu_lora.yaml");
        let text = std::fs::read_to_string(&path).unwrap();
        let text = text
            .replace("  log_every_steps: 10\n", "  log_every_steps: 10\n  env:\n    KEEP: \"a\"\n    GONE: \"b\"\n")
            .replace("  tokenizer: byte\n", "  tokenizer: byte\n  random_init: true\n");
        let recipe = Recipe::from_str(&text, "tiny.yaml").unwrap_or_else(|e| panic!("{e}"));
        let s = spec(recipe, &[("KEEP", Some("c")), ("GONE", None), ("NEW", Some("d"))], dir.path());
        let mut sink = Collect(Vec::new());
        Session::open(&s, None, &mut sink).unwrap();
        let started = sink.0.iter().find(|e| e.kind == "run.started").expect("run.started");
        assert_eq!(started.data["env"], serde_json::json!({"KEEP": "c", "NEW": "d"}));
    }

    fn tiny_lora(edit: impl Fn(String) -> String) -> LoadedRecipe {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../recipes/tiny_cpu_lora.yaml");
        let text = edit(std::fs::read_to_string(&path).unwrap());
        Recipe::from_str(&text, "tiny.yaml").unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn an_adapter_on_random_weights_is_refused_unless_the_recipe_asks_for_it() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("out");
        let s = spec(tiny_lora(|t| t), &[], &out);
        let err = train(&s, &mut Discard, &mut Quiet).unwrap_err();
        assert!(matches!(err, RunError::RandomBase), "{err}");
        assert!(err.to_string().contains("model.random_init: true"), "{err}");
        assert!(!out.exists(), "refused before anything is written");

        let s = spec(
            tiny_lora(|t| t.replace("  tokenizer: byte\n", "  tokenizer: byte\n  random_init: true\n")),
            &[],
            &out,
        );
        let mut sink = Collect(Vec::new());
        Session::open(&s, None, &mut sink).unwrap();
        let record = OutDir::new(&out).read_record().unwrap().unwrap();
        assert_eq!(record.base, Some(BaseRecord::RandomInit { seed: 7 }));
        let started = sink.0.iter().find(|e| e.kind == "run.started").unwrap();
        assert_eq!(started.data["base"]["kind"], "random_init");
    }
}
