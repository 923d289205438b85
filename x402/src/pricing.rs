//! What one call costs, in atomic units of the asset.
//!
//! `exact` settles exactly what was signed before the handler runs, so a token-metered
//! price is charged on the token *budget* the request asks for (prompt + `max_tokens`,
//! as the caller's counter reports it), capped by `max_charge`; nothing is settled above
//! what the client saw in the 402.

use std::fmt;
use std::sync::Arc;

/// Counts the tokens a request may consume (prompt plus generation budget) from its head
/// and body; `None` when it cannot tell, which prices the call at `max_charge`.
pub type TokenBudget = Arc<dyn Fn(&http::request::Parts, &[u8]) -> Option<u64> + Send + Sync>;

/// Prices a request from its head and body (what a rental of N calls costs, say), or says
/// why the request cannot be priced: that is answered 400, before any payment.
pub type Quote = Arc<dyn Fn(&http::request::Parts, &[u8]) -> Result<u64, String> + Send + Sync>;

#[derive(Clone)]
pub enum Pricing {
    PerCall { amount: u64 },
    Per1kTokens { per_1k: u64, max_charge: u64, budget: TokenBudget },
    Quoted(Quote),
}

impl Pricing {
    /// The amount for this request; at least 1 atomic unit (a zero-value authorization
    /// proves nothing). An error says why the request cannot be priced.
    pub fn price(&self, parts: &http::request::Parts, body: &[u8]) -> Result<u64, String> {
        let amount = match self {
            Pricing::PerCall { amount } => *amount,
            Pricing::Per1kTokens { per_1k, max_charge, budget } => match budget(parts, body) {
                Some(tokens) => per_1k_price(*per_1k, tokens).min(*max_charge),
                None => *max_charge,
            },
            Pricing::Quoted(quote) => quote(parts, body)?,
        };
        Ok(amount.max(1))
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
            Pricing::Per1kTokens { per_1k, max_charge, .. } => write!(f, "Per1kTokens({per_1k}, max {max_charge})"),
            Pricing::Quoted(_) => write!(f, "Quoted"),
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
    fn per_call_and_token_budget_prices() {
        assert_eq!(Pricing::PerCall { amount: 1000 }.price(&parts(), b""), Ok(1000));
        let budget: TokenBudget = Arc::new(|_, body| std::str::from_utf8(body).ok()?.parse().ok());
        let p = Pricing::Per1kTokens { per_1k: 200, max_charge: 5000, budget };
        assert_eq!(p.price(&parts(), b"1500"), Ok(300));
        assert_eq!(p.price(&parts(), b"1"), Ok(1), "rounded up, never free");
        assert_eq!(p.price(&parts(), b"999999"), Ok(5000), "capped");
        assert_eq!(p.price(&parts(), b"not a number"), Ok(5000), "unknown budget pays the cap");
        let quote: Quote = Arc::new(|_, body| match body {
            b"" => Err("empty".into()),
            b => Ok(b.len() as u64 * 10),
        });
        assert_eq!(Pricing::Quoted(quote.clone()).price(&parts(), b"abc"), Ok(30));
        assert_eq!(Pricing::Quoted(quote).price(&parts(), b""), Err("empty".to_string()));
        assert_eq!(per_1k_price(u64::MAX, u64::MAX), u64::MAX);
    }
}
