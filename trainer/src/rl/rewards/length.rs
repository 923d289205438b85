//! `length`: DAPO's soft overlong penalty. With `L = max_new_tokens` and a margin
//! `C = max(1, L / 4)`: 0 up to `L − C` tokens, falling linearly to −1 at `L`, and −1 for a
//! completion the length limit cut off. Every completion is scored.

use super::Sample;

pub const SOURCES: &[&str] = &[include_str!("length.rs")];

pub fn score(s: &Sample<'_>) -> Option<f64> {
    if s.truncated {
        return Some(-1.0);
    }
    let limit = s.max_new_tokens as f64;
    let margin = (s.max_new_tokens / 4).max(1) as f64;
    let n = s.completion_tokens as f64;
    Some(if n <= limit - margin { 0.0 } else { ((limit - margin - n) / margin).max(-1.0) })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn score_of(tokens: usize, truncated: bool) -> f64 {
        score(&Sample { reference: "", text: "", completion_tokens: tokens, truncated, max_new_tokens: 16 }).unwrap()
    }

    #[test]
    fn the_penalty_starts_a_quarter_before_the_limit() {
        assert_eq!(score_of(0, false), 0.0);
        assert_eq!(score_of(12, false), 0.0);
        assert_eq!(score_of(13, false), -0.25);
        assert_eq!(score_of(14, false), -0.5);
        assert_eq!(score_of(16, false), -1.0);
        assert_eq!(score_of(5, true), -1.0);
    }
}
