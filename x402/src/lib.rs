//! x402 paid HTTP for mindxtrain: wire types (v2, v1 compatible), the EIP-3009 `exact`
//! scheme, facilitators (in-process over alloy, or remote over HTTP, and the routes that
//! serve one) and [`PaidRoute`], the axum layer that sells any handler.
//!
//! * [`wire`], [`header`]: the JSON messages and their size-limited base64 headers;
//! * [`network`]: CAIP-2 networks and USDC/TestUSDC presets;
//! * [`eip712`]: `TransferWithAuthorization` typed data, signing and recovery ([`recover`]);
//! * [`exact`]: offer matching and the checks that need no chain;
//! * [`facilitator`], [`local`], [`remote`]: verify/settle/supported;
//! * [`paid`]: the layer; [`events`]: what it reports; [`pricing`]: what a call costs;
//! * [`ledger`]: every authorization consumed at most once, across routes and restarts;
//!   [`evidence`]: what the chain says about an authorization; [`reconcile`]: settlements
//!   whose outcome was unknown, found on chain;
//! * [`idempotency`]: the payment-identifier extension; [`key`]: the settling key.
//!
//! This crate knows nothing of the node or the trainer: prices arrive as plain numbers
//! and payment events leave through [`PaymentEvents`].
//!
//! Without the default `server` feature only [`wire`] and [`header`] are built (no alloy,
//! no axum): what the fuzz target of the header decoders needs.

pub mod header;
pub mod wire;

/// Items of the `server` feature.
macro_rules! server {
    ($($item:item)*) => { $( #[cfg(feature = "server")] $item )* };
}

server! {
    pub mod eip712;
    pub mod events;
    pub mod exact;
    pub mod facilitator;
    pub mod evidence;
    pub mod idempotency;
    pub mod key;
    pub mod ledger;
    pub mod local;
    pub mod network;
    pub mod paid;
    pub mod pricing;
    pub mod reason;
    pub mod reconcile;
    pub mod recover;
    pub mod remote;

    /// The alloy version these APIs speak.
    pub use alloy;
    pub use events::{NoEvents, PaymentEvents, PaymentFacts, Recorded, SettledBy};
    pub use evidence::Evidence;
    pub use exact::Offer;
    pub use facilitator::{Facilitator, Settled};
    pub use ledger::{Ledger, Record};
    pub use key::SettlerKey;
    pub use local::{LocalFacilitator, LocalFacilitatorConfig, SettleVia};
    pub use network::{Asset, Network};
    pub use paid::{PaidRoute, PaidRouteConfig, Payments, Settlement, VerifiedPayment};
    pub use pricing::{Pricing, Quote, SettleWhen};
    pub use reason::RejectReason;
    pub use remote::{HttpFacilitator, facilitator_routes};
}
