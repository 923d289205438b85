//! Admission to the model: a fixed number of generation slots (`serve.max_batch`), a
//! bounded first-come-first-served queue in front of them, a budget of KV-cache blocks, and a
//! polite refusal when the queue or the budget is full (429 with `Retry-After`) or the server
//! is shutting down (503).
//!
//! The KV budget counts what admitted work (running and queued) may need: each request
//! reserves the blocks of its prompt plus its token budget until it ends. The running batch
//! may reserve the whole cache and the queue, as it holds `max_waiting / slots` requests per
//! slot, that many caches more: the engine schedules what fits and preempts beyond it, and
//! work past the queue's share is refused rather than left to wait for minutes.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Instant;

use tokio::sync::{OwnedSemaphorePermit, Semaphore, TryAcquireError};

/// Why a request was not admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// The queue is full; try again after this many seconds.
    Busy { retry_after: u64 },
    /// The server is draining.
    Closed,
}

/// The engine's KV cache, in blocks of `block_size` tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvBudget {
    pub total_blocks: usize,
    pub block_size: usize,
}

impl KvBudget {
    /// Blocks that `tokens` tokens occupy (at least one).
    pub fn blocks(&self, tokens: usize) -> usize {
        tokens.div_ceil(self.block_size.max(1)).max(1)
    }
}

pub struct Admission {
    slots: Arc<Semaphore>,
    kv: Option<KvBudget>,
    /// How many caches' worth of blocks admitted and queued work may reserve.
    kv_depth: usize,
    /// Blocks reserved by admitted and queued requests.
    reserved: AtomicUsize,
    slot_count: usize,
    waiting: AtomicUsize,
    max_waiting: usize,
    /// Exponential average of a completion's duration, in milliseconds.
    avg_ms: AtomicU64,
}

/// Holding it is holding a slot; dropping it frees the slot and its KV reservation and
/// records the duration.
pub struct Slot {
    _permit: OwnedSemaphorePermit,
    blocks: usize,
    admission: Arc<Admission>,
    since: Instant,
}

impl Admission {
    pub fn new(slots: usize, max_waiting: usize, kv: Option<KvBudget>) -> Admission {
        let slots = slots.max(1);
        Admission {
            slots: Arc::new(Semaphore::new(slots)),
            kv,
            kv_depth: 1 + max_waiting.div_ceil(slots),
            reserved: AtomicUsize::new(0),
            slot_count: slots,
            waiting: AtomicUsize::new(0),
            max_waiting,
            avg_ms: AtomicU64::new(1000),
        }
    }

    /// Reserves the KV blocks of a request of `tokens` tokens (prompt plus budget), then
    /// waits for a slot in arrival order (tokio's semaphore is fair), unless the budget or the
    /// queue is already full.
    pub async fn enter(self: &Arc<Self>, tokens: usize) -> Result<Slot, Refused> {
        let blocks = self.reserve(tokens)?;
        let unreserve = |r| {
            self.reserved.fetch_sub(blocks, Ordering::SeqCst);
            r
        };
        let permit = self.slot().await.map_err(unreserve)?;
        Ok(Slot { _permit: permit, blocks, admission: self.clone(), since: Instant::now() })
    }

    fn reserve(&self, tokens: usize) -> Result<usize, Refused> {
        let Some(kv) = self.kv else { return Ok(0) };
        let need = kv.blocks(tokens);
        let limit = kv.total_blocks.saturating_mul(self.kv_depth);
        let mut now = self.reserved.load(Ordering::SeqCst);
        loop {
            if now > 0 && now + need > limit {
                return Err(Refused::Busy { retry_after: self.retry_after(self.waiting()) });
            }
            match self.reserved.compare_exchange(now, now + need, Ordering::SeqCst, Ordering::SeqCst) {
                Ok(_) => return Ok(need),
                Err(actual) => now = actual,
            }
        }
    }

    /// KV blocks reserved by admitted and queued requests.
    pub fn reserved_blocks(&self) -> usize {
        self.reserved.load(Ordering::SeqCst)
    }

    async fn slot(self: &Arc<Self>) -> Result<OwnedSemaphorePermit, Refused> {
        let permit = match self.slots.clone().try_acquire_owned() {
            Ok(p) => p,
            Err(TryAcquireError::Closed) => return Err(Refused::Closed),
            Err(TryAcquireError::NoPermits) => {
                let ahead = self.waiting.fetch_add(1, Ordering::SeqCst);
                if ahead >= self.max_waiting {
                    self.waiting.fetch_sub(1, Ordering::SeqCst);
                    return Err(Refused::Busy { retry_after: self.retry_after(ahead) });
                }
                let got = self.slots.clone().acquire_owned().await;
                self.waiting.fetch_sub(1, Ordering::SeqCst);
                got.map_err(|_| Refused::Closed)?
            }
        };
        Ok(permit)
    }

    /// Stops admitting; requests already admitted finish.
    pub fn close(&self) {
        self.slots.close();
    }

    pub fn waiting(&self) -> usize {
        self.waiting.load(Ordering::SeqCst)
    }

    /// How long until the queue has room, from the average completion time: at least 1 s.
    fn retry_after(&self, ahead: usize) -> u64 {
        let avg = self.avg_ms.load(Ordering::Relaxed);
        let ms = avg.saturating_mul(ahead as u64 + 1) / self.slot_count as u64;
        ms.div_ceil(1000).max(1)
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.admission.reserved.fetch_sub(self.blocks, Ordering::SeqCst);
        let ms = self.since.elapsed().as_millis() as u64;
        let old = self.admission.avg_ms.load(Ordering::Relaxed);
        self.admission.avg_ms.store((old * 7 + ms) / 8, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn slots_then_a_bounded_queue_then_refusal_then_closed() {
        let a = Arc::new(Admission::new(1, 1, None));
        let first = a.enter(10).await.unwrap();
        let waiter = {
            let a = a.clone();
            tokio::spawn(async move { a.enter(10).await.map(|_| ()) })
        };
        while a.waiting() == 0 {
            tokio::task::yield_now().await;
        }
        match a.enter(10).await {
            Err(Refused::Busy { retry_after }) => assert!(retry_after >= 1),
            other => panic!("expected Busy, got {:?}", other.map(|_| ())),
        }
        drop(first);
        assert_eq!(waiter.await.unwrap(), Ok(()));
        a.close();
        assert_eq!(a.enter(10).await.map(|_| ()).unwrap_err(), Refused::Closed);
    }

    #[tokio::test]
    async fn the_kv_budget_bounds_admitted_work_and_is_given_back() {
        // 10 blocks of 16 tokens; a queue of one per slot may reserve as much again.
        let a = Arc::new(Admission::new(8, 8, Some(KvBudget { total_blocks: 10, block_size: 16 })));
        let one = a.enter(160).await.unwrap();
        assert_eq!(a.reserved_blocks(), 10);
        let two = a.enter(150).await.unwrap();
        assert_eq!(a.reserved_blocks(), 20, "150 tokens take 10 blocks");
        assert!(matches!(a.enter(1).await.map(|_| ()), Err(Refused::Busy { .. })), "the budget is full");
        drop(one);
        let three = a.enter(17).await.unwrap();
        assert_eq!(a.reserved_blocks(), 12);
        drop((two, three));
        assert_eq!(a.reserved_blocks(), 0);
        // One request larger than the budget is let in alone (the engine takes what fits).
        let big = a.enter(10_000).await.unwrap();
        assert!(matches!(a.enter(16).await.map(|_| ()), Err(Refused::Busy { .. })));
        drop(big);
        assert_eq!(a.reserved_blocks(), 0);
    }
}
