//! EIP-712 `TransferWithAuthorization` (EIP-3009): the typed authorization, its signing
//! hash under the asset's domain, signing (for clients and tests) and recovery.

use alloy::primitives::{Address, B256, Bytes, U256, uint};
use alloy::signers::SignerSync;
use alloy::signers::local::PrivateKeySigner;
use alloy::sol_types::{Eip712Domain, SolStruct};

use crate::network::Asset;
use crate::reason::RejectReason;
use crate::wire::{Authorization, ExactEvmPayload};

alloy::sol! {
    /// The EIP-3009 message, field for field as FiatToken hashes it.
    #[derive(Debug, PartialEq, Eq)]
    struct TransferWithAuthorization {
        address from;
        address to;
        uint256 value;
        uint256 validAfter;
        uint256 validBefore;
        bytes32 nonce;
    }
}

/// secp256k1 n / 2: FiatToken (and TestUSDC) refuse signatures with a larger `s` (EIP-2).
const HALF_N: U256 = uint!(0x7FFFFFFFFFFFFFFFFFFFFFFFFFFFFFFF5D576E7357A4501DDFE92F46681B20A0_U256);

/// An authorization with its fields parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedAuthorization {
    pub message: TransferWithAuthorization,
    pub signature: Bytes,
}

impl ParsedAuthorization {
    /// Parses the wire payload; any ill-formed field is `MalformedAuthorization`.
    pub fn parse(p: &ExactEvmPayload) -> Result<Self, RejectReason> {
        let a = &p.authorization;
        let bad = |_| RejectReason::MalformedAuthorization;
        let message = TransferWithAuthorization {
            from: a.from.parse::<Address>().map_err(|_| RejectReason::MalformedAuthorization)?,
            to: a.to.parse::<Address>().map_err(|_| RejectReason::MalformedAuthorization)?,
            value: decimal(&a.value)?,
            validAfter: decimal(&a.valid_after)?,
            validBefore: decimal(&a.valid_before)?,
            nonce: strict_hex_32(&a.nonce).ok_or(RejectReason::MalformedAuthorization)?,
        };
        let sig = p.signature.strip_prefix("0x").ok_or(RejectReason::MalformedAuthorization)?;
        let signature = alloy::hex::decode(sig).map_err(bad)?;
        if signature.is_empty() {
            return Err(RejectReason::MalformedAuthorization);
        }
        Ok(Self { message, signature: signature.into() })
    }

    /// The EIP-712 digest the payer signed, under `asset`'s domain.
    pub fn digest(&self, asset: &Asset) -> B256 {
        self.message.eip712_signing_hash(&domain(asset))
    }

    /// The signer of a 65-byte `r‖s‖v` signature, with the token's own rules (v 27/28,
    /// low s); `None` when the signature is not such an ECDSA signature.
    pub fn ecdsa_signer(&self, digest: &B256) -> Option<Address> {
        let raw: &[u8; 65] = self.signature.as_ref().try_into().ok()?;
        if !matches!(raw[64], 27 | 28) {
            return None;
        }
        if U256::from_be_slice(&raw[32..64]) > HALF_N {
            return None;
        }
        crate::recover::signer(digest, raw).filter(|a| !a.is_zero())
    }
}

/// The asset's EIP-712 domain: `{name, version, chainId, verifyingContract}`.
pub fn domain(asset: &Asset) -> Eip712Domain {
    Eip712Domain::new(
        Some(asset.name.clone().into()),
        Some(asset.version.clone().into()),
        Some(U256::from(asset.network.chain_id)),
        Some(asset.address),
        None,
    )
}

/// A canonical unsigned decimal (no sign, no leading zeros except "0", ≤ 78 digits).
fn decimal(s: &str) -> Result<U256, RejectReason> {
    let canonical =
        !s.is_empty() && s.len() <= 78 && s.bytes().all(|b| b.is_ascii_digit()) && (s == "0" || !s.starts_with('0'));
    if !canonical {
        return Err(RejectReason::MalformedAuthorization);
    }
    U256::from_str_radix(s, 10).map_err(|_| RejectReason::MalformedAuthorization)
}

fn strict_hex_32(s: &str) -> Option<B256> {
    let h = s.strip_prefix("0x")?;
    if h.len() != 64 {
        return None;
    }
    let bytes = alloy::hex::decode(h).ok()?;
    Some(B256::from_slice(&bytes))
}

/// Signs an authorization for `asset` (what an x402 client does): a helper for our own
/// client side and the tests.
pub fn sign_authorization(
    signer: &PrivateKeySigner,
    asset: &Asset,
    message: &TransferWithAuthorization,
) -> Result<ExactEvmPayload, alloy::signers::Error> {
    let hash = message.eip712_signing_hash(&domain(asset));
    let sig = signer.sign_hash_sync(&hash)?;
    Ok(ExactEvmPayload {
        signature: format!("0x{}", alloy::hex::encode(sig.as_bytes())),
        authorization: Authorization {
            from: message.from.to_checksum(None),
            to: message.to.to_checksum(None),
            value: message.value.to_string(),
            valid_after: message.validAfter.to_string(),
            valid_before: message.validBefore.to_string(),
            nonce: message.nonce.to_string(),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::network::BASE;
    use alloy::primitives::address;

    fn message(from: Address) -> TransferWithAuthorization {
        TransferWithAuthorization {
            from,
            to: address!("1111111111111111111111111111111111111111"),
            value: U256::from(1000),
            validAfter: U256::ZERO,
            validBefore: U256::from(u64::MAX),
            nonce: B256::repeat_byte(7),
        }
    }

    #[test]
    fn type_hash_is_circles() {
        // keccak256("TransferWithAuthorization(address from,...)") as published by Circle.
        let expected: B256 = "0x7c7c6cdb67a18743f49ec6fa9b35f50d52ed05cbed4cc592e13b44501c1a2267".parse().unwrap();
        assert_eq!(message(Address::ZERO).eip712_type_hash(), expected);
    }

    #[test]
    fn sign_then_recover_and_every_tampered_field_fails() {
        let signer = PrivateKeySigner::random();
        let asset = Asset::usdc_base();
        let payload = sign_authorization(&signer, &asset, &message(signer.address())).unwrap();
        let parsed = ParsedAuthorization::parse(&payload).unwrap();
        assert_eq!(parsed.ecdsa_signer(&parsed.digest(&asset)), Some(signer.address()));

        let mut other = asset.clone();
        other.network = crate::network::Network::new(1);
        assert_ne!(parsed.ecdsa_signer(&parsed.digest(&other)), Some(signer.address()), "chain id is bound");
        let mut other = asset.clone();
        other.name = "USDC".into();
        assert_ne!(parsed.ecdsa_signer(&parsed.digest(&other)), Some(signer.address()), "domain name is bound");
        let mut tampered = payload.clone();
        tampered.authorization.value = "1001".into();
        let t = ParsedAuthorization::parse(&tampered).unwrap();
        assert_ne!(t.ecdsa_signer(&t.digest(&asset)), Some(signer.address()));
        let _ = BASE;
    }

    #[test]
    fn high_s_and_bad_v_are_refused_like_the_token_does() {
        let signer = PrivateKeySigner::random();
        let asset = Asset::usdc_base();
        let payload = sign_authorization(&signer, &asset, &message(signer.address())).unwrap();
        let parsed = ParsedAuthorization::parse(&payload).unwrap();
        let digest = parsed.digest(&asset);
        let mut raw = parsed.signature.to_vec();
        raw[64] -= 27;
        let v01 = ParsedAuthorization { signature: raw.clone().into(), ..parsed.clone() };
        assert_eq!(v01.ecdsa_signer(&digest), None);
        // The malleated twin (n - s, flipped v) recovers the same key but is high-s.
        let n = uint!(0xFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFEBAAEDCE6AF48A03BBFD25E8CD0364141_U256);
        let s = U256::from_be_slice(&parsed.signature[32..64]);
        let mut twin = parsed.signature.to_vec();
        twin[32..64].copy_from_slice(&(n - s).to_be_bytes::<32>());
        twin[64] = if parsed.signature[64] == 27 { 28 } else { 27 };
        let twin = ParsedAuthorization { signature: twin.into(), ..parsed.clone() };
        assert_eq!(twin.ecdsa_signer(&digest), None);
        let short = ParsedAuthorization { signature: parsed.signature[..64].to_vec().into(), ..parsed };
        assert_eq!(short.ecdsa_signer(&digest), None);
    }

    #[test]
    fn malformed_fields_are_typed() {
        let signer = PrivateKeySigner::random();
        let good = sign_authorization(&signer, &Asset::usdc_base(), &message(signer.address())).unwrap();
        type Mutation = Box<dyn Fn(&mut ExactEvmPayload)>;
        let cases: Vec<Mutation> = vec![
            Box::new(|p| p.authorization.value = "-1".into()),
            Box::new(|p| p.authorization.value = "01".into()),
            Box::new(|p| p.authorization.value = "1e3".into()),
            Box::new(|p| p.authorization.valid_before = "9".repeat(79)),
            Box::new(|p| p.authorization.nonce = "0x12".into()),
            Box::new(|p| p.authorization.from = "0xnothex".into()),
            Box::new(|p| p.signature = "deadbeef".into()),
            Box::new(|p| p.signature = "0x".into()),
            Box::new(|p| p.signature = "0xzz".into()),
        ];
        for mutate in cases {
            let mut p = good.clone();
            mutate(&mut p);
            assert_eq!(ParsedAuthorization::parse(&p), Err(RejectReason::MalformedAuthorization), "{p:?}");
        }
    }
}
