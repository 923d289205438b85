//! What the node has recorded, read back from its log by kind: checkpoints, evals,
//! manifests, plans, payments and rentals. Each collection is a list of event kinds; the
//! answer pages newest first through the log's kind index, so it never scans the log.

use std::sync::Arc;

use axum::Json;
use axum::http::StatusCode;
use serde::Deserialize;
use serde_json::{Value, json};

use super::ApiState;
use super::log_routes::MAX_RANGE;
use crate::log::index;
use crate::serve::openai::ApiError;

/// A kind of record and the event kinds that make it up.
#[derive(Debug, Clone, Copy)]
pub struct Collection {
    /// Where it is served (`/api/checkpoints`).
    pub path: &'static str,
    pub kinds: &'static [&'static str],
    /// Whether it reveals payer data (and so needs the token).
    pub guarded: bool,
    pub about: &'static str,
}

pub const COLLECTIONS: [Collection; 6] = [
    Collection {
        path: "/api/checkpoints",
        kinds: &["checkpoint.saved"],
        guarded: false,
        about: "Training checkpoints (step, files and their digests), newest first",
    },
    Collection {
        path: "/api/evals",
        kinds: &["eval.completed"],
        guarded: false,
        about: "Evaluation results, newest first",
    },
    Collection {
        path: "/api/manifests",
        kinds: &["manifest.sealed"],
        guarded: false,
        about: "Sealed manifests (run id, blake3, file), newest first",
    },
    Collection {
        path: "/api/plans",
        kinds: &["plan.emitted"],
        guarded: false,
        about: "AOT plans measured (digest, choices, probe time), newest first",
    },
    Collection {
        path: "/api/payments",
        kinds: &[
            "payment.verified",
            "payment.settling",
            "payment.settled",
            "payment.failed",
            "payment.served",
            "payment.rejected",
            "payment.unsettled",
            "payment.replayed",
        ],
        guarded: true,
        about: "x402 payments (payer, amount, tx), newest first",
    },
    Collection {
        path: "/api/rentals",
        kinds: &["rental.opened", "rental.used", "rental.closed", "rental.acquired"],
        guarded: true,
        about: "Rentals opened, used, closed or acquired, newest first",
    },
];

impl Collection {
    pub fn name(&self) -> &'static str {
        self.path.trim_start_matches("/api/")
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    /// Only events with seq below this (the previous page's `next_before`).
    before: Option<u64>,
    limit: Option<u64>,
    /// Only the events of this subject (a run id, a payer, a rental id).
    subject: Option<String>,
}

/// `GET /api/{collection}?before&limit&subject`: the collection's events, newest first.
pub async fn list(s: Arc<ApiState>, c: &'static Collection, q: ListQuery) -> Result<Json<Value>, ApiError> {
    tokio::task::spawn_blocking(move || page(&s, c, q)).await.map_err(unreadable)?.map(Json)
}

fn page(s: &ApiState, c: &Collection, q: ListQuery) -> Result<Value, ApiError> {
    let limit = q.limit.unwrap_or(100);
    if limit == 0 || limit > MAX_RANGE {
        return Err(ApiError::invalid("limit", format!("limit must be 1..={MAX_RANGE}")));
    }
    let seqs = seqs_of(s, c.kinds)?;
    let before = q.before.unwrap_or(u64::MAX);
    let mut events = Vec::new();
    let mut next_before = None;
    for &seq in seqs.iter().rev().filter(|&&seq| seq < before) {
        let ev = s.log.get(seq).map_err(unreadable)?;
        if q.subject.as_deref().is_some_and(|want| want != ev.envelope.subject) {
            continue;
        }
        if events.len() as u64 == limit {
            next_before = events.last().and_then(|e: &Value| e["seq"].as_u64());
            break;
        }
        events.push(ev.to_json());
    }
    Ok(json!({"collection": c.name(), "total": seqs.len(), "events": events, "next_before": next_before}))
}

/// Every seq of the given kinds, ascending.
pub fn seqs_of(s: &ApiState, kinds: &[&str]) -> Result<Vec<u64>, ApiError> {
    let mut seqs = Vec::new();
    for kind in kinds {
        let found = s.log.query(&index::Query::Kind((*kind).to_owned())).map_err(unreadable)?;
        seqs.extend(found);
    }
    seqs.sort_unstable();
    seqs.dedup();
    Ok(seqs)
}

pub fn unreadable(e: impl std::fmt::Display) -> ApiError {
    ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", "log_unreadable", e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn collection_names_are_unique_and_payer_data_is_guarded() {
        let mut names: Vec<_> = COLLECTIONS.iter().map(Collection::name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), COLLECTIONS.len());
        for c in COLLECTIONS {
            let payer_data = c.kinds.iter().any(|k| k.starts_with("payment.") || k.starts_with("rental."));
            assert_eq!(c.guarded, payer_data, "{}", c.path);
        }
    }
}
