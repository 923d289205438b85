//! What one call costs, in atomic units of the asset, and when it is settled.
//!
//! A route either charges a fixed amount per call or *prepares* each request: it reads the
//! request once (parses, tokenizes, checks it against what it serves), says what it costs
//! and when to settle, and hands what it prepared to the handler as request extensions, so
//! the paid path does that work once. A request it cannot serve is answered before any
//! payment is asked for.
//!
//! `exact` settles exactly what was signed before the handler runs, so a token-metered price
//! is charged on the token *budget* the request asks for (prompt + `max_tokens`), capped;
//! nothing is settled above what the client saw in the 402.

use std::fmt;
use std::sync::Arc;

use axum::response::Response;

/// When the payment is settled relative to the handler.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SettleWhen {
    /// The handler runs and its whole answer is buffered; settled only if it succeeded, and
    /// the answer leaves after settlement. A failed handler costs the payer nothing.
    #[default]
    AfterBody,
    /// The handler runs until its response head (a stream's, say), then the payment is
    /// settled while the body is produced; the first byte leaves after settlement. A stream
    /// that dies after that stays redeemable with the same header.
    AfterHead,
    /// Settled before the handler runs: for handlers that record facts that must follow
    /// the payment (a rental). A handler that fails after that leaves the payment
    /// redeemable with the same header.
    BeforeHandler,
}

/// What a prepared request costs and carries on.
#[derive(Clone, Default)]
pub struct Quote {
    /// Atomic units; at least 1 is charged (a zero-value authorization proves nothing).
    pub amount: u64,
    pub settle: SettleWhen,
    /// Handed to the handler with the request (what was prepared).
    pub extensions: http::Extensions,
}

impl Quote {
    pub fn new(amount: u64, settle: SettleWhen) -> Self {
        Self { amount, settle, extensions: http::Extensions::new() }
    }
}

/// Reads a request's head and body and quotes it, or answers it outright (a 4xx that needs
/// no payment).
pub type Prepare = Arc<dyn Fn(&http::request::Parts, &bytes::Bytes) -> Result<Quote, Box<Response>> + Send + Sync>;

#[derive(Clone)]
pub enum Pricing {
    /// The same amount for every call, settled after the handler's whole answer.
    PerCall { amount: u64 },
    Prepared(Prepare),
}

impl Pricing {
    pub fn quote(&self, parts: &http::request::Parts, body: &bytes::Bytes) -> Result<Quote, Box<Response>> {
        let mut quote = match self {
            Pricing::PerCall { amount } => Quote::new(*amount, SettleWhen::AfterBody),
            Pricing::Prepared(prepare) => prepare(parts, body)?,
        };
        quote.amount = quote.amount.max(1);
        Ok(quote)
    }
}

/// ceil(per_1k × tokens / 1000), saturating.
pub fn per_1k_price(per_1k: u64, tokens: u64) -> u64 {
    let atomic = u128::from(per_1k) * u128::from(tokens);
    u64::try_from(atomic.div_ceil(1000)).unwrap_or(u64::MAX)
}

impl fmt::Debug for Pricing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Pricing::PerCall { amount } => write!(f, "PerCall({amount})"),
            Pricing::Prepared(_) => write!(f, "Prepared"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts() -> http::request::Parts {
        http::Request::new(()).into_parts().0
    }

    #[test]
    fn per_call_and_prepared_quotes() {
        let q = Pricing::PerCall { amount: 1000 }.quote(&parts(), &bytes::Bytes::new()).unwrap();
        assert_eq!((q.amount, q.settle), (1000, SettleWhen::AfterBody));
        let prepare: Prepare = Arc::new(|_, body| match body.as_ref() {
            b"" => Err(Box::new(Response::new(axum::body::Body::from("empty")))),
            b => {
                let mut q = Quote::new(b.len() as u64 * 10, SettleWhen::AfterHead);
                q.extensions.insert(b.len());
                Ok(q)
            }
        });
        let q = Pricing::Prepared(prepare.clone()).quote(&parts(), &bytes::Bytes::from_static(b"abc")).unwrap();
        assert_eq!((q.amount, q.settle, q.extensions.get::<usize>()), (30, SettleWhen::AfterHead, Some(&3)));
        assert!(Pricing::Prepared(prepare).quote(&parts(), &bytes::Bytes::new()).is_err());
        assert_eq!(Pricing::PerCall { amount: 0 }.quote(&parts(), &bytes::Bytes::new()).unwrap().amount, 1, "never free");
        assert_eq!(per_1k_price(200, 1500), 300);
        assert_eq!(per_1k_price(200, 1), 1, "rounded up");
        assert_eq!(per_1k_price(u64::MAX, u64::MAX), u64::MAX);
    }
}
