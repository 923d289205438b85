//! Registering recipes: validate, then record `recipe.registered` with the BLAKE3 of
//! the exact bytes, so a manifest can later prove which recipe a run used.

use crate::log::{AppendError, AppendRequest, EventLog};
use mindxtrain_trainer::recipe::{LoadedRecipe, Recipe, RecipeErrors};
use serde_json::json;
use thiserror::Error;

/// Kind of the event that records a recipe.
pub const RECIPE_REGISTERED: &str = "recipe.registered";

#[derive(Debug, Error)]
pub enum RegisterError {
    #[error("{0}")]
    Invalid(RecipeErrors),
    #[error("recording the recipe failed: {0}")]
    Append(#[from] AppendError),
}

/// A recipe now in the log.
#[derive(Debug, Clone)]
pub struct Registered {
    pub loaded: LoadedRecipe,
    pub seq: u64,
    /// True when these exact bytes had been registered before (same event returned).
    pub already: bool,
}

/// Validates `src` (reported against `name`) and appends `recipe.registered`.
/// Registering the same bytes again is idempotent: the event id is the digest.
pub fn register(log: &EventLog, name: &str, src: &str) -> Result<Registered, RegisterError> {
    let loaded = Recipe::check_str(src, name).map_err(RegisterError::Invalid)?;
    Ok(register_checked(log, name, src, loaded)?)
}

/// [`register`] for a recipe already checked: `loaded` must come from `src`.
pub fn register_checked(
    log: &EventLog,
    name: &str,
    src: &str,
    loaded: LoadedRecipe,
) -> Result<Registered, AppendError> {
    let digest = hex::encode(loaded.bytes_blake3);
    let data = json!({
        "name": loaded.recipe.meta.run_name,
        "project": loaded.recipe.meta.project,
        "file": name,
        "bytes": src.len(),
        "blake3": digest,
        "method": serde_json::to_value(&loaded.recipe.train.method).ok().and_then(|m| m.get("kind").cloned()),
        "hardware": serde_json::to_value(&loaded.recipe.hardware).unwrap_or_default(),
    });
    let req = AppendRequest::new(RECIPE_REGISTERED, digest.clone(), data).with_id(format!("recipe:{digest}"));
    let appended = log.append(req)?;
    Ok(Registered { loaded, seq: appended.seq, already: appended.duplicate })
}

include!(concat!(env!("OUT_DIR"), "/embedded_recipes.rs"));
