//! `combination:*`, `startend:*`, `change_case:*` and `punctuation:no_comma`: how the response
//! begins, ends and is cased.

use super::language;
use super::pytext::{is_lower, is_upper, strip};
use super::words::word_tokenize;

/// `two_responses`: exactly two non-blank, different pieces between `******` (a blank piece
/// only at either end).
pub fn two_responses(text: &str) -> bool {
    let pieces: Vec<&str> = text.split("******").collect();
    let mut valid = Vec::new();
    for (i, p) in pieces.iter().enumerate() {
        if strip(p).is_empty() {
            if i != 0 && i != pieces.len() - 1 {
                return false;
            }
        } else {
            valid.push(*p);
        }
    }
    matches!(valid.as_slice(), [a, b] if strip(a) != strip(b))
}

/// `repeat_prompt`: the response starts with the prompt, case ignored.
pub fn repeats(text: &str, prompt: &str) -> bool {
    strip(text).to_lowercase().starts_with(&strip(prompt).to_lowercase())
}

/// `end_checker`: the response, stripped of whitespace and then of `"`, ends with the phrase,
/// case ignored.
pub fn ends_with(text: &str, phrase: &str) -> bool {
    strip(text).trim_matches('"').to_lowercase().ends_with(&strip(phrase).to_lowercase())
}

/// `quotation`: wrapped in double quotes (two characters at least).
pub fn quoted(text: &str) -> bool {
    let t = strip(text);
    t.chars().count() > 1 && t.starts_with('"') && t.ends_with('"')
}

/// `capital_word_frequency`: the tokens of `nltk.word_tokenize` in all capitals.
pub fn capital_words(text: &str) -> usize {
    word_tokenize(text).iter().filter(|w| is_upper(w)).count()
}

/// `english_capital`: all capitals, and English (or no language to tell).
pub fn english_capital(text: &str) -> bool {
    is_upper(text) && language::is_in(text, "en")
}

/// `english_lowercase`: all lower case, and English (or no language to tell).
pub fn english_lowercase(text: &str) -> bool {
    is_lower(text) && language::is_in(text, "en")
}

/// `no_comma`.
pub fn no_comma(text: &str) -> bool {
    !text.contains(',')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn starts_ends_and_cases() {
        assert!(two_responses("one\n******\ntwo\n******") && !two_responses("a ****** a"));
        assert!(!two_responses("a ****** ****** b") && !two_responses("only one"));
        assert!(repeats("  WRITE a poem. Here it is", "Write a poem.") && !repeats("A poem", "Write"));
        assert!(ends_with("Bye. \"Any other questions?\"\n", "Any other questions?") && !ends_with("x.", "y"));
        assert!(quoted(" \"hi\" ") && !quoted("\"") && !quoted("\"a"));
        assert_eq!(capital_words("IT'S. I say NO, you say YES!"), 5);
        assert!(
            english_capital("THIS IS A SHORT ANSWER WRITTEN IN CAPITAL LETTERS ONLY.") && !english_capital("THIS is")
        );
        assert!(
            english_lowercase("this is a short answer written in lowercase letters only.") && !english_lowercase("No.")
        );
        assert!(no_comma("a b") && !no_comma("a, b"));
    }
}
