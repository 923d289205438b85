//! The demo's market step: the LoRA model served behind x402 on the embedded anvil with
//! TestUSDC, paid into an X402Receiver that records each settlement; one paid chat
//! completion from a funded test wallet (balance, on-chain record and the settlement's
//! transaction checked), then a two-call rental used to its end; then the same server's
//! operator API: the run's receipt exported and verified over HTTP (chain included), the
//! payments read back with the operator token, anchors, metrics and the Coach UI page.

use anyhow::{Context, Result, ensure};
use mindxtrain_chain::bindings::{TestUSDC, X402Receiver};
use mindxtrain_chain::{deploy, key::AnchorKey};
use mindxtrain_node::anchor::session::{self, Access};
use mindxtrain_node::identity::Identity;
use mindxtrain_node::log::EventLog;
use mindxtrain_node::serve::Sale;
use mindxtrain_node::serve::client::PayingClient;
use mindxtrain_node::serve::model::{ModelSource, ServedModel};
use mindxtrain_trainer::recipe::Recipe;
use mindxtrain_x402::alloy::network::EthereumWallet;
use mindxtrain_x402::alloy::primitives::{Address, B256, U256};
use mindxtrain_x402::alloy::providers::{Provider, ProviderBuilder};
use mindxtrain_x402::alloy::signers::local::PrivateKeySigner;
use mindxtrain_x402::local::payment_record_id;
use mindxtrain_x402::{Asset, LocalFacilitator, LocalFacilitatorConfig, Network, Offer, SettleVia, SettlerKey};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// anvil's well-known development account 0: deploys and mints.
const ANVIL_ADMIN: &str = "0xac0974bec39a17e36ba4a6b4d238ff944bacb478cbed5efcae784d7bf4f2ff80";
/// anvil's well-known development account 1: pays the settlement gas.
const ANVIL_SETTLER: &str = "0x59c6995e998f97a5a0044966f0945389dc9e86dae88c7a8412f4603b6b78690d";
/// What the buyer's wallet is given: 1 TestUSDC.
const FUNDING: u64 = 1_000_000;

pub fn demo_step(
    dir: &Path,
    log: &Arc<EventLog>,
    id: &Identity,
    training: &Value,
    device: &candle_core::Device,
    say: &dyn Fn(String),
) -> Result<Value> {
    let lora = &training[1];
    let path = |v: &Value| v.as_str().map(PathBuf::from).context("training summary lacks a path");
    let recipe_file = path(&lora["recipe_file"])?;
    let checkpoint = path(&lora["final_dir"])?;
    let base = path(&training[0]["final_dir"])?;
    let loaded = Recipe::check_path(&recipe_file).map_err(|e| anyhow::anyhow!("{e}"))?;
    let recipe_dir = recipe_file.parent().map(Path::to_path_buf).unwrap_or_default();
    let model = ServedModel::load(&ModelSource {
        recipe: &loaded,
        recipe_dir: &recipe_dir,
        checkpoint: &checkpoint,
        base: Some(&base),
        force_base: false,
        merge: false,
        name: None,
        device,
        adapters: &[],
    })?;
    let billing = loaded.recipe.publish.billing.x402.clone().context("the demo recipe sets no x402 price")?;
    let price = billing.pricing.per_call.context("the demo recipe prices per call")?.atomic();

    let mut anvil = session::start_embedded(dir, Access::Write)?;
    let rt = tokio::runtime::Runtime::new()?;
    let result = rt.block_on(async {
        let rpc = anvil.endpoint();
        let network = Network::new(anvil.chain_id());
        let usdc = deploy::deploy_test_usdc(&rpc, &AnchorKey::development(), "USD Coin", "2").await?.address;
        let admin: PrivateKeySigner = ANVIL_ADMIN.parse()?;
        let chain = ProviderBuilder::new().wallet(EthereumWallet::from(admin)).connect_http(rpc.parse()?);
        let token = TestUSDC::new(usdc, &chain);
        let buyer = PrivateKeySigner::random();
        let seller = PrivateKeySigner::random().address();
        ensure!(
            token.mint(buyer.address(), U256::from(FUNDING)).send().await?.get_receipt().await?.status(),
            "mint reverted"
        );
        let balance = |who: Address| {
            let token = token.clone();
            async move { anyhow::Ok(u64::try_from(token.balanceOf(who).call().await?)?) }
        };
        say(format!(
            "      TestUSDC {usdc}; buyer {} funded with 1 USDC; price {} USDC per call",
            buyer.address(),
            fmt_usdc(price)
        ));

        // Payments go to an X402Receiver, which records each one in the settling transaction.
        let settler = SettlerKey::from_hex(ANVIL_SETTLER)?;
        let receiver = deploy::deploy_x402_receiver(&rpc, &AnchorKey::development(), usdc, seller, settler.address())
            .await?
            .address;
        let mut config = LocalFacilitatorConfig::new(&rpc, network);
        config.settle_via = SettleVia::Receiver(receiver);
        let facilitator = LocalFacilitator::connect(config, settler).await?;
        let evidence = facilitator.evidence();
        let sale = Sale {
            offer: Offer { asset: Asset::test_usdc(network, usdc), pay_to: receiver, max_timeout_seconds: 300 },
            payments: mindxtrain_node::serve::payments(log, Arc::new(facilitator), evidence)?,
            prices: billing.pricing.clone(),
            rental: billing.rental.clone(),
            facilitator_routes: true,
        };
        let node = super::serve_cmd::NodeParts { log: log.clone(), id: Arc::new(id.clone()), dir: dir.to_path_buf() };
        let server = super::serve_cmd::start(
            node,
            Some(model),
            Some(sale),
            super::serve_cmd::Listen::new("127.0.0.1:0".parse()?),
        )
        .await?;
        let name = server.state.as_ref().map(|s| s.model.name.clone()).unwrap_or_default();
        let url = server.url.clone();
        let buyer_address = buyer.address();
        let outcome = market_calls(&url, &name, buyer, &chain, price).await;
        let run_id = lora["run_id"].as_str().unwrap_or_default();
        let operator = match &outcome {
            Ok(_) => operator_calls(&url, dir, run_id).await,
            Err(_) => Ok(Value::Null),
        };
        server.stop().await;
        let (call, rental, nonce) = outcome?;
        let operator = operator?;
        let received = balance(receiver).await?;
        ensure!(received == 3 * price, "the receiver holds {received} after three paid calls' worth");
        let id = payment_record_id(usdc, buyer_address, nonce);
        let record = X402Receiver::new(receiver, &chain).payments(id).call().await?;
        ensure!(
            record.payer == buyer_address && record.amount == U256::from(price),
            "the paid call is not recorded in X402Receiver"
        );
        anyhow::Ok(json!({"url": url, "model": name, "device": mindxtrain_trainer::run::device_name(device), "asset": usdc, "receiver": receiver, "price": price.to_string(),
            "received": received.to_string(), "paid_call": call, "rental": rental, "operator_api": operator}))
    });
    anvil.stop();
    let market = result?;
    say(format!(
        "      paid call: {PAID_QUESTION:?} answered {:?} (tx {}, recorded in X402Receiver)",
        market["paid_call"]["answer"].as_str().unwrap_or(""),
        market["paid_call"]["tx"].as_str().unwrap_or("-")
    ));
    say(format!(
        "      rental {}: 2 calls bought in one payment, used, then refused ({})",
        market["rental"]["id"].as_str().unwrap_or("-"),
        market["rental"]["after_last_call"].as_str().unwrap_or("-")
    ));
    let api = &market["operator_api"];
    say(format!(
        "      operator API: receipt of {} verified over HTTP ({} checks, root found on chain), {} settled payments \
         read with the token, {} anchored items, Coach UI at /ui/",
        api["run_id"].as_str().unwrap_or("-"),
        api["receipt_checks"],
        api["payments_settled"],
        api["anchored_items"]
    ));
    Ok(market)
}

/// The operator API of the running node, as an operator and a third party would use it.
async fn operator_calls(url: &str, dir: &Path, run_id: &str) -> Result<Value> {
    let token = std::fs::read_to_string(dir.join(mindxtrain_node::api::auth::TOKEN_FILE))?.trim().to_owned();
    let http = reqwest::Client::new();
    let get = |path: String, auth: bool| {
        let req = http.get(format!("{url}{path}"));
        let req = if auth { req.bearer_auth(&token) } else { req };
        async move {
            let r = req.send().await.with_context(|| path.clone())?;
            ensure!(r.status().is_success(), "GET {path} answered {}", r.status());
            anyhow::Ok(r.json::<Value>().await?)
        }
    };
    // A third party: no token, the receipt exported and checked by the node, chain included.
    let receipt = get(format!("/api/receipts/{run_id}"), false).await?;
    let verified: Value = http.post(format!("{url}/api/receipts/verify")).json(&receipt).send().await?.json().await?;
    let checks = verified["report"]["checks"].as_array().cloned().unwrap_or_default();
    let on_chain = checks.iter().any(|c| c["name"] == "anchor.on_chain" && c["status"] == "pass");
    ensure!(verified["ok"] == true && on_chain, "the receipt did not verify over HTTP: {verified}");
    // The operator: payer data needs the token.
    let anonymous = http.get(format!("{url}/api/payments")).send().await?.status();
    ensure!(anonymous == 401, "payments without the token answered {anonymous}");
    let payments = get("/api/payments?limit=1000".into(), true).await?;
    let settled =
        payments["events"].as_array().map_or(0, |e| e.iter().filter(|e| e["kind"] == "payment.settled").count());
    ensure!(settled >= 2, "{settled} payment.settled events after a paid call and a rental");
    let anchors = get("/api/anchors".into(), false).await?;
    let anchored = anchors["items"].as_array().map_or(0, |i| i.iter().filter(|i| i["state"] == "anchored").count());
    let metrics = http.get(format!("{url}/metrics")).bearer_auth(&token).send().await?.text().await?;
    ensure!(metrics.contains("mindxtrain_http_requests_total"), "metrics without request counts");
    let ui = http.get(format!("{url}/ui/")).send().await?;
    ensure!(ui.status().is_success(), "the Coach UI answered {}", ui.status());
    Ok(json!({"run_id": run_id, "receipt_checks": checks.len(), "receipt_on_chain": on_chain,
        "payments_settled": settled, "anchored_items": anchored, "ui": format!("{url}/ui/")}))
}

/// What the paid call asks: a held-out prompt of the tuned task mix (the generator draws
/// parity questions about numbers from 100 to 9,999,999; this one is in neither corpus).
const PAID_QUESTION: &str = "Is 2026 even or odd?";

/// One paid completion, then a rental of two calls used up.
async fn market_calls(
    url: &str,
    model: &str,
    buyer: PrivateKeySigner,
    chain: &impl Provider,
    price: u64,
) -> Result<(Value, Value, B256)> {
    let client = PayingClient::new(buyer, 10 * price)?;
    let request = json!({"model": model, "max_tokens": 24, "temperature": 0,
        "messages": [{"role": "user", "content": PAID_QUESTION}]});
    let paid = client.post_json(&format!("{url}/v1/chat/completions"), &request).await?;
    ensure!(paid.status == 200, "paid call answered {}: {}", paid.status, paid.body);
    let settlement = paid.settlement.context("no PAYMENT-RESPONSE on the paid call")?;
    let tx: B256 = settlement.transaction.parse().context("settlement transaction hash")?;
    let receipt = chain.get_transaction_receipt(tx).await?.context("the settlement transaction is not on chain")?;
    ensure!(receipt.status(), "the settlement transaction reverted");
    ensure!(paid.amount == price, "paid {} for a {price} call", paid.amount);
    let nonce = paid.nonce.context("the paid call carries no nonce")?;
    let call = json!({"question": PAID_QUESTION, "answer": paid.body["choices"][0]["message"]["content"], "usage": paid.body["usage"],
        "tx": settlement.transaction, "block": receipt.block_number});

    let rented = client.post_json(&format!("{url}/v1/rentals"), &json!({"model": model, "calls": 2})).await?;
    ensure!(rented.status == 200, "rental answered {}: {}", rented.status, rented.body);
    let token = rented.body["token"].as_str().context("rental without a token")?.to_string();
    let http = reqwest::Client::new();
    let mut statuses = Vec::new();
    for _ in 0..3 {
        let r = http.post(format!("{url}/v1/chat/completions")).bearer_auth(&token).json(&request).send().await?;
        statuses.push(r.status().as_u16());
    }
    ensure!(statuses == [200, 200, 403], "rental calls answered {statuses:?}, expected [200, 200, 403]");
    let id = rented.body["id"].as_str().unwrap_or_default().to_string();
    let state: Value = http.get(format!("{url}/v1/rentals/{id}")).send().await?.json().await?;
    ensure!(state["calls_used"] == 2 && state["status"] == "closed", "rental state after use: {state}");
    let rental = json!({"id": id, "paid": rented.amount.to_string(), "tx": rented.settlement.map(|s| s.transaction),
        "calls_used": 2, "after_last_call": "403 rental_used_up", "state": state});
    Ok((call, rental, nonce))
}

fn fmt_usdc(atomic: u64) -> String {
    mindxtrain_trainer::recipe::Usdc(atomic).to_string()
}
