//! The operator API through the binary: every route of the OpenAPI document answers, with
//! the token where the document says so and without it elsewhere; the log over HTTP (range,
//! live tail, proofs against a signed checkpoint); metrics; the token file.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;

use mindxtrain_tests::mindxtrain;
use mindxtrain_tests::served::{self, Server, get_json};
use serde_json::Value;

/// `mindxtrain serve` (operator API only) in a new node, with its token checked.
struct Node {
    /// Kept for its lifetime: the node is killed when the test drops it.
    server: Server,
    url: String,
    token: String,
}

impl Node {
    fn start(dir: &Path) -> Node {
        assert!(mindxtrain(dir, &["init"]).output().unwrap().status.success());
        let server = Server::run(dir, &["serve"]);
        assert_eq!(server.started["model"], Value::Null, "no model: the operator API only");
        let token_file = dir.join("api.token");
        assert_eq!(server.started["token_file"], token_file.display().to_string());
        let mode = std::fs::metadata(&token_file).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "the token file is private");
        Node { url: server.url.clone(), token: Server::token(dir), server }
    }

    /// POSTs `body` as JSON to `path` with the token.
    fn post(
        &self,
        http: &reqwest::Client,
        path: &str,
        body: Value,
    ) -> impl Future<Output = reqwest::Result<reqwest::Response>> + use<> {
        http.post(format!("{}{path}", self.url)).bearer_auth(&self.token).json(&body).send()
    }

    /// GETs `path` (with the token when `auth`), expecting 200 and JSON.
    async fn get(&self, http: &reqwest::Client, path: &str, auth: bool) -> Value {
        get_json(http, &format!("{}{path}", self.url), auth.then_some(self.token.as_str())).await
    }
}

/// A documented path with its parameters filled in.
fn concrete(path: &str) -> String {
    ["{id}", "{name}", "{blake3}", "{run_id}"]
        .iter()
        .fold(path.replace("{seq}", "0"), |p, param| p.replace(param, "unknown"))
}

/// Calls every route of `doc` on `url` without, with a wrong and with the right token;
/// checks each guards as documented and exists. Returns how many were called.
async fn walk(http: &reqwest::Client, url: &str, token: &str, doc: &Value) -> usize {
    let paths = doc["paths"].as_object().unwrap();
    let mut checked = 0;
    for (path, methods) in paths {
        for (method, op) in methods.as_object().unwrap() {
            let full = format!("{url}{}", concrete(path));
            let guarded = op["security"].as_array().unwrap().iter().any(|s| s.get("bearer").is_some());
            let request = |token: Option<&str>| {
                let mut r = match method.as_str() {
                    "get" => http.get(&full),
                    "post" => http.post(&full),
                    m => panic!("{m} {path}: method not covered by this test"),
                };
                if let Some(t) = token {
                    r = r.bearer_auth(t);
                }
                // A live tail would stream forever: the head is all this test needs.
                r.timeout(Duration::from_secs(5)).send()
            };
            let anonymous = request(None).await.unwrap();
            let wrong = request(Some("mxa1.not-the-token")).await.unwrap();
            let with_token = request(Some(token)).await.unwrap();
            let (a, w, t) = (anonymous.status().as_u16(), wrong.status().as_u16(), with_token.status().as_u16());
            if guarded {
                assert_eq!((a, w), (401, 401), "{method} {path} needs the token");
                assert!(anonymous.headers().get("www-authenticate").is_some(), "{method} {path}");
            } else {
                assert_ne!(a, 401, "{method} {path} is open");
            }
            // A 404 is right for an unknown `{id}`, never for a missing route (`unknown_url`).
            // (Other bodies are left unread: a live tail never ends.)
            let known_resource_missing = t == 404
                && serde_json::from_slice::<Value>(&with_token.bytes().await.unwrap())
                    .is_ok_and(|b| b["error"]["code"].is_string() && b["error"]["code"] != "unknown_url");
            assert!(
                ![401, 405].contains(&t) && (t != 404 || known_resource_missing),
                "{method} {path} with the token answered {t}"
            );
            checked += 1;
        }
    }
    checked
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_documented_route_answers_and_guards_as_documented() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(dir.path());
    let http = reqwest::Client::builder().timeout(Duration::from_secs(10)).build().unwrap();
    let doc: Value = node.get(&http, "/openapi.json", false).await;
    assert_eq!(doc["openapi"], "3.1.0");
    let paths = doc["paths"].as_object().unwrap();
    assert!(paths.len() >= 9, "{paths:?}");
    assert!(!paths.contains_key("/v1/chat/completions"), "no model routes without a model");
    for ui in ["/", "/ui/", "/ui/app.js", "/ui/app.css"] {
        assert!(paths.contains_key(ui), "{ui} is documented");
    }
    let checked = walk(&http, &node.url, &node.token, &doc).await;
    assert!(checked >= 10, "{checked} routes checked");

    // An ed25519-signed request (here with the node's own key) passes the same guard, once.
    let key = mindxtrain_node::identity::Identity::load_from(dir.path()).unwrap();
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
    let body = br#"{"yaml": "meta: {}", "name": "signed.yaml"}"#;
    let signed = |key: &mindxtrain_node::identity::Identity, path: &str, body: &[u8]| {
        mindxtrain_node::api::signed::authorization(key, "POST", path, now, body)
    };
    let send = |auth: String, path: &str, body: &'static [u8]| {
        http.post(format!("{}{path}", node.url))
            .header("authorization", auth)
            .header("content-type", "application/json")
            .body(body.to_vec())
            .send()
    };
    let header = signed(&key, "/api/recipes", body);
    let r = send(header.clone(), "/api/recipes", body).await.unwrap();
    assert_eq!(r.status(), 400, "through the guard to the handler, which refuses the recipe");
    let r = send(header, "/api/recipes", body).await.unwrap();
    assert_eq!(r.status(), 401, "a signature is good once");
    assert!(r.text().await.unwrap().contains("already used"));
    let r = send(signed(&key, "/api/recipes", body), "/api/recipes", b"{}").await.unwrap();
    assert_eq!(r.status(), 401, "the body is signed");
    let stranger = mindxtrain_node::identity::Identity::from_seed([9; 32]);
    let r = send(signed(&stranger, "/api/log/checkpoints", b""), "/api/log/checkpoints", b"").await.unwrap();
    assert_eq!(r.status(), 401, "a key that is neither the node's nor in api.keys");
    let r = send(signed(&key, "/api/log/checkpoints", b""), "/api/log/checkpoints", b"").await.unwrap();
    assert_eq!(r.status(), 200);

    // CORS is off: a cross-origin request gets no Access-Control header, a preflight no allowance.
    let r =
        http.get(format!("{}/api/runs", node.url)).header("origin", "https://elsewhere.example").send().await.unwrap();
    assert!(r.headers().get("access-control-allow-origin").is_none());
    let r = http
        .request(reqwest::Method::OPTIONS, format!("{}/api/runs", node.url))
        .header("origin", "https://elsewhere.example")
        .header("access-control-request-method", "POST")
        .send()
        .await
        .unwrap();
    assert!(r.headers().get("access-control-allow-origin").is_none(), "preflight: {:?}", r.headers());

    // Undocumented paths are 404, even with the token, in the routes' error shape; a documented
    // path asked with another method is 405.
    let r = http.get(format!("{}/api/nothing", node.url)).bearer_auth(&node.token).send().await.unwrap();
    assert_eq!(r.status(), 404);
    let body: Value = r.json().await.unwrap();
    assert_eq!(
        (body["error"]["code"].as_str(), &body["error"]["param"]),
        (Some("unknown_url"), &Value::Null),
        "{body}"
    );
    let r = http.delete(format!("{}/api/runs", node.url)).bearer_auth(&node.token).send().await.unwrap();
    assert_eq!(r.status(), 405);
    assert!(r.headers().get("allow").is_some_and(|a| a.to_str().unwrap().contains("GET")));
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["error"]["code"], "method_not_allowed", "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_model_routes_answer_as_documented_on_a_serving_node() {
    let t = served::trained(1);
    let dir = served::new_node(&t, "server");
    let server = Server::start(&dir, &t, &["--free"]);
    let token = Server::token(&dir);
    let http = reqwest::Client::builder().timeout(Duration::from_secs(10)).build().unwrap();
    let doc = get_json(&http, &format!("{}/openapi.json", server.url), None).await;
    let paths = doc["paths"].as_object().unwrap();
    for model_route in ["/v1/models", "/v1/models/{id}", "/v1/chat/completions", "/v1/rentals", "/v1/rentals/{id}"] {
        assert!(paths.contains_key(model_route), "{model_route} is documented when a model is served");
    }
    assert!(!paths.contains_key("/facilitator/settle"), "served for free: no facilitator");
    let checked = walk(&http, &server.url, &token, &doc).await;
    assert!(checked >= 15, "{checked} routes checked");
    // The limits cover the model routes too.
    let (status, body) = declare_too_large(&server.url, "/v1/chat/completions", None).await;
    assert_eq!(status, 413, "{body}");
}

/// Sends only the head of a POST that declares a body over the 1 MiB limit, then reads
/// the answer: a server that refuses before reading answers without waiting for the
/// body. (Sending the whole body races the server's early close: the client can see a
/// broken pipe before the 413.)
async fn declare_too_large(base: &str, path: &str, token: Option<&str>) -> (u16, Value) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let host = base.trim_start_matches("http://");
    let mut stream = tokio::net::TcpStream::connect(host).await.unwrap();
    let auth = token.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: {host}\r\n{auth}Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        (1 << 20) + 16
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut answer))
        .await
        .expect("answered without the body")
        .unwrap();
    let answer = String::from_utf8_lossy(&answer);
    let status = answer.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    let body = answer.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    (status, serde_json::from_str(body).unwrap_or(Value::Null))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_over_the_limit_is_refused_before_it_is_read() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(dir.path());
    let http = reqwest::Client::new();
    let size = |http: &reqwest::Client| {
        let url = format!("{}/readyz", node.url);
        let http = http.clone();
        async move { get_json(&http, &url, None).await["log_size"].as_u64().unwrap() }
    };
    let before = size(&http).await;
    for path in ["/api/recipes", "/api/log/checkpoints", "/api/runs"] {
        let (status, body) = declare_too_large(&node.url, path, Some(&node.token)).await;
        assert_eq!(status, 413, "{path}: {body}");
        assert_eq!(body["error"]["code"], "body_too_large", "{body}");
    }
    assert_eq!(get_json(&http, &format!("{}/healthz", node.url), None).await["status"], "ok");
    assert_eq!(size(&http).await, before, "nothing was appended");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_cancels_the_run_closes_the_log_and_exits_zero() {
    let dir = tempfile::tempdir().unwrap();
    let mut node = Node::start(dir.path());
    let http = reqwest::Client::new();
    let r = node.post(&http, "/api/runs", serde_json::json!({"recipe": "tiny_cpu_pretrain.yaml"})).await.unwrap();
    assert_eq!(r.status(), 202);
    let launched: Value = r.json().await.unwrap();
    let status_url = format!("{}/api/runs/{}", node.url, launched["id"].as_str().unwrap());
    let st = wait_for(&http, &status_url, |s| s["phase"] == "training" && s["step"].as_u64() >= Some(2)).await;
    let out_dir = std::path::PathBuf::from(st["out_dir"].as_str().unwrap());

    let pid = node.server.child.id().to_string();
    assert!(std::process::Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
    let mut exited = None;
    for _ in 0..1200 {
        if let Some(status) = node.server.child.try_wait().unwrap() {
            exited = Some(status);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let status = exited.expect("serve exits within 120 s of SIGTERM");
    assert_eq!(status.code(), Some(0), "a clean exit");

    // The log (no longer locked) verifies and tells the run's end; the cancel checkpointed.
    let verify = mindxtrain(dir.path(), &["log", "verify"]).output().unwrap();
    assert!(verify.status.success(), "{}", String::from_utf8_lossy(&verify.stdout));
    let shown = served::ok(mindxtrain(dir.path(), &["--json", "log", "show"]).output().unwrap());
    let events = shown.as_array().unwrap();
    let run_id = events.iter().find(|e| e["kind"] == "run.started").expect("run.started")["subject"].clone();
    let of_run = |kind: &str| events.iter().filter(|e| e["kind"] == kind && e["subject"] == run_id).count();
    assert_eq!(of_run("run.cancelled"), 1, "{events:?}");
    assert!(of_run("checkpoint.saved") >= 1, "{events:?}");
    assert!(out_dir.join("checkpoints").read_dir().unwrap().next().is_some(), "checkpointed when stopped");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_log_over_http_tails_live_and_proves_against_a_signed_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(dir.path());
    let http = reqwest::Client::new();
    let get = |path: &str| http.get(format!("{}{path}", node.url)).bearer_auth(&node.token).send();

    // A live tail from the start: the genesis event, then a checkpoint recorded meanwhile.
    let mut tail = get("/api/log/tail?from=0").await.unwrap();
    assert_eq!(tail.headers()["content-type"], "text/event-stream");
    let mut seen = String::new();
    let mut next_event = async || -> Value {
        loop {
            if let Some(end) = seen.find("\n\n") {
                let block: String = seen.drain(..end + 2).collect();
                if let Some(data) = block.lines().find_map(|l| l.strip_prefix("data: ")) {
                    return serde_json::from_str(data).unwrap();
                }
                continue;
            }
            let chunk = tokio::time::timeout(Duration::from_secs(10), tail.chunk()).await.unwrap().unwrap().unwrap();
            seen.push_str(std::str::from_utf8(&chunk).unwrap());
        }
    };
    assert_eq!(next_event().await["kind"], "log.genesis");
    let recorded: Value = http
        .post(format!("{}/api/log/checkpoints", node.url))
        .bearer_auth(&node.token)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let live = next_event().await;
    assert_eq!((live["kind"].as_str(), live["seq"].as_u64()), (Some("log.checkpointed"), recorded["seq"].as_u64()));

    // The range holds both; the kind filter keeps one.
    let page: Value = get("/api/log?from=0&limit=10").await.unwrap().json().await.unwrap();
    assert_eq!(page["size"], 2);
    assert_eq!(page["events"].as_array().unwrap().len(), 2);
    let only: Value = get("/api/log?kind=log.check").await.unwrap().json().await.unwrap();
    assert_eq!(only["events"].as_array().unwrap().len(), 1);
    assert_eq!(get("/api/log?limit=5000").await.unwrap().status(), 400, "a page is at most 1000 events");

    // An inclusion proof of the genesis event against the open, freshly signed checkpoint.
    let cp: Value = node.get(&http, "/api/log/checkpoint", false).await;
    assert_eq!(cp["size"], 2);
    assert!(cp["note"].as_str().unwrap().contains(&format!("\n{}\n", cp["size"])));
    let proof: Value = node.get(&http, "/api/log/proof/0?size=2", false).await;
    assert_eq!(proof["root"], cp["root"], "the proof is against the signed root");
    let r = http.get(format!("{}/api/log/proof/7", node.url)).send().await.unwrap();
    assert_eq!(r.status(), 404, "no event 7");
    let c: Value = node.get(&http, "/api/log/consistency?old=1", false).await;
    assert_eq!(c["new_root"], cp["root"]);

    // Metrics count the log, its kinds and the requests above.
    let text = get("/metrics").await.unwrap().text().await.unwrap();
    assert!(text.contains("mindxtrain_log_events 2\n"), "{text}");
    assert!(text.contains("mindxtrain_log_up 1\n"));
    assert!(text.contains("mindxtrain_events_total{kind=\"log.checkpointed\"} 1\n"), "{text}");
    assert!(
        text.contains("mindxtrain_http_requests_total{route=\"/api/log\",method=\"GET\",status=\"200\"} 2\n"),
        "{text}"
    );
    assert!(text.contains("route=\"/api/log/proof/{seq}\""), "counted by route pattern, not path");
    let ready: Value = node.get(&http, "/readyz", false).await;
    assert_eq!((ready["ready"].as_bool(), ready["log_size"].as_u64()), (Some(true), Some(2)));
}

/// Waits until the run's status satisfies `done`, and returns it.
async fn wait_for(http: &reqwest::Client, url: &str, done: impl Fn(&Value) -> bool) -> Value {
    for _ in 0..2400 {
        let st: Value = http.get(url).send().await.unwrap().json().await.unwrap();
        assert_ne!(st["phase"], "failed", "{st}");
        if done(&st) {
            return st;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{url} never got there");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_is_launched_cancelled_resumed_and_sealed_over_the_api() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(dir.path());
    let http = reqwest::Client::new();
    let post = |path: &str, body: Value| node.post(&http, path, body);

    // A broken recipe is refused with every error located; nothing starts.
    let good = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../recipes/tiny_cpu_lora.yaml")).unwrap();
    let line = good.lines().position(|l| l.trim() == "r: 8").unwrap() + 1;
    let bad = good.replace("    r: 8\n", "    r: 0\n");
    let r = post("/api/runs", serde_json::json!({"yaml": bad, "name": "bad.yaml"})).await.unwrap();
    assert_eq!(r.status(), 400);
    let body: Value = r.json().await.unwrap();
    let errors = body["errors"].as_array().unwrap();
    assert!(!errors.is_empty() && errors.iter().all(|e| e["text"].as_str().unwrap().starts_with("bad.yaml")), "{body}");
    assert!(
        errors.iter().any(|e| e["line"].as_u64() == Some(line as u64) && e["path"] == "train.method.r"),
        "the r: 0 on line {line} is named: {body}"
    );
    let v: Value = http
        .post(format!("{}/api/recipes/validate", node.url))
        .json(&serde_json::json!({"yaml": bad, "name": "bad.yaml"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!((v["valid"].as_bool(), v["errors"].as_array().map(Vec::len)), (Some(false), Some(errors.len())));

    let recipes: Value = node.get(&http, "/api/recipes", false).await;
    assert!(recipes["recipes"].as_array().unwrap().iter().any(|r| r["name"] == "tiny_cpu_pretrain.yaml"));

    // Launch, watch it train, cancel it mid-way. The demo's pretraining, shortened: launch,
    // cancel and resume are tested here, not learning (1,600 debug-build steps on a loaded
    // 2-core CI machine outlast the waits below).
    let pretrain = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../recipes/tiny_cpu_pretrain.yaml"))
        .unwrap()
        .replace("max_steps: 1600", "max_steps: 400")
        .replace("every_steps: 800", "every_steps: 200");
    assert!(pretrain.contains("max_steps: 400"), "tiny_cpu_pretrain.yaml changed shape");
    let r = post("/api/runs", serde_json::json!({"yaml": pretrain, "name": "pretrain.yaml"})).await.unwrap();
    assert_eq!(r.status(), 202);
    let launched: Value = r.json().await.unwrap();
    let status_url = format!("{}/api/runs/{}", node.url, launched["id"].as_str().unwrap());
    let mut events = http.get(format!("{status_url}/events")).send().await.unwrap();
    let st = wait_for(&http, &status_url, |s| s["phase"] == "training" && s["step"].as_u64() >= Some(3)).await;
    let busy = post("/api/runs", serde_json::json!({"recipe": "tiny_cpu_lora.yaml"})).await.unwrap();
    assert_eq!(busy.status(), 409, "one run at a time");
    let cancel = http.post(format!("{status_url}/cancel")).bearer_auth(&node.token).send().await.unwrap();
    assert_eq!(cancel.status(), 202);
    let cancelled = wait_for(&http, &status_url, |s| s["phase"] == "cancelled").await;
    let stopped_at = cancelled["step"].as_u64().unwrap();
    assert!(stopped_at >= st["step"].as_u64().unwrap() && stopped_at < cancelled["total_steps"].as_u64().unwrap());
    let run_id = cancelled["run_id"].as_str().unwrap().to_owned();
    let out_dir = std::path::PathBuf::from(cancelled["out_dir"].as_str().unwrap());
    assert!(out_dir.join("checkpoints").read_dir().unwrap().next().is_some(), "checkpointed when cancelled");

    // Resume: it continues from that checkpoint to the end, and is sealed.
    let r = http.post(format!("{status_url}/resume")).bearer_auth(&node.token).send().await.unwrap();
    assert_eq!(r.status(), 202);
    let done = wait_for(&http, &status_url, |s| s["phase"] == "finished").await;
    assert_eq!(done["run_id"], run_id.as_str(), "the same run");
    assert_eq!(done["step"], done["total_steps"]);
    assert!(std::path::Path::new(done["manifest"].as_str().unwrap()).is_file());

    // Metrics follow the run from the log (a fold, a moment behind): its last recorded step,
    // loss, lr and throughput; the log's syncs.
    let series = |name: &str| format!("{name}{{run_id=\"{run_id}\"}} ");
    let mut text = String::new();
    for _ in 0..100 {
        let r = http.get(format!("{}/metrics", node.url)).bearer_auth(&node.token).send().await.unwrap();
        text = r.text().await.unwrap();
        if text.contains(&series("mindxtrain_train_step")) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let value = |name: &str| -> f64 {
        let line = text.lines().find_map(|l| l.strip_prefix(series(name).as_str()));
        line.unwrap_or_else(|| panic!("no {name} of {run_id} in {text}")).parse().unwrap()
    };
    let step = value("mindxtrain_train_step");
    assert!(step > stopped_at as f64 && step <= done["total_steps"].as_f64().unwrap(), "step {step}: {text}");
    let loss = value("mindxtrain_train_loss");
    assert!(loss.is_finite() && loss > 0.0 && loss < 20.0, "loss {loss}");
    let lr = value("mindxtrain_train_lr");
    assert!(lr.is_finite() && (0.0..1.0).contains(&lr), "lr {lr}");
    assert!(value("mindxtrain_train_tokens_per_second") > 0.0, "{text}");
    let syncs: u64 = text.lines().find_map(|l| l.strip_prefix("mindxtrain_log_syncs_total ")).unwrap().parse().unwrap();
    assert!(syncs > 0, "{text}");

    // The run's live stream saw its whole story, in order.
    let mut seen = String::new();
    let wanted = ["run.started", "train.progress", "run.cancelled", "run.resumed", "manifest.sealed"];
    let mut kinds: Vec<String> = Vec::new();
    while !wanted.iter().all(|w| kinds.iter().any(|k| k == w)) {
        let chunk = tokio::time::timeout(Duration::from_secs(30), events.chunk()).await.unwrap().unwrap().unwrap();
        seen.push_str(std::str::from_utf8(&chunk).unwrap());
        kinds = seen.lines().filter_map(|l| l.strip_prefix("event: ")).map(String::from).collect();
    }
    let at = |k: &str| kinds.iter().position(|x| x == k).unwrap();
    assert!(at("run.started") < at("run.cancelled") && at("run.cancelled") < at("run.resumed"), "{kinds:?}");
    assert_eq!(http.post(format!("{status_url}/cancel")).bearer_auth(&node.token).send().await.unwrap().status(), 409);

    // What the run left is read back by kind, newest first, and its receipt verifies here.
    let (client, base) = (&http, node.url.as_str());
    let get = |path: String| async move {
        let r = client.get(format!("{base}{path}")).send().await.unwrap();
        assert_eq!(r.status(), 200, "{path}");
        r.json::<Value>().await.unwrap()
    };
    let checkpoints = get(format!("/api/checkpoints?subject={run_id}&limit=1")).await;
    let newest = &checkpoints["events"][0];
    assert_eq!(
        (newest["kind"].as_str(), newest["subject"].as_str()),
        (Some("checkpoint.saved"), Some(run_id.as_str()))
    );
    assert!(checkpoints["total"].as_u64().unwrap() >= 2, "the cancel's checkpoint and the last: {checkpoints}");
    let older = get(format!("/api/checkpoints?before={}", newest["seq"])).await;
    assert!(older["events"].as_array().unwrap().iter().all(|e| e["seq"].as_u64() < newest["seq"].as_u64()));
    let manifests = get("/api/manifests".into()).await;
    assert_eq!(manifests["events"][0]["subject"], run_id.as_str());
    let plan = get(format!("/api/plans/{}", done["plan_blake3"].as_str().unwrap())).await;
    assert_eq!(plan["blake3"], done["plan_blake3"]);
    assert!(plan["plan"]["choices"].is_object() || plan["plan"]["choices"].is_array(), "{plan}");
    let envelope = get(format!("/api/manifests/{run_id}/envelope")).await;
    assert_eq!(envelope["payloadType"], "application/vnd.in-toto+json");
    let receipt = get(format!("/api/receipts/{run_id}")).await;
    assert_eq!(receipt["manifest"], envelope);
    let verify = |body: Value| http.post(format!("{}/api/receipts/verify", node.url)).json(&body).send();
    let report: Value = verify(receipt.clone()).await.unwrap().json().await.unwrap();
    assert_eq!(report["ok"], true, "{report}");
    let checks = report["report"]["checks"].as_array().unwrap();
    let status_of = |name: &str| checks.iter().find(|c| c["name"] == name).map(|c| c["status"].clone());
    assert_eq!(status_of("manifest.signature"), Some("pass".into()), "{report}");
    assert_eq!(status_of("log.inclusion"), Some("pass".into()), "{report}");
    assert_eq!(status_of("anchor.on_chain"), Some("skipped".into()), "no chain deployed here: {report}");
    // Launched here, so its files, recipe and plan are compared too.
    for local in ["recipe", "plan", "file:run.json", "file:final/model.safetensors"] {
        assert_eq!(status_of(local), Some("pass".into()), "{local}: {report}");
    }
    let mut forged = receipt.clone();
    forged["event"]["seq"] = serde_json::json!(receipt["event"]["seq"].as_u64().unwrap() + 1);
    let report: Value = verify(forged).await.unwrap().json().await.unwrap();
    assert_eq!(report["ok"], false, "a moved event is caught: {report}");
    let r = verify(serde_json::json!({"not": "a receipt"})).await.unwrap();
    assert_eq!(r.status(), 400);
    let anchors = get("/api/anchors".into()).await;
    assert!(anchors["items"].as_array().unwrap().iter().all(|i| i["state"] == "pending"), "{anchors}");
    let r = http.get(format!("{}/api/receipts/no-such-run", node.url)).send().await.unwrap();
    assert_eq!(r.status(), 404);
    // Payer data needs the token.
    assert_eq!(http.get(format!("{}/api/payments", node.url)).send().await.unwrap().status(), 401);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recipes_are_registered_and_planned_over_the_api() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(dir.path());
    let http = reqwest::Client::new();
    let post = |path: &str, body: Value| node.post(&http, path, body);
    let yaml = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../recipes/tiny_cpu_lora.yaml")).unwrap();
    let mine = yaml.replacen("run_name: ", "run_name: mine-", 1);
    let r = post("/api/recipes", serde_json::json!({"yaml": mine, "name": "mine.yaml"})).await.unwrap();
    assert_eq!(r.status(), 201, "new");
    let registered: Value = r.json().await.unwrap();
    let blake3 = registered["recipe"]["blake3"].as_str().unwrap().to_owned();
    assert_eq!(blake3, blake3::hash(mine.as_bytes()).to_hex().as_str());
    let again = post("/api/recipes", serde_json::json!({"yaml": mine, "name": "mine.yaml"})).await.unwrap();
    assert_eq!(again.status(), 200, "known");
    assert_eq!(again.json::<Value>().await.unwrap()["seq"], registered["seq"], "no second event");
    let bad = post("/api/recipes", serde_json::json!({"yaml": "meta: {", "name": "x.yaml"})).await.unwrap();
    assert_eq!(bad.status(), 400);

    let list: Value = node.get(&http, "/api/recipes", false).await;
    assert!(list["registered"].as_array().unwrap().iter().any(|r| r["blake3"] == blake3.as_str()), "{list}");
    let shown: Value = node.get(&http, &format!("/api/recipes/{blake3}"), false).await;
    assert_eq!(shown["yaml"], mine.as_str());
    assert!(shown["resolved"]["train"]["method"].is_object(), "defaults filled in: {shown}");

    // The probe, for the registered recipe by its digest; the plan is recorded and read back.
    let r = post("/api/plans", serde_json::json!({"recipe": blake3})).await.unwrap();
    assert_eq!(r.status(), 201);
    let measured: Value = r.json().await.unwrap();
    let plans: Value = node.get(&http, "/api/plans", false).await;
    assert_eq!(plans["events"][0]["subject"], measured["blake3"]);
    let shown: Value = http
        .get(format!("{}/api/plans/{}", node.url, measured["blake3"].as_str().unwrap()))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(shown["plan"], measured["plan"]);
    assert_eq!(post("/api/plans", serde_json::json!({"recipe": "nope.yaml"})).await.unwrap().status(), 400);
}

/// `GET /api/runs` is the log's: a run trained with `mindxtrain train` is listed beside those
/// launched over the API, and a run cancelled before the node restarted is still there
/// afterwards and resumes to the end. An adapter launched without a base is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_of_the_command_line_and_of_before_a_restart_are_listed_and_resumed() {
    use mindxtrain_tests::micro;
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("node");
    assert!(mindxtrain(&dir, &["init"]).output().unwrap().status.success());
    let base_recipe = tmp.path().join("base.yaml");
    std::fs::write(&base_recipe, micro::recipe("base", 5, micro::FULL, 10, "")).unwrap();
    let out = tmp.path().join("base-run");
    let trained = micro::ok_json(
        &mindxtrain(&dir, &["--json", "train", micro::s(&base_recipe), "--out", micro::s(&out), "--eval-prompts", "1"])
            .output()
            .unwrap(),
    );
    let cli_run = trained["run_id"].as_str().unwrap().to_owned();

    let server = Server::run(&dir, &["serve"]);
    let (url, token) = (server.url.clone(), Server::token(&dir));
    let http = reqwest::Client::new();
    let runs: Value = get_json(&http, &format!("{url}/api/runs"), None).await;
    let listed = runs["runs"].as_array().unwrap().iter().find(|r| r["run_id"] == cli_run.as_str()).cloned();
    let listed = listed.unwrap_or_else(|| panic!("the CLI run is listed: {runs}"));
    assert_eq!((listed["origin"].as_str(), listed["phase"].as_str()), (Some("cli"), Some("finished")), "{listed}");
    assert!(Path::new(listed["manifest"].as_str().unwrap()).is_file(), "{listed}");
    let shown: Value = get_json(&http, &format!("{url}/api/runs/{cli_run}"), None).await;
    assert_eq!(shown["step"], 10);

    let post = |path: String, body: Value| http.post(format!("{url}{path}")).bearer_auth(&token).json(&body).send();
    let r = post("/api/runs".into(), serde_json::json!({"recipe": "tiny_cpu_lora.yaml"})).await.unwrap();
    assert_eq!(r.status(), 400, "an adapter needs a base");
    let e: Value = r.json().await.unwrap();
    assert!(e["error"]["message"].as_str().unwrap().contains("\"base\""), "{e}");

    let lora = micro::recipe("lora", 5, micro::LORA, 1000, "");
    let body = serde_json::json!({"yaml": lora, "name": "lora.yaml", "base": cli_run});
    let r = post("/api/runs".into(), body).await.unwrap();
    assert_eq!(r.status(), 202);
    let id = r.json::<Value>().await.unwrap()["id"].as_str().unwrap().to_owned();
    let status_url = format!("{url}/api/runs/{id}");
    wait_for(&http, &status_url, |s| s["phase"] == "training" && s["step"].as_u64() >= Some(2)).await;
    assert_eq!(post(format!("/api/runs/{id}/cancel"), Value::Null).await.unwrap().status(), 202);
    let cancelled = wait_for(&http, &status_url, |s| s["phase"] == "cancelled").await;
    drop(server);

    // A new process: the run is known from the log, and resumes on the recorded base.
    let server = Server::run(&dir, &["serve"]);
    let (url, http) = (server.url.clone(), reqwest::Client::new());
    let status_url = format!("{url}/api/runs/{id}");
    let after: Value = get_json(&http, &status_url, None).await;
    assert_eq!((after["phase"].as_str(), after["origin"].as_str()), (Some("cancelled"), Some("api")), "{after}");
    assert_eq!(after["run_id"], cancelled["run_id"]);
    assert_eq!(after["step"], cancelled["step"]);
    let r = http.post(format!("{status_url}/resume")).bearer_auth(&token).send().await.unwrap();
    assert_eq!(r.status(), 202, "{}", r.text().await.unwrap());
    let done = wait_for(&http, &status_url, |s| s["phase"] == "finished" && s["manifest"].is_string()).await;
    assert_eq!(done["run_id"], cancelled["run_id"], "the same run");
    assert_eq!(done["step"], 1000);
    let resumed: Value = get_json(&http, &format!("{url}/api/log?kind=run.resumed"), Some(&token)).await;
    let data = &resumed["events"][0]["data"];
    assert_eq!(data["base"]["path"], std::fs::canonicalize(out.join("final")).unwrap().to_str().unwrap(), "{data}");
}
