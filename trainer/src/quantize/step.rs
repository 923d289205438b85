//! The pipeline's quantize step: after training, when the recipe's `quantize.enabled`, the run's
//! final model becomes `<run>/quantized/` (sealed with the run: every file of the run directory is
//! a subject of its manifest), recorded by a `model.quantized` event with the files' digests.
//! An adapter is merged into its base first, as `mindxtrain export --merge` does.

use std::path::Path;

use serde_json::{Value, json};

use super::QuantizeError;
use super::config::{Fp8Options, SCHEME};
use super::dir::{Quantized, quantize_dir};
use crate::checkpoint::ADAPTER_CONFIG_FILE;
use crate::events::{EventSink, TrainerEvent};
use crate::run::{Observer, RunError, RunSpec, adapter_base, export_hf};

/// The quantized model's directory in a run directory.
pub const QUANTIZED_DIR: &str = "quantized";
/// The event that records a quantized model.
pub const MODEL_QUANTIZED: &str = "model.quantized";

/// Quantizes the run's `final_dir` into `<run>/quantized` when `spec`'s recipe asks for it, and
/// records `model.quantized` for `run_id`.
pub fn after_training(
    spec: &RunSpec,
    final_dir: &Path,
    run_id: &str,
    sink: &mut impl EventSink,
    observer: &mut dyn Observer,
) -> Result<(), RunError> {
    let recipe = &spec.recipe.recipe;
    if !recipe.quantize.enabled {
        return Ok(());
    }
    let options = Fp8Options::from_recipe(&recipe.quantize)?;
    let out = spec.out_dir.join(QUANTIZED_DIR);
    remove(&out)?;
    let merged = spec.out_dir.join(".quantize-merged.tmp");
    let source = if final_dir.join(ADAPTER_CONFIG_FILE).is_file() {
        remove(&merged)?;
        let base = adapter_base(recipe, &spec.recipe_dir, final_dir, None, false)?;
        observer.note("quantize: merging the adapter into its base");
        export_hf(recipe, &spec.recipe_dir, final_dir, base.as_deref(), &merged)?;
        merged.clone()
    } else {
        final_dir.to_path_buf()
    };
    let done = quantize_dir(&source, &out, options, &mut |line| observer.note(line));
    remove(&merged)?;
    let done = done?;
    let data = event_data(run_id, &final_dir.display().to_string(), &out, &done);
    sink.emit(TrainerEvent { kind: MODEL_QUANTIZED.into(), subject: run_id.into(), data })
        .map_err(|e| RunError::Events(e.to_string()))
}

/// `model.quantized`'s data: the scheme, where from and to, and every file's digest.
pub fn event_data(subject: &str, source: &str, out: &Path, q: &Quantized) -> Value {
    json!({
        "run_id": subject, "scheme": SCHEME, "format": "compressed-tensors", "weights": q.strategy,
        "activations": "token (dynamic)", "source": source, "dir": out.display().to_string(),
        "fp8_tensors": q.fp8_tensors, "ignore": q.ignored, "files": q.files,
    })
}

fn remove(dir: &Path) -> Result<(), QuantizeError> {
    match std::fs::remove_dir_all(dir) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(QuantizeError::io(dir)(e)),
        _ => Ok(()),
    }
}
