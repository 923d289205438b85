//! Whether text is one JSON value as Python's `json.loads` reads it: standard JSON plus `NaN`,
//! `Infinity` and `-Infinity`, any escape (a lone surrogate too), no raw control characters in
//! strings, whitespace ` \t\n\r` around tokens. (serde_json refuses the three constants and lone
//! surrogates, so `detectable_format:json_format` would fail where the harness passes.)

/// Deeper nesting than this fails (Python raises `RecursionError` well before).
const MAX_DEPTH: usize = 10_000;

struct Reader<'a> {
    s: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn ws(&mut self) {
        while self.s.get(self.at).is_some_and(|b| matches!(b, b' ' | b'\t' | b'\n' | b'\r')) {
            self.at += 1;
        }
    }

    fn eat(&mut self, word: &str) -> bool {
        let ok = self.s[self.at..].starts_with(word.as_bytes());
        if ok {
            self.at += word.len();
        }
        ok
    }

    fn digits(&mut self) -> usize {
        let start = self.at;
        while self.s.get(self.at).is_some_and(u8::is_ascii_digit) {
            self.at += 1;
        }
        self.at - start
    }

    fn value(&mut self, depth: usize) -> bool {
        if depth > MAX_DEPTH {
            return false;
        }
        self.ws();
        match self.s.get(self.at) {
            Some(b'{') => {
                self.at += 1;
                self.items(b'}', depth, |r, d| {
                    r.ws();
                    r.string()
                        && {
                            r.ws();
                            r.eat(":")
                        }
                        && r.value(d)
                })
            }
            Some(b'[') => {
                self.at += 1;
                self.items(b']', depth, |r, d| r.value(d))
            }
            Some(b'"') => self.string(),
            Some(b'-') if self.s[self.at..].starts_with(b"-Infinity") => self.eat("-Infinity"),
            Some(b'-' | b'0'..=b'9') => self.number(),
            _ => ["true", "false", "null", "NaN", "Infinity"].iter().any(|w| self.eat(w)),
        }
    }

    /// The items of an object or array after its opening bracket, up to `close`.
    fn items(&mut self, close: u8, depth: usize, item: impl Fn(&mut Self, usize) -> bool) -> bool {
        self.ws();
        if self.s.get(self.at) == Some(&close) {
            self.at += 1;
            return true;
        }
        loop {
            if !item(self, depth + 1) {
                return false;
            }
            self.ws();
            match self.s.get(self.at) {
                Some(b',') => self.at += 1,
                Some(c) if *c == close => {
                    self.at += 1;
                    return true;
                }
                _ => return false,
            }
        }
    }

    fn number(&mut self) -> bool {
        self.eat("-");
        if !self.eat("0") && self.digits() == 0 {
            return false;
        }
        // A fraction or exponent without digits is not part of the number (Python then fails on
        // the extra text).
        let mark = self.at;
        if self.eat(".") && self.digits() == 0 {
            self.at = mark;
        }
        let mark = self.at;
        if (self.eat("e") || self.eat("E")) && {
            let _ = self.eat("+") || self.eat("-");
            self.digits() == 0
        } {
            self.at = mark;
        }
        true
    }

    fn string(&mut self) -> bool {
        if !self.eat("\"") {
            return false;
        }
        while let Some(&b) = self.s.get(self.at) {
            self.at += 1;
            match b {
                b'"' => return true,
                0..=0x1f => return false,
                b'\\' => {
                    let Some(&e) = self.s.get(self.at) else { return false };
                    self.at += 1;
                    match e {
                        b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => {}
                        b'u' => {
                            let hex = self.s.get(self.at..self.at + 4);
                            if !hex.is_some_and(|h| h.iter().all(u8::is_ascii_hexdigit)) {
                                return false;
                            }
                            self.at += 4;
                        }
                        _ => return false,
                    }
                }
                _ => {}
            }
        }
        false
    }
}

/// `json.loads(text)` succeeds.
pub fn is_python_json(text: &str) -> bool {
    let mut r = Reader { s: text.as_bytes(), at: 0 };
    let ok = r.value(0);
    r.ws();
    ok && r.at == r.s.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn python_s_json_grammar() {
        for good in
            ["{}", " [1, -0.5e+3, \"a\\u00e9\\ud800\", true, null, {\"k\": [NaN, Infinity, -Infinity]}] ", "\"x\"", "0"]
        {
            assert!(is_python_json(good), "{good}");
        }
        for bad in ["", "{a: 1}", "[1,]", "01", "1.", "\"a\tb\"", "[1] 2", "{\"a\" 1}", "'x'", "\"\\x\"", "-"] {
            assert!(!is_python_json(bad), "{bad}");
        }
    }
}
