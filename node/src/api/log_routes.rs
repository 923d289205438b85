//! The event log over HTTP: a range of events, a live tail (SSE), inclusion and
//! consistency proofs, and a freshly signed checkpoint.

use std::convert::Infallible;
use std::sync::Arc;

use axum::Json;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Value, json};
use tokio_stream::wrappers::ReceiverStream;

use super::ApiState;
use crate::log::proofs::{self, ProofError};
use crate::log::{Event, EventLog};
use crate::serve::openai::ApiError;

/// Most events one range answer holds.
pub const MAX_RANGE: u64 = 1000;

#[derive(Debug, Deserialize)]
pub struct RangeQuery {
    #[serde(default)]
    from: u64,
    limit: Option<u64>,
    /// Only events whose kind starts with this (`payment.`).
    kind: Option<String>,
}

/// `GET /api/log?from&limit&kind`: events `from..from+limit` (at most 1000), optionally
/// only those of a kind; `next` is where the following page starts.
pub async fn range(State(s): State<Arc<ApiState>>, Query(q): Query<RangeQuery>) -> Result<Json<Value>, ApiError> {
    let limit = q.limit.unwrap_or(100);
    if limit == 0 || limit > MAX_RANGE {
        return Err(ApiError::invalid("limit", format!("limit must be 1..={MAX_RANGE}")));
    }
    let size = s.log.len();
    let to = q.from.saturating_add(limit).min(size);
    let events = read(&s.log, q.from, to)?;
    let events: Vec<Value> = events
        .iter()
        .filter(|e| q.kind.as_deref().is_none_or(|k| e.envelope.kind.starts_with(k)))
        .map(Event::to_json)
        .collect();
    Ok(Json(json!({"size": size, "from": q.from, "next": to.max(q.from), "events": events})))
}

fn read(log: &EventLog, from: u64, to: u64) -> Result<Vec<Event>, ApiError> {
    log.read(|v| v.range(from, to))
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", "log_unreadable", e.to_string()))
}

#[derive(Debug, Deserialize)]
pub struct TailQuery {
    /// First seq to send (default: only events appended from now on).
    from: Option<u64>,
}

/// `GET /api/log/tail?from`: every event from `from` (or from now), then each new one as
/// it becomes durable, as server-sent events (`id` = seq, `event` = kind). A reconnecting
/// client's `Last-Event-ID` resumes after the last one it saw.
pub async fn tail(State(s): State<Arc<ApiState>>, Query(q): Query<TailQuery>, headers: HeaderMap) -> Response {
    let resume = headers.get("last-event-id").and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok());
    let from = resume.map(|seq| seq + 1).or(q.from).unwrap_or_else(|| s.log.len());
    event_stream(s.log.clone(), from, |_| true)
}

/// Server-sent events of the log from `from` on, those `keep` accepts, until the client
/// leaves. Runs' event streams use it too.
pub fn event_stream(log: Arc<EventLog>, from: u64, keep: impl Fn(&Event) -> bool + Send + Sync + 'static) -> Response {
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<SseEvent, Infallible>>(64);
    tokio::spawn(async move {
        let mut changed = log.subscribe();
        let mut next = from;
        loop {
            let size = log.len();
            while next < size {
                let to = (next + 256).min(size);
                let Ok(batch) = log.read(|v| v.range(next, to)) else { return };
                for ev in batch.iter().filter(|e| keep(e)) {
                    let sse = SseEvent::default()
                        .id(ev.envelope.seq.to_string())
                        .event(ev.envelope.kind.clone())
                        .data(ev.to_json().to_string());
                    if tx.send(Ok(sse)).await.is_err() {
                        return;
                    }
                }
                next = to;
            }
            tokio::select! {
                r = changed.changed() => if r.is_err() { return },
                () = tx.closed() => return,
            }
        }
    });
    Sse::new(ReceiverStream::new(rx)).keep_alive(KeepAlive::default()).into_response()
}

#[derive(Debug, Deserialize)]
pub struct SizeQuery {
    size: Option<u64>,
}

/// `GET /api/log/proof/{seq}?size`: the inclusion proof of one event (default: in the
/// whole log), self-checked.
pub async fn proof(
    State(s): State<Arc<ApiState>>,
    Path(seq): Path<u64>,
    Query(q): Query<SizeQuery>,
) -> Result<Json<Value>, ApiError> {
    let size = q.size.unwrap_or_else(|| s.log.len());
    s.log.read(|v| proofs::inclusion(v, seq, size)).map(Json).map_err(proof_error)
}

#[derive(Debug, Deserialize)]
pub struct ConsistencyQuery {
    old: u64,
    size: Option<u64>,
}

/// `GET /api/log/consistency?old&size`: the tree of `old` events is a prefix of `size`'s.
pub async fn consistency(
    State(s): State<Arc<ApiState>>,
    Query(q): Query<ConsistencyQuery>,
) -> Result<Json<Value>, ApiError> {
    let size = q.size.unwrap_or_else(|| s.log.len());
    s.log.read(|v| proofs::consistency(v, q.old, size)).map(Json).map_err(proof_error)
}

/// `GET /api/log/checkpoint`: the log's current size and root in a signed note (C2SP
/// tlog-checkpoint), signed now; nothing is appended.
pub async fn checkpoint(State(s): State<Arc<ApiState>>) -> Result<Json<Value>, ApiError> {
    s.log.read(|v| proofs::signed_checkpoint(v, &s.identity)).map(|(_, doc)| Json(doc)).map_err(proof_error)
}

/// `POST /api/log/checkpoints`: signs a checkpoint of the whole log and records it as
/// `log.checkpointed` (an item the anchorer will put on chain).
pub async fn record_checkpoint(State(s): State<Arc<ApiState>>) -> Result<Json<Value>, ApiError> {
    let (log, id) = (s.log.clone(), s.identity.clone());
    let recorded = tokio::task::spawn_blocking(move || crate::anchor::run::checkpoint_log(&log, &id)).await;
    let failed = |m: String| ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "server_error", "not_recorded", m);
    let (cp, note, appended) = recorded.map_err(|e| failed(e.to_string()))?.map_err(|e| failed(e.to_string()))?;
    Ok(Json(
        json!({"origin": cp.origin, "size": cp.size, "root": hex::encode(cp.root), "note": note, "seq": appended.seq}),
    ))
}

fn proof_error(e: ProofError) -> ApiError {
    match e {
        ProofError::OutOfRange { .. } | ProofError::TooLarge { .. } => {
            ApiError::new(StatusCode::NOT_FOUND, "invalid_request_error", "out_of_range", e.to_string())
        }
        ProofError::BadSizes { .. } => ApiError::invalid("old", e.to_string()),
        ProofError::Read(m) => ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", "log_unreadable", m),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::Identity;
    use crate::log::LogOptions;
    use axum::response::IntoResponse;

    #[test]
    fn a_consistency_query_from_an_empty_or_larger_tree_is_the_callers_error() {
        let dir = tempfile::tempdir().unwrap();
        let id = Identity::from_seed([4; 32]);
        let (log, _) = EventLog::create(dir.path(), id.clone(), LogOptions::default()).unwrap();
        let rt = tokio::runtime::Runtime::new().unwrap();
        let state = rt.block_on(async { ApiState::new(Arc::new(log), Arc::new(id), dir.path().into(), None, false) });
        let status = |old, size| {
            let q = Query(ConsistencyQuery { old, size });
            match rt.block_on(consistency(State(state.clone()), q)) {
                Ok(_) => StatusCode::OK,
                Err(e) => e.into_response().status(),
            }
        };
        assert_eq!(status(0, Some(0)), StatusCode::BAD_REQUEST);
        assert_eq!(status(0, None), StatusCode::BAD_REQUEST);
        assert_eq!(status(2, Some(1)), StatusCode::BAD_REQUEST);
        assert_eq!(status(1, Some(5)), StatusCode::NOT_FOUND, "a tree the log does not have yet");
        assert_eq!(status(1, Some(1)), StatusCode::OK);
    }
}
