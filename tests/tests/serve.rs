//! Serving through the `mindxtrain` binary: the official OpenAI Python client against
//! `serve` (whole and streamed completions, stop sequences, errors, refused parameters, tools),
//! the recipe's `serve` section carried out (where it listens, `enabled`, `max_model_len`), the
//! reference npm x402 client paying for a completion on anvil, two nodes renting from each
//! other with `mindxtrain rent`, and a full queue answering 429 with Retry-After.

use mindxtrain_tests::served::{
    MODEL, PRICE, Server, key_file, new_node, ok, post_json_blocking, recipe_with_serve, s, trained,
};
use mindxtrain_tests::x402_env::{ANVIL_KEY_1, ANVIL_KEY_2, Chain, run_npm_client};
use mindxtrain_tests::{mindxtrain, openai_python};
use mindxtrain_x402::alloy::primitives::{Address, B256};
use mindxtrain_x402::alloy::providers::Provider;
use mindxtrain_x402::alloy::signers::local::PrivateKeySigner;
use serde_json::{Value, json};
use std::path::{Path, PathBuf};

fn events(node: &Path) -> Vec<Value> {
    let v = ok(mindxtrain(node, &["--json", "log", "show"]).output().unwrap());
    v["events"].as_array().or(v.as_array()).cloned().unwrap_or_default()
}

fn kinds(node: &Path, prefix: &str) -> Vec<String> {
    events(node)
        .iter()
        .filter_map(|e| e["kind"].as_str().or(e["envelope"]["kind"].as_str()))
        .filter(|k| k.starts_with(prefix))
        .map(String::from)
        .collect()
}

#[test]
fn the_openai_python_client_completes_and_streams() {
    let python = openai_python().expect("OpenAI client venv");
    let t = trained(2);
    let node = new_node(&t, "node");
    let server = Server::start(&node, &t, &["--free"]);
    let out = std::process::Command::new(python)
        .arg(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("python/openai_client.py"))
        .args([&server.url, MODEL])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let r: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(r["models"], json!([MODEL]));
    assert_eq!(r["retrieved"], MODEL);
    assert_eq!(r["object"], "chat.completion");
    let completion = r["usage"]["completion_tokens"].as_u64().unwrap();
    assert!((1..=24).contains(&completion), "{r}");
    assert_eq!(r["usage"]["total_tokens"], r["usage"]["prompt_tokens"].as_u64().unwrap() + completion);
    assert!(r["finish"] == "stop" || r["finish"] == "length", "{r}");
    // Greedy with the same seed: the stream is the same answer, in pieces.
    assert_eq!(r["stream_text"], r["text"], "{r}");
    assert_eq!(r["stream_finish"], r["finish"]);
    assert_eq!(r["stream_usage"], r["usage"]);
    assert_eq!(r["stream_roles"], json!(["assistant"]));
    if let Some(stop) = r.get("stop") {
        let text = r["text"].as_str().unwrap();
        let seq = stop["sequence"].as_str().unwrap();
        assert_eq!(stop["text"].as_str().unwrap(), &text[..text.find(seq).unwrap()], "{r}");
        assert_eq!(stop["finish"], "stop");
    }
    assert_eq!(r["wrong_model"], json!({"status": 404, "code": "model_not_found"}));
}

#[test]
fn the_openai_python_client_gets_refusals_by_name_and_tools_on_a_tool_calling_recipe() {
    let python = openai_python().expect("OpenAI client venv");
    let t = trained(2);
    let node = new_node(&t, "node");
    let recipe =
        t.recipe_serving("tools.yaml", "{max_model_len: 1024, max_batch: 2, reasoning: true, tool_calls: true}");
    let server = Server::start_as(&node, &t, &recipe, &["--free"]);
    let out = std::process::Command::new(python)
        .arg(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("python/openai_contract.py"))
        .args([&server.url, MODEL])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let r: Value = serde_json::from_slice(&out.stdout).unwrap();
    // Each refusal is an openai.BadRequestError naming the parameter.
    for (name, code) in [
        ("presence_penalty", "unsupported_parameter"),
        ("response_format", "unsupported_parameter"),
        ("logit_bias", "unsupported_parameter"),
        ("min_p", "unsupported_parameter"),
        ("frobnicate", "unknown_parameter"),
        ("tool_choice", "unsupported_parameter"),
    ] {
        let refusal = &r["refused"][name];
        assert_eq!((refusal["status"].as_u64(), refusal["param"].as_str()), (Some(400), Some(name)), "{r}");
        assert_eq!(refusal["code"], code, "{name}: {refusal}");
    }
    assert!(
        r["refused"]["frobnicate"]["message"]
            .as_str()
            .unwrap()
            .contains("Unrecognized request argument supplied: frobnicate")
    );
    assert_eq!(r["neutral"]["object"], "chat.completion", "values that change nothing are served: {r}");
    // The tools reach the chat template, and tool_choice none keeps them out.
    let tokens = &r["prompt_tokens"];
    assert!(tokens["tools"].as_u64().unwrap() > tokens["plain"].as_u64().unwrap() + 100, "{tokens}");
    assert_eq!(tokens["tools_none"], tokens["plain"], "{tokens}");
    // A call and its result are accepted and rendered; the answer has the message's shape.
    let answered = &r["answered"];
    assert_eq!(answered["role"], "assistant");
    assert!(answered["prompt_tokens"].as_u64().unwrap() > tokens["tools"].as_u64().unwrap() + 40, "{r}");
    // A micro model on random weights writes no well-formed call: its text is the content, and
    // the stream is the same answer.
    assert_eq!(answered["tool_calls"], json!([]), "{answered}");
    assert!(answered["finish"] == "stop" || answered["finish"] == "length", "{answered}");
    assert_eq!(r["streamed"]["content"], answered["content"], "{r}");
    assert_eq!((&r["streamed"]["tool_calls"], &r["streamed"]["finish"]), (&json!([]), &answered["finish"]));
    assert_eq!(r["unknown_route"], json!({"status": 404, "code": "unknown_url", "param": null}));
}

/// A loopback port free right now (ports the recipe rules allow are 1024 and up; the
/// ephemeral range is above that).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

#[test]
fn serve_listens_where_the_recipe_says_and_bounds_requests_by_its_max_model_len() {
    let t = trained(1);
    let node = new_node(&t, "node");
    let port = free_port();
    let recipe = t.recipe_serving("here.yaml", &format!("{{host: 127.0.0.1, port: {port}, max_model_len: 160}}"));
    let checkpoint = s(&t.checkpoint);
    let here = Server::spawn(&node, &["serve", s(&recipe), "--checkpoint", checkpoint, "--free"]);
    assert_eq!(here.url, format!("http://127.0.0.1:{port}"), "{}", here.started);
    // --listen overrides the recipe.
    let other = new_node(&t, "other");
    let roomy = t.recipe_serving("roomy.yaml", &format!("{{host: 127.0.0.1, port: {port}, max_model_len: 1024}}"));
    let elsewhere = Server::start_as(&other, &t, &roomy, &["--free"]);
    assert_ne!(elsewhere.url, here.url);

    // A prompt over the first recipe's max_model_len (160) fits the second's (1024).
    let long = json!({"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": "word ".repeat(60)}]});
    let ask = |url: &str| post_json_blocking(&format!("{url}/v1/chat/completions"), &long);
    let (status, body) = ask(&here.url);
    assert_eq!((status, body["error"]["code"].as_str()), (400, Some("context_length_exceeded")), "{body}");
    let (status, body) = ask(&elsewhere.url);
    assert_eq!(status, 200, "{body}");
}

#[test]
fn a_recipe_with_serve_enabled_false_is_not_served() {
    let dir = tempfile::tempdir().unwrap();
    let node = dir.path().join("node");
    ok(mindxtrain(&node, &["init"]).output().unwrap());
    let recipe = dir.path().join("private.yaml");
    // Without its sale: billing needs a served model.
    let yaml = recipe_with_serve("{enabled: false, max_model_len: 160}");
    std::fs::write(&recipe, yaml.split("publish:").next().unwrap()).unwrap();
    let out = mindxtrain(&node, &["serve", s(&recipe), "--checkpoint", s(&dir.path().join("final")), "--free"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("serve.enabled is false"), "{err}");
    // The operator API alone still runs on that node.
    let api = Server::run(&node, &["serve"]);
    assert_eq!(api.started["model"], Value::Null);
}

#[test]
fn a_full_queue_is_refused_with_429_and_retry_after() {
    let t = trained(1);
    let node = new_node(&t, "node");
    let server = Server::start(&node, &t, &["--free"]);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let answers = rt.block_on(async {
        let http = reqwest::Client::new();
        let body = json!({"model": MODEL, "max_tokens": 120, "temperature": 1.0, "seed": 9,
            "messages": [{"role": "user", "content": "Count."}]});
        let calls = (0..60).map(|_| {
            let (http, url, body) = (http.clone(), format!("{}/v1/chat/completions", server.url), body.clone());
            tokio::spawn(async move {
                let r = http.post(url).json(&body).send().await.unwrap();
                let retry = r.headers().get("retry-after").map(|v| v.to_str().unwrap().parse::<u64>().unwrap());
                let status = r.status().as_u16();
                let body: Value = r.json().await.unwrap();
                (status, retry, body)
            })
        });
        let mut out = vec![];
        for c in calls.collect::<Vec<_>>() {
            out.push(c.await.unwrap());
        }
        out
    });
    let served = answers.iter().filter(|a| a.0 == 200).count();
    let refused: Vec<_> = answers.iter().filter(|a| a.0 == 429).collect();
    assert_eq!(served + refused.len(), answers.len(), "only 200 or 429: {answers:?}");
    // One slot and eight places in the queue: at least nine are served, the rest wait or go.
    assert!(served >= 9, "{served} served");
    assert!(!refused.is_empty(), "60 simultaneous requests on one slot: none refused");
    for (_, retry, body) in refused {
        assert!(retry.is_some_and(|s| s >= 1), "429 without Retry-After");
        assert_eq!(body["error"]["code"], "queue_full");
    }
    // The engine's load and latencies are on /metrics: idle again, every block free, one
    // first-token time per served completion.
    let metrics = rt.block_on(async {
        let r = reqwest::Client::new().get(format!("{}/metrics", server.url)).bearer_auth(Server::token(&node));
        r.send().await.unwrap().text().await.unwrap()
    });
    let value = |name: &str| -> f64 {
        let line =
            metrics.lines().find(|l| l.starts_with(&format!("{name} "))).unwrap_or_else(|| panic!("{name} missing"));
        line.split_whitespace().nth(1).unwrap().parse().unwrap()
    };
    assert_eq!(value("mindxtrain_engine_running"), 0.0, "{metrics}");
    assert_eq!(value("mindxtrain_engine_kv_blocks_used"), 0.0);
    assert!(value("mindxtrain_engine_kv_blocks_total") > 0.0);
    assert_eq!(value("mindxtrain_engine_time_to_first_token_seconds_count"), served as f64, "{metrics}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paid_completions_and_two_nodes_renting_from_each_other() {
    let t = tokio::task::spawn_blocking(|| trained(2)).await.unwrap();
    let chain = Chain::start().await.expect("anvil + TestUSDC");
    let usdc = format!("{}", chain.usdc);
    let (a, b) = (new_node(&t, "node-a"), new_node(&t, "node-b"));
    let (pay_a, pay_b) = (PrivateKeySigner::random().address(), PrivateKeySigner::random().address());
    let sell = |node: &Path, settler: &str, pay_to: Address| {
        let key = key_file(node, "settler.key", settler);
        let pay_to = pay_to.to_string();
        let args = ["--rpc-url", &chain.rpc, "--settler-key", s(&key), "--asset", &usdc, "--pay-to", &pay_to];
        Server::start(node, &t, &args)
    };
    let server_b = sell(&b, ANVIL_KEY_2, pay_b);

    // Node A's wallet rents two calls from B while A is not serving: A's log records it.
    let wallet_a = PrivateKeySigner::random();
    chain.mint(wallet_a.address(), 1_000_000).await.unwrap();
    let wallet_a_key = key_file(&a, "wallet.key", &format!("0x{}", hex::encode(wallet_a.to_bytes())));
    let rent = |node: &Path, seller: &Path, from: &str, key: &Path| {
        let args = [
            "--json",
            "rent",
            "--from",
            from,
            "--model",
            MODEL,
            "--calls",
            "2",
            "--key",
            s(key),
            "--max-price",
            "0.05",
        ];
        let out = mindxtrain(node, &args).output().unwrap();
        if !out.status.success() {
            let refusals: Vec<Value> =
                events(seller).into_iter().filter(|e| e.to_string().contains("payment.rejected")).collect();
            panic!("rent failed: {}\nseller's refusals: {refusals:?}", String::from_utf8_lossy(&out.stderr));
        }
        ok(out)
    };
    let a_from_b = tokio::task::block_in_place(|| rent(&a, &b, &server_b.url, &wallet_a_key));
    assert_eq!(a_from_b["amount"], (2 * PRICE).to_string());
    assert_eq!(a_from_b["recorded"], true);
    assert_eq!(kinds(&a, "rental."), ["rental.acquired"]);

    // Now A serves too, and B's wallet rents from A (B is serving: its log is busy).
    let server_a = sell(&a, ANVIL_KEY_1, pay_a);
    let wallet_b = PrivateKeySigner::random();
    chain.mint(wallet_b.address(), 1_000_000).await.unwrap();
    let wallet_b_key = key_file(&b, "wallet.key", &format!("0x{}", hex::encode(wallet_b.to_bytes())));
    let b_from_a = tokio::task::block_in_place(|| rent(&b, &a, &server_a.url, &wallet_b_key));
    assert_eq!(b_from_a["payer"], wallet_b.address().to_checksum(None));

    // Each token works on the node that sold it, and only there.
    let http = reqwest::Client::new();
    let ask = json!({"model": MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]});
    let call = |url: &str, token: &str| {
        http.post(format!("{url}/v1/chat/completions")).bearer_auth(token.to_string()).json(&ask).send()
    };
    let token_b = a_from_b["token"].as_str().unwrap();
    let token_a = b_from_a["token"].as_str().unwrap();
    assert_eq!(call(&server_a.url, token_b).await.unwrap().status(), 401, "B's token is not A's");
    let statuses = [
        call(&server_b.url, token_b).await.unwrap().status().as_u16(),
        call(&server_b.url, token_b).await.unwrap().status().as_u16(),
        call(&server_b.url, token_b).await.unwrap().status().as_u16(),
    ];
    assert_eq!(statuses, [200, 200, 403]);
    assert_eq!(call(&server_a.url, token_a).await.unwrap().status(), 200);
    let id = b_from_a["id"].as_str().unwrap();
    let state: Value =
        http.get(format!("{}/v1/rentals/{id}", server_a.url)).send().await.unwrap().json().await.unwrap();
    assert_eq!(
        (state["calls_used"].clone(), state["calls_left"].clone(), state["status"].clone()),
        (json!(1), json!(1), json!("open"))
    );

    // The reference npm client pays A per call; the settlement is on chain.
    let npm_key = PrivateKeySigner::random();
    chain.mint(npm_key.address(), 1_000_000).await.unwrap();
    let (url, key, asset) =
        (format!("{}/v1/chat/completions", server_a.url), format!("0x{}", hex::encode(npm_key.to_bytes())), chain.usdc);
    let body = ask.to_string();
    let paid =
        tokio::task::spawn_blocking(move || run_npm_client(&url, &key, asset, &["--body", &body])).await.unwrap();
    assert_eq!(paid[0]["status"], 200, "{paid:?}");
    let completion: Value = serde_json::from_str(paid[0]["body"].as_str().unwrap()).unwrap();
    assert_eq!(completion["object"], "chat.completion");
    let tx: B256 = paid[0]["paymentResponse"]["transaction"].as_str().unwrap().parse().unwrap();
    assert!(chain.admin.get_transaction_receipt(tx).await.unwrap().is_some_and(|r| r.status()));

    // Balances moved by exactly the prices: A sold 2 rented calls + 1 call, B sold 2.
    assert_eq!(chain.balance(pay_a).await.unwrap(), 3 * PRICE);
    assert_eq!(chain.balance(pay_b).await.unwrap(), 2 * PRICE);
    assert_eq!(chain.balance(npm_key.address()).await.unwrap(), 1_000_000 - PRICE);
    // Killed (SIGKILL) straight after the paid answer: its settlement is on A's log already.
    drop(server_a);
    drop(server_b);
    let settled_tx = events(&a).iter().any(|e| {
        let e = if e["envelope"].is_object() { &e["envelope"] } else { e };
        e["kind"] == "payment.settled" && e["data"]["tx"] == tx.to_string()
    });
    assert!(settled_tx, "payment.settled for {tx} is durable before the answer leaves");
    let a_rentals = kinds(&a, "rental.");
    assert_eq!(a_rentals, ["rental.acquired", "rental.opened", "rental.used"], "A's log");
    assert_eq!(kinds(&b, "rental."), ["rental.opened", "rental.used", "rental.used", "rental.closed"], "B's log");
    let a_payments = kinds(&a, "payment.");
    assert_eq!(a_payments.iter().filter(|k| *k == "payment.settled").count(), 2, "{a_payments:?}");
    assert_eq!(a_payments.iter().filter(|k| *k == "payment.verified").count(), 2, "{a_payments:?}");
}
