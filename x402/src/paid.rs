//! `PaidRoute`: a tower layer that puts any axum handler behind an x402 payment.
//!
//! unpaid → 402 (`PAYMENT-REQUIRED` + v1 body) · paid → the shared [`Ledger`] claims the
//! authorization (one request at a time, across every route; a spent one is refused) →
//! verify → handler and settlement in the order the route's [`SettleWhen`] says → 200 +
//! `PAYMENT-RESPONSE`. A handler status ≥ 400 before settlement settles nothing; a failed
//! settlement answers 402 with no body. A settled payment whose answer was never delivered
//! (a crash, a client gone mid-stream) is redeemed by a retry with the same header.

mod respond;
pub(crate) mod settle;

use std::convert::Infallible;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use alloy::primitives::{Address, B256};
use axum::body::Body;
use axum::response::Response;
use http::{HeaderValue, Request, StatusCode};
use tower::{Layer, Service, ServiceExt};

use crate::eip712::ParsedAuthorization;
use crate::events::{PaymentEvents, PaymentFacts};
use crate::evidence::Evidence;
use crate::exact::{Offer, match_offer, requirement_asset};
use crate::facilitator::{BoxFuture, Facilitator};
use crate::header::{self, HeaderError, MAX_HEADER_LEN};
use crate::idempotency::{self, Claim as IdClaim, IdempotencyCache, Running};
use crate::ledger::{self, Claim, Intent, Ledger};
use crate::network::Network;
use crate::pricing::{Pricing, SettleWhen};
use crate::reason::RejectReason;
use crate::wire::{self, PaymentPayload, PaymentRequirements, ResourceInfo};
use respond::{payment_required, plain, reject, replay};
use settle::{Delivery, Found, Settling};

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

/// What every paid route of a server shares: who verifies and settles, where the events
/// go, the one ledger of authorizations, and a chain reader.
#[derive(Clone)]
pub struct Payments {
    pub facilitator: Arc<dyn Facilitator>,
    pub events: Arc<dyn PaymentEvents>,
    pub ledger: Arc<Ledger>,
    /// Checks settlements the facilitator did not check itself (a remote one's) and finds
    /// the transfer of a settlement whose outcome was unknown. Without one, a remote
    /// facilitator's settlement cannot be vouched for and is treated as pending.
    pub evidence: Option<Evidence>,
}

impl Payments {
    /// The facilitator's own chain reader, a fresh ledger.
    pub fn new(facilitator: Arc<dyn Facilitator>, events: Arc<dyn PaymentEvents>) -> Self {
        let evidence = facilitator.evidence();
        Self { facilitator, events, ledger: Ledger::new(), evidence }
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

/// The transfer that paid for the request, for handlers that run after settlement
/// ([`SettleWhen::BeforeHandler`], and redemptions on any route).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settlement {
    pub tx: B256,
    pub block: u64,
    /// `true` when this request redeems a settlement whose earlier answer was lost.
    pub redeemed: bool,
}

struct Shared {
    config: PaidRouteConfig,
    payments: Payments,
    idempotency: Arc<IdempotencyCache>,
}

/// The layer. Cheap to clone; every route built from the same [`Payments`] shares its ledger.
#[derive(Clone)]
pub struct PaidRoute {
    shared: Arc<Shared>,
}

impl PaidRoute {
    pub fn new(config: PaidRouteConfig, payments: Payments) -> Self {
        let idempotency = IdempotencyCache::new(config.idempotency_ttl, config.idempotency_capacity);
        Self { shared: Arc::new(Shared { config, payments, idempotency }) }
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

#[derive(Clone, Copy)]
pub(crate) enum Version {
    V1,
    V2,
}

impl Version {
    fn response_header(self) -> &'static str {
        match self {
            Version::V2 => header::PAYMENT_RESPONSE,
            Version::V1 => header::X_PAYMENT_RESPONSE,
        }
    }
}

/// A payment understood and matched to an offer, before the ledger is asked.
struct Presented {
    version: Version,
    payload: PaymentPayload,
    requirements: PaymentRequirements,
    asset: crate::network::Asset,
    auth: ParsedAuthorization,
    payment_id: Option<String>,
}

async fn handle<S>(shared: Arc<Shared>, inner: S, req: Request<Body>) -> Response
where
    S: Service<Request<Body>, Response = Response, Error = Infallible> + Send + 'static,
    S::Future: Send,
{
    let (mut parts, body) = req.into_parts();
    if shared.config.exempt.as_ref().is_some_and(|f| f(&parts)) {
        return run(inner, Request::from_parts(parts, body)).await;
    }
    let Ok(body) = axum::body::to_bytes(body, shared.config.max_request_body).await else {
        return plain(StatusCode::PAYLOAD_TOO_LARGE, "request body too large");
    };
    let quote = match shared.config.pricing.quote(&parts, &body) {
        Ok(q) => q,
        Err(answer) => return *answer,
    };
    let priced = price(&shared.config, &parts, quote.amount);
    let mut facts = PaymentFacts {
        resource: priced.path.clone(),
        network: priced.offered.first().map(|r| r.network.clone()).unwrap_or_default(),
        asset: priced.offered.first().map(|r| r.asset.clone()).unwrap_or_default(),
        amount: quote.amount.to_string(),
        ..PaymentFacts::default()
    };
    let p = match present(&shared.config, &parts, &priced, &mut facts) {
        Ok(Some(p)) => p,
        Ok(None) => return payment_required(&shared.config, &priced, None),
        Err((reason, msg)) => return reject(&shared, &priced, &facts, reason, msg.as_deref()),
    };

    // One payment-identifier, one payment: run it, wait for the run in progress, or replay.
    let mut running: Option<Running> = None;
    if let Some(id) = &p.payment_id {
        loop {
            match shared.idempotency.claim(id) {
                IdClaim::Fresh(r) => {
                    running = Some(r);
                    break;
                }
                IdClaim::Wait(rx) => {
                    if let Some(answer) = idempotency::wait(rx).await {
                        return replay(&shared, &priced, &facts, &p.asset, &p.auth, &answer);
                    }
                }
                IdClaim::Done(answer) => return replay(&shared, &priced, &facts, &p.asset, &p.auth, &answer),
            }
        }
    }

    let m = &p.auth.message;
    let key = (p.asset.address, m.from, m.nonce);
    let fingerprint = ledger::fingerprint(&p.auth);
    let intent = Intent {
        facts: facts.clone(),
        pay_to: m.to,
        value: quote.amount,
        valid_before: u64::try_from(m.validBefore).unwrap_or(u64::MAX),
        fingerprint,
    };
    parts.extensions.extend(quote.extensions);
    parts.extensions.insert(VerifiedPayment {
        payer: m.from,
        amount: quote.amount,
        network: p.asset.network,
        asset: p.asset.address,
        payment_id: p.payment_id.clone(),
    });
    let ticket = match shared.payments.ledger.claim(key, fingerprint, &priced.path, crate::exact::now_secs()) {
        Claim::Refused(reason) => return reject(&shared, &priced, &facts, reason, None),
        Claim::Redeem(ticket, landed) => {
            let delivery = Delivery::new(&shared.payments, intent, landed, ticket, p.version, &p.requirements, true);
            parts.extensions.insert(delivery.settlement());
            return deliver(&shared, inner, parts, body, quote.settle, delivery, running).await;
        }
        Claim::Fresh(ticket) => ticket,
    };
    let settling = Settling::new(&shared.payments, &p.payload, &p.requirements, p.version, intent, ticket);

    // The earlier attempt of a settlement whose outcome was unknown may have landed.
    let settling = match settling.found_on_chain().await {
        Found::Yes(delivery) => {
            parts.extensions.insert(delivery.settlement());
            return deliver(&shared, inner, parts, body, quote.settle, *delivery, running).await;
        }
        Found::Refused(refusal) => return refusal.response(p.version),
        Found::No(s) => *s,
    };

    // Refused without a chain call or a record when it is wrong on its face (recipient, value,
    // time window); the facilitator checks the same again.
    if let Err(reason) = crate::exact::check_offline(&p.payload.payload, &p.requirements, crate::exact::now_secs()) {
        return reject(&shared, &priced, &facts, reason, None);
    }
    let mut settling = settling;
    settling.record_intent();
    let verdict = shared.payments.facilitator.verify(&p.payload, &p.requirements).await;
    if !verdict.is_valid {
        let reason = RejectReason::from_code(verdict.invalid_reason.as_deref().unwrap_or("unexpected_error"));
        return reject(&shared, &priced, &facts, reason, verdict.invalid_message.as_deref());
    }
    shared.payments.events.verified(&facts);

    match quote.settle {
        SettleWhen::BeforeHandler => {
            let delivery = match settling.settle().await {
                Ok(d) => d,
                Err(refusal) => return refusal.response(p.version),
            };
            parts.extensions.insert(delivery.settlement());
            deliver(&shared, inner, parts, body, quote.settle, delivery, running).await
        }
        SettleWhen::AfterHead | SettleWhen::AfterBody => {
            let answer = run(inner, Request::from_parts(parts, Body::from(body))).await;
            let (head, answer) = match read_answer(&shared.config, answer, quote.settle).await {
                Ok(a) => a,
                Err(too_large) => {
                    shared.payments.events.not_settled(&facts, 500);
                    return too_large;
                }
            };
            if head.status.as_u16() >= 400 {
                shared.payments.events.not_settled(&facts, head.status.as_u16());
                return Response::from_parts(head, answer.into_body());
            }
            match settling.settle().await {
                Ok(delivery) => respond(head, answer, delivery, running),
                Err(refusal) => refusal.response(p.version),
            }
        }
    }
}

/// A handler's answer: whole (buffered) or a stream.
enum Answer {
    Whole(bytes::Bytes),
    Stream(Body),
}

impl Answer {
    fn into_body(self) -> Body {
        match self {
            Answer::Whole(b) => Body::from(b),
            Answer::Stream(b) => b,
        }
    }
}

/// Splits the handler's response, reading the whole body when the route settles after it.
async fn read_answer(
    config: &PaidRouteConfig,
    answer: Response,
    when: SettleWhen,
) -> Result<(http::response::Parts, Answer), Response> {
    let (head, body) = answer.into_parts();
    match when {
        SettleWhen::AfterBody => match axum::body::to_bytes(body, config.max_response_body).await {
            Ok(b) => Ok((head, Answer::Whole(b))),
            Err(_) => Err(plain(StatusCode::INTERNAL_SERVER_ERROR, "response too large to serve")),
        },
        _ => Ok((head, Answer::Stream(body))),
    }
}

/// Runs the handler for a request that is already paid (settled before it, or redeemed) and
/// delivers its answer; an answer ≥ 400 leaves the payment redeemable.
async fn deliver<S>(
    shared: &Shared,
    inner: S,
    parts: http::request::Parts,
    body: bytes::Bytes,
    when: SettleWhen,
    delivery: Delivery,
    running: Option<Running>,
) -> Response
where
    S: Service<Request<Body>, Response = Response, Error = Infallible> + Send + 'static,
    S::Future: Send,
{
    let answer = run(inner, Request::from_parts(parts, Body::from(body))).await;
    let (head, answer) = match read_answer(&shared.config, answer, when).await {
        Ok(a) => a,
        Err(too_large) => return too_large,
    };
    if head.status.as_u16() >= 400 {
        return Response::from_parts(head, answer.into_body());
    }
    respond(head, answer, delivery, running)
}

/// The paid answer: the settlement header on the handler's head, the body delivered (its
/// last byte marks the payment served). A whole answer is also kept for payment-identifier
/// retries.
fn respond(mut head: http::response::Parts, answer: Answer, delivery: Delivery, running: Option<Running>) -> Response {
    let (name, value) = delivery.response_header();
    head.headers.insert(name, value);
    head.headers.insert(http::header::CACHE_CONTROL, HeaderValue::from_static("private, no-store"));
    if let (Some(run), Answer::Whole(bytes)) = (running, &answer) {
        run.finish(idempotency::StoredAnswer {
            payer: delivery.payer(),
            nonce: delivery.nonce(),
            fingerprint: delivery.fingerprint(),
            status: head.status,
            headers: head.headers.clone(),
            body: bytes.clone(),
        });
    }
    Response::from_parts(head, delivery.wrap(answer.into_body()))
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

type Refusal = (RejectReason, Option<String>);

/// The payment header decoded, matched to an offer and parsed; `None` without one.
fn present(
    config: &PaidRouteConfig,
    parts: &http::request::Parts,
    priced: &Priced,
    facts: &mut PaymentFacts,
) -> Result<Option<Presented>, Refusal> {
    let (version, raw) = match (parts.headers.get(header::PAYMENT_SIGNATURE), parts.headers.get(header::X_PAYMENT)) {
        (Some(v), _) => (Version::V2, v.as_bytes()),
        (None, Some(v)) => (Version::V1, v.as_bytes()),
        (None, None) => return Ok(None),
    };
    let payload = decode(version, raw, &priced.offered).map_err(|r| (r, None))?;
    facts.payer = Some(payload.payload.authorization.from.clone());
    facts.nonce = Some(payload.payload.authorization.nonce.clone());
    let requirements = match_offer(&payload.accepted, &priced.offered).map_err(|r| (r, None))?.clone();
    facts.network = requirements.network.clone();
    facts.asset = requirements.asset.clone();
    let asset = requirement_asset(&requirements).map_err(|r| (r, None))?;
    let auth = ParsedAuthorization::parse(&payload.payload).map_err(|r| (r, None))?;
    let payment_id = match wire::payment_identifier(&payload) {
        Ok(None) if config.require_payment_identifier => {
            let msg = "this route requires a payment-identifier".to_owned();
            return Err((RejectReason::InvalidPaymentIdentifier, Some(msg)));
        }
        Ok(id) => id.map(str::to_owned),
        Err(msg) => return Err((RejectReason::InvalidPaymentIdentifier, Some(msg.to_owned()))),
    };
    facts.payment_id = payment_id.clone();
    Ok(Some(Presented { version, payload, requirements, asset, auth, payment_id }))
}

/// The payment header as a v2 payload; a v1 payment becomes the v2 payload of the offer
/// it names (v1 carries only scheme and network).
fn decode(version: Version, raw: &[u8], offered: &[PaymentRequirements]) -> Result<PaymentPayload, RejectReason> {
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

/// Header values longer than this are refused before decoding (re-exported for callers
/// that configure their HTTP server's own limits).
pub const MAX_PAYMENT_HEADER: usize = MAX_HEADER_LEN;
