//! From generated tokens to text deltas: incremental detokenisation and OpenAI stop strings.
//!
//! Tokens do not align with characters (a byte-level tokenizer splits UTF-8) nor with stop
//! strings. [`Detokenizer`] decodes only a short window of recent tokens per step (the tokens
//! since the last released text, with a few before them for context) and releases new text
//! once it no longer ends in an unfinished character, so a long answer costs the same per token
//! as a short one. [`StopText`] then holds back any suffix that could still grow into a stop
//! string, and cuts the answer before the first one.

use crate::data::Tokenizer;

/// Incremental decoding of one answer.
#[derive(Debug, Clone, Default)]
pub struct Detokenizer {
    ids: Vec<u32>,
    /// Start of the window decoded for context.
    prefix: usize,
    /// Tokens before this are released.
    read: usize,
}

/// Tokens of left context decoded in front of the new ones: byte-level BPE merges across
/// token boundaries (a leading space, a split character) only within a few tokens.
const CONTEXT: usize = 5;

impl Detokenizer {
    /// Adds a token; returns the text that became final.
    pub fn push(&mut self, tokenizer: &Tokenizer, id: u32) -> Result<String, String> {
        self.ids.push(id);
        let decode = |ids: &[u32]| tokenizer.decode(ids, true).map_err(|e| e.to_string());
        let before = decode(&self.ids[self.prefix..self.read])?;
        let now = decode(&self.ids[self.prefix..])?;
        if now.len() <= before.len() || now.ends_with('\u{FFFD}') || !now.starts_with(&before) {
            return Ok(String::new());
        }
        let new = now[before.len()..].to_string();
        self.read = self.ids.len();
        self.prefix = self.read.saturating_sub(CONTEXT);
        Ok(new)
    }

    /// At the end: whatever is still held (an unfinished character decodes as U+FFFD).
    pub fn finish(&mut self, tokenizer: &Tokenizer) -> Result<String, String> {
        let decode = |ids: &[u32]| tokenizer.decode(ids, true).map_err(|e| e.to_string());
        let before = decode(&self.ids[self.prefix..self.read])?;
        let now = decode(&self.ids[self.prefix..])?;
        self.read = self.ids.len();
        Ok(now.strip_prefix(&before).unwrap_or("").to_string())
    }
}

/// The stop strings of one answer over its text so far.
#[derive(Debug, Clone, Default)]
pub struct StopText {
    stops: Vec<String>,
    /// Everything received.
    text: String,
    /// Bytes of `text` already released.
    released: usize,
}

/// What one push releases.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Released {
    pub text: String,
    /// A stop string was found: the answer ends here.
    pub stopped: bool,
}

impl StopText {
    /// Empty stop strings are ignored (they would match everywhere).
    pub fn new(stops: Vec<String>) -> StopText {
        StopText { stops: stops.into_iter().filter(|s| !s.is_empty()).collect(), ..StopText::default() }
    }

    /// Appends `delta`; returns the text that can no longer become part of a stop string.
    pub fn push(&mut self, delta: &str) -> Released {
        self.text.push_str(delta);
        if let Some(at) = self.first_stop() {
            return Released { text: self.release_to(at), stopped: true };
        }
        let end = self.text.len() - self.held_back();
        Released { text: self.release_to(end), stopped: false }
    }

    /// At the end of generation: everything not yet released (up to a stop string).
    pub fn finish(&mut self) -> String {
        let end = self.first_stop().unwrap_or(self.text.len());
        self.release_to(end)
    }

    /// The earliest stop string's start; only the unreleased tail (and the longest stop's
    /// reach back into the released text) can hold a new match.
    fn first_stop(&self) -> Option<usize> {
        let longest = self.stops.iter().map(String::len).max().unwrap_or(0);
        let mut from = self.released.saturating_sub(longest);
        while !self.text.is_char_boundary(from) {
            from -= 1;
        }
        self.stops.iter().filter_map(|s| self.text[from..].find(s.as_str()).map(|i| from + i)).min()
    }

    /// Length of the longest suffix of the text that is a proper prefix of a stop string.
    fn held_back(&self) -> usize {
        let mut longest = 0;
        for stop in &self.stops {
            for (i, _) in stop.char_indices().skip(1) {
                if i > longest && self.text.ends_with(&stop[..i]) {
                    longest = i;
                }
            }
        }
        longest
    }

    fn release_to(&mut self, end: usize) -> String {
        if end <= self.released || !self.text.is_char_boundary(end) {
            return String::new();
        }
        let out = self.text[self.released..end].to_string();
        self.released = end;
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn run(stops: &[&str], deltas: &[&str]) -> (String, bool) {
        let mut s = StopText::new(stops.iter().map(|s| s.to_string()).collect());
        let mut out = String::new();
        for d in deltas {
            let r = s.push(d);
            out.push_str(&r.text);
            if r.stopped {
                return (out, true);
            }
        }
        out.push_str(&s.finish());
        (out, false)
    }

    #[test]
    fn a_stop_string_split_across_tokens_is_held_back_then_cut() {
        assert_eq!(run(&["END"], &["4", "2 E", "N", "D", "!"]), ("42 ".into(), true));
        // A false start is released once it can no longer match.
        let mut s = StopText::new(vec!["END".into()]);
        assert_eq!(s.push("a E").text, "a ");
        assert_eq!(s.push("X").text, "EX");
    }

    #[test]
    fn byte_tokens_release_whole_characters_only() {
        let tok = Tokenizer::byte();
        let mut d = Detokenizer::default();
        let ids = tok.encode("é!").unwrap();
        assert_eq!(ids.len(), 3, "é is two byte tokens");
        let out: Vec<String> = ids.iter().map(|&i| d.push(&tok, i).unwrap()).collect();
        assert_eq!(out, ["", "é", "!"]);
        assert_eq!(d.finish(&tok).unwrap(), "");
    }

    proptest! {
        /// Any split of a text into deltas releases exactly the text up to the first stop.
        #[test]
        fn streamed_text_equals_the_cut_whole(text in "[a-cX é]{0,40}", stop in "[a-cXé]{1,3}", cuts in proptest::collection::vec(0usize..40, 0..8)) {
            let mut points: Vec<usize> = cuts.into_iter().filter(|&c| c <= text.len() && text.is_char_boundary(c)).collect();
            points.push(0);
            points.push(text.len());
            points.sort();
            let deltas: Vec<&str> = points.windows(2).map(|w| &text[w[0]..w[1]]).collect();
            let (got, _) = run(&[stop.as_str()], &deltas);
            let want = match text.find(&stop) { Some(i) => &text[..i], None => &text[..] };
            prop_assert_eq!(got, want);
        }

        /// Incremental decoding of any text's tokens gives the text.
        #[test]
        fn incremental_decoding_equals_decoding_the_whole(text in "[a-z é→€]{0,30}") {
            let tok = Tokenizer::byte();
            let ids = tok.encode(&text).unwrap();
            let mut d = Detokenizer::default();
            let mut out: String = ids.iter().map(|&i| d.push(&tok, i).unwrap()).collect();
            out.push_str(&d.finish(&tok).unwrap());
            prop_assert_eq!(out, tok.decode(&ids, true).unwrap());
        }
    }
}
