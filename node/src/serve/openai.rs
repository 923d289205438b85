//! The OpenAI chat-completions wire format, as far as this server implements it, and the
//! OpenAI error body.
//!
//! Requests are read leniently, as OpenAI's own server does: unknown fields are ignored,
//! but a known option set to something this server cannot honour (`n > 1`, tools,
//! logprobs) is a 400 naming the field rather than a silently different answer.

use axum::Json;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// `POST /v1/chat/completions` body.
#[derive(Debug, Clone, Deserialize)]
pub struct ChatRequest {
    pub model: String,
    pub messages: Vec<ChatMessage>,
    #[serde(default)]
    pub max_tokens: Option<u32>,
    #[serde(default)]
    pub max_completion_tokens: Option<u32>,
    #[serde(default)]
    pub temperature: Option<f64>,
    #[serde(default)]
    pub top_p: Option<f64>,
    #[serde(default)]
    pub stop: Option<StopField>,
    #[serde(default)]
    pub seed: Option<u64>,
    #[serde(default)]
    pub stream: bool,
    #[serde(default)]
    pub stream_options: Option<StreamOptions>,
    #[serde(default)]
    pub n: Option<u32>,
    #[serde(default)]
    pub tools: Option<Vec<Value>>,
    #[serde(default)]
    pub logprobs: Option<bool>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct ChatMessage {
    pub role: String,
    #[serde(default)]
    pub content: Option<Content>,
}

/// A message's content: a string, or parts of which only `text` parts are understood.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum Content {
    Text(String),
    Parts(Vec<ContentPart>),
}

#[derive(Debug, Clone, Deserialize)]
pub struct ContentPart {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub text: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum StopField {
    One(String),
    Many(Vec<String>),
}

#[derive(Debug, Clone, Copy, Default, Deserialize)]
pub struct StreamOptions {
    #[serde(default)]
    pub include_usage: bool,
}

impl ChatRequest {
    /// At most four stop sequences, as OpenAI allows.
    pub fn stops(&self) -> Result<Vec<String>, ApiError> {
        let stops = match &self.stop {
            None => vec![],
            Some(StopField::One(s)) => vec![s.clone()],
            Some(StopField::Many(v)) => v.clone(),
        };
        if stops.len() > 4 {
            return Err(ApiError::invalid("stop", format!("{} stop sequences; at most 4 are allowed", stops.len())));
        }
        Ok(stops)
    }

    /// Options this server cannot honour, named.
    pub fn unsupported(&self) -> Result<(), ApiError> {
        if self.n.is_some_and(|n| n != 1) {
            return Err(ApiError::invalid("n", "only n = 1 is supported"));
        }
        if self.tools.as_ref().is_some_and(|t| !t.is_empty()) {
            return Err(ApiError::invalid("tools", "tool calling is not enabled for this model"));
        }
        if self.logprobs == Some(true) {
            return Err(ApiError::invalid("logprobs", "logprobs are not supported"));
        }
        Ok(())
    }
}

impl Content {
    pub fn text(&self, index: usize) -> Result<String, ApiError> {
        match self {
            Content::Text(t) => Ok(t.clone()),
            Content::Parts(parts) => {
                let mut out = String::new();
                for p in parts {
                    match (p.kind.as_str(), &p.text) {
                        ("text", Some(t)) => out.push_str(t),
                        (kind, _) => {
                            return Err(ApiError::invalid(
                                &format!("messages[{index}].content"),
                                format!("content part of type {kind:?} is not supported (text only)"),
                            ));
                        }
                    }
                }
                Ok(out)
            }
        }
    }
}

/// Token counts of one completion.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub total_tokens: usize,
}

impl Usage {
    pub fn new(prompt: usize, completion: usize) -> Usage {
        Usage { prompt_tokens: prompt, completion_tokens: completion, total_tokens: prompt + completion }
    }
}

/// A whole (non-streamed) completion.
pub fn completion_body(id: &str, created: u64, model: &str, text: &str, finish: &str, usage: Usage) -> Value {
    json!({
        "id": id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [{
            "index": 0,
            "message": {"role": "assistant", "content": text},
            "logprobs": null,
            "finish_reason": finish,
        }],
        "usage": usage,
    })
}

/// One `chat.completion.chunk` of a stream: a delta, a finish reason, or (with
/// `include_usage`) the final usage chunk with no choices.
pub fn chunk_body(id: &str, created: u64, model: &str, delta: Value, finish: Option<&str>) -> Value {
    json!({
        "id": id,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish}],
    })
}

pub fn usage_chunk_body(id: &str, created: u64, model: &str, usage: Usage) -> Value {
    json!({
        "id": id,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [],
        "usage": usage,
    })
}

/// An error in OpenAI's shape: `{"error": {message, type, param, code}}`.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    pub status: StatusCode,
    pub kind: &'static str,
    pub code: &'static str,
    pub param: Option<String>,
    pub message: String,
    /// Seconds, for 429 and 503.
    pub retry_after: Option<u64>,
}

impl ApiError {
    pub fn invalid(param: &str, message: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            kind: "invalid_request_error",
            code: "invalid_value",
            param: Some(param.to_string()),
            message: message.into(),
            retry_after: None,
        }
    }

    pub fn new(status: StatusCode, kind: &'static str, code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError { status, kind, code, param: None, message: message.into(), retry_after: None }
    }

    pub fn retry_after(mut self, seconds: u64) -> ApiError {
        self.retry_after = Some(seconds);
        self
    }

    pub fn body(&self) -> Value {
        json!({"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}})
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut resp = (self.status, Json(self.body())).into_response();
        if let Some(s) = self.retry_after {
            resp.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(s));
        }
        resp
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lenient_reading_strict_options() {
        let r: ChatRequest = serde_json::from_value(json!({
            "model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
            "stop": "X", "frequency_penalty": 0.0, "stream": true
        }))
        .unwrap();
        assert_eq!(r.stops().unwrap(), vec!["X"]);
        assert_eq!(r.messages[0].content.as_ref().unwrap().text(0).unwrap(), "hi");
        assert!(r.unsupported().is_ok());
        let many: ChatRequest =
            serde_json::from_value(json!({"model": "m", "messages": [], "stop": ["a","b","c","d","e"], "n": 2}))
                .unwrap();
        assert_eq!(many.stops().unwrap_err().param.as_deref(), Some("stop"));
        assert_eq!(many.unsupported().unwrap_err().param.as_deref(), Some("n"));
        let image = Content::Parts(vec![ContentPart { kind: "image_url".into(), text: None }]);
        assert!(image.text(3).unwrap_err().message.contains("image_url"));
    }

    #[test]
    fn errors_have_openais_shape_and_retry_after() {
        let e = ApiError::new(StatusCode::TOO_MANY_REQUESTS, "rate_limit_error", "queue_full", "busy").retry_after(2);
        assert_eq!(e.body()["error"]["type"], "rate_limit_error");
        let resp = e.into_response();
        assert_eq!(resp.status(), 429);
        assert_eq!(resp.headers()[header::RETRY_AFTER], "2");
    }
}
