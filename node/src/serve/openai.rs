//! The OpenAI chat-completions (and legacy completions) wire format, as far as this server implements it, and the
//! OpenAI error body.
//!
//! * [`params`]: every request parameter and message field, honoured or refused (one table,
//!   listed in docs/formats.md);
//! * [`request`]: a body read strictly by that table; [`messages`]: its conversation and tools;
//! * [`response`]: completions and stream chunks;
//! * [`completion`]: a `POST /v1/completions` body (legacy completions, by its own table);
//! * [`tokenize`]: `POST /tokenize` and `/detokenize` bodies (vLLM's shapes, by their tables).
//!
//! Nothing a client sends is silently ignored: a parameter is carried out, or accepted only at
//! the value that changes nothing, or a 400 naming it (`param`), as OpenAI's own API answers a
//! parameter it does not know.

pub mod completion;
pub mod messages;
pub mod params;
pub mod request;
pub mod response;
pub mod tokenize;

use axum::Json;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

pub use request::ChatRequest;

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

    /// A parameter no table here defines, in the words of OpenAI's own API.
    pub fn unrecognized(param: &str) -> ApiError {
        ApiError {
            code: "unknown_parameter",
            ..ApiError::invalid(param, format!("Unrecognized request argument supplied: {param}"))
        }
    }

    /// A parameter (or value) that means something this server does not do yet.
    pub fn unsupported(param: &str, message: impl Into<String>) -> ApiError {
        ApiError { code: "unsupported_parameter", ..ApiError::invalid(param, message) }
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
    fn errors_have_openais_shape_and_retry_after() {
        let e = ApiError::new(StatusCode::TOO_MANY_REQUESTS, "rate_limit_error", "queue_full", "busy").retry_after(2);
        assert_eq!(e.body()["error"]["type"], "rate_limit_error");
        let resp = e.into_response();
        assert_eq!(resp.status(), 429);
        assert_eq!(resp.headers()[header::RETRY_AFTER], "2");
        let e = ApiError::unrecognized("foo").body();
        assert_eq!(e["error"]["message"], "Unrecognized request argument supplied: foo");
        assert_eq!(
            (e["error"]["param"].as_str(), e["error"]["type"].as_str()),
            (Some("foo"), Some("invalid_request_error"))
        );
    }
}
