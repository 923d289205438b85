//! Word counts as the harness takes them: `count_words` (NLTK's `RegexpTokenizer(r"\w+")`) and
//! `nltk.word_tokenize` (Punkt sentences, then `NLTKWordTokenizer`'s substitutions on each, then
//! a split on whitespace), which `change_case:capital_word_frequency` counts capital words over.
//! The substitutions are NLTK 3.10's, in its order. NLTK runs every pattern in the third-party
//! `regex` engine (`nltk.redos`), whose Unicode `\w`, `\s`, `\d` and `\b` are this crate's
//! (marks are word characters there, unlike in Python's `re`).

use std::sync::OnceLock;

use regex::Regex;

use super::punkt;
use super::pytext::split_words;

/// `count_words`: the runs of word characters (vowel signs and other marks included).
pub fn count_words(text: &str) -> usize {
    static WORDS: OnceLock<Regex> = OnceLock::new();
    let re = WORDS.get_or_init(|| Regex::new(r"\w+").unwrap_or_else(|e| unreachable!("{e}")));
    re.find_iter(text).count()
}

/// One substitution; `$n` in the replacement is the n-th group.
struct Rule {
    re: Regex,
    with: &'static str,
}

struct Rules {
    starting_quotes: Vec<Rule>,
    /// `(?<!\w)(')(?!(?:re|ve|ll|m|t|s|d|n)\b)(?=\w)`: an opening single quote before a word
    /// that is no contraction (the one look-around rule).
    opening_single_quote: fancy_regex::Regex,
    punctuation: Vec<Rule>,
    ending_quotes: Vec<Rule>,
}

fn rules() -> &'static Rules {
    static RULES: OnceLock<Rules> = OnceLock::new();
    RULES.get_or_init(|| {
        let rule =
            |p: &str, with: &'static str| Rule { re: Regex::new(p).unwrap_or_else(|e| unreachable!("{p}: {e}")), with };
        let quote = r"(?i)(?<!\w)(')(?!(?:re|ve|ll|m|t|s|d|n)\b)(?=\w)";
        Rules {
            starting_quotes: vec![
                rule("([«“‘„]|[`]+)", " $1 "),
                rule(r#"^""#, "``"),
                rule("(``)", " $1 "),
                rule(r#"([ \(\[{<])("|'{2})"#, "$1 `` "),
            ],
            opening_single_quote: fancy_regex::Regex::new(quote).unwrap_or_else(|e| unreachable!("{quote}: {e}")),
            punctuation: vec![
                // Python's `$` also matches before a final newline: `\n?` takes that case in.
                rule(r#"([^\.])(\.)([\]\)}>"'»”’ ]*)\s*$"#, "$1 $2 $3 "),
                rule(r"([:,])([^\d])", " $1 $2"),
                rule(r"([:,])(\n?)$", " $1 $2"),
                rule(r"\.{2,}", " $0 "),
                rule(r"[;@#$%&]", " $0 "),
                rule(r"[\u{2012}-\u{2015}]", " $0 "),
                rule(r#"([^\.])(\.)([\]\)}>"']*)\s*$"#, "$1 $2$3 "),
                rule(r"[?!]", " $0 "),
                rule(r"([^'])' ", "$1 ' "),
                rule(r"[*]", " $0 "),
                rule(r"[\]\[\(\)\{\}<>]", " $0 "),
                rule(r"--", " -- "),
            ],
            ending_quotes: vec![
                rule("([»”’])", " $1 "),
                rule("''", " '' "),
                rule(r#"""#, " '' "),
                rule(r"\s+", " "),
                rule(r"([^' ])('[sS]|'[mM]|'[dD]|') ", "$1 $2 "),
                rule(r"([^' ])('ll|'LL|'re|'RE|'ve|'VE|n't|N'T) ", "$1 $2 "),
                // The contractions (`CONTRACTIONS2`, `CONTRACTIONS3`); `wanna`'s look-ahead for
                // whitespace is matched and put back.
                rule(r"(?i)\b(can)(not)\b", " $1 $2 "),
                rule(r"(?i)\b(d)('ye)\b", " $1 $2 "),
                rule(r"(?i)\b(gim)(me)\b", " $1 $2 "),
                rule(r"(?i)\b(gon)(na)\b", " $1 $2 "),
                rule(r"(?i)\b(got)(ta)\b", " $1 $2 "),
                rule(r"(?i)\b(lem)(me)\b", " $1 $2 "),
                rule(r"(?i)\b(more)('n)\b", " $1 $2 "),
                rule(r"(?i)\b(wan)(na)(\s)", " $1 $2 $3"),
                rule(r"(?i) ('t)(is)\b", " $1 $2 "),
                rule(r"(?i) ('t)(was)\b", " $1 $2 "),
            ],
        }
    })
}

fn apply(rules: &[Rule], mut text: String) -> String {
    for r in rules {
        text = r.re.replace_all(&text, r.with).into_owned();
    }
    text
}

/// `NLTKWordTokenizer().tokenize(sentence)`.
fn tokenize_sentence(sentence: &str) -> Vec<String> {
    let r = rules();
    let text = apply(&r.starting_quotes, sentence.to_owned());
    // The pattern is constant and has no unbounded backtracking: a step never fails.
    let text = r.opening_single_quote.replace_all(&text, "$1 ").into_owned();
    let text = apply(&r.punctuation, text);
    let text = apply(&r.ending_quotes, format!(" {text} "));
    split_words(&text).map(str::to_owned).collect()
}

/// `nltk.word_tokenize(text)`.
pub fn word_tokenize(text: &str) -> Vec<String> {
    punkt::sentences(text).into_iter().flat_map(tokenize_sentence).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_are_python_s_word_runs() {
        assert_eq!(count_words("Hello, world! It's 2 o'clock_now."), 7);
        assert_eq!(count_words(""), 0);
        // NLTK's engine keeps Devanagari's vowel signs and virama (marks) inside a word, where
        // Python's `re` would split "नमस्ते दुनिया" into five.
        assert_eq!(count_words("नमस्ते दुनिया"), 2);
    }

    #[test]
    fn word_tokenize_splits_contractions_punctuation_and_sentence_ends() {
        assert_eq!(
            word_tokenize("IT'S. DON'T GO. U.S.A. is big."),
            ["IT", "'S", ".", "DO", "N'T", "GO", ".", "U.S.A.", "is", "big", "."]
        );
        assert_eq!(
            word_tokenize("\"Hello,\" she said (quietly) -- I cannot."),
            ["``", "Hello", ",", "''", "she", "said", "(", "quietly", ")", "--", "I", "can", "not", "."]
        );
    }
}
