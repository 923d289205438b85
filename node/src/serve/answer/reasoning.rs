//! Qwen3's reasoning: an answer that starts with `<think>` reasons until `</think>`; that text
//! is the message's `reasoning_content`, and what follows (its leading whitespace trimmed) is
//! the content. An answer cut off inside the block is all reasoning; an answer that does not
//! start with `<think>` is all content, unless the prompt itself opened the block.
//!
//! vLLM's `qwen3` reasoning parser differs in ways that do not arise with the templates served
//! here (docs/formats.md, "Serving", lists them): it keeps the whitespace after `</think>`,
//! strips a `<think>` found anywhere, and reads an answer without any tag as reasoning unless
//! the prompt closed the block.

use super::{Delta, Scan, scan};

const OPEN: &str = "<think>";
const CLOSE: &str = "</think>";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Not yet known whether the answer starts with `<think>`.
    Opening,
    Thinking,
    /// After `</think>`: whitespace is dropped until the content starts.
    Closed,
    Content,
}

/// Splits one answer into reasoning and content as its text arrives.
#[derive(Debug)]
pub struct ThinkSplitter {
    state: State,
    /// Text not yet released.
    buf: String,
    /// Leading whitespace of the reasoning, held until something else follows: a block of
    /// whitespace alone (Qwen3's empty `<think>\n\n</think>`) is no reasoning at all.
    blank: String,
    reasoned: bool,
}

impl ThinkSplitter {
    /// `think_open`: the prompt ended inside a think block.
    pub fn new(think_open: bool) -> ThinkSplitter {
        let state = if think_open { State::Thinking } else { State::Opening };
        ThinkSplitter { state, buf: String::new(), blank: String::new(), reasoned: false }
    }

    pub fn push(&mut self, text: &str, out: &mut Vec<Delta>) {
        self.buf.push_str(text);
        loop {
            match self.state {
                State::Opening => {
                    if self.buf.starts_with(OPEN) {
                        self.buf.drain(..OPEN.len());
                        self.state = State::Thinking;
                    } else if OPEN.starts_with(self.buf.as_str()) {
                        return;
                    } else {
                        self.state = State::Content;
                    }
                }
                State::Thinking => match scan(&self.buf, CLOSE) {
                    Scan::Found(at) => {
                        let reasoning = self.buf[..at].to_owned();
                        self.buf.drain(..at + CLOSE.len());
                        self.reason(&reasoning, out);
                        self.state = State::Closed;
                    }
                    Scan::Safe(safe) => {
                        let reasoning: String = self.buf.drain(..safe).collect();
                        self.reason(&reasoning, out);
                        return;
                    }
                },
                State::Closed => {
                    let kept = self.buf.trim_start().len();
                    self.buf.drain(..self.buf.len() - kept);
                    if self.buf.is_empty() {
                        return;
                    }
                    self.state = State::Content;
                }
                State::Content => {
                    if !self.buf.is_empty() {
                        out.push(Delta::Content(std::mem::take(&mut self.buf)));
                    }
                    return;
                }
            }
        }
    }

    /// The answer ended: a partial `<think>` is content, a partial `</think>` reasoning.
    pub fn finish(&mut self, out: &mut Vec<Delta>) {
        let rest = std::mem::take(&mut self.buf);
        match self.state {
            State::Opening => {
                if !rest.is_empty() {
                    out.push(Delta::Content(rest));
                }
            }
            State::Thinking => self.reason(&rest, out),
            State::Closed | State::Content => {}
        }
    }

    fn reason(&mut self, text: &str, out: &mut Vec<Delta>) {
        if text.is_empty() {
            return;
        }
        if !self.reasoned && text.trim().is_empty() {
            self.blank.push_str(text);
            return;
        }
        self.reasoned = true;
        let mut reasoning = std::mem::take(&mut self.blank);
        reasoning.push_str(text);
        out.push(Delta::Reasoning(reasoning));
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Answer, Format};

    fn split(think_open: bool, text: &str) -> (String, String) {
        let a = Answer::parse(&Format { reasoning: true, think_open, tools: vec![] }, text);
        (a.reasoning, a.content)
    }

    #[test]
    fn a_leading_think_block_is_reasoning_and_the_content_follows_it_trimmed() {
        let r = |s: &str| s.to_owned();
        assert_eq!(split(false, "<think>\nadd 2 and 3\n</think>\n\nIt is 5."), (r("\nadd 2 and 3\n"), r("It is 5.")));
        assert_eq!(split(false, "<think>a</think>b"), (r("a"), r("b")));
        // Cut off inside the block: all reasoning.
        assert_eq!(split(false, "<think>still thinking </thi"), (r("still thinking </thi"), r("")));
        // An empty block (Qwen3 without thinking) is no reasoning.
        assert_eq!(split(false, "<think>\n\n</think>\n\nHi"), (r(""), r("Hi")));
        // Only a block at the very start counts; anything else is content as generated.
        assert_eq!(split(false, "Hi <think>x</think>"), (r(""), r("Hi <think>x</think>")));
        assert_eq!(split(false, " <think>x</think>"), (r(""), r(" <think>x</think>")));
        assert_eq!(split(false, "<thin"), (r(""), r("<thin")));
        assert_eq!(split(false, "  \n"), (r(""), r("  \n")));
        // A second block after the first stays content.
        assert_eq!(split(false, "<think>a</think> b<think>c</think>"), (r("a"), r("b<think>c</think>")));
        // A prompt that opened the block: the answer starts inside it.
        assert_eq!(split(true, "plan</think>\n\ndone"), (r("plan"), r("done")));
        assert_eq!(split(true, "no end"), (r("no end"), r("")));
    }

    #[test]
    fn switched_off_the_text_is_returned_as_generated() {
        let a = Answer::parse(&Format::default(), "<think>a</think>\n\nb");
        assert_eq!((a.reasoning.as_str(), a.content.as_str()), ("", "<think>a</think>\n\nb"));
    }
}
