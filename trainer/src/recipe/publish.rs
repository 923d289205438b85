//! The `publish` section and the value types of x402 billing: networks, assets, addresses
//! and exact USDC amounts.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer, de};

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Publish {
    #[serde(default)]
    pub enabled: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hf: Option<HfPublish>,
    #[serde(default)]
    pub billing: Billing,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HfPublish {
    pub repo: String,
    /// Private unless said otherwise: publishing is the one step that cannot be undone.
    #[serde(default = "super::schema::yes")]
    pub private: bool,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Billing {
    /// Unset: the served model is not sold.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub x402: Option<X402>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct X402 {
    pub network: Network,
    #[serde(default)]
    pub asset: Asset,
    /// Receiving address; unset means the node's own receiver.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pay_to: Option<Address>,
    pub pricing: Pricing,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rental: Option<Rental>,
}

/// Either `per_call`, or `per_1k_tokens` with `max_charge` (the most one call may cost,
/// which x402 needs up front because the token count is known only afterwards).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Pricing {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub per_call: Option<Usdc>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub per_1k_tokens: Option<Usdc>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_charge: Option<Usdc>,
}

/// Renting the served model exclusively for a period.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rental {
    pub per_hour: Usdc,
    #[serde(default = "Rental::default_min_minutes")]
    pub min_minutes: u32,
    #[serde(default = "Rental::default_max_hours")]
    pub max_hours: u32,
}

impl Rental {
    fn default_min_minutes() -> u32 {
        15
    }
    fn default_max_hours() -> u32 {
        24
    }
}

/// Reads a value from its string form, with the parse error as the message.
fn from_text<'de, D: Deserializer<'de>, T: FromStr<Err = String>>(d: D) -> Result<T, D::Error> {
    let s = String::deserialize(d)?;
    s.parse().map_err(de::Error::custom)
}

/// An amount of a 6-decimal stablecoin in atomic units (1 USDC = 1 000 000).
///
/// Written as a decimal string (`"0.001"`) so no float rounding ever touches a price; more
/// than six decimals is an error rather than a silent truncation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Usdc(pub u64);

impl Usdc {
    pub const DECIMALS: u32 = 6;

    pub fn atomic(self) -> u64 {
        self.0
    }
}

impl FromStr for Usdc {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || format!("expected a decimal amount like \"0.001\", found {s:?}");
        let (int, frac) = s.split_once('.').unwrap_or((s, ""));
        let digits = |t: &str| t.bytes().all(|b| b.is_ascii_digit());
        if int.is_empty() || !digits(int) || !digits(frac) || (s.contains('.') && frac.is_empty()) {
            return Err(bad());
        }
        if frac.len() > Self::DECIMALS as usize {
            return Err(format!("amount {s:?} has {} decimals; at most 6 are allowed", frac.len()));
        }
        let too_big = || format!("amount {s:?} is too large");
        let whole: u64 = int.parse().map_err(|_| too_big())?;
        let padded = format!("{frac:0<6}");
        let part: u64 = padded.parse().map_err(|_| bad())?;
        whole.checked_mul(1_000_000).and_then(|w| w.checked_add(part)).map(Usdc).ok_or_else(too_big)
    }
}

impl fmt::Display for Usdc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (whole, part) = (self.0 / 1_000_000, self.0 % 1_000_000);
        if part == 0 {
            return write!(f, "{whole}");
        }
        let frac = format!("{part:06}");
        write!(f, "{whole}.{}", frac.trim_end_matches('0'))
    }
}

impl Serialize for Usdc {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Usdc {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        from_text(d)
    }
}

/// An EVM chain, kept as its CAIP-2 id (`eip155:8453`). The names `base`, `base-sepolia`,
/// `anvil`, `ethereum` and `sepolia` are accepted as shorthands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Network {
    chain_id: u64,
}

const NAMED_NETWORKS: &[(&str, u64)] =
    &[("base", 8453), ("base-sepolia", 84532), ("anvil", 31337), ("ethereum", 1), ("sepolia", 11_155_111)];

impl Network {
    pub fn chain_id(self) -> u64 {
        self.chain_id
    }

    pub fn caip2(self) -> String {
        format!("eip155:{}", self.chain_id)
    }

    /// The shorthand name, when the chain has one.
    pub fn name(self) -> Option<&'static str> {
        NAMED_NETWORKS.iter().find(|(_, id)| *id == self.chain_id).map(|(n, _)| *n)
    }
}

impl FromStr for Network {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        if let Some((_, id)) = NAMED_NETWORKS.iter().find(|(n, _)| *n == s) {
            return Ok(Network { chain_id: *id });
        }
        let not_evm = || {
            format!(
                "`{s}` is not an EVM network: x402 here settles on EVM chains only; write a CAIP-2 \
                 id `eip155:<chain id>` or one of base, base-sepolia, anvil, ethereum, sepolia"
            )
        };
        let id = s.strip_prefix("eip155:").ok_or_else(not_evm)?;
        let canonical = !id.is_empty() && id.bytes().all(|b| b.is_ascii_digit()) && !id.starts_with('0');
        match id.parse::<u64>() {
            Ok(chain_id) if canonical => Ok(Network { chain_id }),
            _ => Err(format!("`{s}`: the chain id after `eip155:` must be a positive integer without leading zeros")),
        }
    }
}

impl fmt::Display for Network {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "eip155:{}", self.chain_id)
    }
}

impl Serialize for Network {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Network {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        from_text(d)
    }
}

/// A 20-byte EVM address, written `0x` + 40 hex digits. The EIP-55 checksum of mixed-case
/// input is not verified here (that needs Keccak); the node verifies before paying out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Address(pub [u8; 20]);

impl FromStr for Address {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || format!("expected an address `0x` + 40 hex digits, found {s:?}");
        let hex = s.strip_prefix("0x").ok_or_else(bad)?;
        if hex.len() != 40 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(bad());
        }
        let mut out = [0u8; 20];
        for (i, byte) in out.iter_mut().enumerate() {
            *byte = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).map_err(|_| bad())?;
        }
        if out == [0u8; 20] {
            return Err("the zero address cannot receive payments".into());
        }
        Ok(Address(out))
    }
}

impl fmt::Display for Address {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("0x")?;
        self.0.iter().try_for_each(|b| write!(f, "{b:02x}"))
    }
}

impl Serialize for Address {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Address {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        from_text(d)
    }
}

/// What a payment is made in: a known 6-decimal stablecoin by symbol, whose contract the node
/// looks up for the network, or a token contract given by address (taken as 6 decimals).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum Asset {
    #[default]
    Usdc,
    Eurc,
    Token(Address),
}

impl FromStr for Asset {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "USDC" => Ok(Asset::Usdc),
            "EURC" => Ok(Asset::Eurc),
            _ if s.starts_with("0x") => s.parse().map(Asset::Token),
            _ => Err(format!("unknown asset {s:?}; expected USDC, EURC or a token address `0x...`")),
        }
    }
}

impl fmt::Display for Asset {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Asset::Usdc => f.write_str("USDC"),
            Asset::Eurc => f.write_str("EURC"),
            Asset::Token(a) => write!(f, "{a}"),
        }
    }
}

impl Serialize for Asset {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Asset {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        from_text(d)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usdc_parses_exactly() {
        assert_eq!("0.001".parse::<Usdc>(), Ok(Usdc(1_000)));
        assert_eq!("0.0002".parse::<Usdc>(), Ok(Usdc(200)));
        assert_eq!("12".parse::<Usdc>(), Ok(Usdc(12_000_000)));
        assert_eq!("1.000001".parse::<Usdc>(), Ok(Usdc(1_000_001)));
        for bad in ["", ".5", "5.", "-1", "+1", "1e-3", " 1", "1,0", "0.0000001", "99999999999999999999"] {
            assert!(bad.parse::<Usdc>().is_err(), "{bad:?} accepted");
        }
        assert!("0.0000001".parse::<Usdc>().unwrap_err().contains("at most 6"));
    }

    #[test]
    fn usdc_display_round_trips() {
        for s in ["0.001", "0.0002", "12", "1.5", "0.000001"] {
            assert_eq!(s.parse::<Usdc>().map(|u| u.to_string()), Ok(s.to_owned()));
        }
    }

    #[test]
    fn networks_are_evm_only() {
        assert_eq!("base".parse::<Network>().map(Network::caip2), Ok("eip155:8453".into()));
        assert_eq!("base-sepolia".parse::<Network>().map(Network::chain_id), Ok(84532));
        assert_eq!("anvil".parse::<Network>().map(Network::chain_id), Ok(31337));
        assert_eq!("eip155:10".parse::<Network>().map(Network::chain_id), Ok(10));
        assert!("algorand".parse::<Network>().unwrap_err().contains("not an EVM network"));
        assert!("solana:mainnet".parse::<Network>().is_err());
        assert!("eip155:0".parse::<Network>().is_err());
        assert!("eip155:".parse::<Network>().is_err());
    }

    #[test]
    fn addresses_and_assets() {
        let a: Address = "0x00000000000000000000000000000000000000Aa".parse().unwrap();
        assert_eq!(a.to_string(), "0x00000000000000000000000000000000000000aa");
        assert!("0x0000000000000000000000000000000000000000".parse::<Address>().is_err());
        assert!("0x12".parse::<Address>().is_err());
        assert_eq!("USDC".parse::<Asset>(), Ok(Asset::Usdc));
        assert!("usdc".parse::<Asset>().is_err());
    }
}
