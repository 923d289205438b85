//! Verifying without a chain round trip for a payer the chain has just vouched for.
//!
//! A successful simulation of `transferWithAuthorization(from → to, value)` at block N says
//! that at N the token is not paused, neither side is blocked, the token accepts `from`'s
//! ECDSA signatures and `balanceOf(from) ≥ value`. Another authorization from the same
//! payer to the same recipient for at most `value`, whose ECDSA signature recovers `from`
//! (checked offline) and whose nonce is fresh, passes the same simulation at N. So while the
//! head is still N, verify answers it without asking the chain. When the head moves (the
//! follower sees a new block, or one of our own settlements lands) every voucher lapses and
//! the next payment simulates again.
//!
//! The view can lag the chain by up to one poll, and a nonce is only known fresh to the
//! extent that nobody else submitted the authorization (which pays the recipient anyway).
//! Settlement stays authoritative: the token refuses a payment that a lagging view let
//! through, and the paid layer then serves nothing. If the head cannot be read for three
//! polls, no voucher is honoured until it can.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use alloy::primitives::{Address, U256};
use alloy::providers::{DynProvider, Provider};

/// Token, payer, recipient: what a simulation's success is about.
pub type PayerKey = (Address, Address, Address);

/// The highest value simulated successfully for a payer, and the block it held at.
#[derive(Debug, Clone, Copy)]
struct Voucher {
    block: u64,
    value: U256,
}

/// The followed chain head: its number and when it was last read.
struct Head {
    block: AtomicU64,
    read_at_ms: AtomicU64,
    epoch: Instant,
    fresh_for: Duration,
}

impl Head {
    fn advance(&self, block: u64) {
        self.block.fetch_max(block, Ordering::AcqRel);
        self.read_at_ms.store(self.epoch.elapsed().as_millis() as u64, Ordering::Release);
    }

    fn fresh(&self) -> bool {
        let age = self.epoch.elapsed().as_millis() as u64 - self.read_at_ms.load(Ordering::Acquire);
        age <= self.fresh_for.as_millis() as u64
    }
}

/// Vouchers per payer, lapsing when the followed head moves.
pub struct Vouchers {
    head: Arc<Head>,
    by_payer: Mutex<HashMap<PayerKey, Voucher>>,
    follower: tokio::task::JoinHandle<()>,
}

/// Above this many payers the map starts over (each payer then simulates once more).
const MAX_PAYERS: usize = 100_000;

impl Vouchers {
    /// Reads the head once, then follows it every `poll` in a background task.
    pub async fn follow(provider: DynProvider, poll: Duration) -> Result<Self, alloy::transports::TransportError> {
        let head = Arc::new(Head {
            block: AtomicU64::new(0),
            read_at_ms: AtomicU64::new(0),
            epoch: Instant::now(),
            fresh_for: poll * 3,
        });
        head.advance(provider.get_block_number().await?);
        let followed = head.clone();
        let follower = tokio::spawn(async move {
            loop {
                tokio::time::sleep(poll).await;
                if let Ok(n) = provider.get_block_number().await {
                    followed.advance(n);
                }
            }
        });
        Ok(Self { head, by_payer: Mutex::new(HashMap::new()), follower })
    }

    /// The newest block seen.
    pub fn head(&self) -> u64 {
        self.head.block.load(Ordering::Acquire)
    }

    /// A block we know exists (a settlement's receipt): vouchers from before it lapse now
    /// rather than at the next poll.
    pub fn advance(&self, block: u64) {
        self.head.advance(block);
    }

    /// Whether a simulation at the current head vouches for `value` from this payer.
    pub fn covers(&self, key: &PayerKey, value: U256) -> bool {
        let head = self.head();
        self.head.fresh() && lock(&self.by_payer).get(key).is_some_and(|v| v.block == head && value <= v.value)
    }

    /// A simulation of `value` for this payer succeeded at (or after) `block`.
    pub fn grant(&self, key: PayerKey, block: u64, value: U256) {
        let mut map = lock(&self.by_payer);
        if map.len() >= MAX_PAYERS && !map.contains_key(&key) {
            map.clear();
        }
        let v = map.entry(key).or_insert(Voucher { block, value });
        if block > v.block || (block == v.block && value > v.value) {
            *v = Voucher { block, value };
        }
    }
}

impl Drop for Vouchers {
    fn drop(&mut self) {
        self.follower.abort();
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vouchers(block: u64, fresh_for: Duration) -> Vouchers {
        let head = Head { block: AtomicU64::new(0), read_at_ms: AtomicU64::new(0), epoch: Instant::now(), fresh_for };
        head.advance(block);
        let follower = tokio::spawn(async {});
        Vouchers { head: Arc::new(head), by_payer: Mutex::new(HashMap::new()), follower }
    }

    const KEY: PayerKey = (Address::repeat_byte(1), Address::repeat_byte(2), Address::repeat_byte(3));

    #[tokio::test]
    async fn a_voucher_covers_up_to_its_value_until_the_head_moves() {
        let v = vouchers(7, Duration::from_secs(60));
        assert!(!v.covers(&KEY, U256::from(1)), "nothing simulated yet");
        v.grant(KEY, 7, U256::from(100));
        assert!(v.covers(&KEY, U256::from(100)));
        assert!(v.covers(&KEY, U256::from(99)));
        assert!(!v.covers(&KEY, U256::from(101)), "more than was simulated");
        assert!(!v.covers(&(KEY.0, KEY.1, Address::repeat_byte(9)), U256::from(1)), "another recipient");
        v.grant(KEY, 7, U256::from(50));
        assert!(v.covers(&KEY, U256::from(100)), "a smaller success keeps the larger one");
        v.advance(8);
        assert!(!v.covers(&KEY, U256::from(1)), "lapsed with the head");
        v.grant(KEY, 7, U256::from(500));
        assert!(!v.covers(&KEY, U256::from(1)), "a simulation from before the head vouches for nothing");
        v.grant(KEY, 8, U256::from(5));
        assert!(v.covers(&KEY, U256::from(5)) && !v.covers(&KEY, U256::from(6)));
    }

    #[tokio::test]
    async fn an_unread_head_honours_nothing() {
        let v = vouchers(3, Duration::from_millis(20));
        v.grant(KEY, 3, U256::from(10));
        assert!(v.covers(&KEY, U256::from(10)));
        tokio::time::sleep(Duration::from_millis(60)).await;
        assert!(!v.covers(&KEY, U256::from(10)), "the head was not read for longer than it stays fresh");
        v.advance(3);
        assert!(v.covers(&KEY, U256::from(10)), "read again, same block");
    }
}
