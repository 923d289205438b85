//! One event as it lies on disk.
//!
//! ```text
//! record = len u32 LE | crc32c(body) u32 LE | body
//! body   = canonical JSON envelope | ed25519 signature (64 bytes)
//! hash   = BLAKE3(canonical JSON envelope)
//! sig    = Ed25519(node key, "mindxtrain/event/v1\n" ‖ hash)
//! ```
//! The envelope's members, in canonical (sorted) order, are
//! `data, id, kind, prev, seq, subject, time, v`. `id` is the caller's idempotency
//! key: it must be inside the signed record so that a retry after a crash still finds
//! the original event.

use crate::canonical::{self, CanonicalError};
use crate::identity::{self, Identity};
use ed25519_dalek::VerifyingKey;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use thiserror::Error;

pub use mindxtrain_chain::merkle::Hash;

/// Envelope format version written by this build.
pub const ENVELOPE_VERSION: u32 = 1;
/// Bytes of the `len | crc` header.
pub const HEADER_LEN: usize = 8;
/// Ed25519 signature length.
pub const SIG_LEN: usize = 64;
/// Smallest body that can hold an envelope and a signature.
pub const MIN_BODY: usize = SIG_LEN + 64;
/// Largest body accepted; bounds memory and turns garbage lengths into errors fast.
pub const MAX_BODY: usize = 4 << 20;
/// Largest canonical `data` member an event may carry.
pub const MAX_DATA: usize = 1 << 20;
/// Domain separation: an event signature can never be replayed as another object's.
pub const SIGNATURE_CONTEXT: &[u8] = b"mindxtrain/event/v1\n";

/// The signed part of an event.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Envelope {
    pub v: u32,
    pub seq: u64,
    /// Hex BLAKE3 of the previous envelope; 64 zeros for seq 0.
    pub prev: String,
    /// RFC 3339 UTC time of sequencing, microsecond precision.
    pub time: String,
    pub kind: String,
    pub subject: String,
    pub id: String,
    pub data: Value,
}

/// An event read back from the log.
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    pub envelope: Envelope,
    pub hash: Hash,
    pub signature: [u8; SIG_LEN],
}

impl Event {
    /// JSON view for `--json` output and the HTTP API.
    pub fn to_json(&self) -> Value {
        let mut v = serde_json::to_value(&self.envelope).unwrap_or(Value::Null);
        if let Value::Object(m) = &mut v {
            m.insert("hash".into(), Value::String(hex::encode(self.hash)));
            m.insert("sig".into(), Value::String(hex::encode(self.signature)));
        }
        v
    }

    pub fn verify_signature(&self, key: &VerifyingKey) -> bool {
        identity::verify(key, &signing_message(&self.hash), &self.signature)
    }
}

#[derive(Debug, Error, Clone, PartialEq)]
pub enum EncodeError {
    #[error("event kind {0:?} must be 1-64 chars of lowercase dotted words ([a-z0-9_] separated by '.')")]
    BadKind(String),
    #[error("event subject is {0} bytes; at most 256 allowed")]
    SubjectTooLong(usize),
    #[error("event id {0:?} must be 1-128 printable ASCII characters")]
    BadId(String),
    #[error("event data must be a JSON object")]
    DataNotObject,
    #[error("event data is {0} bytes canonical; at most {MAX_DATA} allowed")]
    DataTooLarge(usize),
    #[error("event data: {0}")]
    Canonical(#[from] CanonicalError),
}

#[derive(Debug, Error, Clone, PartialEq)]
pub enum DecodeError {
    #[error("body of {0} bytes is too short for an envelope and signature")]
    TooShort(usize),
    #[error("envelope is not valid JSON of the expected shape: {0}")]
    Json(String),
    #[error("envelope is not in canonical form (its bytes would hash differently)")]
    NotCanonical,
}

/// Checks a kind like `run.started` or `payment.settled`.
pub fn validate_kind(kind: &str) -> Result<(), EncodeError> {
    let ok = !kind.is_empty()
        && kind.len() <= 64
        && kind
            .split('.')
            .all(|w| !w.is_empty() && w.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_'));
    if ok { Ok(()) } else { Err(EncodeError::BadKind(kind.to_string())) }
}

pub fn validate_id(id: &str) -> Result<(), EncodeError> {
    let ok = !id.is_empty() && id.len() <= 128 && id.bytes().all(|b| (0x21..0x7f).contains(&b));
    if ok { Ok(()) } else { Err(EncodeError::BadId(id.to_string())) }
}

/// Canonical bytes of `data`, checked against the event limits.
pub fn canonical_data(data: &Value) -> Result<Vec<u8>, EncodeError> {
    if !data.is_object() {
        return Err(EncodeError::DataNotObject);
    }
    let bytes = canonical::to_vec(data)?;
    if bytes.len() > MAX_DATA {
        return Err(EncodeError::DataTooLarge(bytes.len()));
    }
    Ok(bytes)
}

/// The message an event signature covers.
pub fn signing_message(hash: &Hash) -> [u8; SIGNATURE_CONTEXT.len() + 32] {
    let mut m = [0u8; SIGNATURE_CONTEXT.len() + 32];
    m[..SIGNATURE_CONTEXT.len()].copy_from_slice(SIGNATURE_CONTEXT);
    m[SIGNATURE_CONTEXT.len()..].copy_from_slice(hash);
    m
}

/// Fields of an envelope before its data is attached, borrowed to avoid copies on the
/// hot path.
#[derive(Clone, Copy)]
pub struct EnvelopeParts<'a> {
    pub seq: u64,
    pub prev: &'a Hash,
    pub time: &'a str,
    pub kind: &'a str,
    pub subject: &'a str,
    pub id: &'a str,
}

/// Writes the canonical envelope directly: its member names are fixed, so their sorted
/// order is known and no intermediate JSON tree is needed.
pub fn canonical_envelope(parts: &EnvelopeParts<'_>, data_canonical: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let mut out = Vec::with_capacity(data_canonical.len() + parts.subject.len() + parts.id.len() + 192);
    out.extend_from_slice(b"{\"data\":");
    out.extend_from_slice(data_canonical);
    out.extend_from_slice(b",\"id\":");
    write_str(parts.id, &mut out);
    out.extend_from_slice(b",\"kind\":");
    write_str(parts.kind, &mut out);
    out.extend_from_slice(b",\"prev\":\"");
    let mut prev = [0u8; 64];
    hex::encode_to_slice(parts.prev, &mut prev).expect("64 hex digits for 32 bytes");
    out.extend_from_slice(&prev);
    write!(out, "\",\"seq\":{},\"subject\":", parts.seq).expect("writing to a Vec");
    write_str(parts.subject, &mut out);
    out.extend_from_slice(b",\"time\":");
    write_str(parts.time, &mut out);
    write!(out, ",\"v\":{ENVELOPE_VERSION}}}").expect("writing to a Vec");
    out
}

/// A JSON string in canonical form: as is between quotes when nothing in it needs an
/// escape (ids, kinds, times and most subjects), else through the canonical encoder.
fn write_str(s: &str, out: &mut Vec<u8>) {
    if s.bytes().all(|b| b >= 0x20 && b != b'"' && b != b'\\') {
        out.push(b'"');
        out.extend_from_slice(s.as_bytes());
        out.push(b'"');
    } else {
        canonical::write_value(&Value::String(s.to_string()), out).expect("strings always encode");
    }
}

/// Hashes and signs a canonical envelope, returning the framed record and its hash.
pub fn seal(envelope_bytes: &[u8], key: &Identity) -> (Vec<u8>, Hash) {
    let hash = *blake3::hash(envelope_bytes).as_bytes();
    let sig = key.sign(&signing_message(&hash));
    (frame(envelope_bytes, &sig), hash)
}

/// `len | crc | envelope | sig`.
pub fn frame(envelope_bytes: &[u8], sig: &[u8; SIG_LEN]) -> Vec<u8> {
    let mut out = Vec::with_capacity(framed_len(envelope_bytes));
    frame_into(envelope_bytes, sig, &mut out);
    out
}

/// Bytes of the record framing `envelope_bytes`.
pub fn framed_len(envelope_bytes: &[u8]) -> usize {
    HEADER_LEN + envelope_bytes.len() + SIG_LEN
}

/// Appends the record `len | crc | envelope | sig` to `out`; returns its length.
pub fn frame_into(envelope_bytes: &[u8], sig: &[u8; SIG_LEN], out: &mut Vec<u8>) -> usize {
    let body_len = envelope_bytes.len() + SIG_LEN;
    let mut crc = crc32c::crc32c(envelope_bytes);
    crc = crc32c::crc32c_append(crc, sig);
    out.extend_from_slice(&(body_len as u32).to_le_bytes());
    out.extend_from_slice(&crc.to_le_bytes());
    out.extend_from_slice(envelope_bytes);
    out.extend_from_slice(sig);
    HEADER_LEN + body_len
}

/// Splits a record body into its event; `strict` also demands canonical form.
pub fn decode_body(body: &[u8], strict: bool) -> Result<Event, DecodeError> {
    if body.len() < MIN_BODY {
        return Err(DecodeError::TooShort(body.len()));
    }
    let (json, sig) = body.split_at(body.len() - SIG_LEN);
    let envelope: Envelope = serde_json::from_slice(json).map_err(|e| DecodeError::Json(e.to_string()))?;
    if strict {
        let value = serde_json::to_value(&envelope).map_err(|e| DecodeError::Json(e.to_string()))?;
        match canonical::to_vec(&value) {
            Ok(c) if c == json => {}
            _ => return Err(DecodeError::NotCanonical),
        }
    }
    let hash = *blake3::hash(json).as_bytes();
    let signature: [u8; SIG_LEN] = sig.try_into().expect("split at SIG_LEN");
    Ok(Event { envelope, hash, signature })
}

/// Parses a record header: `(body_len, crc)`.
pub fn parse_header(h: &[u8]) -> (usize, u32) {
    let len = u32::from_le_bytes([h[0], h[1], h[2], h[3]]) as usize;
    let crc = u32::from_le_bytes([h[4], h[5], h[6], h[7]]);
    (len, crc)
}

/// Identifies an append's content, so that a retry with the same id can be told
/// apart from a different event reusing the id.
pub fn fingerprint(kind: &str, subject: &str, data_canonical: &[u8]) -> Hash {
    let mut h = blake3::Hasher::new();
    for part in [kind.as_bytes(), subject.as_bytes()] {
        h.update(&(part.len() as u64).to_le_bytes());
        h.update(part);
    }
    h.update(data_canonical);
    *h.finalize().as_bytes()
}

/// Hex of a hash, as envelopes carry it.
pub fn hash_hex(h: &Hash) -> String {
    hex::encode(h)
}

pub const ZERO_HASH: Hash = [0u8; 32];

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn handwritten_envelope_is_canonical() {
        let data = canonical_data(&json!({"z": 1, "a": "x\ny"})).unwrap();
        let prev = [0xabu8; 32];
        let parts = EnvelopeParts {
            seq: 7,
            prev: &prev,
            time: "2026-11-21T05:00:00.000001Z",
            kind: "run.started",
            subject: "run-1 \"quoted\" \\ \u{1} \u{7f} ü \n",
            id: "id-\"1\"",
        };
        let bytes = canonical_envelope(&parts, &data);
        let parsed: Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(canonical::to_vec(&parsed).unwrap(), bytes);
        // Strings that need no escape take the short way; every control byte, the quote
        // and the backslash take the encoder's.
        let subjects: Vec<String> = ["plain ü \u{7f} ~".to_string(), "'/<>".into()]
            .into_iter()
            .chain((0u8..0x20).chain([b'"', b'\\']).map(|b| format!("a{}b", b as char)))
            .collect();
        for subject in &subjects {
            let b = canonical_envelope(&EnvelopeParts { subject, id: subject, ..parts }, &data);
            let parsed: Value = serde_json::from_slice(&b).unwrap();
            assert_eq!(canonical::to_vec(&parsed).unwrap(), b, "{subject:?}");
            assert_eq!(parsed["subject"].as_str(), Some(subject.as_str()));
        }
        let key = Identity::from_seed([3; 32]);
        let (rec, hash) = seal(&bytes, &key);
        let (len, crc) = parse_header(&rec);
        assert_eq!(len, rec.len() - HEADER_LEN);
        assert_eq!(crc, crc32c::crc32c(&rec[HEADER_LEN..]));
        let ev = decode_body(&rec[HEADER_LEN..], true).unwrap();
        assert_eq!(ev.hash, hash);
        assert_eq!(ev.envelope.seq, 7);
        assert!(ev.verify_signature(&key.verifying_key()));
        assert!(!ev.verify_signature(&Identity::from_seed([4; 32]).verifying_key()));
    }

    #[test]
    fn kinds_ids_and_data_are_validated() {
        for ok in ["run.started", "a", "payment.settled_v2", "x.y.z9"] {
            validate_kind(ok).unwrap();
        }
        for bad in ["", "Run.started", "run..x", ".x", "x.", "sp ace", &"a".repeat(65)] {
            assert!(validate_kind(bad).is_err(), "{bad}");
        }
        assert!(validate_id("").is_err());
        assert!(validate_id("has space").is_err());
        assert!(canonical_data(&json!([1])).is_err());
        assert!(canonical_data(&json!({"big": 1u64 << 60})).is_err());
    }
}
