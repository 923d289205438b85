//! Turns one parsed JSON record into an [`Example`] of the recipe's format, or says exactly
//! what is wrong with it (`messages[2].role: expected one of ...`).
//!
//! Unknown fields are ignored: public datasets carry ids, sources and scores beside the
//! fields we read. The fields we read are checked strictly.

use super::example::{Conversation, Example, Message, PreferencePair, Role, ToolArguments, ToolCall};
use super::json::Json;
use crate::recipe::DataFormat;

type Fields = [(String, Json)];

pub fn example_from_json(value: &Json, format: DataFormat) -> Result<Example, String> {
    let Json::Object(fields) = value else {
        return Err(format!("expected a JSON object, found {}", kind(value)));
    };
    match format {
        DataFormat::Chat => chat(fields),
        DataFormat::Instruction => instruction(fields),
        DataFormat::Text => Ok(Example::Text(required_string(fields, "text", false)?)),
        DataFormat::Preference => preference(fields),
    }
}

fn chat(fields: &Fields) -> Result<Example, String> {
    let messages = messages_at(field(fields, "messages").ok_or("missing field `messages`")?, "messages")?;
    let tools = tools(fields)?;
    if !messages.iter().any(|m| m.role == Role::Assistant) {
        return Err("`messages` has no assistant turn to learn from".into());
    }
    Ok(Example::Chat(Conversation { messages, tools }))
}

fn instruction(fields: &Fields) -> Result<Example, String> {
    let instruction = required_string(fields, "instruction", false)?;
    let input = optional_string(fields, "input")?.unwrap_or_default();
    let output = required_string(fields, "output", false)?;
    let mut messages = Vec::new();
    if let Some(system) = optional_string(fields, "system")?.filter(|s| !s.is_empty()) {
        messages.push(Message::new(Role::System, system));
    }
    // Alpaca's own prompt joins instruction and input with a blank line.
    let user = if input.is_empty() { instruction } else { format!("{instruction}\n\n{input}") };
    messages.push(Message::new(Role::User, user));
    messages.push(Message::new(Role::Assistant, output));
    Ok(Example::Chat(Conversation { messages, tools: Vec::new() }))
}

fn preference(fields: &Fields) -> Result<Example, String> {
    let prompt = match field(fields, "prompt").ok_or("missing field `prompt`")? {
        Json::String(s) if !s.is_empty() => vec![Message::new(Role::User, s.clone())],
        Json::String(_) => return Err("`prompt` is empty".into()),
        other => messages_at(other, "prompt")?,
    };
    if prompt.last().is_some_and(|m| m.role == Role::Assistant) {
        return Err("`prompt` must not end with an assistant turn".into());
    }
    let answer = |name: &str| -> Result<Vec<Message>, String> {
        let messages = match field(fields, name).ok_or_else(|| format!("missing field `{name}`"))? {
            Json::String(s) => vec![Message::new(Role::Assistant, s.clone())],
            other => messages_at(other, name)?,
        };
        if let Some(i) = messages.iter().position(|m| m.role != Role::Assistant) {
            return Err(format!("{name}[{i}].role: a preference answer holds only assistant turns"));
        }
        Ok(messages)
    };
    let (chosen, rejected) = (answer("chosen")?, answer("rejected")?);
    if chosen == rejected {
        return Err("`chosen` and `rejected` are identical".into());
    }
    Ok(Example::Preference(PreferencePair { prompt, chosen, rejected, tools: tools(fields)? }))
}

fn tools(fields: &Fields) -> Result<Vec<Json>, String> {
    match field(fields, "tools") {
        None | Some(Json::Null) => Ok(Vec::new()),
        Some(Json::Array(items)) => {
            if let Some(i) = items.iter().position(|t| !matches!(t, Json::Object(_))) {
                return Err(format!("tools[{i}]: expected a JSON object, found {}", kind(&items[i])));
            }
            Ok(items.clone())
        }
        Some(other) => Err(format!("tools: expected an array, found {}", kind(other))),
    }
}

fn messages_at(value: &Json, name: &str) -> Result<Vec<Message>, String> {
    let Json::Array(items) = value else {
        return Err(format!("{name}: expected an array of messages, found {}", kind(value)));
    };
    if items.is_empty() {
        return Err(format!("{name}: is empty"));
    }
    let messages =
        items.iter().enumerate().map(|(i, m)| message(m, &format!("{name}[{i}]"))).collect::<Result<Vec<_>, _>>()?;
    if let Some(i) = messages.iter().skip(1).position(|m| m.role == Role::System) {
        return Err(format!("{name}[{}].role: a system message may only come first", i + 1));
    }
    Ok(messages)
}

fn message(value: &Json, at: &str) -> Result<Message, String> {
    let Json::Object(fields) = value else {
        return Err(format!("{at}: expected a message object, found {}", kind(value)));
    };
    let role = match field(fields, "role") {
        Some(Json::String(r)) => match r.as_str() {
            "system" => Role::System,
            "user" => Role::User,
            "assistant" => Role::Assistant,
            "tool" => Role::Tool,
            other => return Err(format!("{at}.role: expected system, user, assistant or tool, found `{other}`")),
        },
        Some(other) => return Err(format!("{at}.role: expected a string, found {}", kind(other))),
        None => return Err(format!("{at}: missing field `role`")),
    };
    let content = match field(fields, "content") {
        Some(Json::String(s)) => s.clone(),
        // Assistant turns that only call tools carry `content: null` in OpenAI-style data.
        Some(Json::Null) | None => String::new(),
        Some(other) => return Err(format!("{at}.content: expected a string, found {}", kind(other))),
    };
    let reasoning = match field(fields, "reasoning_content") {
        Some(Json::String(s)) => Some(s.clone()),
        Some(Json::Null) | None => None,
        Some(other) => return Err(format!("{at}.reasoning_content: expected a string, found {}", kind(other))),
    };
    let tool_calls = match field(fields, "tool_calls") {
        Some(Json::Array(calls)) if role == Role::Assistant => calls
            .iter()
            .enumerate()
            .map(|(i, c)| tool_call(c, &format!("{at}.tool_calls[{i}]")))
            .collect::<Result<Vec<_>, _>>()?,
        Some(Json::Array(calls)) if calls.is_empty() => Vec::new(),
        Some(Json::Array(_)) => return Err(format!("{at}.tool_calls: only assistant messages call tools")),
        Some(Json::Null) | None => Vec::new(),
        Some(other) => return Err(format!("{at}.tool_calls: expected an array, found {}", kind(other))),
    };
    if content.is_empty() && tool_calls.is_empty() && reasoning.is_none() {
        return Err(format!("{at}.content: is empty"));
    }
    Ok(Message { role, content, reasoning, tool_calls })
}

fn tool_call(value: &Json, at: &str) -> Result<ToolCall, String> {
    let Json::Object(outer) = value else {
        return Err(format!("{at}: expected a tool-call object, found {}", kind(value)));
    };
    // OpenAI style nests the call under `function`; Qwen3's template accepts both.
    let (fields, at) = match field(outer, "function") {
        Some(Json::Object(inner)) => (inner.as_slice(), format!("{at}.function")),
        Some(other) => return Err(format!("{at}.function: expected an object, found {}", kind(other))),
        None => (outer.as_slice(), at.to_owned()),
    };
    let name = match field(fields, "name") {
        Some(Json::String(n)) if !n.is_empty() => n.clone(),
        Some(Json::String(_)) => return Err(format!("{at}.name: is empty")),
        Some(other) => return Err(format!("{at}.name: expected a string, found {}", kind(other))),
        None => return Err(format!("{at}: missing field `name`")),
    };
    let arguments = match field(fields, "arguments") {
        Some(Json::String(s)) => ToolArguments::Raw(s.clone()),
        Some(obj @ Json::Object(_)) => ToolArguments::Json(obj.clone()),
        Some(other) => return Err(format!("{at}.arguments: expected an object or a string, found {}", kind(other))),
        None => return Err(format!("{at}: missing field `arguments`")),
    };
    Ok(ToolCall { name, arguments })
}

fn field<'a>(fields: &'a Fields, name: &str) -> Option<&'a Json> {
    fields.iter().find(|(k, _)| k == name).map(|(_, v)| v)
}

fn required_string(fields: &Fields, name: &str, allow_empty: bool) -> Result<String, String> {
    match field(fields, name) {
        Some(Json::String(s)) if allow_empty || !s.is_empty() => Ok(s.clone()),
        Some(Json::String(_)) => Err(format!("`{name}` is empty")),
        Some(other) => Err(format!("{name}: expected a string, found {}", kind(other))),
        None => Err(format!("missing field `{name}`")),
    }
}

fn optional_string(fields: &Fields, name: &str) -> Result<Option<String>, String> {
    match field(fields, name) {
        None | Some(Json::Null) => Ok(None),
        Some(_) => required_string(fields, name, true).map(Some),
    }
}

fn kind(value: &Json) -> &'static str {
    match value {
        Json::Null => "null",
        Json::Bool(_) => "a boolean",
        Json::Int(_) | Json::Float(_) => "a number",
        Json::String(_) => "a string",
        Json::Array(_) => "an array",
        Json::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(line: &str, format: DataFormat) -> Result<Example, String> {
        example_from_json(&Json::parse(line).unwrap(), format)
    }

    #[test]
    fn alpaca_becomes_a_chat_with_input_after_a_blank_line() {
        let ex = parse(r#"{"instruction":"Add","input":"2 3","output":"5","id":7}"#, DataFormat::Instruction).unwrap();
        let Example::Chat(c) = ex else { panic!() };
        assert_eq!(c.messages, vec![Message::new(Role::User, "Add\n\n2 3"), Message::new(Role::Assistant, "5")]);
    }

    #[test]
    fn alpaca_and_chat_forms_of_one_example_have_one_digest() {
        let a = parse(r#"{"instruction":"Hi","output":"Yo"}"#, DataFormat::Instruction).unwrap();
        let b = parse(
            r#"{"messages":[{"role":"user","content":"Hi"},{"role":"assistant","content":"Yo"}]}"#,
            DataFormat::Chat,
        )
        .unwrap();
        assert_eq!(a.digest(), b.digest());
    }

    #[test]
    fn chat_errors_name_the_field() {
        let cases = [
            (r#"{"messages":[{"role":"bot","content":"x"}]}"#, "messages[0].role: expected system"),
            (r#"{"messages":[{"role":"user","content":3}]}"#, "messages[0].content: expected a string"),
            (r#"{"messages":[{"role":"user","content":"x"}]}"#, "no assistant turn"),
            (r#"{"messages":[]}"#, "messages: is empty"),
            (r#"{"msgs":[]}"#, "missing field `messages`"),
            (r#"[1]"#, "expected a JSON object, found an array"),
            (
                r#"{"messages":[{"role":"user","content":"x"},{"role":"system","content":"s"}]}"#,
                "messages[1].role: a system message may only come first",
            ),
            (
                r#"{"messages":[{"role":"assistant","tool_calls":[{"function":{"name":"f"}}]}]}"#,
                "messages[0].tool_calls[0].function: missing field `arguments`",
            ),
        ];
        for (line, want) in cases {
            let err = parse(line, DataFormat::Chat).unwrap_err();
            assert!(err.contains(want), "{line}: {err}");
        }
    }

    #[test]
    fn tool_calls_keep_argument_order_in_both_nestings() {
        let line = r#"{"messages":[{"role":"user","content":"w"},{"role":"assistant","content":null,
            "tool_calls":[{"type":"function","function":{"name":"f","arguments":{"b":1,"a":2}}},
                          {"name":"g","arguments":"{\"raw\": true}"}]}]}"#;
        let Example::Chat(c) = parse(line, DataFormat::Chat).unwrap() else { panic!() };
        let calls = &c.messages[1].tool_calls;
        assert_eq!(calls[0].name, "f");
        assert_eq!(calls[0].arguments.render(), r#"{"b": 1, "a": 2}"#);
        assert_eq!(calls[1].arguments.render(), r#"{"raw": true}"#);
    }

    #[test]
    fn preference_accepts_strings_and_message_lists() {
        let ex = parse(r#"{"prompt":"Q","chosen":"A","rejected":"B"}"#, DataFormat::Preference).unwrap();
        let Example::Preference(p) = ex else { panic!() };
        assert_eq!(p.prompt, vec![Message::new(Role::User, "Q")]);
        assert_eq!(p.chosen, vec![Message::new(Role::Assistant, "A")]);
        let ex = parse(
            r#"{"prompt":[{"role":"system","content":"S"},{"role":"user","content":"Q"}],
                "chosen":[{"role":"assistant","content":"A"}],"rejected":[{"role":"assistant","content":"B"}]}"#,
            DataFormat::Preference,
        )
        .unwrap();
        let Example::Preference(p) = ex else { panic!() };
        assert_eq!(p.prompt.len(), 2);
        for (line, want) in [
            (r#"{"prompt":"Q","chosen":"A","rejected":"A"}"#, "identical"),
            (r#"{"prompt":"Q","chosen":"A"}"#, "missing field `rejected`"),
            (r#"{"prompt":"Q","chosen":[{"role":"user","content":"A"}],"rejected":"B"}"#, "chosen[0].role"),
        ] {
            let err = parse(line, DataFormat::Preference).unwrap_err();
            assert!(err.contains(want), "{line}: {err}");
        }
    }

    #[test]
    fn text_must_be_a_non_empty_string() {
        assert_eq!(parse(r#"{"text":"abc"}"#, DataFormat::Text).unwrap(), Example::Text("abc".into()));
        assert!(parse(r#"{"text":""}"#, DataFormat::Text).unwrap_err().contains("empty"));
        assert!(parse(r#"{"text":1}"#, DataFormat::Text).unwrap_err().contains("expected a string"));
    }
}
