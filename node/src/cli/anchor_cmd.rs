//! `mindxtrain anchor [verify]` and `mindxtrain anchors`.

use super::chain_cmd::{ChainArgs, fail, runtime};
use super::output::Output;
use super::{EXIT_INVALID_INPUT, EXIT_VERIFY_FAILED};
use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand};
use mindxtrain_chain::batch::{BatchProof, parse_hash};
use mindxtrain_chain::merkle::Hash;
use mindxtrain_chain::{AnchorKey, Anchorer, AnchorerConfig, ChainError};
use mindxtrain_node::anchor::{self, Access, AnchorError, ChainSession, Deployment, session};
use mindxtrain_node::log::{EventLog, LogReader};
use mindxtrain_node::node;
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

#[derive(Args, Debug)]
#[command(args_conflicts_with_subcommands = true)]
pub struct AnchorArgs {
    #[command(subcommand)]
    cmd: Option<AnchorCommand>,
    #[command(flatten)]
    chain: ChainArgs,
    /// Put every pending item under one Merkle root, anchored in one transaction
    /// (default: one transaction per item).
    #[arg(long)]
    batch: bool,
    /// Blocks that must include or follow the anchoring transaction.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=1000))]
    confirmations: u64,
    /// Also anchor this digest (64 hex digits), e.g. a manifest's. Repeatable.
    #[arg(long = "digest", value_name = "HEX")]
    digests: Vec<String>,
    /// Label recorded with --digest items.
    #[arg(long, default_value = "digest")]
    label: String,
    /// Do not record a fresh log checkpoint first; anchor only what is already pending.
    #[arg(long)]
    no_checkpoint: bool,
}

#[derive(Subcommand, Debug)]
enum AnchorCommand {
    /// Prove that a digest is anchored: its batch proof (from the log, or --proof FILE),
    /// checked offline, then against the registry on chain.
    #[command(after_help = "Exit code 0 when the proof verifies (and the chain holds the root), 3 when it does \
not or the digest was never anchored, 4 for a malformed digest or proof.\n\nExamples:\n  mindxtrain anchor verify \
3f9a…(64 hex) --json\n  mindxtrain anchor verify --proof proof.json --rpc-url https://sepolia.base.org")]
    Verify {
        /// The digest (64 hex digits).
        digest: Option<String>,
        /// A batch proof JSON file (as printed by `anchor verify --json` under "proof").
        #[arg(long, conflicts_with = "digest")]
        proof: Option<PathBuf>,
        /// Check the proof's arithmetic only; do not contact the chain.
        #[arg(long)]
        offline: bool,
        #[command(flatten)]
        chain: ChainArgs,
    },
}

fn parse_digest(text: &str) -> Option<Hash> {
    parse_hash(text)
}

pub fn run(args: AnchorArgs, dir: &Path, out: &Output) -> Result<ExitCode> {
    if let Some(AnchorCommand::Verify { digest, proof, offline, chain }) = args.cmd {
        return verify(dir, digest, proof, offline, &chain, out);
    }
    let mut digests = Vec::new();
    for d in &args.digests {
        match parse_digest(d) {
            Some(h) => digests.push(h),
            None => {
                eprintln!("error: --digest {d:?} is not 64 hex digits");
                return Ok(ExitCode::from(EXIT_INVALID_INPUT));
            }
        }
    }
    if let Err(e) = Deployment::load(dir) {
        return fail(e.into());
    }
    let (log, id, _) = node::open(dir)?;
    for d in &digests {
        anchor::request(&log, d, &args.label)?;
    }
    if !args.no_checkpoint {
        anchor::checkpoint_log(&log, &id)?;
    }
    let session = match ChainSession::open(dir, &args.chain.options(), Access::Write) {
        Ok(s) => s,
        Err(e) => return fail(e),
    };
    let result = anchor_with(&log, &session, args.confirmations, args.batch);
    let endpoint = session.endpoint_for_display();
    drop(session);
    let outcomes = match result {
        Ok(o) => o,
        Err(e) => return fail(e),
    };
    let d = Deployment::load(dir)?;
    out.emit(
        &json!({"chain_id": d.chain_id, "registry": d.registry, "endpoint": endpoint, "batches": outcomes}),
        || {
            if outcomes.is_empty() {
                return "nothing to anchor: every item is already anchored".into();
            }
            let mut s = format!("anchored on chain {} registry {:#x} ({endpoint})", d.chain_id, d.registry);
            for o in &outcomes {
                s.push_str(&format!(
                    "\n  root {}  {} item(s)  tx {}  block {}{}",
                    &o.root[..16],
                    o.items.len(),
                    o.tx,
                    o.block,
                    if o.already_anchored { "  (was already anchored)" } else { "" }
                ));
                for i in &o.items {
                    s.push_str(&format!("\n    {} {}", hex::encode(i.digest), i.label));
                }
            }
            s
        },
    );
    Ok(ExitCode::SUCCESS)
}

fn anchor_with(
    log: &EventLog,
    session: &ChainSession,
    confirmations: u64,
    batch: bool,
) -> Result<Vec<anchor::BatchOutcome>, AnchorError> {
    if session.key.is_none() {
        return Err(ChainError::ReadOnly.into());
    }
    let anchorer = session.anchorer(confirmations)?;
    runtime().map_err(|e| AnchorError::Other(e.to_string()))?.block_on(anchor::anchor_pending(log, &anchorer, batch))
}

fn verify(
    dir: &Path,
    digest: Option<String>,
    proof_file: Option<PathBuf>,
    offline: bool,
    chain: &ChainArgs,
    out: &Output,
) -> Result<ExitCode> {
    let proof = match (digest, proof_file) {
        (_, Some(file)) => {
            let text = std::fs::read_to_string(&file).with_context(|| format!("reading {}", file.display()))?;
            match BatchProof::from_json(&text) {
                Ok(p) => p,
                Err(e) => {
                    eprintln!("error: {}: {e}", file.display());
                    return Ok(ExitCode::from(EXIT_INVALID_INPUT));
                }
            }
        }
        (Some(d), None) => {
            let Some(h) = parse_digest(&d) else {
                eprintln!("error: {d:?} is not 64 hex digits");
                return Ok(ExitCode::from(EXIT_INVALID_INPUT));
            };
            let state = anchor::state_of_reader(&LogReader::open(dir)?)?;
            match state.proof_of(&h) {
                Some((p, _)) => p,
                None => {
                    let pending = state.items.iter().any(|i| i.digest == h);
                    let why = if pending { "pending: requested but not anchored yet" } else { "unknown to this node" };
                    out.emit(&json!({"digest": d, "anchored": false, "reason": why}), || {
                        format!("{d}: not anchored ({why})")
                    });
                    return Ok(ExitCode::from(EXIT_VERIFY_FAILED));
                }
            }
        }
        (None, None) => bail!("give a DIGEST or --proof FILE"),
    };
    if let Err(e) = proof.verify() {
        out.emit(&json!({"anchored": false, "proof": proof.to_json(), "problem": e.to_string()}), || {
            format!("FAILED: {e}")
        });
        return Ok(ExitCode::from(EXIT_VERIFY_FAILED));
    }
    let mut chain_check = Value::Null;
    if !offline {
        let record = match lookup_root(dir, chain, &proof) {
            Ok(r) => r,
            Err(e) => return fail(e),
        };
        if let Err(e) = proof.verify_against(record.as_ref()) {
            out.emit(&json!({"anchored": false, "proof": proof.to_json(), "problem": e.to_string()}), || {
                format!("FAILED: {e}")
            });
            return Ok(ExitCode::from(EXIT_VERIFY_FAILED));
        }
        chain_check = json!(record);
    }
    out.emit(&json!({"anchored": true, "offline": offline, "proof": proof.to_json(), "record": chain_check}), || {
        format!(
            "OK: digest {} is leaf {} of {} under root {}\n    anchored on chain {} registry {:#x} in block {} (tx {:#x}, time {}){}",
            hex::encode(proof.digest),
            proof.leaf_index,
            proof.tree_size,
            hex::encode(proof.root),
            proof.chain_id,
            proof.registry,
            proof.block,
            proof.tx,
            proof.timestamp,
            if offline { "\n    (offline: the chain was not asked)" } else { "\n    the registry holds this root with the same block and time" }
        )
    });
    Ok(ExitCode::SUCCESS)
}

/// Reads the registry's record of the proof's root: through the node's deployment when the
/// proof is for it, else through --rpc-url.
fn lookup_root(
    dir: &Path,
    chain: &ChainArgs,
    proof: &BatchProof,
) -> Result<Option<mindxtrain_chain::AnchorRecord>, AnchorError> {
    let ours = Deployment::load(dir).ok().filter(|d| d.chain_id == proof.chain_id && d.registry == proof.registry);
    let (url, _anvil) = match (&chain.rpc_url, ours) {
        (Some(url), _) => (url.clone(), None),
        (None, Some(_)) => {
            let s = ChainSession::open(dir, &chain.options(), Access::Read)?;
            let url = s.rpc_url.clone();
            (url, Some(s))
        }
        (None, None) => {
            return Err(AnchorError::Other(
                "the proof is for a registry this node did not deploy: pass --rpc-url of its chain".into(),
            ));
        }
    };
    let anchorer = Anchorer::new(AnchorerConfig::new(url, proof.chain_id, proof.registry))?;
    runtime()
        .map_err(|e| AnchorError::Other(e.to_string()))?
        .block_on(anchorer.lookup(proof.root_b256()))
        .map_err(Into::into)
}

pub fn list(dir: &Path, out: &Output) -> Result<ExitCode> {
    let state = anchor::state_of_reader(&LogReader::open(dir)?)?;
    let deployment = Deployment::load(dir).ok();
    let pending =
        deployment.as_ref().map(|d| state.pending(d.chain_id, d.registry)).unwrap_or_else(|| state.items.clone());
    out.emit(
        &json!({
            "deployment": deployment,
            "anchors": state.confirmed,
            "pending": pending,
            "failed": state.failed.iter().map(|(seq, root, err)| json!({"seq": seq, "root": root, "error": err})).collect::<Vec<_>>(),
        }),
        || {
            let mut s = String::new();
            if state.confirmed.is_empty() {
                s.push_str("no anchors yet");
            }
            for c in &state.confirmed {
                s.push_str(&format!(
                    "seq {:>5}  root {}  {:>3} item(s)  chain {}  block {:>8}  tx {:#x}\n",
                    c.seq,
                    &hex::encode(c.root)[..16],
                    c.items.len(),
                    c.chain_id,
                    c.block,
                    c.tx
                ));
            }
            if !pending.is_empty() {
                s.push_str(&format!("\n{} pending item(s):", pending.len()));
                for i in &pending {
                    s.push_str(&format!("\n  seq {:>5}  {}  {}", i.seq, hex::encode(i.digest), i.label));
                }
            }
            for (seq, root, err) in &state.failed {
                s.push_str(&format!("\nfailed at seq {seq}: root {}: {err}", root.get(..16).unwrap_or(root)));
            }
            s.trim_end().to_string()
        },
    );
    Ok(ExitCode::SUCCESS)
}

/// The demo's chain step: deploy the registry on an embedded anvil kept in the node dir,
/// anchor every pending item (the run's log checkpoint) in one batch, and prove the
/// checkpoint against the registry. Returns the summary for the demo's output.
pub fn demo_step(dir: &Path, log: &EventLog) -> Result<Value> {
    let mut anvil = session::start_embedded(dir, Access::Write)?;
    let rt = runtime()?;
    let key = AnchorKey::development();
    let target = session::Target { network: "anvil".into(), chain_id: Some(31337), rpc_url: None };
    let result = rt.block_on(async {
        let d = anchor::run::deploy(log, dir, &target, &anvil.endpoint(), &key, false).await?;
        let anchorer =
            Anchorer::new(AnchorerConfig::new(anvil.endpoint(), d.chain_id, d.registry).with_key(key.clone()))?;
        let outcomes = anchor::anchor_pending(log, &anchorer, true).await?;
        let state = anchor::state_of_log(log)?;
        let checkpoint = state.items.iter().rev().find(|i| i.label == "log.checkpoint").map(|i| i.digest);
        let checkpoint = checkpoint.ok_or_else(|| AnchorError::Other("the demo recorded no checkpoint".into()))?;
        let (proof, _) =
            state.proof_of(&checkpoint).ok_or_else(|| AnchorError::Other("checkpoint not anchored".into()))?;
        let record = anchorer.lookup(proof.root_b256()).await?;
        proof.verify_against(record.as_ref()).map_err(|e| AnchorError::Other(e.to_string()))?;
        Ok::<_, AnchorError>((d, outcomes, proof))
    });
    anvil.stop();
    let (d, outcomes, proof) = result?;
    let batch = outcomes.first().context("nothing was anchored")?;
    Ok(json!({
        "chain_id": d.chain_id,
        "registry": d.registry,
        "deploy_tx": d.deploy_tx,
        "tx": batch.tx,
        "block": batch.block,
        "root": batch.root,
        "items": batch.items.len(),
        "gas_used": batch.gas_used,
        "checkpoint_digest": hex::encode(proof.digest),
        "proof_verified_on_chain": true,
    }))
}
