//! Anchoring against a real anvil on a free loopback port: the chain crate's API and the
//! `mindxtrain` commands built on it.

use mindxtrain_chain::alloy::providers::Provider;
use mindxtrain_chain::anvil::{AnvilOptions, LocalAnvil, StateFile};
use mindxtrain_chain::batch::Batch;
use mindxtrain_chain::deploy::deploy_registry;
use mindxtrain_chain::merkle::Hash;
use mindxtrain_chain::rpc::RetryPolicy;
use mindxtrain_chain::{Address, AnchorKey, AnchorStep, Anchorer, AnchorerConfig, B256, ChainError};
use mindxtrain_tests::mindxtrain;
use serde_json::Value;
use std::path::Path;
use std::process::Output;
use std::sync::Mutex;
use std::time::Duration;

fn digest(i: u64) -> Hash {
    *blake3::hash(&i.to_le_bytes()).as_bytes()
}

fn root(i: u64) -> B256 {
    B256::from(digest(1_000_000 + i))
}

async fn deployed(anvil: &LocalAnvil) -> (Anchorer, Address) {
    let key = AnchorKey::development();
    let d = deploy_registry(&anvil.endpoint(), &key, Some(31337)).await.expect("deploy");
    let cfg = AnchorerConfig::new(anvil.endpoint(), 31337, d.address).with_key(key);
    (Anchorer::new(cfg).unwrap(), d.address)
}

async fn nonce(a: &Anchorer) -> u64 {
    a.provider().get_transaction_count(a.account().unwrap()).await.unwrap()
}

#[tokio::test]
async fn deploy_anchor_lookup_and_a_repeat_sends_nothing() {
    let anvil = LocalAnvil::start(AnvilOptions::default()).unwrap();
    let (anchorer, registry) = deployed(&anvil).await;
    let r = root(1);
    assert_eq!(anchorer.lookup(r).await.unwrap(), None);

    let steps = Mutex::new(Vec::new());
    let first = anchorer.anchor_observed(r, &|s: &AnchorStep| steps.lock().unwrap().push(s.clone())).await.unwrap();
    assert!(!first.already_anchored);
    let gas = first.gas_used.expect("our tx was mined");
    assert!((40_000..60_000).contains(&gas), "anchor gas {gas}");
    let steps = steps.into_inner().unwrap();
    assert!(
        matches!(steps.as_slice(), [AnchorStep::Submitted { tx, .. }] if Some(*tx) == first.record.tx),
        "{steps:?}"
    );

    let rec = anchorer.lookup(r).await.unwrap().expect("anchored");
    assert_eq!(rec, first.record);
    assert_eq!(rec.by, anchorer.account().unwrap());
    assert!(rec.timestamp > 1_700_000_000 && rec.block >= 2, "{rec:?}");

    // A repeat is success without a second transaction (no revert, no nonce used).
    let before = nonce(&anchorer).await;
    let again = anchorer.anchor(r).await.unwrap();
    assert!(again.already_anchored);
    assert_eq!(again.record, rec);
    assert_eq!(nonce(&anchorer).await, before);

    // A read-only client sees the same record and cannot write.
    let reader = Anchorer::new(AnchorerConfig::new(anvil.endpoint(), 31337, registry)).unwrap();
    assert_eq!(reader.lookup(r).await.unwrap(), Some(rec));
    assert!(matches!(reader.anchor(root(2)).await, Err(ChainError::ReadOnly)));
}

#[tokio::test]
async fn concurrent_anchors_use_consecutive_nonces_and_one_root_is_sent_once() {
    let anvil = LocalAnvil::start(AnvilOptions::default()).unwrap();
    let (anchorer, _) = deployed(&anvil).await;
    let start = nonce(&anchorer).await;
    let distinct: Vec<_> = (10..18)
        .map(|i| {
            let a = anchorer.clone();
            tokio::spawn(async move { a.anchor(root(i)).await })
        })
        .collect();
    for h in distinct {
        assert!(!h.await.unwrap().unwrap().already_anchored);
    }
    assert_eq!(nonce(&anchorer).await, start + 8);

    let same: Vec<_> = (0..4)
        .map(|_| {
            let a = anchorer.clone();
            tokio::spawn(async move { a.anchor(root(99)).await })
        })
        .collect();
    let mut fresh = 0;
    for h in same {
        fresh += usize::from(!h.await.unwrap().unwrap().already_anchored);
    }
    assert_eq!(fresh, 1, "exactly one task sent the anchor");
    assert_eq!(nonce(&anchorer).await, start + 9);
}

#[tokio::test]
async fn anvil_killed_and_restarted_mid_run_then_the_retry_succeeds() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state.json");
    let opts = AnvilOptions {
        state: Some(StateFile::LoadAndDump(state.clone())),
        state_interval: Some(1),
        ..Default::default()
    };
    let mut anvil = LocalAnvil::start(opts.clone()).unwrap();
    let port = anvil.port();
    let (anchorer, registry) = deployed(&anvil).await;
    anchorer.anchor(root(1)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(1600)).await; // one periodic dump
    anvil.kill(); // SIGKILL: no dump on exit

    let quick = RetryPolicy {
        attempts: 30,
        first_backoff: Duration::from_millis(100),
        max_backoff: Duration::from_millis(400),
        call_timeout: Duration::from_secs(5),
    };
    let cfg = AnchorerConfig::new(format!("http://127.0.0.1:{port}"), 31337, registry)
        .with_key(AnchorKey::development())
        .with_retry(quick);
    let anchorer = Anchorer::new(cfg).unwrap();
    let retries = Mutex::new(0u32);
    let restart = tokio::task::spawn_blocking(move || {
        std::thread::sleep(Duration::from_millis(1200));
        LocalAnvil::start(AnvilOptions { port: Some(port), ..opts }).unwrap()
    });
    let anchored = anchorer
        .anchor_observed(root(2), &|s: &AnchorStep| {
            if matches!(s, AnchorStep::Retrying { .. }) {
                *retries.lock().unwrap() += 1;
            }
        })
        .await
        .expect("anchoring succeeds once anvil is back");
    let _anvil = restart.await.unwrap();
    assert!(*retries.lock().unwrap() >= 1, "the outage was noticed");
    assert!(!anchored.already_anchored);
    // The state from before the crash survived: the first root is still anchored.
    assert!(anchorer.lookup(root(1)).await.unwrap().is_some());
}

#[tokio::test]
async fn wrong_chain_missing_contract_and_no_funds_are_typed_errors() {
    let anvil = LocalAnvil::start(AnvilOptions::default()).unwrap();
    let (_, registry) = deployed(&anvil).await;
    let key = AnchorKey::development();

    let wrong = Anchorer::new(AnchorerConfig::new(anvil.endpoint(), 8453, registry).with_key(key.clone())).unwrap();
    match wrong.anchor(root(1)).await {
        Err(ChainError::WrongChainId { expected: 8453, actual: 31337 }) => {}
        other => panic!("expected WrongChainId, got {other:?}"),
    }
    let nowhere = Address::repeat_byte(0x42);
    let missing = Anchorer::new(AnchorerConfig::new(anvil.endpoint(), 31337, nowhere).with_key(key)).unwrap();
    match missing.anchor(root(1)).await {
        Err(ChainError::ContractMissing { address }) => assert_eq!(address, nowhere),
        other => panic!("expected ContractMissing, got {other:?}"),
    }
    assert!(missing.lookup(root(1)).await.unwrap_err().to_string().contains("chain deploy"));

    let poor = AnchorKey::from_secret_bytes(&[0x42; 32]).unwrap();
    let broke = Anchorer::new(AnchorerConfig::new(anvil.endpoint(), 31337, registry).with_key(poor.clone())).unwrap();
    match broke.anchor(root(1)).await {
        Err(ChainError::InsufficientFunds { address, .. }) => assert_eq!(address, poor.address()),
        other => panic!("expected InsufficientFunds, got {other:?}"),
    }
}

#[tokio::test]
async fn sixty_four_digests_in_one_transaction_each_proven_against_the_chain() {
    let anvil = LocalAnvil::start(AnvilOptions::default()).unwrap();
    let (anchorer, registry) = deployed(&anvil).await;
    let digests: Vec<Hash> = (0..64).map(digest).collect();
    let batch = Batch::new(digests.clone()).unwrap();
    let before = nonce(&anchorer).await;
    let anchored = anchorer.anchor(B256::from(batch.root())).await.unwrap();
    assert_eq!(nonce(&anchorer).await, before + 1, "one transaction for the whole batch");
    let rec = anchored.record.clone();
    let at = mindxtrain_chain::AnchorPlace {
        chain_id: 31337,
        registry,
        tx: rec.tx.unwrap(),
        block: rec.block,
        timestamp: rec.timestamp,
    };
    let onchain = anchorer.lookup(B256::from(batch.root())).await.unwrap();
    for d in &digests {
        let p = batch.proof(d, &at).unwrap();
        assert_eq!(p.tree_size, 64);
        let back = mindxtrain_chain::BatchProof::from_json(&p.to_json().to_string()).unwrap();
        back.verify_against(onchain.as_ref()).unwrap();
    }
    // A digest outside the batch has no proof, and a forged one fails.
    let mut forged = batch.proof(&digests[5], &at).unwrap();
    forged.digest = digest(64);
    assert!(forged.verify_against(onchain.as_ref()).is_err());
}

// ------------------------------------------------------------------ the CLI

fn run(dir: &Path, args: &[&str]) -> Output {
    mindxtrain(dir, args).env_remove("MINDXTRAIN_ANCHOR_KEY").output().expect("run mindxtrain")
}

fn json(o: &Output) -> Value {
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| {
        panic!("{e}: stdout {} stderr {}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
    })
}

fn ok(o: &Output) -> &Output {
    assert!(
        o.status.success(),
        "status {:?}\nstdout {}\nstderr {}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    o
}

fn kinds(dir: &Path, kind: &str) -> Vec<Value> {
    json(ok(&run(dir, &["log", "show", "--kind", kind, "--json"]))).as_array().unwrap().clone()
}

#[test]
fn cli_embedded_chain_deploy_anchor_list_verify() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("node");
    ok(&run(&dir, &["init"]));

    let no_chain = run(&dir, &["anchor"]);
    assert_eq!(no_chain.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&no_chain.stderr).contains("chain deploy"));

    let d = json(ok(&run(&dir, &["chain", "deploy", "--json"])));
    assert_eq!(d["deployment"]["chain_id"], 31337);
    assert!(dir.join("chain.json").is_file());
    assert!(dir.join("chain/anvil-state.json").is_file(), "embedded chain saved on exit");
    assert_eq!(run(&dir, &["chain", "deploy"]).status.code(), Some(1), "no silent redeploy");

    let manifest = hex::encode(digest(7));
    let a = json(ok(&run(
        &dir,
        &["anchor", "--batch", "--digest", &manifest, "--label", "manifest", "--confirmations", "2", "--json"],
    )));
    let batches = a["batches"].as_array().unwrap();
    assert_eq!(batches.len(), 1);
    let items = batches[0]["items"].as_array().unwrap();
    assert_eq!(items.len(), 2, "the manifest digest and the fresh log checkpoint: {items:?}");
    assert_eq!(batches[0]["confirmations"], 2);
    let tx = batches[0]["tx"].as_str().unwrap().to_string();

    // Every step is in the signed log.
    let submitted = kinds(&dir, "anchor.submitted");
    let confirmed = kinds(&dir, "anchor.confirmed");
    assert_eq!(submitted.len(), 1);
    assert_eq!(confirmed.len(), 1);
    assert_eq!(submitted[0]["data"]["tx"], tx.as_str());
    assert_eq!(confirmed[0]["data"]["tx"], tx.as_str());
    assert!(submitted[0]["seq"].as_u64() < confirmed[0]["seq"].as_u64());
    assert_eq!(kinds(&dir, "chain.deployed").len(), 1);
    ok(&run(&dir, &["log", "verify"]));

    let list = json(ok(&run(&dir, &["anchors", "--json"])));
    assert_eq!(list["anchors"].as_array().unwrap().len(), 1);
    assert_eq!(list["pending"].as_array().unwrap().len(), 0);

    // Verified against the chain, which the node restarts from its saved state.
    let v = json(ok(&run(&dir, &["anchor", "verify", &manifest, "--json"])));
    assert_eq!(v["anchored"], true);
    assert_eq!(v["record"]["tx"], tx.as_str());
    let proof_file = tmp.path().join("proof.json");
    std::fs::write(&proof_file, v["proof"].to_string()).unwrap();
    ok(&run(&dir, &["anchor", "verify", "--proof", proof_file.to_str().unwrap(), "--offline"]));
    let unknown = run(&dir, &["anchor", "verify", &hex::encode(digest(8))]);
    assert_eq!(unknown.status.code(), Some(3));
    assert_eq!(run(&dir, &["anchor", "verify", "xyz"]).status.code(), Some(4));
    assert_eq!(run(&dir, &["anchor", "--digest", "xyz"]).status.code(), Some(4));

    let again = json(ok(&run(&dir, &["anchor", "--no-checkpoint", "--json"])));
    assert_eq!(again["batches"].as_array().unwrap().len(), 0, "nothing pending");

    let status = json(ok(&run(&dir, &["chain", "status", "--json"])));
    assert_eq!(status["ok"], true);
    assert_eq!(status["anchors"], 1);
}

#[test]
fn cli_external_rpc_wrong_network_and_unreachable_chain() {
    let anvil = LocalAnvil::start(AnvilOptions::default()).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("node");
    ok(&run(&dir, &["init"]));
    let wrong = run(&dir, &["chain", "deploy", "--rpc-url", &anvil.endpoint(), "--network", "base"]);
    assert_eq!(wrong.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&wrong.stderr).contains("chain id 31337"),
        "{}",
        String::from_utf8_lossy(&wrong.stderr)
    );
    assert_eq!(run(&dir, &["chain", "deploy", "--network", "nowhere"]).status.code(), Some(4));

    let d = json(ok(&run(&dir, &["chain", "deploy", "--rpc-url", &anvil.endpoint(), "--json"])));
    assert_eq!(d["deployment"]["network"], "anvil");
    let a = json(ok(&run(&dir, &["anchor", "--json"])));
    assert_eq!(a["batches"].as_array().unwrap().len(), 1);

    // The chain goes away: the command fails with exit 5 and the failure is an event.
    let port = anvil.port();
    drop(anvil);
    let down = run(&dir, &["anchor", "--retries", "2", "--rpc-url", &format!("http://127.0.0.1:{port}")]);
    assert_eq!(down.status.code(), Some(5), "{}", String::from_utf8_lossy(&down.stderr));
    let failed = kinds(&dir, "anchor.failed");
    assert_eq!(failed.len(), 1);
    assert_eq!(failed[0]["data"]["error_kind"], "transport");
    let list = json(ok(&run(&dir, &["anchors", "--json"])));
    assert_eq!(list["pending"].as_array().unwrap().len(), 1, "the new checkpoint waits for the next anchor");
}
