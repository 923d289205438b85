//! The operator API, served by `mindxtrain serve` beside the model routes: health and
//! readiness, Prometheus metrics, the event log (ranges, a live tail, proofs, signed
//! checkpoints), recipes and training runs (launch, cancel, resume, live events), and the
//! OpenAPI document.
//!
//! * [`auth`]: the bearer token (`node-dir/api.token`, 0600) or an ed25519-signed request
//!   ([`signed`]) every route that reveals payer data or changes state needs; read-only
//!   public routes stay open;
//! * [`health`], [`metrics`], [`log_routes`], [`runs`], [`openapi`].
//!
//! ```no_run
//! # async fn f(state: std::sync::Arc<mindxtrain_node::api::ApiState>) -> anyhow::Result<()> {
//! use mindxtrain_node::api::{auth, signed};
//! let token = auth::ApiToken::load_or_create(&state.node_dir)?.0;
//! let keys = signed::Keyring::load(&state.node_dir, &state.identity).map_err(anyhow::Error::msg)?;
//! let app = mindxtrain_node::api::router(state, std::sync::Arc::new(auth::Credentials { token, keys }));
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:8080").await?;
//! axum::serve(listener, app).await?;
//! # Ok(()) }
//! ```

pub mod auth;
pub mod health;
pub mod log_routes;
pub mod metrics;
pub mod openapi;
pub mod plans;
pub mod receipts;
pub mod recipes;
pub mod records;
pub mod runs;
pub mod signed;
pub mod ui;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::{DefaultBodyLimit, Query, State};
use axum::http::StatusCode;
use axum::middleware;
use axum::routing::{get, post};
use tower_http::timeout::TimeoutLayer;

use crate::identity::Identity;
use crate::log::EventLog;
use auth::Credentials;
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
    /// On-chain receipt checks go one at a time (each may start a read-only anvil).
    pub chain_checks: tokio::sync::Mutex<()>,
}

impl ApiState {
    /// The state, with metrics following the log from its first event.
    pub fn new(log: Arc<EventLog>, identity: Arc<Identity>, node_dir: PathBuf, model: Option<String>) -> Arc<Self> {
        let metrics = Arc::new(Metrics::default());
        metrics.follow(log.clone());
        let launches = runs::Launches::default();
        let chain_checks = tokio::sync::Mutex::new(());
        Arc::new(ApiState { log, identity, node_dir, metrics, model, started: Instant::now(), launches, chain_checks })
    }
}

/// The operator routes (those of [`openapi::routes`]).
pub fn router(state: Arc<ApiState>, credentials: Arc<Credentials>) -> Router {
    let (mut open, mut guarded) = (Router::new(), Router::new());
    for c in &records::COLLECTIONS {
        let handler =
            get(move |State(s): State<Arc<ApiState>>, Query(q): Query<records::ListQuery>| records::list(s, c, q));
        if c.guarded {
            guarded = guarded.route(c.path, handler);
        } else {
            open = open.route(c.path, handler);
        }
    }
    let open = open
        .route("/", get(ui::root))
        .route("/ui/", get(ui::index))
        .route("/ui/app.js", get(ui::script))
        .route("/ui/app.css", get(ui::style))
        .route("/healthz", get(health::healthz))
        .route("/readyz", get(health::readyz))
        .route("/openapi.json", get(openapi::serve))
        .route("/api/log/proof/{seq}", get(log_routes::proof))
        .route("/api/log/consistency", get(log_routes::consistency))
        .route("/api/log/checkpoint", get(log_routes::checkpoint))
        .route("/api/recipes", get(recipes::list))
        .route("/api/recipes/{name}", get(recipes::show))
        .route("/api/recipes/validate", post(recipes::validate))
        .route("/api/plans/{blake3}", get(plans::show))
        .route("/api/manifests/{run_id}/envelope", get(receipts::manifest))
        .route("/api/receipts/{run_id}", get(receipts::export))
        .route("/api/receipts/verify", post(receipts::verify))
        .route("/api/anchors", get(receipts::anchors))
        .route("/api/runs", get(runs::list))
        .route("/api/runs/{id}", get(runs::show))
        .route("/api/runs/{id}/events", get(runs::events));
    let guarded = guarded
        .route("/metrics", get(metrics::render))
        .route("/api/recipes", post(recipes::register))
        .route("/api/plans", post(plans::measure))
        .route("/api/log", get(log_routes::range))
        .route("/api/log/tail", get(log_routes::tail))
        .route("/api/log/checkpoints", post(log_routes::record_checkpoint))
        .route("/api/runs", post(runs::launch))
        .route("/api/runs/{id}/cancel", post(runs::cancel))
        .route("/api/runs/{id}/resume", post(runs::resume))
        .route_layer(middleware::from_fn_with_state(credentials, auth::require));
    open.merge(guarded)
        .layer(TimeoutLayer::with_status_code(StatusCode::REQUEST_TIMEOUT, REQUEST_TIMEOUT))
        .layer(DefaultBodyLimit::max(MAX_BODY))
        .with_state(state)
}

/// `app` with every request counted in `metrics` (by route pattern and status).
pub fn with_metrics(app: Router, metrics: Arc<Metrics>) -> Router {
    app.layer(middleware::from_fn_with_state(metrics, metrics::track))
}
