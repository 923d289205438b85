//! `GET /v1/models`, `GET /v1/models/{id}` and `POST /v1/chat/completions` (whole or
//! streamed as server-sent events), with rental tokens standing in for payment.

use std::ops::ControlFlow;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use mindxtrain_trainer::generate::Sampling;
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use super::model::{Job, Outcome};
use super::openai::{ApiError, ChatRequest, Usage, chunk_body, completion_body, usage_chunk_body};
use super::queue::{Refused, Slot};
use super::rentals::{RentalError, Reservation};
use super::{AppState, ChatPrice, unix_now};
use mindxtrain_x402::{Quote, SettleWhen};

pub async fn list_models(State(s): State<Arc<AppState>>) -> Json<Value> {
    let data: Vec<Value> = s.model.model_ids().iter().map(|id| model_object(&s, id)).collect();
    Json(json!({"object": "list", "data": data}))
}

pub async fn get_model(State(s): State<Arc<AppState>>, Path(id): Path<String>) -> Response {
    if s.model.resolve(&id).is_none() {
        return model_not_found(&id).into_response();
    }
    Json(model_object(&s, &id)).into_response()
}

fn model_object(s: &AppState, id: &str) -> Value {
    json!({"id": id, "object": "model", "created": s.model.loaded_at, "owned_by": "mindxtrain"})
}

fn model_not_found(id: &str) -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, "invalid_request_error", "model_not_found", format!("no model {id:?} here"))
}

/// The rental token a request carries as its bearer token, if any. Other bearer tokens
/// are ignored: OpenAI clients always send one (their API key), and here it means nothing.
pub fn rental_token(headers: &HeaderMap) -> Option<&str> {
    let token = headers.get(header::AUTHORIZATION)?.to_str().ok()?.strip_prefix("Bearer ")?.trim();
    token.starts_with(super::rentals::TOKEN_PREFIX).then_some(token)
}

/// A chat request read once on the paid path (parsed, checked, tokenized), handed to the
/// handler in the request's extensions so the answer does not read it again.
#[derive(Clone)]
pub struct PreparedChat(Arc<(ChatRequest, Job)>);

/// Prices a paid chat request: what it costs, and when it settles (a stream before its first
/// byte, a whole answer after it is complete). A request this model cannot answer is refused
/// here, before any payment is asked for.
pub fn prepare_paid(s: &AppState, price: ChatPrice, body: &[u8]) -> Result<Quote, ApiError> {
    let req = parse(body)?;
    let job = prepare(s, &req)?;
    let settle = if req.stream { SettleWhen::AfterHead } else { SettleWhen::AfterBody };
    let mut quote = Quote::new(price.amount(job.prompt_ids.len() + job.max_tokens), settle);
    quote.extensions.insert(PreparedChat(Arc::new((req, job))));
    Ok(quote)
}

fn parse(body: &[u8]) -> Result<ChatRequest, ApiError> {
    serde_json::from_slice(body).map_err(|e| ApiError::invalid("body", format!("not a chat request: {e}")))
}

pub async fn completions(
    State(s): State<Arc<AppState>>,
    prepared: Option<Extension<PreparedChat>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let prepared = match prepared {
        Some(Extension(PreparedChat(p))) => Ok(p),
        None => parse(&body).and_then(|req| prepare(&s, &req).map(|job| Arc::new((req, job)))),
    };
    match prepared {
        Ok(p) => completion(s, &headers, &p.0, p.1.clone()).await.unwrap_or_else(|e| e.into_response()),
        Err(e) => e.into_response(),
    }
}

async fn completion(s: Arc<AppState>, headers: &HeaderMap, req: &ChatRequest, job: Job) -> Result<Response, ApiError> {
    let rental = match rental_token(headers) {
        Some(token) => Some(s.rentals.reserve(token, &req.model, unix_now()).map_err(rental_refusal)?),
        None => None,
    };
    let slot = s.admission.enter(job.prompt_ids.len() + job.max_tokens).await.map_err(|r| match r {
        Refused::Busy { retry_after } => ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "rate_limit_error",
            "queue_full",
            "the model is busy: its generation slots and queue, or its KV-cache budget, are full",
        )
        .retry_after(retry_after),
        Refused::Closed => ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "server_error",
            "shutting_down",
            "the server is shutting down",
        )
        .retry_after(5),
    })?;
    let prompt_tokens = job.prompt_ids.len();
    let meta = Meta { id: completion_id(), created: unix_now(), model: req.model.clone() };
    if req.stream {
        let include_usage = req.stream_options.is_some_and(|o| o.include_usage);
        return Ok(stream(s, job, slot, rental, meta, include_usage));
    }
    let model = s.model.clone();
    let outcome = tokio::task::spawn_blocking(move || {
        let _slot = slot;
        model.complete(&job, |_| ControlFlow::Continue(()))
    })
    .await
    .map_err(|e| internal(e.to_string()))?
    .map_err(|e| internal(e.to_string()))?;
    let usage = Usage::new(prompt_tokens, outcome.completion_tokens);
    if let Some(r) = rental {
        r.finish(json!(usage)).await.map_err(|e| internal(e.to_string()))?;
    }
    let body = completion_body(&meta.id, meta.created, &meta.model, &outcome.text, outcome.finish_reason, usage);
    Ok(Json(body).into_response())
}

/// Checks a request against the model and turns it into a [`Job`].
fn prepare(s: &AppState, req: &ChatRequest) -> Result<Job, ApiError> {
    let adapter = s.model.resolve(&req.model).ok_or_else(|| model_not_found(&req.model))?;
    req.unsupported()?;
    if req.messages.is_empty() {
        return Err(ApiError::invalid("messages", "at least one message is required"));
    }
    let mut messages = Vec::with_capacity(req.messages.len());
    for (i, m) in req.messages.iter().enumerate() {
        let text = match &m.content {
            Some(c) => c.text(i)?,
            None => String::new(),
        };
        messages.push((m.role.clone(), text));
    }
    let sampling = Sampling {
        temperature: req.temperature.unwrap_or(1.0),
        top_p: req.top_p.unwrap_or(1.0),
        seed: req.seed.unwrap_or_else(random_seed),
    };
    sampling
        .validate()
        .map_err(|m| ApiError::invalid(if m.starts_with("top_p") { "top_p" } else { "temperature" }, m))?;
    let prompt_ids = s.model.prompt_ids(&messages).map_err(|e| ApiError::invalid("messages", e.to_string()))?;
    let context = s.model.context;
    if prompt_ids.len() >= context {
        return Err(ApiError {
            code: "context_length_exceeded",
            ..ApiError::invalid(
                "messages",
                format!("the prompt is {} tokens; this model's context is {context}", prompt_ids.len()),
            )
        });
    }
    let room = context - prompt_ids.len();
    let max_tokens = match req.max_completion_tokens.or(req.max_tokens) {
        Some(0) => return Err(ApiError::invalid("max_tokens", "must be at least 1")),
        Some(n) => (n as usize).min(room),
        None => room,
    };
    Ok(Job { prompt_ids, max_tokens, sampling, stops: req.stops()?, adapter })
}

struct Meta {
    id: String,
    created: u64,
    model: String,
}

fn stream(
    s: Arc<AppState>,
    job: Job,
    slot: Slot,
    rental: Option<Reservation>,
    meta: Meta,
    include_usage: bool,
) -> Response {
    // A failed generation ends the body with an error after its error chunk, so a paid
    // stream that did not complete is not counted as delivered (and stays redeemable).
    let (tx, rx) = mpsc::channel::<Result<Event, std::io::Error>>(64);
    let model = s.model.clone();
    let prompt_tokens = job.prompt_ids.len();
    let generation = tokio::task::spawn_blocking(move || {
        let _slot = slot;
        let send = |v: Value| tx.blocking_send(Ok(Event::default().data(v.to_string()))).is_ok();
        send(chunk_body(&meta.id, meta.created, &meta.model, json!({"role": "assistant", "content": ""}), None));
        let result = model.complete(&job, |text| {
            let delta = chunk_body(&meta.id, meta.created, &meta.model, json!({"content": text}), None);
            if send(delta) { ControlFlow::Continue(()) } else { ControlFlow::Break(()) }
        });
        match &result {
            Ok(o) => {
                send(chunk_body(&meta.id, meta.created, &meta.model, json!({}), Some(o.finish_reason)));
                if include_usage {
                    let usage = Usage::new(prompt_tokens, o.completion_tokens);
                    send(usage_chunk_body(&meta.id, meta.created, &meta.model, usage));
                }
                let _ = tx.blocking_send(Ok(Event::default().data("[DONE]")));
            }
            Err(e) => {
                send(internal(e.to_string()).body());
                let _ = tx.blocking_send(Err(std::io::Error::other(e.to_string())));
            }
        }
        result
    });
    tokio::spawn(async move {
        if let (Ok(Ok(Outcome { completion_tokens, .. })), Some(r)) = (generation.await, rental) {
            let usage = Usage::new(prompt_tokens, completion_tokens);
            if let Err(e) = r.finish(json!(usage)).await {
                tracing::error!(error = %e, "rental use not recorded");
            }
        }
    });
    Sse::new(ReceiverStream::new(rx)).keep_alive(KeepAlive::default()).into_response()
}

fn rental_refusal(e: RentalError) -> ApiError {
    let (status, code) = match &e {
        RentalError::BadToken | RentalError::Unknown(_) => (StatusCode::UNAUTHORIZED, "invalid_rental_token"),
        RentalError::Closed { .. } => (StatusCode::FORBIDDEN, "rental_closed"),
        RentalError::WrongModel { .. } => (StatusCode::FORBIDDEN, "rental_wrong_model"),
        RentalError::UsedUp(_) => (StatusCode::FORBIDDEN, "rental_used_up"),
        RentalError::Log(_) => (StatusCode::INTERNAL_SERVER_ERROR, "log_unavailable"),
    };
    ApiError::new(status, "invalid_request_error", code, e.to_string())
}

/// A failed generation: the whole error (a device error may carry a backtrace) goes to the
/// operator's log, its first line to the client.
fn internal(message: String) -> ApiError {
    tracing::error!(error = %message, "generation failed");
    let first = message.lines().next().unwrap_or("generation failed").to_string();
    ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", "generation_failed", first)
}

fn completion_id() -> String {
    let mut b = [0u8; 12];
    let _ = getrandom::fill(&mut b);
    format!("chatcmpl-{}", hex::encode(b))
}

fn random_seed() -> u64 {
    let mut b = [0u8; 8];
    let _ = getrandom::fill(&mut b);
    u64::from_le_bytes(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_generation_tells_the_client_its_first_line_only() {
        let e = internal("tensor op: matmul is only supported for contiguous tensors\n   0: <unknown>\n   1: x".into());
        assert_eq!(e.body()["error"]["message"], "tensor op: matmul is only supported for contiguous tensors");
        assert_eq!(e.body()["error"]["code"], "generation_failed");
    }
}
