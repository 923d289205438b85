//! `PaidRoute`: a tower layer that puts any axum handler behind an x402 payment.
//!
//! unpaid → 402 (`PAYMENT-REQUIRED` + v1 body) · paid → verify → handler, response buffered
//! → status < 400: settle → 200 + `PAYMENT-RESPONSE` · handler status ≥ 400: returned as is,
//! nothing settled · settlement fails: 402, no body.

use std::collections::HashSet;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use alloy::primitives::{Address, B256};
use axum::body::Body;
use axum::response::Response;
use http::{HeaderMap, HeaderValue, Request, StatusCode};
use tower::{Layer, Service, ServiceExt};

use crate::eip712::ParsedAuthorization;
use crate::events::{PaymentEvents, PaymentFacts};
use crate::exact::{Offer, match_offer, requirement_asset};
use crate::facilitator::{BoxFuture, Facilitator};
use crate::header::{self, HeaderError, MAX_HEADER_LEN};
use crate::idempotency::{self, Claim, IdempotencyCache, Running, StoredAnswer};
use crate::network::Network;
use crate::pricing::Pricing;
use crate::reason::RejectReason;
use crate::wire::{
    self, PaymentPayload, PaymentRequired, PaymentRequiredV1, PaymentRequirements, PaymentRequirementsV1, ResourceInfo,
};

/// Decides that a request needs no payment (e.g. it carries a valid rental token). The
/// handler behind the layer must then do its own accounting.
pub type Exemption = Arc<dyn Fn(&http::request::Parts) -> bool + Send + Sync>;

/// What a route sells and how.
#[derive(Clone)]
pub struct PaidRouteConfig {
    /// The ways to pay (usually one); listed in `accepts` in this order.
    pub offers: Vec<Offer>,
    pub pricing: Pricing,
    pub description: Option<String>,
    pub mime_type: Option<String>,
    /// `https://node.example` — the resource URL's origin; the `Host` header otherwise.
    pub public_origin: Option<String>,
    /// Requests with larger bodies get 413 (the body is read to price the call).
    pub max_request_body: usize,
    /// A handler answer larger than this is not served (nor settled): 500.
    pub max_response_body: usize,
    /// Ask clients for a payment-identifier (and refuse payments without one).
    pub require_payment_identifier: bool,
    /// How long a settled answer is replayed to retries with the same payment-identifier.
    pub idempotency_ttl: Duration,
    pub idempotency_capacity: usize,
    pub exempt: Option<Exemption>,
}

impl PaidRouteConfig {
    pub fn new(offers: Vec<Offer>, pricing: Pricing) -> Self {
        Self {
            offers,
            pricing,
            description: None,
            mime_type: Some("application/json".into()),
            public_origin: None,
            max_request_body: 1 << 20,
            max_response_body: 16 << 20,
            require_payment_identifier: false,
            idempotency_ttl: Duration::from_secs(3600),
            idempotency_capacity: 100_000,
            exempt: None,
        }
    }
}

/// What the handler behind the layer learns about the payment (request extension).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifiedPayment {
    pub payer: Address,
    pub amount: u64,
    pub network: Network,
    pub asset: Address,
    pub payment_id: Option<String>,
}

type AuthKey = (Address, Address, B256);

struct Shared {
    config: PaidRouteConfig,
    facilitator: Arc<dyn Facilitator>,
    events: Arc<dyn PaymentEvents>,
    /// Authorizations between claim and settlement: a second request carrying one is
    /// refused while the first runs (the check-then-use window).
    in_flight: Mutex<HashSet<AuthKey>>,
    idempotency: Arc<IdempotencyCache>,
}

/// The layer. Cheap to clone; one instance per paid route keeps its own in-flight set and
/// payment-identifier memory.
#[derive(Clone)]
pub struct PaidRoute {
    shared: Arc<Shared>,
}

impl PaidRoute {
    pub fn new(config: PaidRouteConfig, facilitator: Arc<dyn Facilitator>, events: Arc<dyn PaymentEvents>) -> Self {
        let idempotency = IdempotencyCache::new(config.idempotency_ttl, config.idempotency_capacity);
        let shared = Shared { config, facilitator, events, in_flight: Mutex::new(HashSet::new()), idempotency };
        Self { shared: Arc::new(shared) }
    }
}

impl<S> Layer<S> for PaidRoute {
    type Service = PaidService<S>;
    fn layer(&self, inner: S) -> PaidService<S> {
        PaidService { inner, shared: self.shared.clone() }
    }
}

#[derive(Clone)]
pub struct PaidService<S> {
    inner: S,
    shared: Arc<Shared>,
}

impl<S> Service<Request<Body>> for PaidService<S>
where
    S: Service<Request<Body>, Response = Response, Error = Infallible> + Clone + Send + 'static,
    S::Future: Send,
{
    type Response = Response;
    type Error = Infallible;
    type Future = BoxFuture<'static, Result<Response, Infallible>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        // Readiness of the inner service is awaited per call (oneshot on a clone).
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<Body>) -> Self::Future {
        let inner = self.inner.clone();
        let shared = self.shared.clone();
        Box::pin(async move { Ok(handle(shared, inner, req).await) })
    }
}

/// The request as the payment flow sees it.
struct Priced {
    resource: ResourceInfo,
    offered: Vec<PaymentRequirements>,
    path: String,
}

enum Version {
    V1,
    V2,
}

async fn handle<S>(shared: Arc<Shared>, inner: S, req: Request<Body>) -> Response
where
    S: Service<Request<Body>, Response = Response, Error = Infallible> + Send + 'static,
    S::Future: Send,
{
    let (parts, body) = req.into_parts();
    if shared.config.exempt.as_ref().is_some_and(|f| f(&parts)) {
        return run(inner, Request::from_parts(parts, body)).await;
    }
    let Ok(body) = axum::body::to_bytes(body, shared.config.max_request_body).await else {
        return plain(StatusCode::PAYLOAD_TOO_LARGE, "request body too large");
    };
    let amount = match shared.config.pricing.price(&parts, &body) {
        Ok(a) => a,
        Err(why) => {
            let mut r = Response::new(Body::from(why));
            *r.status_mut() = StatusCode::BAD_REQUEST;
            return r;
        }
    };
    let priced = price(&shared.config, &parts, amount);

    let (version, raw) = match (parts.headers.get(header::PAYMENT_SIGNATURE), parts.headers.get(header::X_PAYMENT)) {
        (Some(v), _) => (Version::V2, v.as_bytes()),
        (None, Some(v)) => (Version::V1, v.as_bytes()),
        (None, None) => return payment_required(&shared.config, &priced, None),
    };
    let mut facts = PaymentFacts {
        resource: priced.path.clone(),
        network: priced.offered.first().map(|r| r.network.clone()).unwrap_or_default(),
        asset: priced.offered.first().map(|r| r.asset.clone()).unwrap_or_default(),
        amount: amount.to_string(),
        payer: None,
        nonce: None,
        payment_id: None,
    };
    let payload = match decode(&version, raw, &priced.offered) {
        Ok(p) => p,
        Err(reason) => return reject(&shared, &priced, &facts, reason, None),
    };
    facts.payer = Some(payload.payload.authorization.from.clone());
    facts.nonce = Some(payload.payload.authorization.nonce.clone());
    let requirements = match match_offer(&payload.accepted, &priced.offered) {
        Ok(r) => r.clone(),
        Err(reason) => return reject(&shared, &priced, &facts, reason, None),
    };
    facts.network = requirements.network.clone();
    facts.asset = requirements.asset.clone();
    let (asset, auth) =
        match requirement_asset(&requirements).and_then(|a| Ok((a, ParsedAuthorization::parse(&payload.payload)?))) {
            Ok(x) => x,
            Err(reason) => return reject(&shared, &priced, &facts, reason, None),
        };
    let payment_id = match wire::payment_identifier(&payload) {
        Ok(None) if shared.config.require_payment_identifier => {
            let msg = Some("this route requires a payment-identifier");
            return reject(&shared, &priced, &facts, RejectReason::InvalidPaymentIdentifier, msg);
        }
        Ok(id) => id.map(str::to_owned),
        Err(msg) => return reject(&shared, &priced, &facts, RejectReason::InvalidPaymentIdentifier, Some(msg)),
    };
    facts.payment_id = payment_id.clone();

    // One payment-identifier, one payment: run it, wait for the run in progress, or replay.
    let mut running: Option<Running> = None;
    if let Some(id) = &payment_id {
        loop {
            match shared.idempotency.claim(id) {
                Claim::Fresh(r) => {
                    running = Some(r);
                    break;
                }
                Claim::Wait(rx) => {
                    if let Some(answer) = idempotency::wait(rx).await {
                        return replay(&shared, &priced, &facts, &asset, &auth, &answer);
                    }
                }
                Claim::Done(answer) => return replay(&shared, &priced, &facts, &asset, &auth, &answer),
            }
        }
    }

    let key = (asset.address, auth.message.from, auth.message.nonce);
    let Some(_claim) = InFlight::claim(&shared, key) else {
        return reject(&shared, &priced, &facts, RejectReason::NonceInFlight, None);
    };
    let verdict = shared.facilitator.verify(&payload, &requirements).await;
    if !verdict.is_valid {
        let reason = RejectReason::from_code(verdict.invalid_reason.as_deref().unwrap_or("unexpected_error"));
        return reject(&shared, &priced, &facts, reason, verdict.invalid_message.as_deref());
    }
    shared.events.verified(&facts);

    let mut parts = parts;
    parts.extensions.insert(VerifiedPayment {
        payer: auth.message.from,
        amount,
        network: asset.network,
        asset: asset.address,
        payment_id: payment_id.clone(),
    });
    let answer = run(inner, Request::from_parts(parts, Body::from(body))).await;
    let (mut head, body) = answer.into_parts();
    let Ok(body) = axum::body::to_bytes(body, shared.config.max_response_body).await else {
        shared.events.not_settled(&facts, 500);
        return plain(StatusCode::INTERNAL_SERVER_ERROR, "response too large to serve");
    };
    if head.status.as_u16() >= 400 {
        shared.events.not_settled(&facts, head.status.as_u16());
        return Response::from_parts(head, Body::from(body));
    }

    let settlement = shared.facilitator.settle(&payload, &requirements).await;
    let encoded = header::encode(&settlement);
    let response_header = match version {
        Version::V2 => header::PAYMENT_RESPONSE,
        Version::V1 => header::X_PAYMENT_RESPONSE,
    };
    let encoded = HeaderValue::from_str(&encoded).unwrap_or(HeaderValue::from_static(""));
    if !settlement.success {
        let reason = RejectReason::from_code(settlement.error_reason.as_deref().unwrap_or("unexpected_error"));
        shared.events.rejected(&facts, &reason, settlement.error_message.as_deref());
        let mut r = Response::new(Body::empty());
        *r.status_mut() = StatusCode::PAYMENT_REQUIRED;
        r.headers_mut().insert(response_header, encoded);
        return r;
    }
    shared.events.settled(&facts, &settlement.transaction).await;
    head.headers.insert(response_header, encoded);
    head.headers.insert(http::header::CACHE_CONTROL, HeaderValue::from_static("private, no-store"));
    if let Some(run) = running {
        run.finish(StoredAnswer {
            payer: auth.message.from,
            nonce: auth.message.nonce,
            signature: auth.signature.clone(),
            status: head.status,
            headers: head.headers.clone(),
            body: body.clone(),
        });
    }
    Response::from_parts(head, Body::from(body))
}

async fn run<S>(inner: S, req: Request<Body>) -> Response
where
    S: Service<Request<Body>, Response = Response, Error = Infallible>,
{
    match inner.oneshot(req).await {
        Ok(r) => r,
        Err(never) => match never {},
    }
}

fn price(config: &PaidRouteConfig, parts: &http::request::Parts, amount: u64) -> Priced {
    let path = parts.uri.path().to_owned();
    let path_and_query = parts.uri.path_and_query().map(|p| p.as_str()).unwrap_or("/");
    let origin = config.public_origin.clone().or_else(|| {
        let host = parts.headers.get(http::header::HOST)?.to_str().ok()?;
        Some(format!("http://{host}"))
    });
    let url = format!("{}{path_and_query}", origin.unwrap_or_default());
    let resource = ResourceInfo { url, description: config.description.clone(), mime_type: config.mime_type.clone() };
    let offered = config.offers.iter().map(|o| o.requirements(amount)).collect();
    Priced { resource, offered, path }
}

/// The payment header as a v2 payload; a v1 payment becomes the v2 payload of the offer
/// it names (v1 carries only scheme and network).
fn decode(version: &Version, raw: &[u8], offered: &[PaymentRequirements]) -> Result<PaymentPayload, RejectReason> {
    let header_reason = |e: HeaderError| match e {
        HeaderError::TooLarge { .. } => RejectReason::HeaderTooLarge,
        HeaderError::Version(_) => RejectReason::UnsupportedVersion,
        _ => RejectReason::MalformedHeader,
    };
    match version {
        Version::V2 => header::decode_payment_signature(raw).map_err(header_reason),
        Version::V1 => {
            let p = header::decode_x_payment(raw).map_err(header_reason)?;
            let network: Network = p.network.parse().map_err(|_| RejectReason::NetworkMismatch)?;
            let accepted =
                offered.iter().find(|r| r.scheme == p.scheme && r.network == network.caip2()).cloned().ok_or(
                    if offered.iter().any(|r| r.scheme == p.scheme) {
                        RejectReason::NetworkMismatch
                    } else {
                        RejectReason::InvalidScheme
                    },
                )?;
            Ok(PaymentPayload { x402_version: 2, resource: None, accepted, payload: p.payload, extensions: None })
        }
    }
}

/// The claim on an authorization while its request runs; released on drop.
struct InFlight {
    shared: Arc<Shared>,
    key: AuthKey,
}

impl InFlight {
    fn claim(shared: &Arc<Shared>, key: AuthKey) -> Option<Self> {
        let fresh = shared.in_flight.lock().unwrap_or_else(|e| e.into_inner()).insert(key);
        fresh.then(|| Self { shared: shared.clone(), key })
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.shared.in_flight.lock().unwrap_or_else(|e| e.into_inner()).remove(&self.key);
    }
}

fn replay(
    shared: &Shared,
    priced: &Priced,
    facts: &PaymentFacts,
    asset: &crate::network::Asset,
    auth: &ParsedAuthorization,
    answer: &StoredAnswer,
) -> Response {
    // Only the payer who paid gets the stored answer: the same signed authorization, or a
    // fresh one by the same key.
    let same_authorization =
        auth.message.from == answer.payer && auth.message.nonce == answer.nonce && auth.signature == answer.signature;
    let same_signer = auth.ecdsa_signer(&auth.digest(asset)) == Some(answer.payer);
    if !(same_authorization || same_signer) {
        return reject(shared, priced, facts, RejectReason::PaymentIdentifierConflict, None);
    }
    shared.events.replayed(facts);
    let mut r = Response::new(Body::from(answer.body.clone()));
    *r.status_mut() = answer.status;
    *r.headers_mut() = answer.headers.clone();
    r
}

fn reject(shared: &Shared, priced: &Priced, facts: &PaymentFacts, reason: RejectReason, msg: Option<&str>) -> Response {
    shared.events.rejected(facts, &reason, msg);
    payment_required(&shared.config, priced, Some(&reason))
}

/// 402 with `PAYMENT-REQUIRED` (v2) and the v1 body; `error` names the refusal, if any.
fn payment_required(config: &PaidRouteConfig, priced: &Priced, reason: Option<&RejectReason>) -> Response {
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

fn plain(status: StatusCode, msg: &'static str) -> Response {
    let mut r = Response::new(Body::from(msg));
    *r.status_mut() = status;
    r
}

/// Header values longer than this are refused before decoding (re-exported for callers
/// that configure their HTTP server's own limits).
pub const MAX_PAYMENT_HEADER: usize = MAX_HEADER_LEN;
