//! Settlements whose outcome is not known, found on chain: the server stopped between a
//! settlement's intent and its record (kill -9, power loss), or a receipt could not be read
//! in time. Each pending payment is looked up by its authorization: landed → `payment.settled`
//! (and the payment is redeemable by the client's retry with the same header); not landed and
//! past its `validBefore` → `payment.failed`; otherwise it stays pending and is looked at
//! again later.

use std::sync::Arc;
use std::time::Duration;

use crate::events::{PaymentEvents, SettledBy};
use crate::evidence::{Evidence, Expected};
use crate::exact::now_secs;
use crate::ledger::Ledger;
use crate::reason::RejectReason;

/// Seconds past `validBefore` before an unlanded authorization counts as expired: room for
/// a chain clock a little behind ours.
pub const EXPIRY_MARGIN_SECS: u64 = 30;

/// What one pass found.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Reconciled {
    pub landed: usize,
    pub failed: usize,
    pub pending: usize,
}

/// Looks up every pending payment once.
pub async fn reconcile_once(ledger: &Arc<Ledger>, evidence: &Evidence, events: &dyn PaymentEvents) -> Reconciled {
    let mut done = Reconciled::default();
    for (key, intent) in ledger.pending() {
        let Some(mut ticket) = ledger.reconciling(&key) else { continue };
        match evidence.find(&Expected::of(&key, &intent)).await {
            Ok(Some(landed)) => match events.settled(&intent, &landed, SettledBy::Reconciled).await {
                Ok(()) => {
                    ticket.settled(landed);
                    done.landed += 1;
                }
                Err(e) => {
                    tracing::error!(error = %e, tx = %landed.tx, "a reconciled settlement could not be recorded");
                    ticket.unknown();
                    done.pending += 1;
                }
            },
            Ok(None) if intent.valid_before.saturating_add(EXPIRY_MARGIN_SECS) < now_secs() => {
                let why = "the authorization expired before any settlement of it landed";
                events.failed(&intent, &RejectReason::ValidBeforeExpired, Some(why));
                ticket.failed();
                done.failed += 1;
            }
            Ok(None) => {
                ticket.unknown();
                done.pending += 1;
            }
            Err(e) => {
                tracing::warn!(error = %e, "a pending settlement could not be looked up; trying again later");
                ticket.unknown();
                done.pending += 1;
            }
        }
    }
    done
}

/// Reconciles now, then every `every` (a pass with nothing pending costs no chain call).
pub fn spawn(
    ledger: Arc<Ledger>,
    evidence: Evidence,
    events: Arc<dyn PaymentEvents>,
    every: Duration,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            let r = reconcile_once(&ledger, &evidence, events.as_ref()).await;
            if r != Reconciled::default() {
                tracing::info!(landed = r.landed, failed = r.failed, pending = r.pending, "payments reconciled");
            }
            tokio::time::sleep(every).await;
        }
    })
}
