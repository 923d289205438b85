//! `mindxtrain chain deploy|status|up`.

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
        /// Also deploy TestUSDC (an EIP-3009 token with open mint, for local and test chains),
        /// which `serve` then sells for on that chain; with a registry already deployed, only
        /// the token is deployed.
        #[arg(long)]
        test_usdc: bool,
    },
    /// Keep the node's embedded anvil running, with an RPC URL other programs can use, until Ctrl-C.
    #[command(
        after_help = "While it runs, every command of this node that uses the embedded chain (chain deploy, anchor, receipt verify, demo) uses this anvil; its state is saved to <node-dir>/chain/anvil-state.json every 2 s and at exit.\n\nExamples:\n  mindxtrain chain up\n  mindxtrain chain up --detach && mindxtrain chain deploy --test-usdc\n  mindxtrain chain up --port 0 --json"
    )]
    Up {
        /// Port on 127.0.0.1 (0: a free one; the URL is printed).
        #[arg(long, default_value_t = 8545)]
        port: u16,
        /// Run in the background: return once the chain answers (its output goes to
        /// <node-dir>/chain/anvil.log); `mindxtrain chain down` stops it.
        #[arg(long)]
        detach: bool,
    },
    /// Stop the embedded chain `chain up` keeps running (its state is saved).
    #[command(after_help = "Example:\n  mindxtrain chain down")]
    Down,
    /// Show the deployment and check it live: chain id, registry code, head block, balance.
    #[command(after_help = "Example:\n  mindxtrain chain status --json")]
    Status {
        #[command(flatten)]
        chain: ChainArgs,
    },
}

pub fn run(cmd: ChainCommand, dir: &Path, out: &Output) -> Result<ExitCode> {
    match cmd {
        ChainCommand::Deploy { chain, force, test_usdc } => deploy(dir, &chain, force, test_usdc, out),
        ChainCommand::Status { chain } => status(dir, &chain, out),
        ChainCommand::Up { port, detach: false } => up(dir, port, out),
        ChainCommand::Up { port, detach: true } => up_detached(dir, port, out),
        ChainCommand::Down => down(dir, out),
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

fn deploy(dir: &Path, chain: &ChainArgs, force: bool, test_usdc: bool, out: &Output) -> Result<ExitCode> {
    let opts = chain.options();
    let target = match resolve_target(&opts) {
        Ok(t) => t,
        Err(e) => return fail(e),
    };
    if Deployment::path(dir).exists() && !force {
        if test_usdc {
            return deploy_token_only(dir, chain, out);
        }
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
        let d = anchor::run::deploy(&log, dir, &target, &rpc_url, &key, force).await?;
        if !test_usdc {
            return Ok(d);
        }
        refuse_token_on_mainnet(d.chain_id)?;
        anchor::run::deploy_test_usdc(&log, dir, &rpc_url, target.rpc_url.is_none(), &key).await
    });
    drop(anvil);
    let d = match result {
        Ok(d) => d,
        Err(e) => return fail(e),
    };
    let endpoint = display_url(d.rpc_url.as_deref().unwrap_or("embedded"), d.embedded());
    out.emit(&json!({"deployment": d, "chain_file": Deployment::path(dir)}), || {
        let mut text = format!(
            "deployed Registry on {} (chain {})\n  registry  {:#x}\n  tx        {:#x}\n  block     {}\n  deployer  {:#x}\n  endpoint  {}\n  recorded  {}",
            d.network,
            d.chain_id,
            d.registry,
            d.deploy_tx,
            d.deploy_block,
            d.deployer,
            if d.embedded() { embedded_endpoint(dir) } else { endpoint },
            Deployment::path(dir).display()
        );
        if let Some(token) = d.test_usdc {
            text.push_str(&format!("\n  TestUSDC  {token:#x} (serve sells for it on this chain)"));
        }
        text
    });
    Ok(ExitCode::SUCCESS)
}

/// How the embedded chain is reached: `chain up`'s URL while it runs.
fn embedded_endpoint(dir: &Path) -> String {
    match session::SharedChain::running(dir) {
        Some(s) => format!("embedded anvil at {} (kept running by `mindxtrain chain up`)", s.url),
        None => "embedded anvil (state in <node-dir>/chain/; `mindxtrain chain up` serves it at an RPC URL)".into(),
    }
}

fn refuse_token_on_mainnet(chain_id: u64) -> Result<(), AnchorError> {
    if chain_id == 8453 {
        return Err(ChainError::Other("Base has USDC: --test-usdc is for local and test chains".into()).into());
    }
    Ok(())
}

/// `chain deploy --test-usdc` beside a registry already deployed: the token only.
fn deploy_token_only(dir: &Path, chain: &ChainArgs, out: &Output) -> Result<ExitCode> {
    let session = match ChainSession::open(dir, &chain.options(), Access::Write) {
        Ok(s) => s,
        Err(e) => return fail(e),
    };
    let (log, _, _) = node::open(dir)?;
    let rt = runtime()?;
    let result = rt.block_on(async {
        refuse_token_on_mainnet(session.deployment.chain_id)?;
        let key = session.key.clone().ok_or(ChainError::ReadOnly)?;
        anchor::run::deploy_test_usdc(&log, dir, &session.rpc_url, session.anvil.is_some(), &key).await
    });
    drop(session);
    let d = match result {
        Ok(d) => d,
        Err(e) => return fail(e),
    };
    let token = d.test_usdc.unwrap_or_default();
    out.emit(&json!({"deployment": d, "chain_file": Deployment::path(dir), "test_usdc": token}), || {
        format!(
            "deployed TestUSDC on {} (chain {}) beside registry {:#x}\n  TestUSDC  {token:#x}\n  recorded  {}",
            d.network,
            d.chain_id,
            d.registry,
            Deployment::path(dir).display()
        )
    });
    Ok(ExitCode::SUCCESS)
}

/// `chain up` may start: a node directory, and no chain of it running yet.
fn refuse_second_chain(dir: &Path) -> Result<Option<ExitCode>> {
    if !dir.join(mindxtrain_node::identity::SECRET_FILE).exists() {
        anyhow::bail!(
            "{} is not a node directory; run `mindxtrain init --node-dir {}` first",
            dir.display(),
            dir.display()
        );
    }
    if let Some(s) = session::SharedChain::running(dir) {
        eprintln!(
            "error: the embedded chain already runs at {} (process {}): `mindxtrain chain down` stops it",
            s.url, s.pid
        );
        return Ok(Some(ExitCode::from(super::EXIT_FAILURE)));
    }
    Ok(None)
}

/// `chain up --detach`: the same command in a process of its own session, then back once
/// its endpoint is published (or with its log when it failed).
fn up_detached(dir: &Path, port: u16, out: &Output) -> Result<ExitCode> {
    if let Some(code) = refuse_second_chain(dir)? {
        return Ok(code);
    }
    let log_path = anchor::deployment::anvil_state_path(dir).with_file_name("anvil.log");
    std::fs::create_dir_all(mindxtrain_node::fsutil::parent_dir(&log_path))?;
    let log = std::fs::OpenOptions::new().create(true).append(true).open(&log_path)?;
    let mut cmd = std::process::Command::new(std::env::current_exe()?);
    cmd.arg("--node-dir").arg(dir).args(["--json", "chain", "up", "--port", &port.to_string()]);
    cmd.stdin(std::process::Stdio::null()).stdout(log.try_clone()?).stderr(log);
    // SAFETY: setsid(2) is async-signal-safe; the child leaves the terminal's process group,
    // so a Ctrl-C meant for the shell does not stop the chain.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut cmd, || {
            if libc::setsid() < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn().context("starting `mindxtrain chain up` in the background")?;
    let until = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let shared = loop {
        if let Some(s) = session::SharedChain::running(dir).filter(|s| s.pid == child.id()) {
            break s;
        }
        if let Some(status) = child.try_wait()? {
            let tail = std::fs::read_to_string(&log_path).unwrap_or_default();
            anyhow::bail!("`chain up` exited ({status}) before the chain answered:\n{}", tail.trim_end());
        }
        if std::time::Instant::now() > until {
            let _ = child.kill();
            anyhow::bail!("`chain up` did not answer within 60 s (its log: {})", log_path.display());
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    out.emit(&json!({"rpc_url": shared.url, "chain_id": shared.chain_id, "pid": shared.pid, "log": log_path}), || {
        format!(
            "embedded anvil (chain {}) at {}, in the background (process {}, log {}); `mindxtrain chain down` stops it",
            shared.chain_id,
            shared.url,
            shared.pid,
            log_path.display()
        )
    });
    Ok(ExitCode::SUCCESS)
}

/// `chain down`: SIGTERM to the running `chain up`, then waits until it has saved the
/// chain's state and gone.
fn down(dir: &Path, out: &Output) -> Result<ExitCode> {
    let Some(shared) = session::SharedChain::running(dir) else {
        out.emit(&json!({"stopped": false, "running": false}), || "the embedded chain is not running".into());
        return Ok(ExitCode::SUCCESS);
    };
    // SAFETY: a signal to the process `chain up` recorded as its own.
    unsafe { libc::kill(shared.pid as libc::pid_t, libc::SIGTERM) };
    let until = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while session::SharedChain::running(dir).is_some() {
        if std::time::Instant::now() > until {
            anyhow::bail!("`chain up` (process {}) did not stop within 60 s", shared.pid);
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    out.emit(&json!({"stopped": true, "rpc_url": shared.url, "pid": shared.pid}), || {
        format!("stopped the embedded anvil at {} (process {}); its state is saved", shared.url, shared.pid)
    });
    Ok(ExitCode::SUCCESS)
}

/// `chain up`: the embedded anvil on a fixed port until SIGINT/SIGTERM; while it runs its
/// endpoint file lets every other command of the node use it.
fn up(dir: &Path, port: u16, out: &Output) -> Result<ExitCode> {
    if let Some(code) = refuse_second_chain(dir)? {
        return Ok(code);
    }

    let anvil = match session::start_anvil(dir, Access::Write, Some(port).filter(|&p| p != 0), true) {
        Ok(a) => a,
        Err(e) => return fail(e),
    };
    let shared = session::SharedChain { url: anvil.endpoint(), chain_id: anvil.chain_id(), pid: std::process::id() };
    let file = session::SharedChain::path(dir);
    let bytes = serde_json::to_vec_pretty(&shared)?;
    let _ = std::fs::remove_file(&file);
    mindxtrain_node::fsutil::write_new_durably(&file, &bytes, 0o644)
        .with_context(|| format!("writing {}", file.display()))?;
    let deployed = Deployment::load(dir).ok();
    let _ = out.line(&json!({"rpc_url": shared.url, "chain_id": shared.chain_id, "deployment": deployed}), || {
        let next = match &deployed {
            Some(d) => format!("registry {:#x} deployed on it", d.registry),
            None => "nothing deployed yet: `mindxtrain chain deploy --test-usdc`".into(),
        };
        format!(
            "embedded anvil (chain {}) at {}; {next}\nthe node's commands use it while it runs; Ctrl-C stops it (its state is saved)",
            shared.chain_id, shared.url
        )
    });
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let signal = rt.block_on(async {
        use tokio::signal::unix::{SignalKind, signal};
        let mut term = signal(SignalKind::terminate())?;
        let mut int = signal(SignalKind::interrupt())?;
        anyhow::Ok(tokio::select! {
            _ = term.recv() => "SIGTERM",
            _ = int.recv() => "SIGINT",
        })
    });
    // The state is saved before the endpoint goes: `chain down` waits for the endpoint.
    let mut anvil = anvil;
    anvil.stop();
    let _ = std::fs::remove_file(&file);
    let signal = signal?;
    let _ = out.line(&json!({"stopped": signal}), || format!("{signal}: anvil stopped, state saved"));
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
