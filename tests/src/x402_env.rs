//! A paid test server on loopback: anvil, TestUSDC, the in-process facilitator and an
//! axum app whose routes sit behind `PaidRoute`. Shared by the x402 tests and benchmark.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::Bytes;
use axum::http::StatusCode;
use axum::routing::post;
use mindxtrain_chain::anvil::{AnvilOptions, LocalAnvil};
use mindxtrain_chain::{AnchorKey, deploy};
use mindxtrain_node::identity::Identity;
use mindxtrain_node::log::EventLog;
use mindxtrain_x402::alloy::network::EthereumWallet;
use mindxtrain_x402::alloy::primitives::{Address, B256, U256};
use mindxtrain_x402::alloy::providers::{DynProvider, Provider, ProviderBuilder};
use mindxtrain_x402::alloy::signers::local::PrivateKeySigner;
use mindxtrain_x402::eip712::{TransferWithAuthorization, sign_authorization};
use mindxtrain_x402::ledger::{Intent, Landed};
use mindxtrain_x402::wire::{PaymentPayload, PaymentRequired, PaymentRequirements};
use mindxtrain_x402::{
    Asset, Facilitator, LocalFacilitator, LocalFacilitatorConfig, Network, Offer, PaidRoute, PaidRouteConfig,
    PaymentEvents, PaymentFacts, Payments, Pricing, RejectReason, SettledBy, SettlerKey, facilitator_routes, header,
};

#[allow(clippy::too_many_arguments)]
mod abi {
    mindxtrain_x402::alloy::sol! {
        #[sol(rpc)]
        interface ITestToken {
            event Transfer(address indexed from, address indexed to, uint256 value);
            function mint(address to, uint256 amount) external;
            function balanceOf(address account) external view returns (uint256);
            function authorizationState(address authorizer, bytes32 nonce) external view returns (bool);
            function transfer(address to, uint256 amount) external returns (bool);
            function transferWithAuthorization(address from, address to, uint256 value, uint256 validAfter, uint256 validBefore, bytes32 nonce, bytes signature) external;
        }
    }
}
pub use abi::ITestToken;

/// anvil's well-known development keys 1–3 (0 deploys).
pub const ANVIL_KEY_1: &str = "0x59c6995e998f97a5a0044966f0945389dc9e86dae88c7a8412f4603b6b78690d";
pub const ANVIL_KEY_2: &str = "0x5de4111afa1a4b94908f83103eb1f1706367c2e68ca870fc3fb9a804cdab365a";
pub const ANVIL_KEY_3: &str = "0x7c852118294e51e653712a81e05800f419141751be58f605c371e15141b007a6";

/// Price of one call in the tests: 0.01 USDC.
pub const PRICE: u64 = 10_000;

/// Every payment event, as `kind:detail` strings.
#[derive(Default)]
pub struct RecordedEvents(pub Mutex<Vec<String>>);

impl RecordedEvents {
    pub fn all(&self) -> Vec<String> {
        self.0.lock().unwrap().clone()
    }
    fn push(&self, s: String) {
        self.0.lock().unwrap().push(s);
    }
}

impl PaymentEvents for RecordedEvents {
    fn verified(&self, f: &PaymentFacts) {
        self.push(format!("verified:{}", f.payer.clone().unwrap_or_default()));
    }
    fn settling(&self, _: &Intent) -> mindxtrain_x402::Recorded {
        self.push("settling".into());
        mindxtrain_x402::events::recorded()
    }
    fn settled(&self, _: &Intent, landed: &Landed, _: SettledBy) -> mindxtrain_x402::Recorded {
        self.push(format!("settled:{}", landed.tx));
        mindxtrain_x402::events::recorded()
    }
    fn failed(&self, _: &Intent, reason: &RejectReason, _: Option<&str>) {
        self.push(format!("failed:{}", reason.code()));
    }
    fn void(&self, _: &Intent) {
        self.push("void".into());
    }
    fn served(&self, _: &Intent, landed: &Landed, attempt: u32) {
        self.push(format!("served:{}:{attempt}", landed.tx));
    }
    fn rejected(&self, _: &PaymentFacts, reason: &RejectReason, _: Option<&str>) {
        self.push(format!("rejected:{}", reason.code()));
    }
    fn not_settled(&self, _: &PaymentFacts, status: u16) {
        self.push(format!("not_settled:{status}"));
    }
    fn replayed(&self, _: &PaymentFacts) {
        self.push("replayed".into());
    }
}

/// A node in a temporary directory, as a server holds it: its event log and identity.
pub struct TempNode {
    // Fields drop in order: the log closes (its last sync, its signed head) before the
    // directory goes.
    pub log: Arc<EventLog>,
    pub identity: Arc<Identity>,
    pub dir: tempfile::TempDir,
}

impl TempNode {
    /// Made off the async runtime (`init` waits for the genesis event to be durable), so
    /// call it from a multi-threaded one or from none.
    pub fn new() -> anyhow::Result<TempNode> {
        let make = || -> anyhow::Result<TempNode> {
            let dir = tempfile::tempdir()?;
            mindxtrain_node::node::init(dir.path())?;
            let (log, identity, _) = mindxtrain_node::node::open(dir.path())?;
            Ok(TempNode { log: Arc::new(log), identity: Arc::new(identity), dir })
        };
        match tokio::runtime::Handle::try_current() {
            Ok(_) => tokio::task::block_in_place(make),
            Err(_) => make(),
        }
    }
}

/// The chain side: anvil with TestUSDC deployed.
pub struct Chain {
    pub anvil: LocalAnvil,
    pub rpc: String,
    pub usdc: Address,
    pub asset: Asset,
    /// Signs as anvil's account 0 (mints, deploys).
    pub admin: DynProvider,
}

impl Chain {
    pub async fn start() -> anyhow::Result<Self> {
        let anvil = LocalAnvil::start(AnvilOptions::default())?;
        let rpc = anvil.endpoint();
        let dev = AnchorKey::development();
        let usdc = deploy::deploy_test_usdc(&rpc, &dev, "USD Coin", "2").await?.address;
        let admin_key: PrivateKeySigner =
            "0xac0974bec39a17e36ba4a6b4d238ff944bacb478cbed5efcae784d7bf4f2ff80".parse()?;
        let admin = ProviderBuilder::new().wallet(EthereumWallet::from(admin_key)).connect_http(rpc.parse()?).erased();
        let asset = Asset::test_usdc(Network::new(anvil.chain_id()), usdc);
        Ok(Self { anvil, rpc, usdc, asset, admin })
    }

    pub async fn mint(&self, to: Address, amount: u64) -> anyhow::Result<()> {
        let t = ITestToken::new(self.usdc, &self.admin);
        let r = t.mint(to, U256::from(amount)).send().await?.get_receipt().await?;
        anyhow::ensure!(r.status(), "mint reverted");
        Ok(())
    }

    pub async fn balance(&self, who: Address) -> anyhow::Result<u64> {
        let b = ITestToken::new(self.usdc, &self.admin).balanceOf(who).call().await?;
        Ok(u64::try_from(b)?)
    }

    /// Turns anvil's automine on or off (off: transactions wait in the pool for [`Chain::mine`]).
    pub async fn automine(&self, on: bool) -> anyhow::Result<()> {
        self.admin.raw_request::<_, ()>("evm_setAutomine".into(), (on,)).await?;
        Ok(())
    }

    /// Mines one block with what the pool holds.
    pub async fn mine(&self) -> anyhow::Result<()> {
        self.admin.raw_request::<_, serde_json::Value>("evm_mine".into(), ()).await?;
        Ok(())
    }

    /// Transactions waiting in anvil's pool.
    pub async fn pending(&self) -> anyhow::Result<u64> {
        let status: serde_json::Value = self.admin.raw_request("txpool_status".into(), ()).await?;
        let pending = status["pending"].as_str().unwrap_or("0x0");
        Ok(u64::from_str_radix(pending.trim_start_matches("0x"), 16)?)
    }

    /// The transactions that moved TestUSDC to `to` (its `Transfer` logs), in chain order.
    pub async fn transfers_to(&self, to: Address) -> anyhow::Result<Vec<B256>> {
        use mindxtrain_x402::alloy::rpc::types::Filter;
        use mindxtrain_x402::alloy::sol_types::SolEvent;
        let filter = Filter::new()
            .address(self.usdc)
            .event_signature(abi::ITestToken::Transfer::SIGNATURE_HASH)
            .topic2(to.into_word())
            .from_block(0);
        let logs = self.admin.get_logs(&filter).await?;
        Ok(logs.iter().filter_map(|l| l.transaction_hash).collect())
    }

    pub async fn nonce_used(&self, from: Address, nonce: B256) -> anyhow::Result<bool> {
        Ok(ITestToken::new(self.usdc, &self.admin).authorizationState(from, nonce).call().await?)
    }

    /// The default in-process facilitator, settling with anvil's account 1.
    pub async fn facilitator(&self) -> anyhow::Result<Arc<LocalFacilitator>> {
        self.facilitator_with(LocalFacilitatorConfig::new(&self.rpc, self.asset.network)).await
    }

    pub async fn facilitator_with(&self, config: LocalFacilitatorConfig) -> anyhow::Result<Arc<LocalFacilitator>> {
        Ok(Arc::new(LocalFacilitator::connect(config, SettlerKey::from_hex(ANVIL_KEY_1)?).await?))
    }
}

/// An axum app on loopback: `POST /echo` (paid, echoes its JSON), `POST /fail` (paid, 500),
/// `POST /drain` (paid; moves the payer's whole balance away before answering, so
/// settlement fails), `POST /other` (paid, the same price: another route on the same
/// ledger), and the facilitator routes under `/facilitator` (settling only to `pay_to`).
pub struct PaidServer {
    pub url: String,
    pub pay_to: Address,
    pub events: Arc<RecordedEvents>,
    pub payments: Payments,
    /// How many times a paid handler ran.
    pub served: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for PaidServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

pub async fn serve(router: Router) -> anyhow::Result<(String, tokio::task::JoinHandle<()>)> {
    let listener = tokio::net::TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], 0))).await?;
    let url = format!("http://{}", listener.local_addr()?);
    let task = tokio::spawn(async move {
        let _ = axum::serve(listener, router).await;
    });
    Ok((url, task))
}

impl PaidServer {
    /// Routes behind `facilitator`; the facilitator routes serve `local`. The chain is read
    /// through `local`'s provider when `facilitator` has no reader of its own (a remote one).
    pub async fn start(
        chain: &Chain,
        facilitator: Arc<dyn Facilitator>,
        local: Arc<dyn Facilitator>,
    ) -> anyhow::Result<Self> {
        Self::start_paying(chain, facilitator, local, PrivateKeySigner::random().address()).await
    }

    /// [`PaidServer::start`], paid to `pay_to`.
    pub async fn start_paying(
        chain: &Chain,
        facilitator: Arc<dyn Facilitator>,
        local: Arc<dyn Facilitator>,
        pay_to: Address,
    ) -> anyhow::Result<Self> {
        let events = Arc::new(RecordedEvents::default());
        let served = Arc::new(AtomicUsize::new(0));
        let offer = Offer { asset: chain.asset.clone(), pay_to, max_timeout_seconds: 120 };
        let config = PaidRouteConfig::new(vec![offer.clone()], Pricing::PerCall { amount: PRICE });
        let mut payments = Payments::new(facilitator, events.clone());
        payments.evidence = payments.evidence.or_else(|| local.evidence());
        let layer = PaidRoute::new(config.clone(), payments.clone());
        let other = PaidRoute::new(config, payments.clone());
        let (s1, s2, s3, s4) = (served.clone(), served.clone(), served.clone(), served.clone());
        let drain_token = ITestToken::new(chain.usdc, chain.admin.clone());
        let drain_rpc = chain.rpc.clone();
        let router = Router::new()
            .route(
                "/echo",
                post(move |body: Bytes| async move {
                    s1.fetch_add(1, Ordering::SeqCst);
                    let v: serde_json::Value = serde_json::from_slice(&body).unwrap_or(serde_json::Value::Null);
                    axum::Json(serde_json::json!({ "echo": v }))
                })
                .layer(layer.clone()),
            )
            .route(
                "/fail",
                post(move || async move {
                    s2.fetch_add(1, Ordering::SeqCst);
                    (StatusCode::INTERNAL_SERVER_ERROR, "handler failed")
                })
                .layer(layer.clone()),
            )
            .route(
                "/drain",
                post(move |ext: axum::Extension<mindxtrain_x402::VerifiedPayment>| async move {
                    s3.fetch_add(1, Ordering::SeqCst);
                    // The payer (anvil key 3 in the test) empties its account mid-request.
                    let payer: PrivateKeySigner = ANVIL_KEY_3.parse().expect("key");
                    assert_eq!(payer.address(), ext.0.payer);
                    let p = ProviderBuilder::new()
                        .wallet(EthereumWallet::from(payer))
                        .connect_http(drain_rpc.parse().expect("url"));
                    let t = ITestToken::new(*drain_token.address(), &p);
                    let all = t.balanceOf(ext.0.payer).call().await.expect("balance");
                    let sink = Address::repeat_byte(0x42);
                    t.transfer(sink, all).send().await.expect("send").get_receipt().await.expect("receipt");
                    "drained"
                })
                .layer(layer),
            )
            .route(
                "/other",
                post(move |body: Bytes| async move {
                    s4.fetch_add(1, Ordering::SeqCst);
                    axum::Json(serde_json::json!({ "other": body.len() }))
                })
                .layer(other),
            )
            .route(
                "/stream",
                post(stream_handler).layer(PaidRoute::new(stream_config(offer.clone()), payments.clone())),
            )
            .nest("/facilitator", facilitator_routes(Payments { facilitator: local, ..payments.clone() }, vec![offer]));
        let (url, task) = serve(router).await?;
        Ok(Self { url, pay_to, events, payments, served, task })
    }
}

/// How many chunks `/stream` sends, one every [`STREAM_GAP`].
pub const STREAM_CHUNKS: usize = 10;
pub const STREAM_GAP: std::time::Duration = std::time::Duration::from_millis(100);

/// `/stream` is sold like a streamed completion: settled after its response head, before
/// its first byte.
fn stream_config(offer: Offer) -> PaidRouteConfig {
    let prepare: mindxtrain_x402::pricing::Prepare =
        Arc::new(|_, _| Ok(mindxtrain_x402::Quote::new(PRICE, mindxtrain_x402::SettleWhen::AfterHead)));
    PaidRouteConfig::new(vec![offer], Pricing::Prepared(prepare))
}

/// `chunk 0\n`, `chunk 1\n`, … one every [`STREAM_GAP`]; a request whose body is `fail` gets
/// one chunk and then a failed stream (as a generation that fails mid-answer).
async fn stream_handler(body: Bytes) -> axum::body::Body {
    let fail = body.as_ref() == b"fail";
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(1);
    tokio::spawn(async move {
        for i in 0..STREAM_CHUNKS {
            if fail && i == 1 {
                let _ = tx.send(Err(std::io::Error::other("generation failed"))).await;
                return;
            }
            if tx.send(Ok(Bytes::from(format!("chunk {i}\n")))).await.is_err() {
                return;
            }
            tokio::time::sleep(STREAM_GAP).await;
        }
    });
    axum::body::Body::from_stream(tokio_stream::wrappers::ReceiverStream::new(rx))
}

/// The 402 a route answers without payment.
pub async fn payment_required(http: &reqwest::Client, url: &str) -> anyhow::Result<PaymentRequired> {
    payment_required_for(http, url, "{}").await
}

/// The 402 a route answers a request with `body` and no payment (a route that prepares its
/// requests answers one it cannot serve with a 4xx instead).
pub async fn payment_required_for(http: &reqwest::Client, url: &str, body: &str) -> anyhow::Result<PaymentRequired> {
    let r = http.post(url).header("content-type", "application/json").body(body.to_owned()).send().await?;
    anyhow::ensure!(r.status() == 402, "expected 402, got {}", r.status());
    let h = r.headers().get(header::PAYMENT_REQUIRED).ok_or_else(|| anyhow::anyhow!("no PAYMENT-REQUIRED"))?;
    Ok(header::decode_payment_required(h.as_bytes())?)
}

/// A signed payment for `accepted`, with `tweak` applied to the message before signing
/// (and `sign_asset` the domain it is signed under).
pub fn signed_payment(
    payer: &PrivateKeySigner,
    accepted: &PaymentRequirements,
    sign_asset: &Asset,
    tweak: impl FnOnce(&mut TransferWithAuthorization),
) -> PaymentPayload {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
    let mut m = TransferWithAuthorization {
        from: payer.address(),
        to: accepted.pay_to.parse().expect("payTo"),
        value: accepted.amount.parse().expect("amount"),
        validAfter: U256::ZERO,
        validBefore: U256::from(now + 60),
        // 32 random bytes (a fresh key is the handiest CSPRNG output at hand).
        nonce: PrivateKeySigner::random().to_bytes(),
    };
    tweak(&mut m);
    let payload = sign_authorization(payer, sign_asset, &m).expect("sign");
    PaymentPayload { x402_version: 2, resource: None, accepted: accepted.clone(), payload, extensions: None }
}

/// The reason code in a 402's `PAYMENT-REQUIRED.error`.
pub fn refusal(resp: &reqwest::Response) -> Option<String> {
    let h = resp.headers().get(header::PAYMENT_REQUIRED)?;
    header::decode_payment_required(h.as_bytes()).ok()?.error
}

/// `tests/js` in this workspace (with the npm clients installed by its `setup.sh`).
pub fn js_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("js")
}

/// Runs `tests/js/setup.sh` (npm ci when the pinned packages are missing).
pub fn ensure_js() -> anyhow::Result<()> {
    let st = std::process::Command::new("bash").arg(js_dir().join("setup.sh")).status()?;
    anyhow::ensure!(st.success(), "tests/js/setup.sh failed");
    Ok(())
}

/// Pays `url` with the reference npm client (`tests/js/bin/pay.mjs`) as the holder of `key`,
/// allowing up to 1 TestUSDC of `asset` per payment; one JSON object per request.
pub fn run_npm_client(url: &str, key: &str, asset: Address, extra: &[&str]) -> Vec<serde_json::Value> {
    ensure_js().expect("npm clients installed");
    let out = std::process::Command::new("node")
        .current_dir(js_dir())
        .arg("bin/pay.mjs")
        .arg(url)
        .args(extra)
        .arg("--allow-asset")
        .arg(format!("eip155:31337:{asset}:1000000"))
        .env("X402_PAYER_KEY", key)
        .output()
        .expect("node runs");
    assert!(out.status.success(), "pay.mjs failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).lines().map(|l| serde_json::from_str(l).expect("json line")).collect()
}
