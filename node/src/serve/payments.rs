//! The x402 layer's reports as log events, and the payment ledger rebuilt from them.
//!
//! | event | when | durable before |
//! |---|---|---|
//! | `payment.verified` | the facilitator accepted the payment | (group-committed in the background) |
//! | `payment.settling` | the intent, written as soon as the authorization is claimed (the write overlaps with verification and the handler) | anything is broadcast |
//! | `payment.settled` | the transfer is on chain, its receipt's logs checked | the answer's first byte |
//! | `payment.failed` | the intent is void: settlement was sent and will never land (`sent: true`), or the payment was refused or dropped before anything was sent (`sent: false`) | — |
//! | `payment.served` | the answer's last byte went to the connection | — |
//! | `payment.rejected` | refused before anything was settled | — |
//! | `payment.unsettled` | the handler failed after verification: nothing charged | — |
//! | `payment.replayed` | a payment-identifier retry got the stored answer | — |
//!
//! The subject is the authorization nonce, so one payment's events share it. The settling,
//! settled, failed and served events are the ledger's [`Record`]s: [`restore_ledger`] folds
//! them back into a [`Ledger`] when the node starts.

use std::sync::Arc;

use mindxtrain_x402::alloy::primitives::{Address, B256};
use mindxtrain_x402::ledger::{AuthKey, Intent, Landed};
use mindxtrain_x402::{Ledger, PaymentEvents, PaymentFacts, Record, Recorded, RejectReason, SettledBy};
use serde_json::{Value, json};

use crate::log::index::{IndexError, Query};
use crate::log::{AppendRequest, EventLog, ReadError};

/// Why the ledger could not be read back from the log.
#[derive(Debug, thiserror::Error)]
pub enum RestoreError {
    #[error("querying the log's index for payment events: {0}")]
    Index(#[from] IndexError),
    #[error("reading a payment event: {0}")]
    Read(#[from] ReadError),
}

/// The events that carry the ledger's facts, in the order [`Record`] names them.
pub const LEDGER_KINDS: [&str; 4] = ["payment.settling", "payment.settled", "payment.failed", "payment.served"];

pub struct LogPayments {
    log: Arc<EventLog>,
}

impl LogPayments {
    pub fn new(log: Arc<EventLog>) -> LogPayments {
        LogPayments { log }
    }

    /// Submits the event; the returned future completes when it is durable.
    fn record(&self, kind: &str, facts: &PaymentFacts, extra: Value) -> Recorded {
        let mut data = facts_json(facts);
        if let (Some(d), Value::Object(extra)) = (data.as_object_mut(), extra) {
            d.extend(extra);
        }
        let subject = facts.nonce.clone().unwrap_or_else(|| "unreadable".into());
        let rx = self.log.submit(AppendRequest::new(kind, subject, data));
        let kind = kind.to_owned();
        Box::pin(async move {
            match rx.await {
                Ok(Ok(_)) => Ok(()),
                Ok(Err(e)) => Err(format!("{kind} not written: {e}")),
                Err(_) => Err(format!("{kind} not written: the log writer is gone")),
            }
        })
    }

    /// Submits the event without waiting for it (it is queued for the group commit at once); a
    /// failure is logged when a runtime is there to wait for the answer.
    fn background(&self, kind: &str, facts: &PaymentFacts, extra: Value) {
        let recorded = self.record(kind, facts, extra);
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                if let Err(e) = recorded.await {
                    tracing::error!(error = %e, "payment event");
                }
            });
        }
    }
}

fn facts_json(facts: &PaymentFacts) -> Value {
    json!({
        "resource": facts.resource,
        "network": facts.network,
        "asset": facts.asset,
        "amount": facts.amount,
        "payer": facts.payer,
        "nonce": facts.nonce,
        "payment_id": facts.payment_id,
    })
}

fn landed_json(landed: &Landed) -> Value {
    json!({"tx": landed.tx.to_string(), "block": landed.block})
}

impl PaymentEvents for LogPayments {
    fn verified(&self, facts: &PaymentFacts) {
        self.background("payment.verified", facts, json!({}));
    }

    fn settling(&self, intent: &Intent) -> Recorded {
        let extra = json!({
            "pay_to": intent.pay_to.to_checksum(None),
            "value": intent.value.to_string(),
            "valid_before": intent.valid_before,
            "fingerprint": intent.fingerprint.to_string(),
        });
        self.record("payment.settling", &intent.facts, extra)
    }

    fn settled(&self, intent: &Intent, landed: &Landed, by: SettledBy) -> Recorded {
        let mut extra = landed_json(landed);
        extra["checked"] = json!(["AuthorizationUsed", "Transfer"]);
        extra["by"] = json!(by.as_str());
        self.record("payment.settled", &intent.facts, extra)
    }

    fn failed(&self, intent: &Intent, reason: &RejectReason, message: Option<&str>) {
        let extra = json!({"reason": reason.code(), "message": message, "sent": true});
        self.background("payment.failed", &intent.facts, extra);
    }

    fn void(&self, intent: &Intent) {
        let message = "refused or abandoned after its intent was recorded, before anything was sent";
        self.background(
            "payment.failed",
            &intent.facts,
            json!({"reason": "not_sent", "message": message, "sent": false}),
        );
    }

    fn served(&self, intent: &Intent, landed: &Landed, attempt: u32) {
        let mut extra = landed_json(landed);
        extra["attempt"] = json!(attempt);
        self.background("payment.served", &intent.facts, extra);
    }

    fn rejected(&self, facts: &PaymentFacts, reason: &RejectReason, message: Option<&str>) {
        self.background("payment.rejected", facts, json!({"reason": reason.code(), "message": message}));
    }

    fn not_settled(&self, facts: &PaymentFacts, handler_status: u16) {
        self.background("payment.unsettled", facts, json!({"handler_status": handler_status}));
    }

    fn replayed(&self, facts: &PaymentFacts) {
        self.background("payment.replayed", facts, json!({}));
    }
}

/// The ledger as the log records it: every settlement intent, settlement, failure and
/// delivery, folded in log order. Events of other shapes (written by older versions) are
/// skipped: they carry no intent, so they cannot be pending.
pub fn restore_ledger(log: &EventLog, now: u64) -> Result<Arc<Ledger>, RestoreError> {
    let mut seqs = Vec::new();
    for kind in LEDGER_KINDS {
        seqs.extend(log.query(&Query::Kind(kind.into()))?);
    }
    seqs.sort_unstable();
    let mut records = Vec::with_capacity(seqs.len());
    for seq in seqs {
        let event = log.get(seq)?;
        if let Some(r) = record(&event.envelope.kind, &event.envelope.data) {
            records.push(r);
        }
    }
    let ledger = Ledger::new();
    ledger.restore(records, now);
    Ok(ledger)
}

/// One event as a ledger record.
pub fn record(kind: &str, data: &Value) -> Option<Record> {
    let text = |k: &str| data.get(k).and_then(Value::as_str);
    let key: AuthKey = (text("asset")?.parse().ok()?, text("payer")?.parse().ok()?, text("nonce")?.parse().ok()?);
    match kind {
        "payment.settling" => {
            let facts = PaymentFacts {
                resource: text("resource")?.into(),
                network: text("network")?.into(),
                asset: text("asset")?.into(),
                amount: text("amount")?.into(),
                payer: text("payer").map(Into::into),
                nonce: text("nonce").map(Into::into),
                payment_id: text("payment_id").map(Into::into),
            };
            let intent = Intent {
                facts,
                pay_to: text("pay_to")?.parse::<Address>().ok()?,
                value: text("value")?.parse().ok()?,
                valid_before: data.get("valid_before")?.as_u64()?,
                fingerprint: text("fingerprint")?.parse::<B256>().ok()?,
            };
            Some(Record::Settling(key, intent))
        }
        "payment.settled" => {
            let landed = Landed { tx: text("tx")?.parse().ok()?, block: data.get("block")?.as_u64()? };
            Some(Record::Settled(key, landed))
        }
        "payment.failed" => Some(Record::Failed(key)),
        "payment.served" => Some(Record::Served(key)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn every_ledger_event_reads_back_as_its_record() {
        let dir = tempfile::tempdir().unwrap();
        let (log, _, _) = tokio::task::block_in_place(|| {
            crate::node::init(dir.path()).unwrap();
            crate::node::open(dir.path()).unwrap()
        });
        let log = Arc::new(log);
        let events = LogPayments::new(log.clone());
        let facts = PaymentFacts {
            resource: "/v1/chat/completions".into(),
            network: "eip155:31337".into(),
            asset: Address::repeat_byte(1).to_checksum(None),
            amount: "10000".into(),
            payer: Some(Address::repeat_byte(2).to_checksum(None)),
            nonce: Some(B256::repeat_byte(3).to_string()),
            payment_id: None,
        };
        let intent = Intent {
            facts,
            pay_to: Address::repeat_byte(4),
            value: 10_000,
            valid_before: 1_900_000_000,
            fingerprint: B256::repeat_byte(5),
        };
        let key = (Address::repeat_byte(1), Address::repeat_byte(2), B256::repeat_byte(3));
        let landed = Landed { tx: B256::repeat_byte(6), block: 7 };
        events.settling(&intent).await.unwrap();
        events.settled(&intent, &landed, SettledBy::Request).await.unwrap();
        events.failed(&intent, &RejectReason::ValidBeforeExpired, None);
        events.served(&intent, &landed, 1);
        events.verified(&intent.facts);
        // The background ones are durable once a later awaited append is.
        events.settling(&intent).await.unwrap();
        let mut got = Vec::new();
        for seq in 1..log.len() {
            let e = log.get(seq).unwrap();
            got.push((e.envelope.kind.clone(), record(&e.envelope.kind, &e.envelope.data)));
        }
        let kinds: Vec<&str> = got.iter().map(|(k, _)| k.as_str()).collect();
        assert!(kinds.contains(&"payment.verified"));
        let records: Vec<Record> = got.into_iter().filter_map(|(_, r)| r).collect();
        assert!(records.contains(&Record::Settling(key, intent.clone())));
        assert!(records.contains(&Record::Settled(key, landed)));
        assert!(records.contains(&Record::Failed(key)));
        assert!(records.contains(&Record::Served(key)));
        assert_eq!(records.len(), 5, "verified is not a ledger record: {records:?}");
    }
}
