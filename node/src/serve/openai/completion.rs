//! A `POST /v1/completions` body (OpenAI's legacy completions), read strictly by
//! [`super::params::COMPLETION_PARAMS`]: each parameter is carried out, or accepted at its
//! value that changes nothing, or refused by name.

use mindxtrain_trainer::data::Json;

use super::ApiError;
use super::params::COMPLETION_PARAMS;
use super::request::{read_fields, stops, typed};

/// OpenAI's default answer length on this route.
pub const DEFAULT_MAX_TOKENS: u32 = 16;

/// The most likely tokens a position may list (`logprobs`), as OpenAI allows.
pub const MAX_LOGPROBS: u32 = 5;

/// One prompt as the client sent it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PromptInput {
    Text(String),
    Tokens(Vec<u32>),
}

/// A completions request, checked.
#[derive(Debug, Clone, PartialEq)]
pub struct CompletionRequest {
    pub model: String,
    /// One choice per prompt, in this order.
    pub prompts: Vec<PromptInput>,
    pub max_tokens: u32,
    pub echo: bool,
    /// `Some(k)`: every reported token's log-probability and the `k` most likely tokens there.
    pub logprobs: Option<u32>,
    pub temperature: f64,
    pub top_p: f64,
    pub seed: Option<u64>,
    pub stop: Vec<String>,
}

impl CompletionRequest {
    pub fn read(body: &[u8]) -> Result<CompletionRequest, ApiError> {
        let given = read_fields(body, COMPLETION_PARAMS, "a completions request")?;
        let get = |name: &str| given.iter().find(|(n, _)| *n == name).map(|(_, v)| v);
        let model: String =
            typed("model", get("model").ok_or_else(|| ApiError::invalid("model", "`model` is required"))?)?;
        let prompts = prompts(get("prompt").ok_or_else(|| ApiError::invalid("prompt", "`prompt` is required"))?)?;
        let logprobs = get("logprobs").map(|v| typed::<u32>("logprobs", v)).transpose()?;
        if let Some(k) = logprobs.filter(|&k| k > MAX_LOGPROBS) {
            return Err(ApiError::invalid("logprobs", format!("logprobs {k}: at most {MAX_LOGPROBS}")));
        }
        if let Some(v) = get("user") {
            typed::<String>("user", v)?;
        }
        Ok(CompletionRequest {
            model,
            prompts,
            max_tokens: get("max_tokens").map(|v| typed("max_tokens", v)).transpose()?.unwrap_or(DEFAULT_MAX_TOKENS),
            echo: get("echo").map(|v| typed("echo", v)).transpose()?.unwrap_or(false),
            logprobs,
            temperature: get("temperature").map(|v| typed("temperature", v)).transpose()?.unwrap_or(1.0),
            top_p: get("top_p").map(|v| typed("top_p", v)).transpose()?.unwrap_or(1.0),
            seed: get("seed").map(|v| typed("seed", v)).transpose()?,
            stop: stops(get("stop"))?,
        })
    }
}

/// `prompt` in any of its four forms: a string, strings, token ids, lists of token ids.
fn prompts(value: &Json) -> Result<Vec<PromptInput>, ApiError> {
    #[derive(serde::Deserialize)]
    #[serde(untagged)]
    enum Prompt {
        Text(String),
        Texts(Vec<String>),
        Tokens(Vec<u32>),
        TokenLists(Vec<Vec<u32>>),
    }
    let prompts = match typed::<Prompt>("prompt", value).map_err(|_| {
        ApiError::invalid(
            "prompt",
            "`prompt` is a string, a list of strings, a list of token ids, or a list of such lists",
        )
    })? {
        Prompt::Text(t) => vec![PromptInput::Text(t)],
        Prompt::Texts(t) => t.into_iter().map(PromptInput::Text).collect(),
        Prompt::Tokens(t) => vec![PromptInput::Tokens(t)],
        Prompt::TokenLists(t) => t.into_iter().map(PromptInput::Tokens).collect(),
    };
    if prompts.is_empty() {
        return Err(ApiError::invalid("prompt", "`prompt` lists no prompt"));
    }
    Ok(prompts)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(body: &str) -> Result<CompletionRequest, ApiError> {
        CompletionRequest::read(body.as_bytes())
    }

    #[test]
    fn every_prompt_form_reads_as_its_prompts_in_order() {
        let p = |v: &str| read(&format!(r#"{{"model": "m", "prompt": {v}}}"#)).unwrap().prompts;
        assert_eq!(p(r#""hi""#), [PromptInput::Text("hi".into())]);
        assert_eq!(p(r#"["a", "b"]"#), [PromptInput::Text("a".into()), PromptInput::Text("b".into())]);
        assert_eq!(p("[1, 2]"), [PromptInput::Tokens(vec![1, 2])]);
        assert_eq!(p("[[1], [2, 3]]"), [PromptInput::Tokens(vec![1]), PromptInput::Tokens(vec![2, 3])]);
        let r = read(r#"{"model": "m", "prompt": "x"}"#).unwrap();
        assert_eq!((r.max_tokens, r.echo, r.logprobs), (DEFAULT_MAX_TOKENS, false, None));
    }

    #[test]
    fn what_is_not_carried_out_is_refused_by_name() {
        let param = |body: &str| read(body).unwrap_err().param;
        for (field, value) in [
            ("stream", "true"),
            ("best_of", "2"),
            ("suffix", "\"x\""),
            ("n", "2"),
            ("logit_bias", "{}"),
            ("frequency_penalty", "0"),
            ("logprobs", "6"),
            ("prompt", "[1.5]"),
            ("whatever", "1"),
        ] {
            let body = format!(r#"{{"model": "m", "prompt": "x", "{field}": {value}}}"#);
            assert_eq!(param(&body).as_deref(), Some(field), "{body}");
        }
        assert_eq!(param(r#"{"model": "m"}"#).as_deref(), Some("prompt"));
        assert!(read(r#"{"model": "m", "prompt": "x", "stream": false, "n": 1, "user": "u"}"#).is_ok());
    }
}
