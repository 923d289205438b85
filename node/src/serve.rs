//! Serving a trained model: OpenAI-compatible inference sold per call over x402, and
//! rentals of it to other agents. Every payment and rental is an event in the log.
//!
//! * [`model`]: the served checkpoint on the serving engine (`mindxtrain_trainer::infer`:
//!   batching, text deltas, stop sequences) and one completion on it; [`queue`]: generation
//!   slots and a bounded fair queue;
//! * [`openai`]: the wire format, every parameter honoured or refused by name; [`chat`]: the
//!   model routes; [`completions`]: legacy completions (prompt scoring for evaluations);
//!   [`tokenize`]: `/tokenize`, `/detokenize`, `/tokenizer_info` (vLLM's shapes, free);
//!   [`answer`]: an answer's reasoning, content and tool calls;
//! * [`rentals`]: the rental book and tokens; [`rental_routes`]: their routes;
//! * [`payments`]: x402 reports as log events; [`client`]: paying for a call (our client
//!   side, which `mindxtrain rent` and the demo use).
//!
//! ```no_run
//! # async fn f(state: std::sync::Arc<mindxtrain_node::serve::AppState>) -> anyhow::Result<()> {
//! let app = mindxtrain_node::serve::router(state, None);
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:8080").await?;
//! axum::serve(listener, app).await?;
//! # Ok(()) }
//! ```

pub mod answer;
pub mod chat;
pub mod client;
pub mod completions;
pub mod model;
pub mod openai;
pub mod payments;
pub mod queue;
pub mod rental_routes;
pub mod rentals;
pub mod tokenize;

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::response::IntoResponse;
use axum::routing::{get, post};
use mindxtrain_trainer::recipe as publish;
use mindxtrain_x402::pricing::Prepare;
use mindxtrain_x402::{
    Evidence, Facilitator, Offer, PaidRoute, PaidRouteConfig, PaymentEvents, Payments, Pricing, Quote, SettleWhen,
    facilitator_routes, reconcile,
};

use crate::log::{AppendRequest, EventLog};
use model::ServedModel;
use queue::Admission;
use rental_routes::RentalPrices;
use rentals::RentalBook;

/// Requests waiting for a slot beyond those running, per slot.
pub const QUEUE_PER_SLOT: usize = 8;

/// What the routes share.
pub struct AppState {
    pub model: Arc<ServedModel>,
    pub admission: Arc<Admission>,
    pub rentals: Arc<RentalBook>,
    pub log: Arc<EventLog>,
    /// Set when the model is sold and rentals are offered.
    pub rental_prices: Option<RentalPrices>,
}

/// How the model is sold: one offer (asset, network, payee), who checks and settles payments
/// with the one ledger every paid route shares, and the recipe's prices.
#[derive(Clone)]
pub struct Sale {
    pub offer: Offer,
    pub payments: Payments,
    pub prices: publish::Pricing,
    pub rental: Option<publish::Rental>,
    /// Also serve `/facilitator/{verify,settle,supported}` with this facilitator.
    pub facilitator_routes: bool,
}

impl AppState {
    pub fn new(model: ServedModel, log: Arc<EventLog>, rentals: Arc<RentalBook>, sale: Option<&Sale>) -> Arc<AppState> {
        let slots = model.recipe.serve.max_batch.max(1) as usize;
        let stats = model.stats();
        let kv = queue::KvBudget { total_blocks: stats.kv_total_blocks, block_size: stats.block_size };
        let rental_prices = sale.map(|s| RentalPrices {
            per_call: per_call_ceiling(&s.prices),
            per_hour: s
                .rental
                .as_ref()
                .map(|r| (r.per_hour.atomic(), u64::from(r.min_minutes) * 60, u64::from(r.max_hours) * 3600)),
        });
        Arc::new(AppState {
            model: Arc::new(model),
            admission: Arc::new(Admission::new(slots, slots * QUEUE_PER_SLOT, Some(kv))),
            rentals,
            log,
            rental_prices,
        })
    }
}

/// The most one call can cost: the per-call price, or a per-token price's `max_charge`.
fn per_call_ceiling(p: &publish::Pricing) -> u64 {
    p.per_call.or(p.max_charge).map_or(1, publish::Usdc::atomic)
}

/// The model routes, sold through x402 when `sale` is given. Every paid route and the
/// facilitator routes share the sale's ledger: an authorization buys one answer, wherever it
/// is presented.
pub fn router(state: Arc<AppState>, sale: Option<&Sale>) -> Router {
    let mut chat = post(chat::completions);
    let mut legacy = post(completions::completions);
    let mut rentals = post(rental_routes::open);
    let mut app = Router::new();
    if let Some(sale) = sale {
        let price = ChatPrice::of(&sale.prices);
        let s = state.clone();
        let prepare: Prepare =
            Arc::new(move |_, body| chat::prepare_paid(&s, price, body).map_err(|e| Box::new(e.into_response())));
        let mut chat_sale = PaidRouteConfig::new(vec![sale.offer.clone()], Pricing::Prepared(prepare));
        chat_sale.description = Some(format!("chat completion from {}", state.model.name));
        // A rental token pays for the call instead: the handler checks and meters it.
        chat_sale.exempt =
            Some(Arc::new(|parts: &axum::http::request::Parts| chat::rental_token(&parts.headers).is_some()));
        chat = chat.layer(PaidRoute::new(chat_sale, sale.payments.clone()));
        // Completions are paid as chat completions of the same token budget.
        let s = state.clone();
        let prepare: Prepare = Arc::new(move |_, body| {
            completions::prepare_paid(&s, price, body).map_err(|e| Box::new(e.into_response()))
        });
        let mut legacy_sale = PaidRouteConfig::new(vec![sale.offer.clone()], Pricing::Prepared(prepare));
        legacy_sale.description = Some(format!("completion from {}", state.model.name));
        legacy = legacy.layer(PaidRoute::new(legacy_sale, sale.payments.clone()));
        let prices = state.rental_prices.unwrap_or(RentalPrices { per_call: 1, per_hour: None });
        let name = state.model.name.clone();
        // A rental is opened (and recorded) only once its payment has settled.
        let quote: Prepare = Arc::new(move |_, body| {
            let (terms, amount) =
                prices.quote(&name, body).map_err(|m| openai::ApiError::invalid("body", m).into_response())?;
            let mut q = Quote::new(amount, SettleWhen::BeforeHandler);
            q.extensions.insert(terms);
            Ok(q)
        });
        let mut rental_sale = PaidRouteConfig::new(vec![sale.offer.clone()], Pricing::Prepared(quote));
        rental_sale.description = Some(format!("rental of {}", state.model.name));
        rentals = rentals.layer(PaidRoute::new(rental_sale, sale.payments.clone()));
        if sale.facilitator_routes {
            app = app.nest("/facilitator", facilitator_routes(sale.payments.clone(), vec![sale.offer.clone()]));
        }
    }
    let model_routes = Router::new()
        .route("/v1/models", get(chat::list_models))
        .route("/v1/models/{id}", get(chat::get_model))
        .route("/v1/chat/completions", chat)
        .route("/v1/completions", legacy)
        .route("/tokenize", post(tokenize::tokenize))
        .route("/detokenize", post(tokenize::detokenize))
        .route("/tokenizer_info", get(tokenize::tokenizer_info))
        .route("/v1/rentals", rentals)
        .route("/v1/rentals/{id}", get(rental_routes::show))
        .with_state(state);
    app.merge(model_routes)
}

/// What one chat completion costs, from the recipe's `publish.billing.x402.pricing`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChatPrice {
    PerCall(u64),
    /// Charged on the request's token budget (prompt + max tokens), capped.
    Per1kTokens {
        per_1k: u64,
        max_charge: u64,
    },
}

impl ChatPrice {
    pub fn of(prices: &publish::Pricing) -> Self {
        match (prices.per_call, prices.per_1k_tokens) {
            (_, Some(per_1k)) => {
                ChatPrice::Per1kTokens { per_1k: per_1k.atomic(), max_charge: per_call_ceiling(prices) }
            }
            (Some(p), None) => ChatPrice::PerCall(p.atomic()),
            (None, None) => ChatPrice::PerCall(1),
        }
    }

    /// Atomic units for a request that may consume `budget` tokens.
    pub fn amount(self, budget: usize) -> u64 {
        match self {
            ChatPrice::PerCall(a) => a,
            ChatPrice::Per1kTokens { per_1k, max_charge } => {
                mindxtrain_x402::pricing::per_1k_price(per_1k, budget as u64).min(max_charge)
            }
        }
    }
}

/// How often settlements of unknown outcome are looked for on chain.
pub const RECONCILE_EVERY: Duration = Duration::from_secs(2);

/// A sale's payments: `facilitator` verifying and settling, events into `log`, the ledger
/// as the log records it, and its reconciler (on the current tokio runtime) finding every
/// settlement a restart interrupted.
pub fn payments(
    log: &Arc<EventLog>,
    facilitator: Arc<dyn Facilitator>,
    evidence: Evidence,
) -> Result<Payments, payments::RestoreError> {
    let events: Arc<dyn PaymentEvents> = Arc::new(payments::LogPayments::new(log.clone()));
    let ledger = payments::restore_ledger(log, unix_now())?;
    let pending = ledger.pending().len();
    if pending > 0 {
        tracing::info!(pending, "settlements of unknown outcome in the log: reconciling them against the chain");
    }
    reconcile::spawn(ledger.clone(), evidence.clone(), events.clone(), RECONCILE_EVERY);
    Ok(Payments { facilitator, events, ledger, evidence: Some(evidence) })
}

/// Seconds since the Unix epoch.
pub fn unix_now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// Submits an event to the group commit without waiting for its sync; a failure is logged.
/// For reports on the request path whose loss would not change what was served.
pub fn append_in_background(log: &Arc<EventLog>, req: AppendRequest) {
    tokio::spawn(appended(log, req));
}

/// Submits `req` now; the future completes when it is durable, logging a failure (the
/// caller has nothing better to do with it than carry on).
pub fn appended(log: &Arc<EventLog>, req: AppendRequest) -> impl std::future::Future<Output = ()> + Send + 'static {
    let kind = req.kind.clone();
    let rx = log.submit(req);
    async move {
        match rx.await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => tracing::error!(kind, error = %e, "event not written"),
            Err(_) => tracing::error!(kind, "event not written: the log writer is gone"),
        }
    }
}

/// How long a graceful shutdown waits for running completions.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(30);

#[cfg(test)]
mod tests;
