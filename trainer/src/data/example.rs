//! What one training record means, independent of the file format it came in.

use serde::Serialize;

use super::json::Json;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    System,
    User,
    Assistant,
    Tool,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::System => "system",
            Role::User => "user",
            Role::Assistant => "assistant",
            Role::Tool => "tool",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Message {
    pub role: Role,
    pub content: String,
    /// Qwen3's `reasoning_content`: rendered inside `<think>...</think>`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
}

impl Message {
    pub fn new(role: Role, content: impl Into<String>) -> Message {
        Message { role, content: content.into(), reasoning: None, tool_calls: Vec::new() }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ToolCall {
    pub name: String,
    pub arguments: ToolArguments,
}

/// Qwen3 writes object arguments with `tojson` and string arguments verbatim.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum ToolArguments {
    Json(Json),
    Raw(String),
}

impl ToolArguments {
    pub fn render(&self) -> String {
        match self {
            ToolArguments::Json(j) => j.to_python_json(),
            ToolArguments::Raw(s) => s.clone(),
        }
    }
}

/// A conversation and the tool schemas offered in it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Conversation {
    pub messages: Vec<Message>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tools: Vec<Json>,
}

/// A prompt with a preferred and a dispreferred continuation (assistant turns).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PreferencePair {
    pub prompt: Vec<Message>,
    pub chosen: Vec<Message>,
    pub rejected: Vec<Message>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tools: Vec<Json>,
}

/// One record. Instruction (alpaca) records become a [`Example::Chat`] when read.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Example {
    Chat(Conversation),
    Text(String),
    Preference(PreferencePair),
}

impl Example {
    /// BLAKE3 of the example's canonical JSON: records that differ only in whitespace or
    /// in the file format they came in (alpaca vs chat) are the same example.
    pub fn digest(&self) -> [u8; 32] {
        // Serializing plain data to a Vec cannot fail.
        let bytes = serde_json::to_vec(self).unwrap_or_default();
        *blake3::hash(&bytes).as_bytes()
    }

    /// The final assistant turn's text as the template writes it (content and tool calls):
    /// the reference an exact-match scorer compares a generated answer with.
    pub fn reference_answer(&self) -> Option<String> {
        let last = match self {
            Example::Chat(c) => c.messages.last(),
            Example::Preference(p) => p.chosen.last(),
            Example::Text(_) => None,
        }?;
        (last.role == Role::Assistant).then(|| super::template::assistant_answer_text(last))
    }
}
