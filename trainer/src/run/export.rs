//! A run's result as a self-contained Hugging Face model directory (`mindxtrain export`):
//! full weights (an adapter merged into the base it was trained on), `config.json`, the
//! tokenizer with its chat template, and `generation_config.json` naming the tokens that
//! end an answer, so `AutoModelForCausalLM.from_pretrained(dir)` and
//! `AutoTokenizer.from_pretrained(dir)` need nothing else. The checkpoint's model card comes
//! along ([`super::card`]): the run's own card, marked merged when an adapter was folded in.
//! A model from a released Qwen3.5/3.6 checkpoint is written back in that layout
//! ([`crate::checkpoint::ReleasedLayout`]): its vision tower and MTP layer copied byte for byte.

use std::path::Path;

use serde_json::json;

use super::RunError;
use super::base::{self, BaseRecord};
use super::card::{self, CardFacts, MODEL_CARD_FILE};
use super::session::save_model;
use crate::checkpoint::{FileDigest, StagedDir};
use crate::data::Tokenizer;
use crate::model::merge_lora;
use crate::recipe::Recipe;

pub const GENERATION_CONFIG_FILE: &str = "generation_config.json";

/// Writes the model in `checkpoint_dir` (full weights, or an adapter over `base`, which
/// [`super::adapter_base`] settles) to `out`, which must not exist; it appears complete
/// or not at all. Returns the files written.
pub fn export_hf(
    recipe: &Recipe,
    recipe_dir: &Path,
    checkpoint_dir: &Path,
    base: Option<&Path>,
    out: &Path,
) -> Result<Vec<FileDigest>, RunError> {
    let tokenizer = super::base::tokenizer(recipe, recipe_dir, base)?;
    let (mut model, adapters) =
        crate::checkpoint::load_checkpoint(recipe, base, checkpoint_dir, &candle_core::Device::Cpu)?;
    let card = carried_card(recipe, recipe_dir, checkpoint_dir, base, adapters.is_some())?;
    if let Some(adapters) = adapters {
        let merged = merge_lora(model.params(), model.config(), &adapters)?;
        *model.params_mut() = merged;
    }
    let mut dir = StagedDir::create(out)?;
    dir.write_file(MODEL_CARD_FILE, card.as_bytes())?;
    // Written back in the layout the weights came from: the checkpoint's own, or its base's.
    let source = if crate::checkpoint::is_adapter(checkpoint_dir) { base } else { Some(checkpoint_dir) };
    save_model(&mut dir, &model, crate::checkpoint::released_source(source)?.as_ref())?;
    let sources: Vec<&Path> = base.into_iter().chain([checkpoint_dir]).collect();
    carry_model_code(&mut dir, &model.config().to_hf_json("float32"), &sources)?;
    write_tokenizer(&mut dir, &tokenizer, recipe.serve.max_model_len as usize)?;
    let ends = tokenizer.stop_ids();
    let generation = json!({
        "eos_token_id": ends,
        "pad_token_id": tokenizer.pad_id(),
        "bos_token_id": null,
        "do_sample": false,
    });
    let mut bytes = serde_json::to_vec_pretty(&generation).unwrap_or_default();
    bytes.push(b'\n');
    dir.write_file(GENERATION_CONFIG_FILE, &bytes)?;
    Ok(dir.commit()?)
}

/// The Python files the config's `auto_map` names (`modeling_instella.InstellaForCausalLM` →
/// `modeling_instella.py`), each copied from the first of `sources` that holds it: transformers
/// loads an architecture it does not ship (Instella) with `trust_remote_code` from the code
/// beside the weights, as the hub repository lays it out. Without such files (a model trained
/// from scratch) the directory still loads by naming the hub repository's code.
fn carry_model_code(dir: &mut StagedDir, config_json: &str, sources: &[&Path]) -> Result<(), RunError> {
    let config: serde_json::Value = serde_json::from_str(config_json).unwrap_or_default();
    let Some(auto_map) = config.get("auto_map").and_then(|m| m.as_object()) else { return Ok(()) };
    let mut modules: Vec<&str> = auto_map
        .values()
        .filter_map(|v| v.as_str())
        .filter_map(|target| target.rsplit_once('.').map(|(module, _)| module))
        .map(|module| module.rsplit_once("--").map_or(module, |(_, m)| m))
        .collect();
    modules.sort_unstable();
    modules.dedup();
    for module in modules {
        let file = format!("{module}.py");
        if let Some(path) = sources.iter().map(|s| s.join(&file)).find(|p| p.is_file()) {
            let bytes = std::fs::read(&path)
                .map_err(|e| RunError::Io { path: path.display().to_string(), message: e.to_string() })?;
            dir.write_file(&file, &bytes)?;
        }
    }
    Ok(())
}

/// `tokenizer.json` and `tokenizer_config.json` (with the chat template) into `dir`.
pub(super) fn write_tokenizer(dir: &mut StagedDir, tokenizer: &Tokenizer, max_len: usize) -> Result<(), RunError> {
    for (name, bytes) in tokenizer.hf_files(max_len) {
        dir.write_file(name, &bytes)?;
    }
    Ok(())
}

/// The checkpoint's model card for the export: as it is for full weights, marked merged for an
/// adapter folded into `base`; a checkpoint without one (an intermediate step) gets a card from
/// the recipe and the base, without evaluation results.
fn carried_card(
    recipe: &Recipe,
    recipe_dir: &Path,
    checkpoint_dir: &Path,
    base: Option<&Path>,
    merged: bool,
) -> Result<String, RunError> {
    let path = checkpoint_dir.join(MODEL_CARD_FILE);
    let own = match std::fs::read_to_string(&path) {
        Ok(text) => Some(text),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(RunError::Io { path: path.display().to_string(), message: e.to_string() }),
    };
    let recorded = match (BaseRecord::read(checkpoint_dir)?, base) {
        (Some(r), _) => Some(r),
        (None, Some(dir)) => {
            Some(BaseRecord::Weights { path: base::absolute(dir).display().to_string(), files: vec![], hub: None })
        }
        (None, None) => None,
    };
    let facts = CardFacts { recipe, recipe_dir, base: recorded.as_ref(), adapter: false, eval: None };
    match (own, merged) {
        (Some(text), false) => Ok(text),
        (own, true) => Ok(card::merged_card(own.as_deref(), &facts, &path.display().to_string())?),
        (None, false) => Ok(card::model_card(&facts)),
    }
}
