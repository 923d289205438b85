//! Why a payment was refused, with the wire codes of the reference implementation where
//! it has one (so its clients and facilitators understand ours) and our own otherwise.

use std::fmt;

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum RejectReason {
    /// The payment header exceeds [`crate::header::MAX_HEADER_LEN`].
    HeaderTooLarge,
    /// Not base64, not JSON, or not the payload shape.
    MalformedHeader,
    UnsupportedVersion,
    InvalidScheme,
    NetworkMismatch,
    AssetMismatch,
    /// `extra.name`/`extra.version` missing or not the asset's domain.
    Eip712DomainMismatch,
    RecipientMismatch,
    /// `exact` means exact: both a lower and a higher value are refused.
    AmountMismatch,
    /// `accepted` differs from every offer in a field not named above.
    RequirementsMismatch,
    /// An address, number, nonce or signature in the authorization is not well-formed.
    MalformedAuthorization,
    ValidBeforeExpired,
    ValidAfterInFuture,
    InvalidSignature,
    NonceAlreadyUsed,
    /// The same authorization is being processed by another request right now.
    NonceInFlight,
    InsufficientBalance,
    SimulationFailed,
    InvalidPaymentIdentifier,
    /// A payment-identifier seen before, presented by a different payer.
    PaymentIdentifierConflict,
    SettlementFailed,
    /// The settlement was sent but its outcome could not be read in time: the payment is
    /// pending and will be reconciled; a retry with the same header gets its answer once the
    /// transfer is found, or is refused once the authorization has expired unused.
    SettlementPending,
    /// The facilitator could not be reached or answered nonsense.
    FacilitatorUnavailable,
    /// A code from a remote facilitator that we do not model.
    Other(String),
}

const CODES: &[(RejectReason, &str)] = &[
    (RejectReason::HeaderTooLarge, "invalid_payload_too_large"),
    (RejectReason::MalformedHeader, "invalid_payload"),
    (RejectReason::UnsupportedVersion, "invalid_x402_version"),
    (RejectReason::InvalidScheme, "invalid_exact_evm_scheme"),
    (RejectReason::NetworkMismatch, "invalid_exact_evm_network_mismatch"),
    (RejectReason::AssetMismatch, "invalid_exact_evm_asset_mismatch"),
    (RejectReason::Eip712DomainMismatch, "invalid_exact_evm_missing_eip712_domain"),
    (RejectReason::RecipientMismatch, "invalid_exact_evm_recipient_mismatch"),
    (RejectReason::AmountMismatch, "invalid_exact_evm_payload_authorization_value_mismatch"),
    (RejectReason::RequirementsMismatch, "invalid_exact_evm_requirements_mismatch"),
    (RejectReason::MalformedAuthorization, "invalid_exact_evm_payload"),
    (RejectReason::ValidBeforeExpired, "invalid_exact_evm_payload_authorization_valid_before"),
    (RejectReason::ValidAfterInFuture, "invalid_exact_evm_payload_authorization_valid_after"),
    (RejectReason::InvalidSignature, "invalid_exact_evm_signature"),
    (RejectReason::NonceAlreadyUsed, "invalid_exact_evm_nonce_already_used"),
    (RejectReason::NonceInFlight, "invalid_exact_evm_nonce_in_flight"),
    (RejectReason::InsufficientBalance, "invalid_exact_evm_insufficient_balance"),
    (RejectReason::SimulationFailed, "invalid_exact_evm_transaction_simulation_failed"),
    (RejectReason::InvalidPaymentIdentifier, "invalid_payment_identifier"),
    (RejectReason::PaymentIdentifierConflict, "payment_identifier_conflict"),
    (RejectReason::SettlementFailed, "invalid_exact_evm_transaction_failed"),
    (RejectReason::SettlementPending, "settlement_pending"),
    (RejectReason::FacilitatorUnavailable, "facilitator_unavailable"),
];

impl RejectReason {
    /// The wire code (`invalidReason` / `errorReason`).
    pub fn code(&self) -> &str {
        match self {
            RejectReason::Other(code) => code,
            known => CODES.iter().find(|(r, _)| r == known).map(|(_, c)| *c).unwrap_or("unexpected_error"),
        }
    }

    pub fn from_code(code: &str) -> Self {
        CODES
            .iter()
            .find(|(_, c)| *c == code)
            .map(|(r, _)| r.clone())
            .unwrap_or_else(|| RejectReason::Other(code.into()))
    }
}

impl fmt::Display for RejectReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.code())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip_and_are_distinct() {
        let mut seen = std::collections::HashSet::new();
        for (r, c) in CODES {
            assert_eq!(RejectReason::from_code(c), *r);
            assert_eq!(r.code(), *c);
            assert!(seen.insert(*c), "{c} twice");
        }
        assert_eq!(RejectReason::from_code("something_new"), RejectReason::Other("something_new".into()));
    }
}
