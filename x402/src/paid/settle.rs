//! Settling one payment and delivering the answer it bought.
//!
//! Settlement runs on a task of its own: once its intent is durable it goes to the end
//! (receipt read, `payment.settled` or `payment.failed` written) even if the client leaves,
//! so a transfer that lands is always on record and its answer stays redeemable.

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use axum::body::Body;
use axum::response::Response;
use http::{HeaderValue, StatusCode};

use super::{Payments, Settlement, Version};
use crate::events::{PaymentEvents, Recorded, SettledBy};
use crate::evidence::{Expected, check_receipt};
use crate::facilitator::settle_failed;
use crate::header;
use crate::ledger::{AuthKey, Intent, Landed, Ticket};
use crate::reason::RejectReason;
use crate::wire::{PaymentPayload, PaymentRequirements, SettlementResponse};

/// A claimed, verified payment about to be settled.
pub(crate) struct Settling {
    payments: Payments,
    payload: PaymentPayload,
    requirements: PaymentRequirements,
    intent: Intent,
    ticket: Ticket,
    key: AuthKey,
    version: Version,
    /// The ticket took over a settlement whose outcome was unknown.
    took_over: bool,
    /// The intent's record, once it was started ([`Settling::record_intent`]).
    intent_record: Option<(Recorded, VoidUnlessSent)>,
}

/// Closes a recorded intent with `payment.failed` (nothing sent) when the payment is dropped
/// before settlement (refused, its handler failed, its client left), so a restarted node
/// does not take it for a settlement of unknown outcome.
struct VoidUnlessSent {
    events: Arc<dyn PaymentEvents>,
    intent: Option<Intent>,
}

impl VoidUnlessSent {
    fn sent(mut self) {
        self.intent = None;
    }
}

impl Drop for VoidUnlessSent {
    fn drop(&mut self) {
        if let Some(intent) = self.intent.take() {
            self.events.void(&intent);
        }
    }
}

/// What a takeover found on chain.
pub(super) enum Found {
    Yes(Box<Delivery>),
    No(Box<Settling>),
    Refused(SettleRefusal),
}

/// Why a payment was not settled, as the client is told (402, `PAYMENT-RESPONSE`).
pub(crate) struct SettleRefusal {
    response: SettlementResponse,
    /// The outcome is unknown: the client may retry the same header later.
    pending: bool,
}

impl Settling {
    pub(crate) fn new(
        payments: &Payments,
        payload: &PaymentPayload,
        requirements: &PaymentRequirements,
        version: Version,
        intent: Intent,
        ticket: Ticket,
    ) -> Self {
        Self {
            payments: payments.clone(),
            payload: payload.clone(),
            requirements: requirements.clone(),
            key: ticket.key(),
            took_over: ticket.takes_over(),
            intent,
            ticket,
            version,
            intent_record: None,
        }
    }

    /// Starts recording the intent now, so that its write (durable before any broadcast)
    /// overlaps with verification and the handler rather than adding to the settlement.
    pub(crate) fn record_intent(&mut self) {
        if self.intent_record.is_none() {
            self.intent_record = Some(self.start_intent());
        }
    }

    fn start_intent(&self) -> (Recorded, VoidUnlessSent) {
        let recorded = self.payments.events.settling(&self.intent);
        (recorded, VoidUnlessSent { events: self.payments.events.clone(), intent: Some(self.intent.clone()) })
    }

    /// A request that took over a settlement of unknown outcome looks for its transfer
    /// first: found, the payment is settled and its answer is delivered without a new one.
    pub(super) async fn found_on_chain(self) -> Found {
        let (true, Some(evidence)) = (self.took_over, &self.payments.evidence) else { return Found::No(Box::new(self)) };
        let Ok(Some(landed)) = evidence.find(&Expected::of(&self.key, &self.intent)).await else {
            return Found::No(Box::new(self));
        };
        let payer = self.payload.payload.authorization.from.clone();
        let Settling { payments, requirements, intent, ticket, version, .. } = self;
        match record_settled(&payments, intent, ticket, landed, SettledBy::Reconciled).await {
            Ok((intent, ticket)) => {
                Found::Yes(Box::new(Delivery::new(&payments, intent, landed, ticket, version, &requirements, true)))
            }
            Err(e) => Found::Refused(SettleRefusal::new(&RejectReason::SettlementPending, &requirements, payer, Some(e), true)),
        }
    }

    /// Records the intent, settles, checks the transfer and records the outcome, on a task
    /// the request cannot cancel.
    pub(crate) async fn settle(self) -> Result<Delivery, SettleRefusal> {
        let requirements = self.requirements.clone();
        let payer = self.payload.payload.authorization.from.clone();
        match tokio::spawn(self.run()).await {
            Ok(outcome) => outcome,
            Err(e) => Err(SettleRefusal::new(
                &RejectReason::SettlementPending,
                &requirements,
                payer,
                Some(format!("settlement task ended: {e}")),
                true,
            )),
        }
    }

    async fn run(mut self) -> Result<Delivery, SettleRefusal> {
        let payer = self.payload.payload.authorization.from.clone();
        let refuse = |r: &RejectReason, msg: Option<String>, pending| {
            SettleRefusal::new(r, &self.requirements, payer.clone(), msg, pending)
        };
        let (recorded, void) = match self.intent_record.take() {
            Some(started) => started,
            None => self.start_intent(),
        };
        // From here the facilitator may broadcast (once the intent is durable): the intent
        // stays, and its outcome is recorded below or found by reconciliation.
        void.sent();
        self.ticket.settling(self.intent.clone());
        let settled = self.payments.facilitator.settle_checked(&self.payload, &self.requirements, recorded).await;
        let expected = Expected::of(&self.key, &self.intent);
        let checked = match (settled.response.success, settled.landed, &self.payments.evidence) {
            (true, Some(landed), _) => Ok((landed, SettledBy::Request)),
            // A remote facilitator's word is checked against the receipt.
            (true, None, Some(evidence)) => receipt_of(evidence, &settled.response.transaction, &expected)
                .await
                .map(|l| (l, SettledBy::Request))
                .map_err(|m| (RejectReason::SettlementPending, Some(m))),
            (true, None, None) => Err((
                RejectReason::SettlementPending,
                Some("the facilitator's settlement cannot be checked without a chain endpoint".into()),
            )),
            (false, _, _) => {
                let reason = RejectReason::from_code(settled.response.error_reason.as_deref().unwrap_or("unexpected_error"));
                Err((reason, settled.response.error_message.clone()))
            }
        };
        // Ours reverted because the authorization is used: for a takeover that is the
        // earlier attempt's transfer.
        let checked = match checked {
            Err((RejectReason::NonceAlreadyUsed, msg)) if self.took_over => {
                match self.payments.evidence.as_ref().map(|e| e.find(&expected)) {
                    Some(found) => match found.await {
                        Ok(Some(landed)) => Ok((landed, SettledBy::Reconciled)),
                        Ok(None) => Err((RejectReason::SettlementPending, msg)),
                        Err(m) => Err((RejectReason::SettlementPending, Some(m))),
                    },
                    None => Err((RejectReason::SettlementPending, msg)),
                }
            }
            other => other,
        };
        match checked {
            Ok((landed, by)) => {
                let (payments, version, requirements) = (self.payments.clone(), self.version, self.requirements.clone());
                match record_settled(&payments, self.intent, self.ticket, landed, by).await {
                    Ok((intent, ticket)) => Ok(Delivery::new(&payments, intent, landed, ticket, version, &requirements, false)),
                    Err(e) => Err(refuse(&RejectReason::SettlementPending, Some(e), true)),
                }
            }
            Err((RejectReason::SettlementPending, msg)) => {
                self.ticket.unknown();
                Err(refuse(&RejectReason::SettlementPending, msg, true))
            }
            Err((reason, msg)) => {
                self.payments.events.failed(&self.intent, &reason, msg.as_deref());
                self.ticket.failed();
                Err(refuse(&reason, msg, false))
            }
        }
    }
}

/// Writes `payment.settled` (durable before anything else happens) and moves the ledger on.
async fn record_settled(
    payments: &Payments,
    intent: Intent,
    mut ticket: Ticket,
    landed: Landed,
    by: SettledBy,
) -> Result<(Intent, Ticket), String> {
    match payments.events.settled(&intent, &landed, by).await {
        Ok(()) => {
            ticket.settled(landed);
            Ok((intent, ticket))
        }
        Err(e) => {
            // The transfer landed but is not on record: reconciliation writes it later.
            ticket.unknown();
            Err(format!("the settlement landed in {} but could not be recorded: {e}", landed.tx))
        }
    }
}

async fn receipt_of(evidence: &crate::evidence::Evidence, tx: &str, expected: &Expected) -> Result<Landed, String> {
    use alloy::providers::Provider;
    let hash: alloy::primitives::B256 = tx.parse().map_err(|_| format!("the facilitator named no transaction ({tx:?})"))?;
    let receipt = evidence.provider().get_transaction_receipt(hash).await.map_err(|e| e.to_string())?;
    check_receipt(&receipt.ok_or_else(|| format!("no receipt for {hash}"))?, expected)
}

impl SettleRefusal {
    fn new(reason: &RejectReason, req: &PaymentRequirements, payer: String, msg: Option<String>, pending: bool) -> Self {
        Self { response: settle_failed(reason, req, Some(payer), msg), pending }
    }

    /// The failed settlement as the facilitator API answers it.
    pub(crate) fn into_settlement_response(self) -> SettlementResponse {
        self.response
    }

    /// 402 with no body and the failed settlement in the version's response header; a
    /// pending one says when to retry the same header.
    pub(super) fn response(self, version: Version) -> Response {
        let mut r = Response::new(Body::empty());
        *r.status_mut() = StatusCode::PAYMENT_REQUIRED;
        if let Ok(v) = HeaderValue::from_str(&header::encode(&self.response)) {
            r.headers_mut().insert(version.response_header(), v);
        }
        if self.pending {
            r.headers_mut().insert(http::header::RETRY_AFTER, HeaderValue::from_static("5"));
        }
        r
    }
}

/// A settled payment whose answer is on its way: it becomes served when the answer's last
/// byte is handed to the connection, and stays redeemable if the answer never gets there.
pub(crate) struct Delivery {
    events: Arc<dyn PaymentEvents>,
    intent: Intent,
    landed: Landed,
    ticket: Ticket,
    version: Version,
    response: SettlementResponse,
    redeemed: bool,
}

impl Delivery {
    pub(crate) fn new(
        payments: &Payments,
        intent: Intent,
        landed: Landed,
        ticket: Ticket,
        version: Version,
        requirements: &PaymentRequirements,
        redeemed: bool,
    ) -> Self {
        let response = SettlementResponse {
            success: true,
            error_reason: None,
            error_message: None,
            payer: Some(ticket.key().1.to_checksum(None)),
            transaction: landed.tx.to_string(),
            network: requirements.network.clone(),
            amount: Some(intent.value.to_string()),
        };
        let redeemed = redeemed || ticket.attempt() > 1;
        Self { events: payments.events.clone(), intent, landed, ticket, version, response, redeemed }
    }

    /// The settlement as the facilitator API answers it; the payment counts as served (its
    /// caller delivers the answer).
    pub(crate) fn served_now(self) -> SettlementResponse {
        let Delivery { events, intent, landed, ticket, response, .. } = self;
        served(events.as_ref(), &intent, &landed, ticket);
        response
    }

    pub(super) fn settlement(&self) -> Settlement {
        Settlement { tx: self.landed.tx, block: self.landed.block, redeemed: self.redeemed }
    }

    pub(super) fn response_header(&self) -> (&'static str, HeaderValue) {
        let value = HeaderValue::from_str(&header::encode(&self.response)).unwrap_or(HeaderValue::from_static(""));
        (self.version.response_header(), value)
    }

    pub(super) fn payer(&self) -> alloy::primitives::Address {
        self.ticket.key().1
    }

    pub(super) fn nonce(&self) -> alloy::primitives::B256 {
        self.ticket.key().2
    }

    pub(super) fn fingerprint(&self) -> alloy::primitives::B256 {
        self.intent.fingerprint
    }

    /// The body, marking the payment served when its end is reached.
    pub(super) fn wrap(self, body: Body) -> Body {
        let Delivery { events, intent, landed, ticket, .. } = self;
        let done: Box<dyn FnOnce() + Send> = Box::new(move || served(events.as_ref(), &intent, &landed, ticket));
        Body::new(Delivered { inner: body, done: Mutex::new(Some(done)) })
    }
}

fn served(events: &dyn PaymentEvents, intent: &Intent, landed: &Landed, ticket: Ticket) {
    let attempt = ticket.attempt();
    ticket.served();
    events.served(intent, landed, attempt);
}

/// A body that runs `done` once it has yielded its last frame. Dropped earlier (the client
/// left, the stream failed), `done` never runs and the payment stays redeemable.
struct Delivered {
    inner: Body,
    done: Mutex<Option<Box<dyn FnOnce() + Send>>>,
}

impl Delivered {
    fn finish(&self) {
        if let Some(done) = self.done.lock().unwrap_or_else(|e| e.into_inner()).take() {
            done();
        }
    }
}

impl http_body::Body for Delivered {
    type Data = bytes::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<bytes::Bytes>, axum::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(None) => self.finish(),
            Poll::Ready(Some(Err(_))) => {
                // A failed stream was not delivered: dropping `done` leaves the payment redeemable.
                drop(self.done.lock().unwrap_or_else(|e| e.into_inner()).take());
            }
            _ => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        let end = self.inner.is_end_stream();
        if end {
            self.finish();
        }
        end
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}
