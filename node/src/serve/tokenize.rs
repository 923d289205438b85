//! `POST /tokenize`, `POST /detokenize` and `GET /tokenizer_info`, as vLLM serves them: a
//! client counts, splits and joins tokens exactly as this server does, with no tokenizer of its
//! own (lm-evaluation-harness detects these routes and uses them as its `remote` tokenizer).
//! Free: nothing runs on the model.

use std::sync::Arc;

use axum::Json;
use axum::body::Bytes;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::AppState;
use super::chat::model_not_found;
use super::openai::ApiError;
use super::openai::request::Allowed;
use super::openai::tokenize::{DetokenizeRequest, TokenizeInput, TokenizeRequest};

pub async fn tokenize(State(s): State<Arc<AppState>>, body: Bytes) -> Response {
    answer(tokenize_body(&s, &body))
}

pub async fn detokenize(State(s): State<Arc<AppState>>, body: Bytes) -> Response {
    answer(detokenize_body(&s, &body))
}

/// The tokenizer's specials (from its `tokenizer_config.json`; the byte tokenizer's own) and
/// the context a request may use.
pub async fn tokenizer_info(State(s): State<Arc<AppState>>) -> Json<Value> {
    let tokenizer = s.model.tokenizer();
    let mut info = serde_json::Map::new();
    for name in ["bos_token", "eos_token", "pad_token", "unk_token"] {
        info.insert(name.into(), Value::Null);
    }
    for (name, value) in tokenizer.template_vars() {
        if let Some(text) = value.as_str() {
            info.insert(name, Value::from(text));
        }
    }
    if info["pad_token"].is_null() {
        // Qwen's tokenizers have none and pad with `<|endoftext|>`, as the engine does.
        info.insert(
            "pad_token".into(),
            tokenizer.decode(&[tokenizer.pad_id()], false).map(Value::from).unwrap_or_default(),
        );
    }
    info.insert("model_max_length".into(), json!(s.model.context));
    info.insert("vocab_size".into(), json!(tokenizer.vocab_size()));
    info.insert("tokenizer".into(), json!(tokenizer.identity()));
    Json(Value::Object(info))
}

fn answer(result: Result<Value, ApiError>) -> Response {
    match result {
        Ok(v) => Json(v).into_response(),
        Err(e) => e.into_response(),
    }
}

fn check_model(s: &AppState, model: Option<&str>) -> Result<(), ApiError> {
    match model {
        Some(id) if s.model.resolve(id).is_none() => Err(model_not_found(id)),
        _ => Ok(()),
    }
}

fn tokenize_body(s: &AppState, body: &[u8]) -> Result<Value, ApiError> {
    let req = TokenizeRequest::read(body, Allowed { tool_calls: s.model.recipe.serve.tool_calls })?;
    check_model(s, req.model.as_deref())?;
    let tokens = match &req.input {
        TokenizeInput::Text { text, add_special_tokens } => s
            .model
            .tokenizer()
            .encode_as_hf(text, *add_special_tokens)
            .map_err(|e| ApiError::invalid("prompt", e.to_string()))?,
        TokenizeInput::Chat { messages, tools } => {
            s.model.prompt(messages, tools).map_err(|e| ApiError::invalid("messages", e.to_string()))?.ids
        }
    };
    Ok(json!({"count": tokens.len(), "max_model_len": s.model.context, "tokens": tokens}))
}

fn detokenize_body(s: &AppState, body: &[u8]) -> Result<Value, ApiError> {
    let req = DetokenizeRequest::read(body)?;
    check_model(s, req.model.as_deref())?;
    let text = s.model.decode(&req.tokens).map_err(|e| ApiError::invalid("tokens", e.to_string()))?;
    Ok(json!({"prompt": text}))
}
