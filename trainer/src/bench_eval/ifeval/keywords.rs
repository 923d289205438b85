//! `keywords:*`: existence, frequency, forbidden words, letter frequency. The harness uses each
//! keyword as a regular expression (`re.search(keyword, text, re.IGNORECASE)`), so do these.

use regex::{Regex, RegexBuilder};

use super::IfevalError;
use super::pytext::is_boundary;

/// `less than` / `at least`: how a count compares with its threshold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Relation {
    LessThan,
    AtLeast,
}

impl Relation {
    pub fn parse(text: &str) -> Result<Relation, String> {
        match text {
            "less than" => Ok(Relation::LessThan),
            "at least" => Ok(Relation::AtLeast),
            other => Err(format!("relation {other:?} is neither \"less than\" nor \"at least\"")),
        }
    }

    pub fn holds(self, count: usize, threshold: i64) -> bool {
        let count = i64::try_from(count).unwrap_or(i64::MAX);
        match self {
            Relation::LessThan => count < threshold,
            Relation::AtLeast => count >= threshold,
        }
    }
}

/// A keyword as the case-insensitive pattern the harness searches for.
pub fn pattern(keyword: &str) -> Result<Regex, IfevalError> {
    RegexBuilder::new(keyword)
        .case_insensitive(true)
        .build()
        .map_err(|e| IfevalError::Kwargs(format!("keyword {keyword:?} is not a pattern: {e}")))
}

/// `keywords:existence`: every keyword somewhere.
pub fn all_present(keywords: &[Regex], text: &str) -> bool {
    keywords.iter().all(|k| k.is_match(text))
}

/// `keywords:frequency`: the keyword's non-overlapping occurrences.
pub fn occurrences(keyword: &Regex, text: &str) -> usize {
    keyword.find_iter(text).count()
}

/// `keywords:forbidden_words`: `\bword\b` nowhere, with Python's word boundaries (the first
/// match at or after each start whose both ends are boundaries).
pub fn none_present(words: &[Regex], text: &str) -> bool {
    !words.iter().any(|w| {
        let mut from = 0;
        while let Some(m) = w.find_at(text, from) {
            if is_boundary(text, m.start()) && is_boundary(text, m.end()) {
                return true;
            }
            let Some(c) = text[m.start()..].chars().next() else { break };
            from = m.start() + c.len_utf8();
        }
        false
    })
}

/// `keywords:letter_frequency`: how often `letter` (lower case) appears in the lower-cased text.
pub fn letter_count(letter: char, text: &str) -> usize {
    text.to_lowercase().chars().filter(|&c| c == letter).count()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keywords_are_searched_case_insensitively_and_forbidden_ones_as_whole_words() {
        let k = |w: &str| pattern(w).unwrap();
        assert!(all_present(&[k("apple"), k("pie")], "APPLE and Pie") && !all_present(&[k("apple"), k("x")], "apple"));
        assert_eq!(occurrences(&k("the"), "The theme of the day"), 3);
        assert!(none_present(&[k("cat")], "category concatenate") && !none_present(&[k("cat")], "a Cat."));
        // A combining mark is no word character for Python: "cafe" before it is a whole word.
        assert!(!none_present(&[k("cafe")], "cafe\u{301}"));
        assert_eq!(letter_count('a', "Aardvark"), 3);
        assert!(Relation::LessThan.holds(2, 3) && !Relation::LessThan.holds(3, 3) && Relation::AtLeast.holds(3, 3));
        assert!(Relation::parse("more than").is_err() && pattern("(").is_err());
    }
}
