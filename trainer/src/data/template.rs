//! Chat templates: the model's own Jinja template, rendered as transformers renders it, or
//! (only when the model ships none) the built-in ChatML. Either renders a conversation as
//! [`Piece`]s that know whether they are learned.
//!
//! Which tokens are learned, for a Jinja template: the output of its `{% generation %}`
//! blocks when it has them (transformers' `return_assistant_tokens_mask`); otherwise each
//! assistant turn found by rendering prefixes, as TRL does for prompt/completion data: the
//! turn is what `render(messages[..=i])` adds after `render(messages[..i],
//! add_generation_prompt=True)`, provided both are prefixes of the whole rendering. A turn a
//! template renders differently once later messages follow (Qwen3 drops the think block of
//! earlier turns) cannot be located that way; it is not learned and is counted
//! ([`Rendering::unlocated_turns`], the manifest's `template.unlocated_turns`).
//!
//! A Jinja rendering is tokenized as one string with special tokens recognised (what
//! `apply_chat_template(tokenize=True)` does), and a token is learned when its bytes overlap a
//! learned span. So that message text cannot forge a turn boundary, a message holding one of
//! the tokenizer's control tokens is refused.

mod chatml;
mod jinja;
mod labels;
mod tojson;

use std::ops::Range;
use std::path::Path;
use std::sync::Arc;

pub use chatml::{ChatMl, assistant_answer_text};
pub use jinja::{JinjaTemplate, Rendered, TemplateContext};
pub use labels::message_json;
use serde::{Deserialize, Serialize};

use super::error::DataError;
use super::example::{Conversation, Message};
use super::json::Json;
use super::tokenizer::{Special, TemplateSource, Tokenizer};

/// How a conversation becomes text.
#[derive(Debug, Clone)]
pub enum ChatTemplate {
    /// Qwen3's ChatML written by hand (no template shipped with the model).
    Builtin(ChatMl),
    /// The model's own template.
    Jinja(Arc<JinjaTemplate>),
}

/// Which tokens carry a label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Targets {
    /// Every token (continued pre-training on rendered conversations).
    All,
    /// Assistant turns at message index `from` or later (0 for SFT; the prompt length for a
    /// preference answer).
    AssistantFrom(usize),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PieceText {
    /// A control or markup token placed by the built-in template.
    Special(Special),
    /// Message text placed by the built-in template: control strings in it stay text.
    Text(String),
    /// Text a Jinja template wrote: tokenized together with the pieces of this kind around it,
    /// special tokens recognised.
    Rendered(String),
    /// A template error, reported by [`encode_pieces`] (see [`ChatTemplate::generation_prompt`]).
    Failed(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Piece {
    pub text: PieceText,
    pub target: bool,
}

/// Token ids with, per token, whether it is learned.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Encoded {
    pub ids: Vec<u32>,
    pub targets: Vec<bool>,
}

/// A rendered conversation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rendering {
    pub pieces: Vec<Piece>,
    /// Assistant turns meant to be learned that could not be located (see the module doc).
    pub unlocated_turns: u32,
}

/// What the dataset manifest records about the template.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TemplateInfo {
    /// `builtin:qwen3-chatml`, `builtin:compact-chatml`, or the file the template came from.
    pub source: String,
    /// BLAKE3 of the template's text (of the built-in renderer's name for the built-ins).
    pub blake3: String,
    /// How learned tokens are found: `builtin`, `generation` (`{% generation %}` blocks) or
    /// `prefix` (rendering prefixes).
    pub labels: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enable_thinking: Option<bool>,
}

impl ChatTemplate {
    pub const QWEN3: ChatTemplate = ChatTemplate::Builtin(ChatMl::QWEN3);
    pub const COMPACT: ChatTemplate = ChatTemplate::Builtin(ChatMl::COMPACT);

    /// The tokenizer's own template (from `chat_template.jinja`, `tokenizer_config.json` or
    /// the recipe's `model.chat_template`); the built-in ChatML when it has none: Qwen3's for
    /// Hugging Face tokenizers, the compact one for the byte tokenizer.
    pub fn load(tokenizer: &Tokenizer) -> Result<ChatTemplate, DataError> {
        match tokenizer.chat_template() {
            Some(source) => Ok(ChatTemplate::Jinja(Arc::new(compile(tokenizer, source)?))),
            None if tokenizer.identity() == Tokenizer::byte().identity() => Ok(Self::COMPACT),
            None => Ok(Self::QWEN3),
        }
    }

    /// [`ChatTemplate::load`] for callers that cannot report an error: a template that does
    /// not compile falls back to the built-in one. Training loads with `load`, so a model
    /// whose template does not compile is refused before it is trained or served.
    pub fn for_tokenizer(tokenizer: &Tokenizer) -> ChatTemplate {
        Self::load(tokenizer).unwrap_or_else(|_| {
            if tokenizer.identity() == Tokenizer::byte().identity() { Self::COMPACT } else { Self::QWEN3 }
        })
    }

    /// Reads a template from a `.jinja` file (or a `tokenizer_config.json`'s `chat_template`).
    pub fn from_file(path: &Path, tokenizer: &Tokenizer) -> Result<ChatTemplate, DataError> {
        let source = TemplateSource::read(path)?;
        Ok(ChatTemplate::Jinja(Arc::new(compile(tokenizer, &source)?)))
    }

    pub fn info(&self) -> TemplateInfo {
        match self {
            ChatTemplate::Builtin(c) => {
                let name = if c.empty_think_block { "builtin:qwen3-chatml" } else { "builtin:compact-chatml" };
                TemplateInfo {
                    source: name.into(),
                    blake3: blake3::hash(name.as_bytes()).to_hex().to_string(),
                    labels: "builtin".into(),
                    enable_thinking: None,
                }
            }
            ChatTemplate::Jinja(j) => TemplateInfo {
                source: j.origin.clone(),
                blake3: j.blake3.clone(),
                labels: if j.has_generation { "generation" } else { "prefix" }.into(),
                enable_thinking: Some(j.enable_thinking),
            },
        }
    }

    /// The whole conversation, with the learned pieces marked.
    pub fn render(&self, conv: &Conversation, targets: Targets) -> Result<Rendering, DataError> {
        match self {
            ChatTemplate::Builtin(c) => Ok(Rendering { pieces: c.render(conv, targets), unlocated_turns: 0 }),
            ChatTemplate::Jinja(j) => labels::render(j, conv, targets),
        }
    }

    /// The conversation so far followed by the opening of an assistant turn: what a model is
    /// given to generate the next answer.
    pub fn try_generation_prompt(&self, messages: &[Message], tools: &[Json]) -> Result<Vec<Piece>, DataError> {
        match self {
            ChatTemplate::Builtin(c) => Ok(c.generation_prompt(messages, tools)),
            ChatTemplate::Jinja(j) => {
                let r = labels::render_messages(j, messages, tools, true)?;
                Ok(vec![Piece { text: PieceText::Rendered(r.text), target: false }])
            }
        }
    }

    /// [`ChatTemplate::try_generation_prompt`] for callers that encode the prompt right away:
    /// an error (a template's `raise_exception`) is carried in the pieces and returned by
    /// [`encode_pieces`].
    pub fn generation_prompt(&self, messages: &[Message], tools: &[Json]) -> Vec<Piece> {
        self.try_generation_prompt(messages, tools)
            .unwrap_or_else(|e| vec![Piece { text: PieceText::Failed(e.to_string()), target: false }])
    }

    /// The final assistant turn as the model is trained to write it after the generation
    /// prompt, with special tokens left out: what exact match compares a generated answer with.
    pub fn reference_answer(&self, conv: &Conversation, tokenizer: &Tokenizer) -> Result<Option<String>, DataError> {
        let Some(last) = conv.messages.last().filter(|m| m.role == super::example::Role::Assistant) else {
            return Ok(None);
        };
        match self {
            ChatTemplate::Builtin(_) => Ok(Some(assistant_answer_text(last))),
            ChatTemplate::Jinja(_) => {
                let rendering = self.render(conv, Targets::AssistantFrom(conv.messages.len() - 1))?;
                if rendering.unlocated_turns > 0 {
                    return Ok(None);
                }
                let enc = encode_pieces(tokenizer, &rendering.pieces)?;
                let ids: Vec<u32> = enc.ids.iter().zip(&enc.targets).filter(|(_, t)| **t).map(|(id, _)| *id).collect();
                Ok(Some(tokenizer.decode(&ids, true)?))
            }
        }
    }
}

fn compile(tokenizer: &Tokenizer, source: &TemplateSource) -> Result<JinjaTemplate, DataError> {
    let context = TemplateContext {
        vars: tokenizer.template_vars(),
        enable_thinking: tokenizer.enable_thinking(),
        control_tokens: tokenizer.control_tokens(),
    };
    JinjaTemplate::new(&source.text, &source.origin, context)
}

/// The rendered text with specials written out (what `apply_chat_template(tokenize=False)`
/// returns).
pub fn pieces_to_string(pieces: &[Piece]) -> String {
    pieces
        .iter()
        .map(|p| match &p.text {
            PieceText::Special(s) => s.text(),
            PieceText::Text(t) | PieceText::Rendered(t) => t.as_str(),
            PieceText::Failed(_) => "",
        })
        .collect()
}

/// Tokenizes pieces. Adjacent text pieces with the same label flag are encoded together, so
/// tokens only break where the label changes or a control token sits; adjacent rendered
/// pieces are encoded as one string, learned where a token overlaps a learned piece.
pub fn encode_pieces(tokenizer: &Tokenizer, pieces: &[Piece]) -> Result<Encoded, DataError> {
    let mut out = Encoded::default();
    let mut run = String::new();
    let mut run_target = false;
    let mut rendered = String::new();
    let mut learned: Vec<Range<usize>> = Vec::new();
    let flush = |run: &mut String, target: bool, out: &mut Encoded| -> Result<(), DataError> {
        if !run.is_empty() {
            let ids = tokenizer.encode(run)?;
            out.targets.extend(std::iter::repeat_n(target, ids.len()));
            out.ids.extend(ids);
            run.clear();
        }
        Ok(())
    };
    let flush_rendered = |text: &mut String, learned: &mut Vec<Range<usize>>, out: &mut Encoded| {
        if !text.is_empty() {
            let (ids, offsets) = tokenizer.encode_with_offsets(text)?;
            for (id, (start, end)) in ids.into_iter().zip(offsets) {
                out.ids.push(id);
                out.targets.push(learned.iter().any(|r| start < r.end && r.start < end.max(start + 1)));
            }
            text.clear();
            learned.clear();
        }
        Ok::<(), DataError>(())
    };
    for piece in pieces {
        if !matches!(piece.text, PieceText::Rendered(_)) {
            flush_rendered(&mut rendered, &mut learned, &mut out)?;
        }
        match &piece.text {
            PieceText::Text(t) => {
                if piece.target != run_target {
                    flush(&mut run, run_target, &mut out)?;
                    run_target = piece.target;
                }
                run.push_str(t);
            }
            PieceText::Special(s) => {
                flush(&mut run, run_target, &mut out)?;
                let id = tokenizer.special(*s).ok_or_else(|| DataError::Tokenizer {
                    origin: tokenizer.identity().to_owned(),
                    message: format!(
                        "has no `{}` token, which the built-in ChatML template writes: give the model's own chat \
                         template (model.chat_template, or a tokenizer_config.json with one beside tokenizer.json)",
                        s.text()
                    ),
                })?;
                out.ids.push(id);
                out.targets.push(piece.target);
            }
            PieceText::Rendered(t) => {
                flush(&mut run, run_target, &mut out)?;
                if piece.target && !t.is_empty() {
                    learned.push(rendered.len()..rendered.len() + t.len());
                }
                rendered.push_str(t);
            }
            PieceText::Failed(message) => {
                return Err(DataError::Template { origin: "chat template".into(), message: message.clone() });
            }
        }
    }
    flush(&mut run, run_target, &mut out)?;
    flush_rendered(&mut rendered, &mut learned, &mut out)?;
    Ok(out)
}

#[cfg(test)]
mod tests;
