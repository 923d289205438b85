//! What the payment layer reports, so the node can write `payment.*` events to its log
//! without this crate knowing the log.

use std::future::Future;
use std::pin::Pin;

use crate::reason::RejectReason;

/// Completes when a reported event is recorded (for a log: durable).
pub type Recorded = Pin<Box<dyn Future<Output = ()> + Send>>;

/// A [`Recorded`] that is already complete.
pub fn recorded() -> Recorded {
    Box::pin(std::future::ready(()))
}

/// The payment a request carried, as far as it was understood.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PaymentFacts {
    /// Request path (`/v1/chat/completions`).
    pub resource: String,
    /// CAIP-2 network.
    pub network: String,
    pub asset: String,
    /// Atomic units asked for.
    pub amount: String,
    /// `authorization.from`, when the header could be read.
    pub payer: Option<String>,
    /// `authorization.nonce`, when the header could be read.
    pub nonce: Option<String>,
    /// The payment-identifier extension's id, when present.
    pub payment_id: Option<String>,
}

/// Receives the layer's payment events. Called inline on the request path: keep it
/// cheap (append to a channel or a group-committed log).
pub trait PaymentEvents: Send + Sync + 'static {
    /// `payment.verified`: the facilitator accepted the payment; the handler runs next.
    fn verified(&self, facts: &PaymentFacts);
    /// `payment.settled`: the transfer is on chain in `tx`. The paid answer leaves only once
    /// the returned future completes, so an answer that was paid for is always on record.
    fn settled(&self, facts: &PaymentFacts, tx: &str) -> Recorded;
    /// `payment.rejected`: refused before serving (or settlement failed, body withheld).
    fn rejected(&self, facts: &PaymentFacts, reason: &RejectReason, message: Option<&str>);
    /// The handler failed (status ≥ 400) after verification: nothing was settled.
    fn not_settled(&self, _facts: &PaymentFacts, _handler_status: u16) {}
    /// A retry with a known payment-identifier got the stored answer; nothing was paid.
    fn replayed(&self, _facts: &PaymentFacts) {}
}

/// Ignores every event.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoEvents;

impl PaymentEvents for NoEvents {
    fn verified(&self, _: &PaymentFacts) {}
    fn settled(&self, _: &PaymentFacts, _: &str) -> Recorded {
        recorded()
    }
    fn rejected(&self, _: &PaymentFacts, _: &RejectReason, _: Option<&str>) {}
}
