//! The built-in template: Qwen3's ChatML written by hand, used when the model ships no chat
//! template of its own (the byte tokenizer of the tiny models; a tokenizer without one).
//!
//! This follows the Jinja template shipped in Qwen3's `tokenizer_config.json`: tools go into
//! the system turn inside `<tools>`, assistant tool calls are `<tool_call>\n{"name": ..,
//! "arguments": ..}\n</tool_call>`, tool results are user turns wrapped in
//! `<tool_response>`, and assistant turns after the last user query carry a `<think>` block,
//! which is empty when the data has no reasoning.
//!
//! Labels: assistant turns (their content, tool calls and the closing `<|im_end|>`) are the
//! targets of chat SFT. An *empty* think block is part of the prompt, exactly as the template
//! writes it into the generation prompt with `enable_thinking=False`, so the model is never
//! trained to produce it and eval prompts end with it. Message text is kept apart from the
//! control tokens the template places, so a user message holding `<|im_end|>` cannot end its
//! turn early.

use super::{Piece, PieceText, Targets};
use crate::data::example::{Conversation, Message, Role};
use crate::data::json::Json;
use crate::data::tokenizer::Special;

const TOOLS_PREAMBLE: &str = "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n\
     You are provided with function signatures within <tools></tools> XML tags:\n<tools>";
const TOOLS_POSTAMBLE: &str = "\n</tools>\n\nFor each function call, return a json object with function name and \
     arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": \
     <args-json-object>}\n</tool_call>";
const EMPTY_THINK: &str = "<think>\n\n</think>\n\n";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChatMl {
    /// Qwen3 (hybrid thinking) writes `<think>\n\n</think>\n\n` before an answer without
    /// reasoning. Our own byte-level models have no such convention to stay compatible
    /// with and only 128 positions, so they leave it out.
    pub empty_think_block: bool,
}

impl ChatMl {
    pub const QWEN3: ChatMl = ChatMl { empty_think_block: true };
    pub const COMPACT: ChatMl = ChatMl { empty_think_block: false };

    /// The whole conversation.
    pub fn render(&self, conv: &Conversation, targets: Targets) -> Vec<Piece> {
        let mut out = Out { pieces: Vec::new(), all: targets == Targets::All };
        self.system_turn(&mut out, &conv.messages, &conv.tools);
        let last_query = last_query_index(&conv.messages);
        for (i, msg) in conv.messages.iter().enumerate() {
            let learn = matches!(targets, Targets::AssistantFrom(from) if i >= from);
            match msg.role {
                Role::System if i == 0 => {}
                Role::System | Role::User => {
                    out.special(Special::ImStart, false);
                    out.text(format!("{}\n{}", msg.role.as_str(), msg.content), false);
                    out.special(Special::ImEnd, false);
                    out.text("\n", false);
                }
                Role::Assistant => {
                    let is_last = i + 1 == conv.messages.len();
                    self.assistant_turn(&mut out, msg, i > last_query, is_last, learn);
                }
                Role::Tool => {
                    let prev_is_tool = i > 0 && conv.messages[i - 1].role == Role::Tool;
                    let next_is_tool = conv.messages.get(i + 1).is_some_and(|m| m.role == Role::Tool);
                    if !prev_is_tool {
                        out.special(Special::ImStart, false);
                        out.text("user", false);
                    }
                    out.text(format!("\n<tool_response>\n{}\n</tool_response>", msg.content), false);
                    if !next_is_tool {
                        out.special(Special::ImEnd, false);
                        out.text("\n", false);
                    }
                }
            }
        }
        out.pieces
    }

    /// The conversation so far followed by the opening of an assistant turn: what a model is
    /// given to generate the next answer (`add_generation_prompt=True, enable_thinking=False`).
    pub fn generation_prompt(&self, messages: &[Message], tools: &[Json]) -> Vec<Piece> {
        let conv = Conversation { messages: messages.to_vec(), tools: tools.to_vec() };
        let mut pieces = self.render(&conv, Targets::AssistantFrom(usize::MAX));
        pieces.push(Piece { text: PieceText::Special(Special::ImStart), target: false });
        let mut header = String::from("assistant\n");
        if self.empty_think_block {
            header.push_str(EMPTY_THINK);
        }
        pieces.push(Piece { text: PieceText::Text(header), target: false });
        pieces
    }

    fn system_turn(&self, out: &mut Out, messages: &[Message], tools: &[Json]) {
        let system = messages.first().filter(|m| m.role == Role::System);
        if tools.is_empty() {
            if let Some(system) = system {
                out.special(Special::ImStart, false);
                out.text(format!("system\n{}", system.content), false);
                out.special(Special::ImEnd, false);
                out.text("\n", false);
            }
            return;
        }
        let mut text = String::from("system\n");
        if let Some(system) = system {
            text.push_str(&system.content);
            text.push_str("\n\n");
        }
        text.push_str(TOOLS_PREAMBLE);
        for tool in tools {
            text.push('\n');
            text.push_str(&tool.to_python_json());
        }
        text.push_str(TOOLS_POSTAMBLE);
        out.special(Special::ImStart, false);
        out.text(text, false);
        out.special(Special::ImEnd, false);
        out.text("\n", false);
    }

    fn assistant_turn(&self, out: &mut Out, msg: &Message, after_last_query: bool, is_last: bool, learn: bool) {
        let (reasoning, content) = split_reasoning(msg);
        out.special(Special::ImStart, false);
        out.text("assistant\n", false);
        let mut body = String::new();
        if after_last_query && (is_last || !reasoning.is_empty()) {
            let reasoning = reasoning.trim_matches('\n');
            if reasoning.is_empty() {
                if self.empty_think_block {
                    out.text(EMPTY_THINK, false);
                }
            } else {
                body.push_str(&format!("<think>\n{reasoning}\n</think>\n\n"));
            }
            body.push_str(content.trim_start_matches('\n'));
        } else {
            body.push_str(content);
        }
        let content_empty = body.is_empty();
        push_tool_calls(&mut body, msg, !content_empty);
        out.text(body, learn);
        out.special(Special::ImEnd, learn);
        out.text("\n", false);
    }
}

/// The final text of an assistant turn as a model is trained to write it after the
/// generation prompt: content (reasoning removed) and tool calls, without `<|im_end|>`.
pub fn assistant_answer_text(msg: &Message) -> String {
    let (_, content) = split_reasoning(msg);
    let mut text = content.trim_start_matches('\n').to_owned();
    let content_empty = text.is_empty();
    push_tool_calls(&mut text, msg, !content_empty);
    text
}

fn push_tool_calls(body: &mut String, msg: &Message, content_present: bool) {
    for (j, call) in msg.tool_calls.iter().enumerate() {
        if j > 0 || content_present {
            body.push('\n');
        }
        body.push_str("<tool_call>\n{\"name\": \"");
        body.push_str(&call.name);
        body.push_str("\", \"arguments\": ");
        body.push_str(&call.arguments.render());
        body.push_str("}\n</tool_call>");
    }
}

/// Qwen3 takes reasoning from `reasoning_content`, or else from a `<think>` block written
/// into the content itself.
fn split_reasoning(msg: &Message) -> (&str, &str) {
    if let Some(reasoning) = &msg.reasoning {
        return (reasoning, &msg.content);
    }
    match msg.content.rsplit_once("</think>") {
        Some((before, after)) => {
            let before = before.split("</think>").next().unwrap_or(before);
            let reasoning = before.trim_end_matches('\n');
            let reasoning = reasoning.rsplit_once("<think>").map_or(reasoning, |(_, r)| r);
            (reasoning.trim_start_matches('\n'), after.trim_start_matches('\n'))
        }
        None => ("", &msg.content),
    }
}

/// The index of the last real user query (tool results travel as user turns in Qwen3 but
/// do not count); the whole conversation when there is none.
fn last_query_index(messages: &[Message]) -> usize {
    messages
        .iter()
        .rposition(|m| {
            m.role == Role::User
                && !(m.content.starts_with("<tool_response>") && m.content.ends_with("</tool_response>"))
        })
        .unwrap_or(messages.len().saturating_sub(1))
}

struct Out {
    pieces: Vec<Piece>,
    all: bool,
}

impl Out {
    fn special(&mut self, s: Special, target: bool) {
        self.pieces.push(Piece { text: PieceText::Special(s), target: target || self.all });
    }
    fn text(&mut self, text: impl Into<String>, target: bool) {
        let text = text.into();
        if !text.is_empty() {
            self.pieces.push(Piece { text: PieceText::Text(text), target: target || self.all });
        }
    }
}
