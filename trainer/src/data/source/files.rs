//! Which files a recipe's data is: those `data.paths` names, as given, and directories in the
//! layouts datasets come in: the hub's (`data/train-00000-of-00003.parquet`,
//! `train/0000.parquet`, `train.jsonl`), picked by `data.split`, and `datasets.save_to_disk`'s
//! (`dataset_dict.json` naming the splits, each split a directory whose `state.json` lists its
//! Arrow files in order); or, with `data.hf_id` and no `data.paths`, the dataset's snapshot in
//! the Hugging Face cache, a directory in the hub's layout.

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::data::error::DataError;
use crate::hub::{self, HubError, RepoKind, Snapshot};
use crate::recipe::{Data, DataSource};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileKind {
    Jsonl,
    Parquet,
    /// Arrow IPC file format (`ARROW1` magic, random access to record batches).
    ArrowFile,
    /// Arrow IPC stream format (what `datasets` writes).
    ArrowStream,
}

/// One input file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InputFile {
    pub path: PathBuf,
    /// How it is reported: the recipe's path, joined with the path inside a directory.
    pub name: String,
    pub kind: FileKind,
}

const DATA_EXTENSIONS: [&str; 6] = ["parquet", "arrow", "ipc", "feather", "jsonl", "json"];

/// The cached snapshot a recipe's data reads: `source: hf` with `hf_id` and no `paths` names
/// the dataset `hf_id` at `revision` (default `main`) in the hub cache. `None` for data read
/// from `paths` or generated.
pub fn hub_snapshot(data: &Data) -> Result<Option<Snapshot>, HubError> {
    match (&data.source, &data.hf_id) {
        (DataSource::Hf, Some(id)) if data.paths.is_empty() => {
            Ok(Some(hub::resolve(id, RepoKind::Dataset, data.revision.as_deref())?))
        }
        _ => Ok(None),
    }
}

/// The files of a snapshot of the hub cache for `split`, named `hf_id/<path in the repository>`.
pub fn resolve_snapshot(snapshot: &Snapshot, split: &str) -> Result<Vec<InputFile>, DataError> {
    resolve_dir(&snapshot.dir, &snapshot.source.repo, split)
}

/// The files of `paths` (relative to `base_dir`) for `split`, in reading order: the paths in
/// the order given, each directory's files sorted by their path inside it.
pub fn resolve(paths: &[String], split: &str, base_dir: &Path) -> Result<Vec<InputFile>, DataError> {
    let mut files = Vec::new();
    for given in paths {
        let path = base_dir.join(given);
        let meta = std::fs::metadata(&path).map_err(|source| DataError::Io { path: path.clone(), source })?;
        if meta.is_dir() {
            files.extend(resolve_dir(&path, given, split)?);
        } else {
            files.push(InputFile { kind: kind_of(&path)?, path, name: given.clone() });
        }
    }
    Ok(files)
}

fn resolve_dir(dir: &Path, name: &str, split: &str) -> Result<Vec<InputFile>, DataError> {
    let bad = |message: String| DataError::Config(format!("{}: {message}", dir.display()));
    if dir.join("dataset_dict.json").is_file() {
        let dict = read_json(&dir.join("dataset_dict.json"))?;
        let splits: Vec<&str> =
            dict.get("splits").and_then(Value::as_array).into_iter().flatten().filter_map(Value::as_str).collect();
        if !splits.contains(&split) {
            return Err(bad(format!("has no split `{split}` (data.split); its splits: {}", splits.join(", "))));
        }
        return saved_dataset(&dir.join(split), &format!("{name}/{split}"));
    }
    if dir.join("state.json").is_file() {
        return saved_dataset(dir, name);
    }
    let mut all = Vec::new();
    walk(dir, Path::new(""), &mut all)?;
    all.sort();
    let chosen: Vec<&PathBuf> = all.iter().filter(|rel| in_split(rel, split)).collect();
    if chosen.is_empty() {
        let found: Vec<String> = all.iter().take(10).map(|p| p.display().to_string()).collect();
        return Err(bad(if found.is_empty() {
            "holds no data file (.parquet, .arrow, .jsonl)".to_owned()
        } else {
            format!("holds no file of split `{split}` (data.split); found: {}", found.join(", "))
        }));
    }
    chosen
        .into_iter()
        .map(|rel| {
            let path = dir.join(rel);
            Ok(InputFile { kind: kind_of(&path)?, name: format!("{name}/{}", rel.display()), path })
        })
        .collect()
}

/// A directory written by `Dataset.save_to_disk`: the Arrow files its `state.json` lists.
fn saved_dataset(dir: &Path, name: &str) -> Result<Vec<InputFile>, DataError> {
    let state_path = dir.join("state.json");
    let state = read_json(&state_path)?;
    let files = state.get("_data_files").and_then(Value::as_array).ok_or_else(|| {
        DataError::Config(format!(
            "{}: no `_data_files` list (not a datasets.save_to_disk layout?)",
            state_path.display()
        ))
    })?;
    files
        .iter()
        .map(|f| {
            let file = f.get("filename").and_then(Value::as_str).ok_or_else(|| {
                DataError::Config(format!("{}: a `_data_files` entry without `filename`", state_path.display()))
            })?;
            if file.contains('/') || file.contains('\\') || file == ".." {
                return Err(DataError::Config(format!("{}: unsafe file name {file:?}", state_path.display())));
            }
            let path = dir.join(file);
            Ok(InputFile { kind: kind_of(&path)?, name: format!("{name}/{file}"), path })
        })
        .collect()
}

fn read_json(path: &Path) -> Result<Value, DataError> {
    let bytes = std::fs::read(path).map_err(|source| DataError::Io { path: path.to_owned(), source })?;
    serde_json::from_slice(&bytes).map_err(|e| DataError::Config(format!("{}: not JSON: {e}", path.display())))
}

fn walk(root: &Path, rel: &Path, out: &mut Vec<PathBuf>) -> Result<(), DataError> {
    let dir = root.join(rel);
    let entries = std::fs::read_dir(&dir).map_err(|source| DataError::Io { path: dir.clone(), source })?;
    for entry in entries {
        let entry = entry.map_err(|source| DataError::Io { path: dir.clone(), source })?;
        let name = entry.file_name();
        if name.to_string_lossy().starts_with('.') {
            continue; // .cache, .git, .huggingface
        }
        let rel = rel.join(&name);
        let ty = entry.file_type().map_err(|source| DataError::Io { path: root.join(&rel), source })?;
        if ty.is_dir() {
            walk(root, &rel, out)?;
        } else if rel.extension().and_then(|e| e.to_str()).is_some_and(|e| DATA_EXTENSIONS.contains(&e)) {
            out.push(rel);
        }
    }
    Ok(())
}

/// The hub's rule: a file is in `split` when a directory on its path is named `split`, or
/// its name is `split` or starts with `split` followed by `-`, `_` or `.`.
fn in_split(rel: &Path, split: &str) -> bool {
    let dirs = rel.parent().into_iter().flat_map(Path::components);
    if dirs.into_iter().any(|c| c.as_os_str() == split) {
        return true;
    }
    let file = rel.file_name().and_then(|f| f.to_str()).unwrap_or_default();
    file.strip_prefix(split).is_some_and(|rest| rest.starts_with(['-', '_', '.']))
}

fn kind_of(path: &Path) -> Result<FileKind, DataError> {
    let ext = path.extension().and_then(|e| e.to_str()).unwrap_or_default().to_ascii_lowercase();
    match ext.as_str() {
        "jsonl" | "json" => Ok(FileKind::Jsonl),
        "parquet" => Ok(FileKind::Parquet),
        "arrow" | "ipc" | "feather" => {
            use std::io::Read;
            let mut magic = [0u8; 6];
            let mut file =
                std::fs::File::open(path).map_err(|source| DataError::Io { path: path.to_owned(), source })?;
            let n = file.read(&mut magic).map_err(|source| DataError::Io { path: path.to_owned(), source })?;
            Ok(if n == 6 && &magic == b"ARROW1" { FileKind::ArrowFile } else { FileKind::ArrowStream })
        }
        _ => Err(DataError::Config(format!(
            "{}: unknown data file type (expected .jsonl, .parquet or .arrow)",
            path.display()
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hub_split_rule() {
        for (path, split, want) in [
            ("data/train-00000-of-00003.parquet", "train", true),
            ("data/test-00000-of-00001.parquet", "train", false),
            ("default/train/0000.parquet", "train", true),
            ("train.jsonl", "train", true),
            ("training.jsonl", "train", false),
            ("plain_text/train_part2.arrow", "train", true),
            ("validation/x.parquet", "train", false),
        ] {
            assert_eq!(in_split(Path::new(path), split), want, "{path}");
        }
    }

    #[test]
    fn directories_resolve_in_path_order_with_the_split() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().join("ds");
        std::fs::create_dir_all(d.join("data")).unwrap();
        for f in ["data/train-00001-of-00002.parquet", "data/train-00000-of-00002.parquet", "data/test-0.parquet"] {
            std::fs::write(d.join(f), b"x").unwrap();
        }
        let files = resolve(&["ds".into()], "train", dir.path()).unwrap();
        let names: Vec<&str> = files.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(names, ["ds/data/train-00000-of-00002.parquet", "ds/data/train-00001-of-00002.parquet"]);
        let err = resolve(&["ds".into()], "validation", dir.path()).unwrap_err().to_string();
        assert!(err.contains("no file of split `validation`") && err.contains("data/test-0.parquet"), "{err}");
    }

    #[test]
    fn save_to_disk_layouts_follow_state_json() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().join("saved");
        std::fs::create_dir_all(d.join("train")).unwrap();
        std::fs::write(d.join("dataset_dict.json"), br#"{"splits": ["train"]}"#).unwrap();
        std::fs::write(
            d.join("train/state.json"),
            br#"{"_data_files": [{"filename": "data-00001-of-00002.arrow"}, {"filename": "data-00000-of-00002.arrow"}]}"#,
        )
        .unwrap();
        for f in ["data-00000-of-00002.arrow", "data-00001-of-00002.arrow"] {
            std::fs::write(d.join("train").join(f), b"stream").unwrap();
        }
        let files = resolve(&["saved".into()], "train", dir.path()).unwrap();
        assert_eq!(files[0].name, "saved/train/data-00001-of-00002.arrow", "state.json's order");
        assert_eq!(files[0].kind, FileKind::ArrowStream);
        let err = resolve(&["saved".into()], "test", dir.path()).unwrap_err().to_string();
        assert!(err.contains("no split `test`") && err.contains("train"), "{err}");
    }
}
