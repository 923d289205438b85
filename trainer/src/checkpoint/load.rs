//! Loading a model for use, onto the device the caller names: an HF model directory, a
//! recipe's base (the directory `run::base::base_dir` settles, or the seeded random init), and
//! a trained checkpoint as a run left it (full weights, or a PEFT adapter over the base).
//!
//! A training run, `mindxtrain eval` and the inference server all load through here, so the
//! model a node serves on its GPU is exactly the one its run trained.

use std::collections::BTreeMap;
use std::path::Path;

use candle_core::{DType, Device, Tensor};

use super::error::io;
use super::{
    ADAPTER_CONFIG_FILE, AdapterConfig, CONFIG_FILE, CheckpointError, FileDigest, ReleasedLayout, WeightFiles,
};
use crate::model::{Adapters, CausalLm, LmConfig, LoraConfig, ModelError};
use crate::recipe::{Dtype, Recipe, TargetModule};

/// Why a model could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error("model: no base weights and no model.config to draw random weights for")]
    NoModel,
    #[error("{path}: {reason}")]
    Adapter { path: String, reason: String },
}

/// The tensor dtype of a recipe's `model.dtype`.
pub fn model_dtype(d: Dtype) -> DType {
    match d {
        Dtype::Fp32 => DType::F32,
        Dtype::Bf16 => DType::BF16,
        Dtype::Fp16 => DType::F16,
    }
}

/// An HF model directory (`config.json` and its weights) on `device`, with the digests of its
/// files. A released multimodal Qwen3.5/3.6 checkpoint loads its text model ([`ReleasedLayout`]).
pub fn load_hf_model(dir: &Path, dtype: DType, device: &Device) -> Result<(CausalLm, Vec<FileDigest>), LoadError> {
    let config_path = dir.join(CONFIG_FILE);
    let text = std::fs::read_to_string(&config_path).map_err(io(&config_path))?;
    let config = LmConfig::from_hf_json(&text)?;
    let weights = WeightFiles::open(dir)?;
    let files_read = weights.files();
    let params = match ReleasedLayout::of(weights.clone())? {
        Some(released) => released.load_text(dtype, device)?,
        None => weights.load(dtype, device)?,
    };
    let mut files = vec![digest_file(&config_path, dir)?];
    for f in files_read {
        files.push(digest_file(&f, dir)?);
    }
    Ok((CausalLm::new(config, params, device)?, files))
}

/// A recipe's base model on `device`: the HF directory `base` (which `run::base::base_dir`
/// settles), else the random init of `model.config` from `meta.seed`.
pub fn load_base(
    recipe: &Recipe,
    base: Option<&Path>,
    device: &Device,
) -> Result<(CausalLm, Vec<FileDigest>), LoadError> {
    let dtype = model_dtype(recipe.model.dtype);
    match base {
        Some(dir) => load_hf_model(dir, dtype, device),
        None => {
            let config = recipe.model.config.as_ref().ok_or(LoadError::NoModel)?;
            let shape = LmConfig::from_recipe(config, recipe.model.family).ok_or(LoadError::NoModel)?;
            Ok((CausalLm::init_random(&shape, recipe.meta.seed, dtype, device)?, vec![]))
        }
    }
}

/// A trained model as a run left it, on `device`: `checkpoint_dir` holds full HF weights, or a
/// PEFT adapter applied over `base` ([`load_base`]; `run::adapter_base` settles it).
pub fn load_checkpoint(
    recipe: &Recipe,
    base: Option<&Path>,
    checkpoint_dir: &Path,
    device: &Device,
) -> Result<(CausalLm, Option<Adapters>), LoadError> {
    let dtype = model_dtype(recipe.model.dtype);
    if !is_adapter(checkpoint_dir) {
        return Ok((load_hf_model(checkpoint_dir, dtype, device)?.0, None));
    }
    let (model, _) = load_base(recipe, base, device)?;
    let adapters = load_adapter(checkpoint_dir, model.config(), dtype, device)?;
    Ok((model, Some(adapters)))
}

/// Whether `dir` holds a PEFT adapter rather than full weights.
pub fn is_adapter(dir: &Path) -> bool {
    dir.join(ADAPTER_CONFIG_FILE).exists()
}

/// A PEFT adapter directory as [`Adapters`] for a model of `config`, in `dtype` on `device`.
/// Its rank, scaling and targets come from its own `adapter_config.json`, so adapters trained by
/// different recipes can be served over one base.
pub fn load_adapter(dir: &Path, config: &LmConfig, dtype: DType, device: &Device) -> Result<Adapters, LoadError> {
    let (peft, tensors) = super::load_peft_adapter(dir, device)?;
    let lora = lora_config(&peft).map_err(|reason| LoadError::Adapter { path: dir.display().to_string(), reason })?;
    Ok(Adapters::new(config, lora, in_dtype(tensors, dtype)?)?)
}

/// A PEFT adapter's tensors in `dtype` (for resuming a run whose config is the recipe's).
pub fn load_adapter_tensors(dir: &Path, dtype: DType, device: &Device) -> Result<BTreeMap<String, Tensor>, LoadError> {
    let (_, tensors) = super::load_peft_adapter(dir, device)?;
    in_dtype(tensors, dtype)
}

fn in_dtype(tensors: BTreeMap<String, Tensor>, dtype: DType) -> Result<BTreeMap<String, Tensor>, LoadError> {
    tensors
        .into_iter()
        .map(|(k, t)| match t.to_dtype(dtype) {
            Ok(t) => Ok((k, t)),
            Err(source) => Err(CheckpointError::Tensor { name: k, source }.into()),
        })
        .collect()
}

/// The adapter hyper-parameters a PEFT config describes.
fn lora_config(peft: &AdapterConfig) -> Result<LoraConfig, String> {
    let target_modules = peft
        .target_modules
        .iter()
        .map(|m| {
            TargetModule::EVERY
                .into_iter()
                .find(|t| super::peft::module_name(*t) == m)
                .ok_or_else(|| format!("target module {m:?} is not a projection this engine adapts"))
        })
        .collect::<Result<Vec<_>, _>>()?;
    // An expert weight is adapted through the projections it stacks (`LoraConfig::expert_targets`).
    let mut target_modules = target_modules;
    for p in peft.expert_parameters() {
        let stacked = match p {
            "gate_up_proj" if peft.rank_pattern.is_empty() => {
                return Err(format!(
                    "target parameter {p:?} at rank {}: the fused gate/up experts are adapted at twice the rank \
                     (rank_pattern, as PEFT's conversion of gate_proj + up_proj targets writes it)",
                    peft.r
                ));
            }
            "gate_up_proj" => [TargetModule::GateProj, TargetModule::UpProj].as_slice(),
            "down_proj" => [TargetModule::DownProj].as_slice(),
            other => return Err(format!("target parameter {other:?} is not a Qwen3-MoE expert weight")),
        };
        for m in stacked {
            if !target_modules.contains(m) {
                target_modules.push(*m);
            }
        }
    }
    Ok(LoraConfig {
        r: peft.r as usize,
        alpha: f64::from(peft.lora_alpha),
        dropout: peft.lora_dropout,
        target_modules,
        rslora: peft.use_rslora,
    })
}

/// Size and BLAKE3 of `path`, named relative to `root`.
pub fn digest_file(path: &Path, root: &Path) -> Result<FileDigest, CheckpointError> {
    let mut h = blake3::Hasher::new();
    h.update_mmap_rayon(path).map_err(io(path))?;
    let bytes = std::fs::metadata(path).map_err(io(path))?.len();
    let rel = path.strip_prefix(root).unwrap_or(path).to_string_lossy().replace('\\', "/");
    Ok(FileDigest { path: rel, bytes, blake3: h.finalize().to_hex().to_string() })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::{StagedDir, save_hf_model, save_peft_adapter};
    use crate::recipe::Lora;

    fn tiny() -> LmConfig {
        LmConfig {
            arch: crate::model::Arch::Qwen3,
            vocab_size: 32,
            hidden_size: 16,
            intermediate_size: 24,
            num_hidden_layers: 1,
            num_attention_heads: 2,
            num_key_value_heads: 1,
            head_dim: 8,
            rms_norm_eps: 1e-6,
            rope_theta: 10_000.0,
            tie_word_embeddings: false,
            max_position_embeddings: 64,
            moe: None,
            hybrid: None,
        }
    }

    #[test]
    fn an_adapter_loads_with_its_own_config_and_a_full_checkpoint_on_the_device_asked() {
        let root = tempfile::tempdir().unwrap();
        let config = tiny();
        let model = CausalLm::init_random(&config, 3, DType::F32, &Device::Cpu).unwrap();
        let hf = root.path().join("full");
        let mut dir = StagedDir::create(&hf).unwrap();
        let json: serde_json::Value = serde_json::from_str(&config.to_hf_json("float32")).unwrap();
        save_hf_model(&mut dir, &json, model.params(), DType::F32, crate::checkpoint::DEFAULT_MAX_SHARD_BYTES).unwrap();
        dir.commit().unwrap();
        let (loaded, files) = load_hf_model(&hf, DType::F32, &Device::Cpu).unwrap();
        assert_eq!(files[0].path, CONFIG_FILE);
        assert_eq!(loaded.config(), model.config());

        let lora = Lora { r: 2, alpha: 8, target_modules: vec![TargetModule::VProj], ..Lora::default() };
        let adapters = Adapters::init(&config, &LoraConfig::from(&lora), 5, DType::F32, &Device::Cpu).unwrap();
        let ad = root.path().join("adapter");
        let mut dir = StagedDir::create(&ad).unwrap();
        save_peft_adapter(&mut dir, &AdapterConfig::from_recipe(&lora, None), &adapters.tensors).unwrap();
        dir.commit().unwrap();
        assert!(is_adapter(&ad) && !is_adapter(&hf));
        let back = load_adapter(&ad, &config, DType::F32, &Device::Cpu).unwrap();
        assert_eq!(back.config, LoraConfig::from(&lora));
        assert_eq!(back.tensors.keys().collect::<Vec<_>>(), adapters.tensors.keys().collect::<Vec<_>>());
        // An adapter for another shape is refused, naming the tensor.
        let other = LmConfig { hidden_size: 8, num_attention_heads: 1, ..tiny() };
        assert!(load_adapter(&ad, &other, DType::F32, &Device::Cpu).unwrap_err().to_string().contains("lora_A"));
    }
}
