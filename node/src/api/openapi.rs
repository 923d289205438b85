//! The OpenAPI 3.1 document of every route this node serves, built from the route table
//! the router is tested against (`tests/tests/api.rs` calls each documented route, with and
//! without the token).

use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use serde_json::{Map, Value, json};

use super::ApiState;

/// Who may call a route.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Anyone: read-only and reveals no payer data.
    Open,
    /// The operator's bearer token.
    Token,
    /// x402 payment (or a rental token), when the model is sold.
    Paid,
    /// Anyone, though it changes state: an x402 facilitator verifies and settles EIP-3009
    /// authorizations that the payer signed, so the signature is the authorization.
    Facilitator,
}

/// One documented route.
#[derive(Debug, Clone, Copy)]
pub struct RouteDoc {
    pub method: &'static str,
    pub path: &'static str,
    pub access: Access,
    pub summary: &'static str,
}

const fn route(method: &'static str, path: &'static str, access: Access, summary: &'static str) -> RouteDoc {
    RouteDoc { method, path, access, summary }
}

/// The operator API: always served.
pub const OPERATOR: &[RouteDoc] = &[
    route("get", "/", Access::Open, "Redirects to the Coach web UI (/ui/)"),
    route("get", "/ui/", Access::Open, "The Coach web UI"),
    route("get", "/ui/app.js", Access::Open, "The web UI's script"),
    route("get", "/ui/app.css", Access::Open, "The web UI's style sheet"),
    route("get", "/healthz", Access::Open, "Liveness: the process answers"),
    route("get", "/readyz", Access::Open, "Readiness: 503 once the log's writer has stopped"),
    route("get", "/openapi.json", Access::Open, "This document"),
    route("get", "/metrics", Access::Token, "Prometheus metrics"),
    route("get", "/api/log", Access::Token, "Events in a range (from, limit ≤ 1000, kind prefix)"),
    route("get", "/api/log/tail", Access::Token, "Live events as server-sent events (from, Last-Event-ID)"),
    route("get", "/api/log/proof/{seq}", Access::Open, "Inclusion proof of one event (size)"),
    route("get", "/api/log/consistency", Access::Open, "Consistency proof between two tree sizes (old, size)"),
    route("get", "/api/log/checkpoint", Access::Open, "The log's size and root in a freshly signed note"),
    route("post", "/api/log/checkpoints", Access::Token, "Sign a checkpoint and record it (log.checkpointed)"),
    route("get", "/api/recipes", Access::Open, "The embedded recipes, each checked, and those registered here"),
    route("post", "/api/recipes", Access::Token, "Register a recipe (recipe.registered; kept by its blake3)"),
    route("get", "/api/recipes/{name}", Access::Open, "One recipe resolved with its defaults, and its text"),
    route("post", "/api/recipes/validate", Access::Open, "Check a recipe's YAML: every error with line, column, field"),
    route(
        "post",
        "/api/plans",
        Access::Token,
        "Run the AOT probe for a recipe and record the plan (408 after autotune.budget_seconds + 60 s)",
    ),
    route("get", "/api/plans/{blake3}", Access::Open, "A recorded plan by its digest"),
    route("get", "/api/manifests/{run_id}/envelope", Access::Open, "A run's sealed manifest (DSSE envelope)"),
    route("get", "/api/receipts/{run_id}", Access::Open, "A run's receipt bundle, exported now"),
    route("post", "/api/receipts/verify", Access::Open, "Check a receipt (body): every check by name, chain included"),
    route("get", "/api/anchors", Access::Open, "Items anchored or pending, batches with explorer links"),
    route("get", "/api/runs", Access::Open, "Every run in the node's log (CLI, demo, API), oldest first"),
    route(
        "post",
        "/api/runs",
        Access::Token,
        "Launch a run (`base` for an adapter; plan measured first; one at a time)",
    ),
    route("get", "/api/runs/{id}", Access::Open, "A run's phase, step, loss, lr, tok/s, manifest"),
    route("post", "/api/runs/{id}/cancel", Access::Token, "Stop after the current step, checkpointed"),
    route(
        "post",
        "/api/runs/{id}/resume",
        Access::Token,
        "Continue a cancelled, failed or interrupted run from its checkpoint",
    ),
    route("get", "/api/runs/{id}/events", Access::Open, "A run's events, then live (SSE)"),
];

/// The model routes: served when a model is.
pub const MODEL: &[RouteDoc] = &[
    route("get", "/v1/models", Access::Open, "OpenAI: the served model"),
    route("get", "/v1/models/{id}", Access::Open, "OpenAI: one model"),
    route("post", "/v1/chat/completions", Access::Paid, "OpenAI chat completion (stream: SSE)"),
    route("post", "/v1/rentals", Access::Paid, "Rent N calls or T seconds of the model"),
    route("get", "/v1/rentals/{id}", Access::Open, "A rental's state"),
];

/// The x402 facilitator, served beside a sold model when it settles in-process. Public by
/// x402 design: `/verify` changes nothing, and `/settle` submits only an EIP-3009
/// authorization the payer signed *to this node's own payTo and asset* (403 otherwise, so
/// the settler key never pays gas for strangers' transfers), through the same ledger as the
/// paid routes (an authorization is consumed once, whichever way it arrives).
pub const FACILITATOR: &[RouteDoc] = &[
    route("post", "/facilitator/verify", Access::Facilitator, "x402: check a payment payload against requirements"),
    route(
        "post",
        "/facilitator/settle",
        Access::Facilitator,
        "x402: settle a payer-signed EIP-3009 authorization to this node's own payTo and asset",
    ),
    route("get", "/facilitator/supported", Access::Open, "x402: the schemes and networks settled here"),
];

/// The routes this node serves: the operator API, the model's when `model`, the
/// facilitator's when `facilitator`.
pub fn routes(model: bool, facilitator: bool) -> Vec<RouteDoc> {
    let mut all = OPERATOR.to_vec();
    for c in &super::records::COLLECTIONS {
        let access = if c.guarded { Access::Token } else { Access::Open };
        all.push(route("get", c.path, access, c.about));
    }
    if model {
        all.extend_from_slice(MODEL);
    }
    if facilitator {
        all.extend_from_slice(FACILITATOR);
    }
    all
}

/// The document for `routes`.
pub fn document(routes: &[RouteDoc]) -> Value {
    let mut paths = Map::new();
    for r in routes {
        let params: Vec<Value> = r
            .path
            .split('/')
            .filter_map(|seg| seg.strip_prefix('{')?.strip_suffix('}'))
            .map(|name| json!({"name": name, "in": "path", "required": true, "schema": {"type": "string"}}))
            .collect();
        let mut op = json!({
            "summary": r.summary,
            "parameters": params,
            "responses": {"200": {"description": "OK"}},
        });
        match r.access {
            Access::Open => op["security"] = json!([]),
            Access::Token => {
                op["security"] = json!([{"bearer": []}]);
                op["responses"]["401"] = json!({"description": "no or wrong bearer token"});
            }
            Access::Paid => {
                op["security"] = json!([]);
                op["x-payment"] = json!({"protocol": "x402", "versions": [2, 1], "scheme": "exact"});
                op["responses"]["402"] = json!({"description": "payment required (PAYMENT-REQUIRED header)"});
            }
            Access::Facilitator => {
                op["security"] = json!([]);
                op["description"] = json!(
                    "Public by x402 design, the exception to state-changing routes needing the operator token: \
                     the payload is an EIP-3009 transferWithAuthorization the payer signed (amount, payee, \
                     validity window, single-use nonce), checked here and settled on chain as signed. \
                     /settle settles only payments to this node's own payTo and asset (403 otherwise) and \
                     shares the paid routes' ledger: an authorization is consumed at most once."
                );
                op["responses"]["403"] = json!({"description": "not a payment to this node's payTo and asset"});
            }
        }
        let entry = paths.entry(r.path.to_owned()).or_insert_with(|| json!({}));
        entry[r.method] = op;
    }
    json!({
        "openapi": "3.1.0",
        "info": {"title": "mindxtrain node", "version": env!("CARGO_PKG_VERSION"),
            "description": "Every route: bodies over 1 MiB get 413; no response head within 30 s (120 s on \
                paid routes, the recipe's autotune budget + 60 s on POST /api/plans) gets 408. Routes that \
                change state or reveal payer data need the bearer token, except /facilitator/verify and \
                /facilitator/settle, public by x402 design (they act on payer-signed EIP-3009 authorizations; \
                /settle only on payments to this node's own payTo and asset)."},
        "components": {"securitySchemes": {"bearer": {"type": "http", "scheme": "bearer",
            "description": "node-dir/api.token"}}},
        "paths": paths,
    })
}

/// `GET /openapi.json`.
pub async fn serve(State(s): State<Arc<ApiState>>) -> Json<Value> {
    Json(document(&routes(s.model.is_some(), s.facilitator)))
}
