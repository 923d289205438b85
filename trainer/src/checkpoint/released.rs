//! The released Qwen3.5/3.6 checkpoints' layout (`Qwen3_5ForConditionalGeneration`,
//! `Qwen3_5MoeForConditionalGeneration`, e.g. Qwen/Qwen3.6-27B): the text model under
//! `model.language_model.*` and its head `lm_head.weight`, beside the vision tower
//! `model.visual.*` and the multi-token-prediction layer `mtp.*`, sharded with an index.
//!
//! The text model loads under our names (`model.language_model.X` is our `model.X`); the other
//! tensors are not read, only remembered where they are. A save writes the directory back as it
//! was released: the same `config.json` and index, the same shards holding the same tensors, each
//! in its stored dtype; the text weights from the model, every other tensor's bytes copied from
//! the source without decoding, so what training did not touch is bit for bit the source's.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use candle_core::{DType, Device, Tensor};

use super::CheckpointError;
use super::durable::StagedDir;
use super::error::{io, tensor};
use super::hf::{CONFIG_FILE, INDEX_FILE, WeightFiles, header_names, pt_metadata};
use super::safetensors_file::{SafetensorsFile, dtype_of, encode, write_raw_safetensors};

/// Where a released checkpoint keeps its language model's tensors.
pub const RELEASED_TEXT_PREFIX: &str = "model.language_model.";
/// Where our model (and transformers' `*ForCausalLM`) keeps them.
const OUR_PREFIX: &str = "model.";
/// The untied head, at the top in both layouts.
const HEAD: &str = "lm_head.weight";
/// PEFT names a released base's text modules through its `model.language_model` path.
const PEFT_OURS: &str = "base_model.model.model.";
const PEFT_RELEASED: &str = "base_model.model.model.language_model.";

/// Our name for a released tensor, if the text model has it (`lm_head.weight` is at the top in
/// both layouts); `None` for the vision tower and the MTP layer.
pub fn text_name(released: &str) -> Option<String> {
    match released.strip_prefix(RELEASED_TEXT_PREFIX) {
        Some(rest) => Some(format!("{OUR_PREFIX}{rest}")),
        None if released == HEAD => Some(released.to_string()),
        None => None,
    }
}

/// The released name of our tensor `ours`.
pub fn released_name(ours: &str) -> String {
    match ours.strip_prefix(OUR_PREFIX) {
        Some(rest) => format!("{RELEASED_TEXT_PREFIX}{rest}"),
        None => ours.to_string(),
    }
}

/// Adapter tensors under the names PEFT gives them over a released base.
pub fn released_adapter_names(tensors: &BTreeMap<String, Tensor>) -> BTreeMap<String, Tensor> {
    let rename = |n: &str| match n.strip_prefix(PEFT_OURS) {
        Some(rest) => format!("{PEFT_RELEASED}{rest}"),
        None => n.to_string(),
    };
    tensors.iter().map(|(n, t)| (rename(n), t.clone())).collect()
}

/// An adapter tensor's name over our model, whether PEFT saved it over a released base or not.
pub(super) fn our_adapter_name(name: &str) -> String {
    match name.strip_prefix(PEFT_RELEASED) {
        Some(rest) => format!("{PEFT_OURS}{rest}"),
        None => name.to_string(),
    }
}

/// A released checkpoint directory: where each of its tensors is.
#[derive(Debug, Clone)]
pub struct ReleasedLayout {
    files: WeightFiles,
}

impl ReleasedLayout {
    /// `dir`'s weights if they are in the released layout (any tensor under
    /// `model.language_model.`), else `None`.
    pub fn detect(dir: &Path) -> Result<Option<ReleasedLayout>, CheckpointError> {
        Self::of(WeightFiles::open(dir)?)
    }

    /// `files` if released, having checked that every tensor the index names is in its shard
    /// (the tensors a save copies are never read at load, so a gap would show only then).
    pub(super) fn of(files: WeightFiles) -> Result<Option<ReleasedLayout>, CheckpointError> {
        if !files.tensor_names().any(|n| n.starts_with(RELEASED_TEXT_PREFIX)) {
            return Ok(None);
        }
        for path in files.files() {
            let held: BTreeSet<String> = header_names(&path)?.into_iter().collect();
            let file = path.file_name().map(|f| f.to_string_lossy().into_owned()).unwrap_or_default();
            if let Some(name) = files.names_in(&file).find(|n| !held.contains(*n)) {
                return Err(CheckpointError::MissingTensor { name: name.to_string(), file: path.clone() });
            }
        }
        Ok(Some(ReleasedLayout { files }))
    }

    pub fn dir(&self) -> &Path {
        self.files.dir()
    }

    /// The text model's tensors under our names, as `dtype` on `device`.
    pub fn load_text(&self, dtype: DType, device: &Device) -> Result<BTreeMap<String, Tensor>, CheckpointError> {
        let text: Vec<(&str, String)> =
            self.files.tensor_names().filter_map(|n| text_name(n).map(|ours| (n, ours))).collect();
        let mut loaded = self.files.load_names(text.iter().map(|(n, _)| (*n, None)), dtype, device)?;
        Ok(text.into_iter().filter_map(|(n, ours)| loaded.remove(n).map(|t| (ours, t))).collect())
    }

    /// Writes the checkpoint back into `out` with `weights` (the text model under our names, one
    /// tensor per expert as the source has them) in place of the source's text tensors: the
    /// source's `config.json` and index as they are, each shard with the same tensors, each in its
    /// stored dtype. Every weight must have a tensor of its shape in the source, and every source
    /// text tensor a weight.
    pub fn save(&self, out: &mut StagedDir, weights: &BTreeMap<String, Tensor>) -> Result<(), CheckpointError> {
        let dir = self.dir().to_path_buf();
        let mismatch = |reason: String| CheckpointError::ReleasedMismatch { dir: dir.clone(), reason };
        let mut text: BTreeMap<String, (&str, &Tensor)> = BTreeMap::new();
        for (ours, t) in weights {
            let name = released_name(ours);
            if !self.files.contains(&name) {
                return Err(mismatch(format!("the weight `{ours}` has no tensor `{name}` there")));
            }
            text.insert(name, (ours.as_str(), t));
        }
        if let Some(missing) = self.files.tensor_names().find(|n| text_name(n).is_some() && !text.contains_key(*n)) {
            return Err(mismatch(format!("its text tensor `{missing}` is not among the weights saved")));
        }
        for file in [CONFIG_FILE, INDEX_FILE] {
            let path = dir.join(file);
            if path.is_file() {
                out.write_file(file, &std::fs::read(&path).map_err(io(&path))?)?;
            }
        }
        let meta = pt_metadata();
        for path in self.files.files() {
            let source = SafetensorsFile::read(&path)?;
            let mut tensors = source.raw_tensors(&path)?;
            for (name, stored) in tensors.iter_mut() {
                let Some((ours, t)) = text.get(name) else { continue };
                let dtype = dtype_of(&stored.dtype).filter(|d| d.is_float()).ok_or_else(|| {
                    CheckpointError::UnsupportedDtype {
                        name: name.clone(),
                        file: path.clone(),
                        dtype: stored.dtype.clone(),
                    }
                })?;
                if t.dims() != stored.shape.as_slice() {
                    return Err(CheckpointError::ShapeMismatch {
                        name: ours.to_string(),
                        file: path.clone(),
                        expected: stored.shape.clone(),
                        found: t.dims().to_vec(),
                    });
                }
                stored.bytes = std::borrow::Cow::Owned(encode(t, dtype).map_err(tensor(ours))?);
            }
            let file = path.file_name().map(|f| f.to_string_lossy().into_owned()).unwrap_or_default();
            out.write_with(&file, |w| write_raw_safetensors(w, &tensors, &meta))?;
        }
        Ok(())
    }
}

/// The source a model's save writes back to: `dir`'s layout if released.
pub fn released_source(dir: Option<&Path>) -> Result<Option<ReleasedLayout>, CheckpointError> {
    dir.map(ReleasedLayout::detect).transpose().map(Option::flatten)
}

#[cfg(test)]
mod tests;
