//! `POST /tokenize` and `POST /detokenize` bodies, vLLM's shapes (what evaluation harnesses and
//! agent frameworks call to count and split tokens the server's way: lm-evaluation-harness's
//! `remote` tokenizer backend), read strictly by [`super::params::TOKENIZE_PARAMS`] and
//! [`super::params::DETOKENIZE_PARAMS`].

use mindxtrain_trainer::data::{Json, Message};

use super::ApiError;
use super::messages::{read_messages, read_tools};
use super::params::{DETOKENIZE_PARAMS, TOKENIZE_PARAMS};
use super::request::{Allowed, read_fields, typed};

/// What to tokenize: a text, or a conversation through the model's chat template.
#[derive(Debug, Clone, PartialEq)]
pub enum TokenizeInput {
    Text { text: String, add_special_tokens: bool },
    Chat { messages: Vec<Message>, tools: Vec<Json> },
}

/// A `/tokenize` request, checked.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenizeRequest {
    /// The model id named, if any (the tokenizer is the served checkpoint's either way).
    pub model: Option<String>,
    pub input: TokenizeInput,
}

impl TokenizeRequest {
    pub fn read(body: &[u8], allowed: Allowed) -> Result<TokenizeRequest, ApiError> {
        let given = read_fields(body, TOKENIZE_PARAMS, "a tokenize request")?;
        let get = |name: &str| given.iter().find(|(n, _)| *n == name).map(|(_, v)| v);
        let model = get("model").map(|v| typed::<String>("model", v)).transpose()?;
        let input = match (get("prompt"), get("messages")) {
            (Some(p), None) => {
                if get("tools").is_some() {
                    return Err(ApiError::invalid("tools", "`tools` go with `messages`, not with `prompt`"));
                }
                TokenizeInput::Text {
                    text: typed("prompt", p)?,
                    add_special_tokens: get("add_special_tokens")
                        .map(|v| typed("add_special_tokens", v))
                        .transpose()?
                        .unwrap_or(false),
                }
            }
            (None, Some(m)) => {
                if get("add_special_tokens").is_some() {
                    return Err(ApiError::invalid(
                        "add_special_tokens",
                        "`add_special_tokens` goes with `prompt`: the chat template places every special token itself",
                    ));
                }
                let tools = get("tools").map(read_tools).transpose()?.map(|(t, _)| t).unwrap_or_default();
                TokenizeInput::Chat { messages: read_messages(m, allowed.tool_calls)?, tools }
            }
            (Some(_), Some(_)) => return Err(ApiError::invalid("messages", "give `prompt` or `messages`, not both")),
            (None, None) => return Err(ApiError::invalid("prompt", "`prompt` (a text) or `messages` is required")),
        };
        Ok(TokenizeRequest { model, input })
    }
}

/// A `/detokenize` request, checked.
#[derive(Debug, Clone, PartialEq)]
pub struct DetokenizeRequest {
    pub model: Option<String>,
    pub tokens: Vec<u32>,
}

impl DetokenizeRequest {
    pub fn read(body: &[u8]) -> Result<DetokenizeRequest, ApiError> {
        let given = read_fields(body, DETOKENIZE_PARAMS, "a detokenize request")?;
        let get = |name: &str| given.iter().find(|(n, _)| *n == name).map(|(_, v)| v);
        Ok(DetokenizeRequest {
            model: get("model").map(|v| typed::<String>("model", v)).transpose()?,
            tokens: typed("tokens", get("tokens").ok_or_else(|| ApiError::invalid("tokens", "`tokens` is required"))?)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(body: &str) -> Result<TokenizeRequest, ApiError> {
        TokenizeRequest::read(body.as_bytes(), Allowed::default())
    }

    #[test]
    fn a_text_or_a_conversation_and_nothing_else() {
        let t = read(r#"{"prompt": "hi", "add_special_tokens": true}"#).unwrap();
        assert_eq!(t.input, TokenizeInput::Text { text: "hi".into(), add_special_tokens: true });
        assert_eq!(t.model, None);
        let c = read(r#"{"model": "m", "messages": [{"role": "user", "content": "hi"}]}"#).unwrap();
        assert!(matches!(&c.input, TokenizeInput::Chat { messages, tools } if messages.len() == 1 && tools.is_empty()));
        assert_eq!(c.model.as_deref(), Some("m"));
        for (body, param) in [
            (r#"{}"#, "prompt"),
            (r#"{"prompt": "a", "messages": []}"#, "messages"),
            (r#"{"prompt": 3}"#, "prompt"),
            (r#"{"prompt": "a", "return_token_strs": true}"#, "return_token_strs"),
            (r#"{"messages": [{"role": "user", "content": "a"}], "add_special_tokens": true}"#, "add_special_tokens"),
            (r#"{"prompt": "a", "tools": []}"#, "tools"),
        ] {
            let e = read(body).unwrap_err();
            assert_eq!(e.param.as_deref(), Some(param), "{body}: {e:?}");
        }
    }

    #[test]
    fn detokenize_needs_token_ids() {
        let d = DetokenizeRequest::read(br#"{"tokens": [1, 2]}"#).unwrap();
        assert_eq!(d.tokens, [1, 2]);
        for body in [&br#"{}"#[..], br#"{"tokens": [-1]}"#, br#"{"tokens": "ab"}"#] {
            assert_eq!(DetokenizeRequest::read(body).unwrap_err().param.as_deref(), Some("tokens"));
        }
    }
}
