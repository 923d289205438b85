//! `chain.json`: where this node's registry lives.

use crate::fsutil;
use mindxtrain_chain::Address;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use thiserror::Error;

/// File name of the deployment record in the node directory.
pub const CHAIN_FILE: &str = "chain.json";
/// Sub-directory for the embedded anvil's state.
pub const CHAIN_DIR: &str = "chain";
/// The embedded anvil's state file (inside [`CHAIN_DIR`]).
pub const ANVIL_STATE_FILE: &str = "anvil-state.json";

#[derive(Debug, Error)]
pub enum DeploymentError {
    #[error("{0} has no chain.json: no registry is deployed for this node yet (run `mindxtrain chain deploy` first)")]
    Missing(PathBuf),
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{path} is not a valid deployment record: {reason}")]
    Invalid { path: PathBuf, reason: String },
    #[error("{0} already records a deployment; pass --force to replace it")]
    Exists(PathBuf),
}

/// What `mindxtrain chain deploy` recorded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Deployment {
    pub v: u32,
    /// Preset name (`anvil`, `base`, `base-sepolia`) or `custom`.
    pub network: String,
    pub chain_id: u64,
    /// `None`: the embedded anvil, started by the node on demand from its state file.
    pub rpc_url: Option<String>,
    pub registry: Address,
    pub deploy_tx: mindxtrain_chain::B256,
    pub deploy_block: u64,
    pub deployer: Address,
    /// RFC 3339 UTC.
    pub deployed_at: String,
    /// The EIP-3009 test token (`chain deploy --test-usdc`) a local chain's x402 sales use.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub test_usdc: Option<Address>,
}

impl Deployment {
    pub fn embedded(&self) -> bool {
        self.rpc_url.is_none()
    }

    pub fn path(node_dir: &Path) -> PathBuf {
        node_dir.join(CHAIN_FILE)
    }

    pub fn load(node_dir: &Path) -> Result<Self, DeploymentError> {
        let path = Self::path(node_dir);
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(DeploymentError::Missing(node_dir.to_path_buf()));
            }
            Err(source) => return Err(DeploymentError::Io { path, source }),
        };
        let d: Self = serde_json::from_str(&text)
            .map_err(|e| DeploymentError::Invalid { path: path.clone(), reason: e.to_string() })?;
        if d.v != 1 {
            return Err(DeploymentError::Invalid { path, reason: format!("unknown version {}", d.v) });
        }
        Ok(d)
    }

    /// Writes the record durably (temporary file, fsync, rename, fsync of the directory).
    pub fn save(&self, node_dir: &Path, replace: bool) -> Result<(), DeploymentError> {
        let path = Self::path(node_dir);
        if path.exists() && !replace {
            return Err(DeploymentError::Exists(path));
        }
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |source| DeploymentError::Io { path, source }
        };
        let staged = node_dir.join(format!("{CHAIN_FILE}.new"));
        let _ = std::fs::remove_file(&staged);
        let mut bytes = serde_json::to_vec_pretty(self).expect("a deployment serialises");
        bytes.push(b'\n');
        fsutil::write_new_durably(&staged, &bytes, 0o600).map_err(io(&staged))?;
        std::fs::rename(&staged, &path).map_err(io(&path))?;
        fsutil::sync_dir(node_dir).map_err(io(node_dir))
    }
}

/// The embedded anvil's state file for a node.
pub fn anvil_state_path(node_dir: &Path) -> PathBuf {
    node_dir.join(CHAIN_DIR).join(ANVIL_STATE_FILE)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Deployment {
        Deployment {
            v: 1,
            network: "anvil".into(),
            chain_id: 31337,
            rpc_url: None,
            registry: Address::repeat_byte(1),
            deploy_tx: mindxtrain_chain::B256::repeat_byte(2),
            deploy_block: 1,
            deployer: Address::repeat_byte(3),
            deployed_at: "2026-11-21T00:00:00Z".into(),
            test_usdc: None,
        }
    }

    #[test]
    fn saves_loads_and_refuses_to_overwrite_without_replace() {
        let dir = tempfile::tempdir().unwrap();
        assert!(matches!(Deployment::load(dir.path()), Err(DeploymentError::Missing(_))));
        let d = sample();
        d.save(dir.path(), false).unwrap();
        assert_eq!(Deployment::load(dir.path()).unwrap(), d);
        assert!(matches!(d.save(dir.path(), false), Err(DeploymentError::Exists(_))));
        let d2 = Deployment { chain_id: 8453, network: "base".into(), ..d };
        d2.save(dir.path(), true).unwrap();
        assert_eq!(Deployment::load(dir.path()).unwrap(), d2);
        assert!(!dir.path().join("chain.json.new").exists());
        std::fs::write(Deployment::path(dir.path()), "{").unwrap();
        assert!(matches!(Deployment::load(dir.path()), Err(DeploymentError::Invalid { .. })));
    }
}
