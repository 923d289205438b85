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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::Identity;
    use crate::log::{AppendRequest, EventLog, LogOptions};

    #[test]
    fn readiness_turns_503_with_the_reason_once_the_log_stops() {
        let dir = tempfile::tempdir().unwrap();
        let id = Identity::from_seed([3; 32]);
        let (log, _) = EventLog::create(dir.path(), id.clone(), LogOptions::default()).unwrap();
        let log = Arc::new(log);
        let rt = tokio::runtime::Runtime::new().unwrap();
        let state = rt.block_on(async { ApiState::new(log.clone(), Arc::new(id), dir.path().into(), None, false) });
        let (status, Json(body)) = rt.block_on(readyz(State(state.clone())));
        assert_eq!(status, StatusCode::OK);
        assert_eq!(body["ready"], true);

        log.fail_next_sync(std::io::ErrorKind::Other);
        assert!(log.append(AppendRequest::new("a.b", "s", json!({}))).is_err());
        let (status, Json(body)) = rt.block_on(readyz(State(state)));
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(body["ready"], false);
        assert!(body["reason"].as_str().unwrap().contains("fdatasync failed"), "{body}");
    }
}
