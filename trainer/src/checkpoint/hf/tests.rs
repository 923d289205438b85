use super::*;

fn weights() -> BTreeMap<String, Tensor> {
    let t = |v: Vec<f32>, shape: &[usize]| Tensor::from_vec(v, shape, &Device::Cpu).unwrap();
    BTreeMap::from([
        ("model.embed_tokens.weight".to_string(), t((0..12).map(|i| i as f32 * 0.25).collect(), &[4, 3])),
        ("model.layers.0.self_attn.q_proj.weight".to_string(), t((0..9).map(|i| -(i as f32)).collect(), &[3, 3])),
        ("model.norm.weight".to_string(), t(vec![1.0, 0.5, 2.0], &[3])),
    ])
}

fn config() -> serde_json::Value {
    serde_json::json!({"model_type": "qwen3", "hidden_size": 3, "vocab_size": 4})
}

fn save(root: &Path, name: &str, max_shard: u64, dtype: DType) -> (PathBuf, Vec<super::super::FileDigest>) {
    let target = root.join(name);
    let mut dir = StagedDir::create(&target).unwrap();
    save_hf_model(&mut dir, &config(), &weights(), dtype, max_shard).unwrap();
    (target, dir.commit().unwrap())
}

fn values(t: &Tensor) -> Vec<f32> {
    t.to_dtype(DType::F32).unwrap().flatten_all().unwrap().to_vec1().unwrap()
}

#[test]
fn single_file_round_trip() {
    let root = tempfile::tempdir().unwrap();
    let (dir, files) = save(root.path(), "m", DEFAULT_MAX_SHARD_BYTES, DType::F32);
    assert_eq!(files.iter().map(|f| f.path.as_str()).collect::<Vec<_>>(), [CONFIG_FILE, SINGLE_FILE]);
    let loaded = load_hf_weights(&dir, DType::F32, &Device::Cpu).unwrap();
    assert_eq!(loaded.keys().collect::<Vec<_>>(), weights().keys().collect::<Vec<_>>());
    for (name, t) in weights() {
        assert_eq!(loaded[&name].dims(), t.dims());
        assert_eq!(values(&loaded[&name]), values(&t), "{name}");
    }
    let cfg: serde_json::Value = serde_json::from_slice(&std::fs::read(dir.join(CONFIG_FILE)).unwrap()).unwrap();
    assert_eq!(cfg, config());
}

#[test]
fn sharded_round_trip_with_hf_index() {
    let root = tempfile::tempdir().unwrap();
    // 12 + 9 + 3 floats = 48 + 36 + 12 bytes; a 40-byte limit gives three shards.
    let (dir, files) = save(root.path(), "m", 40, DType::F32);
    let names: Vec<_> = files.iter().map(|f| f.path.as_str()).collect();
    assert_eq!(
        names,
        [
            CONFIG_FILE,
            "model-00001-of-00003.safetensors",
            "model-00002-of-00003.safetensors",
            "model-00003-of-00003.safetensors",
            INDEX_FILE
        ]
    );
    let index: serde_json::Value = serde_json::from_slice(&std::fs::read(dir.join(INDEX_FILE)).unwrap()).unwrap();
    assert_eq!(index["metadata"]["total_size"], 96);
    assert_eq!(index["weight_map"]["model.norm.weight"], "model-00003-of-00003.safetensors");
    let files = WeightFiles::open(&dir).unwrap();
    assert_eq!(files.files().len(), 3);
    let loaded = files.load(DType::F32, &Device::Cpu).unwrap();
    assert_eq!(
        values(&loaded["model.layers.0.self_attn.q_proj.weight"]),
        values(&weights()["model.layers.0.self_attn.q_proj.weight"])
    );
}

#[test]
fn bf16_files_convert_to_the_requested_dtype() {
    let root = tempfile::tempdir().unwrap();
    let (dir, _) = save(root.path(), "m", DEFAULT_MAX_SHARD_BYTES, DType::BF16);
    let f32s = load_hf_weights(&dir, DType::F32, &Device::Cpu).unwrap();
    assert!(f32s.values().all(|t| t.dtype() == DType::F32));
    // Multiples of 0.25 below 4 and small integers are exact in bf16.
    assert_eq!(values(&f32s["model.embed_tokens.weight"]), values(&weights()["model.embed_tokens.weight"]));
    let f16s = load_hf_weights(&dir, DType::F16, &Device::Cpu).unwrap();
    assert!(f16s.values().all(|t| t.dtype() == DType::F16));
}

#[test]
fn identical_weights_give_identical_digests() {
    let root = tempfile::tempdir().unwrap();
    let (_, a) = save(root.path(), "a", 40, DType::BF16);
    let (_, b) = save(root.path(), "b", 40, DType::BF16);
    assert_eq!(a, b);
}

#[test]
fn expected_shapes_are_checked() {
    let root = tempfile::tempdir().unwrap();
    let (dir, _) = save(root.path(), "m", 40, DType::F32);
    let files = WeightFiles::open(&dir).unwrap();
    let mut expected: BTreeMap<String, Vec<usize>> =
        weights().iter().map(|(n, t)| (n.clone(), t.dims().to_vec())).collect();
    assert_eq!(files.load_expected(&expected, DType::F32, &Device::Cpu).unwrap().len(), 3);

    expected.insert("model.norm.weight".into(), vec![4]);
    match files.load_expected(&expected, DType::F32, &Device::Cpu) {
        Err(CheckpointError::ShapeMismatch { name, file, expected, found }) => {
            assert_eq!(name, "model.norm.weight");
            assert!(file.ends_with("model-00003-of-00003.safetensors"));
            assert_eq!((expected, found), (vec![4], vec![3]));
        }
        other => panic!("{other:?}"),
    }
    expected.insert("model.norm.weight".into(), vec![3]);
    expected.insert("lm_head.weight".into(), vec![4, 3]);
    match files.load_expected(&expected, DType::F32, &Device::Cpu) {
        Err(CheckpointError::MissingTensor { name, file }) => {
            assert_eq!(name, "lm_head.weight");
            assert!(file.ends_with(INDEX_FILE));
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn broken_directories_give_named_errors() {
    let root = tempfile::tempdir().unwrap();
    assert!(matches!(WeightFiles::open(root.path()), Err(CheckpointError::NoWeights { .. })));

    let (dir, _) = save(root.path(), "m", 40, DType::F32);
    std::fs::remove_file(dir.join("model-00002-of-00003.safetensors")).unwrap();
    match WeightFiles::open(&dir) {
        Err(e @ CheckpointError::MissingShard { .. }) => {
            let msg = e.to_string();
            assert!(msg.contains("model-00002-of-00003.safetensors") && msg.contains(INDEX_FILE), "{msg}");
        }
        other => panic!("{other:?}"),
    }

    for bad in [
        &b"{not json"[..],
        br#"{"weight_map": {}}"#,
        br#"{"weight_map": {"a": "../x.safetensors"}}"#,
        br#"{"metadata": {}}"#,
    ] {
        std::fs::write(dir.join(INDEX_FILE), bad).unwrap();
        assert!(
            matches!(WeightFiles::open(&dir), Err(CheckpointError::BadIndex { .. })),
            "{}",
            String::from_utf8_lossy(bad)
        );
    }

    // The index names a tensor its shard does not hold.
    let (dir, _) = save(root.path(), "n", 40, DType::F32);
    let mut index: serde_json::Value = serde_json::from_slice(&std::fs::read(dir.join(INDEX_FILE)).unwrap()).unwrap();
    index["weight_map"]["model.ghost.weight"] = "model-00001-of-00003.safetensors".into();
    std::fs::write(dir.join(INDEX_FILE), index.to_string()).unwrap();
    match load_hf_weights(&dir, DType::F32, &Device::Cpu) {
        Err(CheckpointError::MissingTensor { name, file }) => {
            assert_eq!(name, "model.ghost.weight");
            assert!(file.ends_with("model-00001-of-00003.safetensors"));
        }
        other => panic!("{other:?}"),
    }

    let single = root.path().join("s");
    std::fs::create_dir(&single).unwrap();
    std::fs::write(single.join(SINGLE_FILE), b"\xff\xff\xff\xff\xff\xff\xff\x00garbage").unwrap();
    assert!(matches!(WeightFiles::open(&single), Err(CheckpointError::BadSafetensors { .. })));
}

#[test]
fn integer_tensors_are_refused_as_weights() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("i");
    let mut staged = StagedDir::create(&dir).unwrap();
    let ints = BTreeMap::from([("model.norm.weight".to_string(), Tensor::new(&[1i64, 2], &Device::Cpu).unwrap())]);
    let list: Vec<(&str, &Tensor)> = ints.iter().map(|(k, v)| (k.as_str(), v)).collect();
    staged.write_with(SINGLE_FILE, |w| write_safetensors(w, &list, None, &pt_metadata()).map(|_| ())).unwrap();
    staged.commit().unwrap();
    assert!(matches!(load_hf_weights(&dir, DType::F32, &Device::Cpu), Err(CheckpointError::UnsupportedDtype { .. })));
}
