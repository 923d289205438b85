//! A `POST /v1/chat/completions` body, read strictly by [`super::params`]: each parameter is
//! carried out, or accepted at its value that changes nothing, or refused by name.

use mindxtrain_trainer::data::{Json, Message};
use serde::de::DeserializeOwned;
use serde_json::Value;

use super::ApiError;
use super::messages::{read_messages, read_tools};
use super::params::{PARAMS, Param, Treatment, find};

/// A chat request, checked.
#[derive(Debug, Clone, PartialEq)]
pub struct ChatRequest {
    pub model: String,
    pub messages: Vec<Message>,
    /// The tools offered to the chat template (none with `tool_choice: none`).
    pub tools: Vec<Json>,
    /// The names of the offered tools: the functions an answer may call.
    pub tool_names: Vec<String>,
    /// `max_completion_tokens`, else `max_tokens`.
    pub max_tokens: Option<u32>,
    pub temperature: f64,
    pub top_p: f64,
    /// 0 keeps every token.
    pub top_k: u32,
    pub seed: Option<u64>,
    pub stop: Vec<String>,
    pub stream: bool,
    pub include_usage: bool,
}

/// What the served model allows, from its recipe.
#[derive(Debug, Clone, Copy, Default)]
pub struct Allowed {
    /// `serve.tool_calls`.
    pub tool_calls: bool,
}

impl ChatRequest {
    /// Reads `body`, refusing every parameter this server would otherwise not carry out.
    pub fn read(body: &[u8], allowed: Allowed) -> Result<ChatRequest, ApiError> {
        let given = read_fields(body, PARAMS, "a chat request")?;
        let get = |name: &str| given.iter().find(|(n, _)| *n == name).map(|(_, v)| v);
        let model: String =
            typed("model", get("model").ok_or_else(|| ApiError::invalid("model", "`model` is required"))?)?;
        let messages = read_messages(
            get("messages").ok_or_else(|| ApiError::invalid("messages", "`messages` is required"))?,
            allowed.tool_calls,
        )?;
        let (tools, tool_names) = tools(get("tools"), get("tool_choice"), get("parallel_tool_calls"), allowed)?;
        let stream = get("stream").map(|v| typed("stream", v)).transpose()?.unwrap_or(false);
        let include_usage = stream_options(get("stream_options"), stream)?;
        let max_tokens = match (get("max_completion_tokens"), get("max_tokens")) {
            (Some(v), _) => Some(("max_completion_tokens", typed::<u32>("max_completion_tokens", v)?)),
            (None, Some(v)) => Some(("max_tokens", typed::<u32>("max_tokens", v)?)),
            (None, None) => None,
        };
        if let Some((name, 0)) = max_tokens {
            return Err(ApiError::invalid(name, format!("`{name}` must be at least 1")));
        }
        let top_k = match get("top_k").map(|v| typed::<i64>("top_k", v)).transpose()? {
            None | Some(-1 | 0) => 0,
            Some(k) if k > 0 => u32::try_from(k).unwrap_or(u32::MAX),
            Some(k) => {
                return Err(ApiError::invalid(
                    "top_k",
                    format!("top_k {k}: -1 or 0 keep every token, else at least 1"),
                ));
            }
        };
        Ok(ChatRequest {
            model,
            messages,
            tools,
            tool_names,
            max_tokens: max_tokens.map(|(_, n)| n),
            temperature: get("temperature").map(|v| typed("temperature", v)).transpose()?.unwrap_or(1.0),
            top_p: get("top_p").map(|v| typed("top_p", v)).transpose()?.unwrap_or(1.0),
            top_k,
            seed: get("seed").map(|v| typed("seed", v)).transpose()?,
            stop: stops(get("stop"))?,
            stream,
            include_usage,
        })
    }
}

/// The top-level fields of a JSON object `body` (a `what`) that `table` honours, with their
/// values; `null` is left out, a neutral value is checked and dropped, and any other field is
/// a 400 naming it.
pub(super) fn read_fields(
    body: &[u8],
    table: &'static [Param],
    what: &str,
) -> Result<Vec<(&'static str, Json)>, ApiError> {
    let top: Json = serde_json::from_slice(body).map_err(|e| ApiError::invalid("body", format!("not {what}: {e}")))?;
    let Json::Object(fields) = top else {
        return Err(ApiError::invalid("body", format!("{what} is a JSON object")));
    };
    let mut given = Vec::new();
    for (name, value) in fields {
        if value == Json::Null {
            continue;
        }
        let param = find(table, &name).ok_or_else(|| ApiError::unrecognized(&name))?;
        match param.treatment {
            Treatment::Honoured => given.push((param.name, value)),
            Treatment::Neutral { neutral, is } => {
                let v: Value = typed(&name, &value)?;
                if !is(&v) {
                    return Err(ApiError::unsupported(
                        &name,
                        format!(
                            "`{name}` = {v} is not supported yet ({}); only {neutral}, which changes nothing, is accepted",
                            param.note
                        ),
                    ));
                }
            }
            Treatment::Refused => return Err(refused(param)),
        }
    }
    Ok(given)
}

/// A parameter's value as `T`, or a 400 naming it.
pub(super) fn typed<T: DeserializeOwned>(name: &str, value: &Json) -> Result<T, ApiError> {
    serde_json::to_value(value)
        .and_then(serde_json::from_value)
        .map_err(|e| ApiError::invalid(name, format!("`{name}`: {e}")))
}

fn refused(p: &Param) -> ApiError {
    ApiError::unsupported(p.name, format!("`{}` is not supported yet: {}", p.name, p.note))
}

/// The tools offered to the template and their names, after `tool_choice` and
/// `parallel_tool_calls`.
fn tools(
    tools: Option<&Json>,
    choice: Option<&Json>,
    parallel: Option<&Json>,
    allowed: Allowed,
) -> Result<(Vec<Json>, Vec<String>), ApiError> {
    let (tools, names) = match tools {
        Some(t) => read_tools(t)?,
        None => (Vec::new(), Vec::new()),
    };
    if !tools.is_empty() && !allowed.tool_calls {
        return Err(ApiError::unsupported(
            "tools",
            "tool calling is not enabled for this model: its recipe sets serve.tool_calls: false",
        ));
    }
    let offer = match choice {
        None => true,
        Some(Json::String(c)) if c == "auto" => true,
        Some(Json::String(c)) if c == "none" => false,
        Some(Json::String(c)) if c == "required" => {
            return Err(ApiError::unsupported(
                "tool_choice",
                "tool_choice \"required\" is not supported yet: forcing a call needs constrained decoding; use \"auto\" or \"none\"",
            ));
        }
        Some(Json::Object(_)) => {
            return Err(ApiError::unsupported(
                "tool_choice",
                "naming the function to call is not supported yet: it needs constrained decoding; use \"auto\" or \"none\"",
            ));
        }
        Some(_) => {
            return Err(ApiError::invalid("tool_choice", "expected \"auto\", \"none\", \"required\" or a function"));
        }
    };
    let parallel: bool = parallel.map(|v| typed("parallel_tool_calls", v)).transpose()?.unwrap_or(true);
    if !parallel && offer && !tools.is_empty() {
        return Err(ApiError::unsupported(
            "parallel_tool_calls",
            "parallel_tool_calls: false is not supported yet: nothing limits an answer to one call",
        ));
    }
    Ok(if offer { (tools, names) } else { (Vec::new(), Vec::new()) })
}

/// `stream_options`: whether the usage chunk is sent.
fn stream_options(value: Option<&Json>, stream: bool) -> Result<bool, ApiError> {
    let Some(value) = value else { return Ok(false) };
    if !stream {
        return Err(ApiError::invalid("stream_options", "`stream_options` is only allowed when `stream` is true"));
    }
    let Json::Object(fields) = value else { return Err(ApiError::invalid("stream_options", "must be an object")) };
    let mut include_usage = false;
    for (k, v) in fields {
        let at = format!("stream_options.{k}");
        match k.as_str() {
            _ if *v == Json::Null => {}
            "include_usage" => include_usage = typed(&at, v)?,
            "include_obfuscation" if !typed::<bool>(&at, v)? => {}
            "include_obfuscation" => {
                return Err(ApiError::unsupported(
                    &at,
                    "stream obfuscation is not supported yet; only false is accepted",
                ));
            }
            _ => return Err(ApiError::unrecognized(&at)),
        }
    }
    Ok(include_usage)
}

/// At most four stop sequences, as OpenAI allows.
pub(super) fn stops(value: Option<&Json>) -> Result<Vec<String>, ApiError> {
    #[derive(serde::Deserialize)]
    #[serde(untagged)]
    enum Stop {
        One(String),
        Many(Vec<String>),
    }
    let stops = match value.map(|v| typed::<Stop>("stop", v)).transpose()? {
        None => vec![],
        Some(Stop::One(s)) => vec![s],
        Some(Stop::Many(v)) => v,
    };
    if stops.len() > 4 {
        return Err(ApiError::invalid("stop", format!("{} stop sequences; at most 4 are allowed", stops.len())));
    }
    Ok(stops)
}

#[cfg(test)]
mod tests;
