//! The layer's own answers: 402 with what to pay, refusals, payment-identifier replays.

use axum::body::Body;
use axum::response::Response;
use http::{HeaderMap, HeaderValue, StatusCode};

use super::{PaidRouteConfig, Priced, Shared};
use crate::eip712::ParsedAuthorization;
use crate::events::PaymentFacts;
use crate::header;
use crate::idempotency::StoredAnswer;
use crate::reason::RejectReason;
use crate::wire::{self, PaymentRequired, PaymentRequiredV1, PaymentRequirementsV1};

/// A retry with a known payment-identifier: the stored answer, for the payer who paid.
pub(super) fn replay(
    shared: &Shared,
    priced: &Priced,
    facts: &PaymentFacts,
    asset: &crate::network::Asset,
    auth: &ParsedAuthorization,
    answer: &StoredAnswer,
) -> Response {
    // Only the payer who paid gets the stored answer: the same signed authorization, or a
    // fresh one by the same key.
    let same_authorization = crate::ledger::fingerprint(auth) == answer.fingerprint;
    let same_signer = auth.ecdsa_signer(&auth.digest(asset)) == Some(answer.payer);
    if !(same_authorization || same_signer) {
        return reject(shared, priced, facts, RejectReason::PaymentIdentifierConflict, None);
    }
    shared.payments.events.replayed(facts);
    let mut r = Response::new(Body::from(answer.body.clone()));
    *r.status_mut() = answer.status;
    *r.headers_mut() = answer.headers.clone();
    r
}

pub(super) fn reject(
    shared: &Shared,
    priced: &Priced,
    facts: &PaymentFacts,
    reason: RejectReason,
    msg: Option<&str>,
) -> Response {
    shared.payments.events.rejected(facts, &reason, msg);
    payment_required(&shared.config, priced, Some(&reason))
}

/// 402 with `PAYMENT-REQUIRED` (v2) and the v1 body; `error` names the refusal, if any.
pub(super) fn payment_required(config: &PaidRouteConfig, priced: &Priced, reason: Option<&RejectReason>) -> Response {
    let error = reason.map(|r| r.code().to_owned());
    let mut extensions = serde_json::Map::new();
    extensions.insert(
        wire::PAYMENT_IDENTIFIER.into(),
        wire::payment_identifier_declaration(config.require_payment_identifier),
    );
    let v2 = PaymentRequired {
        x402_version: 2,
        error: error.clone(),
        resource: priced.resource.clone(),
        accepts: priced.offered.clone(),
        extensions: Some(extensions),
    };
    let v1 = PaymentRequiredV1 {
        x402_version: 1,
        error: error.unwrap_or_else(|| "X-PAYMENT header is required".into()),
        accepts: config
            .offers
            .iter()
            .zip(&priced.offered)
            .map(|(o, r)| PaymentRequirementsV1::from_v2(r, &o.asset.network.v1_name(), &priced.resource))
            .collect(),
    };
    let mut headers = HeaderMap::new();
    if let Ok(v) = HeaderValue::from_str(&header::encode(&v2)) {
        headers.insert(header::PAYMENT_REQUIRED, v);
    }
    headers.insert(http::header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    headers.insert(http::header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    let mut r = Response::new(Body::from(serde_json::to_vec(&v1).unwrap_or_default()));
    *r.status_mut() = StatusCode::PAYMENT_REQUIRED;
    *r.headers_mut() = headers;
    r
}

pub(super) fn plain(status: StatusCode, msg: &'static str) -> Response {
    let mut r = Response::new(Body::from(msg));
    *r.status_mut() = status;
    r
}
