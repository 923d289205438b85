//! A node's own chain from the command line: `chain up --detach` keeps the embedded anvil
//! running at a URL every command of the node (and anyone else) uses, `chain deploy
//! --test-usdc` puts the registry and a test token on it, and `serve` sells a model there with
//! nothing more than a settler key; what is missing is named with the command that gives it.

use mindxtrain_tests::served::{self, Server, s};
use mindxtrain_tests::x402_env::{ANVIL_KEY_1, payment_required_for};
use mindxtrain_tests::{micro, mindxtrain};
use serde_json::Value;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_sells_on_the_nodes_own_chain_once_it_is_up_and_deployed() {
    let t = served::trained(1);
    let node = served::new_node(&t, "seller");
    let serve = ["serve", s(&t.recipe), "--checkpoint", s(&t.checkpoint), "--listen", "127.0.0.1:0"];
    let stderr = |o: &std::process::Output| String::from_utf8_lossy(&o.stderr).into_owned();

    // Nothing set up: the refusal names each command that is missing, before serving.
    let o = mindxtrain(&node, &serve).output().unwrap();
    assert_eq!(o.status.code(), Some(1));
    let e = stderr(&o);
    for want in ["mindxtrain chain up", "mindxtrain chain deploy --test-usdc", "--settler-key", "--free"] {
        assert!(e.contains(want), "{want:?} in {e}");
    }

    let up =
        micro::ok_json(&mindxtrain(&node, &["--json", "chain", "up", "--detach", "--port", "0"]).output().unwrap());
    let rpc = up["rpc_url"].as_str().unwrap().to_owned();
    let again = mindxtrain(&node, &["chain", "up", "--detach", "--port", "0"]).output().unwrap();
    assert_eq!(again.status.code(), Some(1), "one chain per node");
    assert!(stderr(&again).contains("chain down"), "{}", stderr(&again));
    let deployed = micro::ok_json(&mindxtrain(&node, &["--json", "chain", "deploy", "--test-usdc"]).output().unwrap());
    let token = deployed["deployment"]["test_usdc"].as_str().unwrap().to_owned();
    // The deployment went to the running chain: another client reaches it at its URL.
    let status =
        micro::ok_json(&mindxtrain(&node, &["--json", "chain", "status", "--rpc-url", &rpc]).output().unwrap());
    assert_eq!(status["ok"], true, "{status}");
    let kinds: Vec<String> =
        served::ok(mindxtrain(&node, &["--json", "log", "show", "--kind", "chain."]).output().unwrap())
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["data"]["contract"].as_str().unwrap().to_owned())
            .collect();
    assert_eq!(kinds, ["Registry", "TestUSDC"]);

    // Now only the settler key is missing; the endpoint and the token come from the node.
    let o = mindxtrain(&node, &serve).output().unwrap();
    assert_eq!(o.status.code(), Some(1));
    let e = stderr(&o);
    assert!(e.contains("--settler-key") && !e.contains("chain up"), "{e}");
    let key = served::key_file(&t.root, "settler.key", ANVIL_KEY_1.trim_start_matches("0x"));
    let server = Server::start(&node, &t, &["--settler-key", s(&key)]);
    assert_eq!(server.started["price_per_call"], served::PRICE);
    let ask = serde_json::json!({"model": served::MODEL, "messages": [{"role": "user", "content": "hi"}]}).to_string();
    let url = format!("{}/v1/chat/completions", server.url);
    let required = payment_required_for(&reqwest::Client::new(), &url, &ask).await.unwrap();
    let offer: Value = serde_json::to_value(&required.accepts[0]).unwrap();
    assert_eq!(offer["asset"].as_str().unwrap().to_lowercase(), token.to_lowercase(), "{offer}");
    assert_eq!(offer["network"], "eip155:31337");
    drop(server);

    let down = micro::ok_json(&mindxtrain(&node, &["--json", "chain", "down"]).output().unwrap());
    assert_eq!(down["stopped"], true);
    assert!(reqwest::Client::new().post(&rpc).send().await.is_err(), "{rpc} still answers");
    // Its state was saved: the registry is there when the chain comes back.
    let status = micro::ok_json(&mindxtrain(&node, &["--json", "chain", "status"]).output().unwrap());
    assert_eq!(status["ok"], true, "{status}");
}
