//! x402 benchmark: paid-request throughput and added latency, mindxtrain's `PaidRoute`
//! against the reference `@x402/express` 2.27 middleware, both around the same echo handler
//! and the same facilitator, on loopback, in one run; once with settlement stubbed and once
//! with every payment settled for real on anvil.
//!
//! The facilitator is mindxtrain's `LocalFacilitator` on anvil: real EIP-712 recovery and a
//! real transfer simulation against TestUSDC (`eth_call`) for every payment. Stubbed, it is
//! wrapped in `StubSettle`, whose settlement answers success with a synthetic transaction and
//! sends nothing; real, each settlement is a `transferWithAuthorization` mined by anvil, its
//! receipt's logs checked. Both servers settle through the same object: express over HTTP
//! (`/verify`, `/settle` on loopback), ours once over the same HTTP routes and once in-process.
//! Ours records what the node records: `payment.*` events in a real event log (fdatasync'd
//! group commit) in a temporary node directory, the settlement intent durable before each
//! broadcast. With real settlement a fourth server is ours without the intent record (the
//! settlement event still durable before the answer): the difference at p50 is what the
//! exactly-once ledger costs; stubbed, the fourth is ours recording nothing (what the
//! reference records), which shows what the node's log costs. The servers are measured in
//! interleaved rounds (`--rounds`), so that what drifts (the chain growing a block per
//! settlement, load from elsewhere) falls on all alike. Every paid request carries a fresh, pre-signed authorization
//! (signing is the client's cost and happens before timing).
//!
//! "Added latency" = a paid `POST /echo` minus an unpaid `POST /free` (the same handler
//! without the layer) on the same server, at p50 and p99 over sequential requests, paid and
//! unpaid taken in turn.

use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, ensure};
use axum::Router;
use axum::body::Bytes;
use axum::routing::post;
use clap::Parser;
use mindxtrain_node::log::EventLog;
use mindxtrain_node::serve::payments::LogPayments;
use mindxtrain_tests::x402_env::{Chain, TempNode, ensure_js, js_dir, serve, signed_payment};
use mindxtrain_x402::alloy::primitives::keccak256;
use mindxtrain_x402::alloy::signers::local::PrivateKeySigner;
use mindxtrain_x402::facilitator::BoxFuture;
use mindxtrain_x402::ledger::{Intent, Landed};
use mindxtrain_x402::wire::{
    PaymentPayload, PaymentRequirements, SettlementResponse, SupportedResponse, VerifyResponse,
};
use mindxtrain_x402::{
    Facilitator, HttpFacilitator, NoEvents, Offer, PaidRoute, PaidRouteConfig, PaymentEvents, PaymentFacts, Payments,
    Pricing, Recorded, RejectReason, Settled, SettledBy, facilitator_routes, header,
};

#[derive(Parser)]
#[command(about = "x402 paid-request benchmark: PaidRoute vs @x402/express, same facilitator")]
struct Args {
    /// Paid requests per server for the throughput run, settlement stubbed.
    #[arg(long, default_value_t = 2000)]
    requests: usize,
    /// Paid requests per server for the throughput run, settled on anvil.
    #[arg(long, default_value_t = 600)]
    settled_requests: usize,
    /// Requests in flight during the throughput run.
    #[arg(long, default_value_t = 32)]
    concurrency: usize,
    /// Sequential requests per latency sample (paid and unpaid each, in turn), stubbed.
    #[arg(long, default_value_t = 2000)]
    samples: usize,
    /// Sequential requests per latency sample, settled on anvil.
    #[arg(long, default_value_t = 400)]
    settled_samples: usize,
    /// Paying wallets, used in turn.
    #[arg(long, default_value_t = 8)]
    payers: usize,
    /// Rounds: each takes its share of every server's samples and requests in turn.
    #[arg(long, default_value_t = 4)]
    rounds: usize,
}

const PRICE: u64 = 10_000;

/// Verifies through the wrapped facilitator; settles nothing.
struct StubSettle(Arc<dyn Facilitator>);

impl Facilitator for StubSettle {
    fn verify<'a>(&'a self, p: &'a PaymentPayload, r: &'a PaymentRequirements) -> BoxFuture<'a, VerifyResponse> {
        self.0.verify(p, r)
    }
    fn settle<'a>(&'a self, p: &'a PaymentPayload, r: &'a PaymentRequirements) -> BoxFuture<'a, SettlementResponse> {
        Box::pin(async move { self.settle_checked(p, r, mindxtrain_x402::events::recorded()).await.response })
    }
    fn settle_checked<'a>(
        &'a self,
        p: &'a PaymentPayload,
        r: &'a PaymentRequirements,
        ready: Recorded,
    ) -> BoxFuture<'a, Settled> {
        Box::pin(async move {
            let _ = ready.await;
            let tx = keccak256(p.payload.signature.as_bytes());
            let response = SettlementResponse {
                success: true,
                error_reason: None,
                error_message: None,
                payer: Some(p.payload.authorization.from.clone()),
                transaction: tx.to_string(),
                network: r.network.clone(),
                amount: Some(r.amount.clone()),
            };
            Settled { response, landed: Some(Landed { tx, block: 0 }) }
        })
    }
    fn supported(&self) -> BoxFuture<'_, SupportedResponse> {
        self.0.supported()
    }
}

/// A remote facilitator whose settlements are taken as landed without reading a receipt: for
/// the stubbed run only, where no transaction exists to read.
struct TakenAsLanded(Arc<dyn Facilitator>);

impl Facilitator for TakenAsLanded {
    fn verify<'a>(&'a self, p: &'a PaymentPayload, r: &'a PaymentRequirements) -> BoxFuture<'a, VerifyResponse> {
        self.0.verify(p, r)
    }
    fn settle<'a>(&'a self, p: &'a PaymentPayload, r: &'a PaymentRequirements) -> BoxFuture<'a, SettlementResponse> {
        self.0.settle(p, r)
    }
    fn settle_checked<'a>(
        &'a self,
        p: &'a PaymentPayload,
        r: &'a PaymentRequirements,
        ready: Recorded,
    ) -> BoxFuture<'a, Settled> {
        Box::pin(async move {
            let _ = ready.await;
            let response = self.0.settle(p, r).await;
            let landed = response.transaction.parse().ok().map(|tx| Landed { tx, block: 0 });
            Settled { response, landed }
        })
    }
    fn supported(&self) -> BoxFuture<'_, SupportedResponse> {
        self.0.supported()
    }
}

/// The node's payment events, except that the settlement intent is not recorded: the
/// baseline for what the exactly-once ledger adds.
struct WithoutIntent(LogPayments);

impl PaymentEvents for WithoutIntent {
    fn verified(&self, f: &PaymentFacts) {
        self.0.verified(f)
    }
    fn settling(&self, _: &Intent) -> Recorded {
        mindxtrain_x402::events::recorded()
    }
    fn settled(&self, i: &Intent, l: &Landed, by: SettledBy) -> Recorded {
        self.0.settled(i, l, by)
    }
    fn failed(&self, i: &Intent, r: &RejectReason, m: Option<&str>) {
        self.0.failed(i, r, m)
    }
    fn served(&self, i: &Intent, l: &Landed, a: u32) {
        self.0.served(i, l, a)
    }
    fn rejected(&self, f: &PaymentFacts, r: &RejectReason, m: Option<&str>) {
        self.0.rejected(f, r, m)
    }
}

fn echo_router(layer: Option<PaidRoute>) -> Router {
    let echo = |body: Bytes| async move {
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap_or(serde_json::Value::Null);
        axum::Json(serde_json::json!({ "echo": v }))
    };
    let paid = match layer {
        Some(l) => post(echo).layer(l),
        None => post(echo),
    };
    Router::new().route("/echo", paid).route("/free", post(echo))
}

struct Express(Child);

impl Drop for Express {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start_express(port: u16, facilitator: &str, pay_to: &str, asset: &str) -> anyhow::Result<Express> {
    use std::io::BufRead;
    let mut child = Command::new("node")
        .current_dir(js_dir())
        .args(["bin/express-server.mjs", &port.to_string(), facilitator, pay_to, asset, &PRICE.to_string()])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .context("node")?;
    let out = child.stdout.take().context("stdout")?;
    let mut line = String::new();
    std::io::BufReader::new(out).read_line(&mut line)?;
    ensure!(line.trim() == "listening", "express did not start: {line:?}");
    Ok(Express(child))
}

struct Row {
    mode: &'static str,
    server: &'static str,
    link: &'static str,
    paid_rps: f64,
    free_rps: f64,
    p50_paid_us: f64,
    p99_paid_us: f64,
    p50_added_us: f64,
    p99_added_us: f64,
}

/// Microseconds.
fn pct(sorted: &[Duration], p: f64) -> f64 {
    mindxtrain_tests::bench::percentile(sorted, p).as_secs_f64() * 1e6
}

/// Why a 402 was answered: the refusal code, or the failed settlement's reason.
fn refusal_of(h: &reqwest::header::HeaderMap) -> Option<String> {
    let required = h.get(header::PAYMENT_REQUIRED).and_then(|v| header::decode_payment_required(v.as_bytes()).ok());
    let settled = h.get(header::PAYMENT_RESPONSE).and_then(|v| header::decode_payment_response(v.as_bytes()).ok());
    required.and_then(|r| r.error).or_else(|| settled.and_then(|s| s.error_reason))
}

async fn one(http: &reqwest::Client, url: &str, payment: Option<&str>) -> anyhow::Result<()> {
    let mut rb = http.post(url).header("content-type", "application/json").body(r#"{"prompt":"bench"}"#);
    if let Some(p) = payment {
        rb = rb.header("payment-signature", p);
    }
    let r = rb.send().await?;
    let status = r.status();
    let headers = r.headers().clone();
    let has_receipt = headers.contains_key(header::PAYMENT_RESPONSE);
    let _ = r.bytes().await?;
    ensure!(status == 200, "{url}: status {status} ({:?})", refusal_of(&headers));
    ensure!(payment.is_none() || has_receipt, "{url}: no PAYMENT-RESPONSE");
    Ok(())
}

/// `n` unpaid and `n` paid requests, one after the other in turn, so that whatever else the
/// machine does in the meantime falls on both alike; each list sorted.
async fn interleaved(
    http: &reqwest::Client,
    free: &str,
    paid: &str,
    payments: &[String],
    n: usize,
) -> anyhow::Result<(Vec<Duration>, Vec<Duration>)> {
    let (mut free_t, mut paid_t) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for payment in &payments[..n] {
        let t = Instant::now();
        one(http, free, None).await?;
        free_t.push(t.elapsed());
        let t = Instant::now();
        one(http, paid, Some(payment)).await?;
        paid_t.push(t.elapsed());
    }
    free_t.sort();
    paid_t.sort();
    Ok((free_t, paid_t))
}

/// Seconds to send `n` requests with `concurrency` in flight.
async fn throughput(
    http: &reqwest::Client,
    url: &str,
    payments: Option<Arc<Vec<String>>>,
    n: usize,
    concurrency: usize,
) -> anyhow::Result<f64> {
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let t = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..concurrency {
        let (http, url, payments, next) = (http.clone(), url.to_owned(), payments.clone(), next.clone());
        tasks.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if i >= n {
                    return Ok::<_, anyhow::Error>(());
                }
                one(&http, &url, payments.as_ref().map(|p| p[i].as_str())).await?;
            }
        }));
    }
    for task in tasks {
        task.await??;
    }
    Ok(t.elapsed().as_secs_f64())
}

/// One server under test.
struct Target {
    server: &'static str,
    link: &'static str,
    base: String,
}

/// What one target's rounds add up to.
#[derive(Default)]
struct Acc {
    free_t: Vec<Duration>,
    paid_t: Vec<Duration>,
    free_s: f64,
    paid_s: f64,
}

/// Measures every target in `rounds` rounds, each round taking its share of latency samples
/// and throughput requests from every target in turn, so that what drifts during the run
/// (the chain growing by a block per settlement, other load on the machine) falls on all
/// of them alike.
#[allow(clippy::too_many_arguments)]
async fn measure_all(
    mode: &'static str,
    targets: &[Target],
    payers: &[PrivateKeySigner],
    chain: &Chain,
    requests: usize,
    samples: usize,
    rounds: usize,
    args: &Args,
) -> anyhow::Result<Vec<Row>> {
    let http = reqwest::Client::builder().pool_max_idle_per_host(args.concurrency * 2).build()?;
    let mut acc: Vec<Acc> = targets.iter().map(|_| Acc::default()).collect();
    let mut accepted = Vec::new();
    for t in targets {
        let required = mindxtrain_tests::x402_env::payment_required(&http, &format!("{}/echo", t.base)).await?;
        accepted.push(required.accepts[0].clone());
    }
    let sign = |n: usize, i: usize| -> Vec<String> {
        let payer = |k: usize| &payers[k % payers.len()];
        (0..n).map(|k| header::encode(&signed_payment(payer(k), &accepted[i], &chain.asset, |_| {}))).collect()
    };
    for (i, t) in targets.iter().enumerate() {
        interleaved(&http, &format!("{}/free", t.base), &format!("{}/echo", t.base), &sign(20, i), 20).await?;
    }
    let rounds = rounds.max(1);
    let (per_round_samples, per_round_requests) = (samples.div_ceil(rounds), requests.div_ceil(rounds));
    for _ in 0..rounds {
        for (i, t) in targets.iter().enumerate() {
            let (paid, free) = (format!("{}/echo", t.base), format!("{}/free", t.base));
            let (f, p) = interleaved(&http, &free, &paid, &sign(per_round_samples, i), per_round_samples).await?;
            acc[i].free_t.extend(f);
            acc[i].paid_t.extend(p);
            acc[i].free_s += throughput(&http, &free, None, per_round_requests, args.concurrency).await?;
            let bulk = Arc::new(sign(per_round_requests, i));
            acc[i].paid_s += throughput(&http, &paid, Some(bulk), per_round_requests, args.concurrency).await?;
        }
    }
    let done = (per_round_requests * rounds) as f64;
    Ok(targets
        .iter()
        .zip(acc)
        .map(|(t, mut a)| {
            a.free_t.sort();
            a.paid_t.sort();
            Row {
                mode,
                server: t.server,
                link: t.link,
                paid_rps: done / a.paid_s,
                free_rps: done / a.free_s,
                p50_paid_us: pct(&a.paid_t, 0.5),
                p99_paid_us: pct(&a.paid_t, 0.99),
                p50_added_us: pct(&a.paid_t, 0.5) - pct(&a.free_t, 0.5),
                p99_added_us: pct(&a.paid_t, 0.99) - pct(&a.free_t, 0.99),
            }
        })
        .collect())
}

/// One settlement mode: the servers up together, measured in interleaved rounds.
async fn run_mode(
    label: &'static str,
    facilitator: Arc<dyn Facilitator>,
    chain: &Chain,
    payers: &[PrivateKeySigner],
    args: &Args,
) -> anyhow::Result<Vec<Row>> {
    let settled = label != "stubbed";
    let pay_to = PrivateKeySigner::random().address();
    let offer = Offer { asset: chain.asset.clone(), pay_to, max_timeout_seconds: 120 };
    let evidence = chain.facilitator().await?.evidence();
    let routes_payments =
        Payments { evidence: Some(evidence.clone()), ..Payments::new(facilitator.clone(), Arc::new(NoEvents)) };
    let (facilitator_url, _f) = serve(facilitator_routes(routes_payments, vec![offer.clone()])).await?;
    let nodes = [TempNode::new()?, TempNode::new()?, TempNode::new()?];
    let logs: Vec<Arc<EventLog>> = nodes.iter().map(|n| n.log.clone()).collect();
    let layer = |f: Arc<dyn Facilitator>, events: Arc<dyn PaymentEvents>| {
        let payments = Payments { evidence: Some(evidence.clone()), ..Payments::new(f, events) };
        PaidRoute::new(PaidRouteConfig::new(vec![offer.clone()], Pricing::PerCall { amount: PRICE }), payments)
    };
    let over_http: Arc<dyn Facilitator> = Arc::new(HttpFacilitator::new(&facilitator_url, Duration::from_secs(30))?);
    // Stubbed, there is no receipt to check; settled, ours reads each one (as the node does).
    let over_http = if settled { over_http } else { Arc::new(TakenAsLanded(over_http)) };
    let node_events = |log: &Arc<EventLog>| -> Arc<dyn PaymentEvents> { Arc::new(LogPayments::new(log.clone())) };
    let (ours_local, _a) = serve(echo_router(Some(layer(facilitator.clone(), node_events(&logs[0]))))).await?;
    let (ours_http, _b) = serve(echo_router(Some(layer(over_http, node_events(&logs[1]))))).await?;
    let without_intent: Arc<dyn PaymentEvents> = Arc::new(WithoutIntent(LogPayments::new(logs[2].clone())));
    let (ours_no_intent, _c) = serve(echo_router(Some(layer(facilitator.clone(), without_intent)))).await?;
    let (ours_no_log, _d) = serve(echo_router(Some(layer(facilitator.clone(), Arc::new(NoEvents))))).await?;
    let port = mindxtrain_chain::anvil::free_port()?;
    let _express = start_express(port, &facilitator_url, &pay_to.to_checksum(None), &chain.usdc.to_checksum(None))?;
    let express = format!("http://127.0.0.1:{port}");
    let (n, samples) =
        if settled { (args.settled_requests, args.settled_samples) } else { (args.requests, args.samples) };
    let target = |server, link, base: &str| Target { server, link, base: base.to_owned() };
    let mut targets = vec![
        target("@x402/express 2.27", "HTTP", &express),
        target("mindxtrain PaidRoute", "HTTP", &ours_http),
        target("mindxtrain PaidRoute", "in-process", &ours_local),
    ];
    if settled {
        targets.push(target("PaidRoute, no intent record", "in-process", &ours_no_intent));
    } else {
        targets.push(target("PaidRoute, no event log", "in-process", &ours_no_log));
    }
    let rows = measure_all(label, &targets, payers, chain, n, samples, args.rounds, args).await?;
    Ok(rows)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    ensure_js()?;
    let chain = Chain::start().await?;
    ensure!(args.payers > 0, "--payers must be at least 1");
    let payers: Vec<PrivateKeySigner> = (0..args.payers).map(|_| PrivateKeySigner::random()).collect();
    for p in &payers {
        chain.mint(p.address(), 1_000_000_000_000).await?;
    }
    let local: Arc<dyn Facilitator> = chain.facilitator().await?;
    let stub: Arc<dyn Facilitator> = Arc::new(StubSettle(local.clone()));
    let mut rows = run_mode("stubbed", stub, &chain, &payers, &args).await?;
    rows.extend(run_mode("settled on anvil", local, &chain, &payers, &args).await?);
    println!(
        "concurrency {} · payers {} · stubbed: {} requests, {} latency samples · settled: {} requests, {} samples\n",
        args.concurrency, args.payers, args.requests, args.samples, args.settled_requests, args.settled_samples
    );
    println!(
        "| settlement | server | facilitator | paid req/s | unpaid req/s | paid p50 µs | paid p99 µs | added p50 µs | added p99 µs |"
    );
    println!("|---|---|---|---:|---:|---:|---:|---:|---:|");
    for r in &rows {
        println!(
            "| {} | {} | {} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} |",
            r.mode,
            r.server,
            r.link,
            r.paid_rps,
            r.free_rps,
            r.p50_paid_us,
            r.p99_paid_us,
            r.p50_added_us,
            r.p99_added_us
        );
    }
    for mode in ["stubbed", "settled on anvil"] {
        let of: Vec<&Row> = rows.iter().filter(|r| r.mode == mode).collect();
        let reference = of[0].paid_rps;
        for r in &of[1..] {
            println!("{mode}: {} ({}): {:.1}x the reference's paid req/s", r.server, r.link, r.paid_rps / reference);
        }
    }
    let settled: Vec<&Row> = rows.iter().filter(|r| r.mode == "settled on anvil").collect();
    if let (Some(with), Some(without)) = (settled.get(2), settled.get(3)) {
        let added = with.p50_paid_us - without.p50_paid_us;
        println!(
            "exactly-once ledger (intent record): paid p50 {:.0} µs with, {:.0} µs without: {:+.0} µs ({:+.1}%)",
            with.p50_paid_us,
            without.p50_paid_us,
            added,
            100.0 * added / without.p50_paid_us
        );
    }
    Ok(())
}
