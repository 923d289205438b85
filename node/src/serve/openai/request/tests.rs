use serde_json::{Value, json};

use super::super::params::{PARAMS, Treatment};
use super::*;

const TOOLS_ON: Allowed = Allowed { tool_calls: true };

fn base() -> Value {
    json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
}

fn with(extra: Value) -> Value {
    let mut body = base();
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    body
}

fn read(body: &Value, allowed: Allowed) -> Result<ChatRequest, ApiError> {
    ChatRequest::read(body.to_string().as_bytes(), allowed)
}

fn one(name: &str, value: Value) -> Value {
    Value::Object([(name.to_owned(), value)].into_iter().collect())
}

/// The parameter a refusal names.
fn refused(body: Value, allowed: Allowed) -> String {
    let e = read(&body, allowed).expect_err(&body.to_string());
    assert_eq!(e.status, 400, "{body}");
    e.param.expect("a refusal names its parameter")
}

#[test]
fn the_honoured_parameters_are_read() {
    let r = read(
        &with(json!({"max_completion_tokens": 7, "max_tokens": 99, "temperature": 0, "top_p": 0.5, "top_k": 40,
            "seed": 3, "stop": "X", "stream": true, "stream_options": {"include_usage": true}, "n": null})),
        Allowed::default(),
    )
    .unwrap();
    assert_eq!((r.model.as_str(), r.messages.len()), ("m", 1));
    assert_eq!((r.max_tokens, r.temperature, r.top_p, r.top_k, r.seed), (Some(7), 0.0, 0.5, 40, Some(3)));
    assert_eq!((r.stop, r.stream, r.include_usage), (vec!["X".to_owned()], true, true));
    let r = read(&with(json!({"max_tokens": 5, "top_k": -1})), Allowed::default()).unwrap();
    assert_eq!((r.max_tokens, r.top_k, r.temperature, r.top_p, r.stream), (Some(5), 0, 1.0, 1.0, false));
    assert_eq!(refused(with(json!({"top_k": -2})), Allowed::default()), "top_k");
    assert_eq!(refused(with(json!({"max_tokens": 0})), Allowed::default()), "max_tokens");
    assert_eq!(refused(with(json!({"stop": ["a", "b", "c", "d", "e"]})), Allowed::default()), "stop");
    assert_eq!(refused(with(json!({"temperature": "hot"})), Allowed::default()), "temperature");
    assert_eq!(refused(json!({"messages": []}), Allowed::default()), "model");
}

#[test]
fn a_parameter_nobody_defines_is_refused_as_openai_refuses_it() {
    let e = read(&with(json!({"frobnicate": 1})), Allowed::default()).unwrap_err();
    assert_eq!(e.param.as_deref(), Some("frobnicate"));
    assert_eq!(e.message, "Unrecognized request argument supplied: frobnicate");
    assert_eq!(
        refused(with(json!({"stream": true, "stream_options": {"x": 1}})), Allowed::default()),
        "stream_options.x"
    );
}

/// Values tried on every neutral-only parameter: each is accepted exactly when it is the
/// parameter's value that changes nothing.
fn samples() -> Vec<Value> {
    vec![
        json!(0),
        json!(0.0),
        json!(1),
        json!(1.0),
        json!(0.3),
        json!(-1),
        json!(true),
        json!(false),
        json!({}),
        json!({"type": "text"}),
        json!({"type": "json_object"}),
        json!({"type": "json_schema", "json_schema": {"name": "x", "strict": true, "schema": {}}}),
        json!({"50256": -100}),
        json!({"enable_thinking": false}),
        json!([]),
        json!(["text"]),
        json!(["text", "audio"]),
        json!([7]),
        json!("auto"),
        json!("default"),
        json!("flex"),
    ]
}

#[test]
fn every_table_entry_is_carried_out_or_refused_by_name() {
    for p in PARAMS {
        match p.treatment {
            Treatment::Honoured => {}
            Treatment::Neutral { neutral, is } => {
                for v in samples() {
                    let body = with(one(p.name, v.clone()));
                    match read(&body, Allowed::default()) {
                        Ok(_) => assert!(is(&v), "{} = {v} accepted: only {neutral} changes nothing", p.name),
                        Err(e) => {
                            assert!(!is(&v), "{} = {v} (its neutral value) refused: {}", p.name, e.message);
                            assert_eq!(e.param.as_deref(), Some(p.name));
                            assert!(e.message.contains("not supported yet"), "{}", e.message);
                        }
                    }
                }
                // Leaving it out or sending null is the same as its neutral value.
                assert!(read(&with(one(p.name, Value::Null)), Allowed::default()).is_ok(), "{}", p.name);
            }
            Treatment::Refused => {
                for v in samples() {
                    let e = read(&with(one(p.name, v.clone())), TOOLS_ON).unwrap_err();
                    assert_eq!(e.param.as_deref(), Some(p.name), "{} = {v}", p.name);
                    assert!(e.message.contains("not supported yet"), "{}", e.message);
                }
            }
        }
    }
}

#[test]
fn the_sampling_and_format_options_this_server_lacks_are_refused_by_name() {
    for (name, value) in [
        ("response_format", json!({"type": "json_object"})),
        ("response_format", json!({"type": "json_schema", "json_schema": {"name": "x", "strict": true, "schema": {}}})),
        ("min_p", json!(0.1)),
        ("presence_penalty", json!(0.5)),
        ("frequency_penalty", json!(-0.5)),
        ("repetition_penalty", json!(1.1)),
        ("logit_bias", json!({"50256": -100})),
        ("chat_template_kwargs", json!({"enable_thinking": false})),
        ("n", json!(2)),
        ("logprobs", json!(true)),
    ] {
        assert_eq!(refused(with(one(name, value)), TOOLS_ON), name);
    }
    let defaults = json!({"presence_penalty": 0, "frequency_penalty": 0.0, "repetition_penalty": 1, "logit_bias": {},
        "n": 1, "logprobs": false, "top_logprobs": 0, "response_format": {"type": "text"}, "tools": [],
        "parallel_tool_calls": false, "min_p": 0, "chat_template_kwargs": {}, "store": false, "tool_choice": "none"});
    assert!(read(&with(defaults), Allowed::default()).is_ok());
}

#[test]
fn tools_follow_the_recipe_and_tool_choice() {
    let tools = json!([{"type": "function", "function": {"name": "w", "parameters": {"type": "object"}}}]);
    assert_eq!(refused(with(json!({"tools": tools})), Allowed::default()), "tools");
    let r = read(&with(json!({"tools": tools, "tool_choice": "auto", "parallel_tool_calls": true})), TOOLS_ON).unwrap();
    assert_eq!((r.tools.len(), r.tool_names.clone()), (1, vec!["w".to_owned()]));
    let none = read(&with(json!({"tools": tools, "tool_choice": "none"})), TOOLS_ON).unwrap();
    assert!(none.tools.is_empty() && none.tool_names.is_empty(), "tool_choice none: no tools offered");
    for choice in [json!("required"), json!({"type": "function", "function": {"name": "w"}}), json!("sometimes")] {
        assert_eq!(refused(with(json!({"tools": tools, "tool_choice": choice})), TOOLS_ON), "tool_choice");
    }
    assert_eq!(refused(with(json!({"tools": tools, "parallel_tool_calls": false})), TOOLS_ON), "parallel_tool_calls");
    assert_eq!(refused(with(json!({"stream_options": {"include_usage": true}})), TOOLS_ON), "stream_options");
}
