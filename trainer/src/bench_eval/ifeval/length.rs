//! `length_constraints:*`: sentences (Punkt), paragraphs (`***` dividers), words, and the n-th
//! paragraph's first word (paragraphs split by blank lines).

use std::sync::OnceLock;

use regex::Regex;

use super::pytext::{SPACE_CLASS as S, split_words, strip};

/// `number_paragraphs`: pieces between `***` dividers; an empty piece counts against the total
/// only at either end and fails the check anywhere else.
pub fn paragraphs_exactly(text: &str, want: i64) -> bool {
    static DIVIDER: OnceLock<Regex> = OnceLock::new();
    let re = DIVIDER.get_or_init(|| {
        let p = format!(r"{S}?\*\*\*{S}?");
        Regex::new(&p).unwrap_or_else(|e| unreachable!("{p}: {e}"))
    });
    let pieces: Vec<&str> = re.split(text).collect();
    let mut count = pieces.len() as i64;
    for (i, p) in pieces.iter().enumerate() {
        if strip(p).is_empty() {
            if i == 0 || i == pieces.len() - 1 {
                count -= 1;
            } else {
                return false;
            }
        }
    }
    count == want
}

/// `nth_paragraph_first_word`: `want` non-blank paragraphs (split at `\n\n`) and the `nth` piece's
/// first word, up to its first punctuation, lower-cased, is `first_word`.
pub fn nth_paragraph_starts_with(text: &str, want: i64, nth: i64, first_word: &str) -> bool {
    let pieces: Vec<&str> = text.split("\n\n").collect();
    let count = pieces.iter().filter(|p| !strip(p).is_empty()).count() as i64;
    if nth > count {
        return false;
    }
    let Some(paragraph) = usize::try_from(nth - 1).ok().and_then(|i| pieces.get(i)).map(|p| strip(p)) else {
        return false;
    };
    let Some(word) = split_words(paragraph).next() else { return false };
    let word = word.trim_start_matches('\'').trim_start_matches('"');
    let found: String = word
        .chars()
        .take_while(|c| !matches!(c, '.' | ',' | '?' | '!' | '\'' | '"'))
        .flat_map(char::to_lowercase)
        .collect();
    count == want && found == first_word
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paragraphs_by_dividers_and_by_blank_lines() {
        assert!(paragraphs_exactly("a\n***\nb\n***\nc", 3));
        assert!(paragraphs_exactly("***\na *** b\n***", 2));
        assert!(!paragraphs_exactly("a *** *** b", 2) && !paragraphs_exactly("a *** b", 3));
        let text = "Intro here.\n\n\"Summer's, end\" came.\n\n\n\nLast one";
        assert!(nth_paragraph_starts_with(text, 3, 2, "summer"));
        assert!(!nth_paragraph_starts_with(text, 3, 3, "last"), "the 3rd piece is the blank one");
        assert!(!nth_paragraph_starts_with(text, 2, 2, "summer") && !nth_paragraph_starts_with(text, 3, 4, "x"));
    }
}
