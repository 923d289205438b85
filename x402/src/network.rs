//! EVM networks as CAIP-2 ids, and the assets x402 is paid in on them.

use std::fmt;
use std::str::FromStr;

use alloy::primitives::{Address, address};

/// An EVM chain (`eip155:<chain id>`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Network {
    pub chain_id: u64,
}

pub const BASE: Network = Network { chain_id: 8453 };
pub const BASE_SEPOLIA: Network = Network { chain_id: 84532 };
pub const ANVIL: Network = Network { chain_id: 31337 };

/// v1 spoke network names; v2 speaks CAIP-2.
const V1_NAMES: &[(&str, u64)] = &[("base", 8453), ("base-sepolia", 84532), ("ethereum", 1), ("sepolia", 11_155_111)];

impl Network {
    pub const fn new(chain_id: u64) -> Self {
        Self { chain_id }
    }

    pub fn caip2(self) -> String {
        format!("eip155:{}", self.chain_id)
    }

    /// The v1 name (`base`, `base-sepolia`); chains without one (anvil) use CAIP-2 in v1 too.
    pub fn v1_name(self) -> String {
        V1_NAMES
            .iter()
            .find(|(_, id)| *id == self.chain_id)
            .map(|(n, _)| (*n).to_owned())
            .unwrap_or_else(|| self.caip2())
    }
}

impl FromStr for Network {
    type Err = String;

    /// Accepts CAIP-2 (`eip155:8453`) and the v1 names.
    fn from_str(s: &str) -> Result<Self, String> {
        if let Some((_, id)) = V1_NAMES.iter().find(|(n, _)| *n == s) {
            return Ok(Network { chain_id: *id });
        }
        let id = s.strip_prefix("eip155:").ok_or_else(|| format!("`{s}` is not an EVM network (eip155:<id>)"))?;
        let canonical = !id.is_empty() && id.bytes().all(|b| b.is_ascii_digit()) && !id.starts_with('0');
        match id.parse::<u64>() {
            Ok(chain_id) if canonical => Ok(Network { chain_id }),
            _ => Err(format!("`{s}`: the chain id must be a positive integer without leading zeros")),
        }
    }
}

impl fmt::Display for Network {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "eip155:{}", self.chain_id)
    }
}

/// An EIP-3009 token on one network, with the EIP-712 domain its signatures use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Asset {
    pub network: Network,
    pub address: Address,
    /// EIP-712 domain name (`extra.name`).
    pub name: String,
    /// EIP-712 domain version (`extra.version`).
    pub version: String,
    pub decimals: u8,
}

impl Asset {
    /// Circle's USDC on Base.
    pub fn usdc_base() -> Self {
        Self::usdc(BASE, address!("833589fCD6eDb6E08f4c7C32D4f71b54bdA02913"), "USD Coin")
    }

    /// Circle's USDC on Base Sepolia (its domain name is "USDC", not "USD Coin").
    pub fn usdc_base_sepolia() -> Self {
        Self::usdc(BASE_SEPOLIA, address!("036CbD53842c5426634e7929541eC2318f3dCF7e"), "USDC")
    }

    /// The project's TestUSDC deployed at `address` on a local chain (deployed with the
    /// domain of USDC on Base: "USD Coin", "2").
    pub fn test_usdc(network: Network, address: Address) -> Self {
        Self::usdc(network, address, "USD Coin")
    }

    fn usdc(network: Network, address: Address, name: &str) -> Self {
        Self { network, address, name: name.into(), version: "2".into(), decimals: 6 }
    }

    /// USDC's preset for a known network (Base, Base Sepolia); `None` elsewhere.
    pub fn usdc_preset(network: Network) -> Option<Self> {
        match network {
            BASE => Some(Self::usdc_base()),
            BASE_SEPOLIA => Some(Self::usdc_base_sepolia()),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_caip2_and_v1_names() {
        assert_eq!("eip155:8453".parse::<Network>(), Ok(BASE));
        assert_eq!("base-sepolia".parse::<Network>(), Ok(BASE_SEPOLIA));
        assert_eq!("eip155:31337".parse::<Network>(), Ok(ANVIL));
        for bad in ["eip155:", "eip155:0", "eip155:012", "solana:mainnet", "eip155:-1", "anvil2"] {
            assert!(bad.parse::<Network>().is_err(), "{bad}");
        }
        assert_eq!(BASE.v1_name(), "base");
        assert_eq!(ANVIL.v1_name(), "eip155:31337");
    }

    #[test]
    fn usdc_presets_carry_their_domains() {
        assert_eq!(Asset::usdc_preset(BASE).map(|a| a.name), Some("USD Coin".into()));
        assert_eq!(Asset::usdc_preset(BASE_SEPOLIA).map(|a| a.name), Some("USDC".into()));
        assert_eq!(Asset::usdc_preset(ANVIL), None);
    }
}
