//! Paid inference exactly once, tried as an outside client would: replays after another
//! payment's check, one authorization raced across routes and header versions, a kill -9
//! while a settlement is pending, a rental whose settlement fails, and misuse of the
//! facilitator routes. Real anvil, real TestUSDC, real settlement; every test ends with the
//! accounting: answers served = distinct transfers on chain = `payment.settled` events, each
//! with its own transaction.

use std::collections::HashSet;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use mindxtrain_tests::mindxtrain;
use mindxtrain_tests::served::{MODEL, PRICE, Server, Trained, key_file, new_node, ok, s, trained};
use mindxtrain_tests::x402_env::{
    ANVIL_KEY_1, ANVIL_KEY_3, Chain, ITestToken, PaidServer, STREAM_CHUNKS, STREAM_GAP, payment_required, refusal,
    signed_payment,
};
use mindxtrain_x402::alloy::network::EthereumWallet;
use mindxtrain_x402::alloy::primitives::{Address, B256, U256};
use mindxtrain_x402::alloy::providers::ProviderBuilder;
use mindxtrain_x402::alloy::signers::local::PrivateKeySigner;
use mindxtrain_x402::wire::{FacilitatorRequest, PaymentPayload, PaymentPayloadV1, SettlementResponse};
use mindxtrain_x402::{Facilitator, header};
use serde_json::{Value, json};

/// The node's events of `kind`.
fn logged(node: &Path, kind: &str) -> Vec<Value> {
    let v = ok(mindxtrain(node, &["--json", "log", "show", "--kind", kind]).output().unwrap());
    let all = v["events"].as_array().or(v.as_array()).cloned().unwrap_or_default();
    all.into_iter().map(|e| if e["envelope"].is_object() { e["envelope"].clone() } else { e }).collect()
}

/// answers served = distinct transfers on chain = settlement records, each naming its own
/// transaction, and the records name exactly the transfers.
fn assert_accounts(answers: usize, transfers: &[B256], settled_txs: &[String]) {
    let on_chain: HashSet<String> = transfers.iter().map(|t| t.to_string()).collect();
    let recorded: HashSet<&String> = settled_txs.iter().collect();
    assert_eq!(on_chain.len(), transfers.len(), "a transaction moved money to the payee twice?");
    assert_eq!(recorded.len(), settled_txs.len(), "a settlement recorded twice: {settled_txs:?}");
    assert_eq!(answers, transfers.len(), "answers served vs transfers on chain");
    assert_eq!(settled_txs.len(), transfers.len(), "payment.settled events vs transfers on chain");
    assert_eq!(recorded, on_chain.iter().collect(), "the records name other transactions than the chain's");
}

fn settled_txs_in(node: &Path) -> Vec<String> {
    logged(node, "payment.settled").iter().map(|e| e["data"]["tx"].as_str().unwrap().to_owned()).collect()
}

fn v1(p: &PaymentPayload) -> String {
    header::encode(&PaymentPayloadV1 {
        x402_version: 1,
        scheme: "exact".into(),
        network: p.accepted.network.clone(),
        payload: p.payload.clone(),
    })
}

// ------------------------------------------------------------------ the layer on its own

/// Failure 1: pay A; have a fresh payment B checked (the public verify route, and a paid
/// request refused before settlement); A's exact header again is refused on every route and
/// in both header versions, and nothing is recorded or moved for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_settled_payment_replayed_after_another_check_buys_nothing() {
    let chain = Chain::start().await.unwrap();
    let f: Arc<dyn Facilitator> = chain.facilitator().await.unwrap();
    let server = PaidServer::start(&chain, f.clone(), f).await.unwrap();
    let http = reqwest::Client::new();
    let echo = format!("{}/echo", server.url);
    let accepted = payment_required(&http, &echo).await.unwrap().accepts.remove(0);
    let payer = PrivateKeySigner::random();
    chain.mint(payer.address(), 1_000_000).await.unwrap();
    let post = |route: &str, name: &'static str, value: String| {
        http.post(format!("{}/{route}", server.url)).header(name, value).body("{}").send()
    };

    let a = signed_payment(&payer, &accepted, &chain.asset, |_| {});
    assert_eq!(post("echo", "payment-signature", header::encode(&a)).await.unwrap().status(), 200);
    let mut answers = 1;

    let b = signed_payment(&payer, &accepted, &chain.asset, |_| {});
    let check =
        FacilitatorRequest { x402_version: 2, payment_payload: b.clone(), payment_requirements: accepted.clone() };
    let verdict: Value = http
        .post(format!("{}/facilitator/verify", server.url))
        .json(&check)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(verdict["isValid"], true, "{verdict}");
    assert_eq!(post("fail", "payment-signature", header::encode(&b)).await.unwrap().status(), 500);

    for (route, name, value) in [
        ("echo", "payment-signature", header::encode(&a)),
        ("echo", "x-payment", v1(&a)),
        ("other", "payment-signature", header::encode(&a)),
        ("echo", "payment-signature", header::encode(&a)),
    ] {
        let r = post(route, name, value).await.unwrap();
        assert_eq!(r.status(), 402, "{route} {name}: A replayed");
        assert_eq!(refusal(&r).as_deref(), Some("invalid_exact_evm_nonce_already_used"), "{route} {name}");
    }
    // B, never settled, still pays once.
    assert_eq!(post("other", "payment-signature", header::encode(&b)).await.unwrap().status(), 200);
    answers += 1;

    let events = server.events.all();
    let settled: Vec<String> = events.iter().filter_map(|e| e.strip_prefix("settled:")).map(str::to_owned).collect();
    assert_accounts(answers, &chain.transfers_to(server.pay_to).await.unwrap(), &settled);
    assert_eq!(chain.balance(payer.address()).await.unwrap(), 1_000_000 - 2 * PRICE_LAYER);
}

/// A paid stream settles before its first byte and then streams: the first chunk arrives
/// long before the last. A client that leaves mid-stream redeems the same header for a whole
/// stream without a second transfer; after that the header buys nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paid_stream_starts_at_once_and_a_dropped_one_is_redeemed() {
    let chain = Chain::start().await.unwrap();
    let f: Arc<dyn Facilitator> = chain.facilitator().await.unwrap();
    let server = PaidServer::start(&chain, f.clone(), f).await.unwrap();
    let http = reqwest::Client::new();
    let url = format!("{}/stream", server.url);
    let accepted = payment_required(&http, &url).await.unwrap().accepts.remove(0);
    let payer = PrivateKeySigner::random();
    chain.mint(payer.address(), 1_000_000).await.unwrap();
    let paid = header::encode(&signed_payment(&payer, &accepted, &chain.asset, |_| {}));
    let send = || http.post(&url).header("payment-signature", paid.clone()).body("{}").send();

    let started = std::time::Instant::now();
    let mut first = send().await.unwrap();
    assert_eq!(first.status(), 200);
    let settled = header::decode_payment_response(first.headers()[header::PAYMENT_RESPONSE].as_bytes()).unwrap();
    assert!(settled.success);
    assert_eq!(first.chunk().await.unwrap().as_deref(), Some(&b"chunk 0\n"[..]));
    let whole = STREAM_GAP * STREAM_CHUNKS as u32;
    assert!(started.elapsed() < whole / 2, "first byte after {:?}: buffered, not streamed", started.elapsed());
    drop(first); // the client leaves mid-stream

    let mut chunks = Vec::new();
    let mut redeemed = None;
    for _ in 0..100 {
        let mut r = send().await.unwrap();
        if r.status() == 402 && refusal(&r).as_deref() == Some("invalid_exact_evm_nonce_in_flight") {
            // The server has not yet noticed the first client left.
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        }
        assert_eq!(r.status(), 200, "{:?}", refusal(&r));
        redeemed = Some(header::decode_payment_response(r.headers()[header::PAYMENT_RESPONSE].as_bytes()).unwrap());
        while let Some(c) = r.chunk().await.unwrap() {
            chunks.extend_from_slice(&c);
        }
        break;
    }
    let redeemed = redeemed.expect("the retry was answered");
    assert_eq!(redeemed.transaction, settled.transaction, "redeemed, not paid again");
    assert_eq!(String::from_utf8(chunks).unwrap().lines().count(), STREAM_CHUNKS);
    let r = send().await.unwrap();
    assert_eq!(refusal(&r).as_deref(), Some("invalid_exact_evm_nonce_already_used"), "delivered once: spent");

    let events = server.events.all();
    assert!(events.contains(&format!("served:{}:2", settled.transaction)), "{events:?}");
    let settled: Vec<String> = events.iter().filter_map(|e| e.strip_prefix("settled:")).map(str::to_owned).collect();
    assert_accounts(1, &chain.transfers_to(server.pay_to).await.unwrap(), &settled);
}

/// A paid stream whose generation fails after its first chunk was settled (before its first
/// byte) but not delivered: the client sees a broken stream, and the same header is then
/// answered in full without a second transfer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paid_stream_that_fails_mid_answer_stays_redeemable() {
    let chain = Chain::start().await.unwrap();
    let f: Arc<dyn Facilitator> = chain.facilitator().await.unwrap();
    let server = PaidServer::start(&chain, f.clone(), f).await.unwrap();
    let http = reqwest::Client::new();
    let url = format!("{}/stream", server.url);
    let accepted = payment_required(&http, &url).await.unwrap().accepts.remove(0);
    let payer = PrivateKeySigner::random();
    chain.mint(payer.address(), 1_000_000).await.unwrap();
    let paid = header::encode(&signed_payment(&payer, &accepted, &chain.asset, |_| {}));

    let mut broken = http.post(&url).header("payment-signature", paid.clone()).body("fail").send().await.unwrap();
    assert_eq!(broken.status(), 200);
    let settled = header::decode_payment_response(broken.headers()[header::PAYMENT_RESPONSE].as_bytes()).unwrap();
    let mut got = Vec::new();
    let outcome = loop {
        match broken.chunk().await {
            Ok(Some(c)) => got.extend_from_slice(&c),
            Ok(None) => break Ok(()),
            Err(e) => break Err(e),
        }
    };
    assert!(outcome.is_err(), "the stream must end broken, got {:?}", String::from_utf8_lossy(&got));
    assert_eq!(got, b"chunk 0\n");

    let mut whole = Vec::new();
    for _ in 0..100 {
        let mut r = http.post(&url).header("payment-signature", paid.clone()).body("{}").send().await.unwrap();
        if refusal(&r).as_deref() == Some("invalid_exact_evm_nonce_in_flight") {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        }
        assert_eq!(r.status(), 200, "{:?}", refusal(&r));
        let again = header::decode_payment_response(r.headers()[header::PAYMENT_RESPONSE].as_bytes()).unwrap();
        assert_eq!(again.transaction, settled.transaction, "redeemed, not paid again");
        while let Some(c) = r.chunk().await.unwrap() {
            whole.extend_from_slice(&c);
        }
        break;
    }
    assert_eq!(String::from_utf8(whole).unwrap().lines().count(), STREAM_CHUNKS);
    let settled: Vec<String> =
        server.events.all().iter().filter_map(|e| e.strip_prefix("settled:")).map(str::to_owned).collect();
    assert_accounts(1, &chain.transfers_to(server.pay_to).await.unwrap(), &settled);
}

/// The paid test server's price (tests/src/x402_env.rs).
const PRICE_LAYER: u64 = mindxtrain_tests::x402_env::PRICE;

/// Failure 5: the facilitator routes settle only payments to this server's own payTo and
/// asset, and through the same ledger as its paid routes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_facilitator_settles_only_its_own_payments_once() {
    let chain = Chain::start().await.unwrap();
    let f: Arc<dyn Facilitator> = chain.facilitator().await.unwrap();
    let server = PaidServer::start(&chain, f.clone(), f).await.unwrap();
    let http = reqwest::Client::new();
    let accepted = payment_required(&http, &format!("{}/echo", server.url)).await.unwrap().accepts.remove(0);
    let payer = PrivateKeySigner::random();
    chain.mint(payer.address(), 1_000_000).await.unwrap();
    let settle = |p: &PaymentPayload, req: &mindxtrain_x402::wire::PaymentRequirements| {
        let body =
            FacilitatorRequest { x402_version: 2, payment_payload: p.clone(), payment_requirements: req.clone() };
        http.post(format!("{}/facilitator/settle", server.url)).json(&body).send()
    };

    // To a stranger: refused before anything is sent, whatever the payer signed.
    let stranger = Address::repeat_byte(0x77);
    let mut theirs = accepted.clone();
    theirs.pay_to = stranger.to_checksum(None);
    let p = signed_payment(&payer, &theirs, &chain.asset, |_| {});
    let r = settle(&p, &theirs).await.unwrap();
    assert_eq!(r.status(), 403);
    let s: SettlementResponse = r.json().await.unwrap();
    assert!(!s.success && s.error_reason.as_deref() == Some("invalid_exact_evm_recipient_mismatch"), "{s:?}");
    assert_eq!(chain.balance(stranger).await.unwrap(), 0);
    // Another token (a second TestUSDC): refused too.
    let other = mindxtrain_chain::deploy::deploy_test_usdc(
        &chain.rpc,
        &mindxtrain_chain::AnchorKey::development(),
        "USD Coin",
        "2",
    )
    .await
    .unwrap()
    .address;
    let other_asset = mindxtrain_x402::Asset::test_usdc(chain.asset.network, other);
    let mut other_req = accepted.clone();
    other_req.asset = other.to_checksum(None);
    let p = signed_payment(&payer, &other_req, &other_asset, |_| {});
    assert_eq!(settle(&p, &other_req).await.unwrap().status(), 403);

    // To us: settled once; the same authorization again, here or on a paid route, buys nothing.
    let mine = signed_payment(&payer, &accepted, &chain.asset, |_| {});
    let s: SettlementResponse = settle(&mine, &accepted).await.unwrap().json().await.unwrap();
    assert!(s.success, "{s:?}");
    let s: SettlementResponse = settle(&mine, &accepted).await.unwrap().json().await.unwrap();
    assert!(!s.success, "settled twice: {s:?}");
    let r = http
        .post(format!("{}/echo", server.url))
        .header("payment-signature", header::encode(&mine))
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(refusal(&r).as_deref(), Some("invalid_exact_evm_nonce_already_used"));
    // A payment served on a paid route cannot be settled again through the facilitator.
    let served = signed_payment(&payer, &accepted, &chain.asset, |_| {});
    let r = http
        .post(format!("{}/echo", server.url))
        .header("payment-signature", header::encode(&served))
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let s: SettlementResponse = settle(&served, &accepted).await.unwrap().json().await.unwrap();
    assert_eq!(s.error_reason.as_deref(), Some("invalid_exact_evm_nonce_already_used"), "{s:?}");

    // Two answers: one settlement sold through the facilitator, one paid call.
    let settled: Vec<String> =
        server.events.all().iter().filter_map(|e| e.strip_prefix("settled:")).map(str::to_owned).collect();
    assert_accounts(2, &chain.transfers_to(server.pay_to).await.unwrap(), &settled);
    assert_eq!(server.served.load(Ordering::SeqCst), 1);
}

// ------------------------------------------------------------------ a node selling its model

struct Seller {
    _t: Trained,
    node: std::path::PathBuf,
    server: Option<Server>,
    args: Vec<String>,
    pay_to: Address,
}

impl Seller {
    /// A node serving the micro model for 0.01 TestUSDC per call, settling with anvil key 1.
    fn start(chain: &Chain) -> Seller {
        let t = trained(2);
        let node = new_node(&t, "seller");
        let key = key_file(&node, "settler.key", ANVIL_KEY_1);
        let pay_to = PrivateKeySigner::random().address();
        let args: Vec<String> = [
            "--rpc-url",
            &chain.rpc,
            "--settler-key",
            s(&key),
            "--asset",
            &chain.usdc.to_string(),
            "--pay-to",
            &pay_to.to_string(),
        ]
        .iter()
        .map(|a| a.to_string())
        .collect();
        let mut seller = Seller { _t: t, node, server: None, args, pay_to };
        seller.restart();
        seller
    }

    fn restart(&mut self) {
        let args: Vec<&str> = self.args.iter().map(String::as_str).collect();
        self.server = Some(tokio::task::block_in_place(|| Server::start(&self.node, &self._t, &args)));
    }

    fn url(&self) -> &str {
        &self.server.as_ref().unwrap().url
    }

    /// kill -9.
    fn kill(&mut self) {
        drop(self.server.take());
    }
}

fn chat(max_tokens: u32) -> Value {
    json!({"model": MODEL, "max_tokens": max_tokens, "messages": [{"role": "user", "content": "2+2="}]})
}

/// The requirements a route asks for this body.
async fn accepted_for(http: &reqwest::Client, url: &str, body: &Value) -> mindxtrain_x402::wire::PaymentRequirements {
    let r = http.post(url).json(body).send().await.unwrap();
    assert_eq!(r.status(), 402);
    let h = r.headers().get(header::PAYMENT_REQUIRED).unwrap();
    header::decode_payment_required(h.as_bytes()).unwrap().accepts.remove(0)
}

/// Failure 2: the same authorization at once to the chat route and the rental route (a
/// one-call rental costs what one call does), in both header versions, 100 times: one
/// answer each time, one transfer each time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_authorization_raced_across_routes_and_versions_buys_one_answer() {
    let chain = Chain::start().await.unwrap();
    let seller = tokio::task::block_in_place(|| Seller::start(&chain));
    let http = reqwest::Client::new();
    let chat_url = format!("{}/v1/chat/completions", seller.url());
    let rent_url = format!("{}/v1/rentals", seller.url());
    let rental = json!({"model": MODEL, "calls": 1});
    let accepted = accepted_for(&http, &chat_url, &chat(2)).await;
    assert_eq!(accepted, accepted_for(&http, &rent_url, &rental).await, "one header fits both routes");
    let payer = PrivateKeySigner::random();
    chain.mint(payer.address(), 100 * PRICE).await.unwrap();

    let tries = 100;
    let mut answers = 0;
    for i in 0..tries {
        let p = signed_payment(&payer, &accepted, &chain.asset, |_| {});
        let (chat_header, rent_header) = match i % 3 {
            0 => (("payment-signature", header::encode(&p)), ("x-payment", v1(&p))),
            1 => (("x-payment", v1(&p)), ("payment-signature", header::encode(&p))),
            _ => (("payment-signature", header::encode(&p)), ("payment-signature", header::encode(&p))),
        };
        let a = http.post(&chat_url).header(chat_header.0, chat_header.1).json(&chat(2)).send();
        let b = http.post(&rent_url).header(rent_header.0, rent_header.1).json(&rental).send();
        let (a, b) = tokio::join!(a, b);
        let (a, b) = (a.unwrap(), b.unwrap());
        let won = [a.status().as_u16(), b.status().as_u16()];
        let losers: Vec<Option<String>> = [&a, &b].iter().filter(|r| r.status() == 402).map(|r| refusal(r)).collect();
        assert_eq!(won.iter().filter(|s| **s == 200).count(), 1, "try {i}: {won:?} {losers:?}");
        for reason in losers {
            assert!(
                matches!(
                    reason.as_deref(),
                    Some("invalid_exact_evm_nonce_in_flight" | "invalid_exact_evm_nonce_already_used")
                ),
                "try {i}: {reason:?}"
            );
        }
        answers += 1;
    }
    let transfers = chain.transfers_to(seller.pay_to).await.unwrap();
    assert_accounts(answers, &transfers, &settled_txs_in(&seller.node));
    assert_eq!(chain.balance(payer.address()).await.unwrap(), 0, "paid once per try");
}

/// Failure 3: automine off, a paid call, the node killed (kill -9) while its settlement is
/// in the pool, a block mined (the transfer lands), the node restarted: it reconciles the
/// intent, and the client's retry with the same header is answered with no new transfer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kill_during_settlement_is_reconciled_and_the_retry_answered_without_paying_again() {
    let chain = Chain::start().await.unwrap();
    let mut seller = tokio::task::block_in_place(|| Seller::start(&chain));
    let http = reqwest::Client::new();
    let chat_url = format!("{}/v1/chat/completions", seller.url());
    let accepted = accepted_for(&http, &chat_url, &chat(2)).await;
    let payer = PrivateKeySigner::random();
    chain.mint(payer.address(), 1_000_000).await.unwrap();
    let p = signed_payment(&payer, &accepted, &chain.asset, |_| {});
    let paid = header::encode(&p);

    chain.automine(false).await.unwrap();
    let in_flight = tokio::spawn({
        let (http, url, paid) = (http.clone(), chat_url.clone(), paid.clone());
        async move { http.post(url).header("payment-signature", paid).json(&chat(2)).send().await }
    });
    for _ in 0..500 {
        if chain.pending().await.unwrap() > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(chain.pending().await.unwrap(), 1, "the settlement is in the pool");
    seller.kill();
    assert!(in_flight.await.unwrap().is_err(), "the client got nothing");
    let intents = logged(&seller.node, "payment.settling");
    assert_eq!(intents.len(), 1, "the intent was durable before the broadcast");
    assert!(logged(&seller.node, "payment.settled").is_empty());
    chain.mine().await.unwrap();
    chain.automine(true).await.unwrap();
    assert_eq!(chain.balance(payer.address()).await.unwrap(), 1_000_000 - PRICE, "the transfer landed");

    seller.restart();
    let chat_url = format!("{}/v1/chat/completions", seller.url());
    let mut answer = None;
    for _ in 0..100 {
        let r = http.post(&chat_url).header("payment-signature", paid.clone()).json(&chat(2)).send().await.unwrap();
        match (r.status().as_u16(), refusal(&r)) {
            (200, _) => {
                let s = header::decode_payment_response(r.headers().get(header::PAYMENT_RESPONSE).unwrap().as_bytes());
                answer = Some((s.unwrap(), r.json::<Value>().await.unwrap()));
                break;
            }
            // The reconciler holds it for a moment.
            (402, Some(reason)) if reason == "invalid_exact_evm_nonce_in_flight" => {}
            (status, reason) => panic!("retry answered {status} {reason:?}"),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (settlement, body) = answer.expect("the retry is answered");
    assert_eq!(body["object"], "chat.completion");
    let transfers = chain.transfers_to(seller.pay_to).await.unwrap();
    assert_eq!(settlement.transaction, transfers[0].to_string(), "the retry names the transfer that landed");
    assert_eq!(chain.balance(payer.address()).await.unwrap(), 1_000_000 - PRICE, "no second transfer");
    // Once answered, the header buys nothing more.
    let r = http.post(&chat_url).header("payment-signature", paid).json(&chat(2)).send().await.unwrap();
    assert_eq!(refusal(&r).as_deref(), Some("invalid_exact_evm_nonce_already_used"));
    // `payment.served` is group-committed after the answer's last byte (nothing waits for it:
    // payments.rs), so under load it may reach the log a moment after the client has the answer.
    // Wait for it before killing the seller; then there is exactly one.
    let mut served = Vec::new();
    for _ in 0..200 {
        served = logged(&seller.node, "payment.served");
        if !served.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    seller.kill();
    let settled = logged(&seller.node, "payment.settled");
    assert_eq!(settled[0]["data"]["by"], "reconciliation");
    assert_eq!(served.len(), 1, "the answer was recorded as served once");
    assert_eq!(logged(&seller.node, "payment.served").len(), 1);
    assert_accounts(1, &transfers, &settled_txs_in(&seller.node));
}

/// Failure 4: a rental whose settlement reverts (the payer empties its account in the same
/// block, ahead of it) opens nothing: no `rental.opened`, a `payment.failed`, a 402.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rental_whose_settlement_fails_opens_nothing() {
    let chain = Chain::start().await.unwrap();
    let mut seller = tokio::task::block_in_place(|| Seller::start(&chain));
    let http = reqwest::Client::new();
    let rent_url = format!("{}/v1/rentals", seller.url());
    let rental = json!({"model": MODEL, "calls": 2});
    let accepted = accepted_for(&http, &rent_url, &rental).await;
    // Anvil's key 3 pays: it has gas to move its TestUSDC away itself.
    let payer: PrivateKeySigner = ANVIL_KEY_3.parse().unwrap();
    chain.mint(payer.address(), 2 * PRICE).await.unwrap();
    let p = signed_payment(&payer, &accepted, &chain.asset, |_| {});

    chain.automine(false).await.unwrap();
    let in_flight = tokio::spawn({
        let (http, url, paid) = (http.clone(), rent_url.clone(), header::encode(&p));
        async move { http.post(url).header("payment-signature", paid).json(&rental).send().await }
    });
    for _ in 0..500 {
        if chain.pending().await.unwrap() > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(chain.pending().await.unwrap(), 1, "the settlement is in the pool");
    let wallet =
        ProviderBuilder::new().wallet(EthereumWallet::from(payer.clone())).connect_http(chain.rpc.parse().unwrap());
    let token = ITestToken::new(chain.usdc, &wallet);
    let _drain = token
        .transfer(Address::repeat_byte(0x42), U256::from(2 * PRICE))
        // Estimated against the pool, the transfer would seem to fail: the settlement ahead
        // of it has taken the balance. Mined ahead of the settlement, it succeeds.
        .gas(100_000)
        .max_priority_fee_per_gas(100_000_000_000)
        .max_fee_per_gas(200_000_000_000)
        .send()
        .await
        .unwrap();
    chain.mine().await.unwrap();
    chain.automine(true).await.unwrap();

    let r = in_flight.await.unwrap().unwrap();
    assert_eq!(r.status(), 402);
    let s = header::decode_payment_response(r.headers().get(header::PAYMENT_RESPONSE).unwrap().as_bytes()).unwrap();
    assert!(!s.success, "{s:?}");
    assert!(r.bytes().await.unwrap().is_empty(), "no rental token");
    // The failure is recorded beside the answer, not before it (a crash in between leaves the
    // durable intent, which the reconciler settles as failed: tested above): wait for it.
    for _ in 0..100 {
        if !logged(&seller.node, "payment.failed").is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    seller.kill();
    assert!(logged(&seller.node, "rental.opened").is_empty(), "a rental opened for a payment that never landed");
    let failed = logged(&seller.node, "payment.failed");
    assert_eq!(failed.len(), 1, "{failed:?}");
    assert_accounts(0, &chain.transfers_to(seller.pay_to).await.unwrap(), &settled_txs_in(&seller.node));
}

/// The paid-load serving benchmark's smoke run (bench/serving-paid.sh runs it on a GPU): the
/// same load paid and unpaid generates the same tokens, every request exactly its
/// `max_tokens`, and every paid request, warm-up included, is one `payment.settled`, one
/// `payment.served` and one transfer on chain.
#[test]
fn the_paid_load_bench_generates_the_same_tokens_paid_and_unpaid_and_settles_each_call_once() {
    use mindxtrain_tests::bench::paid_serving::{PaidServing, run};
    let load = PaidServing {
        device: "cpu".into(),
        shape: "tiny".into(),
        streams: 3,
        prompt: 32,
        new_tokens: 8,
        rounds: 2,
        payers: 2,
    };
    let r = run(&load).expect("the smoke run");
    r.check().expect("what the bench checks itself");
    assert_eq!((r.paid.tokens, r.unpaid.tokens), (3 * 8 * 2, 3 * 8 * 2));
    assert_eq!((r.paid.requests, r.unpaid.requests), (6, 6));
    let g = &r.ledger;
    // A warm-up load, then two measured ones.
    assert_eq!((g.paid_requests, g.settled, g.served, g.transfers), (9, 9, 9, 9));
    assert!(r.ratio().is_finite() && r.ratio() > 0.0);
}
