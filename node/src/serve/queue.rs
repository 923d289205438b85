//! Admission to the model: a fixed number of generation slots (`serve.max_batch`), a
//! bounded first-come-first-served queue in front of them, and a polite refusal when the
//! queue is full (429 with `Retry-After`) or the server is shutting down (503).

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

pub struct Admission {
    slots: Arc<Semaphore>,
    slot_count: usize,
    waiting: AtomicUsize,
    max_waiting: usize,
    /// Exponential average of a completion's duration, in milliseconds.
    avg_ms: AtomicU64,
}

/// Holding it is holding a slot; dropping it frees the slot and records the duration.
pub struct Slot {
    _permit: OwnedSemaphorePermit,
    admission: Arc<Admission>,
    since: Instant,
}

impl Admission {
    pub fn new(slots: usize, max_waiting: usize) -> Admission {
        let slots = slots.max(1);
        Admission {
            slots: Arc::new(Semaphore::new(slots)),
            slot_count: slots,
            waiting: AtomicUsize::new(0),
            max_waiting,
            avg_ms: AtomicU64::new(1000),
        }
    }

    /// Waits for a slot in arrival order (tokio's semaphore is fair), unless the queue is
    /// already full.
    pub async fn enter(self: &Arc<Self>) -> Result<Slot, Refused> {
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
        Ok(Slot { _permit: permit, admission: self.clone(), since: Instant::now() })
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
        let a = Arc::new(Admission::new(1, 1));
        let first = a.enter().await.unwrap();
        let waiter = {
            let a = a.clone();
            tokio::spawn(async move { a.enter().await.map(|_| ()) })
        };
        while a.waiting() == 0 {
            tokio::task::yield_now().await;
        }
        match a.enter().await {
            Err(Refused::Busy { retry_after }) => assert!(retry_after >= 1),
            other => panic!("expected Busy, got {:?}", other.map(|_| ())),
        }
        drop(first);
        assert_eq!(waiter.await.unwrap(), Ok(()));
        a.close();
        assert_eq!(a.enter().await.map(|_| ()).unwrap_err(), Refused::Closed);
    }
}
