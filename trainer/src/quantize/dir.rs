//! An HF model directory in, its FP8 compressed-tensors directory out.
//!
//! Shard by shard (one in memory at a time), each output file named as its input: every decoder
//! Linear weight becomes `*.weight` (F8_E4M3 codes) and `*.weight_scale`, everything else is
//! written as it was; a sharded model gets a new index. config.json gains the
//! `quantization_config`; every other file of the directory (tokenizer, chat template,
//! generation config, model card, model code) is copied. The directory appears complete or not
//! at all ([`StagedDir`]).

use std::collections::BTreeMap;
use std::path::Path;

use candle_core::{Device, Tensor};
use serde_json::{Value, json};

use super::config::{Fp8Options, quantization_config};
use super::fp8::quantize;
use super::targets::{Treatment, is_expert, treatment};
use super::{QuantizeError, StagedDir};
use crate::checkpoint::{
    ADAPTER_CONFIG_FILE, CONFIG_FILE, FileDigest, INDEX_FILE, WeightFiles, read_safetensors, write_weight_file,
};

/// What a quantization wrote.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Quantized {
    /// The output directory's files, with their digests.
    pub files: Vec<FileDigest>,
    /// Weights written as FP8.
    pub fp8_tensors: usize,
    /// Linear weights kept in their dtype (named in `ignore`, with `lm_head`).
    pub ignored: Vec<String>,
    /// compressed-tensors' weight strategy: `channel` or `tensor`.
    pub strategy: &'static str,
}

/// Quantizes the HF model in `src` into `out` (which must not exist), telling `progress` one
/// line per weight file.
pub fn quantize_dir(
    src: &Path,
    out: &Path,
    options: Fp8Options,
    progress: &mut dyn FnMut(&str),
) -> Result<Quantized, QuantizeError> {
    if src.join(ADAPTER_CONFIG_FILE).is_file() {
        return Err(QuantizeError::Adapter { path: src.to_path_buf() });
    }
    let config_path = src.join(CONFIG_FILE);
    let text = std::fs::read(&config_path).map_err(QuantizeError::io(&config_path))?;
    let bad = |message: String| QuantizeError::BadConfig { path: config_path.clone(), message };
    let mut config: Value = serde_json::from_slice(&text).map_err(|e| bad(e.to_string()))?;
    let Some(fields) = config.as_object_mut() else { return Err(bad("not a JSON object".into())) };
    if fields.contains_key("quantization_config") {
        return Err(QuantizeError::AlreadyQuantized { path: src.to_path_buf() });
    }
    let weights = WeightFiles::open(src)?;
    if let Some(name) = weights.tensor_names().find(|n| is_expert(n)) {
        return Err(QuantizeError::NotBuilt(format!(
            "FP8 for mixture-of-experts models is not built (`{name}` is an expert's weight): transformers holds \
             the experts as fused parameters, not the Linear modules the compressed-tensors scheme targets"
        )));
    }
    let mut dir = StagedDir::create(out)?;
    let mut weight_map = serde_json::Map::new();
    let (mut fp8_tensors, mut ignored, mut total_size) = (0, Vec::new(), 0u64);
    let files = weights.files();
    for (i, path) in files.iter().enumerate() {
        let file = super::file_name(path);
        let tensors = read_safetensors(path, None, &Device::Cpu)?;
        let mut written: BTreeMap<String, Tensor> = BTreeMap::new();
        let mut here = 0;
        for (name, t) in tensors {
            match treatment(&name, t.dims()) {
                Treatment::Quantize => {
                    let q = quantize(&name, &t, options.weights)?;
                    written.insert(format!("{name}_scale"), q.scale);
                    written.insert(name, q.codes);
                    here += 1;
                }
                Treatment::Ignore => {
                    ignored.push(name.trim_end_matches(".weight").to_string());
                    written.insert(name, t);
                }
                Treatment::Keep => {
                    written.insert(name, t);
                }
            }
        }
        for (name, t) in &written {
            weight_map.insert(name.clone(), json!(file));
            total_size += (t.elem_count() * t.dtype().size_in_bytes()) as u64;
        }
        write_weight_file(&mut dir, &file, &written)?;
        fp8_tensors += here;
        progress(&format!("quantize: {file} ({} of {}): {here} weights to FP8", i + 1, files.len()));
    }
    if src.join(INDEX_FILE).is_file() {
        let index = json!({"metadata": {"total_size": total_size}, "weight_map": weight_map});
        dir.write_file(INDEX_FILE, &pretty(&index))?;
    }
    let mut ignore = vec!["lm_head".to_string()];
    ignore.extend(ignored.iter().cloned());
    fields.insert("quantization_config".into(), quantization_config(options, &ignore));
    dir.write_file(CONFIG_FILE, &pretty(&config))?;
    copy_the_rest(src, &mut dir, &files)?;
    let files = dir.commit()?;
    Ok(Quantized { files, fp8_tensors, ignored, strategy: options.weights.strategy() })
}

/// Every regular file of `src` that is not a weight file, the index or config.json, as it is.
fn copy_the_rest(src: &Path, dir: &mut StagedDir, weight_files: &[std::path::PathBuf]) -> Result<(), QuantizeError> {
    let entries = std::fs::read_dir(src).map_err(QuantizeError::io(src))?;
    let mut names = Vec::new();
    for e in entries {
        let path = e.map_err(QuantizeError::io(src))?.path();
        let name = super::file_name(&path);
        let skip = !path.is_file() || name == CONFIG_FILE || name == INDEX_FILE || weight_files.contains(&path);
        if !skip {
            names.push((name, path));
        }
    }
    names.sort();
    for (name, path) in names {
        let bytes = std::fs::read(&path).map_err(QuantizeError::io(&path))?;
        dir.write_file(&name, &bytes)?;
    }
    Ok(())
}

/// JSON as transformers writes it: 2-space indented, a final newline.
fn pretty(v: &Value) -> Vec<u8> {
    let mut bytes = serde_json::to_vec_pretty(v).unwrap_or_default();
    bytes.push(b'\n');
    bytes
}
