//! CPU-bound request work, off the async executor and bounded.
//!
//! A handler that computes (checking a recipe, say) would otherwise run on one of the few
//! executor threads that also answer `/healthz`, accept connections and drive every other
//! request, and a request deadline cannot cut work that never yields. [`CpuPool::run`]
//! moves the work to a blocking thread, lets at most [`CpuPool::permits`] of them compute
//! at once (one core is left to the executor) and refuses, with 503 and `Retry-After`,
//! once [`MAX_WAITING`] requests already wait: work queued behind the limit would only
//! outlive its deadline.
//!
//! ```no_run
//! # async fn f() -> Result<(), mindxtrain_node::serve::openai::ApiError> {
//! let pool = mindxtrain_node::api::cpu::CpuPool::new();
//! let sum = pool.run(|| (0..1_000_000u64).sum::<u64>()).await?;
//! # Ok(()) }
//! ```

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::http::StatusCode;
use tokio::sync::Semaphore;

use crate::serve::openai::ApiError;

/// Requests that may wait for a permit before more are refused.
pub const MAX_WAITING: usize = 64;

/// Seconds a refused client is asked to wait (`Retry-After`).
const RETRY_AFTER_S: u64 = 1;

/// A bound on CPU-bound request work (see the module docs).
pub struct CpuPool {
    permits: Arc<Semaphore>,
    size: usize,
    waiting: AtomicUsize,
}

impl Default for CpuPool {
    fn default() -> Self {
        Self::new()
    }
}

impl CpuPool {
    /// One permit per CPU the process may use, but one: that one stays with the executor.
    pub fn new() -> Self {
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        Self::with_permits(cpus.saturating_sub(1).max(1))
    }

    pub fn with_permits(size: usize) -> Self {
        CpuPool { permits: Arc::new(Semaphore::new(size)), size, waiting: AtomicUsize::new(0) }
    }

    /// How many computations may run at once.
    pub fn permits(&self) -> usize {
        self.size
    }

    /// Runs `work` on a blocking thread once a permit is free. The permit is held until the
    /// work returns, even if the request that asked for it has gone (its deadline passed):
    /// the work is bounded, and the next one waits for the core it uses.
    pub async fn run<T: Send + 'static>(&self, work: impl FnOnce() -> T + Send + 'static) -> Result<T, ApiError> {
        let permit = match self.permits.clone().try_acquire_owned() {
            Ok(p) => p,
            Err(_) => {
                if self.waiting.fetch_add(1, Ordering::AcqRel) >= MAX_WAITING {
                    self.waiting.fetch_sub(1, Ordering::AcqRel);
                    return Err(busy());
                }
                let acquired = self.permits.clone().acquire_owned().await;
                self.waiting.fetch_sub(1, Ordering::AcqRel);
                acquired.map_err(|_| busy())?
            }
        };
        tokio::task::spawn_blocking(move || {
            let _permit = permit;
            work()
        })
        .await
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", "worker_failed", e.to_string()))
    }
}

fn busy() -> ApiError {
    let message = format!("too many requests are computing or waiting ({MAX_WAITING}); retry in {RETRY_AFTER_S} s");
    ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "server_error", "busy", message).retry_after(RETRY_AFTER_S)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    #[test]
    fn work_waits_for_a_permit_and_the_queue_is_bounded() {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        rt.block_on(async {
            let pool = Arc::new(CpuPool::with_permits(1));
            let (tx, rx) = std::sync::mpsc::channel::<()>();
            let first = tokio::spawn({
                let pool = pool.clone();
                async move { pool.run(move || rx.recv_timeout(Duration::from_secs(10)).is_ok()).await }
            });
            tokio::time::sleep(Duration::from_millis(50)).await;
            // MAX_WAITING more wait; the one after them is refused at once.
            let waiting: Vec<_> = (0..MAX_WAITING)
                .map(|i| {
                    let pool = pool.clone();
                    tokio::spawn(async move { pool.run(move || i).await })
                })
                .collect();
            tokio::time::sleep(Duration::from_millis(50)).await;
            let t = Instant::now();
            let refused = pool.run(|| 0).await.unwrap_err();
            assert!(t.elapsed() < Duration::from_millis(100));
            assert_eq!((refused.status, refused.retry_after), (StatusCode::SERVICE_UNAVAILABLE, Some(RETRY_AFTER_S)));
            tx.send(()).unwrap();
            assert!(first.await.unwrap().unwrap());
            for (i, w) in waiting.into_iter().enumerate() {
                assert_eq!(w.await.unwrap().unwrap(), i);
            }
        });
    }
}
