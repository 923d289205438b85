//! The dataset manifest: what went into a run's data, precisely enough to check it later.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::jsonl::{FileDigest, SkippedLine};
use super::near_dedupe::NearDedupeParams;
use super::template::TemplateInfo;
use crate::hub::HubSource;
use crate::recipe::{DataFormat, DataSource, GeneratorKind};

/// Bumped when a field's meaning changes.
pub const MANIFEST_VERSION: u32 = 2;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DatasetManifest {
    pub version: u32,
    pub source: DataSource,
    pub format: DataFormat,
    /// Every input with its BLAKE3; a generated corpus appears as `generated:<kind>` with the
    /// digest of the JSONL it generated.
    pub files: Vec<FileDigest>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generator: Option<GeneratorInfo>,
    /// The split that picked the files of directories (`hf` source).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub split: Option<String>,
    /// `data.hf_id`: the hub dataset the files are, read from its snapshot in the Hugging Face
    /// cache or (with `data.paths`) a local copy of it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hf_id: Option<String>,
    /// The revision asked for: `data.revision`, `main` when the cache was read without one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<String>,
    /// The commit the revision resolved to in the cache (unknown for a local copy).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub commit: Option<String>,
    /// `data.columns`: record field → table column, where a column has another name.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub columns: BTreeMap<String, String>,
    /// `byte-v1` or the BLAKE3 of the `tokenizer.json`.
    pub tokenizer: String,
    /// The chat template the conversations were rendered with (its source and BLAKE3).
    pub template: TemplateInfo,
    pub seq_len: u32,
    pub packing: bool,
    /// Records parsed from the inputs, before anything was removed.
    pub read_examples: u64,
    pub skipped_lines: u64,
    /// The first skipped lines, with the reason for each.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub skipped: Vec<SkippedLine>,
    pub duplicates_removed: u64,
    /// Examples dropped as near duplicates of an earlier kept one (`data.dedupe.near_threshold`);
    /// absent when near dedupe is off, so the manifests of runs without it stay as they were.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub near_duplicates_removed: Option<u64>,
    /// How near duplicates were found (threshold, shingles, bands × rows).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub near_dedupe: Option<NearDedupeParams>,
    /// Examples beyond `data.max_samples`.
    pub over_max_samples: u64,
    pub train_examples: u64,
    pub holdout_examples: u64,
    /// Examples that left nothing to learn within `seq_len` (e.g. a prompt longer than the row).
    pub dropped_no_target: u64,
    /// Assistant turns a template without `{% generation %}` renders differently once later
    /// messages follow, so they could not be located and were not learned.
    pub unlocated_turns: u64,
    /// Examples longer than `seq_len`, cut at the end.
    pub truncated: u64,
    /// Tokens of the training documents after cutting, and how many of them carry a label.
    pub train_tokens: u64,
    pub train_target_tokens: u64,
    pub holdout_tokens: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GeneratorInfo {
    pub kind: GeneratorKind,
    pub seed: u64,
    pub count: u32,
    pub version: u32,
    pub multi_arg_tools: bool,
    /// `data.generator.families` (every family when empty).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub families: Vec<crate::data::TaskFamily>,
}

impl DatasetManifest {
    /// BLAKE3 (hex) of the manifest's JSON: one value that pins the whole dataset.
    pub fn digest(&self) -> String {
        let bytes = serde_json::to_vec(self).unwrap_or_default();
        blake3::hash(&bytes).to_hex().to_string()
    }

    /// The hub snapshot the data was read from, when it was found in the cache.
    pub fn hub_source(&self) -> Option<HubSource> {
        Some(HubSource { repo: self.hf_id.clone()?, revision: self.revision.clone()?, commit: self.commit.clone()? })
    }

    /// The manifest with its digest, as written beside a run.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({"manifest": self, "blake3": self.digest()})
    }
}
