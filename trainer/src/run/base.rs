//! The base a run starts from, recorded where its results go, so that a resume, an
//! evaluation, a server or an export of an adapter uses the weights it was trained on.
//!
//! [`base_dir`] is the one rule for where the base lies: `--init-from`, else `model.path`,
//! else (no `model.config`, and `model.name` a hub id `owner/name`) the snapshot of
//! `model.name` at `model.revision` in the Hugging Face cache ([`crate::hub`]), else none
//! (random weights from the seed). Training, the probe, evaluation, export and serving all
//! take their base, and their tokenizer when `model.tokenizer` is unset ([`tokenizer`]), from it.
//!
//! A run records its base in `run.json` and, beside every adapter it saves, in
//! `base_model.json`: an HF directory by absolute path with the BLAKE3 of every file read
//! (`config.json` and the weights), and the hub repository, revision and commit it was
//! resolved from; or the seeded random initialisation. Whoever loads the adapter later takes
//! the recorded base by default and refuses another one unless forced ([`adapter_base`]). An
//! adapter on random weights learns nothing useful, so a run that would train one is refused
//! unless the recipe says `model.random_init: true` ([`check_base_choice`]), and so is a
//! `model.config` that says another shape than the base's `config.json`.

mod shape;

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::RunError;
use crate::checkpoint::{self, FileDigest};
use crate::data::Tokenizer;
use crate::hub::{self, HubSource, RepoKind};
use crate::recipe::Recipe;

/// The file beside an adapter's weights that names its base.
pub const BASE_FILE: &str = "base_model.json";

/// Where a run's starting weights came from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum BaseRecord {
    /// An HF model directory (`--init-from`, the recipe's `model.path`, or a snapshot in the
    /// hub cache).
    Weights {
        /// Absolute path of the directory when the run read it.
        path: String,
        /// `config.json` and every weight file, as read.
        files: Vec<FileDigest>,
        /// The hub repository (`model.name`), revision asked and commit the directory is the
        /// snapshot of, when it was found in the hub cache.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        hub: Option<HubSource>,
    },
    /// Weights drawn from the recipe's seed for its inline `model.config`.
    RandomInit { seed: u64 },
}

impl BaseRecord {
    /// The directory, for a base of weights.
    pub fn path(&self) -> Option<&Path> {
        match self {
            BaseRecord::Weights { path, .. } => Some(Path::new(path)),
            BaseRecord::RandomInit { .. } => None,
        }
    }

    /// Where the recorded base lies now: its directory, or, when that is gone and the base is a
    /// hub snapshot, the snapshot of its commit in this machine's cache (a cache that moved, or
    /// another machine's). `None` for random weights.
    pub fn locate(&self) -> Result<Option<PathBuf>, RunError> {
        let BaseRecord::Weights { path, hub, .. } = self else { return Ok(None) };
        let dir = PathBuf::from(path);
        Ok(Some(match hub {
            Some(h) if !dir.join(checkpoint::CONFIG_FILE).is_file() => {
                hub::resolve(&h.repo, RepoKind::Model, Some(&h.commit))?.dir
            }
            _ => dir,
        }))
    }

    /// What PEFT's `base_model_name_or_path` says: the directory, or nothing for random
    /// weights (there is no file a loader could find).
    pub fn name_or_path(&self) -> Option<String> {
        self.path().map(|p| p.display().to_string())
    }

    /// One line for messages: the path and its config's digest, or the seed.
    pub fn describe(&self) -> String {
        match self {
            BaseRecord::Weights { path, files, hub } => {
                let config = files.iter().find(|f| f.path == checkpoint::CONFIG_FILE);
                let short = config.map(|f| format!(" (config.json blake3 {})", &f.blake3[..f.blake3.len().min(12)]));
                let from = hub.as_ref().map(|h| format!("{}@{} (commit {}) at ", h.repo, h.revision, h.commit));
                format!("{}{path}{}", from.unwrap_or_default(), short.unwrap_or_default())
            }
            BaseRecord::RandomInit { seed } => format!("random weights from seed {seed}"),
        }
    }

    /// Reads an adapter directory's record; `None` when it has none (an adapter saved
    /// before bases were recorded, or by another tool).
    pub fn read(adapter_dir: &Path) -> Result<Option<BaseRecord>, RunError> {
        let path = adapter_dir.join(BASE_FILE);
        match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map(Some)
                .map_err(|e| RunError::Io { path: path.display().to_string(), message: e.to_string() }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(RunError::Io { path: path.display().to_string(), message: e.to_string() }),
        }
    }

    /// The record's JSON, as written beside an adapter.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut bytes = serde_json::to_vec_pretty(self).unwrap_or_default();
        bytes.push(b'\n');
        bytes
    }
}

/// Where a run's base weights lie, and the hub snapshot they are when they came from the cache.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BaseDir {
    pub dir: PathBuf,
    pub hub: Option<HubSource>,
}

impl BaseDir {
    /// What a run that read this base records: the directory by absolute path, its files'
    /// digests (`files`, as the loader read them) and the hub snapshot it is.
    pub fn record(&self, files: Vec<FileDigest>) -> BaseRecord {
        BaseRecord::Weights { path: absolute(&self.dir).display().to_string(), files, hub: self.hub.clone() }
    }
}

/// The directory a run reads its base weights from (see the module doc): `--init-from`, else
/// `model.path` (relative to the recipe), else the hub snapshot of `model.name` when the
/// recipe gives no `model.config`, else none (random weights). A hub model missing from the
/// cache is an error naming the cache and the command that fetches it.
pub fn base_dir(recipe: &Recipe, recipe_dir: &Path, init_from: Option<&Path>) -> Result<Option<BaseDir>, RunError> {
    let m = &recipe.model;
    let local = init_from.map(Path::to_path_buf).or_else(|| m.path.as_ref().map(|p| recipe_dir.join(p)));
    if let Some(dir) = local {
        return Ok(Some(BaseDir { dir, hub: None }));
    }
    if m.config.is_some() || !hub::is_repo_id(&m.name) {
        return Ok(None);
    }
    let snapshot = hub::resolve(&m.name, RepoKind::Model, m.revision.as_deref())?;
    Ok(Some(BaseDir { dir: snapshot.dir, hub: Some(snapshot.source) }))
}

/// The base a run of `recipe` starts from ([`base_dir`]), refused before anything is written
/// when it cannot be trained on: a model with neither weights nor a shape, an adapter on random
/// weights the recipe did not ask for (it trains without an error and answers noise), or a
/// `model.family` or `model.config` that contradicts the base's `config.json` (the base's
/// architecture and shape are what would train).
pub fn check_base_choice(
    recipe: &Recipe,
    recipe_dir: &Path,
    init_from: Option<&Path>,
) -> Result<Option<BaseDir>, RunError> {
    let base = base_dir(recipe, recipe_dir, init_from)?;
    match (&base, &recipe.model.config) {
        (Some(b), _) => shape::check(&recipe.model, &b.dir)?,
        (None, Some(_)) if recipe.train.method.adapter().is_some() && !recipe.model.random_init => {
            return Err(RunError::RandomBase);
        }
        (None, Some(_)) => {}
        (None, None) => {
            return Err(RunError::Base(format!(
                "model: {:?} has no weights and no shape: give model.path (an HF model directory), a base with \
                 --init-from, model.config (random weights), or name a hub model (owner/name) fetched into the \
                 Hugging Face cache",
                recipe.model.name
            )));
        }
    }
    Ok(base)
}

/// The tokenizer of a run on `base`: `model.tokenizer` when the recipe names one, else the
/// `tokenizer.json` (and chat template) beside the base's weights: `base`, else the recipe's
/// own base ([`base_dir`]).
pub fn tokenizer(recipe: &Recipe, recipe_dir: &Path, base: Option<&Path>) -> Result<Tokenizer, RunError> {
    let beside = match (&recipe.model.tokenizer, base) {
        (Some(_), _) => None,
        (None, Some(dir)) => Some(dir.to_path_buf()),
        (None, None) => base_dir(recipe, recipe_dir, None)?.map(|b| b.dir),
    };
    Ok(Tokenizer::from_recipe(&recipe.model, recipe_dir, beside.as_deref())?)
}

/// `config.json` and the weight files of an HF directory with their digests, named
/// relative to it.
pub fn digest_weights(dir: &Path) -> Result<Vec<FileDigest>, RunError> {
    let config = dir.join(checkpoint::CONFIG_FILE);
    if !config.is_file() {
        return Err(RunError::Io {
            path: dir.display().to_string(),
            message: "not an HF model directory: no config.json".into(),
        });
    }
    let mut files = vec![checkpoint::digest_file(&config, dir)?];
    for f in checkpoint::WeightFiles::open(dir)?.files() {
        files.push(checkpoint::digest_file(&f, dir)?);
    }
    Ok(files)
}

/// An absolute form of `dir` for the record (canonical when it exists).
pub fn absolute(dir: &Path) -> PathBuf {
    std::fs::canonicalize(dir).unwrap_or_else(|_| std::path::absolute(dir).unwrap_or_else(|_| dir.to_path_buf()))
}

/// The first difference between a recorded base and another, in words; `None` when they
/// hold the same bytes (where the directory lies does not matter).
pub fn difference(recorded: &BaseRecord, other: &BaseRecord) -> Option<String> {
    match (recorded, other) {
        (BaseRecord::RandomInit { seed: a }, BaseRecord::RandomInit { seed: b }) => {
            (a != b).then(|| format!("random weights from seed {b}, not {a}"))
        }
        (BaseRecord::Weights { files: a, .. }, BaseRecord::Weights { files: b, .. }) => {
            for want in a {
                match b.iter().find(|f| f.path == want.path) {
                    None => return Some(format!("it has no {}", want.path)),
                    Some(got) if got.blake3 != want.blake3 => {
                        return Some(format!("its {} has blake3 {}, not {}", want.path, got.blake3, want.blake3));
                    }
                    Some(_) => {}
                }
            }
            b.iter().find(|f| !a.iter().any(|w| w.path == f.path)).map(|f| format!("it has an extra {}", f.path))
        }
        (BaseRecord::Weights { .. }, BaseRecord::RandomInit { .. }) => Some("it is random weights".into()),
        (BaseRecord::RandomInit { .. }, BaseRecord::Weights { .. }) => Some("it is a directory of weights".into()),
    }
}

/// What the base directory `dir` amounts to.
fn record_of(dir: &Path) -> Result<BaseRecord, RunError> {
    Ok(BaseDir { dir: dir.to_path_buf(), hub: None }.record(digest_weights(dir)?))
}

/// The base to load an adapter over (`base` for [`crate::checkpoint::load_checkpoint`]): the
/// one recorded beside it when `given` is `None` (a hub snapshot found again by its commit in
/// this machine's cache when its recorded path is gone); `given` when it holds the recorded
/// bytes, or when `force` is set. A recorded directory that moved or changed is refused the
/// same way. An adapter saved without a record goes on the recipe's base ([`check_base_choice`]).
/// A directory of full weights needs no base and returns `given` unchanged.
pub fn adapter_base(
    recipe: &Recipe,
    recipe_dir: &Path,
    checkpoint_dir: &Path,
    given: Option<&Path>,
    force: bool,
) -> Result<Option<PathBuf>, RunError> {
    if !checkpoint_dir.join(checkpoint::ADAPTER_CONFIG_FILE).exists() {
        return Ok(given.map(Path::to_path_buf));
    }
    if let (true, Some(dir)) = (force, given) {
        return Ok(Some(dir.to_path_buf()));
    }
    let Some(recorded) = BaseRecord::read(checkpoint_dir)? else {
        // Saved without a record: what the caller names, or the recipe's own base.
        return Ok(check_base_choice(recipe, recipe_dir, given)?.map(|b| b.dir));
    };
    let adapter = checkpoint_dir.display();
    let candidate = match (given, &recorded) {
        (Some(dir), _) => dir.to_path_buf(),
        (None, BaseRecord::Weights { path, .. }) => {
            let dir = recorded.locate()?.unwrap_or_default();
            if !dir.join(checkpoint::CONFIG_FILE).is_file() {
                return Err(RunError::Base(format!(
                    "{adapter} is an adapter trained on {path}, which is no longer an HF model directory: \
                     give the same base at its new place with --base DIR"
                )));
            }
            dir
        }
        (None, BaseRecord::RandomInit { .. }) => {
            if !force && let Some(b) = base_dir(recipe, recipe_dir, None)? {
                return Err(RunError::Base(format!(
                    "{adapter} is an adapter trained on {}, but the recipe names base weights ({}): use the \
                     recipe it was trained with",
                    recorded.describe(),
                    b.dir.display()
                )));
            }
            let actual = BaseRecord::RandomInit { seed: recipe.meta.seed };
            if let Some(why) = difference(&recorded, &actual).filter(|_| !force) {
                return Err(RunError::Base(format!(
                    "{adapter} is an adapter trained on {}; this recipe gives {why}: use the recipe it was \
                     trained with, or pass --force-base",
                    recorded.describe()
                )));
            }
            return Ok(None);
        }
    };
    let actual = record_of(&candidate)?;
    if let Some(why) = difference(&recorded, &actual)
        && !force
    {
        let hint = if given.is_some() {
            "leave --base out to use the recorded one, or pass --force-base to use this one anyway"
        } else {
            "restore it, or pass --base DIR with --force-base to use another"
        };
        return Err(RunError::Base(format!(
            "{adapter} is an adapter trained on {}; {} differs ({why}): {hint}",
            recorded.describe(),
            candidate.display()
        )));
    }
    Ok(Some(candidate))
}

/// Rewrites where an adapter directory says its base lies (PEFT's
/// `base_model_name_or_path` and [`BASE_FILE`]'s path) to `path`, byte for byte as a run
/// writes them: what a replay does before comparing its adapter with one whose base lay
/// at another place.
pub fn relocate_base(adapter_dir: &Path, path: &str) -> Result<(), RunError> {
    let io =
        |p: &Path, e: &dyn std::fmt::Display| RunError::Io { path: p.display().to_string(), message: e.to_string() };
    let config_path = adapter_dir.join(checkpoint::ADAPTER_CONFIG_FILE);
    let bytes = std::fs::read(&config_path).map_err(|e| io(&config_path, &e))?;
    let mut config: checkpoint::AdapterConfig = serde_json::from_slice(&bytes).map_err(|e| io(&config_path, &e))?;
    config.base_model_name_or_path = Some(path.to_string());
    std::fs::write(&config_path, config.to_json_bytes()).map_err(|e| io(&config_path, &e))?;
    if let Some(BaseRecord::Weights { files, hub, .. }) = BaseRecord::read(adapter_dir)? {
        let record = BaseRecord::Weights { path: path.to_string(), files, hub };
        let file = adapter_dir.join(BASE_FILE);
        std::fs::write(&file, record.to_bytes()).map_err(|e| io(&file, &e))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn digest(path: &str, b3: &str) -> FileDigest {
        FileDigest { path: path.into(), bytes: 1, blake3: b3.into() }
    }

    fn weights(path: &str, files: Vec<FileDigest>) -> BaseRecord {
        BaseRecord::Weights { path: path.into(), files, hub: None }
    }

    /// The one rule for where a base lies: `--init-from`, else `model.path` (relative to the
    /// recipe), else nothing for an inline shape or a local label (a hub id is the cache's: the
    /// hub tests).
    #[test]
    fn a_recipe_s_model_path_is_its_base() {
        let text = include_str!("../../../recipes/tiny_cpu_lora.yaml");
        let mut r = crate::recipe::Recipe::from_str(text, "t.yaml").unwrap().recipe;
        let recipes = Path::new("/recipes");
        assert_eq!(base_dir(&r, recipes, None).unwrap(), None, "an inline shape: random weights");
        r.model.path = Some("weights/base".into());
        let dir = |b: Option<BaseDir>| b.map(|b| b.dir);
        assert_eq!(dir(base_dir(&r, recipes, None).unwrap()), Some(PathBuf::from("/recipes/weights/base")));
        let given = Path::new("/elsewhere/final");
        assert_eq!(dir(base_dir(&r, recipes, Some(given)).unwrap()), Some(given.to_path_buf()), "--init-from wins");
    }

    #[test]
    fn differences_name_the_file_and_ignore_the_place() {
        let a = weights("/a", vec![digest("config.json", "11"), digest("m", "22")]);
        let moved = weights("/b", vec![digest("config.json", "11"), digest("m", "22")]);
        assert_eq!(difference(&a, &moved), None);
        let changed = weights("/a", vec![digest("config.json", "11"), digest("m", "33")]);
        assert_eq!(difference(&a, &changed).unwrap(), "its m has blake3 33, not 22");
        let fewer = weights("/a", vec![digest("config.json", "11")]);
        assert_eq!(difference(&a, &fewer).unwrap(), "it has no m");
        assert_eq!(difference(&fewer, &a).unwrap(), "it has an extra m");
        let r7 = BaseRecord::RandomInit { seed: 7 };
        assert_eq!(difference(&r7, &BaseRecord::RandomInit { seed: 7 }), None);
        assert!(difference(&r7, &BaseRecord::RandomInit { seed: 8 }).unwrap().contains("seed 8"));
        assert!(difference(&r7, &a).is_some() && difference(&a, &r7).is_some());
    }

    #[test]
    fn records_round_trip_as_json() {
        let hub = HubSource { repo: "Qwen/Qwen3-8B".into(), revision: "main".into(), commit: "c".repeat(40) };
        for r in [
            weights("/x/final", vec![digest("config.json", "ab")]),
            BaseRecord::Weights { path: "/h".into(), files: vec![], hub: Some(hub) },
            BaseRecord::RandomInit { seed: 3 },
        ] {
            let back: BaseRecord = serde_json::from_slice(&r.to_bytes()).unwrap();
            assert_eq!(back, r);
        }
        let text = String::from_utf8(BaseRecord::RandomInit { seed: 3 }.to_bytes()).unwrap();
        assert!(text.contains("\"kind\": \"random_init\""), "{text}");
        // A record written before bases were found in the hub cache reads as a local directory.
        let old: BaseRecord = serde_json::from_str(r#"{"kind": "weights", "path": "/x", "files": []}"#).unwrap();
        assert_eq!(old, weights("/x", vec![]));
    }
}
