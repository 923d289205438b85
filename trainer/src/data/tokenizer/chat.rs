//! The chat template a tokenizer ships, found where transformers looks for it: a
//! `chat_template.jinja` beside the `tokenizer.json` (transformers saves it there since 4.43,
//! and it wins), else the `chat_template` of `tokenizer_config.json` (a string, or a list of
//! named templates of which `default` is used). The recipe's `model.chat_template` replaces
//! both.

use std::path::{Path, PathBuf};

use minijinja::Value;
use serde_json::Value as JsonValue;

use super::{Inner, Special, TOKENIZER_CONFIG_FILE, Tokenizer};
use crate::data::error::DataError;
use crate::recipe::Model;

pub const CHAT_TEMPLATE_FILE: &str = "chat_template.jinja";

/// A template's text and where it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TemplateSource {
    /// The file, as a path (`DIR/tokenizer_config.json`, `DIR/chat_template.jinja`).
    pub origin: String,
    pub text: String,
    /// Whether it came from a `.jinja` file (written back as one beside trained weights).
    pub from_jinja_file: bool,
}

impl TemplateSource {
    /// The template of the tokenizer at `tokenizer_json`, if its directory has one.
    pub fn beside(tokenizer_json: &Path) -> Result<Option<TemplateSource>, DataError> {
        let jinja = tokenizer_json.with_file_name(CHAT_TEMPLATE_FILE);
        if jinja.is_file() {
            return Self::read(&jinja).map(Some);
        }
        let config = tokenizer_json.with_file_name(TOKENIZER_CONFIG_FILE);
        match std::fs::read(&config) {
            Ok(bytes) => from_config(&bytes, &config),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(source) => Err(DataError::Io { path: config, source }),
        }
    }

    /// A `.jinja` file, or a `tokenizer_config.json` (its `chat_template`).
    pub fn read(path: &Path) -> Result<TemplateSource, DataError> {
        let bytes = std::fs::read(path).map_err(|source| DataError::Io { path: path.to_owned(), source })?;
        if path.extension().is_some_and(|e| e == "json") {
            return from_config(&bytes, path)?.ok_or_else(|| DataError::Template {
                origin: path.display().to_string(),
                message: "has no `chat_template`".into(),
            });
        }
        let text = String::from_utf8(bytes).map_err(|_| DataError::Template {
            origin: path.display().to_string(),
            message: "is not UTF-8 text".into(),
        })?;
        Ok(TemplateSource { origin: path.display().to_string(), text, from_jinja_file: true })
    }
}

fn from_config(bytes: &[u8], path: &Path) -> Result<Option<TemplateSource>, DataError> {
    let bad = |message: String| DataError::Template { origin: path.display().to_string(), message };
    let config: JsonValue = serde_json::from_slice(bytes).map_err(|e| bad(format!("not JSON: {e}")))?;
    let text = match config.get("chat_template") {
        None | Some(JsonValue::Null) => return Ok(None),
        Some(JsonValue::String(s)) => s.clone(),
        Some(JsonValue::Array(named)) => named
            .iter()
            .find(|t| t.get("name").and_then(JsonValue::as_str) == Some("default"))
            .and_then(|t| t.get("template").and_then(JsonValue::as_str))
            .ok_or_else(|| bad("chat_template: a list of named templates without a `default` one".into()))?
            .to_owned(),
        Some(_) => return Err(bad("chat_template: expected a string or a list of named templates".into())),
    };
    Ok(Some(TemplateSource { origin: path.display().to_string(), text, from_jinja_file: false }))
}

impl Tokenizer {
    /// The model's own chat template, if there is one.
    pub fn chat_template(&self) -> Option<&TemplateSource> {
        self.chat_template.as_ref()
    }

    /// `enable_thinking` for the chat template.
    pub fn enable_thinking(&self) -> bool {
        self.enable_thinking
    }

    /// The recipe's `model.chat_template` (a `.jinja` file or a `tokenizer_config.json`,
    /// relative to `base_dir`) and `model.enable_thinking`.
    pub(super) fn apply_model_settings(&mut self, model: &Model, base_dir: &Path) -> Result<(), DataError> {
        if let Some(path) = &model.chat_template {
            let path: PathBuf = base_dir.join(path);
            self.chat_template = Some(TemplateSource::read(&path)?);
        }
        self.enable_thinking = model.enable_thinking;
        Ok(())
    }

    /// The special tokens a template sees as variables, as transformers passes them
    /// (`bos_token`, `eos_token`, ... from `tokenizer_config.json`, when set).
    pub fn template_vars(&self) -> Vec<(String, Value)> {
        let Inner::Hf(hf) = &self.inner else {
            return vec![("eos_token".into(), Value::from(Special::ImEnd.text()))];
        };
        let Some(config) = hf.config.as_deref().and_then(|c| serde_json::from_slice::<JsonValue>(c).ok()) else {
            return Vec::new();
        };
        ["bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token", "mask_token"]
            .into_iter()
            .filter_map(|name| {
                let token = match config.get(name)? {
                    JsonValue::String(s) => s.clone(),
                    JsonValue::Object(o) => o.get("content")?.as_str()?.to_owned(),
                    _ => return None,
                };
                Some((name.to_owned(), Value::from(token)))
            })
            .collect()
    }

    /// The text of every control token (added tokens marked `special`): message text holding
    /// one is refused by a Jinja template.
    pub fn control_tokens(&self) -> Vec<String> {
        match &self.inner {
            Inner::Byte => Special::ALL.iter().filter(|s| s.is_control()).map(|s| s.text().to_owned()).collect(),
            Inner::Hf(hf) => {
                let mut tokens: Vec<String> = hf
                    .with_specials
                    .get_added_tokens_decoder()
                    .values()
                    .filter(|t| t.special)
                    .map(|t| t.content.clone())
                    .collect();
                tokens.sort();
                tokens
            }
        }
    }
}
