//! A Hugging Face hub cache as huggingface_hub writes it, for runs that name their model and data
//! by hub id and must find them without a network: `<root>/models--owner--name/` (and
//! `datasets--owner--name/`) with `refs/<branch or tag>` holding a commit id, `snapshots/<commit>/`
//! holding each file as a relative link into `blobs/<sha256 of the file>`.
//!
//! [`HubFixture::add_model`] puts a tiny Qwen3 there (seeded random weights saved by the
//! checkpoint module, `config.json`, and the byte tokenizer as HF files with its chat template),
//! [`HubFixture::add_chat_dataset`] a tiny chat dataset as Parquet in the hub's file layout
//! (`data/<split>-00000-of-00001.parquet`, and a `test` split beside it). Point `HF_HUB_CACHE`
//! at [`HubFixture::root`] and a recipe naming `model.name: owner/name` and `data.hf_id` runs.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result};
use arrow_array::builder::{ListBuilder, StringBuilder, StructBuilder};
use arrow_array::{ArrayRef, RecordBatch};
use arrow_schema::{DataType, Field, Fields};
use candle_core::{DType, Device};
use mindxtrain_trainer::checkpoint::{self, StagedDir};
use mindxtrain_trainer::data::Tokenizer;
use mindxtrain_trainer::model::{CausalLm, LmConfig};
use sha2::{Digest, Sha256};

/// The kind of hub repository, as the cache names its folders.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Model,
    Dataset,
}

impl Kind {
    fn folder_prefix(self) -> &'static str {
        match self {
            Kind::Model => "models",
            Kind::Dataset => "datasets",
        }
    }
}

/// A hub cache directory being filled.
pub struct HubFixture {
    root: PathBuf,
}

/// A commit id (40 hex digits) named after `label`, stable across runs.
pub fn commit_id(label: &str) -> String {
    blake3::hash(label.as_bytes()).to_hex()[..40].to_string()
}

/// The shape of the tiny model: a micro Qwen3 the byte tokenizer fits (vocabulary 512) and that
/// trains a step in milliseconds, with room for the shipped recipes' lengths (`seq_len` 4096,
/// `serve.max_model_len` 8192).
pub fn tiny_config() -> LmConfig {
    LmConfig {
        arch: mindxtrain_trainer::model::Arch::Qwen3,
        vocab_size: 512,
        hidden_size: 32,
        intermediate_size: 64,
        num_hidden_layers: 1,
        num_attention_heads: 2,
        num_key_value_heads: 1,
        head_dim: 16,
        rms_norm_eps: 1e-6,
        rope_theta: 1_000_000.0,
        tie_word_embeddings: true,
        max_position_embeddings: 8192,
        moe: None,
        hybrid: None,
    }
}

/// The files of an HF model directory holding `config` with weights drawn from `seed`:
/// `config.json`, the safetensors weights, and `tokenizer.json` with `tokenizer_config.json`
/// carrying the chat template (the byte tokenizer, as `mindxtrain export` writes it).
pub fn model_files(config: &LmConfig, seed: u64) -> Result<Vec<(String, Vec<u8>)>> {
    let staging = tempfile::tempdir()?;
    let dir = staging.path().join("model");
    let model = CausalLm::init_random(config, seed, DType::F32, &Device::Cpu)?;
    let mut staged = StagedDir::create(&dir)?;
    let json: serde_json::Value = serde_json::from_str(&config.to_hf_json("float32"))?;
    checkpoint::save_hf_model(&mut staged, &json, model.params(), DType::F32, checkpoint::DEFAULT_MAX_SHARD_BYTES)?;
    for (name, bytes) in Tokenizer::byte().hf_files(config.max_position_embeddings) {
        staged.write_file(name, &bytes)?;
    }
    let written = staged.commit()?;
    written
        .iter()
        .map(|f| Ok((f.path.clone(), std::fs::read(dir.join(&f.path)).with_context(|| f.path.clone())?)))
        .collect()
}

/// `rows` chat conversations as one Parquet file with a `messages` column (a list of
/// `{role, content}` structs), as the hub's chat datasets have it. Conversation `i` asks for
/// a word of `tag` and `i` and answers it, so two datasets of other tags hold other examples.
pub fn chat_parquet(tag: &str, rows: usize) -> Result<Vec<u8>> {
    let fields =
        Fields::from(vec![Field::new("role", DataType::Utf8, false), Field::new("content", DataType::Utf8, false)]);
    let mut messages = ListBuilder::new(StructBuilder::from_fields(fields.clone(), rows * 2)).with_field(Field::new(
        "item",
        DataType::Struct(fields),
        false,
    ));
    for i in 0..rows {
        let word = format!("{tag}{i}");
        for (role, content) in [("user", format!("Repeat the word {word}.")), ("assistant", word.clone())] {
            let item = messages.values();
            item.field_builder::<StringBuilder>(0).context("role column")?.append_value(role);
            item.field_builder::<StringBuilder>(1).context("content column")?.append_value(content);
            item.append(true);
        }
        messages.append(true);
    }
    let column: ArrayRef = Arc::new(messages.finish());
    let batch = RecordBatch::try_from_iter([("messages", column)])?;
    let mut bytes = Vec::new();
    let mut writer = parquet::arrow::ArrowWriter::try_new(&mut bytes, batch.schema(), None)?;
    writer.write(&batch)?;
    writer.close()?;
    Ok(bytes)
}

impl HubFixture {
    /// A cache at `root` (created when missing).
    pub fn new(root: &Path) -> Result<HubFixture> {
        std::fs::create_dir_all(root)?;
        Ok(HubFixture { root: root.to_path_buf() })
    }

    /// The directory to give as `HF_HUB_CACHE`.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// `<root>/<kind>s--owner--name`.
    pub fn repo_dir(&self, kind: Kind, repo: &str) -> PathBuf {
        self.root.join(format!("{}--{}", kind.folder_prefix(), repo.replace('/', "--")))
    }

    /// Writes `files` (paths inside the repository, `/`-separated) as the snapshot `commit` of
    /// `repo`: each file's bytes once in `blobs/<sha256>`, and a relative link to it under
    /// `snapshots/<commit>/`; then points each of `refs` (branches, tags) at `commit`. Returns
    /// the snapshot directory.
    pub fn add_snapshot(
        &self,
        kind: Kind,
        repo: &str,
        commit: &str,
        refs: &[&str],
        files: &[(String, Vec<u8>)],
    ) -> Result<PathBuf> {
        let repo_dir = self.repo_dir(kind, repo);
        let blobs = repo_dir.join("blobs");
        let snapshot = repo_dir.join("snapshots").join(commit);
        std::fs::create_dir_all(&blobs)?;
        for (name, bytes) in files {
            let etag = hex::encode(Sha256::digest(bytes));
            let blob = blobs.join(&etag);
            if !blob.exists() {
                std::fs::write(&blob, bytes)?;
            }
            let link = snapshot.join(name);
            let parent = link.parent().context("a file inside the snapshot")?;
            std::fs::create_dir_all(parent)?;
            // As huggingface_hub links them: relative, so the cache can move as a whole.
            let depth = name.split('/').count() + 1;
            let target = format!("{}blobs/{etag}", "../".repeat(depth));
            std::os::unix::fs::symlink(&target, &link).with_context(|| link.display().to_string())?;
        }
        for r in refs {
            let path = repo_dir.join("refs").join(r);
            std::fs::create_dir_all(path.parent().context("refs/")?)?;
            std::fs::write(&path, commit)?;
        }
        Ok(snapshot)
    }

    /// The tiny model of `config` with weights from `seed` as the snapshot `commit` of `repo`.
    pub fn add_model(&self, repo: &str, commit: &str, refs: &[&str], config: &LmConfig, seed: u64) -> Result<PathBuf> {
        self.add_snapshot(Kind::Model, repo, commit, refs, &model_files(config, seed)?)
    }

    /// A chat dataset of `rows` conversations in split `split` (and 4 in a `test` split) as the
    /// snapshot `commit` of `repo`, in the hub's layout (`data/<split>-00000-of-00001.parquet`).
    pub fn add_chat_dataset(
        &self,
        repo: &str,
        commit: &str,
        refs: &[&str],
        split: &str,
        rows: usize,
    ) -> Result<PathBuf> {
        let files = [
            (format!("data/{split}-00000-of-00001.parquet"), chat_parquet(split, rows)?),
            ("data/test-00000-of-00001.parquet".to_string(), chat_parquet("test", 4)?),
            ("README.md".to_string(), format!("# {repo}\n\nA tiny chat dataset for tests.\n").into_bytes()),
        ];
        self.add_snapshot(Kind::Dataset, repo, commit, refs, &files)
    }
}

/// gsm8k-shaped documents (question, reference answer ending in `#### N`): the test split, then
/// the train split few-shot examples come from.
pub const GSM8K_TEST: [(&str, &str); 3] = [
    ("Tom has 3 apples and buys 4 more. How many apples does he have?", "3 + 4 = 7\n#### 7"),
    ("What is 10 minus 4?", "10 - 4 = 6\n#### 6"),
    ("A box holds 1,000 pins. How many pins are in 2 boxes?", "2 * 1000 = 2000\n#### 2,000"),
];
pub const GSM8K_TRAIN: [(&str, &str); 2] =
    [("What is 1 + 1?", "1 + 1 = 2\n#### 2"), ("What is 2 + 2?", "2 + 2 = 4\n#### 4")];

/// MMLU-shaped documents of one subject (question, four choices, the right one's index): the
/// test split, then the dev split few-shot examples come from.
pub const MMLU_SUBJECT: &str = "high_school_biology";
pub const MMLU_TEST: [(&str, [&str; 4], i64); 4] = [
    ("What colour is grass?", ["red", "green", "blue", "black"], 1),
    ("Which organ pumps blood?", ["heart", "lung", "skin", "bone"], 0),
    ("What do plants need to grow?", ["salt", "noise", "light", "plastic"], 2),
    ("How many legs has a spider?", ["two", "four", "six", "eight"], 3),
];
pub const MMLU_DEV: [(&str, [&str; 4], i64); 1] = [("Blood is?", ["red", "green", "blue", "black"], 0)];

/// One Parquet file of `columns`.
pub fn table_parquet(columns: Vec<(&str, ArrayRef)>) -> Result<Vec<u8>> {
    let batch = RecordBatch::try_from_iter(columns)?;
    let mut bytes = Vec::new();
    let mut writer = parquet::arrow::ArrowWriter::try_new(&mut bytes, batch.schema(), None)?;
    writer.write(&batch)?;
    writer.close()?;
    Ok(bytes)
}

fn strings<'a>(values: impl IntoIterator<Item = &'a str>) -> ArrayRef {
    Arc::new(arrow_array::StringArray::from_iter_values(values))
}

fn gsm8k_parquet(rows: &[(&str, &str)]) -> Result<Vec<u8>> {
    table_parquet(vec![("question", strings(rows.iter().map(|r| r.0))), ("answer", strings(rows.iter().map(|r| r.1)))])
}

fn mmlu_parquet(rows: &[(&str, [&str; 4], i64)]) -> Result<Vec<u8>> {
    let mut choices = ListBuilder::new(StringBuilder::new());
    for (_, c, _) in rows {
        for v in c {
            choices.values().append_value(v);
        }
        choices.append(true);
    }
    table_parquet(vec![
        ("question", strings(rows.iter().map(|r| r.0))),
        ("subject", strings(rows.iter().map(|_| MMLU_SUBJECT))),
        ("choices", Arc::new(choices.finish()) as ArrayRef),
        ("answer", Arc::new(arrow_array::Int64Array::from_iter_values(rows.iter().map(|r| r.2))) as ArrayRef),
    ])
}

impl HubFixture {
    /// The gsm8k- and MMLU-shaped data above as `openai/gsm8k` (configuration `main`) and
    /// `cais/mmlu` (configuration `all`), as the hub lays them out, on `main`; returns the
    /// snapshot directories.
    pub fn add_task_datasets(&self) -> Result<(PathBuf, PathBuf)> {
        let gsm8k = self.add_snapshot(
            Kind::Dataset,
            "openai/gsm8k",
            &commit_id("gsm8k"),
            &["main"],
            &[
                ("main/test-00000-of-00001.parquet".into(), gsm8k_parquet(&GSM8K_TEST)?),
                ("main/train-00000-of-00001.parquet".into(), gsm8k_parquet(&GSM8K_TRAIN)?),
            ],
        )?;
        let mmlu = self.add_snapshot(
            Kind::Dataset,
            "cais/mmlu",
            &commit_id("mmlu"),
            &["main"],
            &[
                ("all/test-00000-of-00001.parquet".into(), mmlu_parquet(&MMLU_TEST)?),
                ("all/dev-00000-of-00001.parquet".into(), mmlu_parquet(&MMLU_DEV)?),
            ],
        )?;
        Ok((gsm8k, mmlu))
    }
}
