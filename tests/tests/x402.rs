//! x402 end to end on anvil with TestUSDC: the real npm clients pay our layer, and a
//! battery of bad payments is refused with the right reason and serves nothing.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use mindxtrain_tests::x402_env::*;
use mindxtrain_x402::alloy::primitives::{Address, B256, U256};
use mindxtrain_x402::alloy::providers::Provider;
use mindxtrain_x402::alloy::signers::local::PrivateKeySigner;
use mindxtrain_x402::wire::{PaymentPayloadV1, SettlementResponse};
use mindxtrain_x402::{Asset, Facilitator, HttpFacilitator, Network, header};

struct Env {
    chain: Chain,
    server: PaidServer,
    http: reqwest::Client,
}

async fn env() -> Env {
    let chain = Chain::start().await.expect("anvil + TestUSDC");
    let f: Arc<dyn Facilitator> = chain.facilitator().await.expect("facilitator");
    let server = PaidServer::start(&chain, f.clone(), f).await.expect("server");
    Env { chain, server, http: reqwest::Client::new() }
}

/// Settles `p` on the token directly, as someone else holding the authorization could;
/// returns the block it landed in.
async fn settle_elsewhere(chain: &Chain, p: &mindxtrain_x402::wire::PaymentPayload) -> u64 {
    let a = &p.payload.authorization;
    let token = ITestToken::new(chain.usdc, &chain.admin);
    let sig_bytes: mindxtrain_x402::alloy::primitives::Bytes = p.payload.signature.parse().unwrap();
    let receipt = token
        .transferWithAuthorization(
            a.from.parse().unwrap(),
            a.to.parse().unwrap(),
            a.value.parse().unwrap(),
            a.valid_after.parse().unwrap(),
            a.valid_before.parse().unwrap(),
            a.nonce.parse().unwrap(),
            sig_bytes,
        )
        .send()
        .await
        .unwrap()
        .get_receipt()
        .await
        .unwrap();
    assert!(receipt.status());
    receipt.block_number.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reference_npm_client_pays_and_is_served() {
    let e = env().await;
    let payer = PrivateKeySigner::random();
    e.chain.mint(payer.address(), 1_000_000).await.unwrap();
    let key = format!("0x{}", mindxtrain_x402::alloy::hex::encode(payer.credential().to_bytes()));

    let results = tokio::task::spawn_blocking({
        let url = format!("{}/echo", e.server.url);
        let usdc = e.chain.usdc;
        move || run_npm_client(&url, &key, usdc, &["--body", r#"{"prompt":"hi"}"#])
    })
    .await
    .unwrap();
    let r = &results[0];
    assert_eq!(r["status"], 200, "{r}");
    assert_eq!(serde_json::from_str::<serde_json::Value>(r["body"].as_str().unwrap()).unwrap()["echo"]["prompt"], "hi");
    let settlement: SettlementResponse = serde_json::from_value(r["paymentResponse"].clone()).unwrap();
    assert!(settlement.success);
    assert_eq!(settlement.network, "eip155:31337");

    assert_eq!(e.chain.balance(payer.address()).await.unwrap(), 1_000_000 - PRICE);
    assert_eq!(e.chain.balance(e.server.pay_to).await.unwrap(), PRICE);
    let tx: B256 = settlement.transaction.parse().unwrap();
    let receipt = e.chain.admin.get_transaction_receipt(tx).await.unwrap().expect("tx on chain");
    assert!(receipt.status());
    assert_eq!(receipt.to, Some(e.chain.usdc));
    assert_eq!(e.server.served.load(Ordering::SeqCst), 1);
    let ev = e.server.events.all();
    let tx = &settlement.transaction;
    // The intent's write starts with verification, before anything can be sent.
    assert_eq!(ev[0], "settling", "{ev:?}");
    assert!(ev[1].starts_with("verified:"), "{ev:?}");
    assert_eq!(ev[2..], [format!("settled:{tx}"), format!("served:{tx}:1")], "{ev:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_payment_identifier_pays_once_and_replays_the_answer() {
    let e = env().await;
    let payer = PrivateKeySigner::random();
    e.chain.mint(payer.address(), 1_000_000).await.unwrap();
    let key = format!("0x{}", mindxtrain_x402::alloy::hex::encode(payer.credential().to_bytes()));
    let results = tokio::task::spawn_blocking({
        let url = format!("{}/echo", e.server.url);
        let usdc = e.chain.usdc;
        move || run_npm_client(&url, &key, usdc, &["--repeat", "2", "--payment-id", "pay_0123456789abcdef0123"])
    })
    .await
    .unwrap();
    assert_eq!(results.len(), 2);
    assert_eq!(results[0]["status"], 200);
    assert_eq!(results[0], results[1], "the retry gets the same answer");
    assert_eq!(e.chain.balance(payer.address()).await.unwrap(), 1_000_000 - PRICE, "paid once");
    assert_eq!(e.server.served.load(Ordering::SeqCst), 1);
    assert!(e.server.events.all().contains(&"replayed".to_owned()));

    // The same id from another payer is refused (ids are not bearer tokens).
    let req = payment_required(&e.http, &format!("{}/echo", e.server.url)).await.unwrap();
    let thief = PrivateKeySigner::random();
    let mut p = signed_payment(&thief, &req.accepts[0], &e.chain.asset, |_| {});
    let mut ext = serde_json::Map::new();
    ext.insert(
        "payment-identifier".into(),
        serde_json::json!({"info": {"required": false, "id": "pay_0123456789abcdef0123"}}),
    );
    p.extensions = Some(ext);
    let r = e
        .http
        .post(format!("{}/echo", e.server.url))
        .header("payment-signature", header::encode(&p))
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 402);
    assert_eq!(refusal(&r).as_deref(), Some("payment_identifier_conflict"));
}

/// One bad payment: refused with `reason`, nothing served, nothing moved.
async fn refused(e: &Env, header_name: &str, value: String, reason: &str) {
    let served = e.server.served.load(Ordering::SeqCst);
    let r = e.http.post(format!("{}/echo", e.server.url)).header(header_name, value).body("{}").send().await.unwrap();
    assert_eq!(r.status(), 402, "{reason}");
    assert_eq!(refusal(&r).as_deref(), Some(reason));
    assert!(r.headers().get(header::PAYMENT_RESPONSE).is_none(), "{reason}: nothing settled");
    let body: serde_json::Value = r.json().await.unwrap();
    assert!(body.get("echo").is_none() && body["x402Version"] == 1, "{reason}: served {body}");
    assert_eq!(e.server.served.load(Ordering::SeqCst), served, "{reason}: handler ran");
    let events = e.server.events.all();
    let last = events.iter().rev().find(|e| *e != "void" && *e != "settling");
    assert_eq!(last.map(String::as_str), Some(format!("rejected:{reason}").as_str()));
    // Every intent recorded is settled or voided: none is left for a restart to reconcile.
    let count = |p: &str| events.iter().filter(|e| e.starts_with(p)).count();
    assert_eq!(count("settling"), count("settled:") + count("void"), "{events:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bad_payment_battery() {
    let e = env().await;
    let url = format!("{}/echo", e.server.url);
    let req = payment_required(&e.http, &url).await.unwrap();
    let ok = &req.accepts[0];
    let payer = PrivateKeySigner::random();
    e.chain.mint(payer.address(), 1_000_000).await.unwrap();
    let asset = e.chain.asset.clone();
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
    let sig = |p: &mindxtrain_x402::wire::PaymentPayload| header::encode(p);
    let ps = "payment-signature";

    // Replayed nonce: served once, then the same header again.
    let good = signed_payment(&payer, ok, &asset, |_| {});
    let r = e.http.post(&url).header(ps, sig(&good)).body("{}").send().await.unwrap();
    assert_eq!(r.status(), 200);
    refused(&e, ps, sig(&good), "invalid_exact_evm_nonce_already_used").await;

    // Already-settled nonce: the authorization was submitted to the token by someone else.
    let elsewhere = signed_payment(&payer, ok, &asset, |_| {});
    settle_elsewhere(&e.chain, &elsewhere).await;
    refused(&e, ps, sig(&elsewhere), "invalid_exact_evm_nonce_already_used").await;
    let before = e.chain.balance(payer.address()).await.unwrap();

    // Time window.
    let p = signed_payment(&payer, ok, &asset, |m| m.validBefore = U256::from(now - 1));
    refused(&e, ps, sig(&p), "invalid_exact_evm_payload_authorization_valid_before").await;
    let p = signed_payment(&payer, ok, &asset, |m| m.validBefore = U256::from(now + 2));
    refused(&e, ps, sig(&p), "invalid_exact_evm_payload_authorization_valid_before").await;
    let p = signed_payment(&payer, ok, &asset, |m| m.validAfter = U256::from(now + 3600));
    refused(&e, ps, sig(&p), "invalid_exact_evm_payload_authorization_valid_after").await;

    // Wrong amount, lower and higher: in the signed value, and in `accepted` too.
    let amount = "invalid_exact_evm_payload_authorization_value_mismatch";
    for v in [PRICE - 1, PRICE + 1] {
        let p = signed_payment(&payer, ok, &asset, |m| m.value = U256::from(v));
        refused(&e, ps, sig(&p), amount).await;
        let mut acc = ok.clone();
        acc.amount = v.to_string();
        let p = signed_payment(&payer, &acc, &asset, |_| {});
        refused(&e, ps, sig(&p), amount).await;
    }

    // Wrong payTo.
    let elsewhere_addr = Address::repeat_byte(0x77);
    let p = signed_payment(&payer, ok, &asset, |m| m.to = elsewhere_addr);
    refused(&e, ps, sig(&p), "invalid_exact_evm_recipient_mismatch").await;
    let mut acc = ok.clone();
    acc.pay_to = elsewhere_addr.to_checksum(None);
    refused(&e, ps, sig(&signed_payment(&payer, &acc, &asset, |_| {})), "invalid_exact_evm_recipient_mismatch").await;

    // Wrong asset: named in `accepted`, or only in the signed domain.
    let other_token = Asset::test_usdc(asset.network, Address::repeat_byte(0x55));
    let mut acc = ok.clone();
    acc.asset = other_token.address.to_checksum(None);
    refused(&e, ps, sig(&signed_payment(&payer, &acc, &other_token, |_| {})), "invalid_exact_evm_asset_mismatch").await;
    refused(&e, ps, sig(&signed_payment(&payer, ok, &other_token, |_| {})), "invalid_exact_evm_signature").await;

    // Wrong chain id: named in `accepted`, or only in the signed domain.
    let base = Asset { network: Network::new(8453), ..asset.clone() };
    let mut acc = ok.clone();
    acc.network = "eip155:8453".into();
    refused(&e, ps, sig(&signed_payment(&payer, &acc, &base, |_| {})), "invalid_exact_evm_network_mismatch").await;
    refused(&e, ps, sig(&signed_payment(&payer, ok, &base, |_| {})), "invalid_exact_evm_signature").await;

    // Forged signature (another key claims to be the payer), and malformed ones.
    let forger = PrivateKeySigner::random();
    let p = signed_payment(&forger, ok, &asset, |m| m.from = payer.address());
    refused(&e, ps, sig(&p), "invalid_exact_evm_signature").await;
    let mut p = signed_payment(&payer, ok, &asset, |_| {});
    p.payload.signature = "0x1234".into();
    refused(&e, ps, sig(&p), "invalid_exact_evm_signature").await;
    p.payload.signature = "0xnothex".into();
    refused(&e, ps, sig(&p), "invalid_exact_evm_payload").await;

    // Malformed base64 / JSON, and an oversized header.
    refused(&e, ps, "!!!not-base64!!!".into(), "invalid_payload").await;
    refused(&e, ps, header::encode(&serde_json::json!({"x402Version": 2, "hello": 1})), "invalid_payload").await;
    refused(&e, ps, "eyJ4NDAyVmVyc2lvbiI6Mn0".into(), "invalid_payload").await;
    refused(&e, ps, "A".repeat(header::MAX_HEADER_LEN + 1), "invalid_payload_too_large").await;

    // Insufficient balance.
    let poor = PrivateKeySigner::random();
    e.chain.mint(poor.address(), PRICE - 1).await.unwrap();
    refused(&e, ps, sig(&signed_payment(&poor, ok, &asset, |_| {})), "invalid_exact_evm_insufficient_balance").await;
    assert_eq!(e.chain.balance(poor.address()).await.unwrap(), PRICE - 1);

    assert_eq!(e.chain.balance(payer.address()).await.unwrap(), before, "no refused payment moved money");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_concurrent_requests_with_one_payment_serve_exactly_one() {
    let e = env().await;
    let url = format!("{}/echo", e.server.url);
    let req = payment_required(&e.http, &url).await.unwrap();
    let payer = PrivateKeySigner::random();
    e.chain.mint(payer.address(), 1_000_000).await.unwrap();
    let value = header::encode(&signed_payment(&payer, &req.accepts[0], &e.chain.asset, |_| {}));
    let mut tasks = Vec::new();
    for _ in 0..50 {
        let (http, url, value) = (e.http.clone(), url.clone(), value.clone());
        tasks.push(tokio::spawn(async move {
            let r = http.post(&url).header("payment-signature", value).body("{}").send().await.unwrap();
            (r.status().as_u16(), refusal(&r))
        }));
    }
    let mut ok = 0;
    for t in tasks {
        let (status, reason) = t.await.unwrap();
        match status {
            200 => ok += 1,
            402 => assert!(
                matches!(
                    reason.as_deref(),
                    Some("invalid_exact_evm_nonce_in_flight" | "invalid_exact_evm_nonce_already_used")
                ),
                "{reason:?}"
            ),
            s => panic!("status {s}"),
        }
    }
    assert_eq!(ok, 1);
    assert_eq!(e.server.served.load(Ordering::SeqCst), 1);
    assert_eq!(e.chain.balance(payer.address()).await.unwrap(), 1_000_000 - PRICE);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handler_errors_settle_nothing_and_failed_settlements_serve_nothing() {
    let e = env().await;
    let req = payment_required(&e.http, &format!("{}/fail", e.server.url)).await.unwrap();
    let payer = PrivateKeySigner::random();
    e.chain.mint(payer.address(), 1_000_000).await.unwrap();
    let p = signed_payment(&payer, &req.accepts[0], &e.chain.asset, |_| {});
    let nonce: B256 = p.payload.authorization.nonce.parse().unwrap();
    let r = e
        .http
        .post(format!("{}/fail", e.server.url))
        .header("payment-signature", header::encode(&p))
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 500);
    assert!(r.headers().get(header::PAYMENT_RESPONSE).is_none());
    assert!(!e.chain.nonce_used(payer.address(), nonce).await.unwrap(), "not settled");
    assert_eq!(e.chain.balance(payer.address()).await.unwrap(), 1_000_000);
    assert!(e.server.events.all().contains(&"not_settled:500".to_owned()));
    // The unspent authorization still pays for a call that succeeds.
    let r = e
        .http
        .post(format!("{}/echo", e.server.url))
        .header("payment-signature", header::encode(&p))
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);

    // Settlement failure: the payer (anvil key 3, who has gas) empties its account while
    // the handler runs; the answer is withheld.
    let drainer: PrivateKeySigner = ANVIL_KEY_3.parse().unwrap();
    e.chain.mint(drainer.address(), 1_000_000).await.unwrap();
    let p = signed_payment(&drainer, &req.accepts[0], &e.chain.asset, |_| {});
    let r = e
        .http
        .post(format!("{}/drain", e.server.url))
        .header("payment-signature", header::encode(&p))
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 402);
    let s = header::decode_payment_response(r.headers().get(header::PAYMENT_RESPONSE).unwrap().as_bytes()).unwrap();
    assert!(!s.success);
    assert_eq!(s.error_reason.as_deref(), Some("invalid_exact_evm_insufficient_balance"));
    assert!(r.bytes().await.unwrap().is_empty(), "no body after a failed settlement");
    assert_eq!(e.server.pay_to, e.server.pay_to);
    assert_eq!(e.chain.balance(e.server.pay_to).await.unwrap(), PRICE, "only the first call paid");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn v1_payments_and_the_http_facilitator() {
    let e = env().await;
    // A second server of the same seller (same payTo) whose layer talks to the first one's
    // facilitator routes over HTTP, and reads the chain itself to check each settlement.
    let remote: Arc<dyn Facilitator> =
        Arc::new(HttpFacilitator::new(&format!("{}/facilitator", e.server.url), Duration::from_secs(30)).unwrap());
    let supported = remote.supported().await;
    assert!(supported.kinds.iter().any(|k| k.x402_version == 2 && k.network == "eip155:31337"), "{supported:?}");
    let local: Arc<dyn Facilitator> = e.chain.facilitator().await.unwrap();
    let second = PaidServer::start_paying(&e.chain, remote, local, e.server.pay_to).await.unwrap();

    let payer = PrivateKeySigner::random();
    e.chain.mint(payer.address(), 1_000_000).await.unwrap();
    let key = format!("0x{}", mindxtrain_x402::alloy::hex::encode(payer.credential().to_bytes()));
    let results = tokio::task::spawn_blocking({
        let url = format!("{}/echo", second.url);
        let usdc = e.chain.usdc;
        move || run_npm_client(&url, &key, usdc, &[])
    })
    .await
    .unwrap();
    assert_eq!(results[0]["status"], 200, "{}", results[0]);
    assert_eq!(e.chain.balance(second.pay_to).await.unwrap(), PRICE);
    let settled: Vec<String> = second.events.all().into_iter().filter(|e| e.starts_with("settled:")).collect();
    assert_eq!(settled.len(), 1, "the remote settlement was checked on chain and recorded: {:?}", second.events.all());

    // v1: X-PAYMENT in, X-PAYMENT-RESPONSE out; the 402 body lists v1 requirements.
    let url = format!("{}/echo", e.server.url);
    let r = e.http.post(&url).body("{}").send().await.unwrap();
    let body: serde_json::Value = r.json().await.unwrap();
    assert_eq!(body["accepts"][0]["maxAmountRequired"], PRICE.to_string());
    let req = payment_required(&e.http, &url).await.unwrap();
    let v2 = signed_payment(&payer, &req.accepts[0], &e.chain.asset, |_| {});
    let v1 = PaymentPayloadV1 {
        x402_version: 1,
        scheme: "exact".into(),
        network: "eip155:31337".into(),
        payload: v2.payload,
    };
    let r = e.http.post(&url).header("x-payment", header::encode(&v1)).body(r#"{"v":1}"#).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let s = header::decode_payment_response(r.headers().get(header::X_PAYMENT_RESPONSE).unwrap().as_bytes()).unwrap();
    assert!(s.success);
    assert_eq!(e.chain.balance(payer.address()).await.unwrap(), 1_000_000 - 2 * PRICE);
}
