//! x402 paid HTTP for mindxtrain: wire types (v2, v1 compatible), the EIP-3009 `exact`
//! scheme, the facilitator and the axum layer. The protocol lands with paid inference;
//! the crate exists now so the workspace's dependency order is fixed from day one.
