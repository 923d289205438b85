//! DSSE envelopes (Dead Simple Signing Envelope, secure-systems-lab/dsse v1).
//!
//! ```text
//! PAE(type, body) = "DSSEv1" SP LEN(type) SP type SP LEN(body) SP body
//! LEN(s)          = ASCII decimal byte length of s, no leading zeros
//! signature       = Ed25519(node key, PAE(payloadType, payload bytes))
//! ```
//! The envelope is `{"payload": base64(body), "payloadType": type, "signatures":
//! [{"keyid": hex(public key), "sig": base64(signature)}]}`. Its file bytes are the
//! RFC 8785 canonical JSON of that object, so its digest is reproducible.

use crate::canonical;
use crate::identity::{self, Identity};
use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use ed25519_dalek::VerifyingKey;
use serde::{Deserialize, Serialize};
use thiserror::Error;

/// The payload type of in-toto statements.
pub const IN_TOTO_PAYLOAD_TYPE: &str = "application/vnd.in-toto+json";
/// Refuse envelopes larger than this before parsing (a manifest is kilobytes).
pub const MAX_ENVELOPE_BYTES: usize = 16 << 20;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Signature {
    /// Lowercase hex of the signer's 32-byte Ed25519 public key (an unauthenticated hint:
    /// pin the key with `--trusted-key`).
    pub keyid: String,
    /// Standard base64 of the 64-byte signature.
    pub sig: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Envelope {
    /// Standard base64 (with padding) of the payload bytes.
    pub payload: String,
    #[serde(rename = "payloadType")]
    pub payload_type: String,
    pub signatures: Vec<Signature>,
}

#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum DsseError {
    #[error("envelope is not valid JSON of the DSSE shape: {0}")]
    Malformed(String),
    #[error("envelope payload is not base64")]
    PayloadEncoding,
    #[error("envelope has no signature")]
    Unsigned,
    #[error("signature keyid {0:?} is not a hex Ed25519 public key")]
    BadKeyId(String),
    #[error("no signature by key {0}")]
    NoSignatureBy(String),
    #[error("the signature by key {0} does not verify (the payload or signature was changed)")]
    BadSignature(String),
}

/// DSSE pre-authentication encoding.
pub fn pae(payload_type: &str, body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(body.len() + payload_type.len() + 32);
    out.extend_from_slice(format!("DSSEv1 {} {payload_type} {} ", payload_type.len(), body.len()).as_bytes());
    out.extend_from_slice(body);
    out
}

impl Envelope {
    /// Signs `body` as `payload_type` with `key`.
    pub fn sign(payload_type: &str, body: &[u8], key: &Identity) -> Self {
        let sig = key.sign(&pae(payload_type, body));
        Self {
            payload: B64.encode(body),
            payload_type: payload_type.to_string(),
            signatures: vec![Signature { keyid: hex::encode(key.public_bytes()), sig: B64.encode(sig) }],
        }
    }

    /// Parses envelope JSON (any whitespace or member order).
    pub fn from_json(bytes: &[u8]) -> Result<Self, DsseError> {
        if bytes.len() > MAX_ENVELOPE_BYTES {
            return Err(DsseError::Malformed(format!("{} bytes is more than {MAX_ENVELOPE_BYTES}", bytes.len())));
        }
        serde_json::from_slice(bytes).map_err(|e| DsseError::Malformed(e.to_string()))
    }

    /// The canonical (RFC 8785) bytes: what is written to disk and digested.
    pub fn to_canonical(&self) -> Vec<u8> {
        let value = serde_json::to_value(self).expect("an envelope is strings only");
        canonical::to_vec(&value).expect("strings canonicalise")
    }

    pub fn payload_bytes(&self) -> Result<Vec<u8>, DsseError> {
        B64.decode(&self.payload).map_err(|_| DsseError::PayloadEncoding)
    }

    /// The public key named by the first signature's keyid.
    pub fn signer_hint(&self) -> Result<VerifyingKey, DsseError> {
        let s = self.signatures.first().ok_or(DsseError::Unsigned)?;
        key_from_hex(&s.keyid).ok_or_else(|| DsseError::BadKeyId(s.keyid.clone()))
    }

    /// Checks that `key` signed the payload; returns the payload bytes.
    pub fn verify(&self, key: &VerifyingKey) -> Result<Vec<u8>, DsseError> {
        let body = self.payload_bytes()?;
        if self.signatures.is_empty() {
            return Err(DsseError::Unsigned);
        }
        let want = hex::encode(key.to_bytes());
        let sig = self
            .signatures
            .iter()
            .find(|s| s.keyid.eq_ignore_ascii_case(&want))
            .ok_or(DsseError::NoSignatureBy(want.clone()))?;
        let raw: [u8; 64] = B64
            .decode(&sig.sig)
            .ok()
            .and_then(|b| b.try_into().ok())
            .ok_or_else(|| DsseError::BadSignature(want.clone()))?;
        if identity::verify(key, &pae(&self.payload_type, &body), &raw) {
            Ok(body)
        } else {
            Err(DsseError::BadSignature(want))
        }
    }
}

/// 64 hex digits → an Ed25519 public key.
pub fn key_from_hex(text: &str) -> Option<VerifyingKey> {
    VerifyingKey::from_bytes(&identity::parse_key_hex(text)?).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn pae_matches_the_dsse_spec_example() {
        // From the DSSE protocol document.
        assert_eq!(
            pae("http://example.com/HelloWorld", b"hello world"),
            b"DSSEv1 29 http://example.com/HelloWorld 11 hello world"
        );
    }

    #[test]
    fn sign_verify_round_trip_and_tampering() {
        let key = Identity::from_seed([3; 32]);
        let env = Envelope::sign(IN_TOTO_PAYLOAD_TYPE, b"{\"a\":1}", &key);
        let parsed = Envelope::from_json(&env.to_canonical()).unwrap();
        assert_eq!(parsed, env);
        assert_eq!(parsed.verify(&key.verifying_key()).unwrap(), b"{\"a\":1}");
        assert_eq!(parsed.signer_hint().unwrap(), key.verifying_key());

        let other = Identity::from_seed([4; 32]);
        assert!(matches!(env.verify(&other.verifying_key()), Err(DsseError::NoSignatureBy(_))));
        let mut forged = Envelope::sign(IN_TOTO_PAYLOAD_TYPE, b"{\"a\":1}", &other);
        forged.signatures[0].keyid = env.signatures[0].keyid.clone();
        assert!(matches!(forged.verify(&key.verifying_key()), Err(DsseError::BadSignature(_))));
        let mut changed = env.clone();
        changed.payload = B64.encode(b"{\"a\":2}");
        assert!(matches!(changed.verify(&key.verifying_key()), Err(DsseError::BadSignature(_))));
        let mut retyped = env.clone();
        retyped.payload_type = "text/plain".into();
        assert!(matches!(retyped.verify(&key.verifying_key()), Err(DsseError::BadSignature(_))));
    }

    #[test]
    fn canonical_bytes_are_sorted_and_compact() {
        let env = Envelope::sign("t", b"x", &Identity::from_seed([1; 32]));
        let text = String::from_utf8(env.to_canonical()).unwrap();
        assert!(
            text.starts_with("{\"payload\":\"eA==\",\"payloadType\":\"t\",\"signatures\":[{\"keyid\":\""),
            "{text}"
        );
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            if let Ok(env) = Envelope::from_json(&bytes) {
                let _ = env.signer_hint();
                let _ = env.verify(&Identity::from_seed([1; 32]).verifying_key());
            }
        }

        #[test]
        fn mutated_envelopes_never_panic_and_never_verify(idx in any::<prop::sample::Index>(), byte in any::<u8>()) {
            let key = Identity::from_seed([8; 32]);
            let mut bytes = Envelope::sign(IN_TOTO_PAYLOAD_TYPE, b"{\"k\":\"v\"}", &key).to_canonical();
            let i = idx.index(bytes.len());
            let original = bytes[i];
            bytes[i] = byte;
            if let Ok(env) = Envelope::from_json(&bytes) {
                let ok = env.verify(&key.verifying_key()).is_ok();
                // Only no-op edits or edits that keep the same meaning (hex case in keyid) may verify.
                let same_payload = env.payload_bytes().ok().as_deref() == Some(&b"{\"k\":\"v\"}"[..]);
                prop_assert!(!ok || byte == original || same_payload, "edit at {} verified", i);
            }
        }
    }
}
