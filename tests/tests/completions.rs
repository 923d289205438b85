//! `POST /v1/completions` through the `mindxtrain` binary, as lm-evaluation-harness's
//! `local-completions` calls it: every prompt form, echoed prompts scored equal to the
//! trainer's own forward (log-softmax of `CausalLm::logits`), `max_tokens` 0 and 1, stop
//! strings, batched prompts answered in order, and refusals by name.

use mindxtrain_tests::served::{MODEL, Server, new_node, post_json_blocking, trained};
use serde_json::{Value, json};

fn complete(server: &Server, body: Value) -> (u16, Value) {
    let mut body = body;
    body["model"] = json!(MODEL);
    post_json_blocking(&format!("{}/v1/completions", server.url), &body)
}

#[test]
fn completions_answer_every_prompt_form_and_score_echoed_prompts_as_the_trainer_does() {
    let t = trained(2);
    let node = new_node(&t, "node");
    let server = Server::start(&node, &t, &["--free"]);

    // lm-eval's loglikelihood request: token ids, echo, one generated token, logprobs 1.
    let ids: Vec<u32> = "The cat sat".bytes().map(u32::from).collect();
    let (status, r) = complete(
        &server,
        json!({"prompt": [ids.clone()], "echo": true, "max_tokens": 1, "logprobs": 1, "temperature": 0, "seed": 1234}),
    );
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["object"], "text_completion");
    let lp = &r["choices"][0]["logprobs"];
    let tokens = lp["tokens"].as_array().unwrap();
    assert_eq!(tokens.len(), ids.len() + 1, "{r}");
    assert_eq!(lp["token_logprobs"][0], Value::Null);
    assert_eq!(lp["text_offset"][1], 1);
    assert!(r["choices"][0]["text"].as_str().unwrap().starts_with("The cat sat"), "{r}");
    let ours = t.logprobs(&ids);
    for (i, (lp_ours, best)) in ours.iter().enumerate() {
        let theirs = lp["token_logprobs"][i + 1].as_f64().unwrap();
        assert!((theirs - lp_ours).abs() < 1e-4, "position {}: {theirs} vs {lp_ours}", i + 1);
        let top: Vec<f64> =
            lp["top_logprobs"][i + 1].as_object().unwrap().values().map(|v| v.as_f64().unwrap()).collect();
        assert_eq!(top.len(), 1);
        assert!((top[0] - best).abs() < 1e-4, "position {}: top {} vs {best}", i + 1, top[0]);
    }

    // max_tokens 0 with echo: the prompt alone, scored; a string prompt tokenizes as the ids.
    let (status, r0) =
        complete(&server, json!({"prompt": "The cat sat", "echo": true, "max_tokens": 0, "logprobs": 0}));
    assert_eq!(status, 200, "{r0}");
    assert_eq!(r0["choices"][0]["text"], "The cat sat");
    assert_eq!(r0["usage"]["completion_tokens"], 0);
    let scored = r0["choices"][0]["logprobs"]["token_logprobs"].as_array().unwrap();
    assert_eq!(scored.len(), ids.len());
    for i in 1..ids.len() {
        assert!((scored[i].as_f64().unwrap() - lp["token_logprobs"][i].as_f64().unwrap()).abs() < 1e-6);
    }

    // Batched prompts of both list forms: one choice each, in order; each the same as alone.
    let alone: Vec<String> = ["ab", "hello there", "x"]
        .iter()
        .map(|p| {
            let (_, r) = complete(&server, json!({"prompt": p, "max_tokens": 6, "temperature": 0}));
            r["choices"][0]["text"].as_str().unwrap().to_string()
        })
        .collect();
    let (status, rb) =
        complete(&server, json!({"prompt": ["ab", "hello there", "x"], "max_tokens": 6, "temperature": 0}));
    assert_eq!(status, 200, "{rb}");
    let choices = rb["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 3);
    for (i, c) in choices.iter().enumerate() {
        assert_eq!(c["index"], i);
        assert_eq!(c["text"], alone[i], "{rb}");
    }
    let lists: Vec<Vec<u32>> = ["ab", "hello there"].iter().map(|p| p.bytes().map(u32::from).collect()).collect();
    let (_, rl) = complete(&server, json!({"prompt": lists, "max_tokens": 6, "temperature": 0}));
    assert_eq!(rl["choices"][1]["text"], alone[1], "{rl}");

    // max_tokens 1: one token at most; a stop string cuts the answer before it.
    let (_, r1) = complete(&server, json!({"prompt": "hello there", "max_tokens": 1, "temperature": 0}));
    assert!(r1["usage"]["completion_tokens"].as_u64().unwrap() <= 1, "{r1}");
    if let Some(c) = alone[1].chars().nth(2).filter(|_| alone[1].chars().count() > 3) {
        let (_, rs) = complete(
            &server,
            json!({"prompt": "hello there", "max_tokens": 6, "temperature": 0, "stop": [c.to_string()]}),
        );
        let cut = &alone[1][..alone[1].find(c).unwrap()];
        assert_eq!(rs["choices"][0]["text"], cut, "{rs}");
        assert_eq!(rs["choices"][0]["finish_reason"], "stop");
    }

    // Refusals by name.
    for (field, value) in [("stream", json!(true)), ("best_of", json!(2)), ("suffix", json!("x")), ("foo", json!(1))] {
        let mut body = json!({"prompt": "x"});
        body[field] = value;
        let (status, e) = complete(&server, body);
        assert_eq!((status, e["error"]["param"].as_str()), (400, Some(field)), "{e}");
    }
    let (status, e) = complete(&server, json!({"prompt": [[9999]], "max_tokens": 1}));
    assert_eq!((status, e["error"]["param"].as_str()), (400, Some("prompt")), "{e}");
}

/// `/tokenize`, `/detokenize` and `/tokenizer_info`: the served tokenizer's ids for a text and
/// for a conversation (the very ids a chat completion prompts with: its `usage` counts them),
/// back to text, and refusals by name.
#[test]
fn token_routes_count_and_join_tokens_as_the_server_does() {
    let t = trained(2);
    let node = new_node(&t, "node");
    let server = Server::start(&node, &t, &["--free"]);
    let post = |route: &str, body: Value| post_json_blocking(&format!("{}/{route}", server.url), &body);

    // Special-token text is read as the token, as the Hugging Face tokenizer reads it.
    let (status, r) = post("tokenize", json!({"prompt": "hi<|im_end|>"}));
    assert_eq!(status, 200, "{r}");
    let tokens: Vec<u32> = serde_json::from_value(r["tokens"].clone()).unwrap();
    assert_eq!(tokens[..2], [u32::from(b'h'), u32::from(b'i')]);
    assert_eq!((tokens.len(), r["count"].as_u64()), (3, Some(3)), "{r}");
    assert!(tokens[2] >= 256, "<|im_end|> is one special token: {r}");
    assert_eq!(r["max_model_len"], 160);
    let (_, d) = post("detokenize", json!({"tokens": tokens, "model": MODEL}));
    assert_eq!(d["prompt"], "hi<|im_end|>");

    let messages = json!([{"role": "user", "content": "hello"}]);
    let (_, chat) = post("tokenize", json!({"messages": messages}));
    let (status, c) = post_json_blocking(
        &format!("{}/v1/chat/completions", server.url),
        &json!({"model": MODEL, "messages": messages, "max_tokens": 2}),
    );
    assert_eq!(status, 200, "{c}");
    assert_eq!(chat["count"], c["usage"]["prompt_tokens"], "{chat} vs {c}");

    let info = mindxtrain_tests::served::get_blocking(&format!("{}/tokenizer_info", server.url));
    assert_eq!(info["eos_token"], "<|im_end|>", "{info}");
    assert_eq!(info["model_max_length"], 160);

    for (route, body, param, code) in [
        ("tokenize", json!({"prompt": "x", "return_token_strs": true}), "return_token_strs", 400),
        ("tokenize", json!({"prompt": "x", "model": "nope"}), "", 404),
        ("tokenize", json!({}), "prompt", 400),
        ("detokenize", json!({"tokens": [99999]}), "tokens", 400),
    ] {
        let (status, e) = post(route, body);
        assert_eq!(status, code, "{route}: {e}");
        if code == 400 {
            assert_eq!(e["error"]["param"], param, "{route}: {e}");
        }
    }
}
