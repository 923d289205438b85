//! NLTK's Punkt sentence tokenizer (`PunktTokenizer("english")`, what `sent_tokenize` and the
//! harness's `count_sentences` use) with NLTK's English parameters (`punkt_english/`, NLTK's
//! `punkt_tab/english` files): candidate ends (`.`, `?`, `!` before punctuation or before
//! whitespace and a token), each decided on its context's tokens by the first pass (abbreviation,
//! ellipsis, period) and the second (collocations, the orthographic heuristic, sentence starters),
//! then closing quotes and brackets realigned onto the sentence they end. Written from NLTK 3.10's
//! algorithm; parity with it is tested on the torch venv (`tests/tests/ifeval.rs`). Its patterns'
//! classes are the `regex` engine's (Unicode's, as this crate's); its `strip`s are Python's.

use std::collections::{HashMap, HashSet};
use std::sync::OnceLock;

use regex::Regex;

use super::pytext::{is_space, is_upper, strip};

const ORTHO_BEG_UC: u32 = 1 << 1;
const ORTHO_MID_UC: u32 = 1 << 2;
const ORTHO_UNK_UC: u32 = 1 << 3;
const ORTHO_BEG_LC: u32 = 1 << 4;
const ORTHO_MID_LC: u32 = 1 << 5;
const ORTHO_UNK_LC: u32 = 1 << 6;
const ORTHO_UC: u32 = ORTHO_BEG_UC | ORTHO_MID_UC | ORTHO_UNK_UC;
const ORTHO_LC: u32 = ORTHO_BEG_LC | ORTHO_MID_LC | ORTHO_UNK_LC;

/// Characters that cannot appear within words (`_re_non_word_chars`).
const NON_WORD: &str = ")\";}]*:@'({[\u{2018}\u{2019}\u{201c}\u{201d}\u{ab}\u{bb}?!";
/// Closing punctuation that belongs to the sentence before a break (`re_boundary_realignment`).
const CLOSERS: &str = "\"')]}\u{2018}\u{2019}\u{201c}\u{201d}\u{ab}\u{bb}";
/// Tokens the orthographic heuristic never takes for a sentence start.
const PUNCTUATION: [&str; 6] = [";", ":", ",", ".", "!", "?"];

struct Params {
    abbrev_types: HashSet<String>,
    collocations: HashSet<(String, String)>,
    sent_starters: HashSet<String>,
    ortho_context: HashMap<String, u32>,
}

/// A parameter file's entries: one a line, the line's end removed and nothing else (as NLTK
/// reads them: `". . "` is an abbreviation type).
fn entries(file: &'static str) -> impl Iterator<Item = &'static str> {
    file.strip_suffix('\n').unwrap_or(file).split('\n')
}

fn params() -> &'static Params {
    static PARAMS: OnceLock<Params> = OnceLock::new();
    PARAMS.get_or_init(|| {
        let pair = |line: &str| line.split_once('\t').map(|(a, b)| (a.to_owned(), b.to_owned()));
        Params {
            abbrev_types: entries(include_str!("punkt_english/abbrev_types.txt")).map(str::to_owned).collect(),
            sent_starters: entries(include_str!("punkt_english/sent_starters.txt")).map(str::to_owned).collect(),
            collocations: entries(include_str!("punkt_english/collocations.tab")).filter_map(pair).collect(),
            // A constant file whose every line is `type<TAB>flags` (the unit test reads them all).
            ortho_context: entries(include_str!("punkt_english/ortho_context.tab"))
                .filter_map(|l| pair(l).and_then(|(t, f)| Some((t, f.parse().ok()?))))
                .collect(),
        }
    })
}

struct Patterns {
    words: fancy_regex::Regex,
    numeric: Regex,
    initial: Regex,
    ellipsis: Regex,
}

fn patterns() -> &'static Patterns {
    static PATTERNS: OnceLock<Patterns> = OnceLock::new();
    PATTERNS.get_or_init(|| {
        let non_word = format!("(?:[{}])", regex::escape(NON_WORD));
        let multi = r"(?:\-{2,}|\.{2,}|(?:\.\s){2,}\.)";
        let start = r#"[^\(\"`{\[:;&\#\*@\)}\]\-,]"#;
        // `_word_tokenize_fmt`: multi-character punctuation, a word up to its end, or one character.
        let words = format!(r"{multi}|(?={start})\S+?(?=\s|$|{non_word}|{multi}|,(?=$|\s|{non_word}|{multi}))|\S");
        let re = |p: &str| Regex::new(p).unwrap_or_else(|e| unreachable!("{p}: {e}"));
        Patterns {
            words: fancy_regex::Regex::new(&words).unwrap_or_else(|e| unreachable!("{words}: {e}")),
            numeric: re(r"^-?[\.,]?\d[\d,\.-]*\.?$"),
            // Word characters less the decimal digits (NLTK's `regex` engine's classes, as here).
            initial: re(r"^[^\W\d]\.$"),
            ellipsis: re(r"^\.\.+$"),
        }
    })
}

/// Whether the orthographic heuristic takes a token for a sentence start.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Starter {
    Yes,
    No,
    Unknown,
}

struct Token<'a> {
    tok: &'a str,
    /// Lower case, numbers as `##number##`.
    typ: String,
    sentbreak: bool,
    abbr: bool,
    ellipsis: bool,
}

impl<'a> Token<'a> {
    fn new(tok: &'a str) -> Token<'a> {
        let lower = tok.to_lowercase();
        let typ = if patterns().numeric.is_match(&lower) { "##number##".to_owned() } else { lower };
        Token { tok, typ, sentbreak: false, abbr: false, ellipsis: false }
    }

    fn period_final(&self) -> bool {
        self.tok.ends_with('.')
    }

    fn type_no_period(&self) -> &str {
        match self.typ.strip_suffix('.') {
            Some(stem) if self.typ.chars().count() > 1 => stem,
            _ => &self.typ,
        }
    }

    fn type_no_sentperiod(&self) -> &str {
        if self.sentbreak { self.type_no_period() } else { &self.typ }
    }

    fn first(&self) -> &str {
        self.tok.chars().next().map_or("", |c| &self.tok[..c.len_utf8()])
    }

    fn first_upper(&self) -> bool {
        is_upper(self.first())
    }

    fn first_lower(&self) -> bool {
        super::pytext::is_lower(self.first())
    }
}

/// Punkt's word tokens of a text, line by line (blank lines give none).
fn tokenize_words(text: &str) -> Vec<Token<'_>> {
    let mut out = Vec::new();
    for line in text.split('\n').filter(|l| !strip(l).is_empty()) {
        // The pattern always matches one non-space character at least, so no step fails.
        out.extend(patterns().words.find_iter(line).filter_map(Result::ok).map(|m| Token::new(m.as_str())));
    }
    out
}

fn first_pass(t: &mut Token<'_>) {
    let p = params();
    if matches!(t.tok, "." | "?" | "!") {
        t.sentbreak = true;
    } else if patterns().ellipsis.is_match(t.tok) {
        t.ellipsis = true;
    } else if t.period_final() && !t.tok.ends_with("..") {
        let stem = t.tok[..t.tok.len() - 1].to_lowercase();
        let last_part = stem.rsplit('-').next().unwrap_or(&stem);
        if p.abbrev_types.contains(&stem) || p.abbrev_types.contains(last_part) {
            t.abbr = true;
        } else {
            t.sentbreak = true;
        }
    }
}

fn ortho_heuristic(t: &Token<'_>) -> Starter {
    if PUNCTUATION.contains(&t.tok) {
        return Starter::No;
    }
    let context = params().ortho_context.get(t.type_no_sentperiod()).copied().unwrap_or(0);
    if t.first_upper() && context & ORTHO_LC != 0 && context & ORTHO_MID_UC == 0 {
        return Starter::Yes;
    }
    if t.first_lower() && (context & ORTHO_UC != 0 || context & ORTHO_BEG_LC == 0) {
        return Starter::No;
    }
    Starter::Unknown
}

/// The second pass over `first` followed by `next` (which has had only its first pass).
fn second_pass(first: &mut Token<'_>, next: &Token<'_>) {
    if !first.period_final() {
        return;
    }
    let p = params();
    let typ = first.type_no_period().to_owned();
    let next_typ = next.type_no_sentperiod();
    let initial = patterns().initial.is_match(first.tok);
    if p.collocations.contains(&(typ.clone(), next_typ.to_owned())) {
        (first.sentbreak, first.abbr) = (false, true);
        return;
    }
    let starts_sentence =
        || ortho_heuristic(next) == Starter::Yes || next.first_upper() && p.sent_starters.contains(next_typ);
    if (first.abbr || first.ellipsis) && !initial && starts_sentence() {
        first.sentbreak = true;
        return;
    }
    if initial || typ == "##number##" {
        let starter = ortho_heuristic(next);
        let lower_seen = p.ortho_context.get(next_typ).copied().unwrap_or(0) & ORTHO_LC != 0;
        if starter == Starter::No || starter == Starter::Unknown && initial && next.first_upper() && !lower_seen {
            (first.sentbreak, first.abbr) = (false, true);
        }
    }
}

/// Whether a candidate's context holds a break that some token follows.
fn contains_sentbreak(context: &str) -> bool {
    let mut tokens = tokenize_words(context);
    tokens.iter_mut().for_each(first_pass);
    for i in 0..tokens.len() {
        if let [first, next, ..] = &mut tokens[i..] {
            second_pass(first, next);
        }
        if tokens[i].sentbreak && i + 1 < tokens.len() {
            return true;
        }
    }
    false
}

/// A candidate end: the punctuation's byte range, what follows it, and where the next token starts.
struct Candidate {
    start: usize,
    end: usize,
    after: String,
    next_tok: Option<usize>,
}

/// `period_context_re`: each `.`, `?`, `!` followed by a non-word character, or by whitespace
/// and a token.
fn candidates(text: &str) -> Vec<Candidate> {
    let mut out = Vec::new();
    for (start, _) in text.char_indices().filter(|(_, c)| matches!(c, '.' | '?' | '!')) {
        let end = start + 1;
        let rest = &text[end..];
        match rest.chars().next() {
            Some(n) if NON_WORD.contains(n) => {
                out.push(Candidate { start, end, after: n.to_string(), next_tok: None });
            }
            // `\s` and `\S` of NLTK's `regex` engine: Unicode's White_Space, as `char`'s.
            Some(n) if n.is_whitespace() => {
                let ws = rest.len() - rest.trim_start_matches(char::is_whitespace).len();
                let tok_len = rest[ws..].find(char::is_whitespace).unwrap_or(rest.len() - ws);
                if tok_len > 0 {
                    out.push(Candidate {
                        start,
                        end,
                        after: rest[..ws + tok_len].to_owned(),
                        next_tok: Some(end + ws),
                    });
                }
            }
            _ => {}
        }
    }
    out
}

/// `_match_potential_end_contexts`: each candidate with the word it ends and what follows; of
/// two candidates in one word only the last.
fn end_contexts<'c>(text: &str, found: &'c [Candidate]) -> Vec<(&'c Candidate, String)> {
    let mut out = Vec::new();
    let (mut prev_slice, mut prev): ((usize, usize), Option<&Candidate>) = ((0, 0), None);
    for m in found {
        let before = &text[prev_slice.1..m.start];
        let last_space = before.rfind([' ', '\t', '\n', '\r', '\x0b', '\x0c']).unwrap_or(0);
        let word_start = if last_space != 0 { last_space + prev_slice.1 + 1 } else { prev_slice.0 };
        let word = (word_start, m.start);
        if let Some(p) = prev.filter(|_| prev_slice.1 <= word.0) {
            out.push((p, format!("{}{}{}", &text[prev_slice.0..prev_slice.1], &text[p.start..p.end], p.after)));
        }
        (prev, prev_slice) = (Some(m), word);
    }
    if let Some(p) = prev {
        out.push((p, format!("{}{}{}", &text[prev_slice.0..prev_slice.1], &text[p.start..p.end], p.after)));
    }
    out
}

/// `_slices_from_text` then `_realign_boundaries`: the sentences' byte ranges.
pub fn sentence_spans(text: &str) -> Vec<(usize, usize)> {
    let found = candidates(text);
    let mut slices = Vec::new();
    let mut last_break = 0;
    for (m, context) in end_contexts(text, &found) {
        if contains_sentbreak(&context) {
            slices.push((last_break, m.end));
            last_break = m.next_tok.unwrap_or(m.end);
        }
    }
    slices.push((last_break, text.trim_end_matches(is_space).len()));

    let mut out = Vec::new();
    let mut realign = 0;
    for (i, &(start, stop)) in slices.iter().enumerate() {
        let first = (start + realign, stop);
        let Some(&(next_start, next_stop)) = slices.get(i + 1) else {
            if first.0 < first.1 {
                out.push(first);
            }
            continue;
        };
        match realigned_closers(&text[next_start..next_stop.max(next_start)]) {
            Some((kept, end)) => {
                out.push((first.0, next_start + kept));
                realign = end;
            }
            None => {
                realign = 0;
                if first.0 < first.1 {
                    out.push(first);
                }
            }
        }
    }
    out
}

/// `re_boundary_realignment.match` at the start of the next sentence (`["')\]}‘’“”«»]+?` then
/// whitespace, `--` ahead, or a line's end): the closers' length without trailing whitespace, and
/// the match's end.
fn realigned_closers(next: &str) -> Option<(usize, usize)> {
    let run = next.len() - next.trim_start_matches(|c| CLOSERS.contains(c)).len();
    let mut ends = next[..run].char_indices().map(|(i, c)| i + c.len_utf8());
    ends.find_map(|p| {
        let rest = &next[p..];
        let ws = rest.len() - rest.trim_start_matches(char::is_whitespace).len();
        let end = if ws > 0 {
            p + ws
        } else if rest.starts_with("--") || rest.is_empty() || rest.starts_with('\n') {
            p
        } else {
            return None;
        };
        Some((next[..end].trim_end_matches(is_space).len(), end))
    })
}

/// `sent_tokenize(text)`: the sentences.
pub fn sentences(text: &str) -> Vec<&str> {
    sentence_spans(text).into_iter().map(|(a, b)| &text[a..b]).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_english_parameters_are_read_whole() {
        let p = params();
        assert_eq!(
            (p.abbrev_types.len(), p.collocations.len(), p.sent_starters.len(), p.ortho_context.len()),
            (156, 37, 39, 20366)
        );
        assert!(p.abbrev_types.contains(". . ") && p.abbrev_types.contains("dr"));
    }

    #[test]
    fn sentences_break_after_ends_but_not_after_abbreviations_or_initials() {
        assert_eq!(
            sentences("Hello there. I am Dr. Smith. It is 5 p.m. now!"),
            ["Hello there.", "I am Dr. Smith.", "It is 5 p.m. now!"]
        );
        assert_eq!(sentences("He said \"Stop.\" Then he left."), ["He said \"Stop.\"", "Then he left."]);
        assert_eq!(sentences("J. R. R. Tolkien wrote it. Yes"), ["J. R. R. Tolkien wrote it.", "Yes"]);
        assert_eq!(sentences("  "), Vec::<&str>::new());
        assert_eq!(sentences("no end at all"), ["no end at all"]);
        assert_eq!(sentences("Wait... What? Really?! ok."), ["Wait... What?", "Really?!", "ok."]);
    }
}
