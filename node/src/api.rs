//! The operator API, served by `mindxtrain serve` beside the model routes: health and
//! readiness, Prometheus metrics, the event log (ranges, a live tail, proofs, signed
//! checkpoints), recipes and training runs (launch, cancel, resume, live events), and the
//! OpenAPI document.
//!
//! * [`auth`]: the bearer token (`node-dir/api.token`, 0600) every route that reveals payer
//!   data or changes state needs; read-only public routes stay open;
//! * [`health`], [`metrics`], [`log_routes`], [`runs`], [`openapi`].
//!
//! ```no_run
//! # async fn f(state: std::sync::Arc<mindxtrain_node::api::ApiState>) -> anyhow::Result<()> {
//! let token = std::sync::Arc::new(mindxtrain_node::api::auth::ApiToken::load_or_create(&state.node_dir)?.0);
//! let app = mindxtrain_node::api::router(state, token);
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:8080").await?;
//! axum::serve(listener, app).await?;
//! # Ok(()) }
//! ```

pub mod auth;
pub mod health;
pub mod log_routes;
pub mod metrics;
pub mod openapi;
pub mod runs;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::http::StatusCode;
use axum::middleware;
use axum::routing::{get, post};
use tower_http::timeout::TimeoutLayer;

use crate::identity::Identity;
use crate::log::EventLog;
use auth::ApiToken;
use metrics::Metrics;

/// Largest request body the operator routes read.
pub const MAX_BODY: usize = 1 << 20;

/// Longest an operator request may take to its response head (streams go on after it).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// What the operator routes share.
pub struct ApiState {
    pub log: Arc<EventLog>,
    pub identity: Arc<Identity>,
    pub node_dir: PathBuf,
    pub metrics: Arc<Metrics>,
    /// The served model's id, when one is.
    pub model: Option<String>,
    pub started: Instant,
    pub launches: runs::Launches,
}

impl ApiState {
    /// The state, with metrics following the log from its first event.
    pub fn new(log: Arc<EventLog>, identity: Arc<Identity>, node_dir: PathBuf, model: Option<String>) -> Arc<Self> {
        let metrics = Arc::new(Metrics::default());
        metrics.follow(log.clone());
        let launches = runs::Launches::default();
        Arc::new(ApiState { log, identity, node_dir, metrics, model, started: Instant::now(), launches })
    }
}

/// The operator routes (those of [`openapi::OPERATOR`]).
pub fn router(state: Arc<ApiState>, token: Arc<ApiToken>) -> Router {
    let open = Router::new()
        .route("/healthz", get(health::healthz))
        .route("/readyz", get(health::readyz))
        .route("/openapi.json", get(openapi::serve))
        .route("/api/log/proof/{seq}", get(log_routes::proof))
        .route("/api/log/consistency", get(log_routes::consistency))
        .route("/api/log/checkpoint", get(log_routes::checkpoint))
        .route("/api/recipes", get(runs::recipes))
        .route("/api/recipes/validate", post(runs::validate))
        .route("/api/runs", get(runs::list))
        .route("/api/runs/{id}", get(runs::show))
        .route("/api/runs/{id}/events", get(runs::events));
    let guarded = Router::new()
        .route("/metrics", get(metrics::render))
        .route("/api/log", get(log_routes::range))
        .route("/api/log/tail", get(log_routes::tail))
        .route("/api/log/checkpoints", post(log_routes::record_checkpoint))
        .route("/api/runs", post(runs::launch))
        .route("/api/runs/{id}/cancel", post(runs::cancel))
        .route("/api/runs/{id}/resume", post(runs::resume))
        .route_layer(middleware::from_fn_with_state(token, auth::require));
    open.merge(guarded)
        .layer(TimeoutLayer::with_status_code(StatusCode::REQUEST_TIMEOUT, REQUEST_TIMEOUT))
        .layer(DefaultBodyLimit::max(MAX_BODY))
        .with_state(state)
}

/// `app` with every request counted in `metrics` (by route pattern and status).
pub fn with_metrics(app: Router, metrics: Arc<Metrics>) -> Router {
    app.layer(middleware::from_fn_with_state(metrics, metrics::track))
}
