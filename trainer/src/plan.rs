//! The ahead-of-time (AOT) autotune plan: measured once before training, replayed verbatim.
//!
//! `mindxtrain bench` times candidate [`Choices`] on the real machine with the recipe's
//! shapes, inside `autotune.budget_seconds`, and writes the fastest as a [`Plan`]. A run
//! reads that file, checks it was made for the same recipe bytes, and uses its choices as
//! they are: nothing is re-tuned during training, so two runs of one recipe and plan do
//! the same arithmetic. The run records the plan's BLAKE3 (of the exact file bytes).
//!
//! ```
//! use mindxtrain_trainer::plan::{Choices, Plan};
//! use mindxtrain_kernels::attention::AttentionKernels;
//! let choices = Choices {
//!     threads: 2,
//!     micro_batch: 8,
//!     activation_checkpointing: false,
//!     gemm_rows: 128,
//!     attention: AttentionKernels::DEFAULT,
//!     moe: Default::default(),
//! };
//! let plan = Plan::new([7; 32], "cpu", choices, vec![], 10, 1234, false);
//! let bytes = plan.to_bytes();
//! let back = Plan::from_bytes(&bytes, "plan.json").unwrap();
//! assert_eq!(back, plan);
//! ```

mod measure;
pub mod parallel;

pub use measure::{
    Candidate, MeasureError, Measured, Probe, attention_candidates, candidates, gpu_candidates, keeping_checkpointing,
    measure, moe_candidates,
};
pub use parallel::{CollectiveCandidate, CollectiveStage, OpTiming, ParallelPlan};

use mindxtrain_kernels::KernelConfig;
use mindxtrain_kernels::attention::AttentionKernels;
use mindxtrain_kernels::gemm_algos::{GemmAlgo, GemmShape};
use mindxtrain_kernels::moe::MoeKernels;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::Path;
use thiserror::Error;

/// Plan format version written by this build.
pub const PLAN_VERSION: u32 = 1;

/// What the plan decides. Every field changes speed or memory, never the result beyond
/// floating-point summation order (`micro_batch` changes how a step's rows are split).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Choices {
    /// Worker threads for the CPU kernels (rayon pool and matmul parallelism).
    pub threads: usize,
    /// Rows per forward/backward pass; a step of `per_device` rows runs
    /// `per_device / micro_batch` passes and sums their gradients.
    pub micro_batch: usize,
    /// Recompute each block's activations in the backward pass instead of keeping them.
    pub activation_checkpointing: bool,
    /// Matmul blocking: token rows per task of the CPU linear kernels. Absent in plans
    /// written before it existed, which then get the kernels' default.
    #[serde(default = "default_gemm_rows")]
    pub gemm_rows: usize,
    /// The GPU flash-attention kernels: forward key tile, and dQ splits (1 = the deterministic
    /// backward). CPU runs ignore it; absent in older plans, which get the default.
    #[serde(default)]
    pub attention: AttentionKernels,
    /// The CPU grouped GEMMs of a mixture-of-experts model: tile and expert order. Measured on
    /// the CPU for MoE recipes only; on a GPU cuBLAS's grouped GEMM picks its own tiles and this
    /// keeps the default. Absent in older plans, which get the default.
    #[serde(default)]
    pub moe: MoeKernels,
}

fn default_gemm_rows() -> usize {
    mindxtrain_kernels::linear::DEFAULT_BLOCK_ROWS
}

impl Choices {
    /// The kernel settings of these choices (CPU GEMM blocking, GPU attention kernels), with
    /// no GEMM table.
    pub fn kernels(&self) -> Result<KernelConfig, String> {
        Ok(KernelConfig::new(self.gemm_rows, self.attention).map_err(|e| e.to_string())?.with_moe(self.moe))
    }

    /// Choices without a measurement (evaluation without a plan): `threads`, whole
    /// micro-batches, no checkpointing, the kernels' default blocking.
    pub fn unmeasured(threads: usize) -> Choices {
        Choices {
            threads,
            micro_batch: 1,
            activation_checkpointing: false,
            gemm_rows: default_gemm_rows(),
            attention: AttentionKernels::DEFAULT,
            moe: MoeKernels::default(),
        }
    }
}

/// One timed candidate.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Measurement {
    pub choices: Choices,
    /// Median wall time of the timed steps, in microseconds; `None` when it failed.
    pub step_us: Option<u64>,
    pub steps_timed: u32,
    /// Why the candidate has no time (error, or skipped for lack of budget).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// One distinct GEMM shape of a training step on a GPU: every candidate algorithm timed, and
/// the one a run uses.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GemmMeasurement {
    pub shape: GemmShape,
    pub chosen: GemmAlgo,
    pub timings: Vec<GemmTiming>,
}

/// One GEMM candidate's time.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GemmTiming {
    pub algo: GemmAlgo,
    /// Mean microseconds per call; `None` when it failed or was not timed (see `note`).
    pub us: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// The machine the plan was measured on; a plan replayed elsewhere still runs, but the
/// run records the mismatch.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Machine {
    pub device: String,
    pub cpu: String,
    pub logical_cpus: usize,
    pub os: String,
    /// The device's memory in GB (10^9 bytes): the GPU's, or the host's for the CPU. Absent in
    /// older plans.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_gb: Option<f64>,
}

impl Machine {
    pub fn this(device: &str) -> Machine {
        Machine {
            device: device.to_string(),
            cpu: cpu_model().unwrap_or_else(|| "unknown".into()),
            logical_cpus: std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
            os: format!("{}-{}", std::env::consts::OS, std::env::consts::ARCH),
            memory_gb: None,
        }
    }
}

fn cpu_model() -> Option<String> {
    let info = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    info.lines().find_map(|l| l.strip_prefix("model name").map(|v| v.trim_start_matches([' ', '\t', ':']).to_string()))
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Plan {
    pub v: u32,
    /// BLAKE3 (hex) of the recipe bytes the plan was measured for.
    pub recipe_blake3: String,
    pub machine: Machine,
    pub choices: Choices,
    pub measurements: Vec<Measurement>,
    pub budget_seconds: u32,
    pub elapsed_ms: u64,
    /// True when the budget ran out before every candidate was timed.
    pub truncated: bool,
    pub software: String,
    /// The recipe asked for bitwise-reproducible runs (`autotune.deterministic`), so only
    /// deterministic kernels were candidates. Older plans: true.
    #[serde(default = "yes")]
    pub deterministic: bool,
    /// The GPU GEMM algorithm of each distinct shape (empty on a CPU).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gemms: Vec<GemmMeasurement>,
    /// Overrides of the recipe's `train.env`: a string sets or replaces a key, `null` removes
    /// it. Applied with [`crate::recipe::apply_plan_env`], so on MI300-class hardware a plan
    /// may retune a mandatory ROCm key but never drop or empty it. Absent in older plans
    /// (and written only when non-empty).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, Option<String>>,
    /// Measured for a run on several ranks: its layout and the probe's collective stage (absent
    /// for one process).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parallel: Option<ParallelPlan>,
    /// Why nothing was measured, when nothing was (`autotune.enabled: false`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// What the probe found that the recipe did not expect (a device whose memory differs from
    /// `hardware.memory_gb`), shown when the plan is made and kept with it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
}

fn yes() -> bool {
    true
}

#[derive(Debug, Error)]
pub enum PlanError {
    #[error("{path}: cannot read the plan: {source}")]
    Read { path: String, source: std::io::Error },
    #[error("{path}: not a valid plan: {message}")]
    Invalid { path: String, message: String },
    #[error("{path}: plan version {found} is not supported (this build reads {PLAN_VERSION})")]
    Version { path: String, found: u32 },
    #[error(
        "{path}: the plan was measured for recipe {plan} but this recipe is {recipe}: leave --plan out to measure one for this recipe (or `mindxtrain bench RECIPE --out NEW.json`)"
    )]
    WrongRecipe { path: String, plan: String, recipe: String },
    #[error("{path}: the plan breaks {field}: {message}")]
    Breaks { path: String, field: &'static str, message: String },
}

impl Plan {
    pub fn new(
        recipe_blake3: [u8; 32],
        device: &str,
        choices: Choices,
        measurements: Vec<Measurement>,
        budget_seconds: u32,
        elapsed_ms: u64,
        truncated: bool,
    ) -> Plan {
        Plan {
            v: PLAN_VERSION,
            recipe_blake3: hex(&recipe_blake3),
            machine: Machine::this(device),
            choices,
            measurements,
            budget_seconds,
            elapsed_ms,
            truncated,
            software: concat!("mindxtrain-trainer/", env!("CARGO_PKG_VERSION")).to_string(),
            deterministic: true,
            gemms: Vec::new(),
            env: BTreeMap::new(),
            parallel: None,
            note: None,
            warnings: Vec::new(),
        }
    }

    /// The GEMM table a run uses: each measured shape and its chosen algorithm.
    pub fn gemm_algos(&self) -> impl Iterator<Item = (GemmShape, GemmAlgo)> + '_ {
        self.gemms.iter().map(|g| (g.shape, g.chosen.clone()))
    }

    /// What the kernels of a run under this plan are told: its choices and its GEMM table.
    pub fn kernels(&self) -> Result<KernelConfig, String> {
        self.choices.kernels()?.with_gemm_algos(self.gemm_algos())
    }

    /// The file form: pretty JSON with a final newline. The plan's identity is the BLAKE3
    /// of these exact bytes, so the file is never rewritten after it is measured.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = serde_json::to_vec_pretty(self).unwrap_or_default();
        out.push(b'\n');
        out
    }

    pub fn from_bytes(bytes: &[u8], path: &str) -> Result<Plan, PlanError> {
        let value: serde_json::Value = serde_json::from_slice(bytes)
            .map_err(|e| PlanError::Invalid { path: path.to_string(), message: e.to_string() })?;
        let found = value.get("v").and_then(|v| v.as_u64()).unwrap_or(0);
        if found != u64::from(PLAN_VERSION) {
            return Err(PlanError::Version { path: path.to_string(), found: found as u32 });
        }
        let plan: Plan = serde_json::from_value(value)
            .map_err(|e| PlanError::Invalid { path: path.to_string(), message: e.to_string() })?;
        let c = plan.choices;
        let invalid = |message: String| PlanError::Invalid { path: path.to_string(), message };
        if c.threads == 0 || c.micro_batch == 0 {
            return Err(invalid("choices.threads and choices.micro_batch must be at least 1".into()));
        }
        c.attention.validate().map_err(|e| invalid(format!("choices.attention: {e}")))?;
        if plan.deterministic && !c.attention.deterministic() {
            return Err(invalid("a deterministic plan chose a non-deterministic attention backward".into()));
        }
        for g in &plan.gemms {
            g.chosen.lt_bytes().map_err(|e| invalid(format!("gemms: {e}")))?;
        }
        Ok(plan)
    }

    /// Reads a plan and returns it with the BLAKE3 of its bytes.
    pub fn read(path: &Path) -> Result<(Plan, [u8; 32]), PlanError> {
        let shown = path.display().to_string();
        let bytes = std::fs::read(path).map_err(|source| PlanError::Read { path: shown.clone(), source })?;
        let plan = Plan::from_bytes(&bytes, &shown)?;
        Ok((plan, *blake3::hash(&bytes).as_bytes()))
    }

    /// Refuses a plan measured for other recipe bytes: its choices were never timed
    /// with these shapes.
    pub fn check_recipe(&self, recipe_blake3: &[u8; 32], path: &str) -> Result<(), PlanError> {
        let recipe = hex(recipe_blake3);
        if self.recipe_blake3 != recipe {
            return Err(PlanError::WrongRecipe { path: path.to_string(), plan: self.recipe_blake3.clone(), recipe });
        }
        Ok(())
    }

    /// Refuses a plan whose choices break a constraint the recipe sets on them (a plan made for
    /// these recipe bytes by an older build, or edited by hand).
    pub fn check_constraints(&self, recipe: &crate::recipe::Recipe, path: &str) -> Result<(), PlanError> {
        if let Some(on) = recipe.train.gradient_checkpointing
            && self.choices.activation_checkpointing != on
        {
            return Err(PlanError::Breaks {
                path: path.to_string(),
                field: "train.gradient_checkpointing",
                message: format!(
                    "the recipe says {on}, the plan's activation_checkpointing is {}: leave --plan out to measure \
                     a plan that keeps it",
                    self.choices.activation_checkpointing
                ),
            });
        }
        Ok(())
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan() -> Plan {
        let c = Choices {
            threads: 2,
            micro_batch: 4,
            activation_checkpointing: true,
            gemm_rows: 64,
            attention: AttentionKernels { key_tile: 32, dq_splits: 1 },
            moe: MoeKernels::default(),
        };
        let m = vec![Measurement { choices: c, step_us: Some(1500), steps_timed: 3, note: None }];
        let mut p = Plan::new([1; 32], "cuda:0", c, m, 10, 900, false);
        let lt = GemmAlgo::Lt { index: 1, algo: "0a".repeat(64) };
        p.gemms.push(GemmMeasurement {
            shape: GemmShape { m: 1024, n: 16384, k: 1024, transa: true, transb: false, bf16: true },
            chosen: lt.clone(),
            timings: vec![
                GemmTiming { algo: GemmAlgo::Default, us: Some(41.5), note: None },
                GemmTiming { algo: lt, us: Some(39.25), note: None },
            ],
        });
        p
    }

    #[test]
    fn kernel_choices_are_checked_on_read() {
        let p = plan();
        assert_eq!(p.gemm_algos().count(), 1);
        let mut v = serde_json::to_value(&p).unwrap();
        v["choices"]["attention"]["dq_splits"] = 2.into();
        let err = Plan::from_bytes(&serde_json::to_vec(&v).unwrap(), "p.json").unwrap_err();
        assert!(err.to_string().contains("deterministic plan"), "{err}");
        v["deterministic"] = false.into();
        assert!(Plan::from_bytes(&serde_json::to_vec(&v).unwrap(), "p.json").is_ok());
        v["choices"]["attention"]["key_tile"] = 48.into();
        let err = Plan::from_bytes(&serde_json::to_vec(&v).unwrap(), "p.json").unwrap_err();
        assert!(err.to_string().contains("key tile 48"), "{err}");

        let mut v = serde_json::to_value(&p).unwrap();
        v["gemms"][0]["chosen"]["algo"] = "xyz".into();
        let err = Plan::from_bytes(&serde_json::to_vec(&v).unwrap(), "p.json").unwrap_err();
        assert!(err.to_string().contains("gemms: gemm algorithm"), "{err}");

        // A plan from before these fields reads with the defaults.
        let mut v = serde_json::to_value(&p).unwrap();
        for key in ["deterministic", "gemms", "env"] {
            v.as_object_mut().unwrap().remove(key);
        }
        v["choices"].as_object_mut().unwrap().remove("attention");
        let old = Plan::from_bytes(&serde_json::to_vec(&v).unwrap(), "p.json").unwrap();
        assert!(old.deterministic && old.gemms.is_empty() && old.env.is_empty());
        assert_eq!(old.choices.attention, AttentionKernels::DEFAULT);
    }

    #[test]
    fn round_trips_byte_for_byte() {
        let mut p = plan();
        p.env.insert("NCCL_MIN_NCHANNELS".into(), Some("64".into()));
        p.env.insert("EXTRA".into(), None);
        let bytes = p.to_bytes();
        let back = Plan::from_bytes(&bytes, "p.json").unwrap();
        assert_eq!(back, p);
        assert_eq!(back.to_bytes(), bytes);
    }

    #[test]
    fn rejects_unknown_fields_and_versions_and_zero_choices() {
        let mut v = serde_json::to_value(plan()).unwrap();
        v["extra"] = 1.into();
        let err = Plan::from_bytes(&serde_json::to_vec(&v).unwrap(), "p.json").unwrap_err();
        assert!(err.to_string().contains("unknown field `extra`"), "{err}");

        let mut v = serde_json::to_value(plan()).unwrap();
        v["v"] = 9.into();
        assert!(matches!(Plan::from_bytes(&serde_json::to_vec(&v).unwrap(), "p"), Err(PlanError::Version { .. })));

        let mut v = serde_json::to_value(plan()).unwrap();
        v["choices"]["threads"] = 0.into();
        let err = Plan::from_bytes(&serde_json::to_vec(&v).unwrap(), "p.json").unwrap_err();
        assert!(err.to_string().contains("at least 1"), "{err}");

        let err = Plan::from_bytes(b"{not json", "p.json").unwrap_err();
        assert!(err.to_string().starts_with("p.json: not a valid plan"), "{err}");
    }

    #[test]
    fn a_plan_for_other_recipe_bytes_is_refused() {
        let p = plan();
        assert!(p.check_recipe(&[1; 32], "p").is_ok());
        let err = p.check_recipe(&[2; 32], "p").unwrap_err();
        assert!(matches!(err, PlanError::WrongRecipe { .. }), "{err}");
    }

    #[test]
    fn the_digest_is_of_the_exact_file_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("plan.json");
        let bytes = plan().to_bytes();
        std::fs::write(&path, &bytes).unwrap();
        let (_, digest) = Plan::read(&path).unwrap();
        assert_eq!(digest, *blake3::hash(&bytes).as_bytes());
    }
}
