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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::{CheckpointError, load_hf_weights, save_hf_model};
    use crate::quantize::Granularity;
    use candle_core::DType;
    use rand::{Rng, SeedableRng};

    /// A two-layer decoder's tensors (with a router gate) in an HF directory, plus a tokenizer file.
    fn model_dir(root: &Path, names: &[(&str, &[usize])]) -> std::path::PathBuf {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(9);
        let tensors: BTreeMap<String, Tensor> = names
            .iter()
            .map(|(n, dims)| {
                let v: Vec<f32> = (0..dims.iter().product()).map(|_| rng.random_range(-0.5f32..0.5)).collect();
                (n.to_string(), Tensor::from_vec(v, *dims, &Device::Cpu).unwrap())
            })
            .collect();
        let src = root.join("src");
        let mut dir = StagedDir::create(&src).unwrap();
        save_hf_model(
            &mut dir,
            &json!({"model_type": "qwen3", "torch_dtype": "float32"}),
            &tensors,
            DType::F32,
            u64::MAX,
        )
        .unwrap();
        dir.write_file("tokenizer.json", b"{}").unwrap();
        dir.commit().unwrap();
        src
    }

    const DENSE: [(&str, &[usize]); 6] = [
        ("model.embed_tokens.weight", &[16, 8]),
        ("model.layers.0.self_attn.q_proj.weight", &[8, 8]),
        ("model.layers.0.mlp.gate.weight", &[4, 8]),
        ("model.layers.0.input_layernorm.weight", &[8]),
        ("model.layers.1.mlp.down_proj.weight", &[8, 12]),
        ("lm_head.weight", &[16, 8]),
    ];

    fn run(src: &Path, out: &Path, weights: Granularity) -> (Quantized, Value, BTreeMap<String, Tensor>) {
        let q = quantize_dir(src, out, Fp8Options { weights }, &mut |_| {}).unwrap();
        let config: Value = serde_json::from_slice(&std::fs::read(out.join(CONFIG_FILE)).unwrap()).unwrap();
        let tensors = read_safetensors(&out.join("model.safetensors"), None, &Device::Cpu).unwrap();
        (q, config, tensors)
    }

    #[test]
    fn a_model_directory_becomes_fp8_linears_with_scales_and_everything_else_as_it_was() {
        let tmp = tempfile::tempdir().unwrap();
        let src = model_dir(tmp.path(), &DENSE);
        let (q, config, tensors) = run(&src, &tmp.path().join("q"), Granularity::Channel);
        assert_eq!(q.fp8_tensors, 2);
        let qc = &config["quantization_config"];
        assert_eq!(qc["quant_method"], "compressed-tensors");
        assert_eq!(qc["format"], "float-quantized");
        assert_eq!(qc["config_groups"]["group_0"]["weights"]["strategy"], "channel");
        assert_eq!(qc["config_groups"]["group_0"]["input_activations"]["dynamic"], true);
        assert_eq!(qc["ignore"], json!(["lm_head", "model.layers.0.mlp.gate"]));
        assert_eq!(config["model_type"], "qwen3");
        let original = load_hf_weights(&src, DType::F32, &Device::Cpu).unwrap();
        for (name, dims) in DENSE {
            let t = &tensors[name];
            match treatment(name, dims) {
                Treatment::Quantize => {
                    assert_eq!(t.dtype(), DType::F8E4M3, "{name}");
                    let scale = &tensors[&format!("{name}_scale")];
                    assert_eq!(scale.dims(), &[dims[0], 1], "{name}");
                    let back = super::super::Fp8Weight { codes: t.clone(), scale: scale.clone() }
                        .dequantize(DType::F32)
                        .unwrap();
                    let err = (back - &original[name]).unwrap().abs().unwrap().max_all().unwrap();
                    assert!(err.to_scalar::<f32>().unwrap() < 0.5 / 16.0, "{name}");
                }
                _ => assert_eq!(t.to_vec1::<f32>().ok(), original[name].to_vec1::<f32>().ok(), "{name}"),
            }
        }
        assert!(tmp.path().join("q/tokenizer.json").is_file(), "the tokenizer is carried");
        let names: Vec<&str> = q.files.iter().map(|f| f.path.as_str()).collect();
        assert_eq!(names, ["config.json", "model.safetensors", "tokenizer.json"]);
        // The quantized directory is not read as weights: its codes need their scales.
        let loaded = load_hf_weights(&tmp.path().join("q"), DType::F32, &Device::Cpu);
        assert!(matches!(loaded, Err(CheckpointError::QuantizedWeights { .. })), "{loaded:?}");
    }

    #[test]
    fn per_channel_false_writes_one_scale_per_tensor_and_says_so() {
        let tmp = tempfile::tempdir().unwrap();
        let src = model_dir(tmp.path(), &DENSE);
        let recipe = crate::recipe::Quantize { enabled: true, per_channel: false, ..Default::default() };
        let options = Fp8Options::from_recipe(&recipe).unwrap();
        let (_, config, tensors) = run(&src, &tmp.path().join("q"), options.weights);
        assert_eq!(config["quantization_config"]["config_groups"]["group_0"]["weights"]["strategy"], "tensor");
        assert_eq!(tensors["model.layers.0.self_attn.q_proj.weight_scale"].dims(), &[1]);
        let per_channel = Fp8Options::from_recipe(&crate::recipe::Quantize::default()).unwrap();
        assert_eq!(per_channel.weights, Granularity::Channel);
    }

    #[test]
    fn experts_adapters_and_quantized_directories_are_refused_by_name() {
        let tmp = tempfile::tempdir().unwrap();
        let moe = model_dir(tmp.path(), &[("model.layers.0.mlp.experts.0.up_proj.weight", &[4, 8])]);
        let err = quantize_dir(&moe, &tmp.path().join("a"), Fp8Options::default(), &mut |_| {}).unwrap_err();
        assert!(err.to_string().contains("mixture-of-experts"), "{err}");
        std::fs::write(moe.join(ADAPTER_CONFIG_FILE), "{}").unwrap();
        let err = quantize_dir(&moe, &tmp.path().join("b"), Fp8Options::default(), &mut |_| {}).unwrap_err();
        assert!(matches!(err, QuantizeError::Adapter { .. }), "{err}");
        let dense = tmp.path().join("dense");
        std::fs::create_dir(&dense).unwrap();
        let src = model_dir(&dense, &DENSE);
        let out = tmp.path().join("q");
        quantize_dir(&src, &out, Fp8Options::default(), &mut |_| {}).unwrap();
        let again = quantize_dir(&out, &tmp.path().join("qq"), Fp8Options::default(), &mut |_| {}).unwrap_err();
        assert!(matches!(again, QuantizeError::AlreadyQuantized { .. }), "{again}");
        assert!(!tmp.path().join("a").exists() && !tmp.path().join("qq").exists(), "nothing half-written");
        let bad =
            crate::recipe::Quantize { enabled: true, scheme: crate::recipe::QuantScheme::Int4, ..Default::default() };
        assert!(Fp8Options::from_recipe(&bad).unwrap_err().to_string().contains("int4 is not built"));
    }
}
