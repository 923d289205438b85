//! `detectable_format:*` and `detectable_content:*`: bullets, highlights, sections, titles, the
//! constrained answers, placeholders and postscripts — each the harness's pattern, with Python's
//! `re` semantics (`.` stops at a newline; `^`/`$` per line where the harness says MULTILINE;
//! `\s` with U+001C–U+001F).

use std::sync::OnceLock;

use regex::{Regex, RegexBuilder};

use super::IfevalError;
use super::pytext::{SPACE_CLASS as S, strip};

struct Patterns {
    star_bullet: Regex,
    dash_bullet: Regex,
    highlight: Regex,
    double_highlight: Regex,
    placeholder: Regex,
    title: Regex,
    pps: Regex,
    ps: Regex,
}

fn patterns() -> &'static Patterns {
    static PATTERNS: OnceLock<Patterns> = OnceLock::new();
    PATTERNS.get_or_init(|| {
        let re = |p: &str| Regex::new(p).unwrap_or_else(|e| unreachable!("{p}: {e}"));
        Patterns {
            star_bullet: re(&format!(r"(?m)^{S}*\*[^\*].*$")),
            dash_bullet: re(&format!(r"(?m)^{S}*-.*$")),
            highlight: re(r"\*[^\n\*]*\*"),
            double_highlight: re(r"\*\*[^\n\*]*\*\*"),
            placeholder: re(r"\[.*?\]"),
            title: re(r"<<[^\n]+>>"),
            pps: re(&format!(r"(?m){S}*p\.{S}?p\.{S}?s.*$")),
            ps: re(&format!(r"(?m){S}*p\.{S}?s\..*$")),
        }
    })
}

/// The three answers `detectable_format:constrained_response` accepts.
const CONSTRAINED: [&str; 3] = ["My answer is yes.", "My answer is no.", "My answer is maybe."];

/// `number_bullet_lists`: lines starting `* ` (not `**`) or `-`.
pub fn bullets(text: &str) -> usize {
    let p = patterns();
    p.star_bullet.find_iter(text).count() + p.dash_bullet.find_iter(text).count()
}

/// `constrained_response`: one of the three answers anywhere.
pub fn constrained(text: &str) -> bool {
    let text = strip(text);
    CONSTRAINED.iter().any(|c| text.contains(c))
}

/// `number_highlighted_sections`: `*…*` spans with text in them, plus `**…**` spans (each
/// counted again, as the harness does).
pub fn highlights(text: &str) -> usize {
    let p = patterns();
    let single = p.highlight.find_iter(text).filter(|m| !strip(m.as_str().trim_matches('*')).is_empty()).count();
    let double = p
        .double_highlight
        .find_iter(text)
        .filter(|m| {
            let inner = m.as_str();
            !strip(&inner[2..inner.len() - 2]).is_empty()
        })
        .count();
    single + double
}

/// `multiple_sections`'s splitter pattern: `\s?SPLITTER\s?\d+\s?` (the splitter is a pattern).
pub fn section_pattern(splitter: &str) -> Result<Regex, IfevalError> {
    Regex::new(&format!(r"{S}?{splitter}{S}?\d+{S}?"))
        .map_err(|e| IfevalError::Kwargs(format!("section splitter {splitter:?} is not a pattern: {e}")))
}

/// Sections after the first split: the splitter's matches.
pub fn sections(splitter: &Regex, text: &str) -> usize {
    splitter.find_iter(text).count()
}

/// `json_format`: the whole (stripped, fences removed) text is JSON as Python's `json.loads`
/// reads it.
pub fn is_json(text: &str) -> bool {
    let mut t = strip(text);
    for fence in ["```json", "```Json", "```JSON", "```"] {
        t = t.strip_prefix(fence).unwrap_or(t);
    }
    let t = strip(t.strip_suffix("```").unwrap_or(t));
    super::json_text::is_python_json(t)
}

/// `title`: a `<<…>>` on one line with text inside.
pub fn has_title(text: &str) -> bool {
    patterns()
        .title
        .find_iter(text)
        .any(|m| !strip(m.as_str().trim_start_matches('<').trim_end_matches('>')).is_empty())
}

/// `number_placeholders`: `[…]` spans within a line.
pub fn placeholders(text: &str) -> usize {
    patterns().placeholder.find_iter(text).count()
}

/// `postscript`'s marker as the harness matches it in the lower-cased text.
#[derive(Debug, Clone)]
pub enum Postscript {
    /// `P.S.`
    Ps,
    /// `P.P.S`
    Pps,
    /// Any other marker, used as a pattern.
    Other(Regex),
}

impl Postscript {
    pub fn new(marker: &str) -> Result<Postscript, IfevalError> {
        Ok(match marker {
            "P.P.S" => Postscript::Pps,
            "P.S." => Postscript::Ps,
            other => Postscript::Other(
                RegexBuilder::new(&format!(r"{S}*{}.*$", other.to_lowercase()))
                    .multi_line(true)
                    .build()
                    .map_err(|e| IfevalError::Kwargs(format!("postscript marker {other:?} is not a pattern: {e}")))?,
            ),
        })
    }

    pub fn found(&self, text: &str) -> bool {
        let text = text.to_lowercase();
        match self {
            Postscript::Ps => patterns().ps.is_match(&text),
            Postscript::Pps => patterns().pps.is_match(&text),
            Postscript::Other(re) => re.is_match(&text),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_format_patterns_count_as_the_harness_s() {
        assert_eq!(bullets("* one\n* two\n**bold** no\n- three\n  -four"), 4);
        // Python's `\s` takes the information separators in: a bullet after U+001C is one.
        assert_eq!(bullets("\u{1c}* a"), 1);
        assert_eq!(sections(&section_pattern("Day").unwrap(), "Day\u{1f}1 x"), 1);
        assert!(constrained("  Well. My answer is maybe.") && !constrained("my answer is yes."));
        assert_eq!(highlights("*a* and **b** and ** and *\n*"), 2);
        let s = section_pattern("SECTION").unwrap();
        assert_eq!(sections(&s, "SECTION 1\nx\nSECTION 2\ny"), 2);
        assert!(section_pattern("(").is_err());
        assert!(is_json("```json\n{\"a\": [1, 2]}\n```") && is_json(" [NaN, -Infinity] ") && !is_json("{a: 1}"));
        assert!(has_title("<<A Poem>>\ntext") && !has_title("<< >>") && !has_title("<<a\nb>>"));
        assert_eq!(placeholders("[name] at [address]\n[no\n]"), 2);
        assert!(
            Postscript::new("P.S.").unwrap().found("Hi\np.s. bye") && !Postscript::new("P.S.").unwrap().found("ps")
        );
        assert!(Postscript::new("P.P.S").unwrap().found("x\nP. P. S more"));
        assert!(Postscript::new("Note").unwrap().found("x\n NOTE: y"));
    }
}
