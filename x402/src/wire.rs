//! The x402 JSON messages, v2 with the v1 shapes beside them.
//!
//! Field names follow the reference implementation (camelCase). Unknown fields are
//! tolerated on input (clients add extensions freely) but every field we act on is typed;
//! amounts stay decimal strings on the wire and become integers only in `exact`.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// Name and version of the asset's EIP-712 domain, carried in `extra`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Eip712Extra {
    pub name: String,
    pub version: String,
}

/// One way to pay (v2): what `accepts` lists and what a payment echoes in `accepted`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PaymentRequirements {
    pub scheme: String,
    pub network: String,
    /// Atomic units, decimal.
    pub amount: String,
    pub asset: String,
    pub pay_to: String,
    pub max_timeout_seconds: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub extra: Option<Value>,
}

impl PaymentRequirements {
    /// The EIP-712 domain name/version from `extra`, when present and well-formed.
    pub fn eip712_extra(&self) -> Option<Eip712Extra> {
        self.extra.as_ref().and_then(|e| serde_json::from_value(e.clone()).ok())
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ResourceInfo {
    pub url: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mime_type: Option<String>,
}

/// The 402 answer (v2), sent base64-encoded in `PAYMENT-REQUIRED`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PaymentRequired {
    pub x402_version: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    pub resource: ResourceInfo,
    pub accepts: Vec<PaymentRequirements>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub extensions: Option<Map<String, Value>>,
}

/// The EIP-3009 authorization a payer signs, numbers as decimal strings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Authorization {
    pub from: String,
    pub to: String,
    pub value: String,
    pub valid_after: String,
    pub valid_before: String,
    /// 32 bytes, 0x-hex.
    pub nonce: String,
}

/// The `exact` EVM payload: a signed `TransferWithAuthorization`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExactEvmPayload {
    /// 0x-hex; 65 bytes for an EOA, anything for an ERC-1271 wallet.
    pub signature: String,
    pub authorization: Authorization,
}

/// A payment (v2), sent base64-encoded in `PAYMENT-SIGNATURE`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PaymentPayload {
    pub x402_version: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource: Option<ResourceInfo>,
    pub accepted: PaymentRequirements,
    pub payload: ExactEvmPayload,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub extensions: Option<Map<String, Value>>,
}

/// The outcome of a settlement, sent base64-encoded in `PAYMENT-RESPONSE`; also the
/// facilitator's `/settle` answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SettlementResponse {
    pub success: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_message: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub payer: Option<String>,
    /// Transaction hash; empty when nothing was sent.
    pub transaction: String,
    pub network: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub amount: Option<String>,
}

/// The facilitator's `/verify` answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VerifyResponse {
    pub is_valid: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub invalid_reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub invalid_message: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub payer: Option<String>,
}

/// Body of `POST /verify` and `POST /settle`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FacilitatorRequest {
    pub x402_version: u32,
    pub payment_payload: PaymentPayload,
    pub payment_requirements: PaymentRequirements,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SupportedKind {
    pub x402_version: u32,
    pub scheme: String,
    pub network: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub extra: Option<Value>,
}

/// `GET /supported`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct SupportedResponse {
    pub kinds: Vec<SupportedKind>,
    #[serde(default)]
    pub extensions: Vec<String>,
    /// CAIP family (`eip155:*`) → facilitator addresses.
    #[serde(default)]
    pub signers: Map<String, Value>,
}

/// v1 requirements: the amount is a ceiling by name only (`exact` still means exact) and
/// the resource travels inline.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PaymentRequirementsV1 {
    pub scheme: String,
    pub network: String,
    pub max_amount_required: String,
    pub resource: String,
    pub description: String,
    pub mime_type: String,
    pub pay_to: String,
    pub max_timeout_seconds: u64,
    pub asset: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub extra: Option<Value>,
}

/// The v1 402 body.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PaymentRequiredV1 {
    pub x402_version: u32,
    pub error: String,
    pub accepts: Vec<PaymentRequirementsV1>,
}

/// A v1 payment (`X-PAYMENT`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PaymentPayloadV1 {
    pub x402_version: u32,
    pub scheme: String,
    pub network: String,
    pub payload: ExactEvmPayload,
}

impl PaymentRequirementsV1 {
    /// The v1 form of `req` for `resource`; `network_name` is the v1 network name.
    pub fn from_v2(req: &PaymentRequirements, network_name: &str, resource: &ResourceInfo) -> Self {
        Self {
            scheme: req.scheme.clone(),
            network: network_name.to_owned(),
            max_amount_required: req.amount.clone(),
            resource: resource.url.clone(),
            description: resource.description.clone().unwrap_or_default(),
            mime_type: resource.mime_type.clone().unwrap_or_default(),
            pay_to: req.pay_to.clone(),
            max_timeout_seconds: req.max_timeout_seconds,
            asset: req.asset.clone(),
            extra: req.extra.clone(),
        }
    }
}

/// The payment-identifier extension's key in `extensions`.
pub const PAYMENT_IDENTIFIER: &str = "payment-identifier";

/// The id a payment carries under `extensions["payment-identifier"].info.id`, if valid
/// (16–128 characters of `[A-Za-z0-9_-]`, as the reference extension defines it).
pub fn payment_identifier(payload: &PaymentPayload) -> Result<Option<&str>, &'static str> {
    let Some(ext) = payload.extensions.as_ref().and_then(|e| e.get(PAYMENT_IDENTIFIER)) else {
        return Ok(None);
    };
    let Some(id) = ext.get("info").and_then(|i| i.get("id")) else { return Ok(None) };
    let id = id.as_str().ok_or("payment identifier is not a string")?;
    let ok_chars = id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if !(16..=128).contains(&id.len()) || !ok_chars {
        return Err("payment identifier must be 16-128 characters of [A-Za-z0-9_-]");
    }
    Ok(Some(id))
}

/// What a server puts under `extensions["payment-identifier"]` to offer idempotency.
pub fn payment_identifier_declaration(required: bool) -> Value {
    serde_json::json!({
        "info": { "required": required },
        "schema": {
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "type": "object",
            "properties": {
                "required": { "type": "boolean" },
                "id": { "type": "string", "minLength": 16, "maxLength": 128, "pattern": "^[a-zA-Z0-9_-]+$" }
            },
            "required": ["required"]
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn requirements() -> PaymentRequirements {
        PaymentRequirements {
            scheme: "exact".into(),
            network: "eip155:84532".into(),
            amount: "1000".into(),
            asset: "0x036CbD53842c5426634e7929541eC2318f3dCF7e".into(),
            pay_to: "0x1111111111111111111111111111111111111111".into(),
            max_timeout_seconds: 60,
            extra: Some(serde_json::json!({"name": "USDC", "version": "2"})),
        }
    }

    #[test]
    fn v2_field_names_match_the_reference() {
        let v = serde_json::to_value(requirements()).unwrap();
        for key in ["scheme", "network", "amount", "asset", "payTo", "maxTimeoutSeconds", "extra"] {
            assert!(v.get(key).is_some(), "missing {key}");
        }
        let s = SettlementResponse {
            success: true,
            error_reason: None,
            error_message: None,
            payer: Some("0xab".into()),
            transaction: "0x01".into(),
            network: "eip155:1".into(),
            amount: None,
        };
        let v = serde_json::to_value(s).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"success": true, "payer": "0xab", "transaction": "0x01", "network": "eip155:1"})
        );
    }

    #[test]
    fn eip712_extra_is_read_from_extra() {
        assert_eq!(requirements().eip712_extra(), Some(Eip712Extra { name: "USDC".into(), version: "2".into() }));
        let mut r = requirements();
        r.extra = Some(serde_json::json!({"name": 3}));
        assert_eq!(r.eip712_extra(), None);
    }

    #[test]
    fn payment_identifier_is_validated() {
        let mut p = PaymentPayload {
            x402_version: 2,
            resource: None,
            accepted: requirements(),
            payload: ExactEvmPayload {
                signature: "0x".into(),
                authorization: Authorization {
                    from: String::new(),
                    to: String::new(),
                    value: String::new(),
                    valid_after: String::new(),
                    valid_before: String::new(),
                    nonce: String::new(),
                },
            },
            extensions: None,
        };
        assert_eq!(payment_identifier(&p), Ok(None));
        let with = |id: Value| {
            let mut m = Map::new();
            m.insert(PAYMENT_IDENTIFIER.into(), serde_json::json!({"info": {"required": false, "id": id}}));
            Some(m)
        };
        p.extensions = with("pay_0123456789abcdef".into());
        assert_eq!(payment_identifier(&p), Ok(Some("pay_0123456789abcdef")));
        for bad in
            [Value::from("short"), Value::from("pay_0123456789abcdef!"), Value::from(7), Value::from("x".repeat(129))]
        {
            p.extensions = with(bad);
            assert!(payment_identifier(&p).is_err());
        }
    }
}
