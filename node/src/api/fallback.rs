//! Requests no route serves, answered in the error shape of every other answer of the node
//! (OpenAI's `{"error": {message, type, param, code}}`): an unknown path is a 404 `unknown_url`
//! as OpenAI's own API answers one, a served path asked with another method a 405 (with axum's
//! `Allow` header). Without this, axum answers both with an empty body, which OpenAI clients
//! report as an unreadable error.

use axum::Router;
use axum::http::{Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};

use crate::serve::openai::ApiError;

/// `app` with both fallbacks. Call it once every route is in: the 405 answer is set on the
/// routes present.
pub fn with_fallbacks(app: Router) -> Router {
    app.fallback(unknown_url).method_not_allowed_fallback(method_not_allowed)
}

async fn unknown_url(method: Method, uri: Uri) -> Response {
    let message = format!(
        "Unknown request URL: {method} {}. The routes this node serves are listed in /openapi.json.",
        uri.path()
    );
    ApiError::new(StatusCode::NOT_FOUND, "invalid_request_error", "unknown_url", message).into_response()
}

async fn method_not_allowed(method: Method, uri: Uri) -> Response {
    let message = format!("{} does not answer {method}; the Allow header lists what it answers", uri.path());
    ApiError::new(StatusCode::METHOD_NOT_ALLOWED, "invalid_request_error", "method_not_allowed", message)
        .into_response()
}

#[cfg(test)]
mod tests {
    use axum::body::{Body, to_bytes};
    use axum::http::{Request, header};
    use axum::routing::get;
    use serde_json::{Value, json};
    use tower::ServiceExt;

    use super::*;

    async fn ask(app: &Router, method: &str, path: &str) -> (StatusCode, Option<String>, Value) {
        let req = Request::builder().method(method).uri(path).body(Body::empty()).unwrap();
        let resp = app.clone().oneshot(req).await.unwrap();
        let allow = resp.headers().get(header::ALLOW).map(|v| v.to_str().unwrap().to_owned());
        let status = resp.status();
        let body = serde_json::from_slice(&to_bytes(resp.into_body(), 1 << 16).await.unwrap()).unwrap();
        (status, allow, body)
    }

    #[tokio::test]
    async fn unknown_paths_and_methods_answer_openais_error_shape() {
        let nested = Router::new().route("/supported", get(|| async { "ok" }));
        let app =
            with_fallbacks(Router::new().route("/v1/models", get(|| async { "[]" })).nest("/facilitator", nested));
        let (status, _, body) = ask(&app, "GET", "/v1/nothing").await;
        assert_eq!(status, 404);
        assert_eq!(body["error"]["type"], "invalid_request_error");
        assert_eq!((&body["error"]["param"], &body["error"]["code"]), (&Value::Null, &json!("unknown_url")));
        assert!(body["error"]["message"].as_str().unwrap().starts_with("Unknown request URL: GET /v1/nothing."));
        for path in ["/v1/models", "/facilitator/supported"] {
            let (status, allow, body) = ask(&app, "DELETE", path).await;
            assert_eq!(status, 405, "{path}");
            assert_eq!(body["error"]["code"], "method_not_allowed", "{path}");
            assert!(allow.is_some_and(|a| a.contains("GET")), "{path}: the Allow header");
        }
    }
}
