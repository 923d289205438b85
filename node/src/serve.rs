//! Serving a trained model: OpenAI-compatible inference sold per call over x402, and
//! rentals of it to other agents. Every payment and rental is an event in the log.
//!
//! * [`model`]: the served checkpoint on the serving engine (`mindxtrain_trainer::infer`:
//!   batching, text deltas, stop sequences) and one completion on it; [`queue`]: generation
//!   slots and a bounded fair queue;
//! * [`openai`]: the wire format; [`chat`]: the model routes;
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

pub mod chat;
pub mod client;
pub mod model;
pub mod openai;
pub mod payments;
pub mod queue;
pub mod rental_routes;
pub mod rentals;

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::routing::{get, post};
use mindxtrain_trainer::recipe as publish;
use mindxtrain_x402::pricing::TokenBudget;
use mindxtrain_x402::{Facilitator, Offer, PaidRoute, PaidRouteConfig, Pricing, facilitator_routes};

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

/// How the model is sold: one offer (asset, network, payee), the facilitator that checks
/// and settles payments, and the recipe's prices.
#[derive(Clone)]
pub struct Sale {
    pub offer: Offer,
    pub facilitator: Arc<dyn Facilitator>,
    pub prices: publish::Pricing,
    pub rental: Option<publish::Rental>,
    /// Also serve `/facilitator/{verify,settle,supported}` with this facilitator.
    pub facilitator_routes: bool,
}

impl AppState {
    pub fn new(model: ServedModel, log: Arc<EventLog>, rentals: Arc<RentalBook>, sale: Option<&Sale>) -> Arc<AppState> {
        let slots = model.recipe.serve.max_batch.max(1) as usize;
        let rental_prices = sale.map(|s| RentalPrices {
            per_call: per_call_ceiling(&s.prices),
            per_hour: s
                .rental
                .as_ref()
                .map(|r| (r.per_hour.atomic(), u64::from(r.min_minutes) * 60, u64::from(r.max_hours) * 3600)),
        });
        Arc::new(AppState {
            model: Arc::new(model),
            admission: Arc::new(Admission::new(slots, slots * QUEUE_PER_SLOT)),
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

/// The model routes, sold through x402 when `sale` is given.
pub fn router(state: Arc<AppState>, sale: Option<&Sale>) -> Router {
    let mut chat = post(chat::completions);
    let mut rentals = post(rental_routes::open);
    let mut app = Router::new();
    if let Some(sale) = sale {
        let events = Arc::new(payments::LogPayments::new(state.log.clone()));
        let mut chat_sale = PaidRouteConfig::new(vec![sale.offer.clone()], chat_pricing(&state, &sale.prices));
        chat_sale.description = Some(format!("chat completion from {}", state.model.name));
        // A rental token pays for the call instead: the handler checks and meters it.
        chat_sale.exempt =
            Some(Arc::new(|parts: &axum::http::request::Parts| chat::rental_token(&parts.headers).is_some()));
        chat = chat.layer(PaidRoute::new(chat_sale, sale.facilitator.clone(), events.clone()));
        let prices = state.rental_prices.unwrap_or(RentalPrices { per_call: 1, per_hour: None });
        let name = state.model.name.clone();
        let quote: mindxtrain_x402::pricing::Quote =
            Arc::new(move |_: &axum::http::request::Parts, body: &[u8]| prices.quote(&name, body).map(|(_, p)| p));
        let mut rental_sale = PaidRouteConfig::new(vec![sale.offer.clone()], Pricing::Quoted(quote));
        rental_sale.description = Some(format!("rental of {}", state.model.name));
        rentals = rentals.layer(PaidRoute::new(rental_sale, sale.facilitator.clone(), events));
        if sale.facilitator_routes {
            app = app.nest("/facilitator", facilitator_routes(sale.facilitator.clone()));
        }
    }
    let model_routes = Router::new()
        .route("/v1/models", get(chat::list_models))
        .route("/v1/models/{id}", get(chat::get_model))
        .route("/v1/chat/completions", chat)
        .route("/v1/rentals", rentals)
        .route("/v1/rentals/{id}", get(rental_routes::show))
        .with_state(state);
    app.merge(model_routes)
}

fn chat_pricing(state: &Arc<AppState>, prices: &publish::Pricing) -> Pricing {
    match (prices.per_call, prices.per_1k_tokens) {
        (_, Some(per_1k)) => {
            let s = state.clone();
            let budget: TokenBudget = Arc::new(move |_, body| chat::token_budget(&s, body));
            Pricing::Per1kTokens { per_1k: per_1k.atomic(), max_charge: per_call_ceiling(prices), budget }
        }
        (Some(p), None) => Pricing::PerCall { amount: p.atomic() },
        (None, None) => Pricing::PerCall { amount: 1 },
    }
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
