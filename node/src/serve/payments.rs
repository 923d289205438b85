//! The x402 layer's reports as log events: `payment.verified`, `payment.settled` (with
//! the transaction), `payment.rejected` (with the reason code), `payment.unsettled` (the
//! handler failed after verification, nothing was charged) and `payment.replayed` (a
//! retry answered from the payment-identifier memory, nothing charged again).
//!
//! The subject is the authorization nonce, so one payment's events share it.

use std::sync::Arc;

use mindxtrain_x402::{PaymentEvents, PaymentFacts, Recorded, RejectReason};
use serde_json::{Value, json};

use crate::log::{AppendRequest, EventLog};

pub struct LogPayments {
    log: Arc<EventLog>,
}

impl LogPayments {
    pub fn new(log: Arc<EventLog>) -> LogPayments {
        LogPayments { log }
    }

    /// Submits the event; the returned future completes when it is durable (or failed, which
    /// is logged).
    fn record(&self, kind: &str, facts: &PaymentFacts, extra: Value) -> Recorded {
        let mut data = json!({
            "resource": facts.resource,
            "network": facts.network,
            "asset": facts.asset,
            "amount": facts.amount,
            "payer": facts.payer,
            "nonce": facts.nonce,
            "payment_id": facts.payment_id,
        });
        if let (Some(d), Value::Object(extra)) = (data.as_object_mut(), extra) {
            d.extend(extra);
        }
        let subject = facts.nonce.clone().unwrap_or_else(|| "unreadable".into());
        Box::pin(super::appended(&self.log, AppendRequest::new(kind, subject, data)))
    }
}

impl PaymentEvents for LogPayments {
    fn verified(&self, facts: &PaymentFacts) {
        tokio::spawn(self.record("payment.verified", facts, json!({})));
    }

    fn settled(&self, facts: &PaymentFacts, tx: &str) -> Recorded {
        self.record("payment.settled", facts, json!({"tx": tx}))
    }

    fn rejected(&self, facts: &PaymentFacts, reason: &RejectReason, message: Option<&str>) {
        tokio::spawn(self.record("payment.rejected", facts, json!({"reason": reason.code(), "message": message})));
    }

    fn not_settled(&self, facts: &PaymentFacts, handler_status: u16) {
        tokio::spawn(self.record("payment.unsettled", facts, json!({"handler_status": handler_status})));
    }

    fn replayed(&self, facts: &PaymentFacts) {
        tokio::spawn(self.record("payment.replayed", facts, json!({})));
    }
}
