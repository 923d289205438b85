//! Which chain to talk to: named presets, or a custom RPC URL.

use crate::error::ChainError;
use serde::{Deserialize, Serialize};

/// A chain preset.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Preset {
    pub name: &'static str,
    pub chain_id: u64,
    /// Public RPC endpoint; `None` for anvil, which the node starts itself.
    pub default_rpc: Option<&'static str>,
    /// Whether the chain is a throwaway development chain (anvil), where the
    /// well-known development key may pay for anchors.
    pub development: bool,
    /// Block explorer whose `/tx/<hash>` page shows a transaction; `None` for anvil.
    pub explorer: Option<&'static str>,
}

pub const ANVIL: Preset =
    Preset { name: "anvil", chain_id: 31337, default_rpc: None, development: true, explorer: None };
pub const BASE: Preset = Preset {
    name: "base",
    chain_id: 8453,
    default_rpc: Some("https://mainnet.base.org"),
    development: false,
    explorer: Some("https://basescan.org"),
};
pub const BASE_SEPOLIA: Preset = Preset {
    name: "base-sepolia",
    chain_id: 84532,
    default_rpc: Some("https://sepolia.base.org"),
    development: false,
    explorer: Some("https://sepolia.basescan.org"),
};

/// The explorer page of transaction `tx` on `chain_id`, where the chain has a known explorer.
pub fn tx_link(chain_id: u64, tx: &str) -> Option<String> {
    preset_for_chain(chain_id).and_then(|p| p.explorer).map(|e| format!("{e}/tx/{tx}"))
}

/// Every preset, in the order `--help` lists them.
pub const PRESETS: [Preset; 3] = [ANVIL, BASE, BASE_SEPOLIA];

/// The preset called `name` (case-insensitive; `base_sepolia` is accepted too).
pub fn preset(name: &str) -> Result<Preset, ChainError> {
    let wanted = name.trim().to_ascii_lowercase().replace('_', "-");
    PRESETS.iter().copied().find(|p| p.name == wanted).ok_or_else(|| {
        let names: Vec<&str> = PRESETS.iter().map(|p| p.name).collect();
        ChainError::Other(format!("unknown network {name:?}; known networks: {}", names.join(", ")))
    })
}

/// The preset for a chain id, if there is one.
pub fn preset_for_chain(chain_id: u64) -> Option<Preset> {
    PRESETS.iter().copied().find(|p| p.chain_id == chain_id)
}

/// Parses and checks an RPC URL (http or https only).
pub fn parse_rpc_url(url: &str) -> Result<alloy::transports::http::reqwest::Url, ChainError> {
    let bad = |reason: &str| ChainError::BadUrl { url: url.to_string(), reason: reason.to_string() };
    let parsed: alloy::transports::http::reqwest::Url = url.parse().map_err(|e| bad(&format!("{e}")))?;
    match parsed.scheme() {
        "http" | "https" => Ok(parsed),
        other => Err(bad(&format!("scheme {other:?} is not supported (use http or https)"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presets_resolve_by_name_and_chain_id() {
        assert_eq!(preset("base").unwrap().chain_id, 8453);
        assert_eq!(preset("Base_Sepolia").unwrap().chain_id, 84532);
        assert_eq!(preset("anvil").unwrap().chain_id, 31337);
        assert!(preset("mainnet").unwrap_err().to_string().contains("base-sepolia"));
        assert_eq!(preset_for_chain(84532).unwrap().name, "base-sepolia");
        assert!(preset_for_chain(1).is_none());
        assert_eq!(tx_link(84532, "0xab").as_deref(), Some("https://sepolia.basescan.org/tx/0xab"));
        assert_eq!(tx_link(8453, "0xab").as_deref(), Some("https://basescan.org/tx/0xab"));
        assert_eq!(tx_link(31337, "0xab"), None);
    }

    #[test]
    fn rpc_urls_must_be_http() {
        assert!(parse_rpc_url("http://127.0.0.1:8545").is_ok());
        assert!(parse_rpc_url("https://sepolia.base.org").is_ok());
        assert!(matches!(parse_rpc_url("ws://x"), Err(ChainError::BadUrl { .. })));
        assert!(matches!(parse_rpc_url("not a url"), Err(ChainError::BadUrl { .. })));
    }
}
