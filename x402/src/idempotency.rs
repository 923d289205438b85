//! The payment-identifier extension on the server side: one id, one payment, one answer.
//!
//! The first request with an id runs; concurrent ones with the same id wait for it; later
//! ones get the stored answer without paying again. Answers are kept for a while (TTL,
//! bounded count); an attempt that ends without a settled answer frees the id.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use alloy::primitives::{Address, B256};
use http::{HeaderMap, StatusCode};
use tokio::sync::watch;

/// A settled answer, replayed to retries of the same payer.
#[derive(Debug, Clone)]
pub struct StoredAnswer {
    pub payer: Address,
    pub nonce: B256,
    /// [`crate::ledger::fingerprint`] of the authorization that paid.
    pub fingerprint: B256,
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: bytes::Bytes,
}

type Outcome = Option<Arc<StoredAnswer>>;

enum Slot {
    Running(watch::Receiver<Outcome>),
    Done(Arc<StoredAnswer>, Instant),
}

pub struct IdempotencyCache {
    slots: Mutex<HashMap<String, Slot>>,
    ttl: Duration,
    capacity: usize,
}

pub enum Claim {
    /// Nobody has this id: run the payment and [`Running::finish`] it.
    Fresh(Running),
    /// Another request with this id is running: wait for it with [`wait`].
    Wait(watch::Receiver<Outcome>),
    /// Settled before.
    Done(Arc<StoredAnswer>),
}

/// The right to run the payment for an id; dropping it unfinished frees the id.
pub struct Running {
    cache: Arc<IdempotencyCache>,
    id: String,
    tx: Option<watch::Sender<Outcome>>,
}

impl IdempotencyCache {
    pub fn new(ttl: Duration, capacity: usize) -> Arc<Self> {
        Arc::new(Self { slots: Mutex::new(HashMap::new()), ttl, capacity: capacity.max(1) })
    }

    pub fn claim(self: &Arc<Self>, id: &str) -> Claim {
        let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        match slots.get(id) {
            Some(Slot::Done(answer, at)) if at.elapsed() < self.ttl => return Claim::Done(answer.clone()),
            Some(Slot::Running(rx)) => return Claim::Wait(rx.clone()),
            _ => {}
        }
        if slots.len() >= self.capacity {
            slots.retain(|_, s| {
                matches!(s, Slot::Done(_, at) if at.elapsed() < self.ttl) || matches!(s, Slot::Running(_))
            });
        }
        if slots.len() >= self.capacity {
            // Still full of live answers: forget the oldest finished one.
            let oldest = slots
                .iter()
                .filter_map(|(k, s)| if let Slot::Done(_, at) = s { Some((k.clone(), *at)) } else { None })
                .min_by_key(|(_, at)| *at)
                .map(|(k, _)| k);
            if let Some(k) = oldest {
                slots.remove(&k);
            }
        }
        let (tx, rx) = watch::channel(None);
        slots.insert(id.to_owned(), Slot::Running(rx));
        Claim::Fresh(Running { cache: self.clone(), id: id.to_owned(), tx: Some(tx) })
    }
}

impl Running {
    /// Stores the settled answer and wakes the waiters.
    pub fn finish(mut self, answer: StoredAnswer) {
        let answer = Arc::new(answer);
        let mut slots = self.cache.slots.lock().unwrap_or_else(|e| e.into_inner());
        slots.insert(self.id.clone(), Slot::Done(answer.clone(), Instant::now()));
        drop(slots);
        if let Some(tx) = self.tx.take() {
            let _ = tx.send(Some(answer));
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(tx) = self.tx.take() {
            let mut slots = self.cache.slots.lock().unwrap_or_else(|e| e.into_inner());
            if matches!(slots.get(&self.id), Some(Slot::Running(_))) {
                slots.remove(&self.id);
            }
            drop(slots);
            let _ = tx.send(None);
        }
    }
}

/// Waits for the running attempt: its answer, or `None` when it ended unsettled.
pub async fn wait(mut rx: watch::Receiver<Outcome>) -> Outcome {
    loop {
        if let Some(a) = rx.borrow_and_update().clone() {
            return Some(a);
        }
        if rx.changed().await.is_err() {
            return rx.borrow().clone();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer() -> StoredAnswer {
        StoredAnswer {
            payer: Address::repeat_byte(1),
            nonce: B256::repeat_byte(2),
            fingerprint: B256::ZERO,
            status: StatusCode::OK,
            headers: HeaderMap::new(),
            body: bytes::Bytes::from_static(b"served"),
        }
    }

    #[tokio::test]
    async fn one_runs_others_wait_then_replay() {
        let cache = IdempotencyCache::new(Duration::from_secs(60), 10);
        let Claim::Fresh(run) = cache.claim("pay_0123456789abcdef") else { panic!("first claim must run") };
        let Claim::Wait(rx) = cache.claim("pay_0123456789abcdef") else { panic!("second must wait") };
        let waiter = tokio::spawn(wait(rx));
        run.finish(answer());
        assert_eq!(waiter.await.unwrap().unwrap().body, "served");
        assert!(matches!(cache.claim("pay_0123456789abcdef"), Claim::Done(_)));
    }

    #[tokio::test]
    async fn an_abandoned_attempt_frees_the_id() {
        let cache = IdempotencyCache::new(Duration::from_secs(60), 10);
        let Claim::Fresh(run) = cache.claim("a") else { panic!() };
        let Claim::Wait(rx) = cache.claim("a") else { panic!() };
        drop(run);
        assert!(wait(rx).await.is_none());
        assert!(matches!(cache.claim("a"), Claim::Fresh(_)));
    }

    #[test]
    fn capacity_and_ttl_bound_the_memory() {
        let cache = IdempotencyCache::new(Duration::from_secs(60), 2);
        for id in ["a", "b", "c"] {
            let Claim::Fresh(run) = cache.claim(id) else { panic!() };
            run.finish(answer());
        }
        assert!(cache.slots.lock().unwrap().len() <= 2);
        let expired = IdempotencyCache::new(Duration::ZERO, 10);
        let Claim::Fresh(run) = expired.claim("a") else { panic!() };
        run.finish(answer());
        assert!(matches!(expired.claim("a"), Claim::Fresh(_)), "expired answers are not replayed");
    }
}
