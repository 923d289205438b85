//! `format`: 1 when the completion has the layout of an answer, else 0. That is: it ended by
//! itself (a stop token, not the length limit); its think block, if any, opens it, is closed
//! and is the only one; an answer follows; and that answer is tool calls (closed blocks, no
//! text around them) exactly when the reference's is. What the answer says is not judged.

use super::Sample;
use super::answer::{TOOL_OPEN, layout, tool_calls};

pub const SOURCES: &[&str] = &[include_str!("format.rs"), include_str!("answer.rs")];

pub fn score(s: &Sample<'_>) -> Option<f64> {
    let l = layout(s.text);
    let calls = tool_calls(l.answer);
    let wants_calls = s.reference.contains(TOOL_OPEN);
    let calls_ok =
        if wants_calls { !calls.bodies.is_empty() && !calls.unbalanced && !calls.text_outside } else { !calls.any() };
    Some(if !s.truncated && l.think_ok && !l.answer.is_empty() && calls_ok { 1.0 } else { 0.0 })
}

#[cfg(test)]
mod tests {
    use super::*;

    const CALL: &str = "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>";

    fn score_of(reference: &str, text: &str, truncated: bool) -> Option<f64> {
        score(&Sample { reference, text, completion_tokens: 4, truncated, max_new_tokens: 16 })
    }

    #[test]
    fn the_layout_is_judged_not_the_content() {
        assert_eq!(score_of("72", "71", false), Some(1.0));
        assert_eq!(score_of("72", "<think>\nhm\n</think>\n\n71", false), Some(1.0));
        assert_eq!(score_of("72", "71", true), Some(0.0), "cut off by the length limit");
        assert_eq!(score_of("72", "<think>hm</think>", false), Some(0.0), "no answer");
        assert_eq!(score_of("72", "<think>hm 71", false), Some(0.0));
        assert_eq!(score_of("72", CALL, false), Some(0.0), "a tool call where none was wanted");
        assert_eq!(score_of(CALL, CALL, false), Some(1.0));
        assert_eq!(score_of(CALL, "<tool_call>{not json}</tool_call>", false), Some(1.0), "JSON is tool_call's job");
        assert_eq!(score_of(CALL, "Sure: <tool_call>{}</tool_call>", false), Some(0.0));
        assert_eq!(score_of(CALL, "<tool_call>{}", false), Some(0.0));
        assert_eq!(score_of(CALL, "f()", false), Some(0.0));
    }
}
