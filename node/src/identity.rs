//! The node's ed25519 identity.
//!
//! The secret seed lives in `node.key` (hex, mode 0600, refused if group- or
//! world-readable, as ssh refuses loose keys, unless [`allow_readable_secrets`] was
//! called); the public key in `node.pub`. The key signs every event, every log checkpoint
//! and every manifest.

use crate::fsutil;
use ed25519_dalek::{Signature, Signer, SigningKey, VerifyingKey};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use thiserror::Error;

/// Whether secret files readable by group or others are accepted (see
/// [`allow_readable_secrets`]).
static ALLOW_READABLE_SECRETS: AtomicBool = AtomicBool::new(false);

/// Accepts `node.key` and `api.token` files that group or others can read, for this
/// process. The binary calls it for `--allow-readable-secrets`: some secret stores mount
/// files 0644 and cannot do otherwise. Like ssh's `StrictModes no`, it is a process-wide
/// choice made once at start, never a default.
pub fn allow_readable_secrets() {
    ALLOW_READABLE_SECRETS.store(true, Ordering::Relaxed);
}

/// The mode bits of a secret file group or others may use, or `None` when it is private
/// (or loose modes are allowed).
pub fn loose_mode(meta: &std::fs::Metadata) -> Option<u32> {
    let mode = meta.permissions().mode() & 0o777;
    (mode & 0o077 != 0 && !ALLOW_READABLE_SECRETS.load(Ordering::Relaxed)).then_some(mode)
}

pub const SECRET_FILE: &str = "node.key";
pub const PUBLIC_FILE: &str = "node.pub";

#[derive(Debug, Error)]
pub enum IdentityError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error(
        "{path} is readable by group or others (mode {mode:o}); run `chmod 600 {path}` (or pass \
         --allow-readable-secrets if the file cannot be private)"
    )]
    LoosePermissions { path: PathBuf, mode: u32 },
    #[error("{path}: not a hex-encoded 32-byte ed25519 key")]
    Malformed { path: PathBuf },
    #[error("no usable randomness from the operating system: {0}")]
    Random(String),
}

/// A node's signing key with its public half.
#[derive(Clone)]
pub struct Identity {
    signing: SigningKey,
}

impl std::fmt::Debug for Identity {
    // Never print the secret, not even in debug output.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Identity").field("public", &hex::encode(self.public_bytes())).finish()
    }
}

impl Identity {
    /// A fresh key from the operating system's randomness.
    pub fn generate() -> Result<Self, IdentityError> {
        let mut seed = [0u8; 32];
        getrandom::fill(&mut seed).map_err(|e| IdentityError::Random(e.to_string()))?;
        Ok(Self { signing: SigningKey::from_bytes(&seed) })
    }

    /// Deterministic key for tests and benchmarks.
    pub fn from_seed(seed: [u8; 32]) -> Self {
        Self { signing: SigningKey::from_bytes(&seed) }
    }

    /// Writes `node.key` (0600) and `node.pub` into `dir`; refuses to overwrite.
    pub fn create_in(dir: &Path) -> Result<Self, IdentityError> {
        let id = Self::generate()?;
        let secret = dir.join(SECRET_FILE);
        let mut text = hex::encode(id.signing.to_bytes());
        text.push('\n');
        fsutil::write_new_durably(&secret, text.as_bytes(), 0o600)
            .map_err(|source| IdentityError::Io { path: secret.clone(), source })?;
        let public = dir.join(PUBLIC_FILE);
        let pub_text = format!("{}\n", hex::encode(id.public_bytes()));
        fsutil::write_new_durably(&public, pub_text.as_bytes(), 0o644)
            .map_err(|source| IdentityError::Io { path: public.clone(), source })?;
        Ok(id)
    }

    /// Loads `node.key` from `dir`, checking its permissions first.
    pub fn load_from(dir: &Path) -> Result<Self, IdentityError> {
        let path = dir.join(SECRET_FILE);
        let io = |source| IdentityError::Io { path: path.clone(), source };
        let meta = std::fs::metadata(&path).map_err(io)?;
        if let Some(mode) = loose_mode(&meta) {
            return Err(IdentityError::LoosePermissions { path, mode });
        }
        let text = std::fs::read_to_string(&path).map_err(io)?;
        let seed = parse_key_hex(text.trim()).ok_or(IdentityError::Malformed { path })?;
        Ok(Self::from_seed(seed))
    }

    pub fn public_bytes(&self) -> [u8; 32] {
        self.signing.verifying_key().to_bytes()
    }

    pub fn verifying_key(&self) -> VerifyingKey {
        self.signing.verifying_key()
    }

    pub fn sign(&self, message: &[u8]) -> [u8; 64] {
        self.signing.sign(message).to_bytes()
    }
}

/// Parses a hex-encoded 32-byte key (public or secret seed).
pub fn parse_key_hex(text: &str) -> Option<[u8; 32]> {
    let bytes = hex::decode(text).ok()?;
    bytes.try_into().ok()
}

/// Reads a public key from a `node.pub`-style file or a literal hex string.
pub fn read_public_key(arg: &str) -> Result<VerifyingKey, String> {
    let text = if Path::new(arg).is_file() {
        std::fs::read_to_string(arg).map_err(|e| format!("{arg}: {e}"))?
    } else {
        arg.to_string()
    };
    let bytes =
        parse_key_hex(text.trim()).ok_or_else(|| format!("{arg}: not a hex-encoded 32-byte ed25519 public key"))?;
    VerifyingKey::from_bytes(&bytes).map_err(|e| format!("{arg}: {e}"))
}

/// Verifies an ed25519 signature, rejecting non-canonical and small-order forms.
pub fn verify(key: &VerifyingKey, message: &[u8], signature: &[u8; 64]) -> bool {
    let sig = Signature::from_bytes(signature);
    key.verify_strict(message, &sig).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn create_then_load_round_trips_with_private_mode() {
        let dir = tempfile::tempdir().unwrap();
        let id = Identity::create_in(dir.path()).unwrap();
        let mode = std::fs::metadata(dir.path().join(SECRET_FILE)).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let again = Identity::load_from(dir.path()).unwrap();
        assert_eq!(id.public_bytes(), again.public_bytes());
        assert!(Identity::create_in(dir.path()).is_err(), "must not overwrite a key");
    }

    #[test]
    fn loose_permissions_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        Identity::create_in(dir.path()).unwrap();
        let path = dir.path().join(SECRET_FILE);
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(matches!(Identity::load_from(dir.path()), Err(IdentityError::LoosePermissions { .. })));
    }

    #[test]
    fn debug_output_hides_the_secret() {
        let id = Identity::from_seed([9; 32]);
        let dbg = format!("{id:?}");
        assert!(!dbg.contains(&hex::encode([9u8; 32])));
    }

    #[test]
    fn signatures_verify_only_with_the_right_key_and_message() {
        let a = Identity::from_seed([1; 32]);
        let b = Identity::from_seed([2; 32]);
        let sig = a.sign(b"msg");
        assert!(verify(&a.verifying_key(), b"msg", &sig));
        assert!(!verify(&b.verifying_key(), b"msg", &sig));
        assert!(!verify(&a.verifying_key(), b"msh", &sig));
    }
}
