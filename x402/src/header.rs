//! Base64(JSON) header codecs, with a hard size limit checked before any decoding.
//!
//! Headers come from anyone: the length is checked first, so an attacker cannot make us
//! allocate or parse more than [`MAX_HEADER_LEN`] bytes, and every failure is a typed
//! error (the decoders never panic; a property test holds them to it).

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use serde::Serialize;
use serde::de::DeserializeOwned;
use thiserror::Error;

use crate::wire::{PaymentPayload, PaymentPayloadV1, PaymentRequired, SettlementResponse};

/// v2 payment header (request).
pub const PAYMENT_SIGNATURE: &str = "payment-signature";
/// v1 payment header (request).
pub const X_PAYMENT: &str = "x-payment";
/// v2 402 header (response).
pub const PAYMENT_REQUIRED: &str = "payment-required";
/// v2 settlement header (response).
pub const PAYMENT_RESPONSE: &str = "payment-response";
/// v1 settlement header (response).
pub const X_PAYMENT_RESPONSE: &str = "x-payment-response";

/// Longest header value accepted, in bytes of base64. A v2 payment with a
/// payment-identifier is about 2 KiB; 8 KiB leaves room for ERC-1271 wallet signatures.
pub const MAX_HEADER_LEN: usize = 8 * 1024;

#[derive(Debug, Error, PartialEq, Eq)]
pub enum HeaderError {
    #[error("header is {len} bytes; at most {MAX_HEADER_LEN} are accepted")]
    TooLarge { len: usize },
    #[error("header is not valid base64: {0}")]
    Base64(String),
    #[error("header is not the expected JSON: {0}")]
    Json(String),
    #[error("unsupported x402Version {0}")]
    Version(u32),
}

/// A payment as it arrived: v2 from `PAYMENT-SIGNATURE`, v1 from `X-PAYMENT`.
#[derive(Debug, Clone, PartialEq)]
pub enum IncomingPayment {
    V2(Box<PaymentPayload>),
    V1(Box<PaymentPayloadV1>),
}

/// Base64 (standard, padded) of the JSON of `value`.
pub fn encode<T: Serialize>(value: &T) -> String {
    // Serializing our own plain structs cannot fail (no maps with non-string keys).
    let json = serde_json::to_vec(value).unwrap_or_default();
    STANDARD.encode(json)
}

/// Decodes a base64(JSON) header value into `T`, enforcing [`MAX_HEADER_LEN`].
pub fn decode<T: DeserializeOwned>(value: &[u8]) -> Result<T, HeaderError> {
    if value.len() > MAX_HEADER_LEN {
        return Err(HeaderError::TooLarge { len: value.len() });
    }
    let trimmed = value.trim_ascii();
    let json = STANDARD.decode(trimmed).map_err(|e| HeaderError::Base64(e.to_string()))?;
    serde_json::from_slice(&json).map_err(|e| HeaderError::Json(e.to_string()))
}

/// `PAYMENT-SIGNATURE` (v2).
pub fn decode_payment_signature(value: &[u8]) -> Result<PaymentPayload, HeaderError> {
    let p: PaymentPayload = decode(value)?;
    if p.x402_version != 2 {
        return Err(HeaderError::Version(p.x402_version));
    }
    Ok(p)
}

/// `X-PAYMENT` (v1).
pub fn decode_x_payment(value: &[u8]) -> Result<PaymentPayloadV1, HeaderError> {
    let p: PaymentPayloadV1 = decode(value)?;
    if p.x402_version != 1 {
        return Err(HeaderError::Version(p.x402_version));
    }
    Ok(p)
}

/// `PAYMENT-REQUIRED` (v2), as a client reads it.
pub fn decode_payment_required(value: &[u8]) -> Result<PaymentRequired, HeaderError> {
    decode(value)
}

/// `PAYMENT-RESPONSE` / `X-PAYMENT-RESPONSE`, as a client reads it.
pub fn decode_payment_response(value: &[u8]) -> Result<SettlementResponse, HeaderError> {
    decode(value)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const SAMPLE: &str = r#"{"x402Version":2,"accepted":{"scheme":"exact","network":"eip155:31337","amount":"1000","asset":"0x0000000000000000000000000000000000000001","payTo":"0x0000000000000000000000000000000000000002","maxTimeoutSeconds":60,"extra":{"name":"USD Coin","version":"2"}},"payload":{"signature":"0x00","authorization":{"from":"0x0000000000000000000000000000000000000003","to":"0x0000000000000000000000000000000000000002","value":"1000","validAfter":"0","validBefore":"99","nonce":"0x00"}}}"#;

    #[test]
    fn round_trips_a_v2_payment() {
        let p: PaymentPayload = serde_json::from_str(SAMPLE).unwrap();
        let header = encode(&p);
        assert_eq!(decode_payment_signature(header.as_bytes()), Ok(p));
    }

    #[test]
    fn rejects_each_kind_of_bad_header() {
        let big = vec![b'A'; MAX_HEADER_LEN + 1];
        assert_eq!(decode_payment_signature(&big), Err(HeaderError::TooLarge { len: MAX_HEADER_LEN + 1 }));
        assert!(matches!(decode_payment_signature(b"%%%not base64"), Err(HeaderError::Base64(_))));
        let not_json = STANDARD.encode("{\"x402Version\":2");
        assert!(matches!(decode_payment_signature(not_json.as_bytes()), Err(HeaderError::Json(_))));
        let v1_as_v2 = STANDARD.encode(SAMPLE.replace("\"x402Version\":2", "\"x402Version\":1"));
        assert_eq!(decode_payment_signature(v1_as_v2.as_bytes()), Err(HeaderError::Version(1)));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        #[test]
        fn decoders_never_panic_on_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..2048)) {
            let _ = decode_payment_signature(&bytes);
            let _ = decode_x_payment(&bytes);
            let _ = decode_payment_required(&bytes);
            let _ = decode_payment_response(&bytes);
        }

        #[test]
        fn decoders_never_panic_on_base64_of_mutated_json(cut in 0usize..SAMPLE.len(), byte in any::<u8>(), at in 0usize..SAMPLE.len()) {
            let mut json = SAMPLE.as_bytes().to_vec();
            json[at] = byte;
            json.truncate(cut.max(at + 1));
            let header = STANDARD.encode(&json);
            let _ = decode_payment_signature(header.as_bytes());
            let _ = decode_x_payment(header.as_bytes());
        }
    }
}
