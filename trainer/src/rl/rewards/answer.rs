//! How a completion is laid out: an optional leading `<think>` block, then the answer, which
//! may hold `<tool_call>` blocks (Qwen3's chat format). The rewards read completions through
//! this one parser, so they agree on where an answer starts.

pub const THINK_OPEN: &str = "<think>";
pub const THINK_CLOSE: &str = "</think>";
pub const TOOL_OPEN: &str = "<tool_call>";
pub const TOOL_CLOSE: &str = "</tool_call>";

/// A completion split at its think block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout<'a> {
    /// Whether the completion opens with a think block.
    pub thinks: bool,
    /// Whether the think blocks are well formed: at most one, at the very start, closed.
    pub think_ok: bool,
    /// The text after the think block (all of it when there is none), trimmed.
    pub answer: &'a str,
}

pub fn layout(text: &str) -> Layout<'_> {
    let t = text.trim_start();
    match t.strip_prefix(THINK_OPEN) {
        Some(rest) => match rest.split_once(THINK_CLOSE) {
            Some((inner, after)) => Layout {
                thinks: true,
                think_ok: !inner.contains(THINK_OPEN) && !after.contains(THINK_OPEN) && !after.contains(THINK_CLOSE),
                answer: after.trim(),
            },
            None => Layout { thinks: true, think_ok: false, answer: "" },
        },
        None => {
            Layout { thinks: false, think_ok: !t.contains(THINK_OPEN) && !t.contains(THINK_CLOSE), answer: t.trim() }
        }
    }
}

/// An answer's tool-call blocks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolCalls<'a> {
    /// The text inside each closed block, trimmed.
    pub bodies: Vec<&'a str>,
    /// A block was opened and never closed, or a close tag stands alone.
    pub unbalanced: bool,
    /// Non-blank text outside the blocks.
    pub text_outside: bool,
}

impl ToolCalls<'_> {
    pub fn any(&self) -> bool {
        !self.bodies.is_empty() || self.unbalanced
    }
}

pub fn tool_calls(answer: &str) -> ToolCalls<'_> {
    let mut out = ToolCalls { bodies: Vec::new(), unbalanced: false, text_outside: false };
    let mut rest = answer;
    loop {
        match rest.split_once(TOOL_OPEN) {
            Some((before, after)) => {
                out.text_outside |= !before.trim().is_empty();
                out.unbalanced |= before.contains(TOOL_CLOSE);
                match after.split_once(TOOL_CLOSE) {
                    Some((body, after)) => {
                        out.unbalanced |= body.contains(TOOL_OPEN);
                        out.bodies.push(body.trim());
                        rest = after;
                    }
                    None => {
                        out.unbalanced = true;
                        return out;
                    }
                }
            }
            None => {
                out.text_outside |= !rest.trim().is_empty();
                out.unbalanced |= rest.contains(TOOL_CLOSE);
                return out;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn think_blocks_are_split_off_and_judged() {
        let l = layout("<think>\nsum it\n</think>\n\n42");
        assert_eq!((l.thinks, l.think_ok, l.answer), (true, true, "42"));
        assert_eq!(layout("  42 ").answer, "42");
        assert!(layout("42").think_ok);
        assert!(!layout("<think>never closed 42").think_ok);
        assert!(!layout("42 </think>").think_ok);
        assert!(!layout("<think>a</think><think>b</think>42").think_ok);
        assert!(!layout("42 <think>late</think>").think_ok);
    }

    #[test]
    fn tool_call_blocks_are_found_with_their_surroundings() {
        let c = tool_calls("<tool_call>\n{\"name\": \"f\"}\n</tool_call>\n<tool_call>{}</tool_call>");
        assert_eq!(c.bodies, ["{\"name\": \"f\"}", "{}"]);
        assert!(!c.unbalanced && !c.text_outside && c.any());
        assert!(tool_calls("Sure. <tool_call>{}</tool_call>").text_outside);
        assert!(tool_calls("<tool_call>{}").unbalanced);
        assert!(tool_calls("{}</tool_call>").unbalanced);
        assert!(tool_calls("<tool_call><tool_call>{}</tool_call>").unbalanced);
        assert!(!tool_calls("just text").any());
    }
}
