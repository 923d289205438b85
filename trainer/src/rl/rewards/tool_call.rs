//! `tool_call`: whether tool calls are valid JSON calls, for the tool-use data. Where the
//! reference calls a tool, 1 when the answer (after a think block) is one or more closed
//! `<tool_call>` blocks and nothing else, each a JSON object with exactly a non-empty string
//! `name` and an object `arguments`; else 0. Where the reference calls none, 0 if the answer
//! calls one anyway; answers that neither call nor should are not scored.

use serde_json::Value;

use super::Sample;
use super::answer::{TOOL_OPEN, layout, tool_calls};

pub const SOURCES: &[&str] = &[include_str!("tool_call.rs"), include_str!("answer.rs")];

pub fn score(s: &Sample<'_>) -> Option<f64> {
    let calls = tool_calls(layout(s.text).answer);
    match (s.reference.contains(TOOL_OPEN), calls.any()) {
        (false, false) => None,
        (false, true) => Some(0.0),
        (true, _) => {
            let ok = !calls.bodies.is_empty()
                && !calls.unbalanced
                && !calls.text_outside
                && calls.bodies.iter().all(|b| valid_call(b));
            Some(if ok { 1.0 } else { 0.0 })
        }
    }
}

fn valid_call(body: &str) -> bool {
    let Ok(Value::Object(call)) = serde_json::from_str::<Value>(body) else { return false };
    call.len() == 2
        && call.get("name").and_then(Value::as_str).is_some_and(|n| !n.trim().is_empty())
        && call.get("arguments").is_some_and(Value::is_object)
}

#[cfg(test)]
mod tests {
    use super::*;

    const CALL: &str = "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"city\": \"Tavo\"}}\n</tool_call>";

    fn score_of(reference: &str, text: &str) -> Option<f64> {
        score(&Sample { reference, text, completion_tokens: 4, truncated: false, max_new_tokens: 16 })
    }

    #[test]
    fn valid_json_calls_score_where_a_call_is_wanted() {
        assert_eq!(score_of(CALL, CALL), Some(1.0));
        // Validity, not correctness: another city is still a valid call.
        assert_eq!(
            score_of(CALL, "<tool_call>{\"arguments\": {\"city\": \"Rome\"}, \"name\": \"f\"}</tool_call>"),
            Some(1.0)
        );
        assert_eq!(score_of(CALL, &format!("<think>call it</think>{CALL}\n{CALL}")), Some(1.0));
        for bad in [
            "<tool_call>{\"name\": \"f\", \"arguments\": {\"city\": }</tool_call>",
            "<tool_call>{\"name\": \"f\"}</tool_call>",
            "<tool_call>{\"name\": \"\", \"arguments\": {}}</tool_call>",
            "<tool_call>{\"name\": \"f\", \"arguments\": \"city\"}</tool_call>",
            "<tool_call>{\"name\": \"f\", \"arguments\": {}, \"id\": 1}</tool_call>",
            "<tool_call>[1]</tool_call>",
            "<tool_call>{\"name\": \"f\", \"arguments\": {}}",
            "ok <tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>",
            "get_time(Tavo)",
        ] {
            assert_eq!(score_of(CALL, bad), Some(0.0), "{bad}");
        }
    }

    #[test]
    fn calls_where_none_is_wanted_score_zero_and_plain_answers_are_not_scored() {
        assert_eq!(score_of("72", CALL), Some(0.0));
        assert_eq!(score_of("72", "72"), None);
        assert_eq!(score_of("72", "</tool_call>"), Some(0.0));
    }
}
