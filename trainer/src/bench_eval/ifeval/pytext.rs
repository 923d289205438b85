//! Python's `str` semantics where the checks depend on them: what `isspace`, `strip`, `split`,
//! `isupper`, `islower` and the regex class `\w` mean for Unicode text. Rust's own methods differ
//! (`char::is_whitespace` leaves out U+001C–U+001F, `\w` takes combining marks in), and a count of
//! words or a case test that differed would give another verdict than the harness's.

use std::sync::OnceLock;

use regex::Regex;

/// Python's `str.isspace` for one character: Unicode's `White_Space` plus the four information
/// separators U+001C–U+001F, which Python counts as whitespace.
pub fn is_space(c: char) -> bool {
    c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)
}

/// Python's `re` `\s` as a class of this crate's regexes (`\s` here leaves out U+001C–U+001F).
pub const SPACE_CLASS: &str = r"[\s\x1C-\x1F]";

/// `str.strip()`.
pub fn strip(s: &str) -> &str {
    s.trim_matches(is_space)
}

/// `str.split()` (no separator): the runs between whitespace.
pub fn split_words(s: &str) -> impl Iterator<Item = &str> {
    s.split(is_space).filter(|w| !w.is_empty())
}

/// Titlecase letters (category Lt): neither upper nor lower case for Python's `isupper`/`islower`.
fn is_title(c: char) -> bool {
    matches!(c, '\u{1c5}' | '\u{1c8}' | '\u{1cb}' | '\u{1f2}' | '\u{1fbc}' | '\u{1fcc}' | '\u{1ffc}')
        || ('\u{1f88}'..='\u{1f8f}').contains(&c)
        || ('\u{1f98}'..='\u{1f9f}').contains(&c)
        || ('\u{1fa8}'..='\u{1faf}').contains(&c)
}

/// `str.isupper()`: at least one cased character, and none lower or title case.
pub fn is_upper(s: &str) -> bool {
    let mut cased = false;
    for c in s.chars() {
        if c.is_lowercase() || is_title(c) {
            return false;
        }
        cased |= c.is_uppercase();
    }
    cased
}

/// `str.islower()`: at least one cased character, and none upper or title case.
pub fn is_lower(s: &str) -> bool {
    let mut cased = false;
    for c in s.chars() {
        if c.is_uppercase() || is_title(c) {
            return false;
        }
        cased |= c.is_lowercase();
    }
    cased
}

/// Python's `re` `\w` for `str` patterns (lm-eval's own checks use `re`): letters (L*), numbers
/// (N*) and `_` — no combining marks. (NLTK's patterns run in the `regex` engine instead, whose
/// `\w` is this crate's.)
pub const WORD_CLASS: &str = r"[\p{L}\p{N}_]";

/// Whether `c` is a Python `\w` character (`char::is_alphanumeric` would also take in the
/// vowel signs and circled letters of `Other_Alphabetic`).
pub fn is_word_char(c: char) -> bool {
    static WORD: OnceLock<Regex> = OnceLock::new();
    let re = WORD.get_or_init(|| {
        Regex::new(&format!("^{WORD_CLASS}$")).unwrap_or_else(|e| unreachable!("a constant class: {e}"))
    });
    let mut buf = [0u8; 4];
    re.is_match(c.encode_utf8(&mut buf))
}

/// Python's `\b` at byte `at` of `text`: a word character on exactly one side.
pub fn is_boundary(text: &str, at: usize) -> bool {
    let before = text[..at].chars().next_back().is_some_and(is_word_char);
    let after = text[at..].chars().next().is_some_and(is_word_char);
    before != after
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn python_s_string_predicates() {
        assert_eq!(strip("\u{1c} a b\u{a0}\n"), "a b");
        assert_eq!(split_words(" a\u{1f}b  c ").collect::<Vec<_>>(), ["a", "b", "c"]);
        assert!(is_upper("HELLO, WORLD 1") && !is_upper("HELLO World") && !is_upper("123 !"));
        assert!(!is_upper("\u{1c5}A") && !is_lower("\u{1c5}a"));
        assert!(is_lower("hello ß 2") && !is_lower("hello A") && !is_lower("--"));
        // A combining mark and a Devanagari vowel sign are no `\w` for Python; `²` is.
        assert!(!is_word_char('\u{301}') && !is_word_char('\u{93e}') && is_word_char('²') && is_word_char('_'));
        assert!(is_boundary("cafe\u{301}", 4) && !is_boundary("cafe", 2) && is_boundary("a b", 1));
    }
}
