//! The x402 layer's reports as log events: `payment.verified`, `payment.settled` (with
//! the transaction), `payment.rejected` (with the reason code), `payment.unsettled` (the
//! handler failed after verification, nothing was charged) and `payment.replayed` (a
//! retry answered from the payment-identifier memory, nothing charged again).
//!
//! The subject is the authorization nonce, so one payment's events share it.

use std::sync::Arc;

use mindxtrain_x402::{PaymentEvents, PaymentFacts, RejectReason};
use serde_json::{Value, json};

use crate::log::{AppendRequest, EventLog};

pub struct LogPayments {
    log: Arc<EventLog>,
}

impl LogPayments {
    pub fn new(log: Arc<EventLog>) -> LogPayments {
        LogPayments { log }
    }

    fn record(&self, kind: &str, facts: &PaymentFacts, extra: Value) {
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
        super::append_in_background(&self.log, AppendRequest::new(kind, subject, data));
    }
}

impl PaymentEvents for LogPayments {
    fn verified(&self, facts: &PaymentFacts) {
        self.record("payment.verified", facts, json!({}));
    }

    fn settled(&self, facts: &PaymentFacts, tx: &str) {
        self.record("payment.settled", facts, json!({"tx": tx}));
    }

    fn rejected(&self, facts: &PaymentFacts, reason: &RejectReason, message: Option<&str>) {
        self.record("payment.rejected", facts, json!({"reason": reason.code(), "message": message}));
    }

    fn not_settled(&self, facts: &PaymentFacts, handler_status: u16) {
        self.record("payment.unsettled", facts, json!({"handler_status": handler_status}));
    }

    fn replayed(&self, facts: &PaymentFacts) {
        self.record("payment.replayed", facts, json!({}));
    }
}
