//! The facilitator interface (verify, settle, supported) and the `exact` answers built
//! from a [`RejectReason`].

use std::future::Future;
use std::pin::Pin;

use crate::events::Recorded;
use crate::evidence::Evidence;
use crate::ledger::Landed;
use crate::reason::RejectReason;
use crate::wire::{PaymentPayload, PaymentRequirements, SettlementResponse, SupportedResponse, VerifyResponse};

pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A settlement's answer with the transfer the chain showed for it: `landed` is set when the
/// facilitator read the receipt and checked its logs itself (the in-process one does).
#[derive(Debug, Clone)]
pub struct Settled {
    pub response: SettlementResponse,
    pub landed: Option<Landed>,
}

/// Verifies and settles payments. Failures are answers, not errors: an unreachable
/// facilitator is `isValid: false` / `success: false` with `facilitator_unavailable`.
pub trait Facilitator: Send + Sync + 'static {
    fn verify<'a>(&'a self, payload: &'a PaymentPayload, req: &'a PaymentRequirements)
    -> BoxFuture<'a, VerifyResponse>;
    fn settle<'a>(
        &'a self,
        payload: &'a PaymentPayload,
        req: &'a PaymentRequirements,
    ) -> BoxFuture<'a, SettlementResponse>;
    fn supported(&self) -> BoxFuture<'_, SupportedResponse>;

    /// [`Facilitator::settle`], with the checked transfer when this facilitator reads the chain.
    /// Nothing may be broadcast before `ready` (the caller's durable settlement intent)
    /// completes `Ok`; a facilitator may prepare the transaction meanwhile.
    fn settle_checked<'a>(
        &'a self,
        payload: &'a PaymentPayload,
        req: &'a PaymentRequirements,
        ready: Recorded,
    ) -> BoxFuture<'a, Settled> {
        Box::pin(async move {
            if let Err(e) = ready.await {
                let why = Some(format!("the settlement intent was not recorded, nothing was sent: {e}"));
                let payer = Some(payload.payload.authorization.from.clone());
                return Settled { response: settle_failed(&RejectReason::FacilitatorUnavailable, req, payer, why), landed: None };
            }
            Settled { response: self.settle(payload, req).await, landed: None }
        })
    }

    /// The chain reader this facilitator settles through, if it has one.
    fn evidence(&self) -> Option<Evidence> {
        None
    }
}

pub fn verify_ok(payer: &str) -> VerifyResponse {
    VerifyResponse { is_valid: true, invalid_reason: None, invalid_message: None, payer: Some(payer.into()) }
}

pub fn verify_rejected(reason: &RejectReason, payer: Option<String>, message: Option<String>) -> VerifyResponse {
    VerifyResponse { is_valid: false, invalid_reason: Some(reason.code().into()), invalid_message: message, payer }
}

pub fn settle_failed(
    reason: &RejectReason,
    req: &PaymentRequirements,
    payer: Option<String>,
    message: Option<String>,
) -> SettlementResponse {
    SettlementResponse {
        success: false,
        error_reason: Some(reason.code().into()),
        error_message: message,
        payer,
        transaction: String::new(),
        network: req.network.clone(),
        amount: None,
    }
}
