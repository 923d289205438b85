//! Signed log checkpoints in the C2SP `tlog-checkpoint` signed-note format.
//!
//! ```text
//! mindxtrain/3f9a0c1d2e4b5a69        ← origin (unique per log: from the node key)
//! 1234                               ← tree size
//! q3Jm…base64 root…=                 ← Merkle root (RFC 6962 shape, BLAKE3)
//!                                    ← blank line ends the signed text
//! — mindxtrain/3f9a0c1d2e4b5a69 AAAA…base64(key id ‖ signature)…
//! ```
//! The key id is the first 4 bytes of `SHA-256(name ‖ "\n" ‖ 0x01 ‖ public key)`
//! (0x01 = Ed25519, per the signed-note spec); the signature covers the text up to and
//! including the newline before the blank line.

use crate::identity::{self, Identity};
use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use ed25519_dalek::VerifyingKey;
use sha2::{Digest, Sha256};
use thiserror::Error;

use super::record::Hash;

/// Signature type byte for Ed25519 in signed notes.
const ED25519_TYPE: u8 = 0x01;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checkpoint {
    pub origin: String,
    pub size: u64,
    pub root: Hash,
}

#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum CheckpointError {
    #[error("malformed checkpoint: {0}")]
    Malformed(String),
    #[error("no signature by {name} (key id {key_id}) on the checkpoint")]
    NoSignature { name: String, key_id: String },
    #[error("checkpoint signature by {0} does not verify")]
    BadSignature(String),
}

/// The origin line of a node's log: stable, and unique per signing key.
pub fn origin_for(public_key: &[u8; 32]) -> String {
    format!("mindxtrain/{}", &hex::encode(Sha256::digest(public_key))[..16])
}

/// The 4-byte signed-note key id of an Ed25519 key under `name`.
pub fn key_id(name: &str, public_key: &[u8; 32]) -> [u8; 4] {
    let mut h = Sha256::new();
    h.update(name.as_bytes());
    h.update(b"\n");
    h.update([ED25519_TYPE]);
    h.update(public_key);
    let d = h.finalize();
    [d[0], d[1], d[2], d[3]]
}

/// The verifier key string of the signed-note ecosystem: `name+keyid+base64(0x01‖key)`.
pub fn verifier_key(name: &str, public_key: &[u8; 32]) -> String {
    let mut k = vec![ED25519_TYPE];
    k.extend_from_slice(public_key);
    format!("{name}+{}+{}", hex::encode(key_id(name, public_key)), B64.encode(k))
}

/// A signed note: `text` (which ends in a newline), a blank line, and one signature line
/// `— name base64(key id ‖ Ed25519 signature of text)`.
pub(crate) fn sign_note(text: &str, name: &str, key: &Identity) -> String {
    let mut sig = key_id(name, &key.public_bytes()).to_vec();
    sig.extend_from_slice(&key.sign(text.as_bytes()));
    format!("{text}\n\u{2014} {name} {}\n", B64.encode(sig))
}

impl Checkpoint {
    /// The signed part of the note.
    pub fn body(&self) -> String {
        format!("{}\n{}\n{}\n", self.origin, self.size, B64.encode(self.root))
    }

    /// The full note, signed by `key` under the checkpoint's origin as key name.
    pub fn sign(&self, key: &Identity) -> String {
        sign_note(&self.body(), &self.origin, key)
    }

    /// Parses a note and checks that `public_key` signed it under the origin's name.
    pub fn verify(note: &str, public_key: &VerifyingKey) -> Result<Self, CheckpointError> {
        let bad = |m: &str| CheckpointError::Malformed(m.to_string());
        let (body, sigs) = note.split_once("\n\n").ok_or_else(|| bad("no blank line before the signatures"))?;
        let body = format!("{body}\n");
        let mut lines = body.lines();
        let origin = lines.next().filter(|l| !l.is_empty()).ok_or_else(|| bad("missing origin line"))?.to_string();
        let size_line = lines.next().ok_or_else(|| bad("missing tree size line"))?;
        if size_line.is_empty()
            || !size_line.bytes().all(|b| b.is_ascii_digit())
            || (size_line.len() > 1 && size_line.starts_with('0'))
        {
            return Err(bad("tree size is not a decimal number"));
        }
        let size: u64 = size_line.parse().map_err(|_| bad("tree size out of range"))?;
        let root: Hash = B64
            .decode(lines.next().ok_or_else(|| bad("missing root hash line"))?)
            .ok()
            .and_then(|r| r.try_into().ok())
            .ok_or_else(|| bad("root hash is not base64 of 32 bytes"))?;
        let pk = public_key.to_bytes();
        let want_id = key_id(&origin, &pk);
        for line in sigs.lines() {
            let Some(rest) = line.strip_prefix("\u{2014} ") else {
                return Err(bad("signature line does not start with an em dash"));
            };
            let Some((name, b64)) = rest.split_once(' ') else { return Err(bad("signature line lacks a name")) };
            let Ok(raw) = B64.decode(b64) else { return Err(bad("signature is not base64")) };
            if name != origin || raw.len() != 4 + 64 || raw[..4] != want_id {
                continue;
            }
            let sig: [u8; 64] = raw[4..].try_into().expect("length checked");
            return if identity::verify(public_key, body.as_bytes(), &sig) {
                Ok(Self { origin, size, root })
            } else {
                Err(CheckpointError::BadSignature(name.to_string()))
            };
        }
        Err(CheckpointError::NoSignature { name: origin, key_id: hex::encode(want_id) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signed_note_round_trips_and_rejects_tampering() {
        let key = Identity::from_seed([5; 32]);
        let cp = Checkpoint { origin: origin_for(&key.public_bytes()), size: 42, root: [7; 32] };
        let note = cp.sign(&key);
        assert!(note.starts_with(&format!("{}\n42\n", cp.origin)));
        assert!(note.contains("\n\n\u{2014} mindxtrain/"));
        assert_eq!(Checkpoint::verify(&note, &key.verifying_key()).unwrap(), cp);

        let other = Identity::from_seed([6; 32]);
        assert!(matches!(Checkpoint::verify(&note, &other.verifying_key()), Err(CheckpointError::NoSignature { .. })));
        let tampered = note.replacen("\n42\n", "\n43\n", 1);
        assert!(matches!(Checkpoint::verify(&tampered, &key.verifying_key()), Err(CheckpointError::BadSignature(_))));
        assert!(Checkpoint::verify("garbage", &key.verifying_key()).is_err());
    }

    #[test]
    fn key_id_follows_signed_note_spec() {
        // Recompute by hand: SHA-256(name ‖ '\n' ‖ 0x01 ‖ key)[..4].
        let pk = [9u8; 32];
        let mut buf = b"example.com/log\n".to_vec();
        buf.push(1);
        buf.extend_from_slice(&pk);
        assert_eq!(key_id("example.com/log", &pk).to_vec(), Sha256::digest(&buf)[..4].to_vec());
        let vk = verifier_key("example.com/log", &pk);
        assert!(vk.starts_with("example.com/log+"));
    }

    /// Known-answer test against the reference implementation of the signed-note spec:
    /// the constants of golang.org/x/mod/sumdb/note's note_test.go (TestNewVerifier,
    /// TestNewSigner, TestSign).
    #[test]
    fn matches_the_go_sumdb_note_test_vectors() {
        const NAME: &str = "PeterNeumann";
        const VERIFIER_KEY: &str = "PeterNeumann+c74f20a3+ARpc2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10TW";
        const SIGNER_KEY: &str = "PRIVATE+KEY+PeterNeumann+c74f20a3+AYEKFALVFGyNhPJEMzD1QIDr+Y7hfZx09iUvxdXHKDFz";
        const TEXT: &str = "If you think cryptography is the answer to your problem,\n\
                            then you don't know what your problem is.\n";
        const SIGNATURE: &str =
            "x08go/ZJkuBS9UG/SffcvIAQxVBtiFupLLr8pAcElZInNIuGUgYN1FFYC2pZSNXgKvqfqdngotpRZb6KE6RyyBwJnAM=";

        // The private key is `PRIVATE+KEY+name+hash+base64(0x01 ‖ Ed25519 seed)`.
        // (The base64 may itself contain '+', so split off the four fields before it.)
        let encoded = SIGNER_KEY.splitn(5, '+').nth(4).unwrap();
        let raw = B64.decode(encoded).unwrap();
        assert_eq!((raw.len(), raw[0]), (33, ED25519_TYPE));
        let key = Identity::from_seed(raw[1..].try_into().unwrap());
        let pk = key.public_bytes();

        // The public key derived from the seed is the one in Go's verifier key.
        let published = B64.decode(VERIFIER_KEY.splitn(3, '+').nth(2).unwrap()).unwrap();
        assert_eq!(published[0], ED25519_TYPE);
        assert_eq!(published[1..], pk);

        assert_eq!(hex::encode(key_id(NAME, &pk)), "c74f20a3");
        assert_eq!(verifier_key(NAME, &pk), VERIFIER_KEY);

        // Ed25519 is deterministic, so signing reproduces Go's note byte for byte.
        let note = sign_note(TEXT, NAME, &key);
        assert_eq!(note, format!("{TEXT}\n\u{2014} {NAME} {SIGNATURE}\n"));
        let sig: [u8; 64] = B64.decode(SIGNATURE).unwrap()[4..].try_into().unwrap();
        assert!(identity::verify(&key.verifying_key(), TEXT.as_bytes(), &sig));
    }
}
