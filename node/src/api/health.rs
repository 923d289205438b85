//! Liveness and readiness.

use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use serde_json::{Value, json};

use super::ApiState;

/// `GET /healthz`: the process answers.
pub async fn healthz(State(s): State<Arc<ApiState>>) -> Json<Value> {
    Json(json!({"status": "ok", "software": crate::SOFTWARE, "uptime_s": s.started.elapsed().as_secs()}))
}

/// `GET /readyz`: 200 while the log accepts appends; 503 with the reason once its writer
/// has stopped (after an fsync failure nothing more can be recorded, so nothing should be
/// sold or trained here).
pub async fn readyz(State(s): State<Arc<ApiState>>) -> (StatusCode, Json<Value>) {
    match s.log.stopped() {
        None => (StatusCode::OK, Json(json!({"ready": true, "log_size": s.log.len(), "model": s.model}))),
        Some(reason) => (StatusCode::SERVICE_UNAVAILABLE, Json(json!({"ready": false, "reason": reason}))),
    }
}
