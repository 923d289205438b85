//! The conversation and the tools of a chat request, read into the trainer's own types so the
//! chat template renders them exactly as it rendered the training data.
//!
//! JSON is read as `mindxtrain_trainer::data::Json`, which keeps key order: tool schemas and
//! call arguments reach the model written as in training (Qwen3's template prints them with
//! `tojson`). Call arguments arrive as OpenAI sends them, a JSON string, and are given to the
//! template as the object they hold (vLLM does the same).

use mindxtrain_trainer::data::{Json, Message, Role, ToolArguments, ToolCall};

use super::ApiError;
use super::params::{MESSAGE_FIELDS, Treatment, find};

type Fields = [(String, Json)];

fn field<'a>(fields: &'a Fields, name: &str) -> Option<&'a Json> {
    fields.iter().find(|(k, v)| k == name && *v != Json::Null).map(|(_, v)| v)
}

/// Refuses any key of `fields` not in `allowed` (`null`s too: a client that sends a field we do
/// not know means something by it).
fn only(fields: &Fields, allowed: &[&str], at: &str) -> Result<(), ApiError> {
    match fields.iter().find(|(k, _)| !allowed.contains(&k.as_str())) {
        Some((k, _)) => Err(ApiError::unrecognized(&format!("{at}.{k}"))),
        None => Ok(()),
    }
}

fn object<'a>(v: &'a Json, at: &str) -> Result<&'a Fields, ApiError> {
    match v {
        Json::Object(f) => Ok(f),
        _ => Err(ApiError::invalid(at, format!("`{at}` must be an object"))),
    }
}

fn string<'a>(v: Option<&'a Json>, at: &str) -> Result<&'a str, ApiError> {
    match v {
        Some(Json::String(s)) => Ok(s),
        Some(_) => Err(ApiError::invalid(at, format!("`{at}` must be a string"))),
        None => Err(ApiError::invalid(at, format!("`{at}` is required"))),
    }
}

/// The refusal of `what` (at `at`) by a model whose recipe does not enable tool calling.
fn tools_off(at: &str, what: &str) -> ApiError {
    ApiError::unsupported(
        at,
        format!("{what} needs tool calling, which this model does not enable: its recipe sets serve.tool_calls: false"),
    )
}

/// `messages`, checked: roles, text content, and (with tool calling) calls and their results.
pub fn read_messages(value: &Json, tool_calls: bool) -> Result<Vec<Message>, ApiError> {
    let Json::Array(items) = value else { return Err(ApiError::invalid("messages", "`messages` must be an array")) };
    if items.is_empty() {
        return Err(ApiError::invalid("messages", "at least one message is required"));
    }
    let mut out = Vec::with_capacity(items.len());
    let mut call_ids: Vec<String> = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let at = format!("messages[{i}]");
        let fields = object(item, &at)?;
        for (k, v) in fields {
            let Some(p) = find(MESSAGE_FIELDS, k) else { return Err(ApiError::unrecognized(&format!("{at}.{k}"))) };
            if matches!(p.treatment, Treatment::Refused) && *v != Json::Null {
                return Err(ApiError::unsupported(
                    &format!("{at}.{k}"),
                    format!("`{at}.{k}` is not supported yet: {}", p.note),
                ));
            }
        }
        let role = match string(field(fields, "role"), &format!("{at}.role"))? {
            "system" | "developer" => Role::System,
            "user" => Role::User,
            "assistant" => Role::Assistant,
            "tool" if tool_calls => Role::Tool,
            "tool" => return Err(tools_off(&format!("{at}.role"), "a tool message")),
            other => {
                return Err(ApiError::invalid(
                    &format!("{at}.role"),
                    format!("role {other:?}: expected system, developer, user, assistant or tool"),
                ));
            }
        };
        let mut message = Message::new(role, content(field(fields, "content"), &at)?);
        if let Some(calls) = field(fields, "tool_calls") {
            let at = format!("{at}.tool_calls");
            let Json::Array(calls) = calls else {
                return Err(ApiError::invalid(&at, format!("`{at}` must be an array")));
            };
            if role != Role::Assistant && !calls.is_empty() {
                return Err(ApiError::invalid(&at, "only assistant messages call tools"));
            }
            if !tool_calls && !calls.is_empty() {
                return Err(tools_off(&at, "a message with tool calls"));
            }
            for (j, c) in calls.iter().enumerate() {
                let (id, call) = read_call(c, &format!("{at}[{j}]"))?;
                call_ids.push(id);
                message.tool_calls.push(call);
            }
        }
        let id = field(fields, "tool_call_id");
        match (role, id) {
            (Role::Tool, Some(id)) => {
                let id = string(Some(id), &format!("{at}.tool_call_id"))?;
                if !call_ids.iter().any(|c| c == id) {
                    return Err(ApiError::invalid(
                        &format!("{at}.tool_call_id"),
                        format!("no earlier assistant message made a tool call with id {id:?}"),
                    ));
                }
            }
            (Role::Tool, None) => {
                return Err(ApiError::invalid(&format!("{at}.tool_call_id"), "a tool message needs its call's id"));
            }
            (_, Some(_)) => {
                return Err(ApiError::invalid(&format!("{at}.tool_call_id"), "only tool messages answer a call"));
            }
            (_, None) => {}
        }
        if let Some(r) = field(fields, "reasoning_content") {
            let r = string(Some(r), &format!("{at}.reasoning_content"))?;
            if role != Role::Assistant {
                return Err(ApiError::invalid(&format!("{at}.reasoning_content"), "only assistant messages reason"));
            }
            message.reasoning = Some(r.to_owned());
        }
        out.push(message);
    }
    Ok(out)
}

/// A message's content: a string, `text` parts (joined), or nothing.
fn content(value: Option<&Json>, at: &str) -> Result<String, ApiError> {
    let at = format!("{at}.content");
    match value {
        None => Ok(String::new()),
        Some(Json::String(s)) => Ok(s.clone()),
        Some(Json::Array(parts)) => {
            let mut text = String::new();
            for (j, part) in parts.iter().enumerate() {
                let at = format!("{at}[{j}]");
                let fields = object(part, &at)?;
                match string(field(fields, "type"), &format!("{at}.type"))? {
                    "text" => {
                        only(fields, &["type", "text"], &at)?;
                        text.push_str(string(field(fields, "text"), &format!("{at}.text"))?);
                    }
                    kind => {
                        return Err(ApiError::unsupported(
                            &format!("{at}.type"),
                            format!("content part of type {kind:?} is not supported yet (text only)"),
                        ));
                    }
                }
            }
            Ok(text)
        }
        Some(_) => Err(ApiError::invalid(&at, format!("`{at}` must be a string or an array of text parts"))),
    }
}

/// One call of an assistant message: its id, and the call as the template renders it.
fn read_call(value: &Json, at: &str) -> Result<(String, ToolCall), ApiError> {
    let fields = object(value, at)?;
    if string(field(fields, "type"), &format!("{at}.type"))? != "function" {
        return Err(ApiError::unsupported(&format!("{at}.type"), "only function calls are supported"));
    }
    only(fields, &["id", "type", "function"], at)?;
    let id = string(field(fields, "id"), &format!("{at}.id"))?.to_owned();
    let at = format!("{at}.function");
    let function = object(field(fields, "function").unwrap_or(&Json::Null), &at)?;
    only(function, &["name", "arguments"], &at)?;
    let name = string(field(function, "name"), &format!("{at}.name"))?.to_owned();
    let text = string(field(function, "arguments"), &format!("{at}.arguments"))?;
    let arguments = match Json::parse(text) {
        Ok(args @ Json::Object(_)) => args,
        _ => {
            return Err(ApiError::invalid(
                &format!("{at}.arguments"),
                "`arguments` must be a JSON object written as a string",
            ));
        }
    };
    Ok((id, ToolCall { name, arguments: ToolArguments::Json(arguments) }))
}

/// `tools`: function tools, each given to the template as sent. Returns them and their names.
pub fn read_tools(value: &Json) -> Result<(Vec<Json>, Vec<String>), ApiError> {
    let Json::Array(items) = value else { return Err(ApiError::invalid("tools", "`tools` must be an array")) };
    let mut names = Vec::with_capacity(items.len());
    for (i, tool) in items.iter().enumerate() {
        let at = format!("tools[{i}]");
        let fields = object(tool, &at)?;
        if string(field(fields, "type"), &format!("{at}.type"))? != "function" {
            return Err(ApiError::unsupported(&format!("{at}.type"), "only function tools are supported"));
        }
        only(fields, &["type", "function"], &at)?;
        let at = format!("{at}.function");
        let function = object(field(fields, "function").unwrap_or(&Json::Null), &at)?;
        only(function, &["name", "description", "parameters", "strict"], &at)?;
        let name = string(field(function, "name"), &format!("{at}.name"))?;
        if name.is_empty() || names.iter().any(|n| n == name) {
            return Err(ApiError::invalid(
                &format!("{at}.name"),
                format!("function name {name:?} is empty or given twice"),
            ));
        }
        if field(function, "strict").is_some_and(|s| *s != Json::Bool(false)) {
            return Err(ApiError::unsupported(
                &format!("{at}.strict"),
                "`strict` function calling is not supported yet: it needs constrained decoding",
            ));
        }
        names.push(name.to_owned());
    }
    Ok((items.clone(), names))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn messages(text: &str, tool_calls: bool) -> Result<Vec<Message>, ApiError> {
        read_messages(&Json::parse(text).unwrap(), tool_calls)
    }

    fn param(e: ApiError) -> String {
        e.param.unwrap_or_default()
    }

    #[test]
    fn a_conversation_with_calls_and_results_reads_into_the_templates_messages() {
        let conv = r#"[{"role": "developer", "content": [{"type": "text", "text": "Be brief."}]},
            {"role": "user", "content": "Weather?"},
            {"role": "assistant", "content": null, "reasoning_content": "look it up",
             "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "w", "arguments": "{\"z\": 1, \"a\": 2}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "sunny"}]"#;
        let m = messages(conv, true).unwrap();
        assert_eq!(
            m.iter().map(|m| m.role).collect::<Vec<_>>(),
            [Role::System, Role::User, Role::Assistant, Role::Tool]
        );
        assert_eq!(m[0].content, "Be brief.");
        assert_eq!(m[2].reasoning.as_deref(), Some("look it up"));
        // Key order as sent: the template writes the arguments as the model saw them in training.
        assert_eq!(m[2].tool_calls[0].arguments.render(), r#"{"z": 1, "a": 2}"#);
        assert_eq!(m[3].content, "sunny");
        // Without tool calling, both halves are refused by name.
        assert_eq!(param(messages(conv, false).unwrap_err()), "messages[2].tool_calls");
    }

    #[test]
    fn each_bad_field_is_refused_by_its_path() {
        for (conv, at) in [
            (r#"[{"role": "user", "content": "hi", "name": "bob"}]"#, "messages[0].name"),
            (r#"[{"role": "user", "content": "hi", "cache": 1}]"#, "messages[0].cache"),
            (r#"[{"role": "robot", "content": "hi"}]"#, "messages[0].role"),
            (
                r#"[{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]"#,
                "messages[0].content[0].type",
            ),
            (r#"[{"role": "user", "content": [{"type": "text", "text": "a", "x": 1}]}]"#, "messages[0].content[0].x"),
            (r#"[{"role": "user", "content": [{"type": "image_url"}]}]"#, "messages[0].content[0].type"),
            (r#"[{"role": "tool", "tool_call_id": "nope", "content": "x"}]"#, "messages[0].tool_call_id"),
            (r#"[{"role": "tool", "content": "x"}]"#, "messages[0].tool_call_id"),
            (r#"[{"role": "user", "tool_call_id": "c", "content": "x"}]"#, "messages[0].tool_call_id"),
            (
                r#"[{"role": "assistant", "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "[1]"}}]}]"#,
                "messages[0].tool_calls[0].function.arguments",
            ),
            (r#"[]"#, "messages"),
        ] {
            assert_eq!(param(messages(conv, true).unwrap_err()), at, "{conv}");
        }
        assert_eq!(
            param(messages(r#"[{"role": "tool", "tool_call_id": "c", "content": "x"}]"#, false).unwrap_err()),
            "messages[0].role"
        );
    }

    #[test]
    fn tools_are_function_tools_given_as_sent_and_strict_is_refused() {
        let (tools, names) = read_tools(
            &Json::parse(r#"[{"type": "function", "function": {"name": "w", "parameters": {"type": "object", "properties": {}}}}]"#)
                .unwrap(),
        )
        .unwrap();
        assert_eq!(names, ["w"]);
        assert_eq!(
            tools[0].to_python_json(),
            r#"{"type": "function", "function": {"name": "w", "parameters": {"type": "object", "properties": {}}}}"#
        );
        for (tools, at) in [
            (r#"[{"type": "function", "function": {"name": "w", "strict": true}}]"#, "tools[0].function.strict"),
            (r#"[{"type": "custom", "custom": {"name": "w"}}]"#, "tools[0].type"),
            (
                r#"[{"type": "function", "function": {"name": "w"}}, {"type": "function", "function": {"name": "w"}}]"#,
                "tools[1].function.name",
            ),
            (r#"{}"#, "tools"),
        ] {
            assert_eq!(param(read_tools(&Json::parse(tools).unwrap()).unwrap_err()), at, "{tools}");
        }
    }
}
