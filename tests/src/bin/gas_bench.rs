//! `gas-bench`: gas per anchored manifest on a real anvil, ours (one Merkle root per
//! batch in `Registry`) beside the seeds' design (`StructRegistry`: one struct of five
//! bytes32 + publisher + timestamp per run), measured in the same run from receipts
//! (intrinsic and calldata gas included), with the ratio.
//!
//! ```text
//! gas-bench [--batches 1,8,64,512] [--json]
//! ```

use anyhow::{Context, Result, ensure};
use clap::Parser;
use mindxtrain_chain::alloy::network::ReceiptResponse;
use mindxtrain_chain::alloy::primitives::B256;
use mindxtrain_chain::anvil::{AnvilOptions, LocalAnvil};
use mindxtrain_chain::bindings::StructRegistry;
use mindxtrain_chain::deploy::deploy_registry;
use mindxtrain_chain::merkle::Hash;
use mindxtrain_chain::{AnchorKey, Anchorer, AnchorerConfig, Batch};
use serde_json::json;

#[derive(Parser)]
#[command(about = "Gas per anchored manifest: batch roots vs one struct per run, on anvil")]
struct Cli {
    /// Comma-separated batch sizes.
    #[arg(long, default_value = "1,8,64,512", value_delimiter = ',')]
    batches: Vec<u64>,
    #[arg(long)]
    json: bool,
}

fn manifest_digest(batch: u64, i: u64) -> Hash {
    *blake3::hash(format!("manifest {batch}/{i}").as_bytes()).as_bytes()
}

fn field(batch: u64, i: u64, name: &str) -> B256 {
    B256::from(*blake3::hash(format!("{name} {batch}/{i}").as_bytes()).as_bytes())
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<()> {
    let cli = Cli::parse();
    let anvil = LocalAnvil::start(AnvilOptions::default())?;
    let key = AnchorKey::development();
    let registry = deploy_registry(&anvil.endpoint(), &key, Some(31337)).await?;
    let anchorer = Anchorer::new(AnchorerConfig::new(anvil.endpoint(), 31337, registry.address).with_key(key.clone()))?;
    // The peer pays from anvil's second development account: each account's nonces stay
    // with one client.
    let peer_key: [u8; 32] = hex::decode("59c6995e998f97a5a0044966f0945389dc9e86dae88c7a8412f4603b6b78690d")?
        .try_into()
        .map_err(|_| anyhow::anyhow!("development key is 32 bytes"))?;
    let provider = mindxtrain_chain::rpc::provider(&anvil.endpoint(), Some(&AnchorKey::from_secret_bytes(&peer_key)?))?;
    let peer = StructRegistry::deploy(provider.clone()).await.context("deploying StructRegistry")?;

    let mut rows = Vec::new();
    for &n in &cli.batches {
        ensure!(n > 0, "batch sizes must be positive");
        let batch = Batch::new((0..n).map(|i| manifest_digest(n, i)))?;
        let anchored = anchorer.anchor(B256::from(batch.root())).await?;
        let ours_total = anchored.gas_used.context("the anchor sent no transaction")?;

        let mut peer_total = 0u64;
        for i in 0..n {
            let receipt = peer
                .storeRun(
                    field(n, i, "run"),
                    field(n, i, "yaml"),
                    field(n, i, "dataset"),
                    field(n, i, "checkpoint"),
                    field(n, i, "eval"),
                )
                .send()
                .await?
                .get_receipt()
                .await?;
            ensure!(receipt.status(), "storeRun reverted");
            peer_total += receipt.gas_used();
        }
        let ours = ours_total as f64 / n as f64;
        let theirs = peer_total as f64 / n as f64;
        rows.push(json!({
            "batch": n,
            "ours_gas_total": ours_total,
            "ours_gas_per_manifest": ours,
            "struct_gas_total": peer_total,
            "struct_gas_per_manifest": theirs,
            "ratio": theirs / ours,
        }));
    }
    if cli.json {
        println!("{}", serde_json::to_string_pretty(&json!({"anvil": "1.7.1", "rows": rows}))?);
        return Ok(());
    }
    println!("{:>6} {:>18} {:>24} {:>10}", "batch", "ours gas/manifest", "struct-per-run gas/man.", "ratio");
    for r in &rows {
        println!(
            "{:>6} {:>18.0} {:>24.0} {:>9.0}x",
            r["batch"].as_u64().unwrap_or_default(),
            r["ours_gas_per_manifest"].as_f64().unwrap_or_default(),
            r["struct_gas_per_manifest"].as_f64().unwrap_or_default(),
            r["ratio"].as_f64().unwrap_or_default()
        );
    }
    Ok(())
}
