//! The settling key: a funded secp256k1 key read from a 0600 file or the environment.
//! It is never printed: `Debug` shows the address only.

use std::fmt;
use std::path::Path;

use alloy::primitives::Address;
use alloy::signers::local::PrivateKeySigner;
use thiserror::Error;

#[derive(Debug, Error)]
pub enum KeyError {
    #[error("cannot read key file {path}: {source}")]
    Read { path: String, source: std::io::Error },
    #[error("key file {path} is readable by others (mode {mode:o}); run `chmod 600 {path}`")]
    Permissions { path: String, mode: u32 },
    #[error("environment variable {0} is not set")]
    MissingEnv(String),
    #[error("the key is not 32 bytes of hex")]
    Malformed,
}

#[derive(Clone)]
pub struct SettlerKey {
    signer: PrivateKeySigner,
}

impl SettlerKey {
    /// Reads a hex key (with or without `0x`, surrounding whitespace ignored); the file
    /// must not be accessible to group or others.
    pub fn from_file(path: &Path) -> Result<Self, KeyError> {
        use std::os::unix::fs::PermissionsExt;
        let shown = path.display().to_string();
        let meta = std::fs::metadata(path).map_err(|source| KeyError::Read { path: shown.clone(), source })?;
        let mode = meta.permissions().mode() & 0o777;
        if mode & 0o077 != 0 {
            return Err(KeyError::Permissions { path: shown, mode });
        }
        let text = std::fs::read_to_string(path).map_err(|source| KeyError::Read { path: shown, source })?;
        Self::from_hex(&text)
    }

    /// Reads the key from environment variable `var`.
    pub fn from_env(var: &str) -> Result<Self, KeyError> {
        let text = std::env::var(var).map_err(|_| KeyError::MissingEnv(var.into()))?;
        Self::from_hex(&text)
    }

    pub fn from_hex(text: &str) -> Result<Self, KeyError> {
        let t = text.trim();
        let t = t.strip_prefix("0x").unwrap_or(t);
        if t.len() != 64 {
            return Err(KeyError::Malformed);
        }
        let signer: PrivateKeySigner = t.parse().map_err(|_| KeyError::Malformed)?;
        Ok(Self { signer })
    }

    pub fn from_signer(signer: PrivateKeySigner) -> Self {
        Self { signer }
    }

    pub fn address(&self) -> Address {
        self.signer.address()
    }

    pub fn signer(&self) -> &PrivateKeySigner {
        &self.signer
    }
}

impl fmt::Debug for SettlerKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SettlerKey({})", self.address())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    const KEY: &str = "0xac0974bec39a17e36ba4a6b4d238ff944bacb478cbed5efcae784d7bf4f2ff80";

    #[test]
    fn file_must_be_private_and_debug_hides_the_key() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("settler.key");
        std::fs::write(&path, format!("{KEY}\n")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(matches!(SettlerKey::from_file(&path), Err(KeyError::Permissions { mode: 0o644, .. })));
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        let key = SettlerKey::from_file(&path).unwrap();
        assert_eq!(key.address().to_string(), "0xf39Fd6e51aad88F6F4ce6aB8827279cffFb92266");
        let shown = format!("{key:?}");
        assert!(!shown.to_lowercase().contains(&KEY[2..12]), "{shown}");
        assert!(matches!(SettlerKey::from_hex("0x1234"), Err(KeyError::Malformed)));
    }
}
