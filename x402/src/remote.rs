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

use alloy::primitives::B256;

use crate::eip712::ParsedAuthorization;
use crate::events::PaymentFacts;
use crate::exact::{Offer, now_secs, requirement_asset};
use crate::facilitator::{BoxFuture, Facilitator, settle_failed, verify_rejected};
use crate::ledger::{self, Claim, Intent};
use crate::paid::Payments;
use crate::paid::Version;
use crate::paid::settle::{Delivery, Settling};
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

/// What the facilitator routes settle: only payments to one of `offers` (their network,
/// asset and `payTo`; any amount), through the same ledger as the paid routes, so an
/// authorization is consumed once whichever way it comes in. Anything else would have the
/// node's settler key pay gas for strangers' transfers.
#[derive(Clone)]
struct Routes {
    payments: Payments,
    offers: Vec<Offer>,
}

/// `POST /verify`, `POST /settle`, `GET /supported` over `payments`. Nest it where it
/// should live (`Router::new().nest("/x402", facilitator_routes(payments, offers))`).
/// `/verify` checks any payment; `/settle` settles only payments to `offers`.
pub fn facilitator_routes(payments: Payments, offers: Vec<Offer>) -> Router {
    Router::new()
        .route("/verify", post(verify_route))
        .route("/settle", post(settle_route))
        .route("/supported", get(supported_route))
        .layer(DefaultBodyLimit::max(MAX_FACILITATOR_BODY))
        .with_state(Arc::new(Routes { payments, offers }))
}

fn body<T>(b: Result<Json<T>, JsonRejection>) -> Result<T, String> {
    b.map(|Json(t)| t).map_err(|e| e.body_text())
}

async fn verify_route(
    State(r): State<Arc<Routes>>,
    req: Result<Json<FacilitatorRequest>, JsonRejection>,
) -> (StatusCode, Json<VerifyResponse>) {
    match body(req) {
        Ok(req) => {
            let v = r.payments.facilitator.verify(&req.payment_payload, &req.payment_requirements).await;
            (StatusCode::OK, Json(v))
        }
        Err(e) => (StatusCode::BAD_REQUEST, Json(verify_rejected(&RejectReason::MalformedHeader, None, Some(e)))),
    }
}

async fn settle_route(
    State(r): State<Arc<Routes>>,
    req: Result<Json<FacilitatorRequest>, JsonRejection>,
) -> (StatusCode, Json<SettlementResponse>) {
    let req = match body(req) {
        Ok(req) => req,
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
            return (StatusCode::BAD_REQUEST, Json(failed));
        }
    };
    match settle_own(&r, &req.payment_payload, &req.payment_requirements).await {
        Ok(settled) => (StatusCode::OK, Json(settled)),
        Err((status, refused)) => (status, Json(refused)),
    }
}

async fn settle_own(
    r: &Routes,
    payload: &PaymentPayload,
    req: &PaymentRequirements,
) -> Result<SettlementResponse, (StatusCode, SettlementResponse)> {
    let payer = Some(payload.payload.authorization.from.clone());
    let refuse = |status, reason: RejectReason, msg: &str| {
        (status, settle_failed(&reason, req, payer.clone(), Some(msg.to_owned())))
    };
    let own = r.offers.iter().any(|o| {
        o.asset.network.caip2() == req.network
            && req.asset.parse().ok() == Some(o.asset.address)
            && req.pay_to.parse().ok() == Some(o.pay_to)
    });
    let same = |a: &str, b: &str| a.parse::<alloy::primitives::Address>().ok() == b.parse().ok();
    if !own || !same(&payload.accepted.pay_to, &req.pay_to) || !same(&payload.accepted.asset, &req.asset) {
        let msg = "this facilitator settles only payments to this node's own payTo and assets";
        return Err(refuse(StatusCode::FORBIDDEN, RejectReason::RecipientMismatch, msg));
    }
    let asset = requirement_asset(req).map_err(|e| refuse(StatusCode::OK, e, "unknown asset"))?;
    let auth = ParsedAuthorization::parse(&payload.payload).map_err(|e| refuse(StatusCode::OK, e, "bad authorization"))?;
    let m = &auth.message;
    let fingerprint = ledger::fingerprint(&auth);
    let facts = PaymentFacts {
        resource: SETTLE_RESOURCE.into(),
        network: req.network.clone(),
        asset: req.asset.clone(),
        amount: req.amount.clone(),
        payer: payer.clone(),
        nonce: Some(payload.payload.authorization.nonce.clone()),
        payment_id: None,
    };
    let key = (asset.address, m.from, m.nonce);
    let ticket = match r.payments.ledger.claim(key, fingerprint, SETTLE_RESOURCE, now_secs()) {
        Claim::Fresh(t) => t,
        // Settled and never answered through here: the caller asking again gets the same
        // answer's settlement, with no new transfer.
        Claim::Redeem(t, landed) => {
            let intent = intent(facts, m, fingerprint);
            return Ok(Delivery::new(&r.payments, intent, landed, t, Version::V2, req, true).served_now());
        }
        Claim::Refused(reason) => return Err(refuse(StatusCode::OK, reason, "the ledger refused this authorization")),
    };
    let intent = intent(facts, m, fingerprint);
    let settling = Settling::new(&r.payments, payload, req, Version::V2, intent, ticket);
    match settling.settle().await {
        Ok(delivery) => Ok(delivery.served_now()),
        Err(refusal) => Err((StatusCode::OK, refusal.into_settlement_response())),
    }
}

/// The resource the facilitator's own settlements are recorded under.
pub const SETTLE_RESOURCE: &str = "/facilitator/settle";

fn intent(facts: PaymentFacts, m: &crate::eip712::TransferWithAuthorization, fingerprint: B256) -> Intent {
    Intent {
        pay_to: m.to,
        value: u64::try_from(m.value).unwrap_or(u64::MAX),
        valid_before: u64::try_from(m.validBefore).unwrap_or(u64::MAX),
        fingerprint,
        facts,
    }
}

async fn supported_route(State(r): State<Arc<Routes>>) -> Json<SupportedResponse> {
    Json(r.payments.facilitator.supported().await)
}
