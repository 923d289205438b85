//! AOT plans over HTTP: the probe run for a recipe (within its `autotune.budget_seconds`),
//! the plan written under `node-dir/plans/` and recorded as `plan.emitted`; a recorded plan
//! read back by its digest.
//!
//! The probe runs on a blocking thread, and the request is bounded by [`deadline`] (the
//! recipe's budget and a margin for loading the model) instead of the 30 s every other
//! operator request gets.

use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::ApiState;
use super::recipes::RecipeRef;
use super::records::{seqs_of, unreadable};
use crate::serve::openai::ApiError;
use crate::training::{self, PLAN_EMITTED};

/// Time a probe may take beyond the recipe's `autotune.budget_seconds`: loading the model
/// and data, a first untimed step on a GPU, writing and recording the plan.
pub const DEADLINE_MARGIN: Duration = Duration::from_secs(60);

/// How long `POST /api/plans` waits for the probe of a recipe with this budget.
pub fn deadline(budget_seconds: u32) -> Duration {
    Duration::from_secs(u64::from(budget_seconds)) + DEADLINE_MARGIN
}

/// `POST /api/plans`: `{recipe}` or `{yaml, name}` → the probe measured now, answered with
/// the plan and its digest once recorded (201); 408 when it takes longer than [`deadline`]
/// (the probe still finishes, and its plan is recorded as `plan.emitted`).
pub async fn measure(State(s): State<Arc<ApiState>>, Json(req): Json<RecipeRef>) -> Response {
    let (_, src, loaded) = match req.load(&s.node_dir) {
        Ok(r) => r,
        Err(rejected) => return rejected.into_response(),
    };
    let mut random = [0u8; 6];
    if let Err(e) = getrandom::fill(&mut random) {
        return unreadable(e).into_response();
    }
    let dir = s.node_dir.clone();
    let log = s.log.clone();
    let file = dir.join("plans").join(format!("{}-{}.plan.json", loaded.recipe.meta.run_name, hex::encode(random)));
    let limit = deadline(loaded.recipe.autotune.budget_seconds);
    let probe = tokio::task::spawn_blocking(move || {
        let kept = crate::recipes::store(&dir, &loaded.bytes_blake3, &src).map_err(|e| e.to_string())?;
        std::fs::create_dir_all(dir.join("plans")).map_err(|e| e.to_string())?;
        let recipe_dir = crate::fsutil::parent_dir(&kept);
        let input = training::ProbeInput { loaded: &loaded, recipe_dir, init_from: None, data: Default::default() };
        training::measure_and_record_plan(&log, input, &file, None, None).map_err(|e| e.to_string())
    });
    let Ok(measured) = tokio::time::timeout(limit, probe).await else {
        return super::timed_out(limit);
    };
    match measured {
        Ok(Ok(p)) => {
            let plan: Value = serde_json::from_slice(&p.bytes).unwrap_or(Value::Null);
            (StatusCode::CREATED, Json(json!({"blake3": hex::encode(p.blake3), "file": p.path, "plan": plan})))
                .into_response()
        }
        Ok(Err(e)) => {
            ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid_request_error", "probe_failed", e).into_response()
        }
        Err(e) => unreadable(e).into_response(),
    }
}

/// `GET /api/plans/{blake3}`: a recorded plan, as written (its digest checked).
pub async fn show(State(s): State<Arc<ApiState>>, Path(digest): Path<String>) -> Result<Json<Value>, ApiError> {
    let not_found = || {
        ApiError::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            "plan_not_found",
            format!("no plan {digest} here"),
        )
    };
    let s2 = s.clone();
    let seqs = tokio::task::spawn_blocking(move || seqs_of(&s2, &[PLAN_EMITTED])).await.map_err(unreadable)??;
    for seq in seqs.into_iter().rev() {
        let ev = s.log.get(seq).map_err(unreadable)?;
        if ev.envelope.subject != digest {
            continue;
        }
        let file = ev.envelope.data.get("file").and_then(Value::as_str).ok_or_else(not_found)?;
        let bytes = std::fs::read(file).map_err(|e| unreadable(format!("{file}: {e}")))?;
        if hex::encode(blake3::hash(&bytes).as_bytes()) != digest {
            return Err(unreadable(format!("{file} no longer hashes to {digest}")));
        }
        let plan: Value = serde_json::from_slice(&bytes).map_err(unreadable)?;
        return Ok(Json(json!({"blake3": digest, "seq": seq, "file": file, "plan": plan})));
    }
    Err(not_found())
}
