//! What the payment layer reports, so the node can write `payment.*` events to its log
//! without this crate knowing the log. The events that carry the ledger's durable facts
//! (intent, settlement, failure, delivery) map one to one onto [`crate::ledger::Record`]s,
//! which is how a restarted server rebuilds its ledger.

use std::future::Future;
use std::pin::Pin;

use crate::ledger::{Intent, Landed};
use crate::reason::RejectReason;

/// Completes when a reported event is recorded (for a log: durable), or says why it was not.
pub type Recorded = Pin<Box<dyn Future<Output = Result<(), String>> + Send>>;

/// A [`Recorded`] that is already complete.
pub fn recorded() -> Recorded {
    Box::pin(std::future::ready(Ok(())))
}

/// The payment a request carried, as far as it was understood.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
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

/// How a `payment.settled` came to be known.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SettledBy {
    /// This request's settlement transaction.
    Request,
    /// Found on chain for a settlement whose outcome was unknown (a crash, a lost receipt,
    /// or a retry that found the earlier attempt's transfer).
    Reconciled,
}

impl SettledBy {
    pub fn as_str(self) -> &'static str {
        match self {
            SettledBy::Request => "request",
            SettledBy::Reconciled => "reconciliation",
        }
    }
}

/// Receives the layer's payment events. Called inline on the request path: keep it
/// cheap (append to a channel or a group-committed log).
pub trait PaymentEvents: Send + Sync + 'static {
    /// `payment.verified`: the facilitator accepted the payment; the handler runs next.
    fn verified(&self, facts: &PaymentFacts);
    /// `payment.settling`: the settlement intent. Nothing is broadcast before the returned
    /// future completes `Ok`, so a crash can always be reconciled from the record.
    fn settling(&self, intent: &Intent) -> Recorded;
    /// `payment.settled`: the transfer is on chain. The answer it bought leaves only once the
    /// returned future completes, so an answer that was paid for is always on record.
    fn settled(&self, intent: &Intent, landed: &Landed, by: SettledBy) -> Recorded;
    /// `payment.failed`: a settlement was attempted (or left pending) and will never land.
    fn failed(&self, intent: &Intent, reason: &RejectReason, message: Option<&str>);
    /// `payment.failed` with nothing sent: the intent was recorded, then the payment was
    /// refused or dropped before its settlement was sent.
    fn void(&self, _intent: &Intent) {}
    /// `payment.served`: the paid answer's last byte was handed to the connection;
    /// `attempt` > 1 when it redeemed a settlement whose earlier answers were lost.
    fn served(&self, intent: &Intent, landed: &Landed, attempt: u32);
    /// `payment.rejected`: refused before anything was settled.
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
    fn settling(&self, _: &Intent) -> Recorded {
        recorded()
    }
    fn settled(&self, _: &Intent, _: &Landed, _: SettledBy) -> Recorded {
        recorded()
    }
    fn failed(&self, _: &Intent, _: &RejectReason, _: Option<&str>) {}
    fn served(&self, _: &Intent, _: &Landed, _: u32) {}
    fn rejected(&self, _: &PaymentFacts, _: &RejectReason, _: Option<&str>) {}
}
