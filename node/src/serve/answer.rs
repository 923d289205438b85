//! From the text a model generates to the parts of an OpenAI assistant message: reasoning
//! (`reasoning_content`), content, and tool calls, whole or as a stream of deltas.
//!
//! * [`reasoning`]: a Qwen3 `<think>…</think>` block at the start of the answer (`serve.reasoning`);
//! * [`tool_calls`]: Qwen3/Hermes `<tool_call>{"name", "arguments"}</tool_call>` blocks
//!   (`serve.tool_calls`, when the request offers tools).
//!
//! Both are incremental: text goes in as the engine releases it, and what can no longer
//! change comes out. A whole answer is the same parser fed once, so a streamed answer and a
//! whole one always agree, however the text was cut into pieces.

pub mod reasoning;
pub mod tool_calls;

use reasoning::ThinkSplitter;
use tool_calls::ToolCallParser;

/// How one answer is read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Format {
    /// Split a leading `<think>` block out into reasoning (`serve.reasoning`).
    pub reasoning: bool,
    /// The prompt itself opened a think block (a template that ends its generation prompt with
    /// `<think>`): the answer starts inside it.
    pub think_open: bool,
    /// The functions offered to the model; tool-call blocks are parsed only when there are some.
    pub tools: Vec<String>,
}

/// A tool call found in the answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedCall {
    /// Its place among the answer's calls (0, 1, …).
    pub index: usize,
    pub name: String,
    /// The arguments object as JSON text (key order as generated).
    pub arguments: String,
}

/// A piece of an answer, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Delta {
    Reasoning(String),
    Content(String),
    ToolCall(ParsedCall),
}

/// Reads one answer incrementally.
#[derive(Debug)]
pub struct AnswerParser {
    think: Option<ThinkSplitter>,
    tools: Option<ToolCallParser>,
}

impl AnswerParser {
    pub fn new(format: &Format) -> AnswerParser {
        AnswerParser {
            think: format.reasoning.then(|| ThinkSplitter::new(format.think_open)),
            tools: (!format.tools.is_empty()).then(|| ToolCallParser::new(format.tools.clone())),
        }
    }

    /// Takes the next piece of generated text; returns what became final.
    pub fn push(&mut self, text: &str) -> Vec<Delta> {
        let mut split = Vec::new();
        match &mut self.think {
            Some(t) => t.push(text, &mut split),
            None => split.push(Delta::Content(text.to_owned())),
        }
        self.calls(split, false)
    }

    /// The answer ended: whatever was held back.
    pub fn finish(&mut self) -> Vec<Delta> {
        let mut split = Vec::new();
        if let Some(t) = &mut self.think {
            t.finish(&mut split);
        }
        self.calls(split, true)
    }

    /// Content goes through the tool-call parser; reasoning is never parsed for calls.
    fn calls(&mut self, split: Vec<Delta>, end: bool) -> Vec<Delta> {
        let Some(parser) = &mut self.tools else {
            return split.into_iter().filter(|d| !matches!(d, Delta::Content(c) if c.is_empty())).collect();
        };
        let mut out = Vec::new();
        for d in split {
            match d {
                Delta::Content(c) => parser.push(&c, &mut out),
                other => out.push(other),
            }
        }
        if end {
            parser.finish(&mut out);
        }
        out
    }
}

/// A whole answer.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Answer {
    pub reasoning: String,
    pub content: String,
    pub tool_calls: Vec<ParsedCall>,
}

impl Answer {
    /// `text`, a whole answer, read as `format` says.
    pub fn parse(format: &Format, text: &str) -> Answer {
        let mut parser = AnswerParser::new(format);
        let mut answer = Answer::default();
        for d in parser.push(text).into_iter().chain(parser.finish()) {
            answer.add(d);
        }
        answer
    }

    pub fn add(&mut self, delta: Delta) {
        match delta {
            Delta::Reasoning(r) => self.reasoning.push_str(&r),
            Delta::Content(c) => self.content.push_str(&c),
            Delta::ToolCall(c) => self.tool_calls.push(c),
        }
    }
}

/// Where `tag` is in `text`, or how much of `text` is safe to release because no suffix of it
/// can grow into `tag` (the rest is held for the next piece).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Scan {
    Found(usize),
    Safe(usize),
}

fn scan(text: &str, tag: &str) -> Scan {
    if let Some(at) = text.find(tag) {
        return Scan::Found(at);
    }
    // Tags are ASCII and start with `<`, so a held suffix starts on a character boundary.
    let held = (1..tag.len()).rev().find(|&n| text.ends_with(&tag[..n])).unwrap_or(0);
    Scan::Safe(text.len() - held)
}

#[cfg(test)]
mod tests;
