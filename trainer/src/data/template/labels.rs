//! A conversation through a Jinja template: the messages as transformers' users pass them,
//! and which bytes of the rendering are learned (see the parent module's doc).

use std::ops::Range;

use minijinja::Value;

use super::{JinjaTemplate, Piece, PieceText, Rendered, Rendering, Targets};
use crate::data::error::DataError;
use crate::data::example::{Conversation, Message, Role, ToolArguments};
use crate::data::json::Json;

/// A message as an OpenAI-style map: `role`, `content` (always a string), `reasoning_content`
/// when given, and `tool_calls` as `{"type": "function", "function": {"name", "arguments"}}`.
pub fn message_json(m: &Message) -> Json {
    let s = |v: &str| Json::String(v.to_owned());
    let mut fields = vec![("role".to_owned(), s(m.role.as_str())), ("content".to_owned(), s(&m.content))];
    if let Some(r) = &m.reasoning {
        fields.push(("reasoning_content".to_owned(), s(r)));
    }
    if !m.tool_calls.is_empty() {
        let calls = m
            .tool_calls
            .iter()
            .map(|c| {
                let arguments = match &c.arguments {
                    ToolArguments::Json(j) => j.clone(),
                    ToolArguments::Raw(r) => s(r),
                };
                let function = Json::object([("name".to_owned(), s(&c.name)), ("arguments".to_owned(), arguments)]);
                Json::object([("type".to_owned(), s("function")), ("function".to_owned(), function)])
            })
            .collect();
        fields.push(("tool_calls".to_owned(), Json::Array(calls)));
    }
    Json::Object(fields)
}

/// A JSON value as a template value, key order kept.
pub fn json_value(json: Json) -> Value {
    Value::from(minijinja::value::Serde(json))
}

/// `messages` rendered with `tools` (none when empty, as transformers passes `tools=None`).
pub fn render_messages(
    t: &JinjaTemplate,
    messages: &[Message],
    tools: &[Json],
    add_generation_prompt: bool,
) -> Result<Rendered, DataError> {
    check_controls(t, messages, tools)?;
    let messages = json_value(Json::Array(messages.iter().map(message_json).collect()));
    let tools = if tools.is_empty() { Value::from(()) } else { json_value(Json::Array(tools.to_vec())) };
    t.render(&messages, &tools, add_generation_prompt)
}

pub fn render(t: &JinjaTemplate, conv: &Conversation, targets: Targets) -> Result<Rendering, DataError> {
    let whole = render_messages(t, &conv.messages, &conv.tools, false)?;
    let from = match targets {
        Targets::All => {
            return Ok(Rendering {
                pieces: vec![Piece { text: PieceText::Rendered(whole.text), target: true }],
                unlocated_turns: 0,
            });
        }
        Targets::AssistantFrom(from) => from,
    };
    let mut unlocated = 0;
    let learned: Vec<Range<usize>> = if t.has_generation {
        // Generation blocks of the prompt part (a preference pair's earlier turns) stay unlearned.
        let skip_before = match from {
            0 => 0,
            _ if from >= conv.messages.len() => usize::MAX,
            _ => render_messages(t, &conv.messages[..from], &conv.tools, false)
                .ok()
                .filter(|p| whole.text.starts_with(&p.text))
                .map_or(usize::MAX, |p| p.text.len()),
        };
        whole.generation.iter().filter(|r| r.start >= skip_before).cloned().collect()
    } else {
        let mut spans = Vec::new();
        for (i, m) in conv.messages.iter().enumerate().skip(from) {
            if m.role != Role::Assistant {
                continue;
            }
            match turn_span(t, conv, i, &whole.text) {
                Some(span) => spans.push(span),
                None => unlocated += 1,
            }
        }
        spans
    };
    Ok(Rendering { pieces: split(&whole.text, &learned), unlocated_turns: unlocated })
}

/// Assistant turn `i`: what rendering `messages[..=i]` adds to the generation prompt after
/// `messages[..i]`, when both are prefixes of the whole rendering.
fn turn_span(t: &JinjaTemplate, conv: &Conversation, i: usize, whole: &str) -> Option<Range<usize>> {
    let prompt = render_messages(t, &conv.messages[..i], &conv.tools, true).ok()?;
    let turn = render_messages(t, &conv.messages[..=i], &conv.tools, false).ok()?;
    let located =
        turn.text.len() > prompt.text.len() && turn.text.starts_with(&prompt.text) && whole.starts_with(&turn.text);
    located.then_some(prompt.text.len()..turn.text.len())
}

/// The text as rendered pieces, learned inside `learned` (ascending, disjoint).
fn split(text: &str, learned: &[Range<usize>]) -> Vec<Piece> {
    let mut pieces = Vec::new();
    let mut at = 0;
    let mut push = |range: Range<usize>, target: bool| {
        if !range.is_empty() {
            pieces.push(Piece { text: PieceText::Rendered(text[range].to_owned()), target });
        }
    };
    for r in learned {
        let start = r.start.max(at);
        push(at..start, false);
        push(start..r.end, true);
        at = at.max(r.end);
    }
    push(at..text.len(), false);
    pieces
}

/// Refuses message text holding one of the tokenizer's control tokens: the rendering is
/// tokenized with special tokens recognised, so such text would end its turn early.
fn check_controls(t: &JinjaTemplate, messages: &[Message], tools: &[Json]) -> Result<(), DataError> {
    let find = |text: &str| t.control_tokens.iter().find(|c| text.contains(c.as_str())).cloned();
    let bad = |at: String, token: String| DataError::Template {
        origin: t.origin.clone(),
        message: format!("{at} holds the control token `{token}`, which would end its turn early"),
    };
    for (i, m) in messages.iter().enumerate() {
        if let Some(token) = find(&m.content) {
            return Err(bad(format!("messages[{i}].content"), token));
        }
        if let Some(token) = m.reasoning.as_deref().and_then(find) {
            return Err(bad(format!("messages[{i}].reasoning_content"), token));
        }
        for (j, c) in m.tool_calls.iter().enumerate() {
            if let Some(token) = find(&c.name).or_else(|| find(&c.arguments.render())) {
                return Err(bad(format!("messages[{i}].tool_calls[{j}]"), token));
            }
        }
    }
    for (i, tool) in tools.iter().enumerate() {
        if let Some(token) = find(&tool.to_python_json()) {
            return Err(bad(format!("tools[{i}]"), token));
        }
    }
    Ok(())
}
