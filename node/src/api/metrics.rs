//! Prometheus metrics: HTTP requests by route and status (with latency), the log's appends
//! and syncs, and what the event stream says — events by kind, payments, training progress
//! per run, anchor latency. The event part is a fold of the log itself, so it counts what
//! happened before this process started too.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use axum::extract::{MatchedPath, Request, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde_json::Value;

use super::ApiState;
use crate::log::{Event, EventLog};
use crate::serve::model::ServedModel;

/// Upper bounds (seconds) of the request latency histogram.
const BUCKETS: [f64; 10] = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 10.0];

#[derive(Default)]
pub struct Metrics {
    http: Mutex<BTreeMap<(String, String, u16), u64>>,
    latency: Mutex<BTreeMap<String, Histogram>>,
    events: Mutex<Fold>,
    /// The served model's engine, when one is served: its queue, batch, cache and latencies.
    engine: Mutex<Option<Arc<ServedModel>>>,
}

#[derive(Default, Clone)]
struct Histogram {
    buckets: [u64; BUCKETS.len()],
    count: u64,
    sum: f64,
}

/// What the log's events add up to.
#[derive(Default)]
struct Fold {
    seen: u64,
    by_kind: BTreeMap<String, u64>,
    settled_atomic: u128,
    runs: BTreeMap<String, RunGauges>,
    anchors_submitted: HashMap<String, f64>,
    anchor_latency: Histogram,
}

#[derive(Default, Clone, Copy)]
struct RunGauges {
    step: f64,
    loss: f64,
    lr: f64,
    tokens_per_s: f64,
}

fn unix_seconds(rfc3339: &str) -> Option<f64> {
    let t = humantime::parse_rfc3339(rfc3339).or_else(|_| humantime::parse_rfc3339_weak(rfc3339)).ok()?;
    t.duration_since(std::time::UNIX_EPOCH).ok().map(|d| d.as_secs_f64())
}

impl Fold {
    fn add(&mut self, ev: &Event) {
        let e = &ev.envelope;
        self.seen = e.seq + 1;
        *self.by_kind.entry(e.kind.clone()).or_default() += 1;
        let num = |k: &str| e.data.get(k).and_then(Value::as_f64);
        match e.kind.as_str() {
            "payment.settled" => {
                let amount = e.data.get("amount").and_then(Value::as_str).and_then(|a| a.parse::<u128>().ok());
                self.settled_atomic += amount.unwrap_or(0);
            }
            "train.progress" => {
                let g = self.runs.entry(e.subject.clone()).or_default();
                *g = RunGauges {
                    step: num("step").unwrap_or(g.step),
                    loss: num("loss").unwrap_or(g.loss),
                    lr: num("lr").unwrap_or(g.lr),
                    tokens_per_s: num("tokens_per_s").unwrap_or(g.tokens_per_s),
                };
            }
            "anchor.submitted" => {
                if let (Some(tx), Some(t)) = (e.data.get("tx").and_then(Value::as_str), unix_seconds(&e.time)) {
                    self.anchors_submitted.insert(tx.to_owned(), t);
                }
            }
            "anchor.confirmed" => {
                let tx = e.data.get("tx").and_then(Value::as_str).unwrap_or_default();
                if let (Some(sent), Some(t)) = (self.anchors_submitted.remove(tx), unix_seconds(&e.time)) {
                    self.anchor_latency.observe((t - sent).max(0.0));
                }
            }
            _ => {}
        }
    }
}

impl Histogram {
    fn observe(&mut self, seconds: f64) {
        for (b, le) in self.buckets.iter_mut().zip(BUCKETS) {
            if seconds <= le {
                *b += 1;
            }
        }
        self.count += 1;
        self.sum += seconds;
    }

    fn render(&self, out: &mut String, name: &str, labels: &str) {
        let sep = if labels.is_empty() { "" } else { "," };
        for (b, le) in self.buckets.iter().zip(BUCKETS) {
            let _ = writeln!(out, "{name}_bucket{{{labels}{sep}le=\"{le}\"}} {b}");
        }
        let _ = writeln!(out, "{name}_bucket{{{labels}{sep}le=\"+Inf\"}} {}", self.count);
        let braces = if labels.is_empty() { String::new() } else { format!("{{{labels}}}") };
        let _ = writeln!(out, "{name}_sum{braces} {}", self.sum);
        let _ = writeln!(out, "{name}_count{braces} {}", self.count);
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A label value with `\`, `"` and newlines escaped.
fn label(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

impl Metrics {
    /// Folds the log from the start, then each new event, in a background task.
    pub fn follow(self: &Arc<Self>, log: Arc<EventLog>) {
        let metrics = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut changed = log.subscribe();
            loop {
                let Some(m) = metrics.upgrade() else { return };
                let from = lock(&m.events).seen;
                let size = log.len();
                let mut next = from;
                while next < size {
                    let to = (next + 1024).min(size);
                    let Ok(batch) = log.read(|v| v.range(next, to)) else { return };
                    let mut fold = lock(&m.events);
                    batch.iter().for_each(|e| fold.add(e));
                    next = to;
                }
                drop(m);
                if changed.changed().await.is_err() {
                    return;
                }
            }
        });
    }

    /// Reports the serving engine of `model` too.
    pub fn watch_engine(&self, model: Arc<ServedModel>) {
        *lock(&self.engine) = Some(model);
    }

    fn observe(&self, route: String, method: String, status: u16, seconds: f64) {
        lock(&self.latency).entry(route.clone()).or_default().observe(seconds);
        *lock(&self.http).entry((route, method, status)).or_default() += 1;
    }

    /// The Prometheus text exposition.
    pub fn render(&self, log: &EventLog) -> String {
        let mut out = String::new();
        let stats = log.stats();
        fn metric(out: &mut String, name: &str, kind: &str, help: &str) {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        }
        metric(&mut out, "mindxtrain_log_events", "gauge", "Durable events in the log.");
        metric(&mut out, "mindxtrain_log_syncs_total", "counter", "fdatasync calls by this process (group commits).");
        let _ = writeln!(out, "mindxtrain_log_events {}\nmindxtrain_log_syncs_total {}", stats.events, stats.syncs);
        metric(&mut out, "mindxtrain_log_up", "gauge", "1 while the log's writer accepts appends.");
        let _ = writeln!(out, "mindxtrain_log_up {}", u8::from(log.stopped().is_none()));
        metric(&mut out, "mindxtrain_http_requests_total", "counter", "HTTP requests by route, method and status.");
        for ((route, method, status), n) in lock(&self.http).iter() {
            let _ = writeln!(
                out,
                "mindxtrain_http_requests_total{{route=\"{}\",method=\"{method}\",status=\"{status}\"}} {n}",
                label(route)
            );
        }
        metric(
            &mut out,
            "mindxtrain_http_request_duration_seconds",
            "histogram",
            "Time to the response head, by route.",
        );
        for (route, h) in lock(&self.latency).iter() {
            h.render(&mut out, "mindxtrain_http_request_duration_seconds", &format!("route=\"{}\"", label(route)));
        }
        let fold = lock(&self.events);
        metric(&mut out, "mindxtrain_events_total", "counter", "Events in the log by kind.");
        for (kind, n) in &fold.by_kind {
            let _ = writeln!(out, "mindxtrain_events_total{{kind=\"{}\"}} {n}", label(kind));
        }
        metric(
            &mut out,
            "mindxtrain_payments_settled_atomic_total",
            "counter",
            "Sum of settled payments, atomic units.",
        );
        let _ = writeln!(out, "mindxtrain_payments_settled_atomic_total {}", fold.settled_atomic);
        for (name, help, pick) in [
            (
                "mindxtrain_train_step",
                "Last recorded step of each run.",
                (|g: &RunGauges| g.step) as fn(&RunGauges) -> f64,
            ),
            ("mindxtrain_train_loss", "Last recorded training loss of each run.", |g| g.loss),
            ("mindxtrain_train_lr", "Last recorded learning rate of each run.", |g| g.lr),
            ("mindxtrain_train_tokens_per_second", "Training throughput of each run.", |g| g.tokens_per_s),
        ] {
            metric(&mut out, name, "gauge", help);
            for (run, g) in &fold.runs {
                let _ = writeln!(out, "{name}{{run_id=\"{}\"}} {}", label(run), pick(g));
            }
        }
        metric(&mut out, "mindxtrain_anchor_latency_seconds", "histogram", "anchor.submitted to anchor.confirmed.");
        fold.anchor_latency.render(&mut out, "mindxtrain_anchor_latency_seconds", "");
        drop(fold);
        if let Some(model) = lock(&self.engine).as_ref() {
            render_engine(&mut out, model, metric);
        }
        out
    }
}

/// The serving engine's gauges and latency histograms.
fn render_engine(out: &mut String, model: &ServedModel, metric: fn(&mut String, &str, &str, &str)) {
    use mindxtrain_trainer::infer::latency::BUCKETS;
    let s = model.stats();
    for (name, kind, help, v) in [
        ("mindxtrain_engine_waiting", "gauge", "Requests queued in the engine, not yet running.", s.waiting),
        ("mindxtrain_engine_running", "gauge", "Requests in the engine's running batch.", s.running),
        ("mindxtrain_engine_kv_blocks_used", "gauge", "Key/value cache blocks held by requests.", s.kv_used_blocks),
        ("mindxtrain_engine_kv_blocks_total", "gauge", "Key/value cache blocks of the engine.", s.kv_total_blocks),
        ("mindxtrain_engine_steps_total", "counter", "Steps the engine ran.", s.steps),
        (
            "mindxtrain_engine_steps_queued_ahead_total",
            "counter",
            "Decode steps queued on the device before the tokens of the step before them were read.",
            s.steps_ahead,
        ),
    ] {
        metric(out, name, kind, help);
        let _ = writeln!(out, "{name} {v}");
    }
    let lat = model.latencies();
    for (name, help, h) in [
        ("mindxtrain_engine_time_to_first_token_seconds", "Submission to first token.", &lat.first_token),
        ("mindxtrain_engine_inter_token_seconds", "Between consecutive tokens of a completion.", &lat.inter_token),
    ] {
        metric(out, name, "histogram", help);
        for (b, le) in h.buckets.iter().zip(BUCKETS) {
            let _ = writeln!(out, "{name}_bucket{{le=\"{le}\"}} {b}");
        }
        let _ =
            writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {}\n{name}_sum {}\n{name}_count {}", h.count, h.sum, h.count);
    }
}

/// Counts every request by its route (the pattern, not the path) and status.
pub async fn track(State(m): State<Arc<Metrics>>, req: Request, next: Next) -> Response {
    let route = req.extensions().get::<MatchedPath>().map_or_else(|| "unmatched".to_owned(), |p| p.as_str().to_owned());
    let method = req.method().to_string();
    let started = Instant::now();
    let r = next.run(req).await;
    m.observe(route, method, r.status().as_u16(), started.elapsed().as_secs_f64());
    r
}

/// `GET /metrics`.
pub async fn render(State(s): State<Arc<ApiState>>) -> Response {
    let body = s.metrics.render(&s.log);
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], body).into_response()
}
