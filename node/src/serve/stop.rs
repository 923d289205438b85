//! Turning generated tokens into text deltas, with OpenAI `stop` sequences.
//!
//! Tokens do not align with characters (a byte tokenizer splits UTF-8) nor with stop
//! sequences, so each step decodes the whole answer so far and releases only text that
//! can no longer change: no trailing replacement character (an unfinished UTF-8
//! sequence), and no suffix that could still grow into a stop sequence. A stop sequence
//! ends the answer and is not part of it.

/// The state of one answer's text.
#[derive(Debug, Clone, Default)]
pub struct TextStream {
    stops: Vec<String>,
    /// Bytes of the decoded text already released.
    released: usize,
}

/// What one step releases.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Released {
    pub text: String,
    /// A stop sequence was found: generation must end.
    pub stopped: bool,
}

impl TextStream {
    /// Empty stop strings are ignored (they would match everywhere).
    pub fn new(stops: Vec<String>) -> TextStream {
        TextStream { stops: stops.into_iter().filter(|s| !s.is_empty()).collect(), released: 0 }
    }

    /// Given the whole answer decoded so far, the new text that is final.
    pub fn push(&mut self, decoded: &str) -> Released {
        if let Some(at) = self.first_stop(decoded) {
            return Released { text: self.release_to(decoded, at), stopped: true };
        }
        let mut end = decoded.trim_end_matches('\u{FFFD}').len();
        end -= self.held_back(&decoded[..end]);
        Released { text: self.release_to(decoded, end), stopped: false }
    }

    /// At the end of generation: everything not yet released (up to a stop sequence).
    pub fn finish(&mut self, decoded: &str) -> String {
        let end = self.first_stop(decoded).unwrap_or(decoded.len());
        self.release_to(decoded, end)
    }

    fn first_stop(&self, decoded: &str) -> Option<usize> {
        self.stops.iter().filter_map(|s| decoded.find(s.as_str())).min()
    }

    /// Length of the longest suffix of `text` that is a proper prefix of a stop sequence.
    fn held_back(&self, text: &str) -> usize {
        let mut longest = 0;
        for stop in &self.stops {
            for (i, _) in stop.char_indices().skip(1) {
                if i > longest && text.ends_with(&stop[..i]) {
                    longest = i;
                }
            }
        }
        longest
    }

    fn release_to(&mut self, decoded: &str, end: usize) -> String {
        if end <= self.released || !decoded.is_char_boundary(end) || !decoded.is_char_boundary(self.released) {
            return String::new();
        }
        let text = decoded[self.released..end].to_string();
        self.released = end;
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn run(stops: &[&str], steps: &[&str]) -> (String, bool) {
        let mut s = TextStream::new(stops.iter().map(|s| s.to_string()).collect());
        let mut out = String::new();
        for step in steps {
            let r = s.push(step);
            out.push_str(&r.text);
            if r.stopped {
                return (out, true);
            }
        }
        out.push_str(&s.finish(steps.last().unwrap_or(&"")));
        (out, false)
    }

    #[test]
    fn a_stop_sequence_split_across_tokens_is_held_back_then_cut() {
        assert_eq!(run(&["END"], &["4", "42 E", "42 EN", "42 END", "42 END!"]), ("42 ".into(), true));
    }

    #[test]
    fn a_false_start_is_released_later() {
        let mut s = TextStream::new(vec!["END".into()]);
        assert_eq!(s.push("a E").text, "a ");
        assert_eq!(s.push("a EX").text, "EX");
    }

    #[test]
    fn unfinished_utf8_waits_for_its_last_byte() {
        let mut s = TextStream::new(vec![]);
        assert_eq!(s.push("é\u{FFFD}").text, "é");
        assert_eq!(s.push("éà").text, "à");
    }

    proptest! {
        /// Streaming any split of a text releases exactly the text up to the first stop.
        #[test]
        fn streamed_text_equals_the_cut_whole(text in "[a-cX ]{0,40}", stop in "[a-cX]{1,3}", cuts in proptest::collection::vec(0usize..40, 0..8)) {
            let mut points: Vec<usize> = cuts.into_iter().filter(|&c| c <= text.len()).collect();
            points.push(text.len());
            points.sort();
            let steps: Vec<&str> = points.iter().map(|&p| &text[..p]).collect();
            let (got, _) = run(&[stop.as_str()], &steps);
            let want = match text.find(&stop) { Some(i) => &text[..i], None => &text[..] };
            prop_assert_eq!(got, want);
        }
    }
}
