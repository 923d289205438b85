//! Rentals: a payer buys N calls or T seconds of a served model up front (one x402
//! payment) and gets a rental token, signed by the node, that stands in for payment on
//! each call until it is used up or expires.
//!
//! The log is the record: `rental.opened`, `rental.used` (one per call, with its tokens)
//! and `rental.closed` events; the in-memory book is a fold of them, rebuilt at start, so
//! a restarted node honours every rental it sold.
//!
//! Token: `mxr1.<base64url(claims JSON)>.<base64url(ed25519 signature)>`, the signature
//! over `mindxtrain-rental-v1\n` followed by the claims bytes.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use ed25519_dalek::{Signature, Verifier};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use thiserror::Error;

use crate::identity::Identity;
use crate::log::{AppendRequest, EventLog, index::Query};

/// The start of every rental token (then `.`).
pub const TOKEN_PREFIX: &str = "mxr1.";
const SIGNING_CONTEXT: &[u8] = b"mindxtrain-rental-v1\n";

/// What a rental token grants (and what its signature covers).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RentalClaims {
    pub v: u32,
    pub id: String,
    /// The issuing node's ed25519 public key, hex.
    pub node: String,
    pub model: String,
    /// Checksummed address that paid.
    pub payer: String,
    /// Calls granted; `None` for a time rental.
    pub calls: Option<u64>,
    /// Unix seconds after which the token is void.
    pub expires: u64,
}

/// What was bought.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Terms {
    Calls(u64),
    Seconds(u64),
}

#[derive(Debug, Error, PartialEq, Eq)]
pub enum RentalError {
    #[error("not a rental token of this node")]
    BadToken,
    #[error("unknown rental {0}")]
    Unknown(String),
    #[error("rental {id} is closed ({reason})")]
    Closed { id: String, reason: String },
    #[error("rental {id} is for model {rented:?}, not {asked:?}")]
    WrongModel { id: String, rented: String, asked: String },
    #[error("rental {0} has no calls left")]
    UsedUp(String),
    #[error("the log refused the rental event: {0}")]
    Log(String),
}

#[derive(Debug, Clone)]
struct Rental {
    claims: RentalClaims,
    used: u64,
    /// Calls admitted and not yet finished.
    in_use: u64,
    closed: Option<String>,
    opened: Value,
}

pub struct RentalBook {
    log: Arc<EventLog>,
    identity: Arc<Identity>,
    rentals: Mutex<HashMap<String, Rental>>,
}

/// One admitted call on a rental; dropping it unfinished gives the call back.
pub struct Reservation {
    book: Arc<RentalBook>,
    id: String,
    finished: bool,
}

impl RentalBook {
    /// The book as the log records it.
    pub fn load(log: Arc<EventLog>, identity: Arc<Identity>) -> Result<Arc<RentalBook>, RentalError> {
        let book = RentalBook { log, identity, rentals: Mutex::new(HashMap::new()) };
        let mut seqs = Vec::new();
        for kind in ["rental.opened", "rental.used", "rental.closed"] {
            seqs.extend(book.log.query(&Query::Kind(kind.into())).map_err(|e| RentalError::Log(e.to_string()))?);
        }
        seqs.sort_unstable();
        {
            let mut rentals = book.rentals.lock().unwrap_or_else(|p| p.into_inner());
            for seq in seqs {
                let event = book.log.get(seq).map_err(|e| RentalError::Log(e.to_string()))?;
                apply(&mut rentals, &event.envelope.kind, &event.envelope.data);
            }
        }
        Ok(Arc::new(book))
    }

    /// Records a paid rental and returns its claims and token.
    pub async fn open(
        &self,
        model: &str,
        payer: &str,
        terms: Terms,
        payment: Value,
        now: u64,
    ) -> Result<(RentalClaims, String), RentalError> {
        let mut rnd = [0u8; 16];
        getrandom::fill(&mut rnd).map_err(|e| RentalError::Log(e.to_string()))?;
        let (calls, expires) = match terms {
            Terms::Calls(n) => (Some(n), now + CALL_RENTAL_LIFETIME_SECS),
            Terms::Seconds(s) => (None, now + s),
        };
        let claims = RentalClaims {
            v: 1,
            id: format!("rent-{}", hex::encode(rnd)),
            node: hex::encode(self.identity.public_bytes()),
            model: model.to_string(),
            payer: payer.to_string(),
            calls,
            expires,
        };
        let data = json!({"claims": claims, "payment": payment, "opened_at": now});
        self.append("rental.opened", &claims.id, data.clone()).await?;
        let mut rentals = self.lock();
        apply(&mut rentals, "rental.opened", &data);
        Ok((claims.clone(), sign_token(&self.identity, &claims)))
    }

    /// The rental a settled payment already opened (its transaction), with its token: a
    /// retry whose first answer was lost gets the same rental, not a second one.
    pub fn opened_by(&self, tx: &str) -> Option<(RentalClaims, String)> {
        let rentals = self.lock();
        let r = rentals.values().find(|r| r.opened["payment"]["tx"].as_str() == Some(tx))?;
        Some((r.claims.clone(), sign_token(&self.identity, &r.claims)))
    }

    /// Admits one call carrying `token` for `model`.
    pub fn reserve(self: &Arc<Self>, token: &str, model: &str, now: u64) -> Result<Reservation, RentalError> {
        let claims = verify_token(token, &self.identity.verifying_key())?;
        let mut rentals = self.lock();
        let r = rentals.get_mut(&claims.id).ok_or_else(|| RentalError::Unknown(claims.id.clone()))?;
        if let Some(reason) = &r.closed {
            return Err(RentalError::Closed { id: claims.id, reason: reason.clone() });
        }
        if now >= r.claims.expires {
            drop(rentals);
            self.close(&claims.id, "expired");
            return Err(RentalError::Closed { id: claims.id, reason: "expired".into() });
        }
        if r.claims.model != model {
            return Err(RentalError::WrongModel { id: claims.id, rented: r.claims.model.clone(), asked: model.into() });
        }
        if r.claims.calls.is_some_and(|n| r.used + r.in_use >= n) {
            return Err(RentalError::UsedUp(claims.id));
        }
        r.in_use += 1;
        Ok(Reservation { book: self.clone(), id: claims.id, finished: false })
    }

    /// A rental's state: claims, calls used and left, open or closed (and why).
    pub fn state(&self, id: &str, now: u64) -> Option<Value> {
        let expired = self.lock().get(id).is_some_and(|r| r.closed.is_none() && now >= r.claims.expires);
        if expired {
            self.close(id, "expired");
        }
        let rentals = self.lock();
        let r = rentals.get(id)?;
        Some(json!({
            "id": r.claims.id,
            "model": r.claims.model,
            "payer": r.claims.payer,
            "calls": r.claims.calls,
            "calls_used": r.used,
            "calls_left": r.claims.calls.map(|n| n.saturating_sub(r.used)),
            "expires": r.claims.expires,
            "status": if r.closed.is_some() { "closed" } else { "open" },
            "closed_reason": r.closed,
            "payment": r.opened.get("payment"),
        }))
    }

    fn close(&self, id: &str, reason: &str) {
        let data = json!({"id": id, "reason": reason});
        {
            let mut rentals = self.lock();
            match rentals.get(id) {
                Some(r) if r.closed.is_none() => apply(&mut rentals, "rental.closed", &data),
                _ => return,
            }
        }
        // Durable in the background: the state above is already closed, and a lost close
        // is re-derived (expiry, calls used) when the book is rebuilt.
        self.submit("rental.closed", id, data);
    }

    async fn append(&self, kind: &str, subject: &str, data: Value) -> Result<(), RentalError> {
        self.log
            .append_async(AppendRequest::new(kind, subject, data))
            .await
            .map_err(|e| RentalError::Log(e.to_string()))?;
        Ok(())
    }

    fn submit(&self, kind: &str, subject: &str, data: Value) {
        super::append_in_background(&self.log, AppendRequest::new(kind, subject, data));
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Rental>> {
        self.rentals.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// How long a call rental stays valid: calls are the limit, not time, but a token must
/// expire some day.
pub const CALL_RENTAL_LIFETIME_SECS: u64 = 30 * 24 * 3600;

/// A rental token for `claims`, signed by the node.
pub fn sign_token(identity: &Identity, claims: &RentalClaims) -> String {
    let body = serde_json::to_vec(claims).unwrap_or_default();
    let sig = identity.sign(&[SIGNING_CONTEXT, &body].concat());
    format!("{TOKEN_PREFIX}{}.{}", B64.encode(&body), B64.encode(sig))
}

/// Checks a token's signature against `node_key` and returns its claims.
pub fn verify_token(token: &str, node_key: &ed25519_dalek::VerifyingKey) -> Result<RentalClaims, RentalError> {
    let mut parts = token.strip_prefix(TOKEN_PREFIX).ok_or(RentalError::BadToken)?.split('.');
    let (Some(body), Some(sig), None) = (parts.next(), parts.next(), parts.next()) else {
        return Err(RentalError::BadToken);
    };
    let body = B64.decode(body).map_err(|_| RentalError::BadToken)?;
    let sig: [u8; 64] = B64.decode(sig).ok().and_then(|s| s.try_into().ok()).ok_or(RentalError::BadToken)?;
    node_key
        .verify(&[SIGNING_CONTEXT, &body].concat(), &Signature::from_bytes(&sig))
        .map_err(|_| RentalError::BadToken)?;
    let claims: RentalClaims = serde_json::from_slice(&body).map_err(|_| RentalError::BadToken)?;
    if claims.node != hex::encode(node_key.as_bytes()) {
        return Err(RentalError::BadToken);
    }
    Ok(claims)
}

/// Folds one rental event into the book.
fn apply(rentals: &mut HashMap<String, Rental>, kind: &str, data: &Value) {
    match kind {
        "rental.opened" => {
            if let Ok(claims) = serde_json::from_value::<RentalClaims>(data["claims"].clone()) {
                let id = claims.id.clone();
                rentals.insert(id, Rental { claims, used: 0, in_use: 0, closed: None, opened: data.clone() });
            }
        }
        "rental.used" => {
            if let Some(r) = data["id"].as_str().and_then(|id| rentals.get_mut(id)) {
                r.used += 1;
            }
        }
        "rental.closed" => {
            if let Some(r) = data["id"].as_str().and_then(|id| rentals.get_mut(id)) {
                r.closed.get_or_insert_with(|| data["reason"].as_str().unwrap_or("closed").to_string());
            }
        }
        _ => {}
    }
}

impl Reservation {
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The call was served: count it (`rental.used`, durable before the answer leaves)
    /// and close the rental when this was its last call.
    pub async fn finish(mut self, usage: Value) -> Result<(), RentalError> {
        self.finished = true;
        let (data, last) = {
            let mut rentals = self.book.lock();
            let Some(r) = rentals.get_mut(&self.id) else { return Err(RentalError::Unknown(self.id.clone())) };
            r.in_use -= 1;
            r.used += 1;
            let data = json!({"id": self.id, "call": r.used, "usage": usage});
            (data, r.claims.calls.is_some_and(|n| r.used >= n))
        };
        self.book.append("rental.used", &self.id, data).await?;
        if last {
            self.book.close(&self.id, "used_up");
        }
        Ok(())
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if !self.finished
            && let Some(r) = self.book.lock().get_mut(&self.id)
        {
            r.in_use -= 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn identity() -> (tempfile::TempDir, Identity) {
        let dir = tempfile::tempdir().unwrap();
        let id = Identity::create_in(dir.path()).unwrap();
        (dir, id)
    }

    fn claims(id: &Identity) -> RentalClaims {
        RentalClaims {
            v: 1,
            id: "rent-1".into(),
            node: hex::encode(id.public_bytes()),
            model: "m".into(),
            payer: "0x0000000000000000000000000000000000000001".into(),
            calls: Some(2),
            expires: 10,
        }
    }

    #[test]
    fn tokens_verify_only_untouched_and_under_their_node_key() {
        let ((_d1, node), (_d2, other)) = (identity(), identity());
        let token = sign_token(&node, &claims(&node));
        assert_eq!(verify_token(&token, &node.verifying_key()), Ok(claims(&node)));
        assert_eq!(verify_token(&token, &other.verifying_key()), Err(RentalError::BadToken), "another node's key");
        // The other node signing claims that name the first node: the signature is checked first.
        let forged = sign_token(&other, &claims(&node));
        assert_eq!(verify_token(&forged, &node.verifying_key()), Err(RentalError::BadToken));
        // Claims naming another node, signed by it, do not pass as this node's.
        let foreign = sign_token(&other, &claims(&other));
        assert_eq!(verify_token(&foreign, &node.verifying_key()), Err(RentalError::BadToken));
        for i in TOKEN_PREFIX.len()..token.len() {
            let mut bytes = token.clone().into_bytes();
            bytes[i] = if bytes[i] == b'A' { b'B' } else { b'A' };
            let tampered = String::from_utf8(bytes).unwrap();
            if tampered != token {
                assert!(verify_token(&tampered, &node.verifying_key()).is_err(), "byte {i} changed and still valid");
            }
        }
        assert!(verify_token(&token[..token.len() - 3], &node.verifying_key()).is_err());
        assert!(verify_token(&token.replacen("mxr1.", "mxr2.", 1), &node.verifying_key()).is_err());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_payment_opens_one_rental_and_a_retry_gets_the_same_one() {
        let dir = tempfile::tempdir().unwrap();
        let (log, id, _) = tokio::task::block_in_place(|| {
            crate::node::init(dir.path()).unwrap();
            crate::node::open(dir.path()).unwrap()
        });
        let book = RentalBook::load(Arc::new(log), Arc::new(id)).unwrap();
        assert!(book.opened_by("0xabc").is_none());
        let payment = json!({"tx": "0xabc", "amount": "10"});
        let (claims, token) = book.open("m", "0x01", Terms::Calls(2), payment, 5).await.unwrap();
        assert_eq!(book.opened_by("0xabc"), Some((claims, token)), "the same claims and token");
        assert!(book.opened_by("0xdef").is_none());
    }

    proptest! {
        #[test]
        fn arbitrary_strings_are_refused_without_panic(s in ".{0,300}", body in proptest::collection::vec(any::<u8>(), 0..200)) {
            let (_d, node) = identity();
            prop_assert!(verify_token(&s, &node.verifying_key()).is_err());
            let crafted = format!("{TOKEN_PREFIX}{}.{}", B64.encode(&body), B64.encode([0u8; 64]));
            prop_assert!(verify_token(&crafted, &node.verifying_key()).is_err());
        }
    }
}
