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
use mindxtrain_trainer::infer::SamplingParams;
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use super::answer::{Answer, AnswerParser, Delta, Format};
use super::model::{Job, Outcome};
use super::openai::request::Allowed;
use super::openai::response::Meta;
use super::openai::{ApiError, ChatRequest, Usage};
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

pub(super) fn model_not_found(id: &str) -> ApiError {
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
pub struct PreparedChat(Arc<Prepared>);

/// A request ready for the engine: what to generate, and how to read the answer.
pub struct Prepared {
    req: ChatRequest,
    job: Job,
    format: Format,
}

/// Prices a paid chat request: what it costs, and when it settles (a stream before its first
/// byte, a whole answer after it is complete). A request this model cannot answer is refused
/// here, before any payment is asked for.
pub fn prepare_paid(s: &AppState, price: ChatPrice, body: &[u8]) -> Result<Quote, ApiError> {
    let p = prepare(s, body)?;
    let settle = if p.req.stream { SettleWhen::AfterHead } else { SettleWhen::AfterBody };
    let mut quote = Quote::new(price.amount(p.job.prompt_ids.len() + p.job.max_tokens), settle);
    quote.extensions.insert(PreparedChat(Arc::new(p)));
    Ok(quote)
}

pub async fn completions(
    State(s): State<Arc<AppState>>,
    prepared: Option<Extension<PreparedChat>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let prepared = match prepared {
        Some(Extension(PreparedChat(p))) => Ok(p),
        None => prepare(&s, &body).map(Arc::new),
    };
    match prepared {
        Ok(p) => completion(s, &headers, &p).await.unwrap_or_else(|e| e.into_response()),
        Err(e) => e.into_response(),
    }
}

async fn completion(s: Arc<AppState>, headers: &HeaderMap, p: &Prepared) -> Result<Response, ApiError> {
    let (req, job) = (&p.req, p.job.clone());
    let rental = match rental_token(headers) {
        Some(token) => Some(s.rentals.reserve(token, &req.model, unix_now()).map_err(rental_refusal)?),
        None => None,
    };
    let slot = admit(&s, job.prompt_ids.len() + job.max_tokens).await?;
    let prompt_tokens = job.prompt_ids.len();
    let meta = Meta { id: completion_id(), created: unix_now(), model: req.model.clone() };
    if req.stream {
        return Ok(stream(s, job, p.format.clone(), slot, rental, meta, req.include_usage));
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
    let answer = Answer::parse(&p.format, &outcome.text);
    Ok(Json(meta.completion(&answer, outcome.finish_reason, usage)).into_response())
}

/// Reads a request and checks it against the model: the engine's [`Job`] and how to read
/// its answer.
fn prepare(s: &AppState, body: &[u8]) -> Result<Prepared, ApiError> {
    let serve = &s.model.recipe.serve;
    let req = ChatRequest::read(body, Allowed { tool_calls: serve.tool_calls })?;
    let adapter = s.model.resolve(&req.model).ok_or_else(|| model_not_found(&req.model))?;
    let sampling = SamplingParams {
        temperature: req.temperature,
        top_p: req.top_p,
        top_k: req.top_k,
        seed: req.seed.unwrap_or_else(random_seed),
    };
    sampling
        .validate()
        .map_err(|m| ApiError::invalid(if m.starts_with("top_p") { "top_p" } else { "temperature" }, m))?;
    let prompt = s.model.prompt(&req.messages, &req.tools).map_err(|e| ApiError::invalid("messages", e.to_string()))?;
    let context = s.model.context;
    if prompt.ids.len() >= context {
        return Err(ApiError {
            code: "context_length_exceeded",
            ..ApiError::invalid(
                "messages",
                format!("the prompt is {} tokens; this model's context is {context}", prompt.ids.len()),
            )
        });
    }
    let room = context - prompt.ids.len();
    let max_tokens = req.max_tokens.map_or(room, |n| (n as usize).min(room));
    let format = Format { reasoning: serve.reasoning, think_open: prompt.think_open, tools: req.tool_names.clone() };
    let job = Job { prompt_ids: prompt.ids, max_tokens, sampling, stops: req.stop.clone(), adapter };
    Ok(Prepared { req, job, format })
}

fn stream(
    s: Arc<AppState>,
    job: Job,
    format: Format,
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
        send(meta.chunk(json!({"role": "assistant", "content": ""}), None));
        let mut parser = AnswerParser::new(&format);
        let mut made_calls = false;
        let mut send_deltas = |deltas: Vec<Delta>| {
            deltas.iter().all(|d| {
                made_calls |= matches!(d, Delta::ToolCall(_));
                send(meta.delta_chunk(d))
            })
        };
        // A client gone is noticed at its next token even while the parser holds text back
        // (inside a tool-call block nothing is sent until it closes).
        let result = model.complete(&job, |text| {
            if send_deltas(parser.push(text)) && !tx.is_closed() {
                ControlFlow::Continue(())
            } else {
                ControlFlow::Break(())
            }
        });
        match &result {
            Ok(o) => {
                send_deltas(parser.finish());
                send(meta.finish_chunk(made_calls, o.finish_reason));
                if include_usage {
                    send(meta.usage_chunk(Usage::new(prompt_tokens, o.completion_tokens)));
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

/// A generation slot for a request that may use `tokens` tokens, or the 429/503 that says why
/// not.
pub(super) async fn admit(s: &AppState, tokens: usize) -> Result<Slot, ApiError> {
    s.admission.enter(tokens).await.map_err(|r| match r {
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
    })
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
pub(super) fn internal(message: String) -> ApiError {
    tracing::error!(error = %message, "generation failed");
    let first = message.lines().next().unwrap_or("generation failed").to_string();
    ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", "generation_failed", first)
}

fn completion_id() -> String {
    format!("chatcmpl-{}", random_id())
}

/// 24 random hex digits: the unique part of a completion's id.
pub(super) fn random_id() -> String {
    let mut b = [0u8; 12];
    let _ = getrandom::fill(&mut b);
    hex::encode(b)
}

pub(super) fn random_seed() -> u64 {
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
