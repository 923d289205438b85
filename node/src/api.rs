//! The operator API, served by `mindxtrain serve` beside the model routes: health and
//! readiness, Prometheus metrics, the event log (ranges, a live tail, proofs, signed
//! checkpoints), recipes and training runs (launch, cancel, resume, live events), and the
//! OpenAPI document.
//!
//! * [`auth`]: the bearer token (`node-dir/api.token`, 0600) or an ed25519-signed request
//!   ([`signed`]) every route that reveals payer data or changes state needs; read-only
//!   public routes stay open;
//! * [`health`], [`metrics`], [`log_routes`], [`runs`], [`openapi`];
//! * [`cpu`]: where CPU-bound handlers compute, off the executor and bounded;
//! * [`listener`]: the accept loop (header read timeout, connections per address);
//! * [`host`]: the `Host` check that keeps DNS rebinding off a node bound to loopback;
//! * [`fallback`]: unknown paths and methods answered in the same error shape.
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
pub mod cpu;
pub mod fallback;
pub mod health;
pub mod host;
pub mod listener;
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
use axum::extract::{DefaultBodyLimit, MatchedPath, Query, Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};

use crate::identity::Identity;
use crate::log::EventLog;
use crate::serve::openai::ApiError;
use auth::Credentials;
use metrics::Metrics;

/// Largest request body any route of the node reads ([`with_limits`]).
pub const MAX_BODY: usize = 1 << 20;

/// Longest a request may take to its response head (streams go on after it), on every
/// route but those of [`OWN_DEADLINE`] and [`PAID_ROUTES`].
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// Longest a paid model request may take to its response head: the generation, then the
/// facilitator's settlement (whose own HTTP timeout is 60 s), which is better not cut short.
pub const PAID_REQUEST_TIMEOUT: Duration = Duration::from_secs(120);

/// Routes that bound their own time (method, route pattern): `POST /api/plans` runs the
/// probe for the recipe's `autotune.budget_seconds` ([`plans::deadline`]).
pub const OWN_DEADLINE: &[(&str, &str)] = &[("POST", "/api/plans")];

/// Routes sold over x402 (method, route pattern): they get [`PAID_REQUEST_TIMEOUT`].
pub const PAID_ROUTES: &[(&str, &str)] =
    &[("POST", "/v1/chat/completions"), ("POST", "/v1/completions"), ("POST", "/v1/rentals")];

/// What the operator routes share.
pub struct ApiState {
    pub log: Arc<EventLog>,
    pub identity: Arc<Identity>,
    pub node_dir: PathBuf,
    pub metrics: Arc<Metrics>,
    /// The served model's id, when one is.
    pub model: Option<String>,
    /// Whether `/facilitator/{verify,settle,supported}` are served (in-process facilitator).
    pub facilitator: bool,
    pub started: Instant,
    pub launches: runs::Launches,
    /// On-chain receipt checks go one at a time (each may start a read-only anvil).
    pub chain_checks: tokio::sync::Mutex<()>,
    /// Where CPU-bound handlers (recipe checks) compute, off the executor.
    pub cpu: cpu::CpuPool,
}

impl ApiState {
    /// The state, with metrics following the log from its first event.
    pub fn new(
        log: Arc<EventLog>,
        identity: Arc<Identity>,
        node_dir: PathBuf,
        model: Option<String>,
        facilitator: bool,
    ) -> Arc<Self> {
        let metrics = Arc::new(Metrics::default());
        metrics.follow(log.clone());
        let launches = runs::Launches::default();
        let chain_checks = tokio::sync::Mutex::new(());
        let started = Instant::now();
        let cpu = cpu::CpuPool::new();
        Arc::new(ApiState {
            log,
            identity,
            node_dir,
            metrics,
            model,
            facilitator,
            started,
            launches,
            chain_checks,
            cpu,
        })
    }
}

/// The operator routes (those of [`openapi::routes`]), without limits: the server applies
/// [`with_limits`] to the whole app once the model routes are merged in.
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
    open.merge(guarded).with_state(state)
}

/// `app` (every route it has now) with the request limits: bodies over [`MAX_BODY`] are
/// refused with 413 before any handler or guard reads them, and a request that has no
/// response head after [`REQUEST_TIMEOUT`] (or its route's own deadline) gets 408.
pub fn with_limits(app: Router) -> Router {
    app.layer(middleware::from_fn(deadline))
        .layer(DefaultBodyLimit::max(MAX_BODY))
        .layer(middleware::from_fn(body_limit))
}

/// 413 for a declared length over [`MAX_BODY`], before anything reads the body. A body
/// without one (chunked) meets the same limit where it is read: axum's extractors (by
/// [`DefaultBodyLimit`]), the signed-request guard and the x402 layer (1 MiB each).
async fn body_limit(req: Request, next: Next) -> Response {
    let declared = req.headers().get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if declared.is_some_and(|n| n > MAX_BODY as u64) {
        return too_large();
    }
    next.run(req).await
}

fn too_large() -> Response {
    let message = format!("request body over {MAX_BODY} bytes");
    ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, "invalid_request_error", "body_too_large", message).into_response()
}

/// The time limit of a request, by its route.
fn limit_of(method: &str, route: Option<&str>) -> Option<Duration> {
    let is = |list: &[(&str, &str)]| route.is_some_and(|r| list.iter().any(|&(m, p)| m == method && p == r));
    if is(OWN_DEADLINE) {
        None
    } else if is(PAID_ROUTES) {
        Some(PAID_REQUEST_TIMEOUT)
    } else {
        Some(REQUEST_TIMEOUT)
    }
}

/// 408 when the response head takes longer than the route's limit.
async fn deadline(req: Request, next: Next) -> Response {
    let route = req.extensions().get::<MatchedPath>().map(|p| p.as_str().to_owned());
    let Some(limit) = limit_of(req.method().as_str(), route.as_deref()) else { return next.run(req).await };
    match tokio::time::timeout(limit, next.run(req)).await {
        Ok(response) => response,
        Err(_) => timed_out(limit),
    }
}

/// The 408 answer after `limit`.
pub fn timed_out(limit: Duration) -> Response {
    let message = format!("no answer within {} s", limit.as_secs());
    ApiError::new(StatusCode::REQUEST_TIMEOUT, "server_error", "request_timeout", message).into_response()
}

/// `app` with every request counted in `metrics` (by route pattern and status).
pub fn with_metrics(app: Router, metrics: Arc<Metrics>) -> Router {
    app.layer(middleware::from_fn_with_state(metrics, metrics::track))
}
