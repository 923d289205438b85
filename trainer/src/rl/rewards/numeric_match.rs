//! `numeric_match`: 1 when the completion's final number equals the reference's, else 0.
//!
//! A final number is read from the answer (after a think block): the content of the last
//! `\boxed{…}` if there is one, else what follows the last `####` (GSM8K's marker), else the
//! whole answer; in it, the last number (`-1,234.50`). Numbers compare as exact decimals
//! (`1,234.50` = `1234.5`; `-0` = `0`), never through floats. References that call a tool or
//! hold no number are not scored (the reward does not apply to them).

use super::Sample;
use super::answer::{TOOL_OPEN, layout};

pub const SOURCES: &[&str] = &[include_str!("numeric_match.rs"), include_str!("answer.rs")];

pub fn score(s: &Sample<'_>) -> Option<f64> {
    if s.reference.contains(TOOL_OPEN) {
        return None;
    }
    let want = final_number(layout(s.reference).answer)?;
    let got = final_number(layout(s.text).answer);
    Some(if got.as_deref() == Some(want.as_str()) { 1.0 } else { 0.0 })
}

/// The normalised last number of the part of `answer` that holds the final answer.
pub fn final_number(answer: &str) -> Option<String> {
    let part = if let Some((_, after)) = answer.rsplit_once("\\boxed{") {
        after.split_once('}').map_or(after, |(inside, _)| inside)
    } else if let Some((_, after)) = answer.rsplit_once("####") {
        after
    } else {
        answer
    };
    numbers(part).pop()
}

/// Every number in `text`, normalised, in order.
fn numbers(text: &str) -> Vec<String> {
    let b = text.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if !b[i].is_ascii_digit() {
            i += 1;
            continue;
        }
        let negative = i > 0 && b[i - 1] == b'-' && (i < 2 || !b[i - 2].is_ascii_alphanumeric());
        let mut digits = String::new();
        // Integer part: digits, with commas only between groups of digits.
        while i < b.len() {
            if b[i].is_ascii_digit() {
                digits.push(b[i] as char);
                i += 1;
            } else if b[i] == b',' && i + 1 < b.len() && b[i + 1].is_ascii_digit() && !digits.is_empty() {
                i += 1;
            } else {
                break;
            }
        }
        let mut fraction = String::new();
        if i + 1 < b.len() && b[i] == b'.' && b[i + 1].is_ascii_digit() {
            i += 1;
            while i < b.len() && b[i].is_ascii_digit() {
                fraction.push(b[i] as char);
                i += 1;
            }
        }
        out.push(normalise(negative, &digits, &fraction));
    }
    out
}

fn normalise(negative: bool, digits: &str, fraction: &str) -> String {
    let int = digits.trim_start_matches('0');
    let int = if int.is_empty() { "0" } else { int };
    let frac = fraction.trim_end_matches('0');
    let body = if frac.is_empty() { int.to_string() } else { format!("{int}.{frac}") };
    if negative && body != "0" { format!("-{body}") } else { body }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample<'a>(reference: &'a str, text: &'a str) -> Sample<'a> {
        Sample { reference, text, completion_tokens: 3, truncated: false, max_new_tokens: 16 }
    }

    #[test]
    fn final_numbers_are_read_and_normalised() {
        assert_eq!(final_number("Natalia sold 48 + 24 = 72 clips.\n#### 72").as_deref(), Some("72"));
        assert_eq!(final_number("so the answer is \\boxed{1,234.50} (not 7)").as_deref(), Some("1234.5"));
        assert_eq!(final_number("it was -3 then -0.0").as_deref(), Some("0"));
        assert_eq!(final_number("x-3 is 5").as_deref(), Some("5"));
        assert_eq!(final_number("x-3").as_deref(), Some("3"), "a minus inside a word is no sign");
        assert_eq!(final_number("007").as_deref(), Some("7"));
        assert_eq!(final_number("1,2,3").as_deref(), Some("123"));
        assert_eq!(final_number("no digits"), None);
    }

    #[test]
    fn answers_score_by_their_final_number() {
        assert_eq!(score(&sample("72", "72")), Some(1.0));
        assert_eq!(score(&sample("#### 72", "<think>48+24</think> The total is 72.00")), Some(1.0));
        assert_eq!(score(&sample("72", "<think>it is 72</think> 71")), Some(0.0), "the think block does not count");
        assert_eq!(score(&sample("72", "")), Some(0.0));
        assert_eq!(score(&sample("abc", "abc")), None, "no number in the reference");
        assert_eq!(
            score(&sample("<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": 1}}\n</tool_call>", "1")),
            None
        );
    }
}
