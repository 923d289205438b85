//! Tool calls as Qwen3 (and Hermes) write them: `<tool_call>\n{"name": "f", "arguments": {…}}\n
//! </tool_call>` blocks in the answer, as the chat template taught them
//! (`trainer::data::template`).
//!
//! A block is a call when its body is a JSON object of exactly `name`, one of the functions
//! offered, and `arguments`, an object. Anything else (bad JSON, another function, a block cut
//! off by the end of the answer) is left in the content as generated, so nothing the model
//! wrote is lost. Whitespace between calls and the text around them (Qwen3 puts a line break
//! between calls) is dropped; other text outside the blocks is the content.

use mindxtrain_trainer::data::Json;

use super::{Delta, ParsedCall, Scan, scan};

const OPEN: &str = "<tool_call>";
const CLOSE: &str = "</tool_call>";

/// Finds the tool calls of one answer's content as its text arrives.
#[derive(Debug)]
pub struct ToolCallParser {
    tools: Vec<String>,
    /// Inside a block (after its `<tool_call>`).
    inside: bool,
    /// Text not yet released: outside, at most a partial `<tool_call>`; inside, the body so far.
    buf: String,
    /// Whitespace after the content released so far: dropped if a call follows.
    blank: String,
    /// The last thing released was a call: whitespace after it is dropped.
    after_call: bool,
    calls: usize,
}

impl ToolCallParser {
    /// `tools`: the names of the functions offered.
    pub fn new(tools: Vec<String>) -> ToolCallParser {
        ToolCallParser { tools, inside: false, buf: String::new(), blank: String::new(), after_call: false, calls: 0 }
    }

    pub fn push(&mut self, text: &str, out: &mut Vec<Delta>) {
        self.buf.push_str(text);
        loop {
            if self.inside {
                let Scan::Found(at) = scan(&self.buf, CLOSE) else { return };
                let body = self.buf[..at].to_owned();
                self.buf.drain(..at + CLOSE.len());
                self.inside = false;
                match self.call(&body) {
                    Some(call) => {
                        self.blank.clear();
                        self.after_call = true;
                        out.push(Delta::ToolCall(call));
                    }
                    None => self.outside_verbatim(format!("{OPEN}{body}{CLOSE}"), out),
                }
            } else {
                match scan(&self.buf, OPEN) {
                    Scan::Found(at) => {
                        let before: String = self.buf.drain(..at + OPEN.len()).collect();
                        self.outside(&before[..at], out);
                        self.inside = true;
                    }
                    Scan::Safe(safe) => {
                        let released: String = self.buf.drain(..safe).collect();
                        self.outside(&released, out);
                        return;
                    }
                }
            }
        }
    }

    /// The answer ended: a block still open is not a call, and held text is content.
    pub fn finish(&mut self, out: &mut Vec<Delta>) {
        let rest = std::mem::take(&mut self.buf);
        if self.inside {
            self.inside = false;
            self.outside_verbatim(format!("{OPEN}{rest}"), out);
        } else {
            self.outside(&rest, out);
        }
        if !self.blank.is_empty() {
            out.push(Delta::Content(std::mem::take(&mut self.blank)));
        }
    }

    /// Text outside any block: released but for trailing whitespace, which waits to see
    /// whether a call follows; whitespace right after a call is dropped.
    fn outside(&mut self, text: &str, out: &mut Vec<Delta>) {
        let text = if self.after_call { text.trim_start() } else { text };
        if text.is_empty() {
            return;
        }
        self.after_call = false;
        let body = text.trim_end();
        if body.is_empty() {
            self.blank.push_str(text);
            return;
        }
        let mut released = std::mem::take(&mut self.blank);
        released.push_str(body);
        self.blank.push_str(&text[body.len()..]);
        out.push(Delta::Content(released));
    }

    /// A block that is not a call: content exactly as written, whitespace before it included.
    fn outside_verbatim(&mut self, block: String, out: &mut Vec<Delta>) {
        self.after_call = false;
        let mut released = std::mem::take(&mut self.blank);
        released.push_str(&block);
        out.push(Delta::Content(released));
    }

    fn call(&mut self, body: &str) -> Option<ParsedCall> {
        let Ok(Json::Object(fields)) = Json::parse(body.trim()) else { return None };
        let field = |name: &str| fields.iter().find(|(k, _)| k == name).map(|(_, v)| v);
        let (Some(Json::String(name)), Some(arguments @ Json::Object(_))) = (field("name"), field("arguments")) else {
            return None;
        };
        if fields.len() != 2 || !self.tools.contains(name) {
            return None;
        }
        let call = ParsedCall { index: self.calls, name: name.clone(), arguments: arguments.to_python_json() };
        self.calls += 1;
        Some(call)
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Answer, Format, ParsedCall};

    fn parse(text: &str) -> Answer {
        Answer::parse(&Format { tools: vec!["get_weather".into(), "add".into()], ..Format::default() }, text)
    }

    fn call(index: usize, name: &str, arguments: &str) -> ParsedCall {
        ParsedCall { index, name: name.into(), arguments: arguments.into() }
    }

    #[test]
    fn blocks_become_calls_and_the_text_around_them_the_content() {
        let a = parse(
            "Let me look.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"c\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"add\", \"arguments\": {\"b\": 1, \"a\": 2}}\n</tool_call>",
        );
        assert_eq!(a.content, "Let me look.");
        assert_eq!(
            a.tool_calls,
            [call(0, "get_weather", r#"{"city": "Paris", "unit": "c"}"#), call(1, "add", r#"{"b": 1, "a": 2}"#)]
        );
        let only = parse("<tool_call>{\"name\":\"add\",\"arguments\":{}}</tool_call>\n");
        assert_eq!((only.content.as_str(), only.tool_calls.len()), ("", 1));
        let after = parse("<tool_call>{\"name\":\"add\",\"arguments\":{}}</tool_call>\n\nDone. ");
        assert_eq!(after.content, "Done. ");
    }

    #[test]
    fn malformed_blocks_stay_in_the_content_as_written() {
        for block in [
            "<tool_call>{\"name\": \"add\", \"arguments\": {}</tool_call>",
            "<tool_call>{\"name\": \"rm_rf\", \"arguments\": {}}</tool_call>",
            "<tool_call>{\"name\": \"add\", \"arguments\": \"{}\"}</tool_call>",
            "<tool_call>{\"name\": \"add\", \"arguments\": {}, \"id\": 1}</tool_call>",
            "<tool_call>[1]</tool_call>",
            "<tool_call>{\"name\": \"add\", \"arguments\": {}}",
        ] {
            let text = format!("Try:\n{block}");
            let a = parse(&text);
            assert_eq!((a.content.as_str(), a.tool_calls.len()), (text.as_str(), 0), "{block}");
        }
        // A good call beside a bad one: the call is taken, the bad block stays.
        let a = parse("<tool_call>{oops}</tool_call>\n<tool_call>{\"name\": \"add\", \"arguments\": {}}</tool_call>");
        assert_eq!(a.content, "<tool_call>{oops}</tool_call>");
        assert_eq!(a.tool_calls, [call(0, "add", "{}")]);
    }

    #[test]
    fn without_tools_offered_nothing_is_parsed() {
        let text = "<tool_call>{\"name\": \"add\", \"arguments\": {}}</tool_call>";
        let a = Answer::parse(&Format::default(), text);
        assert_eq!((a.content.as_str(), a.tool_calls.len()), (text, 0));
    }
}
