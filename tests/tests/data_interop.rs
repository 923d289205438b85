//! Data as users have it: Parquet and Arrow files written by pyarrow and `datasets` load to
//! exactly the examples of the same records as JSONL (a multi-file hub split streams in
//! order); wrong columns, wrong types and corrupt files are errors naming file, row group and
//! column; chat templates render byte for byte as transformers' `apply_chat_template` renders
//! them, with the ids and assistant masks transformers and TRL compute.
//!
//! Needs the CPU torch venv of `scripts/setup-torch` (pyarrow, datasets, transformers). Without
//! it the tests skip, unless MINDXTRAIN_REQUIRE_TORCH is set (CI sets it).

use std::path::{Path, PathBuf};
use std::process::Command;

use mindxtrain_tests::torch_python;
use mindxtrain_trainer::data::template::{encode_pieces, message_json, pieces_to_string};
use mindxtrain_trainer::data::{
    ChatTemplate, Conversation, DataCursor, DataOptions, Dataset, Json, Message, Role, Targets, TaskParams, Tokenizer,
    ToolArguments, ToolCall, generate_jsonl,
};
use mindxtrain_trainer::recipe::{DataFormat, Recipe};
use serde_json::{Value, json};

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("tests/ is inside the repo").to_path_buf()
}

fn python(py: &Path, args: &[&str]) -> String {
    let out = Command::new(py).arg(repo_root().join("tests/python/data_interop.py")).args(args).output().unwrap();
    assert!(out.status.success(), "python failed:\n{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

fn recipe(source: &str, paths: &str, extra: &str) -> Recipe {
    let src = format!(
        "meta: {{project: p, run_name: r, seed: 7}}\nhardware: {{name: cpu, gpus: 0}}\n\
         model:\n  name: tiny\n  tokenizer: byte\n  config: {{hidden_size: 64, num_layers: 2, num_heads: 4, \
         num_kv_heads: 2, head_dim: 16, intermediate_size: 128, vocab_size: 512}}\n\
         data:\n  source: {source}\n  format: chat\n  paths: {paths}\n  seq_len: 192\n  shuffle: false\n{extra}\
         train:\n  method: {{kind: full}}\neval: {{holdout: {{fraction: 0.1}}}}\n"
    );
    Recipe::from_str(&src, "test.yaml").unwrap().recipe
}

fn load(r: &Recipe, dir: &Path) -> Result<Dataset, String> {
    Dataset::from_recipe(r, dir, &Tokenizer::byte(), DataOptions::default()).map_err(|e| e.to_string())
}

/// Same examples in the same order: the same counts, held-out examples and training stream.
fn assert_same(want: &Dataset, got: &Dataset, what: &str) {
    let (a, b) = (&want.manifest, &got.manifest);
    assert_eq!(
        (a.read_examples, a.duplicates_removed, a.train_examples, a.holdout_examples, a.train_tokens),
        (b.read_examples, b.duplicates_removed, b.train_examples, b.holdout_examples, b.train_tokens),
        "{what}"
    );
    for i in 0..want.holdout_len() {
        assert_eq!(want.holdout_example(i).unwrap(), got.holdout_example(i).unwrap(), "{what}: holdout {i}");
    }
    let rows = want.train_rows_per_epoch();
    assert_eq!(rows, got.train_rows_per_epoch(), "{what}");
    let (mut x, mut y) =
        (want.batches(4, DataCursor::default()).unwrap(), got.batches(4, DataCursor::default()).unwrap());
    for step in 0..rows.div_ceil(4) {
        assert_eq!(x.next_batch().unwrap(), y.next_batch().unwrap(), "{what}: batch {step}");
    }
}

#[test]
fn parquet_and_arrow_load_to_the_examples_of_the_same_jsonl() {
    let Some(py) = torch_python() else { return };
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let text = generate_jsonl(&TaskParams { multi_arg_tools: true, ..TaskParams::new(5, 60) }, DataFormat::Chat);
    let lines: Vec<&str> = text.lines().collect();
    std::fs::write(d.join("all.jsonl"), &text).unwrap();
    std::fs::write(d.join("train.jsonl"), lines[..lines.len() - 3].join("\n") + "\n").unwrap();
    let out: Value = serde_json::from_str(&python(
        &py,
        &["tables", "--jsonl", d.join("all.jsonl").to_str().unwrap(), "--out", d.to_str().unwrap()],
    ))
    .unwrap();

    let all = load(&recipe("jsonl", "[all.jsonl]", ""), d).unwrap();
    let train = load(&recipe("jsonl", "[train.jsonl]", ""), d).unwrap();
    // The hub layout: two train shards (row groups of 7 and 5, snappy and zstd) in name order,
    // the test shard left out by `split`.
    let hub = load(&recipe("hf", "[hub]", ""), d).unwrap();
    assert_same(&train, &hub, "hub layout, split train");
    let names: Vec<&str> = hub.manifest.files.iter().map(|f| f.path.as_str()).collect();
    assert_eq!(names, ["hub/data/train-00000-of-00002.parquet", "hub/data/train-00001-of-00002.parquet"]);
    for f in &hub.manifest.files {
        assert_eq!(f.blake3, blake3::hash(&std::fs::read(d.join(&f.path)).unwrap()).to_hex().to_string(), "{}", f.path);
    }
    assert_eq!(hub.manifest.split.as_deref(), Some("train"));
    let test = load(&recipe("hf", "[hub]", "  split: test\n"), d).unwrap();
    assert_eq!(test.manifest.read_examples, 3);

    assert_same(&all, &load(&recipe("hf", "[single.arrow]", ""), d).unwrap(), "Arrow IPC file");
    let saved = load(&recipe("hf", "[saved]", ""), d).unwrap();
    assert_same(&all, &saved, "datasets.save_to_disk");
    assert!(saved.manifest.files[0].path.starts_with("saved/train/data-"), "{:?}", saved.manifest.files);
    let renamed = load(&recipe("hf", "[renamed.parquet]", "  columns: {messages: conversations}\n"), d).unwrap();
    assert_same(&all, &renamed, "a renamed column, mapped");

    let err = load(&recipe("hf", "[renamed.parquet]", ""), d).unwrap_err();
    assert!(
        err.contains("renamed.parquet column `messages`: no such column") && err.contains("conversations"),
        "{err}"
    );
    let err = load(&recipe("hf", "[string_messages.parquet]", ""), d).unwrap_err();
    assert!(err.contains("string_messages.parquet column `messages`: expected lists"), "{err}");
    let err = load(&recipe("hf", "[int_messages.parquet]", ""), d).unwrap_err();
    assert!(err.contains("int_messages.parquet row group 0 column `messages` row 0: messages[0]"), "{err}");
    let group = out["corrupt_row_group"].as_u64().unwrap();
    let err = load(&recipe("hf", "[corrupt.parquet]", ""), d).unwrap_err();
    assert!(err.contains(&format!("corrupt.parquet row group {group} column `messages`: corrupt")), "{err}");
}

fn msg(role: Role, content: &str) -> Message {
    Message::new(role, content)
}

fn conversations() -> Vec<Conversation> {
    let tool = Json::parse(
        r#"{"type": "function", "function": {"name": "get_weather", "description": "Weather now, é",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            "required": ["city"]}}}"#,
    )
    .unwrap();
    let mut call = msg(Role::Assistant, "");
    call.tool_calls = vec![ToolCall {
        name: "get_weather".into(),
        arguments: ToolArguments::Json(Json::parse(r#"{"city": "Oslo", "days": 2, "units": 1.5}"#).unwrap()),
    }];
    let mut reasoning = msg(Role::Assistant, "It is 3 degrees.");
    reasoning.reasoning = Some("The tool said 3.".into());
    vec![
        Conversation { messages: vec![msg(Role::User, "What is 2 + 3?"), msg(Role::Assistant, "5")], tools: vec![] },
        Conversation {
            messages: vec![
                msg(Role::System, "Be brief."),
                msg(Role::User, "  Weather in Oslo?"),
                call,
                msg(Role::Tool, r#"{"temp": 3}"#),
                reasoning,
            ],
            tools: vec![tool.clone()],
        },
        Conversation {
            messages: vec![
                msg(Role::User, "Q1"),
                msg(Role::Assistant, "A1"),
                msg(Role::User, "Q2 ünïcode"),
                msg(Role::Assistant, "A2"),
            ],
            tools: vec![tool],
        },
    ]
}

#[test]
fn templates_render_and_mask_like_transformers() {
    let Some(py) = torch_python() else { return };
    let dir = tempfile::tempdir().unwrap();
    let tok_dir = dir.path().join("tok");
    std::fs::create_dir_all(&tok_dir).unwrap();
    for (name, bytes) in Tokenizer::byte().hf_files(512) {
        std::fs::write(tok_dir.join(name), bytes).unwrap();
    }
    let tokenizer = Tokenizer::from_file(&tok_dir.join("tokenizer.json")).unwrap();
    let mut cases = Vec::new();
    let mut ours = Vec::new();
    for name in ["qwen3.jinja", "generation.jinja", "plain.jinja"] {
        let path = repo_root().join("tests/fixtures/chat_templates").join(name);
        let template = ChatTemplate::from_file(&path, &tokenizer).unwrap();
        for conv in conversations() {
            for with_tools in [false, true] {
                let tools = if with_tools { conv.tools.clone() } else { vec![] };
                let conv = Conversation { messages: conv.messages.clone(), tools: tools.clone() };
                for add_generation_prompt in [false, true] {
                    let (pieces, masked) = if add_generation_prompt {
                        (template.try_generation_prompt(&conv.messages, &tools).unwrap(), false)
                    } else {
                        (template.render(&conv, Targets::AssistantFrom(0)).unwrap().pieces, true)
                    };
                    let enc = encode_pieces(&tokenizer, &pieces).unwrap();
                    ours.push((name, pieces_to_string(&pieces), enc, masked));
                    // Written from our Json (keys in their order): a serde_json::Value sorts
                    // keys, and templates print tools and arguments in the order given.
                    let messages: Vec<Json> = conv.messages.iter().map(message_json).collect();
                    let tools = if with_tools { serde_json::to_string(&tools).unwrap() } else { "null".into() };
                    cases.push(format!(
                        r#"{{"template": {}, "tokenizer_dir": {}, "messages": {}, "tools": {tools},
                            "add_generation_prompt": {add_generation_prompt}, "enable_thinking": false}}"#,
                        json!(path),
                        json!(tok_dir),
                        serde_json::to_string(&messages).unwrap(),
                    ));
                }
            }
        }
    }
    let cases_path = dir.path().join("cases.json");
    std::fs::write(&cases_path, format!("[{}]", cases.join(",\n"))).unwrap();
    let out_path = dir.path().join("out.json");
    python(&py, &["render", "--cases", cases_path.to_str().unwrap(), "--out", out_path.to_str().unwrap()]);
    let theirs: Vec<Value> = serde_json::from_slice(&std::fs::read(&out_path).unwrap()).unwrap();
    assert_eq!(theirs.len(), ours.len());
    let mut learned_somewhere = 0;
    for (i, ((name, text, enc, masked), t)) in ours.iter().zip(&theirs).enumerate() {
        assert_eq!(text, t["text"].as_str().unwrap(), "{name} case {i}");
        let ids: Vec<u32> = serde_json::from_value(t["ids"].clone()).unwrap();
        assert_eq!(enc.ids, ids, "{name} case {i}");
        if *masked {
            let mask: Vec<bool> = t["mask"].as_array().unwrap().iter().map(|m| m.as_i64() == Some(1)).collect();
            assert_eq!(enc.targets, mask, "{name} case {i}: {text:?}");
            learned_somewhere += usize::from(mask.iter().any(|m| *m));
        }
    }
    assert!(learned_somewhere >= 15, "masks must not be trivially empty ({learned_somewhere})");
}
