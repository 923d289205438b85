//! x402 benchmark: paid-request throughput and added latency on the verify path,
//! mindxtrain's `PaidRoute` against the reference `@x402/express` 2.27 middleware, both
//! around the same echo handler and the same facilitator, on loopback, in one run.
//!
//! The facilitator is mindxtrain's `LocalFacilitator` on anvil (real EIP-712 recovery,
//! real `authorizationState` / `balanceOf` / transfer-simulation calls against TestUSDC),
//! wrapped in `StubSettle`: `/settle` answers success with a synthetic transaction id
//! (keccak of the signature) and sends nothing. Both servers settle through that same
//! object — express over HTTP (`/verify`, `/settle` on loopback), ours once over the same
//! HTTP routes and once in-process. Every paid request carries a fresh, pre-signed
//! authorization (signing is the client's cost and happens before timing).
//!
//! "Added latency" = a paid `POST /echo` minus an unpaid `POST /free` (the same handler
//! without the layer) on the same server, at p50 and p99 over sequential requests.

use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, ensure};
use axum::Router;
use axum::body::Bytes;
use axum::routing::post;
use clap::Parser;
use mindxtrain_tests::x402_env::{Chain, ensure_js, js_dir, serve, signed_payment};
use mindxtrain_x402::alloy::primitives::keccak256;
use mindxtrain_x402::alloy::signers::local::PrivateKeySigner;
use mindxtrain_x402::facilitator::BoxFuture;
use mindxtrain_x402::wire::{
    PaymentPayload, PaymentRequirements, SettlementResponse, SupportedResponse, VerifyResponse,
};
use mindxtrain_x402::{
    Facilitator, HttpFacilitator, NoEvents, Offer, PaidRoute, PaidRouteConfig, Pricing, facilitator_routes, header,
};

#[derive(Parser)]
#[command(about = "x402 paid-request benchmark: PaidRoute vs @x402/express, same facilitator")]
struct Args {
    /// Paid requests per server for the throughput run.
    #[arg(long, default_value_t = 2000)]
    requests: usize,
    /// Requests in flight during the throughput run.
    #[arg(long, default_value_t = 32)]
    concurrency: usize,
    /// Sequential requests per latency sample (paid and unpaid each).
    #[arg(long, default_value_t = 400)]
    samples: usize,
}

const PRICE: u64 = 10_000;

/// Verifies through the wrapped facilitator; settles nothing.
struct StubSettle(Arc<dyn Facilitator>);

impl Facilitator for StubSettle {
    fn verify<'a>(&'a self, p: &'a PaymentPayload, r: &'a PaymentRequirements) -> BoxFuture<'a, VerifyResponse> {
        self.0.verify(p, r)
    }
    fn settle<'a>(&'a self, p: &'a PaymentPayload, r: &'a PaymentRequirements) -> BoxFuture<'a, SettlementResponse> {
        Box::pin(async move {
            SettlementResponse {
                success: true,
                error_reason: None,
                error_message: None,
                payer: Some(p.payload.authorization.from.clone()),
                transaction: keccak256(p.payload.signature.as_bytes()).to_string(),
                network: r.network.clone(),
                amount: Some(r.amount.clone()),
            }
        })
    }
    fn supported(&self) -> BoxFuture<'_, SupportedResponse> {
        self.0.supported()
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
    server: &'static str,
    link: &'static str,
    paid_rps: f64,
    free_rps: f64,
    p50_paid_us: f64,
    p99_paid_us: f64,
    p50_added_us: f64,
    p99_added_us: f64,
}

fn pct(sorted: &[Duration], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i].as_secs_f64() * 1e6
}

async fn one(http: &reqwest::Client, url: &str, payment: Option<&str>) -> anyhow::Result<()> {
    let mut rb = http.post(url).header("content-type", "application/json").body(r#"{"prompt":"bench"}"#);
    if let Some(p) = payment {
        rb = rb.header("payment-signature", p);
    }
    let r = rb.send().await?;
    let status = r.status();
    let has_receipt = r.headers().contains_key(header::PAYMENT_RESPONSE);
    let _ = r.bytes().await?;
    ensure!(status == 200, "{url}: status {status}");
    ensure!(payment.is_none() || has_receipt, "{url}: no PAYMENT-RESPONSE");
    Ok(())
}

async fn sequential(
    http: &reqwest::Client,
    url: &str,
    payments: Option<&[String]>,
    n: usize,
) -> anyhow::Result<Vec<Duration>> {
    let mut times = Vec::with_capacity(n);
    for i in 0..n {
        let t = Instant::now();
        one(http, url, payments.map(|p| p[i].as_str())).await?;
        times.push(t.elapsed());
    }
    times.sort();
    Ok(times)
}

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
    Ok(n as f64 / t.elapsed().as_secs_f64())
}

async fn measure(
    server: &'static str,
    link: &'static str,
    base: &str,
    payer: &PrivateKeySigner,
    chain: &Chain,
    args: &Args,
) -> anyhow::Result<Row> {
    let http = reqwest::Client::builder().pool_max_idle_per_host(args.concurrency * 2).build()?;
    let required = mindxtrain_tests::x402_env::payment_required(&http, &format!("{base}/echo")).await?;
    let accepted = &required.accepts[0];
    let sign = |n: usize| -> Vec<String> {
        (0..n).map(|_| header::encode(&signed_payment(payer, accepted, &chain.asset, |_| {}))).collect()
    };
    let (paid, free) = (format!("{base}/echo"), format!("{base}/free"));
    let warm = sign(50);
    sequential(&http, &paid, Some(&warm), 50).await?;
    sequential(&http, &free, None, 50).await?;
    let seq_payments = sign(args.samples);
    let free_t = sequential(&http, &free, None, args.samples).await?;
    let paid_t = sequential(&http, &paid, Some(&seq_payments), args.samples).await?;
    let free_rps = throughput(&http, &free, None, args.requests, args.concurrency).await?;
    let bulk = Arc::new(sign(args.requests));
    let paid_rps = throughput(&http, &paid, Some(bulk), args.requests, args.concurrency).await?;
    Ok(Row {
        server,
        link,
        paid_rps,
        free_rps,
        p50_paid_us: pct(&paid_t, 0.5),
        p99_paid_us: pct(&paid_t, 0.99),
        p50_added_us: pct(&paid_t, 0.5) - pct(&free_t, 0.5),
        p99_added_us: pct(&paid_t, 0.99) - pct(&free_t, 0.99),
    })
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    ensure_js()?;
    let chain = Chain::start().await?;
    let payer = PrivateKeySigner::random();
    chain.mint(payer.address(), 1_000_000_000_000).await?;
    let local: Arc<dyn Facilitator> = chain.facilitator().await?;
    let stub: Arc<dyn Facilitator> = Arc::new(StubSettle(local));
    let (facilitator_url, _f) = serve(facilitator_routes(stub.clone())).await?;

    let pay_to = PrivateKeySigner::random().address();
    let offer = Offer { asset: chain.asset.clone(), pay_to, max_timeout_seconds: 120 };
    let layer = |f: Arc<dyn Facilitator>| {
        PaidRoute::new(
            PaidRouteConfig::new(vec![offer.clone()], Pricing::PerCall { amount: PRICE }),
            f,
            Arc::new(NoEvents),
        )
    };
    let over_http: Arc<dyn Facilitator> = Arc::new(HttpFacilitator::new(&facilitator_url, Duration::from_secs(30))?);
    let (ours_local, _a) = serve(echo_router(Some(layer(stub.clone())))).await?;
    let (ours_http, _b) = serve(echo_router(Some(layer(over_http)))).await?;
    let port = mindxtrain_chain::anvil::free_port()?;
    let _express = start_express(port, &facilitator_url, &pay_to.to_checksum(None), &chain.usdc.to_checksum(None))?;
    let express = format!("http://127.0.0.1:{port}");

    let rows = vec![
        measure("@x402/express 2.27", "HTTP", &express, &payer, &chain, &args).await?,
        measure("mindxtrain PaidRoute", "HTTP", &ours_http, &payer, &chain, &args).await?,
        measure("mindxtrain PaidRoute", "in-process", &ours_local, &payer, &chain, &args).await?,
    ];
    println!(
        "requests {} · concurrency {} · latency samples {} · facilitator: LocalFacilitator on anvil, settle stubbed\n",
        args.requests, args.concurrency, args.samples
    );
    println!(
        "| server | facilitator | paid req/s | unpaid req/s | paid p50 µs | paid p99 µs | added p50 µs | added p99 µs |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|---:|");
    for r in &rows {
        println!(
            "| {} | {} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} |",
            r.server, r.link, r.paid_rps, r.free_rps, r.p50_paid_us, r.p99_paid_us, r.p50_added_us, r.p99_added_us
        );
    }
    let reference = rows[0].paid_rps;
    for r in &rows[1..] {
        println!("{} ({}): {:.1}x the reference's paid req/s", r.server, r.link, r.paid_rps / reference);
    }
    Ok(())
}
