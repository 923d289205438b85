//! `POST /v1/rentals` (paid through x402: the price is quoted from the body) and
//! `GET /v1/rentals/{id}`.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use mindxtrain_x402::alloy::primitives::Address;
use mindxtrain_x402::{Settlement, VerifiedPayment};
use serde::Deserialize;
use serde_json::json;

use super::openai::ApiError;
use super::rentals::{RentalError, Terms};
use super::{AppState, unix_now};

/// The most calls one rental may buy.
pub const MAX_RENTAL_CALLS: u64 = 100_000;

/// `POST /v1/rentals` body: exactly one of `calls` and `seconds`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RentalRequest {
    pub model: String,
    #[serde(default)]
    pub calls: Option<u64>,
    #[serde(default)]
    pub seconds: Option<u64>,
}

/// What renting costs, from the recipe's `publish.billing.x402`.
#[derive(Debug, Clone, Copy)]
pub struct RentalPrices {
    /// Atomic units per call (a per-token price rents at its `max_charge` per call).
    pub per_call: u64,
    /// Atomic units per hour, with the allowed length, when time rentals are offered.
    pub per_hour: Option<(u64, u64, u64)>,
}

impl RentalPrices {
    /// The price of `req` against `model`, or why it cannot be rented.
    pub fn quote(&self, model: &str, body: &[u8]) -> Result<(Terms, u64), String> {
        let req: RentalRequest = serde_json::from_slice(body).map_err(|e| format!("rental request: {e}"))?;
        if req.model != model {
            return Err(format!("no model {:?} here (this node serves {model:?})", req.model));
        }
        match (req.calls, req.seconds) {
            (Some(n), None) => {
                if n == 0 || n > MAX_RENTAL_CALLS {
                    return Err(format!("calls must be 1..={MAX_RENTAL_CALLS}, got {n}"));
                }
                Ok((Terms::Calls(n), n.saturating_mul(self.per_call)))
            }
            (None, Some(secs)) => {
                let (per_hour, min_s, max_s) =
                    self.per_hour.ok_or("this model is not rented by time; ask for calls")?;
                if secs < min_s || secs > max_s {
                    return Err(format!("seconds must be {min_s}..={max_s}, got {secs}"));
                }
                let price = (u128::from(per_hour) * u128::from(secs)).div_ceil(3600);
                Ok((Terms::Seconds(secs), u64::try_from(price).unwrap_or(u64::MAX)))
            }
            _ => Err("give exactly one of calls and seconds".into()),
        }
    }
}

/// Opens a rental whose payment has settled (the paid layer settles this route before it
/// runs, so `rental.opened` always follows its transfer, which it names).
pub async fn open(
    State(s): State<Arc<AppState>>,
    payment: Option<Extension<VerifiedPayment>>,
    settlement: Option<Extension<Settlement>>,
    terms: Option<Extension<Terms>>,
    body: Bytes,
) -> Response {
    let (Some(prices), Some(Extension(payment)), Some(Extension(settlement))) = (s.rental_prices, payment, settlement)
    else {
        return ApiError::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            "not_for_rent",
            "this node does not rent its model",
        )
        .into_response();
    };
    let quoted = match terms {
        Some(Extension(terms)) => Ok((terms, payment.amount)),
        None => prices.quote(&s.model.name, &body),
    };
    let (terms, price) = match quoted {
        Ok(q) => q,
        Err(m) => return ApiError::invalid("body", m).into_response(),
    };
    // A redemption (the first answer was lost) gets the rental its payment already opened.
    let opened = match s.rentals.opened_by(&settlement.tx.to_string()) {
        Some(done) => Ok(done),
        None => {
            let payer = Address::to_checksum(&payment.payer, None);
            s.rentals.open(&s.model.name, &payer, terms, paid(&payment, price, &settlement), unix_now()).await
        }
    };
    match opened {
        Ok((claims, token)) => Json(json!({
            "id": claims.id,
            "object": "rental",
            "model": claims.model,
            "payer": claims.payer,
            "calls": claims.calls,
            "expires": claims.expires,
            "token": token,
        }))
        .into_response(),
        // The payment is settled; a retry with the same payment header opens the rental
        // without paying again.
        Err(e @ RentalError::Log(_)) => {
            ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", "log_unavailable", e.to_string())
                .into_response()
        }
        Err(e) => ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", "rental_failed", e.to_string())
            .into_response(),
    }
}

/// What a rental's `rental.opened` records of its payment.
fn paid(payment: &VerifiedPayment, quoted: u64, settlement: &Settlement) -> serde_json::Value {
    json!({
        "amount": payment.amount.to_string(),
        "quoted": quoted.to_string(),
        "network": payment.network.caip2(),
        "asset": Address::to_checksum(&payment.asset, None),
        "payment_id": payment.payment_id,
        "tx": settlement.tx.to_string(),
        "block": settlement.block,
    })
}

pub async fn show(State(s): State<Arc<AppState>>, Path(id): Path<String>) -> Response {
    match s.rentals.state(&id, unix_now()) {
        Some(state) => Json(state).into_response(),
        None => ApiError::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            "rental_not_found",
            format!("no rental {id:?}"),
        )
        .into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quotes_calls_and_time_and_names_bad_requests() {
        let p = RentalPrices { per_call: 1000, per_hour: Some((360_000, 900, 86_400)) };
        assert_eq!(p.quote("m", br#"{"model":"m","calls":5}"#), Ok((Terms::Calls(5), 5000)));
        assert_eq!(p.quote("m", br#"{"model":"m","seconds":1000}"#), Ok((Terms::Seconds(1000), 100_000)));
        for (body, needle) in [
            (&br#"{"model":"x","calls":5}"#[..], "no model"),
            (br#"{"model":"m","calls":0}"#, "calls must be"),
            (br#"{"model":"m","seconds":10}"#, "seconds must be"),
            (br#"{"model":"m","calls":1,"seconds":900}"#, "exactly one"),
            (br#"{"model":"m"}"#, "exactly one"),
            (br#"{"model":"m","calls":1,"extra":1}"#, "unknown field"),
            (b"not json", "rental request"),
        ] {
            let e = p.quote("m", body).unwrap_err();
            assert!(e.contains(needle), "{e}");
        }
        let calls_only = RentalPrices { per_call: 1, per_hour: None };
        assert!(calls_only.quote("m", br#"{"model":"m","seconds":1000}"#).unwrap_err().contains("not rented by time"));
    }
}
