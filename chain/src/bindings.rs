//! Typed contract bindings, generated from the committed forge artifacts
//! (`contracts/artifacts/<File>.sol/<Contract>.json`: ABI plus creation and runtime
//! bytecode), so `deploy` ships exactly the bytecode the forge tests exercised.

#![allow(clippy::too_many_arguments)]

alloy::sol!(
    /// The write-once root registry (contracts/src/Registry.sol).
    #[sol(rpc, all_derives)]
    Registry,
    "../contracts/artifacts/Registry.sol/Registry.json"
);

alloy::sol!(
    /// EIP-3009 test token for local chains (contracts/src/TestUSDC.sol).
    #[sol(rpc, all_derives)]
    TestUSDC,
    "../contracts/artifacts/TestUSDC.sol/TestUSDC.json"
);

alloy::sol!(
    /// The `payTo` of paid calls (contracts/src/X402Receiver.sol).
    #[sol(rpc, all_derives)]
    X402Receiver,
    "../contracts/artifacts/X402Receiver.sol/X402Receiver.json"
);

alloy::sol!(
    /// The seeds' struct-per-run design, deployed only by the gas benchmark
    /// (contracts/src/bench/StructRegistry.sol).
    #[sol(rpc, all_derives)]
    StructRegistry,
    "../contracts/artifacts/StructRegistry.sol/StructRegistry.json"
);
