//! Providers, per-call timeouts and retries with backoff on transport errors.

use crate::error::ChainError;
use crate::key::AnchorKey;
use crate::network::parse_rpc_url;
use alloy::network::EthereumWallet;
use alloy::providers::{DynProvider, Provider, ProviderBuilder};
use std::future::Future;
use std::time::Duration;

/// How hard to try before giving up on an unreachable endpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Attempts in all (the first try included).
    pub attempts: u32,
    /// Pause after the first failure; doubled after each further one.
    pub first_backoff: Duration,
    pub max_backoff: Duration,
    /// One RPC call taking longer than this counts as a transport error.
    pub call_timeout: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            attempts: 8,
            first_backoff: Duration::from_millis(250),
            max_backoff: Duration::from_secs(8),
            call_timeout: Duration::from_secs(30),
        }
    }
}

impl RetryPolicy {
    /// Pause before attempt `attempt` (2, 3, …).
    pub fn backoff(&self, attempt: u32) -> Duration {
        let factor = 1u32 << attempt.saturating_sub(2).min(16);
        self.first_backoff.saturating_mul(factor).min(self.max_backoff)
    }
}

/// An HTTP provider for `url`; with a key it signs transactions, without it is read-only.
pub fn provider(url: &str, key: Option<&AnchorKey>) -> Result<DynProvider, ChainError> {
    let url = parse_rpc_url(url)?;
    Ok(match key {
        Some(k) => ProviderBuilder::new().wallet(EthereumWallet::from(k.signer().clone())).connect_http(url).erased(),
        None => ProviderBuilder::new().connect_http(url).erased(),
    })
}

/// Runs `call` under the policy's timeout, retrying transient failures with backoff.
/// `on_retry` hears about each failure that will be retried.
pub async fn with_retry<T, F, Fut>(
    policy: &RetryPolicy,
    mut on_retry: impl FnMut(u32, &ChainError),
    mut call: F,
) -> Result<T, ChainError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, ChainError>>,
{
    let mut attempt = 1;
    loop {
        let outcome = match tokio::time::timeout(policy.call_timeout, call()).await {
            Ok(r) => r,
            Err(_) => Err(ChainError::Transport {
                attempts: attempt,
                message: format!("no answer within {}s", policy.call_timeout.as_secs()),
            }),
        };
        match outcome {
            Err(e) if e.is_transient() && attempt < policy.attempts.max(1) => {
                on_retry(attempt, &e);
                attempt += 1;
                tokio::time::sleep(policy.backoff(attempt)).await;
            }
            Err(ChainError::Transport { message, .. }) => {
                return Err(ChainError::Transport { attempts: attempt, message });
            }
            other => return other,
        }
    }
}

/// One RPC call under a timeout (no retry); a timeout is a transport error.
pub(crate) async fn timed<T>(
    policy: &RetryPolicy,
    fut: impl Future<Output = Result<T, alloy::transports::TransportError>>,
) -> Result<T, ChainError> {
    match tokio::time::timeout(policy.call_timeout, fut).await {
        Ok(r) => r.map_err(crate::error::from_transport),
        Err(_) => Err(ChainError::Transport {
            attempts: 1,
            message: format!("no answer within {}s", policy.call_timeout.as_secs()),
        }),
    }
}

/// The chain id the endpoint serves.
pub async fn chain_id(provider: &DynProvider, policy: &RetryPolicy) -> Result<u64, ChainError> {
    with_retry(policy, |_, _| {}, || timed(policy, provider.get_chain_id())).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    fn fast() -> RetryPolicy {
        RetryPolicy {
            attempts: 4,
            first_backoff: Duration::from_millis(1),
            max_backoff: Duration::from_millis(4),
            call_timeout: Duration::from_secs(5),
        }
    }

    #[test]
    fn backoff_doubles_up_to_the_cap() {
        let p = RetryPolicy::default();
        assert_eq!(p.backoff(2), Duration::from_millis(250));
        assert_eq!(p.backoff(3), Duration::from_millis(500));
        assert_eq!(p.backoff(40), Duration::from_secs(8));
    }

    #[tokio::test]
    async fn transient_errors_are_retried_until_success_and_definite_ones_are_not() {
        let calls = AtomicU32::new(0);
        let got = with_retry(
            &fast(),
            |_, _| {},
            || async {
                if calls.fetch_add(1, Ordering::SeqCst) < 2 {
                    Err(ChainError::Transport { attempts: 1, message: "refused".into() })
                } else {
                    Ok(7)
                }
            },
        )
        .await;
        assert_eq!(got.unwrap(), 7);
        assert_eq!(calls.load(Ordering::SeqCst), 3);

        let calls = AtomicU32::new(0);
        let err = with_retry(
            &fast(),
            |_, _| {},
            || async {
                calls.fetch_add(1, Ordering::SeqCst);
                Err::<(), _>(ChainError::Rpc("nonce too low".into()))
            },
        )
        .await
        .unwrap_err();
        assert!(matches!(err, ChainError::Rpc(_)));
        assert_eq!(calls.load(Ordering::SeqCst), 1);

        let err = with_retry(
            &fast(),
            |_, _| {},
            || async { Err::<(), _>(ChainError::Transport { attempts: 1, message: "down".into() }) },
        )
        .await
        .unwrap_err();
        assert!(matches!(err, ChainError::Transport { attempts: 4, .. }), "{err:?}");
    }

    #[tokio::test]
    async fn unreachable_endpoint_is_a_transport_error() {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let p = provider(&format!("http://127.0.0.1:{port}"), None).unwrap();
        let err = chain_id(&p, &fast()).await.unwrap_err();
        assert!(matches!(err, ChainError::Transport { attempts: 4, .. }), "{err:?}");
    }
}
