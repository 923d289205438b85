//! One ledger of EIP-3009 authorizations for every paid route of a server: an authorization
//! buys exactly one answer, whatever the route, header version, order or timing.
//!
//! Each authorization `(asset, payer, nonce)` moves through these states:
//!
//! ```text
//!  (absent) ──claim──▶ in flight ──intent durable──▶ pending ──transfer landed──▶ settled ──answer delivered──▶ served
//!     ▲                   │ verify refused,               │ refused for good            │ answer lost (crash,
//!     └───────────────────┘ handler failed ◀──────────────┘ (reverted, expired)         │ client left): a retry
//!                                                                                       │ with the same header
//!                                                                                       ▼ redeems it, no new transfer
//! ```
//!
//! The ledger only ever *refuses* on its own: it never accepts a payment the chain has not
//! vouched for (verification and settlement stay with the facilitator). What it remembers
//! durably comes from the owner's event log ([`Record`]s, folded by [`Ledger::restore`]), so a
//! restarted server honours every settlement it made and finishes every one it started
//! (see [`crate::reconcile`]).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use alloy::primitives::{Address, B256, keccak256};

use crate::eip712::ParsedAuthorization;
use crate::events::PaymentFacts;
use crate::reason::RejectReason;

/// `(asset, payer, nonce)`: what the token's `authorizationState` is keyed by.
pub type AuthKey = (Address, Address, B256);

/// How often one settled payment may be redeemed by retries whose answers were lost before
/// delivery; after that it counts as served.
pub const MAX_REDEMPTIONS: u32 = 3;

/// How long after its `validBefore` a settled but undelivered payment stays redeemable.
pub const REDEEM_WINDOW_SECS: u64 = 24 * 3600;

/// A transfer on chain that settled an authorization.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Landed {
    pub tx: B256,
    pub block: u64,
}

/// What the ledger keeps of a payment it settles: enough to redeem it, reconcile it, and
/// write its events again after a restart.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Intent {
    pub facts: PaymentFacts,
    pub pay_to: Address,
    /// Atomic units.
    pub value: u64,
    pub valid_before: u64,
    /// [`fingerprint`] of the authorization: a redemption must present the very same one.
    pub fingerprint: B256,
}

/// keccak256 of the signed message's EIP-712 struct hash and the signature: equal only for
/// the same signed authorization.
pub fn fingerprint(auth: &ParsedAuthorization) -> B256 {
    use alloy::sol_types::SolStruct;
    keccak256([auth.message.eip712_hash_struct().as_slice(), auth.signature.as_ref()].concat())
}

#[derive(Debug, Clone)]
enum State {
    /// A request holds it between its claim and its settlement intent.
    InFlight { prior: Option<Intent> },
    /// Settlement may have been broadcast and its outcome is not known: a request is
    /// settling it (`settling`), or it is left to reconciliation (after a crash, or when a
    /// settlement's outcome could not be read).
    Pending { intent: Intent, settling: bool },
    /// The transfer landed; its answer has not been delivered (`serving`: a request is
    /// delivering it now).
    Settled { intent: Intent, landed: Landed, redemptions: u32, serving: bool },
    /// The answer was delivered.
    Served { valid_before: u64 },
}

/// A ledger fact as the owner's log records it; [`Ledger::restore`] folds them in log order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Record {
    /// The settlement intent, durable before any broadcast.
    Settling(AuthKey, Intent),
    Settled(AuthKey, Landed),
    /// Settlement was attempted and will never land (reverted, refused, expired).
    Failed(AuthKey),
    Served(AuthKey),
}

/// The answer to a claim.
pub enum Claim {
    /// Nobody holds the authorization: verify it, serve, settle.
    Fresh(Ticket),
    /// It was settled and its answer never delivered: serve it again, settle nothing.
    Redeem(Ticket, Landed),
    Refused(RejectReason),
}

/// The ledger shared by every paid route (and the facilitator routes) of a server.
#[derive(Default)]
pub struct Ledger {
    entries: Mutex<HashMap<AuthKey, State>>,
    prune_above: Mutex<usize>,
}

impl Ledger {
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// Claims `key` for one request presenting the authorization with `fingerprint` on
    /// `resource`.
    pub fn claim(self: &Arc<Self>, key: AuthKey, fingerprint: B256, resource: &str, now: u64) -> Claim {
        let mut entries = self.lock();
        self.prune(&mut entries, now);
        let (next, claim) = match entries.remove(&key) {
            None => (State::InFlight { prior: None }, Stage::Claimed),
            Some(State::Pending { intent, settling: false }) => {
                // Its earlier attempt's outcome is unknown; this request takes over. If that
                // transfer lands meanwhile, this one's settlement finds it on chain.
                (State::InFlight { prior: Some(intent) }, Stage::Claimed)
            }
            Some(State::Settled { intent, landed, redemptions, serving: false })
                if intent.fingerprint == fingerprint && intent.facts.resource == resource =>
            {
                if redemptions >= MAX_REDEMPTIONS {
                    entries.insert(key, State::Served { valid_before: intent.valid_before });
                    return Claim::Refused(RejectReason::NonceAlreadyUsed);
                }
                let state = State::Settled { intent, landed, redemptions: redemptions + 1, serving: true };
                entries.insert(key, state);
                return Claim::Redeem(Ticket { ledger: self.clone(), key, stage: Stage::Delivering }, landed);
            }
            Some(other) => {
                let reason = match &other {
                    State::InFlight { .. }
                    | State::Pending { settling: true, .. }
                    | State::Settled { serving: true, .. } => RejectReason::NonceInFlight,
                    _ => RejectReason::NonceAlreadyUsed,
                };
                entries.insert(key, other);
                return Claim::Refused(reason);
            }
        };
        entries.insert(key, next);
        Claim::Fresh(Ticket { ledger: self.clone(), key, stage: claim })
    }

    /// Folds records from the owner's log (in log order) into the ledger: what a restarted
    /// server knows. Entries that can no longer matter at `now` are left out.
    pub fn restore(&self, records: impl IntoIterator<Item = Record>, now: u64) {
        let mut entries = self.lock();
        for record in records {
            match record {
                Record::Settling(key, intent) => {
                    entries.insert(key, State::Pending { intent, settling: false });
                }
                Record::Settled(key, landed) => {
                    if let Some(State::Pending { intent, .. }) = entries.remove(&key) {
                        entries.insert(key, State::Settled { intent, landed, redemptions: 0, serving: false });
                    }
                }
                Record::Failed(key) => {
                    if matches!(entries.get(&key), Some(State::Pending { .. })) {
                        entries.remove(&key);
                    }
                }
                Record::Served(key) => {
                    let valid_before = match entries.get(&key) {
                        Some(State::Settled { intent, .. } | State::Pending { intent, .. }) => intent.valid_before,
                        _ => continue,
                    };
                    entries.insert(key, State::Served { valid_before });
                }
            }
        }
        self.prune(&mut entries, now);
    }

    /// Payments whose settlement outcome is unknown and that no request is settling.
    pub fn pending(&self) -> Vec<(AuthKey, Intent)> {
        self.lock()
            .iter()
            .filter_map(|(k, s)| match s {
                State::Pending { intent, settling: false } => Some((*k, intent.clone())),
                _ => None,
            })
            .collect()
    }

    /// Takes a pending payment for reconciliation: while the returned ticket lives, requests
    /// presenting the authorization are told it is in flight. `None` when it is no longer
    /// pending (a request took it over, or another reconciliation has it).
    pub fn reconciling(self: &Arc<Self>, key: &AuthKey) -> Option<Ticket> {
        let mut entries = self.lock();
        match entries.get_mut(key) {
            Some(State::Pending { settling, .. }) if !*settling => {
                *settling = true;
                Some(Ticket { ledger: self.clone(), key: *key, stage: Stage::Settling })
            }
            _ => None,
        }
    }

    /// How many authorizations the ledger holds, by state (in flight, pending, settled and
    /// undelivered, served).
    pub fn counts(&self) -> [usize; 4] {
        let mut c = [0; 4];
        for s in self.lock().values() {
            c[match s {
                State::InFlight { .. } => 0,
                State::Pending { .. } => 1,
                State::Settled { .. } => 2,
                State::Served { .. } => 3,
            }] += 1;
        }
        c
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<AuthKey, State>> {
        self.entries.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Drops entries that can no longer matter: an expired authorization is refused by the
    /// time-window check before the ledger is asked, so a served one past its `validBefore`,
    /// or a settled one past its redemption window, needs no memory. Runs when the map has
    /// doubled since the last pass, so its cost is amortised over the claims.
    fn prune(&self, entries: &mut HashMap<AuthKey, State>, now: u64) {
        let mut above = self.prune_above.lock().unwrap_or_else(|e| e.into_inner());
        if entries.len() < (*above).max(1024) {
            return;
        }
        entries.retain(|_, s| match s {
            State::Served { valid_before } => *valid_before >= now,
            State::Settled { intent, serving: false, .. } => {
                intent.valid_before.saturating_add(REDEEM_WINDOW_SECS) >= now
            }
            _ => true,
        });
        *above = entries.len() * 2;
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    /// Claimed, nothing written yet.
    Claimed,
    /// The intent is durable; settlement is under way.
    Settling,
    /// Settled (by this request or before); its answer is being delivered.
    Delivering,
    /// Finished: nothing to undo on drop.
    Done,
}

/// One request's hold on an authorization. Each step moves the ledger on; dropping the
/// ticket early puts the authorization where a later request can pick it up again: free
/// (nothing was settled), pending (settlement outcome unknown) or redeemable (settled, the
/// answer not delivered).
pub struct Ticket {
    ledger: Arc<Ledger>,
    key: AuthKey,
    stage: Stage,
}

impl Ticket {
    pub fn key(&self) -> AuthKey {
        self.key
    }

    /// The settlement intent is durable: settlement may now be broadcast.
    pub fn settling(&mut self, intent: Intent) {
        self.set(State::Pending { intent, settling: true }, Stage::Settling);
    }

    /// Whether this request took over a settlement whose outcome was unknown (after a crash,
    /// say): its transfer may already be on chain, and should be looked for first.
    pub fn takes_over(&self) -> bool {
        matches!(self.ledger.lock().get(&self.key), Some(State::InFlight { prior: Some(_) }))
    }

    /// The transfer landed (this request's, or the earlier attempt's it took over): the
    /// answer it bought is being delivered.
    pub fn settled(&mut self, landed: Landed) {
        let intent = match self.ledger.lock().get(&self.key) {
            Some(State::Pending { intent, .. } | State::InFlight { prior: Some(intent) }) => intent.clone(),
            _ => return,
        };
        self.set(State::Settled { intent, landed, redemptions: 0, serving: true }, Stage::Delivering);
    }

    /// Settlement was refused for good (it reverted or was rejected before sending): the
    /// authorization is free again; the chain decides what a new attempt gets.
    pub fn failed(mut self) {
        self.ledger.lock().remove(&self.key);
        self.stage = Stage::Done;
    }

    /// Settlement's outcome cannot be known now: reconciliation will find it.
    pub fn unknown(mut self) {
        self.release();
        self.stage = Stage::Done;
    }

    /// 1 for the first delivery of a settlement's answer, more for redemptions.
    pub fn attempt(&self) -> u32 {
        match self.ledger.lock().get(&self.key) {
            Some(State::Settled { redemptions, .. }) => redemptions + 1,
            _ => 1,
        }
    }

    /// The answer was delivered: the authorization is spent.
    pub fn served(mut self) {
        let valid_before = match self.ledger.lock().get(&self.key) {
            Some(State::Settled { intent, .. }) => intent.valid_before,
            _ => return,
        };
        self.set(State::Served { valid_before }, Stage::Done);
    }

    fn set(&mut self, state: State, stage: Stage) {
        self.ledger.lock().insert(self.key, state);
        self.stage = stage;
    }

    fn release(&mut self) {
        let mut entries = self.ledger.lock();
        let Some(state) = entries.remove(&self.key) else { return };
        let back = match (self.stage, state) {
            (Stage::Claimed, State::InFlight { prior: Some(intent) }) => Some(State::Pending { intent, settling: false }),
            (Stage::Claimed, State::InFlight { prior: None }) => None,
            (Stage::Settling, State::Pending { intent, .. }) => Some(State::Pending { intent, settling: false }),
            (Stage::Delivering, State::Settled { intent, landed, redemptions, .. }) => {
                Some(State::Settled { intent, landed, redemptions, serving: false })
            }
            (_, other) => Some(other),
        };
        if let Some(s) = back {
            entries.insert(self.key, s);
        }
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if self.stage != Stage::Done {
            self.release();
        }
    }
}

#[cfg(test)]
mod tests;
