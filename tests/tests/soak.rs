//! Soak: 200 concurrent clients on loopback for 60 s (MINDXTRAIN_SOAK_SECS) against one node
//! that sells its model over x402 on anvil while a run launched over the API trains: readers
//! cycling through the open and guarded read routes, live log tails (SSE), and paying wallets
//! buying chat completions. Nothing may fail, every tail must see every event in order, every
//! paid answer must have its `payment.settled` event, and the node's memory must stay flat.
//! The figures are printed as one JSON line (`SOAK {...}`) for docs/benchmarks.md.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use mindxtrain_node::serve::client::PayingClient;
use mindxtrain_tests::served::{MODEL, Server, get_json, key_file, new_node, s, trained};
use mindxtrain_tests::x402_env::{ANVIL_KEY_1, Chain};
use mindxtrain_x402::alloy::signers::local::PrivateKeySigner;
use serde_json::{Value, json};
use tokio::sync::Mutex;

const TAILS: usize = 20;
const PAYERS: usize = 10;
const READERS: usize = 200 - TAILS - PAYERS;

/// Read routes the readers cycle through; `true` where the token is needed.
const READS: [(&str, bool); 11] = [
    ("/healthz", false),
    ("/readyz", false),
    ("/api/runs", false),
    ("/api/log/checkpoint", false),
    ("/api/log?from=0&limit=50", true),
    ("/api/checkpoints", false),
    ("/api/log/proof/0", false),
    ("/v1/models", false),
    ("/metrics", true),
    ("/api/anchors", false),
    ("/api/payments?limit=20", true),
];

#[derive(Default)]
struct Tally {
    ok: AtomicU64,
    failures: Mutex<Vec<String>>,
    latencies_us: Mutex<Vec<u64>>,
}

impl Tally {
    async fn record(&self, started: Instant, outcome: Result<(), String>) {
        match outcome {
            Ok(()) => {
                self.ok.fetch_add(1, Ordering::Relaxed);
                self.latencies_us.lock().await.push(started.elapsed().as_micros() as u64);
            }
            Err(e) => self.failures.lock().await.push(e),
        }
    }

    async fn summary(&self) -> Value {
        let mut l = self.latencies_us.lock().await.clone();
        l.sort_unstable();
        let at = |q: f64| l.get(((l.len() as f64 * q) as usize).min(l.len().saturating_sub(1))).copied();
        json!({"ok": self.ok.load(Ordering::Relaxed), "failed": self.failures.lock().await.len(),
            "p50_ms": at(0.5).map(|u| u as f64 / 1e3), "p99_ms": at(0.99).map(|u| u as f64 / 1e3)})
    }
}

fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status.lines().find_map(|l| l.strip_prefix("VmRSS:")).and_then(|v| v.split_whitespace().next()?.parse().ok())
}

/// Reads one SSE stream until `stop`, returning the seqs it delivered.
async fn tail(
    http: reqwest::Client,
    url: String,
    token: String,
    stop: Arc<AtomicBool>,
    want: Arc<AtomicU64>,
) -> Result<Vec<u64>, String> {
    let mut r = http.get(&url).bearer_auth(&token).send().await.map_err(|e| format!("tail: {e}"))?;
    if r.status() != 200 {
        return Err(format!("tail: {}", r.status()));
    }
    let (mut buf, mut seqs) = (String::new(), Vec::new());
    loop {
        // Done once stopped and every event up to the final size has arrived.
        if stop.load(Ordering::Acquire) && seqs.last().is_some_and(|&l| l + 1 >= want.load(Ordering::Acquire)) {
            return Ok(seqs);
        }
        let chunk = match tokio::time::timeout(Duration::from_millis(500), r.chunk()).await {
            Err(_) => continue,
            Ok(Ok(Some(c))) => c,
            Ok(Ok(None)) => return Err("tail: the stream ended".into()),
            Ok(Err(e)) => return Err(format!("tail: {e}")),
        };
        buf.push_str(&String::from_utf8_lossy(&chunk));
        while let Some(end) = buf.find("\n\n") {
            let block: String = buf.drain(..end + 2).collect();
            if let Some(id) = block.lines().find_map(|l| l.strip_prefix("id: ")) {
                seqs.push(id.trim().parse().map_err(|_| format!("tail: bad id {id}"))?);
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_hundred_clients_read_tail_and_pay_while_a_run_trains() {
    let secs: u64 = std::env::var("MINDXTRAIN_SOAK_SECS").ok().and_then(|v| v.parse().ok()).unwrap_or(60);
    let t = tokio::task::spawn_blocking(|| trained(8)).await.unwrap();
    let chain = Chain::start().await.expect("anvil + TestUSDC");
    let node = new_node(&t, "seller");
    let settler = key_file(&node, "settler.key", ANVIL_KEY_1);
    let (usdc, pay_to) = (chain.usdc.to_string(), PrivateKeySigner::random().address().to_string());
    let args = ["--rpc-url", &chain.rpc, "--settler-key", s(&settler), "--asset", &usdc, "--pay-to", &pay_to];
    let server = Server::start(&node, &t, &args);
    let (url, token) = (server.url.clone(), Server::token(&node));
    let pid = server.child.id();
    let http = reqwest::Client::builder().timeout(Duration::from_secs(60)).build().unwrap();

    // A run trains through the whole soak.
    let launched = http
        .post(format!("{url}/api/runs"))
        .bearer_auth(&token)
        .json(&json!({"recipe": "tiny_cpu_pretrain.yaml"}))
        .send()
        .await
        .unwrap();
    assert_eq!(launched.status(), 202);
    let run: Value = launched.json().await.unwrap();

    let mut wallets = Vec::new();
    for _ in 0..PAYERS {
        let w = PrivateKeySigner::random();
        chain.mint(w.address(), 100_000_000).await.unwrap();
        wallets.push(w);
    }

    let stop = Arc::new(AtomicBool::new(false));
    let final_size = Arc::new(AtomicU64::new(u64::MAX));
    let (reads, paid) = (Arc::new(Tally::default()), Arc::new(Tally::default()));
    let mut tails = Vec::new();
    // No overall timeout on streams that last the whole soak.
    let streaming = reqwest::Client::new();
    let tail_url = format!("{url}/api/log/tail?from=0");
    for _ in 0..TAILS {
        let f = tail(streaming.clone(), tail_url.clone(), token.clone(), stop.clone(), final_size.clone());
        tails.push(tokio::spawn(f));
    }
    let mut workers = Vec::new();
    for i in 0..READERS {
        let (http, url, token, stop, tally) = (http.clone(), url.clone(), token.clone(), stop.clone(), reads.clone());
        workers.push(tokio::spawn(async move {
            let mut k = i;
            while !stop.load(Ordering::Acquire) {
                let (path, guarded) = READS[k % READS.len()];
                k += 1;
                let mut req = http.get(format!("{url}{path}"));
                if guarded {
                    req = req.bearer_auth(&token);
                }
                let started = Instant::now();
                let outcome = match req.send().await {
                    Ok(r) if r.status() == 200 => r.bytes().await.map(drop).map_err(|e| format!("{path}: {e}")),
                    Ok(r) => Err(format!("{path}: {}", r.status())),
                    Err(e) => Err(format!("{path}: {e}")),
                };
                tally.record(started, outcome).await;
            }
        }));
    }
    for (i, wallet) in wallets.into_iter().enumerate() {
        let (url, stop, tally) = (url.clone(), stop.clone(), paid.clone());
        workers.push(tokio::spawn(async move {
            let client = PayingClient::new(wallet, 1_000_000).unwrap();
            let body = json!({"model": MODEL, "max_tokens": 4, "seed": i,
                "messages": [{"role": "user", "content": "Name a colour."}]});
            while !stop.load(Ordering::Acquire) {
                let started = Instant::now();
                let outcome = match client.post_json(&format!("{url}/v1/chat/completions"), &body).await {
                    Ok(r) if r.status == 200 && r.settlement.as_ref().is_some_and(|s| s.success) => Ok(()),
                    Ok(r) => Err(format!("paid call: {} {}", r.status, r.body)),
                    Err(e) => Err(format!("paid call: {e}")),
                };
                tally.record(started, outcome).await;
            }
        }));
    }

    // Memory, sampled through the soak.
    let began = Instant::now();
    let mut rss = Vec::new();
    while began.elapsed() < Duration::from_secs(secs) {
        rss.push(rss_kib(pid).expect("the node is running"));
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    stop.store(true, Ordering::Release);
    for w in workers {
        w.await.unwrap();
    }
    let cp: Value = http.get(format!("{url}/api/log/checkpoint")).send().await.unwrap().json().await.unwrap();
    let size = cp["size"].as_u64().unwrap();
    final_size.store(size, Ordering::Release);
    let mut streamed = 0;
    for t in tails {
        let seqs = tokio::time::timeout(Duration::from_secs(30), t).await.expect("tail caught up").unwrap().unwrap();
        let want: Vec<u64> = (0..size).collect();
        assert_eq!(&seqs[..size as usize], want.as_slice(), "a tail lost or reordered an event");
        streamed += seqs.len();
    }

    let read_failures = reads.failures.lock().await.clone();
    let paid_failures = paid.failures.lock().await.clone();
    assert!(
        read_failures.is_empty(),
        "{} reads failed: {:?}",
        read_failures.len(),
        &read_failures[..read_failures.len().min(5)]
    );
    assert!(
        paid_failures.is_empty(),
        "{} paid calls failed: {:?}",
        paid_failures.len(),
        &paid_failures[..paid_failures.len().min(5)]
    );
    let paid_ok = paid.ok.load(Ordering::Relaxed);
    assert!(paid_ok > 0 && reads.ok.load(Ordering::Relaxed) > 0);

    // Every paid answer has its settlement in the log.
    // Each payment leaves several events (settling, settled, served): read every page.
    let (mut settled, mut before) = (0, u64::MAX);
    loop {
        let page = get_json(&http, &format!("{url}/api/payments?limit=1000&before={before}"), Some(&token)).await;
        settled += page["events"].as_array().unwrap().iter().filter(|e| e["kind"] == "payment.settled").count();
        match page["next_before"].as_u64() {
            Some(next) => before = next,
            None => break,
        }
    }
    assert_eq!(settled as u64, paid_ok, "one payment.settled per paid answer");

    // Flat: after a 10 s warm-up, the last third of the soak holds no more than the first
    // third plus a margin for the training run's own buffers.
    let warm: Vec<u64> = rss.iter().copied().skip(5).collect();
    let third = (warm.len() / 3).max(1);
    let early = *warm[..third].iter().max().unwrap();
    let late = *warm[warm.len() - third..].iter().max().unwrap();
    assert!(late <= early + early / 4 + 64 * 1024, "memory grew: {early} KiB → {late} KiB ({rss:?})");

    let status: Value =
        http.get(format!("{url}/api/runs/{}", run["id"].as_str().unwrap())).send().await.unwrap().json().await.unwrap();
    assert_ne!(status["phase"], "failed", "{status}");
    let report = json!({"seconds": secs, "clients": {"readers": READERS, "tails": TAILS, "payers": PAYERS},
        "reads": reads.summary().await, "paid": paid.summary().await, "events_in_log": size,
        "events_streamed": streamed, "rss_kib": {"first": rss.first(), "early_max": early, "late_max": late, "last": rss.last()},
        "run": {"phase": status["phase"], "step": status["step"], "total_steps": status["total_steps"]}});
    eprintln!("SOAK {report}");
}
