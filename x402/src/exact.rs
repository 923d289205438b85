//! The `exact` scheme's checks that need no chain: matching a payment to an offer, and the
//! authorization's recipient, value, time window and ECDSA signature.

use alloy::primitives::{Address, B256, U256};

use crate::eip712::ParsedAuthorization;
use crate::network::{Asset, Network};
use crate::reason::RejectReason;
use crate::wire::{ExactEvmPayload, PaymentRequirements};

/// The scheme name.
pub const EXACT: &str = "exact";

/// `validBefore` must leave at least this many seconds to get the settlement mined.
pub const SETTLE_MARGIN_SECS: u64 = 6;

/// One way a route can be paid: an asset on a network, to an address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Offer {
    pub asset: Asset,
    pub pay_to: Address,
    /// How long a signed authorization may stay valid (the client's `validBefore` horizon).
    pub max_timeout_seconds: u64,
}

impl Offer {
    /// The v2 requirements for `amount` atomic units.
    pub fn requirements(&self, amount: u64) -> PaymentRequirements {
        PaymentRequirements {
            scheme: EXACT.into(),
            network: self.asset.network.caip2(),
            amount: amount.to_string(),
            asset: self.asset.address.to_checksum(None),
            pay_to: self.pay_to.to_checksum(None),
            max_timeout_seconds: self.max_timeout_seconds,
            extra: Some(serde_json::json!({ "name": self.asset.name, "version": self.asset.version })),
        }
    }
}

fn same_address(a: &str, b: &str) -> bool {
    match (a.parse::<Address>(), b.parse::<Address>()) {
        (Ok(x), Ok(y)) => x == y,
        _ => false,
    }
}

/// The offer a payment's `accepted` names, or the most specific reason none matches.
/// Fields are compared in order (scheme, network, asset, payTo, amount, domain, rest), each
/// narrowing the candidates, so the reason names the first field that is wrong.
pub fn match_offer<'a>(
    accepted: &PaymentRequirements,
    offered: &'a [PaymentRequirements],
) -> Result<&'a PaymentRequirements, RejectReason> {
    let mut c: Vec<&PaymentRequirements> = offered.iter().collect();
    let mut narrow = |keep: &dyn Fn(&PaymentRequirements) -> bool, reason: RejectReason| {
        c.retain(|r| keep(r));
        if c.is_empty() { Err(reason) } else { Ok(()) }
    };
    narrow(&|r| r.scheme == accepted.scheme, RejectReason::InvalidScheme)?;
    narrow(&|r| r.network == accepted.network, RejectReason::NetworkMismatch)?;
    narrow(&|r| same_address(&r.asset, &accepted.asset), RejectReason::AssetMismatch)?;
    narrow(&|r| same_address(&r.pay_to, &accepted.pay_to), RejectReason::RecipientMismatch)?;
    narrow(&|r| r.amount == accepted.amount, RejectReason::AmountMismatch)?;
    narrow(&|r| r.eip712_extra() == accepted.eip712_extra(), RejectReason::Eip712DomainMismatch)?;
    narrow(&|r| r.max_timeout_seconds == accepted.max_timeout_seconds, RejectReason::RequirementsMismatch)?;
    Ok(c[0])
}

/// The asset `req` names, with its EIP-712 domain from `extra`.
pub fn requirement_asset(req: &PaymentRequirements) -> Result<Asset, RejectReason> {
    let network: Network = req.network.parse().map_err(|_| RejectReason::NetworkMismatch)?;
    let address: Address = req.asset.parse().map_err(|_| RejectReason::AssetMismatch)?;
    let extra = req.eip712_extra().ok_or(RejectReason::Eip712DomainMismatch)?;
    Ok(Asset { network, address, name: extra.name, version: extra.version, decimals: 6 })
}

/// A payment that passed every check that needs no chain.
#[derive(Debug, Clone)]
pub struct CheckedPayment {
    pub asset: Asset,
    pub auth: ParsedAuthorization,
    pub digest: B256,
    /// `true` when a 65-byte ECDSA signature recovers `from`; otherwise `from` must be a
    /// contract wallet accepting the signature through ERC-1271 (checked on chain).
    pub ecdsa_ok: bool,
}

impl CheckedPayment {
    pub fn from(&self) -> Address {
        self.auth.message.from
    }
    pub fn nonce(&self) -> B256 {
        self.auth.message.nonce
    }
    pub fn value(&self) -> U256 {
        self.auth.message.value
    }
}

/// Recipient, exact value, time window (`validAfter ≤ now`, `validBefore ≥ now + 6 s`) and
/// the ECDSA signature, against the requirements the server chose.
pub fn check_offline(
    payload: &ExactEvmPayload,
    req: &PaymentRequirements,
    now_secs: u64,
) -> Result<CheckedPayment, RejectReason> {
    if req.scheme != EXACT {
        return Err(RejectReason::InvalidScheme);
    }
    let asset = requirement_asset(req)?;
    let auth = ParsedAuthorization::parse(payload)?;
    let m = &auth.message;
    let pay_to: Address = req.pay_to.parse().map_err(|_| RejectReason::RecipientMismatch)?;
    if m.to != pay_to {
        return Err(RejectReason::RecipientMismatch);
    }
    let amount = U256::from_str_radix(&req.amount, 10).map_err(|_| RejectReason::AmountMismatch)?;
    if m.value != amount {
        return Err(RejectReason::AmountMismatch);
    }
    if m.validBefore < U256::from(now_secs.saturating_add(SETTLE_MARGIN_SECS)) {
        return Err(RejectReason::ValidBeforeExpired);
    }
    if m.validAfter > U256::from(now_secs) {
        return Err(RejectReason::ValidAfterInFuture);
    }
    let digest = auth.digest(&asset);
    let ecdsa_ok = auth.ecdsa_signer(&digest) == Some(m.from);
    Ok(CheckedPayment { asset, auth, digest, ecdsa_ok })
}

/// Seconds since the Unix epoch.
pub fn now_secs() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::eip712::{TransferWithAuthorization, sign_authorization};
    use alloy::primitives::address;
    use alloy::signers::local::PrivateKeySigner;

    fn offer() -> Offer {
        Offer {
            asset: Asset::usdc_base_sepolia(),
            pay_to: address!("2222222222222222222222222222222222222222"),
            max_timeout_seconds: 60,
        }
    }

    fn signed(signer: &PrivateKeySigner, f: impl FnOnce(&mut TransferWithAuthorization)) -> ExactEvmPayload {
        let o = offer();
        let mut m = TransferWithAuthorization {
            from: signer.address(),
            to: o.pay_to,
            value: U256::from(500),
            validAfter: U256::ZERO,
            validBefore: U256::from(1_000_100),
            nonce: B256::repeat_byte(1),
        };
        f(&mut m);
        sign_authorization(signer, &o.asset, &m).unwrap()
    }

    #[test]
    fn matching_names_the_first_wrong_field() {
        let offered = vec![offer().requirements(500)];
        let ok = offered[0].clone();
        assert!(match_offer(&ok, &offered).is_ok());
        let mut lower_case = ok.clone();
        lower_case.asset = lower_case.asset.to_lowercase();
        assert!(match_offer(&lower_case, &offered).is_ok(), "addresses compare by value");
        type Case = (fn(&mut PaymentRequirements), RejectReason);
        let cases: Vec<Case> = vec![
            (|r| r.scheme = "upto".into(), RejectReason::InvalidScheme),
            (|r| r.network = "eip155:1".into(), RejectReason::NetworkMismatch),
            (|r| r.asset = "0x0000000000000000000000000000000000000009".into(), RejectReason::AssetMismatch),
            (|r| r.pay_to = "0x0000000000000000000000000000000000000009".into(), RejectReason::RecipientMismatch),
            (|r| r.amount = "499".into(), RejectReason::AmountMismatch),
            (|r| r.amount = "501".into(), RejectReason::AmountMismatch),
            (|r| r.extra = None, RejectReason::Eip712DomainMismatch),
            (|r| r.max_timeout_seconds = 61, RejectReason::RequirementsMismatch),
        ];
        for (mutate, reason) in cases {
            let mut r = ok.clone();
            mutate(&mut r);
            assert_eq!(match_offer(&r, &offered), Err(reason));
        }
    }

    #[test]
    fn offline_checks_each_refuse_with_their_reason() {
        let signer = PrivateKeySigner::random();
        let req = offer().requirements(500);
        let now = 1_000_000;
        let good = check_offline(&signed(&signer, |_| {}), &req, now).unwrap();
        assert!(good.ecdsa_ok);
        let refuse = |p: ExactEvmPayload| check_offline(&p, &req, now).map(|_| ()).unwrap_err();
        assert_eq!(refuse(signed(&signer, |m| m.to = Address::repeat_byte(9))), RejectReason::RecipientMismatch);
        assert_eq!(refuse(signed(&signer, |m| m.value = U256::from(499))), RejectReason::AmountMismatch);
        assert_eq!(refuse(signed(&signer, |m| m.value = U256::from(501))), RejectReason::AmountMismatch);
        assert_eq!(refuse(signed(&signer, |m| m.validBefore = U256::from(now + 5))), RejectReason::ValidBeforeExpired);
        assert_eq!(refuse(signed(&signer, |m| m.validAfter = U256::from(now + 1))), RejectReason::ValidAfterInFuture);
        assert!(check_offline(&signed(&signer, |m| m.validBefore = U256::from(now + 6)), &req, now).is_ok());
        let mut forged = signed(&signer, |_| {});
        forged.authorization.from = PrivateKeySigner::random().address().to_checksum(None);
        assert!(!check_offline(&forged, &req, now).unwrap().ecdsa_ok, "another from is not what was signed");
    }
}
