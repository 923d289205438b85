//! `mindxtrain bench`: measuring the plan with the recipe's own shapes and data, on the device
//! the recipe's hardware names (the CPU, or one CUDA GPU).
//!
//! On a CPU every candidate is a whole training step (for a mixture-of-experts model, the
//! grouped GEMMs' tile and expert order are a second stage at the first's winner, with 30% of
//! the budget). On a GPU the budget is spent in three
//! stages: the batch split × activation checkpointing (half the budget), then the attention
//! kernels at the winner (most of the rest; the GEMM shapes of those steps are recorded), then
//! every recorded GEMM shape against cuBLASLt's candidates (what is left).

use super::RunError;
use super::method::MethodPlan;
use super::microbatch::{accumulate, split};
use crate::data::{DataCursor, DataOptions, Dataset};
use crate::model::{Adapters, CausalLm, LmConfig, StepOptions};
use crate::plan::{
    Choices, GemmMeasurement, GemmTiming, Plan, attention_candidates, candidates, gpu_candidates,
    keeping_checkpointing, measure, moe_candidates,
};
use crate::recipe::LoadedRecipe;
use candle_core::DType;
use mindxtrain_kernels::GemmShapeLog;
use mindxtrain_kernels::gemm_algos::{GemmAlgo, GemmShape};
use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

/// Times every candidate [`Choices`] on this machine within `autotune.budget_seconds`
/// and returns the plan. The model is the recipe's shape (random weights: speed does not
/// depend on their values); the batch is the first real batch of the recipe's data. A
/// probe step is the forward/backward of every micro-batch: the optimizer update costs the
/// same whatever the choices. The shape, tokenizer and chat template are those of the run's
/// base (`init_from`, else the recipe's: [`super::base::base_dir`]).
///
/// With `autotune.enabled: false` nothing is timed: the plan holds the defaults (all host
/// threads, the whole batch in one micro-batch, checkpointing as the recipe says, the kernels'
/// default blocking) and says so in its `note`.
pub fn measure_plan(
    recipe: &LoadedRecipe,
    recipe_dir: &Path,
    init_from: Option<&Path>,
    data: DataOptions,
) -> Result<Plan, RunError> {
    let r = &recipe.recipe;
    let device = super::run_device(r)?;
    if !r.autotune.enabled {
        return Ok(default_plan(recipe, &device));
    }
    let base = super::base::base_dir(r, recipe_dir, init_from)?.map(|b| b.dir);
    let config = model_config(r, base.as_deref())?;
    let dtype = crate::checkpoint::model_dtype(r.model.dtype);
    let method = MethodPlan::from_recipe(&r.train.method)?;
    // A QLoRA recipe is timed on the NF4 base it trains on (its products expand each weight
    // first), built weight by weight so a base that fits the device only in NF4 fits here too.
    let mut model = match (device.is_cuda(), method.nf4_base) {
        (true, true) => CausalLm::init_for_timing_nf4(&config, dtype, &device)?,
        (true, false) => CausalLm::init_for_timing(&config, dtype, &device)?,
        (false, nf4) => {
            let mut m = CausalLm::init_random(&config, r.meta.seed, dtype, &device)?;
            if nf4 {
                m.quantize_nf4()?;
            }
            m
        }
    };
    let adapters = match &method.lora {
        Some(l) => Some(Adapters::init(&config, l, r.meta.seed, model.dtype(), &device)?),
        None => None,
    };
    let tokenizer = super::base::tokenizer(r, recipe_dir, base.as_deref())?;
    let dataset = Dataset::from_recipe(r, recipe_dir, &tokenizer, data)?;
    let per_device = r.train.batch.per_device as usize;
    // Preference recipes are timed on their chosen rows: the same shapes, half the rows.
    let batch = if dataset.is_preference() {
        dataset.preference_batches(per_device, DataCursor::default())?.next_batch()?.chosen
    } else {
        dataset.batches(per_device, DataCursor::default())?.next_batch()?
    };
    let scale = 1.0 / batch.target_tokens().max(1) as f64;
    let trainable = method.trainable;
    // While set, every probed step records the GEMM shapes it runs into this log.
    let recording: std::cell::RefCell<Option<GemmShapeLog>> = std::cell::RefCell::new(None);
    let mut probe = |c: &Choices| -> Result<(), String> {
        let pool = super::thread_pool(c.threads).map_err(|e| e.to_string())?;
        let kernels = c.kernels()?;
        model.set_kernels(match &*recording.borrow() {
            Some(log) => kernels.recording_into(log),
            None => kernels,
        });
        pool.install(|| {
            let opts = StepOptions {
                activation_checkpointing: c.activation_checkpointing,
                dropout_seed: 1,
                loss_scale: scale,
            };
            let mut grads = BTreeMap::new();
            for mb in split(&batch, c.micro_batch) {
                let out =
                    model.forward_backward(&mb, trainable, adapters.as_ref(), &opts).map_err(|e| e.to_string())?;
                accumulate(&mut grads, out.grads).map_err(|e| e.to_string())?;
            }
            // GPU work is queued: a step's time is until it has finished.
            device.synchronize().map_err(|e| e.to_string())
        })
    };
    let budget = Duration::from_secs(u64::from(r.autotune.budget_seconds));
    let failed = |e: crate::plan::MeasureError| RunError::Recipe(format!("autotune: {e}"));
    let start = Instant::now();
    let deterministic = r.autotune.deterministic;
    let cpus = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    let checkpointing = r.train.gradient_checkpointing;
    let cpu_candidates = keeping_checkpointing(candidates(cpus, per_device), checkpointing);
    let (best, measurements, truncated, gemms) = if device.is_cuda() {
        // Steps are timed with cuBLAS's default algorithms (the choices carry no GEMM table);
        // the GEMM stage picks per shape.
        let cands = keeping_checkpointing(gpu_candidates(cpus, per_device), checkpointing);
        // One untimed step first, outside the budget, like loading the model: the first launch
        // of each kernel module JIT-compiles its PTX (seconds on a cold machine), which no
        // candidate should be charged for. Its error, if any, recurs in the timed step and is
        // recorded there.
        let _ = probe(&cands[0]);
        let start = Instant::now();
        let batch_split = measure(&cands, budget / 2, &mut probe).map_err(failed)?;
        *recording.borrow_mut() = Some(GemmShapeLog::default());
        let kernels = measure(
            &attention_candidates(batch_split.best, deterministic),
            budget.saturating_sub(start.elapsed()).mul_f64(0.7),
            &mut probe,
        );
        let shapes = recording.borrow_mut().take().map(|log| log.shapes()).unwrap_or_default();
        // Stage 1 may have spent the budget (slow steps, or candidates that fail slowly): the
        // batch split it found stands, with the default kernels.
        let kernels = match kernels {
            Err(crate::plan::MeasureError::NothingMeasured { measurements, .. }) => crate::plan::Measured {
                best: batch_split.best,
                measurements,
                elapsed: start.elapsed(),
                truncated: true,
            },
            other => other.map_err(failed)?,
        };
        let (gemms, gemms_truncated) = measure_gemms(&device, &shapes, budget.saturating_sub(start.elapsed()));
        let mut measurements = batch_split.measurements;
        measurements.extend(kernels.measurements);
        (kernels.best, measurements, batch_split.truncated || kernels.truncated || gemms_truncated, gemms)
    } else if config.moe.is_some() {
        // A mixture-of-experts model: the grouped GEMMs' tile and expert order are timed at the
        // winner of the other choices, with what the first stage left (it gets most of it).
        let first = measure(&cpu_candidates, budget.mul_f64(0.7), &mut probe).map_err(failed)?;
        let moe = measure(&moe_candidates(first.best), budget.saturating_sub(start.elapsed()), &mut probe);
        let (best, more, truncated) = match moe {
            Ok(m) => (m.best, m.measurements, m.truncated),
            // The first stage spent the budget: its winner stands with the default tiles.
            Err(crate::plan::MeasureError::NothingMeasured { measurements, .. }) => (first.best, measurements, true),
        };
        let mut measurements = first.measurements;
        measurements.extend(more);
        (best, measurements, first.truncated || truncated, Vec::new())
    } else {
        let m = measure(&cpu_candidates, budget, &mut probe).map_err(failed)?;
        (m.best, m.measurements, m.truncated, Vec::new())
    };
    let mut plan = Plan::new(
        recipe.bytes_blake3,
        &super::device_name(&device),
        best,
        measurements,
        r.autotune.budget_seconds,
        start.elapsed().as_millis() as u64,
        truncated,
    );
    plan.deterministic = deterministic;
    plan.gemms = gemms;
    describe_memory(&mut plan, r, &device);
    Ok(plan)
}

/// The plan of a recipe that turns the probe off (`autotune.enabled: false`).
fn default_plan(recipe: &LoadedRecipe, device: &candle_core::Device) -> Plan {
    let r = &recipe.recipe;
    let cpus = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    let choices = Choices {
        micro_batch: r.train.batch.per_device as usize,
        activation_checkpointing: r.train.gradient_checkpointing.unwrap_or(false),
        ..Choices::unmeasured(cpus)
    };
    let mut plan = Plan::new(
        recipe.bytes_blake3,
        &super::device_name(device),
        choices,
        Vec::new(),
        r.autotune.budget_seconds,
        0,
        false,
    );
    plan.deterministic = r.autotune.deterministic;
    plan.note = Some("autotune.enabled is false: the defaults, nothing measured".into());
    describe_memory(&mut plan, r, device);
    plan
}

/// Notes the device's memory in the plan and warns when it is not what the recipe was sized
/// for (`hardware.memory_gb`, more than 10% off either way): batch sizes chosen for another
/// card may not fit, or may leave most of this one idle.
fn describe_memory(plan: &mut Plan, r: &crate::recipe::Recipe, device: &candle_core::Device) {
    let gb = mindxtrain_kernels::memory::total_bytes(device).ok().map(|b| b as f64 / 1e9);
    plan.machine.memory_gb = gb.map(|g| (g * 10.0).round() / 10.0);
    if let Some(warning) = memory_warning(r.hardware.memory_gb, gb) {
        plan.warnings.push(warning);
    }
}

fn memory_warning(sized_for: Option<u32>, found_gb: Option<f64>) -> Option<String> {
    let want = f64::from(sized_for?);
    let Some(found) = found_gb else {
        return Some(format!(
            "hardware.memory_gb is {want}, but this device's memory could not be read: the plan does not know \
             whether the recipe's batches fit"
        ));
    };
    ((found - want).abs() > 0.1 * want).then(|| {
        format!(
            "hardware.memory_gb is {want} but this device has {found:.1} GB: the recipe was sized for another \
             card, so its batches may not fit here (or may leave memory unused)"
        )
    })
}

/// The model shape a run trains: the `config.json` of its base directory, else `model.config`
/// (a run's [`super::base::check_base_choice`] refuses a `model.config` that says another shape).
fn model_config(r: &crate::recipe::Recipe, base: Option<&Path>) -> Result<LmConfig, RunError> {
    match (base, &r.model.config) {
        (Some(dir), _) => {
            let path = dir.join(crate::checkpoint::CONFIG_FILE);
            let bytes = std::fs::read_to_string(&path)
                .map_err(|e| RunError::Io { path: path.display().to_string(), message: e.to_string() })?;
            Ok(LmConfig::from_hf_json(&bytes)?)
        }
        (None, Some(c)) => {
            LmConfig::from_recipe(c, r.model.family).ok_or_else(|| crate::checkpoint::LoadError::NoModel.into())
        }
        (None, None) => Err(crate::checkpoint::LoadError::NoModel.into()),
    }
}

/// The gradient buckets a run of `recipe` sends each step (bytes, in the order the backward
/// completes them) and the dtype they travel in: what the probe's collective stage times.
pub fn gradient_buckets(
    recipe: &LoadedRecipe,
    recipe_dir: &Path,
    init_from: Option<&Path>,
) -> Result<(Vec<u64>, DType), RunError> {
    use crate::model::{Stage, stage_of};
    let r = &recipe.recipe;
    let base = super::base::base_dir(r, recipe_dir, init_from)?.map(|b| b.dir);
    let config = model_config(r, base.as_deref())?;
    let method = MethodPlan::from_recipe(&r.train.method)?;
    let shapes = match &method.lora {
        Some(l) => l.shapes(&config),
        None => crate::model::expected_shapes(&config),
    };
    let dtype = crate::checkpoint::model_dtype(r.model.dtype);
    // Stages in the order the backward completes them: the head, the blocks from the last, the
    // embedding; names in order within a stage (as the reducer receives them).
    let key = |name: &str| match stage_of(name) {
        Stage::Head => (0, 0),
        Stage::Block(l) => (1, usize::MAX - l),
        Stage::Embedding => (2, 0),
    };
    let mut names: Vec<(&String, &Vec<usize>)> = shapes.iter().collect();
    names.sort_by(|a, b| key(a.0).cmp(&key(b.0)).then_with(|| a.0.cmp(b.0)));
    let bytes = names.iter().map(|(_, dims)| (dims.iter().product::<usize>() * dtype.size_in_bytes()) as u64);
    Ok((crate::plan::parallel::bucket_sizes(bytes, r.train.distributed.bucket_bytes() as u64), dtype))
}

/// cuBLASLt candidates timed per GEMM shape beside cuBLAS's default.
const LT_CANDIDATES: usize = 4;
/// A cuBLASLt algorithm is chosen only when it beats the default by more than this fraction:
/// smaller differences are within the timing noise.
const LT_MARGIN: f64 = 0.01;

/// Times every shape's candidates within `budget` (an even share of what is left each) and
/// picks the fastest; shapes the budget does not reach keep the default. Returns whether any
/// were left untimed.
fn measure_gemms(device: &candle_core::Device, shapes: &[GemmShape], budget: Duration) -> (Vec<GemmMeasurement>, bool) {
    let start = Instant::now();
    let mut truncated = false;
    let mut out = Vec::with_capacity(shapes.len());
    for (i, shape) in shapes.iter().enumerate() {
        let left = budget.saturating_sub(start.elapsed());
        // Half the share goes to timed calls: warm-ups and the heuristic query take the rest.
        let per_candidate_ms =
            (left.as_secs_f64() * 1e3 / ((shapes.len() - i) * (LT_CANDIDATES + 1)) as f64 / 2.0).min(20.0);
        let timings = if per_candidate_ms < 0.5 {
            truncated = true;
            vec![GemmTiming {
                algo: GemmAlgo::Default,
                us: None,
                note: Some("not timed: the autotune budget was spent".into()),
            }]
        } else {
            time_gemm(device, shape, per_candidate_ms)
        };
        out.push(GemmMeasurement { shape: *shape, chosen: fastest(&timings), timings });
    }
    (out, truncated)
}

/// The default unless a timed cuBLASLt algorithm beats it by more than [`LT_MARGIN`].
fn fastest(timings: &[GemmTiming]) -> GemmAlgo {
    let default_us = timings.iter().find(|t| t.algo == GemmAlgo::Default).and_then(|t| t.us);
    timings
        .iter()
        .filter_map(|t| Some((t.us?, &t.algo)))
        .filter(|(us, algo)| **algo == GemmAlgo::Default || default_us.is_none_or(|d| *us < d * (1.0 - LT_MARGIN)))
        .min_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(_, algo)| algo.clone())
        .unwrap_or(GemmAlgo::Default)
}

#[cfg(feature = "cuda")]
fn time_gemm(device: &candle_core::Device, shape: &GemmShape, per_candidate_ms: f64) -> Vec<GemmTiming> {
    match mindxtrain_kernels::gemm_algos::time_candidates(device, shape, LT_CANDIDATES, per_candidate_ms) {
        Ok(ts) => ts
            .into_iter()
            .map(|t| GemmTiming { algo: t.algo, us: t.us, note: t.error.map(|e| format!("failed: {e}")) })
            .collect(),
        Err(e) => vec![GemmTiming { algo: GemmAlgo::Default, us: None, note: Some(format!("failed: {e}")) }],
    }
}

/// Without CUDA there is no GPU GEMM to time (and no GPU run reaches here).
#[cfg(not(feature = "cuda"))]
fn time_gemm(_: &candle_core::Device, _: &GemmShape, _: f64) -> Vec<GemmTiming> {
    vec![GemmTiming { algo: GemmAlgo::Default, us: None, note: Some("not timed: built without cuda".into()) }]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn timing(algo: GemmAlgo, us: Option<f64>) -> GemmTiming {
        GemmTiming { algo, us, note: None }
    }

    #[test]
    fn a_cublaslt_algorithm_must_beat_the_default_clearly() {
        let lt = |index| GemmAlgo::Lt { index, algo: "00".repeat(64) };
        let d = GemmAlgo::Default;
        assert_eq!(fastest(&[timing(d.clone(), Some(100.0)), timing(lt(0), Some(99.5))]), d);
        assert_eq!(
            fastest(&[timing(d.clone(), Some(100.0)), timing(lt(0), Some(90.0)), timing(lt(1), Some(95.0))]),
            lt(0)
        );
        // A failed default: the fastest timed algorithm; nothing timed: the default.
        assert_eq!(fastest(&[timing(d.clone(), None), timing(lt(2), Some(120.0))]), lt(2));
        assert_eq!(fastest(&[timing(lt(0), None)]), d);
    }

    #[test]
    fn shapes_past_the_budget_keep_the_default() {
        let shape = GemmShape { m: 8, n: 8, k: 8, transa: false, transb: false, bf16: false };
        let (gemms, truncated) = measure_gemms(&candle_core::Device::Cpu, &[shape, shape], Duration::ZERO);
        assert!(truncated);
        assert!(gemms.iter().all(|g| g.chosen == GemmAlgo::Default && g.timings[0].us.is_none()));
    }

    /// The tiny LoRA recipe on random weights, edited.
    fn tiny(edit: impl Fn(String) -> String) -> LoadedRecipe {
        let text = include_str!("../../../recipes/tiny_cpu_lora.yaml")
            .replace("  tokenizer: byte\n", "  tokenizer: byte\n  random_init: true\n")
            .replace("    count: 4000\n", "    count: 200\n");
        crate::recipe::Recipe::from_str(&edit(text), "tiny.yaml").unwrap_or_else(|e| panic!("{e}"))
    }

    fn recipes_dir() -> std::path::PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../recipes")
    }

    #[test]
    fn a_device_whose_memory_differs_from_memory_gb_gets_a_plan_warning() {
        assert_eq!(memory_warning(None, Some(80.0)), None);
        assert_eq!(memory_warning(Some(80), Some(85.0)), None, "within 10%");
        let far = memory_warning(Some(192), Some(80.0)).unwrap();
        assert!(far.contains("hardware.memory_gb is 192") && far.contains("80.0 GB"), "{far}");
        assert!(memory_warning(Some(80), None).unwrap().contains("could not be read"));
        // The probe of a recipe sized for a card this host is not.
        let odd = tiny(|t| {
            t.replace("  gpus: 0\n", "  gpus: 0\n  memory_gb: 4096\n")
                .replace("budget_seconds: 10", "budget_seconds: 1")
        });
        let plan = measure_plan(&odd, &recipes_dir(), None, DataOptions::default()).unwrap();
        assert!(plan.machine.memory_gb.is_some_and(|g| g > 0.0));
        assert!(plan.warnings.iter().any(|w| w.contains("hardware.memory_gb is 4096")), "{:?}", plan.warnings);
        let plain = measure_plan(
            &tiny(|t| t.replace("budget_seconds: 10", "budget_seconds: 1")),
            &recipes_dir(),
            None,
            DataOptions::default(),
        )
        .unwrap();
        assert!(plain.warnings.is_empty(), "{:?}", plain.warnings);
    }

    #[test]
    fn autotune_off_measures_nothing_and_says_so() {
        let off = tiny(|t| t.replace("autotune:\n", "autotune:\n  enabled: false\n"));
        let plan = measure_plan(&off, &recipes_dir(), None, DataOptions::default()).unwrap();
        assert!(plan.measurements.is_empty() && plan.elapsed_ms == 0);
        assert!(plan.note.as_deref().is_some_and(|n| n.contains("autotune.enabled is false")), "{:?}", plan.note);
        assert_eq!(plan.choices.micro_batch, 8, "the whole batch");
        let on = measure_plan(
            &tiny(|t| t.replace("budget_seconds: 10", "budget_seconds: 1")),
            &recipes_dir(),
            None,
            DataOptions::default(),
        )
        .unwrap();
        assert!(!on.measurements.is_empty() && on.note.is_none());
    }

    #[test]
    fn a_plan_keeps_the_recipe_s_gradient_checkpointing() {
        for want in [true, false] {
            let r = tiny(|t| {
                t.replace("budget_seconds: 10", "budget_seconds: 2")
                    .replace("  precision: fp32\n", &format!("  precision: fp32\n  gradient_checkpointing: {want}\n"))
            });
            let plan = measure_plan(&r, &recipes_dir(), None, DataOptions::default()).unwrap();
            assert_eq!(plan.choices.activation_checkpointing, want);
            assert!(plan.measurements.iter().all(|m| m.choices.activation_checkpointing == want));
            assert!(plan.check_constraints(&r.recipe, "p").is_ok());
            let mut other = plan.clone();
            other.choices.activation_checkpointing = !want;
            let err = other.check_constraints(&r.recipe, "p").unwrap_err().to_string();
            assert!(err.contains("train.gradient_checkpointing"), "{err}");
            let off = tiny(|t| {
                t.replace("autotune:\n", "autotune:\n  enabled: false\n")
                    .replace("  precision: fp32\n", &format!("  precision: fp32\n  gradient_checkpointing: {want}\n"))
            });
            let defaults = measure_plan(&off, &recipes_dir(), None, DataOptions::default()).unwrap();
            assert_eq!(defaults.choices.activation_checkpointing, want);
        }
        // Unset: the probe times both.
        let free = measure_plan(
            &tiny(|t| t.replace("budget_seconds: 10", "budget_seconds: 3")),
            &recipes_dir(),
            None,
            DataOptions::default(),
        )
        .unwrap();
        assert!(free.measurements.iter().any(|m| m.choices.activation_checkpointing));
        assert!(free.measurements.iter().any(|m| !m.choices.activation_checkpointing));
    }

    #[test]
    fn the_probe_keeps_to_the_recipe_s_budget() {
        for seconds in [1u32, 3] {
            let r = tiny(|t| t.replace("budget_seconds: 10", &format!("budget_seconds: {seconds}")));
            let plan = measure_plan(&r, &recipes_dir(), None, DataOptions::default()).unwrap();
            assert_eq!(plan.budget_seconds, seconds);
            // The budget is checked between candidates: one more step may start before it ends.
            let slowest = plan.measurements.iter().filter_map(|m| m.step_us).max().unwrap_or(0) / 1000;
            assert!(plan.elapsed_ms <= u64::from(seconds) * 1000 + slowest * 4, "{} ms", plan.elapsed_ms);
        }
    }
}
