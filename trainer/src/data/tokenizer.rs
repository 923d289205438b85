//! One tokenizer type over two implementations: the built-in byte tokenizer (for the tiny
//! from-scratch models: no file, no download) and a Hugging Face `tokenizer.json`.
//!
//! Both know Qwen3's special tokens by name. They fall into two kinds, as in Qwen3's own
//! tokenizer: *control* tokens (`<|endoftext|>`, `<|im_start|>`, `<|im_end|>`, pad) that only
//! the chat template emits, and *markup* tokens (`<think>`, `<tool_call>`, ...) that are
//! ordinary text the model writes. [`Tokenizer::encode`] recognises markup but keeps control
//! strings as literal text, so a user message that contains `<|im_end|>` cannot end its turn
//! early; [`Tokenizer::encode_with_specials`] recognises both.

mod byte;
mod chat;
mod hf_files;

use std::path::{Path, PathBuf};

use super::error::DataError;
use crate::recipe::Model;

pub use byte::BYTE_VOCAB_SIZE;
pub use chat::{CHAT_TEMPLATE_FILE, TemplateSource};
pub use hf_files::{TOKENIZER_CONFIG_FILE, TOKENIZER_FILE, byte_level_alphabet};

/// Qwen3's special tokens, by role.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Special {
    EndOfText,
    ImStart,
    ImEnd,
    Pad,
    ToolCallStart,
    ToolCallEnd,
    ThinkStart,
    ThinkEnd,
    ToolResponseStart,
    ToolResponseEnd,
}

impl Special {
    pub const ALL: [Special; 10] = [
        Special::EndOfText,
        Special::ImStart,
        Special::ImEnd,
        Special::Pad,
        Special::ToolCallStart,
        Special::ToolCallEnd,
        Special::ThinkStart,
        Special::ThinkEnd,
        Special::ToolResponseStart,
        Special::ToolResponseEnd,
    ];

    pub const fn text(self) -> &'static str {
        match self {
            Special::EndOfText => "<|endoftext|>",
            Special::ImStart => "<|im_start|>",
            Special::ImEnd => "<|im_end|>",
            Special::Pad => "<|pad|>",
            Special::ToolCallStart => "<tool_call>",
            Special::ToolCallEnd => "</tool_call>",
            Special::ThinkStart => "<think>",
            Special::ThinkEnd => "</think>",
            Special::ToolResponseStart => "<tool_response>",
            Special::ToolResponseEnd => "</tool_response>",
        }
    }

    /// Control tokens structure the conversation and are never produced from message text.
    pub const fn is_control(self) -> bool {
        matches!(self, Special::EndOfText | Special::ImStart | Special::ImEnd | Special::Pad)
    }
}

/// Each token's byte range `(start, end)` in the text it was encoded from.
pub type Offsets = Vec<(usize, usize)>;

#[derive(Debug, Clone)]
pub struct Tokenizer {
    inner: Inner,
    identity: String,
    /// The model's own chat template, when it ships one (or the recipe names one).
    chat_template: Option<TemplateSource>,
    /// `enable_thinking` for the chat template (the recipe's `model.enable_thinking`).
    enable_thinking: bool,
}

#[derive(Debug, Clone)]
enum Inner {
    Byte,
    Hf(Box<HfTokenizer>),
}

#[derive(Debug, Clone)]
struct HfTokenizer {
    /// Control specials are matched as text (`encode_special_tokens = true`).
    literal: tokenizers::Tokenizer,
    with_specials: tokenizers::Tokenizer,
    specials: Vec<(Special, u32)>,
    vocab_size: usize,
    origin: String,
    /// The `tokenizer.json` as read, and the `tokenizer_config.json` found beside it.
    json: std::sync::Arc<[u8]>,
    config: Option<std::sync::Arc<[u8]>>,
}

impl Tokenizer {
    /// The built-in byte tokenizer: ids 0..=255 are bytes, then Qwen3's specials.
    pub fn byte() -> Tokenizer {
        Tokenizer { inner: Inner::Byte, identity: "byte-v1".into(), chat_template: None, enable_thinking: false }
    }

    /// Reads a Hugging Face `tokenizer.json` (and the `tokenizer_config.json` beside it,
    /// kept for [`Tokenizer::hf_files`]).
    pub fn from_file(path: &Path) -> Result<Tokenizer, DataError> {
        let bytes = std::fs::read(path).map_err(|source| DataError::Io { path: path.to_owned(), source })?;
        let mut tokenizer = Self::from_json_bytes(&bytes, &path.display().to_string())?;
        let config = path.with_file_name(TOKENIZER_CONFIG_FILE);
        if let (Inner::Hf(hf), Ok(bytes)) = (&mut tokenizer.inner, std::fs::read(&config)) {
            hf.config = Some(bytes.into());
        }
        tokenizer.chat_template = TemplateSource::beside(path)?;
        Ok(tokenizer)
    }

    /// Parses the contents of a `tokenizer.json`; `origin` names it in errors.
    pub fn from_json_bytes(bytes: &[u8], origin: &str) -> Result<Tokenizer, DataError> {
        let err = |message: String| DataError::Tokenizer { origin: origin.to_owned(), message };
        let with_specials = tokenizers::Tokenizer::from_bytes(bytes).map_err(|e| err(e.to_string()))?;
        let mut literal = with_specials.clone();
        literal.set_encode_special_tokens(true);
        let specials: Vec<(Special, u32)> =
            Special::ALL.iter().filter_map(|&s| with_specials.token_to_id(s.text()).map(|id| (s, id))).collect();
        // `<|endoftext|>` ends every document (Qwen3's and GPT-NeoX's vocabularies, Instella's
        // among them); ChatML's turn markers are needed only by the built-in template, which
        // says so when a tokenizer without them meets it.
        if !specials.iter().any(|(s, _)| *s == Special::EndOfText) {
            return Err(err(format!("has no `{}` token to end documents with", Special::EndOfText.text())));
        }
        let vocab_size = with_specials.get_vocab(true).values().copied().max().map_or(0, |m| m as usize + 1);
        let identity = format!("hf-blake3:{}", blake3::hash(bytes).to_hex());
        let hf = HfTokenizer {
            literal,
            with_specials,
            specials,
            vocab_size,
            origin: origin.to_owned(),
            json: bytes.into(),
            config: None,
        };
        Ok(Tokenizer { inner: Inner::Hf(Box::new(hf)), identity, chat_template: None, enable_thinking: false })
    }

    /// The tokenizer a recipe names: `byte`, a `tokenizer.json` path (or a directory holding
    /// one), relative to `recipe_dir`; or, unset, the `tokenizer.json` in `weights`, the
    /// directory of the base weights (`run::base::tokenizer` settles it). `model.chat_template`
    /// is taken from `recipe_dir` too.
    pub fn from_recipe(model: &Model, recipe_dir: &Path, weights: Option<&Path>) -> Result<Tokenizer, DataError> {
        let mut path: PathBuf = match (&model.tokenizer, weights) {
            (Some(t), _) if t == "byte" => {
                let mut tokenizer = Tokenizer::byte();
                tokenizer.apply_model_settings(model, recipe_dir)?;
                return Ok(tokenizer);
            }
            (Some(t), _) => recipe_dir.join(t),
            (None, Some(dir)) => dir.to_path_buf(),
            (None, None) => {
                return Err(DataError::Config(
                    "model.tokenizer is unset and the run has no base weights to find tokenizer.json beside \
                     (model.path, --init-from, or a hub model.name in the Hugging Face cache)"
                        .into(),
                ));
            }
        };
        if path.is_dir() {
            path = path.join("tokenizer.json");
        }
        let mut tokenizer = Tokenizer::from_file(&path)?;
        tokenizer.apply_model_settings(model, recipe_dir)?;
        Ok(tokenizer)
    }

    /// A stable name for the vocabulary: `byte-v1`, or the BLAKE3 of the `tokenizer.json`.
    pub fn identity(&self) -> &str {
        &self.identity
    }

    /// One past the largest id this tokenizer produces.
    pub fn vocab_size(&self) -> usize {
        match &self.inner {
            Inner::Byte => BYTE_VOCAB_SIZE,
            Inner::Hf(hf) => hf.vocab_size,
        }
    }

    pub fn special(&self, special: Special) -> Option<u32> {
        match &self.inner {
            Inner::Byte => Some(byte::special_id(special)),
            Inner::Hf(hf) => hf.specials.iter().find(|(s, _)| *s == special).map(|(_, id)| *id),
        }
    }

    /// `<|endoftext|>`: ends every document.
    pub fn eos_id(&self) -> u32 {
        self.required(Special::EndOfText)
    }
    /// `<|im_start|>`, in ChatML vocabularies.
    pub fn im_start_id(&self) -> Option<u32> {
        self.special(Special::ImStart)
    }
    /// `<|im_end|>`: ends a turn, and so a generated answer, in ChatML vocabularies.
    pub fn im_end_id(&self) -> Option<u32> {
        self.special(Special::ImEnd)
    }

    /// The tokens that end a generated answer: `<|im_end|>` where the vocabulary has it,
    /// `<|endoftext|>`, and the `eos_token` of `tokenizer_config.json` (Instella's chat template
    /// ends a turn with it).
    pub fn stop_ids(&self) -> Vec<u32> {
        let config_eos = self
            .template_vars()
            .into_iter()
            .find(|(name, _)| name == "eos_token")
            .and_then(|(_, v)| v.as_str().and_then(|t| self.token_id(t)));
        let mut ids: Vec<u32> = [self.im_end_id(), Some(self.eos_id()), config_eos].into_iter().flatten().collect();
        ids.sort_unstable();
        ids.dedup();
        ids
    }

    /// The id of a whole token's text (`None` for text that is not one token).
    fn token_id(&self, text: &str) -> Option<u32> {
        match &self.inner {
            Inner::Byte => Special::ALL.iter().find(|s| s.text() == text).map(|&s| byte::special_id(s)),
            Inner::Hf(hf) => hf.with_specials.token_to_id(text),
        }
    }
    /// The padding id; Qwen3's tokenizer has none and pads with `<|endoftext|>`.
    pub fn pad_id(&self) -> u32 {
        self.special(Special::Pad).unwrap_or_else(|| self.eos_id())
    }

    fn required(&self, special: Special) -> u32 {
        // Both constructors guarantee `<|endoftext|>` exists.
        self.special(special).unwrap_or(0)
    }

    /// Encodes message text: markup tokens are recognised, control tokens stay literal text.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, DataError> {
        match &self.inner {
            Inner::Byte => Ok(byte::encode(text, false)),
            Inner::Hf(hf) => hf.encode(&hf.literal, text),
        }
    }

    /// [`Tokenizer::encode_with_specials`] with each token's byte range in `text`.
    pub fn encode_with_offsets(&self, text: &str) -> Result<(Vec<u32>, Offsets), DataError> {
        match &self.inner {
            Inner::Byte => Ok(byte::encode_with_offsets(text)),
            Inner::Hf(hf) => {
                let encoding = hf
                    .with_specials
                    .encode(text, false)
                    .map_err(|e| DataError::Tokenizer { origin: hf.origin.clone(), message: e.to_string() })?;
                Ok((encoding.get_ids().to_vec(), encoding.get_offsets().to_vec()))
            }
        }
    }

    /// Encodes text in which every special token string is recognised.
    pub fn encode_with_specials(&self, text: &str) -> Result<Vec<u32>, DataError> {
        match &self.inner {
            Inner::Byte => Ok(byte::encode(text, true)),
            Inner::Hf(hf) => hf.encode(&hf.with_specials, text),
        }
    }

    /// Encodes as Hugging Face's `tokenizer(text, add_special_tokens=…)` does: every special
    /// token's text is read as that token, and with `add_special_tokens` the tokenizer's
    /// post-processor adds its own (a BOS, say; Qwen's and the byte tokenizer's add none). What a
    /// `/tokenize` route answers, so that a client counting tokens counts the server's.
    pub fn encode_as_hf(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>, DataError> {
        match &self.inner {
            Inner::Byte => Ok(byte::encode(text, true)),
            Inner::Hf(hf) => hf
                .with_specials
                .encode(text, add_special_tokens)
                .map(|e| e.get_ids().to_vec())
                .map_err(|e| DataError::Tokenizer { origin: hf.origin.clone(), message: e.to_string() }),
        }
    }

    /// Decodes ids to text. `skip_control` drops control tokens (as HF's
    /// `skip_special_tokens` does for Qwen3); markup tokens are always written out.
    pub fn decode(&self, ids: &[u32], skip_control: bool) -> Result<String, DataError> {
        match &self.inner {
            Inner::Byte => byte::decode(ids, skip_control)
                .map_err(|message| DataError::Tokenizer { origin: self.identity.clone(), message }),
            Inner::Hf(hf) => {
                let err = |message: String| DataError::Tokenizer { origin: hf.origin.clone(), message };
                if let Some(bad) = ids.iter().find(|&&id| id as usize >= hf.vocab_size) {
                    return Err(err(format!("id {bad} is outside the vocabulary of {}", hf.vocab_size)));
                }
                hf.with_specials.decode(ids, skip_control).map_err(|e| err(e.to_string()))
            }
        }
    }
}

impl HfTokenizer {
    fn encode(&self, tk: &tokenizers::Tokenizer, text: &str) -> Result<Vec<u32>, DataError> {
        // No post-processor specials: the chat template places every special itself.
        let encoding = tk
            .encode(text, false)
            .map_err(|e| DataError::Tokenizer { origin: self.origin.clone(), message: e.to_string() })?;
        Ok(encoding.get_ids().to_vec())
    }
}

#[cfg(test)]
pub(crate) mod tests;
