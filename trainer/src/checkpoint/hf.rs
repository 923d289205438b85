//! HF model directories: `config.json` plus `model.safetensors`, or shards listed in
//! `model.safetensors.index.json` (`{"metadata": {"total_size": N}, "weight_map": {name: file}}`).

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};
use serde::Deserialize;

use super::CheckpointError;
use super::durable::StagedDir;
use super::error::io;
use super::safetensors_file::{SafetensorsFile, write_safetensors};

pub const CONFIG_FILE: &str = "config.json";
pub const SINGLE_FILE: &str = "model.safetensors";
pub const INDEX_FILE: &str = "model.safetensors.index.json";
/// transformers' default `max_shard_size` ("5GB", decimal).
pub const DEFAULT_MAX_SHARD_BYTES: u64 = 5_000_000_000;

/// The weight files of an HF model directory and which file holds which tensor.
#[derive(Debug, Clone)]
pub struct WeightFiles {
    dir: PathBuf,
    /// The file that names the tensors: the single file or the index.
    listing: PathBuf,
    /// Tensor name -> file name (relative to `dir`).
    map: BTreeMap<String, String>,
}

#[derive(Deserialize)]
struct Index {
    weight_map: BTreeMap<String, String>,
}

impl WeightFiles {
    /// Finds the weights of `dir`: the index if present (every shard it names must exist),
    /// else `model.safetensors` (only its header is read here).
    pub fn open(dir: &Path) -> Result<Self, CheckpointError> {
        let index_path = dir.join(INDEX_FILE);
        let single_path = dir.join(SINGLE_FILE);
        if index_path.is_file() {
            let text = std::fs::read(&index_path).map_err(io(&index_path))?;
            let bad = |reason: String| CheckpointError::BadIndex { path: index_path.clone(), reason };
            let index: Index = serde_json::from_slice(&text).map_err(|e| bad(e.to_string()))?;
            if index.weight_map.is_empty() {
                return Err(bad("weight_map is empty".into()));
            }
            for (tensor, shard) in &index.weight_map {
                if shard.is_empty() || shard.contains('/') || shard.contains('\\') || shard.starts_with('.') {
                    return Err(bad(format!("tensor `{tensor}` maps to `{shard}`, not a file name in the directory")));
                }
                if !dir.join(shard).is_file() {
                    return Err(CheckpointError::MissingShard {
                        index: index_path.clone(),
                        shard: shard.clone(),
                        tensor: tensor.clone(),
                    });
                }
            }
            return Ok(WeightFiles { dir: dir.to_path_buf(), listing: index_path, map: index.weight_map });
        }
        if single_path.is_file() {
            let map = header_names(&single_path)?.into_iter().map(|n| (n, SINGLE_FILE.to_string())).collect();
            return Ok(WeightFiles { dir: dir.to_path_buf(), listing: single_path, map });
        }
        Err(CheckpointError::NoWeights { dir: dir.to_path_buf() })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The tensors the listing puts in `file` (a file name in the directory).
    pub(super) fn names_in<'a>(&'a self, file: &'a str) -> impl Iterator<Item = &'a str> + 'a {
        self.map.iter().filter(move |(_, f)| f.as_str() == file).map(|(n, _)| n.as_str())
    }

    pub fn contains(&self, name: &str) -> bool {
        self.map.contains_key(name)
    }

    pub fn tensor_names(&self) -> impl Iterator<Item = &str> {
        self.map.keys().map(String::as_str)
    }

    /// The weight files, in name order.
    pub fn files(&self) -> Vec<PathBuf> {
        let mut files: Vec<&String> = self.map.values().collect();
        files.sort();
        files.dedup();
        files.into_iter().map(|f| self.dir.join(f)).collect()
    }

    /// Every tensor, as `dtype` on `device`.
    pub fn load(&self, dtype: DType, device: &Device) -> Result<BTreeMap<String, Tensor>, CheckpointError> {
        self.load_names(self.map.keys().map(|n| (n.as_str(), None)), dtype, device)
    }

    /// Exactly the tensors of `expected` (name -> shape), checked against it; other tensors in
    /// the files are ignored (e.g. buffers older exports carry).
    pub fn load_expected(
        &self,
        expected: &BTreeMap<String, Vec<usize>>,
        dtype: DType,
        device: &Device,
    ) -> Result<BTreeMap<String, Tensor>, CheckpointError> {
        if let Some(name) = expected.keys().find(|n| !self.map.contains_key(*n)) {
            return Err(CheckpointError::MissingTensor { name: name.clone(), file: self.listing.clone() });
        }
        self.load_names(expected.iter().map(|(n, s)| (n.as_str(), Some(s.as_slice()))), dtype, device)
    }

    pub(super) fn load_names<'a>(
        &self,
        names: impl Iterator<Item = (&'a str, Option<&'a [usize]>)>,
        dtype: DType,
        device: &Device,
    ) -> Result<BTreeMap<String, Tensor>, CheckpointError> {
        // One shard in memory at a time.
        let mut by_file: BTreeMap<&str, Vec<Wanted>> = BTreeMap::new();
        for (name, shape) in names {
            by_file.entry(self.map[name].as_str()).or_default().push((name, shape));
        }
        let mut out = BTreeMap::new();
        for (file, wanted) in by_file {
            let path = self.dir.join(file);
            let st = SafetensorsFile::read(&path)?;
            let shapes: BTreeMap<String, Vec<usize>> = st.entries().into_iter().map(|(n, s, _)| (n, s)).collect();
            for (name, expected) in wanted {
                let found = shapes
                    .get(name)
                    .ok_or_else(|| CheckpointError::MissingTensor { name: name.into(), file: path.clone() })?;
                if let Some(expected) = expected
                    && expected != found.as_slice()
                {
                    return Err(CheckpointError::ShapeMismatch {
                        name: name.into(),
                        file: path.clone(),
                        expected: expected.to_vec(),
                        found: found.clone(),
                    });
                }
                out.insert(name.to_string(), st.load_float(&path, name, dtype, device)?);
            }
        }
        Ok(out)
    }
}

/// Every tensor of the HF model in `dir`, as `dtype` on `device`.
pub fn load_hf_weights(dir: &Path, dtype: DType, device: &Device) -> Result<BTreeMap<String, Tensor>, CheckpointError> {
    WeightFiles::open(dir)?.load(dtype, device)
}

/// Tensor names in a safetensors header, reading only the header.
pub(super) fn header_names(path: &Path) -> Result<Vec<String>, CheckpointError> {
    let bad = |reason: String| CheckpointError::BadSafetensors { path: path.to_path_buf(), reason };
    let mut f = std::fs::File::open(path).map_err(io(path))?;
    let file_len = f.metadata().map_err(io(path))?.len();
    let mut len = [0u8; 8];
    f.read_exact(&mut len).map_err(|e| bad(format!("no header length: {e}")))?;
    let len = u64::from_le_bytes(len);
    if len > 100_000_000 || len + 8 > file_len {
        return Err(bad(format!("header length {len} does not fit a {file_len}-byte file")));
    }
    let mut header = vec![0u8; len as usize];
    f.read_exact(&mut header).map_err(|e| bad(e.to_string()))?;
    let header: BTreeMap<String, serde_json::Value> =
        serde_json::from_slice(&header).map_err(|e| bad(format!("header is not a JSON object: {e}")))?;
    Ok(header.into_keys().filter(|k| k != "__metadata__").collect())
}

/// A tensor to load and, if known, the shape it must have.
pub(super) type Wanted<'a> = (&'a str, Option<&'a [usize]>);

pub(super) fn pt_metadata() -> BTreeMap<String, String> {
    BTreeMap::from([("format".to_string(), "pt".to_string())])
}

/// Writes `tensors` as they are stored (each its own dtype, FP8 codes included) into `file` of
/// `dir`, with the metadata transformers writes: one shard of a model whose tensors differ in dtype.
pub fn write_weight_file(
    dir: &mut StagedDir,
    file: &str,
    tensors: &BTreeMap<String, Tensor>,
) -> Result<(), CheckpointError> {
    let list: Vec<(&str, &Tensor)> = tensors.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let meta = pt_metadata();
    dir.write_with(file, |w| write_safetensors(w, &list, None, &meta).map(|_| ()))
}

/// Writes `config.json` (2-space indented, keys sorted, as transformers writes it) and the
/// weights as `dtype`: one `model.safetensors` if they fit `max_shard_bytes`, else shards
/// `model-0000i-of-0000n.safetensors` filled greedily in name order plus the index.
pub fn save_hf_model(
    dir: &mut StagedDir,
    config: &serde_json::Value,
    weights: &BTreeMap<String, Tensor>,
    dtype: DType,
    max_shard_bytes: u64,
) -> Result<(), CheckpointError> {
    let mut config_text = serde_json::to_string_pretty(config).expect("a Value always serializes");
    config_text.push('\n');
    dir.write_file(CONFIG_FILE, config_text.as_bytes())?;

    let size = |t: &Tensor| (t.elem_count() * dtype.size_in_bytes()) as u64;
    let total: u64 = weights.values().map(size).sum();
    let mut shards: Vec<Vec<(&str, &Tensor)>> = vec![Vec::new()];
    let mut current = 0u64;
    for (name, t) in weights {
        let last = shards.last_mut().expect("never empty");
        if !last.is_empty() && current + size(t) > max_shard_bytes {
            shards.push(Vec::new());
            current = 0;
        }
        shards.last_mut().expect("never empty").push((name.as_str(), t));
        current += size(t);
    }
    let meta = pt_metadata();
    if shards.len() == 1 {
        let only = &shards[0];
        return dir.write_with(SINGLE_FILE, |w| write_safetensors(w, only, Some(dtype), &meta).map(|_| ()));
    }
    let n = shards.len();
    let mut weight_map = serde_json::Map::new();
    for (i, shard) in shards.iter().enumerate() {
        let file = format!("model-{:05}-of-{n:05}.safetensors", i + 1);
        dir.write_with(&file, |w| write_safetensors(w, shard, Some(dtype), &meta).map(|_| ()))?;
        for (name, _) in shard {
            weight_map.insert(name.to_string(), serde_json::Value::String(file.clone()));
        }
    }
    let index = serde_json::json!({ "metadata": { "total_size": total }, "weight_map": weight_map });
    let mut text = serde_json::to_string_pretty(&index).expect("a Value always serializes");
    text.push('\n');
    dir.write_file(INDEX_FILE, text.as_bytes())
}

#[cfg(test)]
mod tests;
