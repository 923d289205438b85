//! Exact-match scoring of a generated answer against a reference answer.
//!
//! Text answers must match after trimming whitespace. Answers with tool calls match when the
//! calls, parsed as JSON, are equal in order (so `{"a": 1, "b": 2}` equals `{"b":2,"a":1}`)
//! and the text around them matches. A leading `<think>...</think>` block and anything from
//! the first end-of-turn token on are ignored.

use serde_json::Value;

const TOOL_OPEN: &str = "<tool_call>";
const TOOL_CLOSE: &str = "</tool_call>";

/// Whether `output` (decoded model text) answers like `reference`.
pub fn answers_match(reference: &str, output: &str) -> bool {
    match (split_tool_calls(clean(reference)), split_tool_calls(clean(output))) {
        (Some((ref_text, ref_calls)), Some((out_text, out_calls))) => ref_text == out_text && ref_calls == out_calls,
        _ => false,
    }
}

/// Drops a leading think block and everything from an end-of-turn token on, then trims.
fn clean(text: &str) -> &str {
    let mut text = text.trim_start();
    if let Some(rest) = text.strip_prefix("<think>") {
        text = rest.split_once("</think>").map_or("", |(_, after)| after);
    }
    for end in ["<|im_end|>", "<|endoftext|>"] {
        if let Some((before, _)) = text.split_once(end) {
            text = before;
        }
    }
    text.trim()
}

/// The text outside tool calls (whitespace-normalised) and the calls parsed as JSON; `None`
/// when a call is unterminated or not JSON.
fn split_tool_calls(text: &str) -> Option<(String, Vec<Value>)> {
    let mut outside = Vec::new();
    let mut calls = Vec::new();
    let mut rest = text;
    while let Some((before, after)) = rest.split_once(TOOL_OPEN) {
        outside.push(before.trim());
        let (body, after) = after.split_once(TOOL_CLOSE)?;
        calls.push(serde_json::from_str::<Value>(body.trim()).ok()?);
        rest = after;
    }
    outside.push(rest.trim());
    let outside: Vec<&str> = outside.into_iter().filter(|s| !s.is_empty()).collect();
    Some((outside.join("\n"), calls))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_answers_match_exactly_after_trimming() {
        assert!(answers_match("82", "82"));
        assert!(answers_match("82", " 82\n"));
        assert!(answers_match("82", "82<|im_end|>garbage"));
        assert!(answers_match("82", "<think>\nlet me see\n</think>\n\n82"));
        assert!(!answers_match("82", "83"));
        assert!(!answers_match("82", "820"));
        assert!(!answers_match("ABC", "abc"));
        assert!(!answers_match("82", ""));
    }

    #[test]
    fn tool_calls_compare_as_parsed_json() {
        let reference = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>";
        assert!(answers_match(reference, reference));
        assert!(answers_match(
            reference,
            "<tool_call>{\"arguments\":{\"city\":\"Oslo\"},\"name\":\"get_weather\"}</tool_call>"
        ));
        assert!(!answers_match(
            reference,
            "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}}\n</tool_call>"
        ));
        assert!(!answers_match(
            reference,
            "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}\n</tool_call>"
        ));
        assert!(!answers_match(
            reference,
            "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}"
        ));
        assert!(!answers_match(
            reference,
            "Sure. <tool_call>{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}</tool_call>"
        ));
        assert!(!answers_match(reference, "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}"));
        assert!(!answers_match("Oslo", reference));
    }

    #[test]
    fn two_calls_must_match_in_order() {
        let a = "<tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>";
        let b = "<tool_call>{\"name\": \"g\", \"arguments\": {}}</tool_call>";
        assert!(answers_match(&format!("{a}\n{b}"), &format!("{a}{b}")));
        assert!(!answers_match(&format!("{a}\n{b}"), &format!("{b}\n{a}")));
    }
}
