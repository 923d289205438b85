//! Human or JSON output, chosen once by `--json`.

use serde_json::Value;

pub struct Output {
    pub json: bool,
}

impl Output {
    /// Prints `value` as JSON, or `human` otherwise.
    pub fn emit(&self, value: &Value, human: impl FnOnce() -> String) {
        if self.json {
            println!("{}", serde_json::to_string_pretty(value).unwrap_or_default());
        } else {
            let text = human();
            if !text.is_empty() {
                println!("{text}");
            }
        }
    }

    /// One JSON object per line (for streams such as `log tail --follow`).
    pub fn line(&self, value: &Value, human: impl FnOnce() -> String) {
        if self.json {
            println!("{}", serde_json::to_string(value).unwrap_or_default());
        } else {
            println!("{}", human());
        }
    }
}
