//! What the chat route answers: a whole `chat.completion`, or the `chat.completion.chunk`s of
//! a stream, with an answer's reasoning, content and tool calls (`serve::answer`).

use serde_json::{Value, json};

use super::Usage;
use crate::serve::answer::{Answer, Delta, ParsedCall};

/// What every body of one completion repeats.
#[derive(Debug, Clone)]
pub struct Meta {
    /// `chatcmpl-…`.
    pub id: String,
    pub created: u64,
    pub model: String,
}

impl Meta {
    /// A tool call's id: the completion's, numbered, so the ids of one answer are unique and
    /// the same whole or streamed.
    fn call_id(&self, index: usize) -> String {
        format!("call_{}_{index}", self.id.trim_start_matches("chatcmpl-"))
    }

    fn call(&self, c: &ParsedCall) -> Value {
        json!({"id": self.call_id(c.index), "type": "function", "function": {"name": c.name, "arguments": c.arguments}})
    }

    /// A whole (non-streamed) completion. `finish` is the engine's (`stop`, `length`); an
    /// answer that calls tools finishes with `tool_calls`, as OpenAI's do.
    pub fn completion(&self, answer: &Answer, finish: &str, usage: Usage) -> Value {
        let mut message = json!({"role": "assistant", "content": answer.content});
        if !answer.reasoning.is_empty() {
            message["reasoning_content"] = json!(answer.reasoning);
        }
        if !answer.tool_calls.is_empty() {
            message["tool_calls"] = answer.tool_calls.iter().map(|c| self.call(c)).collect();
        }
        // Empty content beside reasoning or calls is no content.
        if answer.content.is_empty() && (!answer.reasoning.is_empty() || !answer.tool_calls.is_empty()) {
            message["content"] = Value::Null;
        }
        json!({
            "id": self.id,
            "object": "chat.completion",
            "created": self.created,
            "model": self.model,
            "choices": [{"index": 0, "message": message, "logprobs": null, "finish_reason": finish_reason(answer, finish)}],
            "usage": usage,
        })
    }

    /// One chunk of a stream: a delta, a finish reason, or both.
    pub fn chunk(&self, delta: Value, finish: Option<&str>) -> Value {
        json!({
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "choices": [{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish}],
        })
    }

    /// The chunk of one piece of an answer.
    pub fn delta_chunk(&self, delta: &Delta) -> Value {
        let delta = match delta {
            Delta::Reasoning(r) => json!({"reasoning_content": r}),
            Delta::Content(c) => json!({"content": c}),
            // A call goes out whole, once its closing tag has arrived.
            Delta::ToolCall(c) => {
                let mut call = self.call(c);
                call["index"] = json!(c.index);
                json!({"tool_calls": [call]})
            }
        };
        self.chunk(delta, None)
    }

    /// The last chunk with choices: the finish reason, `tool_calls` when any call was made.
    pub fn finish_chunk(&self, made_calls: bool, finish: &str) -> Value {
        self.chunk(json!({}), Some(if made_calls { "tool_calls" } else { finish }))
    }

    /// With `include_usage`: the final chunk, usage and no choices.
    pub fn usage_chunk(&self, usage: Usage) -> Value {
        json!({
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "choices": [],
            "usage": usage,
        })
    }
}

fn finish_reason<'a>(answer: &Answer, finish: &'a str) -> &'a str {
    if answer.tool_calls.is_empty() { finish } else { "tool_calls" }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta() -> Meta {
        Meta { id: "chatcmpl-ab12".into(), created: 7, model: "m".into() }
    }

    #[test]
    fn a_completion_carries_reasoning_content_and_tool_calls_as_openai_does() {
        let plain = Answer { content: "hi".into(), ..Answer::default() };
        let body = meta().completion(&plain, "stop", Usage::new(3, 1));
        assert_eq!(body["choices"][0]["message"], json!({"role": "assistant", "content": "hi"}));
        assert_eq!(body["choices"][0]["finish_reason"], "stop");
        assert_eq!(
            meta().completion(&Answer::default(), "length", Usage::new(3, 0))["choices"][0]["message"]["content"],
            ""
        );

        let call = ParsedCall { index: 0, name: "add".into(), arguments: "{\"a\": 1}".into() };
        let answer = Answer { reasoning: "sum".into(), content: String::new(), tool_calls: vec![call.clone()] };
        let body = meta().completion(&answer, "length", Usage::new(3, 9));
        let message = &body["choices"][0]["message"];
        assert_eq!(message["content"], Value::Null);
        assert_eq!(message["reasoning_content"], "sum");
        assert_eq!(
            message["tool_calls"],
            json!([{"id": "call_ab12_0", "type": "function", "function": {"name": "add", "arguments": "{\"a\": 1}"}}])
        );
        assert_eq!(body["choices"][0]["finish_reason"], "tool_calls");

        let streamed = meta().delta_chunk(&Delta::ToolCall(call));
        assert_eq!(streamed["choices"][0]["delta"]["tool_calls"][0]["index"], 0);
        assert_eq!(streamed["choices"][0]["delta"]["tool_calls"][0]["id"], "call_ab12_0");
        assert_eq!(meta().finish_chunk(true, "stop")["choices"][0]["finish_reason"], "tool_calls");
        assert_eq!(
            meta().delta_chunk(&Delta::Reasoning("r".into()))["choices"][0]["delta"],
            json!({"reasoning_content": "r"})
        );
    }
}
