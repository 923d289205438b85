//! The anchoring key: a secp256k1 secret that pays for anchors.
//!
//! It comes from a file readable by its owner only (mode 0600 or stricter) or from the
//! `MINDXTRAIN_ANCHOR_KEY` environment variable, as 64 hex digits with an optional `0x`.
//! The secret is never printed: [`AnchorKey`] shows only its address, and errors never
//! quote the file's content.

use alloy::primitives::{Address, B256};
use alloy::signers::local::PrivateKeySigner;
use std::fmt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use thiserror::Error;

/// Environment variable holding the anchoring key in hex.
pub const KEY_ENV: &str = "MINDXTRAIN_ANCHOR_KEY";

/// anvil's first development account (from its public default mnemonic). Only ever
/// used on development chains, where it is funded and worthless.
const ANVIL_DEV_KEY: &str = "ac0974bec39a17e36ba4a6b4d238ff944bacb478cbed5efcae784d7bf4f2ff80";

#[derive(Debug, Error)]
pub enum KeyError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{path} has mode {mode:o}: a key file must not be readable by group or others (run `chmod 600 {path}`)")]
    InsecurePermissions { path: PathBuf, mode: u32 },
    #[error("{source_name}: not a secp256k1 private key (expected 64 hex digits, optionally prefixed by 0x)")]
    Malformed { source_name: String },
}

/// A loaded signing key. `Debug` shows the address only.
#[derive(Clone)]
pub struct AnchorKey {
    signer: PrivateKeySigner,
    origin: KeyOrigin,
}

/// Where a key came from (for messages; never the secret).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyOrigin {
    File(PathBuf),
    Env,
    DevelopmentAccount,
    /// Handed over as bytes by the program itself.
    Provided,
}

impl fmt::Display for KeyOrigin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeyOrigin::File(p) => write!(f, "key file {}", p.display()),
            KeyOrigin::Env => write!(f, "${KEY_ENV}"),
            KeyOrigin::DevelopmentAccount => write!(f, "anvil development account 0"),
            KeyOrigin::Provided => write!(f, "a key given by the program"),
        }
    }
}

impl fmt::Debug for AnchorKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AnchorKey").field("address", &self.address()).field("origin", &self.origin).finish()
    }
}

impl AnchorKey {
    /// Reads a key file, refusing one that group or others may read.
    pub fn from_file(path: &Path) -> Result<Self, KeyError> {
        let io = |source| KeyError::Io { path: path.to_path_buf(), source };
        let meta = std::fs::metadata(path).map_err(io)?;
        let mode = meta.permissions().mode() & 0o777;
        if mode & 0o077 != 0 {
            return Err(KeyError::InsecurePermissions { path: path.to_path_buf(), mode });
        }
        let text = std::fs::read_to_string(path).map_err(io)?;
        let signer =
            parse_secret(&text).ok_or_else(|| KeyError::Malformed { source_name: path.display().to_string() })?;
        Ok(Self { signer, origin: KeyOrigin::File(path.to_path_buf()) })
    }

    /// The key in `$MINDXTRAIN_ANCHOR_KEY`, if the variable is set.
    pub fn from_env() -> Result<Option<Self>, KeyError> {
        match std::env::var(KEY_ENV) {
            Ok(v) => parse_secret(&v)
                .map(|signer| Some(Self { signer, origin: KeyOrigin::Env }))
                .ok_or_else(|| KeyError::Malformed { source_name: format!("${KEY_ENV}") }),
            Err(_) => Ok(None),
        }
    }

    /// anvil's funded development account; for development chains only.
    pub fn development() -> Self {
        let signer = parse_secret(ANVIL_DEV_KEY).expect("the development key is valid");
        Self { signer, origin: KeyOrigin::DevelopmentAccount }
    }

    /// A key from raw secret bytes (tests, benchmarks, generated keys).
    pub fn from_secret_bytes(secret: &[u8; 32]) -> Result<Self, KeyError> {
        PrivateKeySigner::from_bytes(&B256::from(*secret))
            .map(|signer| Self { signer, origin: KeyOrigin::Provided })
            .map_err(|_| KeyError::Malformed { source_name: "secret bytes".into() })
    }

    /// Writes `secret` as a new key file with mode 0600 (fails if `path` exists).
    pub fn write_new_file(path: &Path, secret: &[u8; 32]) -> Result<Self, KeyError> {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let io = |source| KeyError::Io { path: path.to_path_buf(), source };
        let key = Self::from_secret_bytes(secret)?;
        let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(path).map_err(io)?;
        f.write_all(format!("{}\n", hex::encode(secret)).as_bytes()).map_err(io)?;
        f.sync_all().map_err(io)?;
        Ok(Self { origin: KeyOrigin::File(path.to_path_buf()), ..key })
    }

    pub fn address(&self) -> Address {
        self.signer.address()
    }

    pub fn origin(&self) -> &KeyOrigin {
        &self.origin
    }

    pub(crate) fn signer(&self) -> &PrivateKeySigner {
        &self.signer
    }
}

fn parse_secret(text: &str) -> Option<PrivateKeySigner> {
    let t = text.trim();
    let t = t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")).unwrap_or(t);
    if t.len() != 64 {
        return None;
    }
    let bytes: [u8; 32] = hex::decode(t).ok()?.try_into().ok()?;
    PrivateKeySigner::from_bytes(&B256::from(bytes)).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_files_must_be_private_and_debug_hides_the_secret() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("anchor.key");
        let secret = [0x11u8; 32];
        let written = AnchorKey::write_new_file(&path, &secret).unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        let key = AnchorKey::from_file(&path).unwrap();
        assert_eq!(key.address(), written.address());
        let shown = format!("{key:?}");
        assert!(!shown.contains(&hex::encode(secret)), "{shown}");
        assert!(shown.contains(&format!("{:?}", key.address())), "{shown}");

        for mode in [0o640, 0o604, 0o644] {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
            assert!(matches!(AnchorKey::from_file(&path), Err(KeyError::InsecurePermissions { .. })));
        }
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o400)).unwrap();
        assert!(AnchorKey::from_file(&path).is_ok());
    }

    #[test]
    fn malformed_keys_are_refused_without_echoing_them() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("k");
        std::fs::write(&path, "0xnot-a-key-but-a-secret-looking-string").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        let err = AnchorKey::from_file(&path).unwrap_err().to_string();
        assert!(!err.contains("secret-looking"), "{err}");
        assert!(parse_secret(&format!("0x{ANVIL_DEV_KEY}")).is_some());
        assert!(parse_secret(&"00".repeat(32)).is_none(), "zero is not a valid secp256k1 key");
        assert!(parse_secret("abc").is_none());
    }

    #[test]
    fn development_key_is_anvils_first_account() {
        assert_eq!(
            AnchorKey::development().address().to_string().to_lowercase(),
            "0xf39fd6e51aad88f6f4ce6ab8827279cfffb92266"
        );
    }
}
