//! A facilitator reached over HTTP (`POST /verify`, `POST /settle`, `GET /supported`),
//! and the axum routes that serve any [`Facilitator`] the same way.

use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::Router;
use axum::extract::rejection::JsonRejection;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::StatusCode;
use axum::routing::{get, post};
use serde::de::DeserializeOwned;

use crate::facilitator::{BoxFuture, Facilitator, settle_failed, verify_rejected};
use crate::reason::RejectReason;
use crate::wire::{
    FacilitatorRequest, PaymentPayload, PaymentRequirements, SettlementResponse, SupportedResponse, VerifyResponse,
};

/// Client of a remote facilitator at `base_url` (without the trailing `/verify`).
#[derive(Debug, Clone)]
pub struct HttpFacilitator {
    base: String,
    http: reqwest::Client,
}

impl HttpFacilitator {
    pub fn new(base_url: &str, timeout: Duration) -> Result<Self, reqwest::Error> {
        let http = reqwest::Client::builder().timeout(timeout).pool_max_idle_per_host(256).build()?;
        Ok(Self { base: base_url.trim_end_matches('/').to_owned(), http })
    }

    /// POSTs `body` and reads the answer as `T` whatever the status: the reference
    /// facilitator answers refusals with 4xx and a well-formed body.
    async fn post<T: DeserializeOwned>(&self, path: &str, body: &FacilitatorRequest) -> Result<T, String> {
        let resp = self.http.post(format!("{}{path}", self.base)).json(body).send().await.map_err(|e| e.to_string())?;
        let status = resp.status();
        let bytes = resp.bytes().await.map_err(|e| e.to_string())?;
        serde_json::from_slice(&bytes).map_err(|e| format!("{path} answered {status} with an unreadable body: {e}"))
    }
}

fn request(payload: &PaymentPayload, req: &PaymentRequirements) -> FacilitatorRequest {
    FacilitatorRequest {
        x402_version: payload.x402_version,
        payment_payload: payload.clone(),
        payment_requirements: req.clone(),
    }
}

impl Facilitator for HttpFacilitator {
    fn verify<'a>(
        &'a self,
        payload: &'a PaymentPayload,
        req: &'a PaymentRequirements,
    ) -> BoxFuture<'a, VerifyResponse> {
        Box::pin(async move {
            self.post("/verify", &request(payload, req)).await.unwrap_or_else(|e| {
                verify_rejected(
                    &RejectReason::FacilitatorUnavailable,
                    Some(payload.payload.authorization.from.clone()),
                    Some(e),
                )
            })
        })
    }

    fn settle<'a>(
        &'a self,
        payload: &'a PaymentPayload,
        req: &'a PaymentRequirements,
    ) -> BoxFuture<'a, SettlementResponse> {
        Box::pin(async move {
            self.post("/settle", &request(payload, req)).await.unwrap_or_else(|e| {
                let payer = Some(payload.payload.authorization.from.clone());
                settle_failed(&RejectReason::FacilitatorUnavailable, req, payer, Some(e))
            })
        })
    }

    fn supported(&self) -> BoxFuture<'_, SupportedResponse> {
        Box::pin(async move {
            let got = async {
                let resp = self.http.get(format!("{}/supported", self.base)).send().await.ok()?;
                resp.json::<SupportedResponse>().await.ok()
            };
            got.await.unwrap_or_default()
        })
    }
}

/// Largest `/verify` or `/settle` body the routes read.
pub const MAX_FACILITATOR_BODY: usize = 64 * 1024;

/// `POST /verify`, `POST /settle`, `GET /supported` over `facilitator`. Nest it where it
/// should live (`Router::new().nest("/x402", facilitator_routes(f))`).
pub fn facilitator_routes(facilitator: Arc<dyn Facilitator>) -> Router {
    Router::new()
        .route("/verify", post(verify_route))
        .route("/settle", post(settle_route))
        .route("/supported", get(supported_route))
        .layer(DefaultBodyLimit::max(MAX_FACILITATOR_BODY))
        .with_state(facilitator)
}

fn body<T>(b: Result<Json<T>, JsonRejection>) -> Result<T, String> {
    b.map(|Json(t)| t).map_err(|e| e.body_text())
}

async fn verify_route(
    State(f): State<Arc<dyn Facilitator>>,
    req: Result<Json<FacilitatorRequest>, JsonRejection>,
) -> (StatusCode, Json<VerifyResponse>) {
    match body(req) {
        Ok(r) => {
            let v = f.verify(&r.payment_payload, &r.payment_requirements).await;
            (StatusCode::OK, Json(v))
        }
        Err(e) => (StatusCode::BAD_REQUEST, Json(verify_rejected(&RejectReason::MalformedHeader, None, Some(e)))),
    }
}

async fn settle_route(
    State(f): State<Arc<dyn Facilitator>>,
    req: Result<Json<FacilitatorRequest>, JsonRejection>,
) -> (StatusCode, Json<SettlementResponse>) {
    match body(req) {
        Ok(r) => (StatusCode::OK, Json(f.settle(&r.payment_payload, &r.payment_requirements).await)),
        Err(e) => {
            let failed = SettlementResponse {
                success: false,
                error_reason: Some(RejectReason::MalformedHeader.code().into()),
                error_message: Some(e),
                payer: None,
                transaction: String::new(),
                network: String::new(),
                amount: None,
            };
            (StatusCode::BAD_REQUEST, Json(failed))
        }
    }
}

async fn supported_route(State(f): State<Arc<dyn Facilitator>>) -> Json<SupportedResponse> {
    Json(f.supported().await)
}
