//! `mindxtrain bench`: measuring the plan with the recipe's own shapes and data, on the device
//! the recipe's hardware names (the CPU, or one CUDA GPU).

use super::RunError;
use super::method::MethodPlan;
use super::microbatch::{accumulate, split};
use super::session::dtype_of;
use crate::data::{DataCursor, DataOptions, Dataset, Tokenizer};
use crate::model::{Adapters, Qwen3, Qwen3Config, StepOptions};
use crate::plan::{Choices, Plan, candidates, gpu_candidates, measure};
use crate::recipe::LoadedRecipe;
use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

/// Times every candidate [`Choices`] on this machine within `autotune.budget_seconds`
/// and returns the plan. The model is the recipe's shape (random weights: speed does not
/// depend on their values); the batch is the first real batch of the recipe's data. A
/// probe step is the forward/backward of every micro-batch: the optimizer update costs the
/// same whatever the choices.
pub fn measure_plan(recipe: &LoadedRecipe, recipe_dir: &Path, data: DataOptions) -> Result<Plan, RunError> {
    let r = &recipe.recipe;
    let device = super::run_device(r)?;
    let config = match (&r.model.config, &r.model.path) {
        (Some(c), _) => Qwen3Config::from(c),
        (None, Some(p)) => {
            let path = recipe_dir.join(p).join("config.json");
            let bytes = std::fs::read_to_string(&path)
                .map_err(|e| RunError::Io { path: path.display().to_string(), message: e.to_string() })?;
            Qwen3Config::from_hf_json(&bytes)?
        }
        (None, None) => return Err(RunError::Recipe("model: give model.path or model.config".into())),
    };
    let dtype = dtype_of(r.model.dtype);
    let model = if device.is_cuda() {
        Qwen3::init_for_timing(&config, dtype, &device)?
    } else {
        Qwen3::init_random(&config, r.meta.seed, dtype, &device)?
    };
    let method = MethodPlan::from_recipe(&r.train.method)?;
    let adapters = match &method.lora {
        Some(l) => Some(Adapters::init(&config, l, r.meta.seed, model.dtype(), &device)?),
        None => None,
    };
    let tokenizer = Tokenizer::from_recipe(&r.model, recipe_dir)?;
    let dataset = Dataset::from_recipe(r, recipe_dir, &tokenizer, data)?;
    let per_device = r.train.batch.per_device as usize;
    // Preference recipes are timed on their chosen rows: the same shapes, half the rows.
    let batch = if dataset.is_preference() {
        dataset.preference_batches(per_device, DataCursor::default())?.next_batch().chosen
    } else {
        dataset.batches(per_device, DataCursor::default())?.next_batch()
    };
    let scale = 1.0 / batch.target_tokens().max(1) as f64;
    let trainable = method.trainable;
    let mut probe = |c: &Choices| -> Result<(), String> {
        let pool = super::apply_choices(c).map_err(|e| e.to_string())?;
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
            Ok(())
        })
    };
    let cands = if device.is_cuda() {
        gpu_candidates(per_device)
    } else {
        candidates(std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1), per_device)
    };
    let budget = Duration::from_secs(u64::from(r.autotune.budget_seconds));
    let measured = measure(&cands, budget, &mut probe).map_err(|e| RunError::Recipe(format!("autotune: {e}")))?;
    Ok(Plan::new(
        recipe.bytes_blake3,
        &super::device_name(&device),
        measured.best,
        measured.measurements,
        r.autotune.budget_seconds,
        measured.elapsed.as_millis() as u64,
        measured.truncated,
    ))
}
