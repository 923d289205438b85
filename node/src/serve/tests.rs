//! The model routes over a tiny model on random weights, in process: what a request's
//! parameters and the recipe's `serve` section change, answered through the real router.

use std::sync::Arc;

use axum::Router;
use axum::body::{Body, to_bytes};
use axum::http::Request;
use candle_core::{DType, Device};
use mindxtrain_trainer::data::Tokenizer;
use mindxtrain_trainer::model::{CausalLm, LmConfig};
use mindxtrain_trainer::recipe::Recipe;
use serde_json::{Value, json};
use tower::ServiceExt;

use super::model::ServedModel;
use super::rentals::RentalBook;
use super::{AppState, router};
use crate::api::fallback::with_fallbacks;

const MODEL: &str = "tiny";

/// A byte-tokenizer recipe with the given `serve` section, and `model` lines of its own.
fn recipe(serve: &str, model: &str) -> Recipe {
    let yaml = format!(
        r#"meta: {{project: t, run_name: serve, seed: 3}}
hardware: {{name: cpu, gpus: 0}}
model:
  name: {MODEL}
  family: qwen3
  tokenizer: byte
  dtype: fp32
  config: {{hidden_size: 64, num_layers: 2, num_heads: 4, num_kv_heads: 2, head_dim: 16, intermediate_size: 128,
            vocab_size: 512, max_position_embeddings: 4096, tie_word_embeddings: true}}
  random_init: true
{model}
data: {{source: generated, format: instruction, generator: {{kind: tasks, seed: 3, count: 20}}, seq_len: 64}}
train:
  method: {{kind: lora, r: 4, alpha: 8, target_modules: [q_proj]}}
  optimizer: {{name: adamw, lr: 1.0e-3}}
  budget: {{max_steps: 1}}
  batch: {{per_device: 1}}
serve: {serve}
"#
    );
    Recipe::check_str(&yaml, "serve.yaml").unwrap_or_else(|e| panic!("{e}")).recipe
}

/// The model routes (and the fallbacks) of a node serving the tiny model under `serve`.
struct Served {
    _dir: tempfile::TempDir,
    state: Arc<AppState>,
    app: Router,
}

/// Blocking (the log's genesis waits for its sync): call it inside `block_in_place`, as
/// [`served`] does.
fn served_blocking(serve: &str, template: Option<&str>) -> Served {
    let dir = tempfile::tempdir().unwrap();
    let model_lines = match template {
        Some(source) => {
            let path = dir.path().join("chat_template.jinja");
            std::fs::write(&path, source).unwrap();
            format!("  chat_template: {}", path.display())
        }
        None => String::new(),
    };
    let recipe = recipe(serve, &model_lines);
    let tokenizer = Tokenizer::from_recipe(&recipe.model, dir.path(), None).unwrap();
    crate::node::init(dir.path().join("node").as_path()).unwrap();
    let (log, id, _) = crate::node::open(&dir.path().join("node")).unwrap();
    let (log, id) = (Arc::new(log), Arc::new(id));
    let config = LmConfig::timing_shape("tiny").unwrap();
    // Seeded: two servers of one test serve the same weights.
    let model = CausalLm::init_random(&config, 5, DType::F32, &Device::Cpu).unwrap();
    let model = ServedModel::from_model(recipe, MODEL.into(), model, tokenizer).unwrap();
    let rentals = RentalBook::load(log.clone(), id).unwrap();
    let state = AppState::new(model, log, rentals, None);
    let app = with_fallbacks(router(state.clone(), None));
    Served { _dir: dir, state, app }
}

fn served(serve: &str) -> Served {
    tokio::task::block_in_place(|| served_blocking(serve, None))
}

/// A thinking model's chat template: its generation prompt opens a `<think>` block.
const THINKING: &str = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}\
{% if add_generation_prompt %}<|im_start|>assistant\n<think>\n{% endif %}";

fn served_thinking(serve: &str) -> Served {
    tokio::task::block_in_place(|| served_blocking(serve, Some(THINKING)))
}

impl Served {
    async fn send(&self, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
        let req = Request::builder()
            .method(method)
            .uri(path)
            .header("content-type", "application/json")
            .body(body.map_or_else(Body::empty, |b| Body::from(b.to_string())))
            .unwrap();
        let resp = self.app.clone().oneshot(req).await.unwrap();
        let status = resp.status().as_u16();
        let bytes = to_bytes(resp.into_body(), 1 << 20).await.unwrap();
        (status, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
    }

    /// The JSON of each `data:` line of a stream, up to `[DONE]`.
    async fn stream(&self, extra: Value) -> Vec<Value> {
        let mut body = json!({"model": MODEL, "max_tokens": 6, "temperature": 1, "seed": 11, "stream": true,
            "messages": [{"role": "user", "content": "Think."}]});
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        let req = Request::builder()
            .method("POST")
            .uri("/v1/chat/completions")
            .header("content-type", "application/json")
            .body(Body::from(body.to_string()))
            .unwrap();
        let resp = self.app.clone().oneshot(req).await.unwrap();
        let text = String::from_utf8(to_bytes(resp.into_body(), 1 << 20).await.unwrap().to_vec()).unwrap();
        text.lines()
            .filter_map(|l| l.strip_prefix("data: "))
            .take_while(|d| *d != "[DONE]")
            .map(|d| serde_json::from_str(d).unwrap())
            .collect()
    }

    async fn chat(&self, extra: Value) -> (u16, Value) {
        let mut body = json!({"model": MODEL, "max_tokens": 3, "temperature": 0,
            "messages": [{"role": "user", "content": "What is 2 + 3?"}]});
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        self.send("POST", "/v1/chat/completions", Some(body)).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_parameters_are_400s_naming_them_and_neutral_values_are_served() {
    let s = served("{max_model_len: 256, max_batch: 2}");
    for (name, value) in [
        ("presence_penalty", json!(0.5)),
        ("response_format", json!({"type": "json_object"})),
        ("min_p", json!(0.05)),
        ("user", json!("u-1")),
        ("not_a_parameter", json!(true)),
    ] {
        let (status, body) = s.chat(json!({name: value})).await;
        assert_eq!(status, 400, "{name}: {body}");
        assert_eq!(body["error"]["param"], name, "{body}");
        assert_eq!(body["error"]["type"], "invalid_request_error");
    }
    let (status, body) = s
        .chat(json!({"presence_penalty": 0, "frequency_penalty": 0, "repetition_penalty": 1, "logit_bias": {},
            "n": 1, "logprobs": false, "response_format": {"type": "text"}, "tools": [], "top_k": 5,
            "stream_options": null, "chat_template_kwargs": {}}))
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["object"], "chat.completion");
    assert_eq!(body["choices"][0]["message"]["role"], "assistant");
    assert!(body["choices"][0]["message"].get("tool_calls").is_none(), "no tools, no calls: {body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tools_reach_the_template_only_when_the_recipe_allows_them() {
    let tools = json!([{"type": "function", "function": {"name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]);
    let off = served("{max_model_len: 1024}");
    let (status, body) = off.chat(json!({"tools": tools})).await;
    assert_eq!((status, body["error"]["param"].as_str()), (400, Some("tools")), "{body}");

    let on = served("{max_model_len: 1024, tool_calls: true}");
    let prompt = |body: &Value| body["usage"]["prompt_tokens"].as_u64().unwrap();
    let (_, plain) = on.chat(json!({})).await;
    let (status, offered) = on.chat(json!({"tools": tools})).await;
    assert_eq!(status, 200, "{offered}");
    assert!(prompt(&offered) > prompt(&plain) + 50, "the tools are in the prompt: {offered} vs {plain}");
    let (_, declined) = on.chat(json!({"tools": tools, "tool_choice": "none"})).await;
    assert_eq!(prompt(&declined), prompt(&plain), "tool_choice none offers no tools");
    // A call made earlier and its result are rendered into the prompt.
    let (status, answered) = on
        .chat(json!({"tools": tools, "messages": [
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
                "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"}]}))
        .await;
    assert_eq!(status, 200, "{answered}");
    // The call's JSON alone is 55 bytes, its result 11 (the byte tokenizer has the tags as
    // single tokens); dropped, they would add under 30.
    assert!(prompt(&answered) >= prompt(&offered) + 60, "{answered} vs {offered}");
    let (status, body) = on.chat(json!({"tools": tools, "tool_choice": "required"})).await;
    assert_eq!((status, body["error"]["param"].as_str()), (400, Some("tool_choice")), "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_model_len_and_max_batch_shape_the_engine() {
    let s = served("{max_model_len: 64, max_batch: 3}");
    // The CPU cache holds exactly max_batch sequences of max_model_len tokens (16 a block).
    let stats = s.state.model.stats();
    assert_eq!((stats.kv_total_blocks, stats.block_size), (3 * 4, 16));
    assert_eq!(s.state.model.context, 64);
    let long = "many words ".repeat(8);
    let (status, body) = s.chat(json!({"messages": [{"role": "user", "content": long}]})).await;
    assert_eq!((status, body["error"]["code"].as_str()), (400, Some("context_length_exceeded")), "{body}");
    // The same prompt fits a longer max_model_len.
    let roomy = served("{max_model_len: 512}");
    let (status, body) = roomy.chat(json!({"messages": [{"role": "user", "content": long}]})).await;
    assert_eq!(status, 200, "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_routes_and_methods_answer_in_openais_error_shape() {
    let s = served("{max_model_len: 64}");
    let (status, body) = s.send("GET", "/v1/embeddings", None).await;
    assert_eq!((status, body["error"]["code"].as_str()), (404, Some("unknown_url")), "{body}");
    assert_eq!(body["error"]["param"], Value::Null);
    let (status, body) = s.send("GET", "/v1/chat/completions", None).await;
    assert_eq!((status, body["error"]["code"].as_str()), (405, Some("method_not_allowed")), "{body}");
    let (status, body) = s.send("GET", "/v1/models", None).await;
    assert_eq!((status, body["data"][0]["id"].as_str()), (200, Some(MODEL)), "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_reasoning_decides_whether_text_inside_think_is_reasoning_content() {
    // The prompt opens a think block and 6 tokens cannot close it: the whole answer is reasoning.
    let ask =
        json!({"max_tokens": 6, "temperature": 1, "seed": 11, "messages": [{"role": "user", "content": "Think."}]});
    let split = served_thinking("{max_model_len: 256, reasoning: true}");
    let (status, on) = split.chat(ask.clone()).await;
    assert_eq!(status, 200, "{on}");
    let message = &on["choices"][0]["message"];
    let reasoning = message["reasoning_content"].as_str().unwrap_or_else(|| panic!("no reasoning: {on}"));
    assert!(!reasoning.trim().is_empty(), "{on}");
    assert_eq!(message["content"], Value::Null, "cut off inside the block: no content: {on}");
    // Streamed, the same text goes out as reasoning_content deltas.
    let chunks = split.stream(json!({})).await;
    let streamed: String =
        chunks.iter().filter_map(|c| c["choices"][0]["delta"]["reasoning_content"].as_str()).collect();
    assert_eq!(streamed, reasoning);
    assert!(chunks.iter().all(|c| c["choices"][0]["delta"]["content"].as_str().is_none_or(str::is_empty)));

    // serve.reasoning: false returns the same tokens as generated, as content.
    let plain = served_thinking("{max_model_len: 256, reasoning: false}");
    let (status, off) = plain.chat(ask).await;
    assert_eq!(status, 200, "{off}");
    assert_eq!(off["choices"][0]["message"]["content"].as_str(), Some(reasoning), "{off}");
    assert!(off["choices"][0]["message"].get("reasoning_content").is_none(), "{off}");
}
