//! The base a run starts from, recorded where its results go, so that a resume, an
//! evaluation, a server or an export of an adapter uses the weights it was trained on.
//!
//! A run records its base in `run.json` and, beside every adapter it saves, in
//! `base_model.json`: an HF directory by absolute path with the BLAKE3 of every file read
//! (`config.json` and the weights), or the seeded random initialisation. Whoever loads the
//! adapter later takes the recorded base by default and refuses another one unless forced
//! ([`adapter_base`]). An adapter on random weights learns nothing useful, so a run that
//! would train one is refused unless the recipe says `model.random_init: true`
//! ([`check_base_choice`]).

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::RunError;
use crate::checkpoint::{self, FileDigest};
use crate::recipe::Recipe;

/// The file beside an adapter's weights that names its base.
pub const BASE_FILE: &str = "base_model.json";

/// Where a run's starting weights came from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum BaseRecord {
    /// An HF model directory (`--init-from`, or the recipe's `model.path`).
    Weights {
        /// Absolute path of the directory when the run read it.
        path: String,
        /// `config.json` and every weight file, as read.
        files: Vec<FileDigest>,
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

    /// What PEFT's `base_model_name_or_path` says: the directory, or nothing for random
    /// weights (there is no file a loader could find).
    pub fn name_or_path(&self) -> Option<String> {
        self.path().map(|p| p.display().to_string())
    }

    /// One line for messages: the path and its config's digest, or the seed.
    pub fn describe(&self) -> String {
        match self {
            BaseRecord::Weights { path, files } => {
                let config = files.iter().find(|f| f.path == checkpoint::CONFIG_FILE);
                let short = config.map(|f| format!(" (config.json blake3 {})", &f.blake3[..f.blake3.len().min(12)]));
                format!("{path}{}", short.unwrap_or_default())
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

/// The directory a run reads its base weights from: `--init-from`, else `model.path`
/// (relative to the recipe), else none (random weights).
pub fn base_dir(recipe: &Recipe, recipe_dir: &Path, init_from: Option<&Path>) -> Option<PathBuf> {
    init_from.map(Path::to_path_buf).or_else(|| recipe.model.path.as_ref().map(|p| recipe_dir.join(p)))
}

/// Refuses an adapter on random weights the recipe did not ask for: the failure this
/// guards against trains (or serves) without an error and gives answers of noise.
pub fn check_base_choice(recipe: &Recipe, recipe_dir: &Path, init_from: Option<&Path>) -> Result<(), RunError> {
    let adapter = recipe.train.method.adapter().is_some();
    if !adapter || recipe.model.random_init || base_dir(recipe, recipe_dir, init_from).is_some() {
        return Ok(());
    }
    Err(RunError::Base(
        "train.method trains an adapter, but its base would be random weights (no model.path, and no \
         base given with --init-from or --base): give the base DIR (an HF model directory, such as the final/ of a \
         tiny_cpu_pretrain.yaml run), or set model.random_init: true in the recipe to train on random \
         weights on purpose"
            .into(),
    ))
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

/// What a given base directory (or, with none, the recipe's seed) amounts to.
fn record_of(recipe: &Recipe, recipe_dir: &Path, given: Option<&Path>) -> Result<BaseRecord, RunError> {
    Ok(match base_dir(recipe, recipe_dir, given) {
        Some(dir) => BaseRecord::Weights { path: absolute(&dir).display().to_string(), files: digest_weights(&dir)? },
        None => BaseRecord::RandomInit { seed: recipe.meta.seed },
    })
}

/// The base to load an adapter over (`init_from` for [`super::load_checkpoint`]): the one
/// recorded beside it when `given` is `None`; `given` when it holds the recorded bytes, or
/// when `force` is set. A recorded directory that moved or changed is refused the same way.
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
        // Saved without a record: only what the caller names (or the recipe's path).
        check_base_choice(recipe, recipe_dir, given)?;
        return Ok(given.map(Path::to_path_buf));
    };
    let adapter = checkpoint_dir.display();
    let candidate = match (given, &recorded) {
        (Some(dir), _) => dir.to_path_buf(),
        (None, BaseRecord::Weights { path, .. }) => {
            let dir = PathBuf::from(path);
            if !dir.join(checkpoint::CONFIG_FILE).is_file() {
                return Err(RunError::Base(format!(
                    "{adapter} is an adapter trained on {path}, which is no longer an HF model directory: \
                     give the same base at its new place with --base DIR"
                )));
            }
            dir
        }
        (None, BaseRecord::RandomInit { .. }) => {
            if recipe.model.path.is_some() && !force {
                return Err(RunError::Base(format!(
                    "{adapter} is an adapter trained on {}, but the recipe names model.path: use the recipe \
                     it was trained with",
                    recorded.describe()
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
    let actual = record_of(recipe, recipe_dir, Some(&candidate))?;
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
    if let Some(BaseRecord::Weights { files, .. }) = BaseRecord::read(adapter_dir)? {
        let record = BaseRecord::Weights { path: path.to_string(), files };
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

    #[test]
    fn differences_name_the_file_and_ignore_the_place() {
        let a = BaseRecord::Weights { path: "/a".into(), files: vec![digest("config.json", "11"), digest("m", "22")] };
        let moved =
            BaseRecord::Weights { path: "/b".into(), files: vec![digest("config.json", "11"), digest("m", "22")] };
        assert_eq!(difference(&a, &moved), None);
        let changed =
            BaseRecord::Weights { path: "/a".into(), files: vec![digest("config.json", "11"), digest("m", "33")] };
        assert_eq!(difference(&a, &changed).unwrap(), "its m has blake3 33, not 22");
        let fewer = BaseRecord::Weights { path: "/a".into(), files: vec![digest("config.json", "11")] };
        assert_eq!(difference(&a, &fewer).unwrap(), "it has no m");
        assert_eq!(difference(&fewer, &a).unwrap(), "it has an extra m");
        let r7 = BaseRecord::RandomInit { seed: 7 };
        assert_eq!(difference(&r7, &BaseRecord::RandomInit { seed: 7 }), None);
        assert!(difference(&r7, &BaseRecord::RandomInit { seed: 8 }).unwrap().contains("seed 8"));
        assert!(difference(&r7, &a).is_some() && difference(&a, &r7).is_some());
    }

    #[test]
    fn records_round_trip_as_json() {
        for r in [
            BaseRecord::Weights { path: "/x/final".into(), files: vec![digest("config.json", "ab")] },
            BaseRecord::RandomInit { seed: 3 },
        ] {
            let back: BaseRecord = serde_json::from_slice(&r.to_bytes()).unwrap();
            assert_eq!(back, r);
        }
        let text = String::from_utf8(BaseRecord::RandomInit { seed: 3 }.to_bytes()).unwrap();
        assert!(text.contains("\"kind\": \"random_init\""), "{text}");
    }
}
