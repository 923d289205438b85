//! `mindxtrain serve`: the trained model behind OpenAI-compatible routes, sold over x402, as
//! the recipe's `serve` section says, beside the operator API.

use super::output::Output;
use anyhow::{Context, Result, bail};
use clap::Args;
use mindxtrain_node::anchor::Deployment;
use mindxtrain_node::anchor::session::SharedChain;
use mindxtrain_node::api::host::AllowedHosts;
use mindxtrain_node::api::{self, ApiState, auth::ApiToken};
use mindxtrain_node::identity::Identity;
use mindxtrain_node::log::EventLog;
use mindxtrain_node::node;
use mindxtrain_node::serve::model::{ModelSource, ServedModel};
use mindxtrain_node::serve::rentals::RentalBook;
use mindxtrain_node::serve::{self, AppState, Sale};
use mindxtrain_trainer::recipe::{self as publish, Usdc};
use mindxtrain_trainer::recipe::{LoadedRecipe, Recipe};
use mindxtrain_x402::alloy::primitives::Address;
use mindxtrain_x402::{
    Asset, Evidence, Facilitator, HttpFacilitator, LocalFacilitator, LocalFacilitatorConfig, Network, Offer, SettleVia,
    SettlerKey,
};
use serde_json::json;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

#[derive(Args, Debug)]
#[command(
    after_help = "Examples:\n  mindxtrain serve                     the operator API only (token: node-dir/api.token)\n  mindxtrain serve run.yaml --checkpoint runs/lora/final --free\n  mindxtrain serve run.yaml --checkpoint runs/lora/final --rpc-url http://127.0.0.1:8545 --settler-key settler.key --asset 0x…"
)]
pub struct ServeArgs {
    /// The recipe the model was trained with (tokenizer, serve limits, publish.billing.x402).
    /// Without it only the operator API is served.
    pub recipe: Option<PathBuf>,
    /// The run's trained weights or adapter (`runs/NAME/final`); needed with a recipe.
    #[arg(long, requires = "recipe")]
    pub checkpoint: Option<PathBuf>,
    /// The base an adapter applies to. Default: the base recorded beside the adapter
    /// (base_model.json); another one is refused unless --force-base.
    #[arg(long)]
    pub base: Option<PathBuf>,
    /// Serve the adapter over --base even though it is not the base it was trained on.
    #[arg(long, requires = "base")]
    pub force_base: bool,
    /// Fold a LoRA adapter into the base weights before serving.
    #[arg(long)]
    pub merge: bool,
    /// The model id clients use (default: the recipe's model.name).
    #[arg(long)]
    pub name: Option<String>,
    /// Serve another PEFT adapter over the same base as model id NAME (repeatable): one engine
    /// batches requests for every adapter together.
    #[arg(long = "adapter", value_name = "NAME=DIR", value_parser = parse_adapter, requires = "checkpoint")]
    pub adapters: Vec<(String, PathBuf)>,
    /// Where to run the model: `cpu` or `cuda[:N]` (default: the recipe's hardware, so a model
    /// trained on a GPU is served on one).
    #[arg(long, value_parser = parse_device)]
    pub device: Option<DeviceArg>,
    /// Address to listen on; port 0 picks a free one (printed at start). Default: the recipe's
    /// serve.host and serve.port; without a recipe, 127.0.0.1:8080. This flag overrides both.
    #[arg(long)]
    pub listen: Option<SocketAddr>,
    /// Serve without charging, even if the recipe sets a price.
    #[arg(long)]
    pub free: bool,
    /// JSON-RPC endpoint of the recipe's network: the in-process facilitator verifies and settles
    /// there; with --facilitator, the node reads it to check each settlement's transfer and to
    /// reconcile settlements a restart interrupted.
    #[arg(long, env = "MINDXTRAIN_RPC_URL")]
    pub rpc_url: Option<String>,
    /// File with the hex private key (mode 0600) that pays settlement gas.
    #[arg(long)]
    pub settler_key: Option<PathBuf>,
    /// Use this HTTP facilitator (/verify, /settle, /supported) instead of settling in-process
    /// (with --rpc-url, read-only).
    #[arg(long, conflicts_with = "settler_key")]
    pub facilitator: Option<String>,
    /// The token contract (required on a local chain, where TestUSDC is deployed per chain).
    #[arg(long)]
    pub asset: Option<Address>,
    /// Who is paid (default: the recipe's pay_to, else the settler key's address).
    #[arg(long)]
    pub pay_to: Option<Address>,
    /// Pay this X402Receiver contract and record every settlement in it, in the same
    /// transaction (`settleTransferAndRecord`); the settler key must be its settler.
    #[arg(long, conflicts_with_all = ["pay_to", "facilitator"])]
    pub receiver: Option<Address>,
    /// Seconds a connection gets to send a request head (and may idle between requests).
    #[arg(long, value_name = "SECS", default_value_t = api::listener::HEADER_READ_TIMEOUT.as_secs(),
        value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub header_timeout: u64,
    /// Most connections one client address may hold open at once.
    #[arg(long, value_name = "N", default_value_t = api::listener::MAX_CONNECTIONS_PER_IP,
        value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=1_000_000))]
    pub max_connections_per_ip: usize,
    /// A name the node answers to when it listens on loopback, beside the local ones
    /// (a reverse proxy's public name, say); repeatable.
    #[arg(long = "allowed-host", value_name = "NAME")]
    pub allowed_hosts: Vec<String>,
}

/// Where `serve` listens without a recipe or `--listen`.
pub const DEFAULT_LISTEN: SocketAddr = SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 8080);

impl ServeArgs {
    /// Where and how the server listens: `--listen`, else the recipe's `serve.host` and
    /// `serve.port`, else [`DEFAULT_LISTEN`].
    fn listen(&self, recipe: Option<&Recipe>) -> Result<Listen> {
        let addr = match (self.listen, recipe) {
            (Some(addr), _) => addr,
            (None, Some(r)) => recipe_address(r)?,
            (None, None) => DEFAULT_LISTEN,
        };
        let limits = api::listener::Limits {
            header_read_timeout: Duration::from_secs(self.header_timeout),
            max_connections_per_ip: self.max_connections_per_ip,
        };
        Ok(Listen { addr, limits, allowed_hosts: AllowedHosts::new(self.allowed_hosts.clone()) })
    }
}

/// The recipe's `serve.host` and `serve.port` as a socket address.
fn recipe_address(recipe: &Recipe) -> Result<SocketAddr> {
    let host: std::net::IpAddr = recipe
        .serve
        .host
        .parse()
        .with_context(|| format!("serve.host {:?} is not an IP address", recipe.serve.host))?;
    Ok(SocketAddr::new(host, recipe.serve.port))
}

/// Where a node server listens, and the limits of its connections.
pub struct Listen {
    pub addr: SocketAddr,
    pub limits: api::listener::Limits,
    /// Names answered to on loopback beside the local ones (see `api::host`).
    pub allowed_hosts: AllowedHosts,
}

impl Listen {
    /// `addr` with the default limits and only local names.
    pub fn new(addr: SocketAddr) -> Self {
        Listen { addr, limits: api::listener::Limits::default(), allowed_hosts: AllowedHosts::default() }
    }
}

pub fn serve(mut args: ServeArgs, node_dir: &Path, out: &Output) -> Result<ExitCode> {
    let model = match (&args.recipe, &args.checkpoint) {
        (Some(recipe), checkpoint) => {
            let loaded = servable_recipe(recipe)?;
            let checkpoint = checkpoint
                .as_deref()
                .context("--checkpoint DIR is needed to serve a model (the run's final/ directory)")?;
            Some((load_model(&loaded, recipe, checkpoint, &args)?, loaded))
        }
        (None, _) => None,
    };
    let listen = args.listen(model.as_ref().map(|(_, loaded)| &loaded.recipe))?;
    if let Some((_, loaded)) = &model
        && !args.free
    {
        settle_on_the_nodes_chain(&mut args, loaded, node_dir)?;
    }
    let (log, id, _) = node::open(node_dir).with_context(|| format!("opening the node at {}", node_dir.display()))?;
    let log = Arc::new(log);
    let rt = tokio::runtime::Runtime::new()?;
    let served = rt.block_on(async {
        let sale = match &model {
            Some((_, loaded)) if !args.free => sale(loaded, &args, &log).await?,
            _ => None,
        };
        let node = NodeParts { log: log.clone(), id: Arc::new(id), dir: node_dir.to_path_buf() };
        let running = start(node, model.map(|(m, _)| m), sale, listen).await?;
        let price = running.state.as_ref().and_then(|s| s.rental_prices).map(|p| p.per_call);
        let model_name = running.state.as_ref().map(|s| s.model.name.clone());
        let token_file = node_dir.join(api::auth::TOKEN_FILE);
        let _ = out.line(
            &json!({"listening": running.url, "model": model_name, "price_per_call": price, "token_file": token_file}),
            || {
                let what = match &model_name {
                    Some(name) => {
                        format!("{name} ({})", price.map_or("free".into(), |p| format!("{} USDC per call", Usdc(p))))
                    }
                    None => "the operator API".into(),
                };
                format!(
                    "serving {what} at {}; operator token in {}; Ctrl-C or SIGTERM stops",
                    running.url,
                    token_file.display()
                )
            },
        );
        let signal = shutdown_signal().await?;
        let _ = out.line(&json!({"shutdown": signal}), || {
            format!("{signal}: shutting down (requests drain, a run launched over the API stops at a checkpoint)")
        });
        running.stop().await;
        anyhow::Ok(())
    });
    // What is left on the runtime (the metrics' fold of the log, idle tasks) lets go of the log.
    rt.shutdown_timeout(Duration::from_secs(5));
    served?;
    let events = close_log(log);
    let _ = out.line(&json!({"stopped": true, "log_events": events}), || {
        format!("stopped; the log holds {}", super::plural(events, "event"))
    });
    Ok(ExitCode::SUCCESS)
}

/// Waits for SIGINT (Ctrl-C) or SIGTERM; returns its name.
async fn shutdown_signal() -> Result<&'static str> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).context("listening for SIGTERM")?;
    let mut int = signal(SignalKind::interrupt()).context("listening for SIGINT")?;
    Ok(tokio::select! {
        _ = term.recv() => "SIGTERM",
        _ = int.recv() => "SIGINT",
    })
}

/// Closes the log (its writer answers every queued append and syncs before this returns)
/// and returns how many events it holds.
fn close_log(log: Arc<EventLog>) -> u64 {
    let events = log.len();
    match Arc::try_unwrap(log) {
        Ok(log) => {
            drop(log);
            tracing::info!(events, "shutdown: log closed");
        }
        Err(_) => tracing::warn!(events, "shutdown: the log is still held (a probe still running?); closed at exit"),
    }
    events
}

/// A sale on the chain this node deployed to: the TestUSDC of `chain deploy --test-usdc` as
/// the asset, and the chain's endpoint (chain.json's, or `chain up`'s for the embedded one),
/// unless given. Without an endpoint or a settler key, says which commands give them.
fn settle_on_the_nodes_chain(args: &mut ServeArgs, loaded: &LoadedRecipe, node_dir: &Path) -> Result<()> {
    let Some(billing) = &loaded.recipe.publish.billing.x402 else { return Ok(()) };
    if args.facilitator.is_some() {
        return Ok(());
    }
    let chain_id = billing.network.chain_id();
    let deployed = Deployment::load(node_dir).ok().filter(|d| d.chain_id == chain_id);
    if let Some(d) = &deployed {
        let preset = Asset::usdc_preset(Network::new(chain_id)).is_some();
        if args.asset.is_none() && !preset && matches!(billing.asset, publish::Asset::Usdc) {
            args.asset = d.test_usdc;
        }
        if args.rpc_url.is_none() {
            args.rpc_url = d.rpc_url.clone().or_else(|| SharedChain::running(node_dir).map(|s| s.url));
        }
    }
    if args.rpc_url.is_none() || args.settler_key.is_none() {
        let local = chain_id == 31337;
        let mut steps = Vec::new();
        if args.rpc_url.is_none() {
            steps.push(if local {
                "an endpoint: `mindxtrain chain up` keeps the node's anvil running (or --rpc-url URL)".to_string()
            } else {
                "--rpc-url URL of the recipe's network".to_string()
            });
        }
        if local && deployed.as_ref().is_none_or(|d| d.test_usdc.is_none()) && args.asset.is_none() {
            steps.push("a token: `mindxtrain chain deploy --test-usdc` (or --asset ADDR)".into());
        }
        if args.settler_key.is_none() {
            steps.push("--settler-key FILE, a 0600 file with the hex key that pays settlement gas".into());
        }
        bail!(
            "the recipe sells the model on {} ({}); to sell it, give {}; or serve it with --free",
            billing.network.caip2(),
            if local { "a local anvil" } else { "a public chain" },
            steps.join("; ")
        );
    }
    Ok(())
}

/// The recipe, checked, if it lets its model be served (`serve.enabled`).
fn servable_recipe(recipe: &Path) -> Result<LoadedRecipe> {
    let loaded = Recipe::check_path(recipe)
        .map_err(|errs| anyhow::anyhow!("{}", errs.iter().map(|e| e.to_string()).collect::<Vec<_>>().join("\n")))?;
    if !loaded.recipe.serve.enabled {
        bail!(
            "{}: serve.enabled is false, so this recipe's model is not served; set serve.enabled: true \
             (or run `mindxtrain serve` without a recipe for the operator API alone)",
            recipe.display()
        );
    }
    Ok(loaded)
}

fn load_model(loaded: &LoadedRecipe, recipe: &Path, checkpoint: &Path, args: &ServeArgs) -> Result<ServedModel> {
    let recipe_dir = recipe.parent().map(Path::to_path_buf).unwrap_or_default();
    let device = match args.device {
        Some(d) => d.open()?,
        None => mindxtrain_trainer::run::run_device(&loaded.recipe)
            .context("the recipe's hardware (pass --device cpu to serve on the CPU)")?,
    };
    let model = ServedModel::load(&ModelSource {
        recipe: loaded,
        recipe_dir: &recipe_dir,
        checkpoint,
        base: args.base.as_deref(),
        force_base: args.force_base,
        merge: args.merge,
        name: args.name.clone(),
        device: &device,
        adapters: &args.adapters,
    })?;
    Ok(model)
}

fn parse_adapter(s: &str) -> Result<(String, PathBuf), String> {
    match s.split_once('=') {
        Some((name, dir)) if !name.trim().is_empty() && !dir.is_empty() => Ok((name.trim().to_string(), dir.into())),
        _ => Err(format!("{s:?}: expected NAME=DIR (the model id clients use, and a PEFT adapter directory)")),
    }
}

/// `serve --device`: the CPU or one CUDA GPU by ordinal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceArg {
    Cpu,
    Cuda(usize),
}

pub(crate) fn parse_device(s: &str) -> Result<DeviceArg, String> {
    match s {
        "cpu" => Ok(DeviceArg::Cpu),
        "cuda" => Ok(DeviceArg::Cuda(0)),
        _ => s
            .strip_prefix("cuda:")
            .and_then(|n| n.parse().ok())
            .map(DeviceArg::Cuda)
            .ok_or_else(|| format!("{s:?}: expected cpu, cuda or cuda:N")),
    }
}

impl DeviceArg {
    pub(crate) fn open(self) -> Result<candle_core::Device> {
        match self {
            DeviceArg::Cpu => Ok(candle_core::Device::Cpu),
            DeviceArg::Cuda(n) => candle_core::Device::new_cuda(n)
                .with_context(|| format!("opening cuda:{n} (this binary needs the cuda feature: scripts/build-gpu)")),
        }
    }
}

/// The open node a server runs on.
pub struct NodeParts {
    pub log: Arc<EventLog>,
    pub id: Arc<Identity>,
    pub dir: PathBuf,
}

/// A node server on a socket: the operator API, and the model routes when a model is served.
pub struct Running {
    pub url: String,
    /// The model routes' state, when a model is served.
    pub state: Option<Arc<AppState>>,
    /// The operator routes' state (the runs launched over the API).
    pub api: Arc<ApiState>,
    shutdown: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
}

/// Binds `listen` and serves until [`Running::stop`].
pub async fn start(node: NodeParts, model: Option<ServedModel>, sale: Option<Sale>, listen: Listen) -> Result<Running> {
    let (token, created) = ApiToken::load_or_create(&node.dir).context("the operator token (api.token)")?;
    if created {
        tracing::info!(file = %node.dir.join(api::auth::TOKEN_FILE).display(), "created the operator token");
    }
    let model_name = model.as_ref().map(|m| m.name.clone());
    let facilitator = model.is_some() && sale.as_ref().is_some_and(|s| s.facilitator_routes);
    let api_state = ApiState::new(node.log.clone(), node.id.clone(), node.dir.clone(), model_name, facilitator);
    let metrics = api_state.metrics.clone();
    let keys = api::signed::Keyring::load(&node.dir, &node.id).map_err(anyhow::Error::msg)?;
    let mut app = api::router(api_state.clone(), Arc::new(api::auth::Credentials { token, keys }));
    let state = match model {
        Some(model) => {
            let rentals = RentalBook::load(node.log.clone(), node.id.clone())?;
            let state = AppState::new(model, node.log.clone(), rentals, sale.as_ref());
            api_state.metrics.watch_engine(state.model.clone());
            app = app.merge(serve::router(state.clone(), sale.as_ref()));
            Some(state)
        }
        None => None,
    };
    // Unknown paths and methods answer in the routes' error shape; the limits (body size, time
    // to the response head) and the Host check cover every route, the model's too.
    let app = api::fallback::with_fallbacks(app);
    let app = api::host::guard(api::with_limits(app), listen.addr.ip(), listen.allowed_hosts);
    let app = api::with_metrics(app, metrics);
    let addr = listen.addr;
    let listener = tokio::net::TcpListener::bind(addr).await.with_context(|| format!("binding {addr}"))?;
    let url = format!("http://{}", listener.local_addr()?);
    let (shutdown, rx) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(api::listener::serve(listener, app, listen.limits, async {
        let _ = rx.await;
    }));
    Ok(Running { url, state, api: api_state, shutdown, task })
}

/// How long a shutdown waits for a run launched over the API to stop after its current
/// step (a checkpoint, then `run.cancelled`; a run still planning finishes its probe first).
pub const RUN_STOP_TIMEOUT: Duration = Duration::from_secs(120);

impl Running {
    /// The graceful shutdown: stops accepting connections and admitting completions, asks a
    /// run launched over the API to stop as its cancel route does, lets in-flight requests
    /// finish (up to [`serve::DRAIN_TIMEOUT`]), then waits for the run's thread (up to
    /// [`RUN_STOP_TIMEOUT`]). The log is the caller's to close after.
    pub async fn stop(self) {
        if let Some(s) = &self.state {
            s.admission.close();
        }
        let cancelled = self.api.launches.close();
        for run in &cancelled {
            tracing::info!(run, "shutdown: cancelling the run (a checkpoint, then run.cancelled)");
        }
        let _ = self.shutdown.send(());
        tracing::info!(
            limit_s = serve::DRAIN_TIMEOUT.as_secs(),
            "shutdown: not accepting; draining in-flight requests"
        );
        match tokio::time::timeout(serve::DRAIN_TIMEOUT, self.task).await {
            Ok(_) => tracing::info!("shutdown: requests drained"),
            Err(_) => tracing::warn!("shutdown: requests still open after the drain timeout are dropped"),
        }
        if !cancelled.is_empty() {
            tracing::info!(limit_s = RUN_STOP_TIMEOUT.as_secs(), "shutdown: waiting for the run to stop");
        }
        if self.api.launches.finished(RUN_STOP_TIMEOUT).await {
            if !cancelled.is_empty() {
                tracing::info!("shutdown: runs stopped");
            }
        } else {
            tracing::error!("shutdown: a run did not stop in time; its last step is not checkpointed");
        }
    }
}

/// How the recipe's `publish.billing.x402` is sold here, or `None` when it sets no price.
async fn sale(loaded: &LoadedRecipe, args: &ServeArgs, log: &Arc<EventLog>) -> Result<Option<Sale>> {
    let Some(billing) = loaded.recipe.publish.billing.x402.clone() else { return Ok(None) };
    let network = Network::new(billing.network.chain_id());
    let asset = asset(&billing, network, args.asset)?;
    let no_rpc = "the recipe sells the model: give --rpc-url and --settler-key (in-process facilitator), \
                  --facilitator URL with --rpc-url, or --free";
    let rpc = args.rpc_url.as_deref().context(no_rpc)?;
    let (facilitator, settler, evidence): (Arc<dyn Facilitator>, Option<Address>, Evidence) = match &args.facilitator {
        Some(url) => {
            let evidence = Evidence::connect(rpc).map_err(anyhow::Error::msg)?;
            (Arc::new(HttpFacilitator::new(url, Duration::from_secs(60))?), None, evidence)
        }
        None => {
            let key_path = args.settler_key.as_deref().context("--settler-key FILE is needed to settle payments")?;
            let key = SettlerKey::from_file(key_path)?;
            let address = key.address();
            let mut config = LocalFacilitatorConfig::new(rpc, network);
            if let Some(receiver) = args.receiver {
                config.settle_via = SettleVia::Receiver(receiver);
            }
            let local = LocalFacilitator::connect(config, key).await?;
            let evidence = local.evidence();
            (Arc::new(local), Some(address), evidence)
        }
    };
    let pay_to = args
        .receiver
        .or(args.pay_to)
        .or(billing.pay_to.map(|a| Address::from(a.0)))
        .or(settler)
        .context("who is paid? give --pay-to (or publish.billing.x402.pay_to)")?;
    let offer = Offer { asset, pay_to, max_timeout_seconds: 300 };
    let payments = serve::payments(log, facilitator, evidence).context("reading the payment ledger from the log")?;
    Ok(Some(Sale {
        offer,
        payments,
        prices: billing.pricing.clone(),
        rental: billing.rental.clone(),
        facilitator_routes: args.facilitator.is_none(),
    }))
}

fn asset(billing: &publish::X402, network: Network, given: Option<Address>) -> Result<Asset> {
    match (&billing.asset, given) {
        (_, Some(address)) => Ok(Asset::test_usdc(network, address)),
        (publish::Asset::Token(a), None) => Ok(Asset::test_usdc(network, Address::from(a.0))),
        (publish::Asset::Usdc, None) => Asset::usdc_preset(network).with_context(|| {
            format!("no USDC address is known for {}: give --asset (the TestUSDC you deployed)", network.caip2())
        }),
        (publish::Asset::Eurc, None) => bail!("EURC is not sold yet: give --asset with a USDC-domain token"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn devices_and_adapters_parse_or_say_what_was_expected() {
        assert_eq!(parse_device("cpu"), Ok(DeviceArg::Cpu));
        assert_eq!(parse_device("cuda"), Ok(DeviceArg::Cuda(0)));
        assert_eq!(parse_device("cuda:3"), Ok(DeviceArg::Cuda(3)));
        assert!(parse_device("gpu").unwrap_err().contains("cpu, cuda or cuda:N"));
        assert!(parse_device("cuda:x").is_err());
        assert_eq!(parse_adapter("legal=runs/legal/final"), Ok(("legal".into(), PathBuf::from("runs/legal/final"))));
        for bad in ["legal", "=dir", "legal="] {
            assert!(parse_adapter(bad).unwrap_err().contains("NAME=DIR"), "{bad}");
        }
        // A CPU build cannot open a GPU and says how to get one.
        #[cfg(not(feature = "cuda"))]
        assert!(format!("{:#}", DeviceArg::Cuda(0).open().unwrap_err()).contains("scripts/build-gpu"));
    }
}
