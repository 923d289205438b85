//! `serve-paid-bench`: what selling each call over x402 costs the node's serving throughput
//! (issue 18: paid tokens/s within 2% of unpaid).
//!
//! One node serves one model on one engine, behind the routes `mindxtrain serve` builds
//! (`serve::router`, the request limits, the Host guard, the metrics and its own accept loop)
//! on two loopback listeners: one sold through x402 (the recipe's per-call price, the
//! in-process `LocalFacilitator` on anvil, every `payment.*` event in the node's real event
//! log), one with no x402 layer. The same load (N streamed chat completions sent at once,
//! prompts of P tokens, G greedy tokens each) runs on both, in rounds whose order alternates,
//! so that what drifts during the run falls on both alike. Each paid request carries a fresh
//! EIP-3009 authorization signed before timing (the client's cost), verified by simulation
//! and settled by a mined `transferWithAuthorization` before the stream's first byte.
//!
//! Every load has prompts of its own: the engine's prefix cache would otherwise serve a
//! repeated prompt without its prefill, and the second mode to see it would do less work.
//!
//! The API has no `ignore_eos`, so the random weights are made to run every request to its
//! `max_tokens`: the head's rows of every id but the 128 ASCII bytes are zero, so those ids
//! score 0 while the best of 128 random logits is positive (all but 2⁻¹²⁸ of the time).
//! End of turn and end of text are never picked, and each token is a whole character, streamed
//! as it is made (a byte ≥ 0x80 could be held back as part of a character), so the first
//! streamed text is the first token. The counts reported are the answers' own `usage`.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use candle_core::{DType, Tensor};
use mindxtrain_node::api::{self, ApiState, host::AllowedHosts, listener};
use mindxtrain_node::log::index::Query;
use mindxtrain_node::serve::model::ServedModel;
use mindxtrain_node::serve::rentals::RentalBook;
use mindxtrain_node::serve::{self, AppState, Sale};
use mindxtrain_trainer::data::{Message, Role, Tokenizer};
use mindxtrain_trainer::model::{CausalLm, EMBED, LM_HEAD, LmConfig};
use mindxtrain_trainer::recipe::Recipe;
use mindxtrain_x402::alloy::signers::local::PrivateKeySigner;
use mindxtrain_x402::wire::PaymentRequirements;
use mindxtrain_x402::{Facilitator, Offer, header};
use serde_json::{Value, json};

use super::percentile;
use crate::x402_env::{Chain, TempNode, payment_required_for, signed_payment};

/// The load and where it runs.
#[derive(Debug, Clone)]
pub struct PaidServing {
    /// `cpu`, `cuda` or `cuda:N`.
    pub device: String,
    /// A [`LmConfig::timing_shape`] name: `tiny`, `0.6B`, `1.7B`, `8B`.
    pub shape: String,
    /// Requests sent at once per load.
    pub streams: usize,
    /// Prompt tokens per request (chat template included).
    pub prompt: usize,
    /// Tokens generated per request.
    pub new_tokens: usize,
    /// Measured rounds; each runs the load unpaid and paid once.
    pub rounds: usize,
    /// Paying wallets, used in turn.
    pub payers: usize,
}

/// The served recipe: the demo's, which sells each call on anvil (`per_call: "0.001"`) and
/// names the byte tokenizer (no file to carry).
const RECIPE: &str = "tiny_cpu_lora.yaml";

/// Ids below this are ASCII bytes in the byte tokenizer; the only ones the head can pick.
const ASCII: usize = 128;

/// One request as its client saw it.
struct Sample {
    /// To the first streamed text.
    ttft: Duration,
    /// To the end of the stream.
    latency: Duration,
    /// `usage.completion_tokens`.
    tokens: usize,
}

/// One mode's measured loads.
#[derive(Debug, Default)]
pub struct Side {
    /// Completion tokens, from the answers' `usage`.
    pub tokens: usize,
    pub requests: usize,
    /// Wall seconds of the loads, each from its first send to its last stream's end.
    pub seconds: f64,
    pub tok_s_per_round: Vec<f64>,
    /// Sorted.
    pub ttft: Vec<Duration>,
    /// Sorted.
    pub latency: Vec<Duration>,
}

impl Side {
    pub fn tok_s(&self) -> f64 {
        self.tokens as f64 / self.seconds
    }

    fn add(&mut self, samples: Vec<Sample>, seconds: f64) {
        let tokens: usize = samples.iter().map(|s| s.tokens).sum();
        self.tok_s_per_round.push(tokens as f64 / seconds);
        self.tokens += tokens;
        self.requests += samples.len();
        self.seconds += seconds;
        self.ttft.extend(samples.iter().map(|s| s.ttft));
        self.latency.extend(samples.iter().map(|s| s.latency));
        self.ttft.sort();
        self.latency.sort();
    }
}

/// What the node's log and the chain hold after the run.
#[derive(Debug)]
pub struct Ledger {
    /// Paid requests sent, warm-up included.
    pub paid_requests: usize,
    /// `payment.settled` events.
    pub settled: usize,
    /// `payment.served` events (each answer's last byte out).
    pub served: usize,
    /// TestUSDC transfers to the node's `payTo`.
    pub transfers: usize,
}

#[derive(Debug)]
pub struct Report {
    pub load: PaidServing,
    /// The device as the engine names it (`cpu`, `cuda:0`).
    pub device: String,
    pub unpaid: Side,
    pub paid: Side,
    pub ledger: Ledger,
}

impl Report {
    /// Paid over unpaid output tokens per second: the goal is ≥ 0.98.
    pub fn ratio(&self) -> f64 {
        self.paid.tok_s() / self.unpaid.tok_s()
    }

    /// Whether the run measured what it claims: every request, paid or not, generated exactly
    /// its `max_tokens`, and every paid one was settled, served and transferred once.
    pub fn check(&self) -> anyhow::Result<()> {
        let l = &self.load;
        let expected = l.streams * l.new_tokens * l.rounds;
        ensure!(
            self.paid.tokens == expected && self.unpaid.tokens == expected,
            "completion tokens: paid {}, unpaid {}, expected {expected} each",
            self.paid.tokens,
            self.unpaid.tokens
        );
        let g = &self.ledger;
        ensure!(
            g.settled == g.paid_requests && g.served == g.paid_requests && g.transfers == g.paid_requests,
            "{} paid requests, but {} payment.settled, {} payment.served and {} transfers",
            g.paid_requests,
            g.settled,
            g.served,
            g.transfers
        );
        Ok(())
    }

    /// One JSON object per metric: the paid and unpaid values and their ratio (paid/unpaid),
    /// with the load's settings.
    pub fn lines(&self) -> Vec<Value> {
        let l = &self.load;
        let setting = json!({
            "device": self.device, "shape": l.shape, "streams": l.streams, "prompt": l.prompt,
            "gen": l.new_tokens, "rounds": l.rounds, "payers": l.payers,
        });
        let line = |metric: &str, paid: f64, unpaid: f64, extra: Value| {
            let mut v = json!({"metric": metric, "paid": paid, "unpaid": unpaid, "ratio": paid / unpaid});
            for fields in [&extra, &setting] {
                if let (Some(v), Some(f)) = (v.as_object_mut(), fields.as_object()) {
                    v.extend(f.clone());
                }
            }
            v
        };
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        let (p, u) = (&self.paid, &self.unpaid);
        let mut lines = vec![line(
            "paid_load_output_tok_s",
            p.tok_s(),
            u.tok_s(),
            json!({"goal_ratio_at_least": 0.98, "paid_per_round": p.tok_s_per_round, "unpaid_per_round": u.tok_s_per_round}),
        )];
        for (name, q) in [("p50", 0.5), ("p99", 0.99)] {
            lines.push(line(
                &format!("paid_load_ttft_ms_{name}"),
                ms(percentile(&p.ttft, q)),
                ms(percentile(&u.ttft, q)),
                json!({}),
            ));
            lines.push(line(
                &format!("paid_load_latency_ms_{name}"),
                ms(percentile(&p.latency, q)),
                ms(percentile(&u.latency, q)),
                json!({}),
            ));
        }
        let expected = l.streams * l.new_tokens * l.rounds;
        lines.push(line(
            "paid_load_completion_tokens",
            p.tokens as f64,
            u.tokens as f64,
            json!({"expected": expected, "requests_each": p.requests}),
        ));
        let g = &self.ledger;
        lines.push(json!({
            "metric": "paid_load_payments", "paid_requests": g.paid_requests, "payment_settled_events": g.settled,
            "payment_served_events": g.served, "transfers_on_chain": g.transfers,
        }));
        lines
    }
}

/// Runs the benchmark: the model is made here, then the node, anvil and the loads run on a
/// runtime of their own.
pub fn run(load: &PaidServing) -> anyhow::Result<Report> {
    ensure!(
        load.streams > 0 && load.new_tokens > 0 && load.rounds > 0 && load.payers > 0,
        "streams, new tokens, rounds and payers must be at least 1"
    );
    mindxtrain_node::training::keep_freed_memory();
    let (model, device) = served_model(load)?;
    let node = TempNode::new()?;
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let report = runtime.block_on(measure(load, model, &node)).map(|(unpaid, paid, ledger)| Report {
        load: load.clone(),
        device,
        unpaid,
        paid,
        ledger,
    });
    // The servers' and the reconciler's tasks hold the log: they end with the runtime, and the
    // log closes before the node's directory goes.
    drop(runtime);
    report
}

/// The model of `load.shape` on random weights whose head picks only ASCII, served under the
/// demo recipe's tokenizer and price with `streams` slots of `prompt + gen` tokens; and its
/// device's name.
fn served_model(load: &PaidServing) -> anyhow::Result<(ServedModel, String)> {
    let src = mindxtrain_node::recipes::EMBEDDED_RECIPES
        .iter()
        .find(|(n, _)| *n == RECIPE)
        .map(|(_, s)| *s)
        .with_context(|| format!("embedded recipe {RECIPE} missing"))?;
    let mut recipe = Recipe::check_str(src, RECIPE).map_err(|e| anyhow::anyhow!("{RECIPE}: {e}"))?.recipe;
    recipe.serve.max_batch = u32::try_from(load.streams)?;
    recipe.serve.max_model_len = u32::try_from(load.prompt + load.new_tokens)?;
    let tokenizer = Tokenizer::from_recipe(&recipe.model, Path::new("."), None)?;
    // `cuda` alone is the first GPU, as `serve --device` reads it.
    let device = mindxtrain_trainer::run::named_device(if load.device == "cuda" { "cuda:0" } else { &load.device })?;
    let config = LmConfig::timing_shape(&load.shape)
        .with_context(|| format!("shape {:?}: expected tiny, 0.6B, 1.7B or 8B", load.shape))?;
    let dtype = if device.is_cuda() { DType::BF16 } else { DType::F32 };
    let mut model = CausalLm::init_for_timing(&config, dtype, &device)?;
    ascii_only_head(&mut model, tokenizer.vocab_size().min(config.vocab_size))?;
    let served = ServedModel::from_model(recipe, format!("bench-qwen3-{}", load.shape), model, tokenizer)?;
    Ok((served, mindxtrain_trainer::run::device_name(&device)))
}

/// Zeroes the head's rows `ASCII..vocab` (the module's doc says why).
fn ascii_only_head(model: &mut CausalLm, vocab: usize) -> anyhow::Result<()> {
    ensure!(vocab > ASCII, "a vocabulary of {vocab} has nothing to zero beyond ASCII");
    let name = if model.config().tie_word_embeddings { EMBED } else { LM_HEAD };
    let (hidden, dtype, device) = (model.config().hidden_size, model.dtype(), model.device().clone());
    let params = model.params_mut();
    let head = params.get(name).with_context(|| format!("no {name}"))?;
    let zeros = Tensor::zeros((vocab - ASCII, hidden), dtype, &device)?;
    let head = head.slice_scatter0(&zeros, ASCII)?;
    params.insert(name.to_owned(), head);
    Ok(())
}

/// The two servers of one node and engine, the loads (unpaid, paid), and the payments' trace.
async fn measure(load: &PaidServing, model: ServedModel, node: &TempNode) -> anyhow::Result<(Side, Side, Ledger)> {
    let chain = Chain::start().await?;
    let payers: Vec<PrivateKeySigner> = (0..load.payers).map(|_| PrivateKeySigner::random()).collect();
    for p in &payers {
        chain.mint(p.address(), 1_000_000_000_000).await?;
    }
    let billing = model.recipe.publish.billing.x402.clone().context("the recipe sells no calls")?;
    let facilitator = chain.facilitator().await?;
    let evidence = facilitator.evidence();
    let facilitator: Arc<dyn Facilitator> = facilitator;
    // A payee of its own, so that the transfers to it are this run's.
    let pay_to = PrivateKeySigner::random().address();
    let sale = Sale {
        offer: Offer { asset: chain.asset.clone(), pay_to, max_timeout_seconds: 300 },
        payments: serve::payments(&node.log, facilitator, evidence)?,
        prices: billing.pricing,
        rental: billing.rental,
        facilitator_routes: true,
    };
    let name = model.name.clone();
    let rentals = RentalBook::load(node.log.clone(), node.identity.clone())?;
    let state = AppState::new(model, node.log.clone(), rentals, Some(&sale));
    let api = ApiState::new(node.log.clone(), node.identity.clone(), node.dir.path().into(), Some(name.clone()), true);
    api.metrics.watch_engine(state.model.clone());
    let paid = Server::start(serve::router(state.clone(), Some(&sale)), &api).await?;
    let unpaid = Server::start(serve::router(state.clone(), None), &api).await?;
    let paid_url = format!("{}/v1/chat/completions", paid.url);
    let unpaid_url = format!("{}/v1/chat/completions", unpaid.url);

    let http = reqwest::Client::builder().pool_max_idle_per_host(load.streams * 2).build()?;
    let prompts = Prompts::new(&state, load, name)?;
    let required = payment_required_for(&http, &paid_url, &prompts.body(0, 0)).await?;
    let accepted = required.accepts.into_iter().next().context("a 402 that accepts nothing")?;
    let mut driver = Driver { http, load, prompts, accepted, chain: &chain, payers: &payers, next: 0, paid: 0 };
    // Warm-up, not measured: the engine's first steps (CUDA graphs recorded), the
    // connections, the first settlement.
    driver.load(&unpaid_url, false).await?;
    driver.load(&paid_url, true).await?;
    let (mut u, mut p) = (Side::default(), Side::default());
    for round in 0..load.rounds {
        for is_paid in if round % 2 == 0 { [false, true] } else { [true, false] } {
            let (samples, seconds) = driver.load(if is_paid { &paid_url } else { &unpaid_url }, is_paid).await?;
            (if is_paid { &mut p } else { &mut u }).add(samples, seconds);
        }
    }
    let ledger = ledger(node, &chain, pay_to, driver.paid).await?;
    paid.stop().await;
    unpaid.stop().await;
    Ok((u, p, ledger))
}

/// A listener with the node's app on it, as `mindxtrain serve` wraps its routes.
struct Server {
    url: String,
    shutdown: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl Server {
    async fn start(routes: axum::Router, api: &ApiState) -> anyhow::Result<Server> {
        let loopback = std::net::Ipv4Addr::LOCALHOST.into();
        let app = api::host::guard(api::with_limits(routes), loopback, AllowedHosts::new(Vec::<String>::new()));
        let app = api::with_metrics(app, api.metrics.clone());
        let listener = tokio::net::TcpListener::bind((loopback, 0)).await?;
        let url = format!("http://{}", listener.local_addr()?);
        let (shutdown, rx) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(listener::serve(listener, app, listener::Limits::default(), async {
            let _ = rx.await;
        }));
        Ok(Server { url, shutdown, task })
    }

    async fn stop(self) {
        let _ = self.shutdown.send(());
        let _ = self.task.await;
    }
}

/// Distinct prompts of exactly `prompt` tokens: random lowercase words in one user message.
struct Prompts {
    model: String,
    new_tokens: usize,
    /// Letters the message needs beside the chat template's tokens.
    letters: usize,
}

impl Prompts {
    fn new(state: &AppState, load: &PaidServing, model: String) -> anyhow::Result<Prompts> {
        let user = |text: String| [Message::new(Role::User, text)];
        let template = state.model.prompt(&user(String::new()), &[])?.ids.len();
        ensure!(load.prompt > template, "--prompt {}: the chat template alone is {template} tokens", load.prompt);
        let prompts = Prompts { model, new_tokens: load.new_tokens, letters: load.prompt - template };
        // The byte tokenizer makes each letter one token; checked rather than assumed.
        let got = state.model.prompt(&user(prompts.text(0, 0)), &[])?.ids.len();
        ensure!(got == load.prompt, "a prompt came out {got} tokens, not {}", load.prompt);
        Ok(prompts)
    }

    /// The message of stream `i` of load `n` (xorshift over a seed of both).
    fn text(&self, n: usize, i: usize) -> String {
        let mut s = ((n as u64) << 32 | i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..self.letters)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                match s % 6 {
                    0 => ' ',
                    _ => char::from(b'a' + (s >> 8) as u8 % 26),
                }
            })
            .collect()
    }

    /// A streamed, greedy request for exactly `gen` tokens (with `usage` at the end).
    fn body(&self, n: usize, i: usize) -> String {
        json!({
            "model": self.model,
            "messages": [{"role": "user", "content": self.text(n, i)}],
            "max_tokens": self.new_tokens,
            "temperature": 0,
            "stream": true,
            "stream_options": {"include_usage": true},
        })
        .to_string()
    }
}

/// Sends the loads, numbering them so that each has prompts of its own.
struct Driver<'a> {
    http: reqwest::Client,
    load: &'a PaidServing,
    prompts: Prompts,
    accepted: PaymentRequirements,
    chain: &'a Chain,
    payers: &'a [PrivateKeySigner],
    /// Loads sent so far.
    next: usize,
    /// Paid requests sent so far.
    paid: usize,
}

impl Driver<'_> {
    /// `streams` requests sent at once to `url`; their samples and the load's wall seconds.
    async fn load(&mut self, url: &str, paid: bool) -> anyhow::Result<(Vec<Sample>, f64)> {
        let n = self.next;
        self.next += 1;
        let bodies: Vec<String> = (0..self.load.streams).map(|i| self.prompts.body(n, i)).collect();
        // Signed now, before the clock starts; each authorization is valid for 60 s.
        let payments: Vec<Option<String>> = (0..self.load.streams)
            .map(|i| {
                paid.then(|| {
                    let payer = &self.payers[(self.paid + i) % self.payers.len()];
                    header::encode(&signed_payment(payer, &self.accepted, &self.chain.asset, |_| {}))
                })
            })
            .collect();
        if paid {
            self.paid += self.load.streams;
        }
        let start = Instant::now();
        let tasks: Vec<_> = bodies
            .into_iter()
            .zip(payments)
            .map(|(body, payment)| tokio::spawn(stream(self.http.clone(), url.to_owned(), body, payment)))
            .collect();
        let mut samples = Vec::with_capacity(tasks.len());
        for task in tasks {
            samples.push(task.await??);
        }
        Ok((samples, start.elapsed().as_secs_f64()))
    }
}

/// One streamed completion, read to its end.
async fn stream(http: reqwest::Client, url: String, body: String, payment: Option<String>) -> anyhow::Result<Sample> {
    let start = Instant::now();
    let mut req = http.post(&url).header("content-type", "application/json").body(body);
    if let Some(p) = &payment {
        req = req.header(header::PAYMENT_SIGNATURE, p);
    }
    let mut resp = req.send().await?;
    let status = resp.status();
    if status != 200 {
        bail!("{url}: status {status}: {}", resp.text().await.unwrap_or_default());
    }
    ensure!(
        payment.is_none() || resp.headers().contains_key(header::PAYMENT_RESPONSE),
        "{url}: paid, but no PAYMENT-RESPONSE"
    );
    let (mut pending, mut ttft, mut tokens, mut done) = (Vec::new(), None, None, false);
    while let Some(chunk) = resp.chunk().await? {
        pending.extend_from_slice(&chunk);
        while let Some(end) = pending.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = pending.drain(..=end).collect();
            let Some(data) = line.strip_prefix(b"data: ") else { continue };
            let data = data.trim_ascii_end();
            if data == b"[DONE]" {
                done = true;
                continue;
            }
            let v: Value = serde_json::from_slice(data).context("an event of the stream")?;
            if let Some(e) = v.get("error") {
                bail!("{url}: the stream failed: {e}");
            }
            let text = v.pointer("/choices/0/delta/content").and_then(Value::as_str);
            if ttft.is_none() && text.is_some_and(|t| !t.is_empty()) {
                ttft = Some(start.elapsed());
            }
            if let Some(n) = v.pointer("/usage/completion_tokens").and_then(Value::as_u64) {
                tokens = Some(n as usize);
            }
        }
    }
    ensure!(done, "{url}: the stream ended before [DONE]");
    Ok(Sample {
        ttft: ttft.context("a stream with no text")?,
        latency: start.elapsed(),
        tokens: tokens.context("a stream with no usage")?,
    })
}

/// The payments as the log and the chain record them. `payment.served` is group-committed
/// after each answer's last byte with nothing waiting for it: waited for here, up to 30 s.
async fn ledger(
    node: &TempNode,
    chain: &Chain,
    pay_to: mindxtrain_x402::alloy::primitives::Address,
    paid_requests: usize,
) -> anyhow::Result<Ledger> {
    let count = |kind: &'static str| {
        let log = node.log.clone();
        async move {
            let seqs = tokio::task::spawn_blocking(move || log.query(&Query::Kind(kind.into()))).await??;
            anyhow::Ok(seqs.len())
        }
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while count("payment.served").await? < paid_requests && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(Ledger {
        paid_requests,
        settled: count("payment.settled").await?,
        served: count("payment.served").await?,
        transfers: chain.transfers_to(pay_to).await?.len(),
    })
}
