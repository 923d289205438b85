//! The released layout on a hand-made two-shard checkpoint of mixed dtypes: the key mapping, the
//! text model loaded under our names, a save that writes back every tensor it did not change bit
//! for bit, and the errors for a missing shard, a key no shard holds and foreign weights.

use super::super::safetensors_file::safetensors_bytes;
use super::*;

const SHARDS: [&str; 2] = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"];

fn t(seed: usize, shape: &[usize], dtype: DType) -> Tensor {
    let n = shape.iter().product::<usize>();
    let v: Vec<f32> = (0..n).map(|i| ((seed * 97 + i * 13) as f32 * 0.37).sin()).collect();
    Tensor::from_vec(v, shape, &Device::Cpu).unwrap().to_dtype(dtype).unwrap()
}

/// Shard 1: the vision tower (bf16) and the embedding; shard 2: the rest of the text model
/// (bf16), the head, and an MTP tensor kept in f32.
fn released(root: &Path) -> std::path::PathBuf {
    let dir = root.join("released");
    std::fs::create_dir_all(&dir).unwrap();
    let bf = DType::BF16;
    let shards: [BTreeMap<String, Tensor>; 2] = [
        BTreeMap::from([
            ("model.visual.blocks.0.attn.qkv.weight".to_string(), t(1, &[6, 2], bf)),
            ("model.language_model.embed_tokens.weight".to_string(), t(2, &[4, 3], bf)),
        ]),
        BTreeMap::from([
            ("model.language_model.layers.0.self_attn.q_proj.weight".to_string(), t(3, &[3, 3], bf)),
            ("model.language_model.norm.weight".to_string(), t(4, &[3], bf)),
            ("lm_head.weight".to_string(), t(5, &[4, 3], bf)),
            ("mtp.fc.weight".to_string(), t(6, &[3, 6], DType::F32)),
        ]),
    ];
    let mut weight_map = serde_json::Map::new();
    for (file, tensors) in SHARDS.iter().zip(&shards) {
        let meta = pt_metadata();
        std::fs::write(dir.join(file), safetensors_bytes(tensors, None, &meta).unwrap()).unwrap();
        for name in tensors.keys() {
            weight_map.insert(name.clone(), serde_json::Value::String(file.to_string()));
        }
    }
    let index = serde_json::json!({"metadata": {"total_size": 1}, "weight_map": weight_map});
    std::fs::write(dir.join(INDEX_FILE), serde_json::to_vec_pretty(&index).unwrap()).unwrap();
    std::fs::write(dir.join(CONFIG_FILE), br#"{"model_type": "qwen3_5", "text_config": {}}"#).unwrap();
    dir
}

fn raw_of(dir: &Path) -> BTreeMap<String, (String, Vec<usize>, Vec<u8>)> {
    let mut out = BTreeMap::new();
    for file in SHARDS {
        let path = dir.join(file);
        let st = SafetensorsFile::read(&path).unwrap();
        for (name, r) in st.raw_tensors(&path).unwrap() {
            out.insert(name, (r.dtype, r.shape, r.bytes.into_owned()));
        }
    }
    out
}

#[test]
fn released_names_map_to_ours_and_back() {
    assert_eq!(
        text_name("model.language_model.layers.3.linear_attn.A_log").unwrap(),
        "model.layers.3.linear_attn.A_log"
    );
    assert_eq!(text_name("lm_head.weight").unwrap(), "lm_head.weight");
    assert_eq!(text_name("model.visual.merger.linear_fc1.weight"), None);
    assert_eq!(text_name("mtp.layers.0.mlp.gate_proj.weight"), None);
    assert_eq!(released_name("model.norm.weight"), "model.language_model.norm.weight");
    assert_eq!(released_name("lm_head.weight"), "lm_head.weight");
    let ours = "base_model.model.model.layers.0.linear_attn.in_proj_qkv.lora_A.weight";
    let peft = released_adapter_names(&BTreeMap::from([(ours.to_string(), t(1, &[2], DType::F32))]));
    let theirs = peft.keys().next().unwrap();
    assert_eq!(theirs, "base_model.model.model.language_model.layers.0.linear_attn.in_proj_qkv.lora_A.weight");
    assert_eq!(our_adapter_name(theirs), ours);
}

#[test]
fn the_text_model_loads_and_a_save_writes_back_what_it_did_not_change_bit_for_bit() {
    let root = tempfile::tempdir().unwrap();
    let src = released(root.path());
    let layout = ReleasedLayout::detect(&src).unwrap().expect("released");
    let text = layout.load_text(DType::F32, &Device::Cpu).unwrap();
    let names: Vec<&str> = text.keys().map(String::as_str).collect();
    assert_eq!(
        names,
        ["lm_head.weight", "model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight", "model.norm.weight"]
    );
    // "Training" changes one weight; the rest are the values loaded (bf16 widened to f32).
    let mut weights = text.clone();
    let q = "model.layers.0.self_attn.q_proj.weight".to_string();
    weights.insert(q.clone(), (&text[&q] + 1.0).unwrap());
    let out_dir = root.path().join("out");
    let mut out = StagedDir::create(&out_dir).unwrap();
    layout.save(&mut out, &weights).unwrap();
    out.commit().unwrap();

    for file in [CONFIG_FILE, INDEX_FILE] {
        assert_eq!(std::fs::read(src.join(file)).unwrap(), std::fs::read(out_dir.join(file)).unwrap(), "{file}");
    }
    let (before, after) = (raw_of(&src), raw_of(&out_dir));
    assert_eq!(before.keys().collect::<Vec<_>>(), after.keys().collect::<Vec<_>>());
    for (name, (dtype, shape, bytes)) in &before {
        let (d, s, b) = &after[name];
        assert_eq!((dtype, shape), (d, s), "{name} keeps its dtype and shape");
        let changed = name == "model.language_model.layers.0.self_attn.q_proj.weight";
        assert_eq!(bytes != b, changed, "{name}: changed {changed}");
    }
    let back = ReleasedLayout::detect(&out_dir).unwrap().unwrap().load_text(DType::F32, &Device::Cpu).unwrap();
    let v = |t: &Tensor| t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
    let stored = weights[&q].to_dtype(DType::BF16).unwrap().to_dtype(DType::F32).unwrap();
    assert_eq!(v(&back[&q]), v(&stored), "the trained weight, rounded to its stored bf16");
}

#[test]
fn a_missing_shard_a_key_no_shard_holds_and_foreign_weights_are_refused_by_name() {
    let root = tempfile::tempdir().unwrap();
    let src = released(root.path());
    let index_path = src.join(INDEX_FILE);
    let index = std::fs::read_to_string(&index_path).unwrap();

    // The index names a tensor its shard does not hold.
    std::fs::write(&index_path, index.replace("\"mtp.fc.weight\"", "\"mtp.norm.weight\"")).unwrap();
    let err = ReleasedLayout::detect(&src).unwrap_err();
    assert!(matches!(&err, CheckpointError::MissingTensor { name, .. } if name == "mtp.norm.weight"), "{err}");
    std::fs::write(&index_path, &index).unwrap();

    // A save whose weights are not the source's text model.
    let layout = ReleasedLayout::detect(&src).unwrap().unwrap();
    let mut text = layout.load_text(DType::F32, &Device::Cpu).unwrap();
    text.insert("model.layers.9.mlp.up_proj.weight".into(), t(7, &[3, 3], DType::F32));
    let mut out = StagedDir::create(&root.path().join("out")).unwrap();
    let err = layout.save(&mut out, &text).unwrap_err().to_string();
    assert!(err.contains("model.layers.9.mlp.up_proj.weight") && err.contains("no tensor"), "{err}");
    text.remove("model.layers.9.mlp.up_proj.weight");
    text.remove("model.norm.weight");
    let err = layout.save(&mut out, &text).unwrap_err().to_string();
    assert!(err.contains("model.language_model.norm.weight") && err.contains("not among the weights"), "{err}");

    // A shard gone.
    std::fs::remove_file(src.join(SHARDS[0])).unwrap();
    let err = ReleasedLayout::detect(&src).unwrap_err();
    assert!(matches!(&err, CheckpointError::MissingShard { shard, .. } if shard == SHARDS[0]), "{err}");
}
