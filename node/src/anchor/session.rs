//! Reaching the chain: the RPC endpoint (given, preset or the embedded anvil) and the key.

use super::AnchorError;
use super::deployment::{Deployment, anvil_state_path};
use mindxtrain_chain::anvil::{AnvilOptions, LocalAnvil, StateFile};
use mindxtrain_chain::key::{AnchorKey, KeyError};
use mindxtrain_chain::network::{self, ANVIL};
use mindxtrain_chain::{Anchorer, AnchorerConfig};
use std::path::{Path, PathBuf};

/// File name of the node's own anchoring key, if it has one (mode 0600).
pub const ANCHOR_KEY_FILE: &str = "anchor.key";

/// What the user said about the chain.
#[derive(Debug, Clone, Default)]
pub struct ChainOptions {
    pub rpc_url: Option<String>,
    pub network: Option<String>,
    pub key_file: Option<PathBuf>,
    /// Attempts per chain operation on transport errors (`None`: the default policy).
    pub retries: Option<u32>,
}

/// Whether the command changes the chain (the embedded anvil's state is saved on exit)
/// or only reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    Write,
    Read,
}

/// Where a deployment goes, before there is a chain.json.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub network: String,
    /// Known in advance for presets; asked from the endpoint otherwise.
    pub chain_id: Option<u64>,
    /// `None`: the embedded anvil.
    pub rpc_url: Option<String>,
}

/// `--rpc-url` and `--network` → a target. Neither → the embedded anvil.
pub fn resolve_target(opts: &ChainOptions) -> Result<Target, AnchorError> {
    let preset = opts.network.as_deref().map(network::preset).transpose()?;
    if let Some(url) = &opts.rpc_url {
        network::parse_rpc_url(url)?;
    }
    Ok(match (preset, &opts.rpc_url) {
        (Some(p), url) => Target {
            network: p.name.into(),
            chain_id: Some(p.chain_id),
            rpc_url: url.clone().or_else(|| p.default_rpc.map(str::to_string)),
        },
        (None, Some(url)) => Target { network: "custom".into(), chain_id: None, rpc_url: Some(url.clone()) },
        (None, None) => Target { network: ANVIL.name.into(), chain_id: Some(ANVIL.chain_id), rpc_url: None },
    })
}

/// The node's embedded chain for one command: an anvil of its own on the node's state
/// file, or the one `mindxtrain chain up` keeps running (then every command shares it, and
/// its state is that process's to save).
#[derive(Debug)]
pub enum EmbeddedChain {
    Own(LocalAnvil),
    Shared(SharedChain),
}

/// What `chain up` publishes in `<node-dir>/chain/anvil.endpoint.json` while it runs.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SharedChain {
    pub url: String,
    pub chain_id: u64,
    /// The `chain up` process; the file is stale once it is gone.
    pub pid: u32,
}

/// File name of the running embedded chain's endpoint (inside the node's chain directory).
pub const ENDPOINT_FILE: &str = "anvil.endpoint.json";

impl SharedChain {
    pub fn path(node_dir: &Path) -> PathBuf {
        anvil_state_path(node_dir).with_file_name(ENDPOINT_FILE)
    }

    /// The chain `chain up` keeps running for this node, if its process is alive.
    pub fn running(node_dir: &Path) -> Option<SharedChain> {
        let text = std::fs::read(Self::path(node_dir)).ok()?;
        let shared: SharedChain = serde_json::from_slice(&text).ok()?;
        // SAFETY: signal 0 only checks that the process exists.
        let alive = unsafe { libc::kill(shared.pid as libc::pid_t, 0) } == 0;
        alive.then_some(shared)
    }
}

impl EmbeddedChain {
    pub fn endpoint(&self) -> String {
        match self {
            EmbeddedChain::Own(a) => a.endpoint(),
            EmbeddedChain::Shared(s) => s.url.clone(),
        }
    }

    pub fn chain_id(&self) -> u64 {
        match self {
            EmbeddedChain::Own(a) => a.chain_id(),
            EmbeddedChain::Shared(s) => s.chain_id,
        }
    }

    /// Stops an anvil of the command's own (saving its state); a shared one keeps running.
    pub fn stop(&mut self) {
        if let EmbeddedChain::Own(a) = self {
            a.stop();
        }
    }
}

/// The node's embedded chain: the one `chain up` keeps running, else an anvil started on
/// the node's state file (saved when it stops, for [`Access::Write`]).
pub fn start_embedded(node_dir: &Path, access: Access) -> Result<EmbeddedChain, AnchorError> {
    if let Some(shared) = SharedChain::running(node_dir) {
        return Ok(EmbeddedChain::Shared(shared));
    }
    Ok(EmbeddedChain::Own(start_anvil(node_dir, access, None, false)?))
}

/// An anvil on the node's state file, on `port` (else a free one). One that keeps running
/// (`chain up`) saves its state every 2 s too, so a crash loses little.
pub fn start_anvil(
    node_dir: &Path,
    access: Access,
    port: Option<u16>,
    keeps_running: bool,
) -> Result<LocalAnvil, AnchorError> {
    let state = anvil_state_path(node_dir);
    if let Some(parent) = state.parent() {
        std::fs::create_dir_all(parent).map_err(|source| AnchorError::Io { path: parent.to_path_buf(), source })?;
    }
    let (state, state_interval) = match access {
        Access::Write => (StateFile::LoadAndDump(state), keeps_running.then_some(2)),
        Access::Read => (StateFile::LoadOnly(state), None),
    };
    Ok(LocalAnvil::start(AnvilOptions { state: Some(state), port, state_interval, ..Default::default() })?)
}

/// The key that pays: `--key-file`, else `$MINDXTRAIN_ANCHOR_KEY`, else the node's
/// `anchor.key`, else — on a development chain only — anvil's funded development account.
pub fn resolve_key(node_dir: &Path, key_file: Option<&Path>, chain_id: u64) -> Result<Option<AnchorKey>, KeyError> {
    if let Some(f) = key_file {
        return AnchorKey::from_file(f).map(Some);
    }
    if let Some(k) = AnchorKey::from_env()? {
        return Ok(Some(k));
    }
    let own = node_dir.join(ANCHOR_KEY_FILE);
    if own.exists() {
        return AnchorKey::from_file(&own).map(Some);
    }
    Ok((chain_id == ANVIL.chain_id).then(AnchorKey::development))
}

/// An open connection to the node's deployed registry.
pub struct ChainSession {
    pub deployment: Deployment,
    pub rpc_url: String,
    pub key: Option<AnchorKey>,
    /// The embedded chain (an anvil of the session's own is stopped, its state saved,
    /// when the session drops).
    pub anvil: Option<EmbeddedChain>,
    retries: Option<u32>,
}

impl ChainSession {
    /// Opens the chain of `chain.json` (`--rpc-url` overrides its endpoint). A key is
    /// resolved for [`Access::Write`]; reads need none.
    pub fn open(node_dir: &Path, opts: &ChainOptions, access: Access) -> Result<Self, AnchorError> {
        let deployment = Deployment::load(node_dir)?;
        if let Some(name) = &opts.network {
            let p = network::preset(name)?;
            if p.chain_id != deployment.chain_id {
                return Err(mindxtrain_chain::ChainError::WrongChainId {
                    expected: deployment.chain_id,
                    actual: p.chain_id,
                }
                .into());
            }
        }
        let (rpc_url, anvil) = match (&opts.rpc_url, &deployment.rpc_url) {
            (Some(url), _) | (None, Some(url)) => (url.clone(), None),
            (None, None) => {
                let a = start_embedded(node_dir, access)?;
                (a.endpoint(), Some(a))
            }
        };
        let key = match access {
            Access::Write => resolve_key(node_dir, opts.key_file.as_deref(), deployment.chain_id)?,
            Access::Read => None,
        };
        Ok(Self { deployment, rpc_url, key, anvil, retries: opts.retries })
    }

    /// An anchorer for the deployed registry.
    pub fn anchorer(&self, confirmations: u64) -> Result<Anchorer, AnchorError> {
        let mut cfg = AnchorerConfig::new(&self.rpc_url, self.deployment.chain_id, self.deployment.registry)
            .with_confirmations(confirmations);
        if let Some(n) = self.retries {
            cfg.retry.attempts = n.max(1);
        }
        cfg.key = self.key.clone();
        Ok(Anchorer::new(cfg)?)
    }

    /// The endpoint for messages: scheme, host and port only (URLs may embed API keys).
    pub fn endpoint_for_display(&self) -> String {
        display_url(&self.rpc_url, self.anvil.is_some())
    }
}

/// An RPC URL without path, query or credentials, for messages and events.
pub fn display_url(url: &str, embedded: bool) -> String {
    if embedded {
        return format!("embedded anvil ({url})");
    }
    match network::parse_rpc_url(url) {
        Ok(u) => format!(
            "{}://{}{}",
            u.scheme(),
            u.host_str().unwrap_or("?"),
            u.port().map(|p| format!(":{p}")).unwrap_or_default()
        ),
        Err(_) => "(invalid URL)".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_from_flags() {
        let t = resolve_target(&ChainOptions::default()).unwrap();
        assert_eq!((t.network.as_str(), t.chain_id, t.rpc_url), ("anvil", Some(31337), None));
        let t = resolve_target(&ChainOptions { network: Some("base-sepolia".into()), ..Default::default() }).unwrap();
        assert_eq!(t.chain_id, Some(84532));
        assert_eq!(t.rpc_url.as_deref(), Some("https://sepolia.base.org"));
        let t =
            resolve_target(&ChainOptions { rpc_url: Some("http://127.0.0.1:9".into()), ..Default::default() }).unwrap();
        assert_eq!((t.network.as_str(), t.chain_id), ("custom", None));
        assert!(resolve_target(&ChainOptions { network: Some("nope".into()), ..Default::default() }).is_err());
        assert!(resolve_target(&ChainOptions { rpc_url: Some("ftp://x".into()), ..Default::default() }).is_err());
    }

    #[test]
    fn urls_are_shown_without_secrets() {
        assert_eq!(display_url("https://user:pw@rpc.example/v2/SECRET?k=1", false), "https://rpc.example");
        assert_eq!(display_url("http://127.0.0.1:8545", false), "http://127.0.0.1:8545");
    }

    #[test]
    fn development_key_only_on_development_chains() {
        let dir = tempfile::tempdir().unwrap();
        // SAFETY of the assertion: the variable is not set by the test runner.
        if std::env::var_os(mindxtrain_chain::key::KEY_ENV).is_none() {
            assert!(resolve_key(dir.path(), None, 31337).unwrap().is_some());
            assert!(resolve_key(dir.path(), None, 8453).unwrap().is_none());
        }
    }
}
