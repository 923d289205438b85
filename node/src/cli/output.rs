//! Human or JSON output, chosen once by `--json`.

use serde_json::Value;

pub struct Output {
    pub json: bool,
}

impl Output {
    /// Prints `value` as JSON, or `human` otherwise.
    pub fn emit(&self, value: &Value, human: impl FnOnce() -> String) {
        if self.json {
            print_line(&serde_json::to_string_pretty(value).unwrap_or_default());
        } else {
            let text = human();
            if !text.is_empty() {
                print_line(&text);
            }
        }
    }

    /// One JSON object per line (for streams such as `log tail --follow`); false once
    /// nobody reads stdout any more, so a stream can stop.
    pub fn line(&self, value: &Value, human: impl FnOnce() -> String) -> bool {
        if self.json { print_line(&serde_json::to_string(value).unwrap_or_default()) } else { print_line(&human()) }
    }
}

/// Writes a line to stdout; false if it could not. A reader that went away (a closed
/// pipe) is not the command's failure: `println!` would panic there, in the middle of,
/// say, a server's graceful shutdown.
fn print_line(text: &str) -> bool {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    writeln!(out, "{text}").and_then(|()| out.flush()).is_ok()
}
