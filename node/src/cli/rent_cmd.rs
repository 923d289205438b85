//! `mindxtrain rent`: buying a rental of a model from another node, paid over x402 with our own
//! client, and recorded in this node's log when it is one.

use super::output::Output;
use anyhow::{Context, Result, bail};
use clap::Args;
use mindxtrain_node::log::AppendRequest;
use mindxtrain_node::node;
use mindxtrain_node::serve::client::PayingClient;
use mindxtrain_trainer::recipe::Usdc;
use mindxtrain_x402::SettlerKey;
use serde_json::json;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

#[derive(Args, Debug)]
pub struct RentArgs {
    /// The selling node's base URL (`http://127.0.0.1:8080`).
    #[arg(long)]
    pub from: String,
    /// The model to rent (as its /v1/models lists it).
    #[arg(long)]
    pub model: String,
    /// Number of calls to buy.
    #[arg(long, conflicts_with = "seconds", required_unless_present = "seconds")]
    pub calls: Option<u64>,
    /// Seconds of use to buy (when the seller rents by time).
    #[arg(long)]
    pub seconds: Option<u64>,
    /// File with the payer's hex private key (mode 0600).
    #[arg(long)]
    pub key: PathBuf,
    /// Refuse to pay more than this (USDC, e.g. "0.05").
    #[arg(long, default_value = "1")]
    pub max_price: Usdc,
    /// Write the rental token to this file (mode 0600) instead of printing it.
    #[arg(long)]
    pub token_out: Option<PathBuf>,
}

pub fn rent(args: RentArgs, node_dir: &Path, out: &Output) -> Result<ExitCode> {
    let key = SettlerKey::from_file(&args.key)?;
    let client = PayingClient::new(key.signer().clone(), args.max_price.atomic())?;
    let url = format!("{}/v1/rentals", args.from.trim_end_matches('/'));
    let body = match (args.calls, args.seconds) {
        (Some(n), _) => json!({"model": args.model, "calls": n}),
        (None, s) => json!({"model": args.model, "seconds": s}),
    };
    let rt = tokio::runtime::Runtime::new()?;
    let paid = rt.block_on(client.post_json(&url, &body))?;
    if paid.status != 200 {
        bail!("{url} answered {}: {}", paid.status, paid.body);
    }
    let token = paid.body["token"].as_str().context("the rental answer has no token")?.to_string();
    let tx = paid.settlement.as_ref().map(|s| s.transaction.clone());
    let record = json!({
        "from": args.from,
        "id": paid.body["id"],
        "model": paid.body["model"],
        "calls": paid.body["calls"],
        "expires": paid.body["expires"],
        "payer": client.address().to_checksum(None),
        "amount": paid.amount.to_string(),
        "tx": tx,
        "token_blake3": blake3::hash(token.as_bytes()).to_hex().to_string(),
    });
    let recorded = record_acquisition(node_dir, &paid.body, &record)?;
    if let Some(path) = &args.token_out {
        mindxtrain_node::fsutil::write_new_durably(path, token.as_bytes(), 0o600)
            .with_context(|| format!("writing the token to {}", path.display()))?;
    }
    let shown_token = if args.token_out.is_some() { serde_json::Value::Null } else { json!(token) };
    let mut shown = record.clone();
    shown["token"] = shown_token;
    shown["recorded"] = json!(recorded);
    out.emit(&shown, || {
        format!(
            "rented {} from {}: {} for {} USDC (tx {})\nrental {}\n{}",
            args.model,
            args.from,
            args.calls.map_or_else(|| format!("{} s", args.seconds.unwrap_or(0)), |n| format!("{n} calls")),
            Usdc(paid.amount),
            tx.as_deref().unwrap_or("-"),
            paid.body["id"].as_str().unwrap_or("-"),
            args.token_out.as_ref().map_or(format!("token: {token}"), |p| format!("token written to {}", p.display()))
        )
    });
    Ok(ExitCode::SUCCESS)
}

/// Writes `rental.acquired` to the renter's own log when `node_dir` is a node. A node that
/// is serving holds its log: the rental still stands, and the warning says it went
/// unrecorded.
fn record_acquisition(node_dir: &Path, rental: &serde_json::Value, record: &serde_json::Value) -> Result<bool> {
    if !node_dir.join(mindxtrain_node::identity::SECRET_FILE).exists() {
        return Ok(false);
    }
    match node::open(node_dir) {
        Ok((log, _, _)) => {
            let subject = rental["id"].as_str().unwrap_or("-");
            log.append(AppendRequest::new("rental.acquired", subject, record.clone()))?;
            Ok(true)
        }
        Err(node::NodeError::Log(mindxtrain_node::log::OpenError::Locked(dir))) => {
            eprintln!("warning: {} is in use by a running node; the rental was not recorded in its log", dir.display());
            Ok(false)
        }
        Err(e) => Err(e.into()),
    }
}
