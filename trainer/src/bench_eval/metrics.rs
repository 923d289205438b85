//! Scores as lm-evaluation-harness computes them: its answer-extraction filters, its
//! `exact_match` with the task's normalisation, and means with their standard error (the
//! sample standard deviation over √n).

use regex::Regex;

/// What a filter yields when its pattern does not match (the harness's fallback).
pub const INVALID: &str = "[invalid]";

/// gsm8k's two filters over a generated answer: `strict-match` (the number after `#### `) and
/// `flexible-extract` (the last number anywhere).
#[derive(Debug)]
pub struct Gsm8kFilters {
    strict: Regex,
    flexible: Regex,
    ignore: [Regex; 4],
}

/// Which match of a pattern a filter takes.
#[derive(Debug, Clone, Copy)]
enum Pick {
    First,
    Last,
}

impl Gsm8kFilters {
    pub fn new() -> Gsm8kFilters {
        // The patterns of the harness's gsm8k.yaml; constant, so they compile.
        let re = |p: &str| Regex::new(p).unwrap_or_else(|e| unreachable!("{p}: {e}"));
        Gsm8kFilters {
            strict: re(r"#### (\-?[0-9\.\,]+)"),
            flexible: re(r"(-?[$0-9.,]{2,})|(-?[0-9]+)"),
            ignore: [re(","), re(r"\$"), re(r"(?s).*#### "), re(r"\.$")],
        }
    }

    /// `(strict-match, flexible-extract)` of a generated answer.
    pub fn extract(&self, output: &str) -> (String, String) {
        (pick(&self.strict, output, Pick::First), pick(&self.flexible, output, Pick::Last))
    }

    /// The harness's `exact_match` with gsm8k's settings: each of `regexes_to_ignore` removed
    /// from both sides, then case ignored.
    pub fn exact_match(&self, prediction: &str, reference: &str) -> bool {
        let norm = |s: &str| {
            let mut s = s.to_owned();
            for re in &self.ignore {
                s = re.replace_all(&s, "").into_owned();
            }
            s.to_lowercase()
        };
        norm(prediction) == norm(reference)
    }
}

impl Default for Gsm8kFilters {
    fn default() -> Self {
        Gsm8kFilters::new()
    }
}

/// The harness's regex filter: all matches, the one `which` picks; a match of several groups
/// gives its first non-empty group; stripped; [`INVALID`] when nothing matches.
fn pick(re: &Regex, text: &str, which: Pick) -> String {
    let matches: Vec<regex::Captures<'_>> = re.captures_iter(text).collect();
    let chosen = match which {
        Pick::First => matches.first(),
        Pick::Last => matches.last(),
    };
    let Some(caps) = chosen else { return INVALID.to_owned() };
    let groups: Vec<&str> = (1..caps.len()).map(|i| caps.get(i).map_or("", |m| m.as_str())).collect();
    let text = match groups.as_slice() {
        [] => caps.get(0).map_or("", |m| m.as_str()),
        [one] => one,
        many => many.iter().find(|g| !g.is_empty()).copied().unwrap_or(""),
    };
    text.trim().to_owned()
}

/// The mean of `values` and its standard error (`None` below two values, where the harness
/// reports N/A).
pub fn mean_stderr(values: &[f64]) -> (f64, Option<f64>) {
    let n = values.len() as f64;
    if values.is_empty() {
        return (f64::NAN, None);
    }
    let mean = values.iter().sum::<f64>() / n;
    if values.len() < 2 {
        return (mean, None);
    }
    let var = values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (n - 1.0);
    (mean, Some((var / n).sqrt()))
}

/// The index of the highest value (the first of equals, as numpy's argmax).
pub fn argmax(values: &[f64]) -> usize {
    let mut best = 0;
    for (i, v) in values.iter().enumerate() {
        if *v > values[best] {
            best = i;
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gsm8k_answers_are_extracted_and_matched_as_the_harness_does() {
        let f = Gsm8kFilters::new();
        let reference = "She has 3 + 4 = 7 apples.\n#### 1,200";
        assert_eq!(f.extract("so 5 then #### 1,200.\n#### 9"), ("1,200.".into(), "9".into()));
        assert_eq!(f.extract("The answer is $1,200."), (INVALID.into(), "$1,200.".into()));
        assert_eq!(f.extract("no number"), (INVALID.into(), INVALID.into()));
        assert_eq!(f.extract("x is 7"), (INVALID.into(), "7".into()));
        assert!(f.exact_match("1,200.", reference));
        assert!(f.exact_match("$1,200.", reference));
        assert!(!f.exact_match("120", reference));
        assert!(!f.exact_match(INVALID, reference));
    }

    #[test]
    fn means_and_standard_errors_are_the_harness_s() {
        let (m, s) = mean_stderr(&[1.0, 0.0, 1.0, 1.0]);
        assert!((m - 0.75).abs() < 1e-12);
        // sample variance 0.25, over n = 4: stderr 0.25
        assert!((s.unwrap() - 0.25).abs() < 1e-12, "{s:?}");
        assert_eq!(mean_stderr(&[1.0]), (1.0, None));
        assert_eq!(argmax(&[-3.0, -1.0, -1.0, -2.0]), 1);
    }
}
