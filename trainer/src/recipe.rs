//! Strict YAML recipes.
//!
//! A recipe says what to train (model, data, method), where (hardware), how it is tuned,
//! evaluated, quantized, served, sold and receipted. Loading one checks everything before any
//! work starts: every field is known, every value has the right type and range, and the
//! hardware invariants hold (MI300-class boards take 0, 1 or 8 GPUs and carry the mandatory
//! ROCm env keys; autotuning is ahead-of-time only).
//!
//! Errors name the file, line, column and field path:
//!
//! ```
//! use mindxtrain_trainer::recipe::Recipe;
//!
//! let src = "\
//! meta: {project: demo, run_name: tiny}
//! hardware: {name: cpu, gpus: 0}
//! model:
//!   name: tiny-qwen3
//!   tokenizer: byte
//!   config: {hidden_size: 64, num_layers: 2, num_heads: 4, num_kv_heads: 2,
//!            head_dim: 16, intermediate_size: 128, vocab_size: 512}
//! data:
//!   source: generated
//!   generator: {kind: tasks, seed: 7, count: 1000}
//!   seq_len: 128
//! train:
//!   method:
//!     kind: lora
//!     r: 1.5
//! ";
//! let err = Recipe::from_str(src, "recipes/x.yaml").unwrap_err();
//! assert_eq!(
//!     err.to_string(),
//!     "recipes/x.yaml:15:5 train.method.r: expected an integer, found float `1.5`"
//! );
//!
//! let ok = Recipe::from_str(&src.replace("r: 1.5", "r: 8"), "recipes/x.yaml").unwrap();
//! assert_eq!(ok.recipe.hardware.arch, "native"); // filled from hardware.name
//! ```
//!
//! The schema, field by field, is in docs/recipes.md.

pub mod contract;
mod de;
mod env;
mod error;
mod publish;
mod schema;
mod train;
mod validate;
mod yaml;

use std::io::Read;
use std::path::Path;

use serde::Deserialize;

pub use env::{apply_plan_env, mandatory_rocm_env_keys};
pub use error::{EnvOverrideError, ErrorKind, Location, RecipeError, RecipeErrors};
pub use publish::{Address, Asset, Billing, HfPublish, Network, Pricing, Publish, Rental, Usdc, X402};
pub use schema::{
    Autotune, AutotunePolicy, Data, DataFormat, DataSource, Dedupe, Dtype, Eval, Generator, GeneratorKind, Hardware,
    HardwareName, Holdout, LinearAttentionConfig, Meta, Model, ModelConfig, ModelFamily, MoeConfig, QuantScheme,
    Quantize, Receipt, ReceiptItem, Recipe, Regression, Serve, Vendor,
};
pub use train::{
    Batch, Budget, Checkpoint, Distributed, Dpo, DpoLoss, Grpo, Gspo, Kto, Lora, Method, MethodKind, Optimizer,
    OptimizerName, Orpo, Precision, Qlora, Reward, Schedule, ScheduleKind, Sharding, TargetModule, Train,
};

use de::{De, PathStack, Sink};
use error::FieldPath;

/// Recipes are hand-written and small; a larger file is a mistake or an attack.
pub const MAX_RECIPE_BYTES: u64 = 1 << 20;

pub use yaml::MAX_NODES;

/// Most reads of the tree [`Recipe::check_str`] makes. One read finds every error it can go
/// on after; each further read follows an error that ended the one before (a missing field,
/// a value a hand-written check refused, a section of the wrong shape) with that field
/// dropped. The bound keeps checking linear in the size of the text: a 1 MiB recipe is
/// read at most this many times, whatever it holds.
const MAX_READS: usize = 8;

/// A recipe that passed every check, with the digest of the exact bytes it came from.
#[derive(Debug, Clone, PartialEq)]
pub struct LoadedRecipe {
    pub recipe: Recipe,
    /// BLAKE3 of the file's bytes as read: the receipt's `recipe_hash`.
    pub bytes_blake3: [u8; 32],
    /// The path or origin name errors were reported against.
    pub source_name: String,
}

impl Recipe {
    /// Reads and checks a recipe file, returning the first problem.
    ///
    /// ```
    /// use mindxtrain_trainer::recipe::{HardwareName, Recipe};
    ///
    /// let loaded = Recipe::from_path("../recipes/tiny_cpu_lora.yaml".as_ref()).unwrap();
    /// assert_eq!(loaded.recipe.hardware.name, HardwareName::Cpu);
    /// assert_eq!(loaded.source_name, "../recipes/tiny_cpu_lora.yaml");
    /// ```
    pub fn from_path(path: &Path) -> Result<LoadedRecipe, RecipeError> {
        Self::check_path(path).map_err(RecipeError::from)
    }

    /// Checks recipe text; `origin_name` stands for the file name in errors.
    ///
    /// ```
    /// use mindxtrain_trainer::recipe::Recipe;
    ///
    /// let err = Recipe::from_str("meta: {project: p}\n", "inline").unwrap_err();
    /// assert_eq!(err.path(), "meta.run_name");
    /// assert_eq!(err.message(), "missing field `run_name`");
    /// ```
    pub fn from_str(src: &str, origin_name: &str) -> Result<LoadedRecipe, RecipeError> {
        Self::check_str(src, origin_name).map_err(RecipeError::from)
    }

    /// Like [`Recipe::from_path`], but reports every problem found (what `recipe check`
    /// prints). Schema errors are collected by dropping each offending field and reading the
    /// file again; rule violations are all collected in one pass.
    pub fn check_path(path: &Path) -> Result<LoadedRecipe, RecipeErrors> {
        let name = path.display().to_string();
        let one = RecipeErrors::one;
        let file =
            std::fs::File::open(path).map_err(|e| one(RecipeError::io(&name, format!("cannot read recipe: {e}"))))?;
        let mut bytes = Vec::new();
        file.take(MAX_RECIPE_BYTES + 1)
            .read_to_end(&mut bytes)
            .map_err(|e| one(RecipeError::io(&name, format!("cannot read recipe: {e}"))))?;
        if bytes.len() as u64 > MAX_RECIPE_BYTES {
            return Err(one(RecipeError::io(&name, format!("recipe is larger than {MAX_RECIPE_BYTES} bytes"))));
        }
        let src = std::str::from_utf8(&bytes).map_err(|e| {
            let valid = &bytes[..e.valid_up_to()];
            let line = valid.iter().filter(|&&b| b == b'\n').count() + 1;
            let line_start = valid.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
            let column = String::from_utf8_lossy(&valid[line_start..]).chars().count() + 1;
            let message = format!("not UTF-8 text (invalid byte 0x{:02x})", bytes[e.valid_up_to()]);
            one(RecipeError::new(&name, Location { line, column }, &FieldPath::default(), message, ErrorKind::Syntax))
        })?;
        Self::check_str(src, &name)
    }

    /// Like [`Recipe::from_str`], but reports every problem found.
    ///
    /// ```
    /// use mindxtrain_trainer::recipe::Recipe;
    ///
    /// let src = "meta: {project: p, run_name: r, colour: red, seed: -1}\n";
    /// let errors = Recipe::check_str(src, "x.yaml").unwrap_err();
    /// let paths: Vec<&str> = errors.iter().map(|e| e.path()).collect();
    /// assert!(paths.contains(&"meta.colour"));
    /// assert!(paths.contains(&"meta.seed"));
    /// ```
    pub fn check_str(src: &str, origin_name: &str) -> Result<LoadedRecipe, RecipeErrors> {
        Self::check_counted(src, origin_name, &Sink::default())
    }

    /// [`Recipe::check_str`], noting errors and work in `sink`.
    fn check_counted(src: &str, origin_name: &str, sink: &Sink) -> Result<LoadedRecipe, RecipeErrors> {
        let bytes_blake3 = *blake3::hash(src.as_bytes()).as_bytes();
        let tree = yaml::parse(src).map_err(|e| {
            RecipeErrors::one(RecipeError::new(origin_name, e.loc, &e.path, e.message, ErrorKind::Syntax))
        })?;
        let mut reads = 0;
        let parsed = loop {
            reads += 1;
            let root = PathStack::Root;
            let err = match Recipe::deserialize(De::root(&tree, &root, sink)) {
                Ok(recipe) => break Some(recipe),
                Err(e) => e,
            };
            let (_, path) = err.at.clone().unwrap_or((tree.loc, FieldPath::default()));
            let missing = err.is_missing_field();
            // A field dropped to go on may now be "missing"; that is not news.
            if !(missing && sink.holds_failure(&path)) {
                sink.note_error(err, tree.loc);
            }
            let target = if missing { path.parent() } else { path.up_to_last_key() };
            if target.0.is_empty() || reads >= MAX_READS || !tree.drop_entry(&target) {
                break None;
            }
        };
        let (mut invariants, mut broken) = (Vec::new(), 0);
        if let Some(mut recipe) = parsed {
            validate::resolve(&mut recipe);
            for (path, message) in validate::validate(&recipe) {
                // A rule about a field that did not read, or about what holds it, follows from that.
                if sink.under_failure(&path) || sink.holds_failure(&path) {
                    continue;
                }
                broken += 1;
                if invariants.len() < de::MAX_KEPT_ERRORS {
                    let loc = tree.locate(&path);
                    invariants.push(RecipeError::new(origin_name, loc, &path, message, ErrorKind::Invariant));
                }
            }
            if sink.found() == 0 && broken == 0 {
                return Ok(LoadedRecipe { recipe, bytes_blake3, source_name: origin_name.to_owned() });
            }
        }
        let found = sink.found() + broken;
        let mut errors: Vec<RecipeError> = sink
            .take_kept()
            .into_iter()
            .map(|(loc, path, message)| RecipeError::new(origin_name, loc, &path, message, ErrorKind::Schema))
            .collect();
        errors.extend(invariants);
        let omitted = found.saturating_sub(errors.len());
        // Every failing path above records an error; the fallback only guards that promise.
        let errors = RecipeErrors::new(errors).unwrap_or_else(|| {
            RecipeErrors::one(RecipeError::io(origin_name, "recipe rejected without a reason (internal error)".into()))
        });
        Err(errors.with_omitted(omitted))
    }
}

#[cfg(test)]
mod linear_tests;
