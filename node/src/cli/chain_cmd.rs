//! `mindxtrain chain deploy|status`.

use super::output::Output;
use super::{EXIT_CHAIN_UNREACHABLE, EXIT_INVALID_INPUT};
use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use mindxtrain_chain::ChainError;
use mindxtrain_chain::network::{self, PRESETS};
use mindxtrain_node::anchor::session::{self, display_url, resolve_key, resolve_target};
use mindxtrain_node::anchor::{self, Access, AnchorError, ChainOptions, ChainSession, Deployment};
use mindxtrain_node::node;
use serde_json::json;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// Where the chain is and who pays (shared by `chain` and `anchor`).
#[derive(Args, Debug, Clone)]
pub struct ChainArgs {
    /// JSON-RPC endpoint (http/https). Default: the network preset's, or the node's
    /// embedded anvil (started and stopped by the command).
    #[arg(long)]
    pub rpc_url: Option<String>,
    /// Network preset: anvil (31337), base (8453), base-sepolia (84532).
    #[arg(long)]
    pub network: Option<String>,
    /// Anchoring key file (mode 0600, 64 hex digits). Else $MINDXTRAIN_ANCHOR_KEY, else
    /// <node-dir>/anchor.key, else (anvil only) anvil's development account.
    #[arg(long)]
    pub key_file: Option<PathBuf>,
    /// Attempts per chain operation when the endpoint is unreachable (backoff doubles
    /// from 0.25 s up to 8 s between them).
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub retries: u32,
}

impl ChainArgs {
    pub fn options(&self) -> ChainOptions {
        ChainOptions {
            rpc_url: self.rpc_url.clone(),
            network: self.network.clone(),
            key_file: self.key_file.clone(),
            retries: Some(self.retries),
        }
    }
}

#[derive(Subcommand, Debug)]
pub enum ChainCommand {
    /// Deploy the Registry contract and record it in <node-dir>/chain.json.
    #[command(after_help = "With neither --rpc-url nor --network, deploys to the node's embedded anvil, whose \
chain is kept in <node-dir>/chain/anvil-state.json between commands.\n\nExamples:\n  mindxtrain chain deploy\n  \
mindxtrain chain deploy --network base-sepolia --key-file ./anchor.key\n  mindxtrain chain deploy --rpc-url http://127.0.0.1:8545 --json")]
    Deploy {
        #[command(flatten)]
        chain: ChainArgs,
        /// Replace an existing chain.json (anchors then start over on the new registry).
        #[arg(long)]
        force: bool,
    },
    /// Show the deployment and check it live: chain id, registry code, head block, balance.
    #[command(after_help = "Example:\n  mindxtrain chain status --json")]
    Status {
        #[command(flatten)]
        chain: ChainArgs,
    },
}

pub fn run(cmd: ChainCommand, dir: &Path, out: &Output) -> Result<ExitCode> {
    match cmd {
        ChainCommand::Deploy { chain, force } => deploy(dir, &chain, force, out),
        ChainCommand::Status { chain } => status(dir, &chain, out),
    }
}

/// Maps anchoring errors to the documented exit codes, printing the message.
pub fn fail(e: AnchorError) -> Result<ExitCode> {
    let code = match &e {
        AnchorError::Chain(ChainError::Transport { .. }) => EXIT_CHAIN_UNREACHABLE,
        AnchorError::Chain(ChainError::BadUrl { .. }) | AnchorError::Key(_) => EXIT_INVALID_INPUT,
        AnchorError::Chain(ChainError::Other(m)) if m.starts_with("unknown network") => EXIT_INVALID_INPUT,
        _ => super::EXIT_FAILURE,
    };
    eprintln!("error: {e}");
    Ok(ExitCode::from(code))
}

pub fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread().enable_all().build().context("starting the async runtime")
}

fn deploy(dir: &Path, chain: &ChainArgs, force: bool, out: &Output) -> Result<ExitCode> {
    let opts = chain.options();
    let target = match resolve_target(&opts) {
        Ok(t) => t,
        Err(e) => return fail(e),
    };
    if Deployment::path(dir).exists() && !force {
        return fail(anchor::deployment::DeploymentError::Exists(Deployment::path(dir)).into());
    }
    let (log, _, _) = node::open(dir)?;
    let anvil = match &target.rpc_url {
        Some(_) => None,
        None => {
            if force {
                // A new embedded chain: drop the old state with the old registry.
                let _ = std::fs::remove_file(anchor::deployment::anvil_state_path(dir));
            }
            match session::start_embedded(dir, Access::Write) {
                Ok(a) => Some(a),
                Err(e) => return fail(e),
            }
        }
    };
    let rpc_url = anvil.as_ref().map(|a| a.endpoint()).or_else(|| target.rpc_url.clone()).unwrap_or_default();
    let rt = runtime()?;
    let result = rt.block_on(async {
        // Ask the endpoint first, so that a wrong --network is reported before any key question.
        let provider = mindxtrain_chain::rpc::provider(&rpc_url, None)?;
        let chain_id = mindxtrain_chain::rpc::chain_id(&provider, &Default::default()).await?;
        if let Some(expected) = target.chain_id
            && expected != chain_id
        {
            return Err(ChainError::WrongChainId { expected, actual: chain_id }.into());
        }
        let key = resolve_key(dir, opts.key_file.as_deref(), chain_id)?.ok_or(ChainError::ReadOnly)?;
        let mut target = target.clone();
        if target.chain_id.is_none() {
            target.chain_id = Some(chain_id);
            if let Some(p) = network::preset_for_chain(chain_id) {
                target.network = p.name.into();
            }
        }
        anchor::run::deploy(&log, dir, &target, &rpc_url, &key, force).await
    });
    drop(anvil);
    let d = match result {
        Ok(d) => d,
        Err(e) => return fail(e),
    };
    let endpoint = display_url(d.rpc_url.as_deref().unwrap_or("embedded"), d.embedded());
    out.emit(&json!({"deployment": d, "chain_file": Deployment::path(dir)}), || {
        format!(
            "deployed Registry on {} (chain {})\n  registry  {:#x}\n  tx        {:#x}\n  block     {}\n  deployer  {:#x}\n  endpoint  {}\n  recorded  {}",
            d.network,
            d.chain_id,
            d.registry,
            d.deploy_tx,
            d.deploy_block,
            d.deployer,
            if d.embedded() { "embedded anvil (state in <node-dir>/chain/)".to_string() } else { endpoint },
            Deployment::path(dir).display()
        )
    });
    Ok(ExitCode::SUCCESS)
}

fn status(dir: &Path, chain: &ChainArgs, out: &Output) -> Result<ExitCode> {
    let session = match ChainSession::open(dir, &chain.options(), Access::Read) {
        Ok(s) => s,
        Err(e) => return fail(e),
    };
    let d = session.deployment.clone();
    let key = resolve_key(dir, chain.key_file.as_deref(), d.chain_id).ok().flatten();
    let reader = mindxtrain_node::log::LogReader::open(dir)?;
    let state = anchor::state_of_reader(&reader)?;
    let pending = state.pending(d.chain_id, d.registry).len();
    let anchors = state.confirmed.iter().filter(|c| c.chain_id == d.chain_id && c.registry == d.registry).count();
    let rt = runtime()?;
    let live = rt.block_on(async {
        let anchorer = session.anchorer(1)?;
        anchorer.preflight().await?;
        let head = anchorer.head_block().await?;
        let balance = match &key {
            Some(k) => Some(anchorer.balance(k.address()).await?),
            None => None,
        };
        Ok::<_, AnchorError>((head, balance))
    });
    let endpoint = session.endpoint_for_display();
    drop(session);
    let (ok, head, balance, problem) = match live {
        Ok((h, b)) => (true, Some(h), b, None),
        Err(e) => (false, None, None, Some(e.to_string())),
    };
    let presets: Vec<_> = PRESETS.iter().map(|p| json!({"name": p.name, "chain_id": p.chain_id})).collect();
    out.emit(
        &json!({
            "deployment": d,
            "endpoint": endpoint,
            "ok": ok,
            "head_block": head,
            "account": key.as_ref().map(|k| k.address()),
            "balance_wei": balance.map(|b| b.to_string()),
            "anchors": anchors,
            "pending_items": pending,
            "problem": problem,
            "presets": presets,
        }),
        || {
            let mut s = format!(
                "network   {} (chain {})\nregistry  {:#x} (deployed in block {}, tx {:#x})\nendpoint  {}\n",
                d.network, d.chain_id, d.registry, d.deploy_block, d.deploy_tx, endpoint
            );
            match (&problem, head) {
                (None, Some(h)) => {
                    s.push_str(&format!("live      OK: chain id matches, registry has code, head block {h}\n"))
                }
                (Some(p), _) => s.push_str(&format!("live      FAILED: {p}\n")),
                _ => {}
            }
            if let (Some(k), Some(b)) = (&key, balance) {
                s.push_str(&format!("account   {:#x} ({}), balance {b} wei\n", k.address(), k.origin()));
            }
            s.push_str(&format!("anchors   {anchors} confirmed, {pending} item(s) pending"));
            s
        },
    );
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        match &problem {
            Some(p) if p.starts_with("transport error") => ExitCode::from(EXIT_CHAIN_UNREACHABLE),
            _ => ExitCode::from(super::EXIT_FAILURE),
        }
    })
}
