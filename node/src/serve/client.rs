//! Paying for an HTTP call with x402 (`exact` scheme, EIP-3009): our own client side, so
//! one node can buy calls and rentals from another.
//!
//! The request is sent once unpaid; a 402 names what it costs; if the price is within the
//! caller's cap, an authorization for exactly that amount is signed locally and the
//! request is sent again with it. The key never leaves this process.

use std::time::Duration;

use mindxtrain_x402::alloy::primitives::{Address, B256, U256};
use mindxtrain_x402::alloy::signers::local::PrivateKeySigner;
use mindxtrain_x402::eip712::{TransferWithAuthorization, sign_authorization};
use mindxtrain_x402::exact::{EXACT, requirement_asset};
use mindxtrain_x402::header;
use mindxtrain_x402::wire::{PaymentPayload, PaymentRequirements, SettlementResponse};
use serde_json::Value;
use thiserror::Error;

/// How long a signed authorization stays valid at most.
const AUTHORIZATION_LIFETIME_SECS: u64 = 300;

#[derive(Debug, Error)]
pub enum ClientError {
    #[error("{url}: {message}")]
    Http { url: String, message: String },
    #[error("{url} asked for payment but offered nothing this client can pay (exact scheme, EIP-3009 asset): {detail}")]
    Unpayable { url: String, detail: String },
    #[error("{url} asks {asked} atomic units; the cap is {cap} (raise --max-price)")]
    TooExpensive { url: String, asked: u64, cap: u64 },
    #[error("signing the authorization: {0}")]
    Sign(String),
    #[error("{url} refused the payment: {reason}")]
    Refused { url: String, reason: String },
}

/// A response, with what was paid for it.
#[derive(Debug, Clone)]
pub struct PaidResponse {
    pub status: u16,
    pub body: Value,
    /// Atomic units authorized (0 when the call needed no payment).
    pub amount: u64,
    pub requirements: Option<PaymentRequirements>,
    /// The `PAYMENT-RESPONSE` settlement, when paid.
    pub settlement: Option<SettlementResponse>,
    /// The EIP-3009 nonce of the authorization, when paid.
    pub nonce: Option<B256>,
}

pub struct PayingClient {
    http: reqwest::Client,
    signer: PrivateKeySigner,
    /// The most one call may cost, in atomic units.
    pub max_amount: u64,
}

impl PayingClient {
    pub fn new(signer: PrivateKeySigner, max_amount: u64) -> Result<PayingClient, ClientError> {
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(300))
            .build()
            .map_err(|e| ClientError::Http { url: String::new(), message: e.to_string() })?;
        Ok(PayingClient { http, signer, max_amount })
    }

    pub fn address(&self) -> Address {
        self.signer.address()
    }

    /// POSTs `body` as JSON to `url`, paying if asked.
    pub async fn post_json(&self, url: &str, body: &Value) -> Result<PaidResponse, ClientError> {
        let http = |e: reqwest::Error| ClientError::Http { url: url.to_string(), message: e.to_string() };
        let first = self.http.post(url).json(body).send().await.map_err(http)?;
        if first.status().as_u16() != 402 {
            let status = first.status().as_u16();
            return Ok(PaidResponse {
                status,
                body: json_body(first).await,
                amount: 0,
                requirements: None,
                settlement: None,
                nonce: None,
            });
        }
        let required = first
            .headers()
            .get(header::PAYMENT_REQUIRED)
            .ok_or_else(|| unpayable(url, "no PAYMENT-REQUIRED header"))
            .and_then(|h| header::decode_payment_required(h.as_bytes()).map_err(|e| unpayable(url, &e.to_string())))?;
        let accepted = required
            .accepts
            .iter()
            .find(|r| r.scheme == EXACT && requirement_asset(r).is_ok())
            .ok_or_else(|| unpayable(url, "no exact-scheme EVM offer"))?
            .clone();
        let amount: u64 = accepted.amount.parse().map_err(|_| unpayable(url, "amount is not an integer"))?;
        if amount > self.max_amount {
            return Err(ClientError::TooExpensive { url: url.into(), asked: amount, cap: self.max_amount });
        }
        let payment = self.sign(&accepted, amount, Some(required.resource.clone()))?;
        let nonce = payment.payload.authorization.nonce.parse::<B256>().ok();
        let second = self
            .http
            .post(url)
            .header(header::PAYMENT_SIGNATURE, header::encode(&payment))
            .json(body)
            .send()
            .await
            .map_err(http)?;
        let status = second.status().as_u16();
        let settlement = second
            .headers()
            .get(header::PAYMENT_RESPONSE)
            .and_then(|h| header::decode::<SettlementResponse>(h.as_bytes()).ok());
        if status == 402 {
            let reason = second
                .headers()
                .get(header::PAYMENT_REQUIRED)
                .and_then(|h| header::decode_payment_required(h.as_bytes()).ok())
                .and_then(|r| r.error)
                .or_else(|| settlement.as_ref().and_then(|s| s.error_reason.clone()))
                .unwrap_or_else(|| "no reason given".into());
            return Err(ClientError::Refused { url: url.into(), reason });
        }
        let body = json_body(second).await;
        Ok(PaidResponse { status, body, amount, requirements: Some(accepted), settlement, nonce })
    }

    fn sign(
        &self,
        accepted: &PaymentRequirements,
        amount: u64,
        resource: Option<mindxtrain_x402::wire::ResourceInfo>,
    ) -> Result<PaymentPayload, ClientError> {
        let asset = requirement_asset(accepted).map_err(|e| ClientError::Sign(e.to_string()))?;
        let to: Address =
            accepted.pay_to.parse().map_err(|_| ClientError::Sign(format!("payTo {:?}", accepted.pay_to)))?;
        let mut nonce = [0u8; 32];
        getrandom::fill(&mut nonce).map_err(|e| ClientError::Sign(e.to_string()))?;
        let lifetime = accepted.max_timeout_seconds.clamp(1, AUTHORIZATION_LIFETIME_SECS);
        let message = TransferWithAuthorization {
            from: self.signer.address(),
            to,
            value: U256::from(amount),
            validAfter: U256::ZERO,
            validBefore: U256::from(super::unix_now() + lifetime),
            nonce: B256::from(nonce),
        };
        let payload =
            sign_authorization(&self.signer, &asset, &message).map_err(|e| ClientError::Sign(e.to_string()))?;
        Ok(PaymentPayload { x402_version: 2, resource, accepted: accepted.clone(), payload, extensions: None })
    }
}

fn unpayable(url: &str, detail: &str) -> ClientError {
    ClientError::Unpayable { url: url.into(), detail: detail.into() }
}

async fn json_body(resp: reqwest::Response) -> Value {
    let text = resp.text().await.unwrap_or_default();
    serde_json::from_str(&text).unwrap_or(Value::String(text))
}
