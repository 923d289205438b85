//! IFEval (`ifeval`): instruction following scored by rules, as lm-evaluation-harness 0.4.13's
//! `ifeval` task scores it. Each prompt of `google/IFEval` carries instructions (ids and kwargs);
//! a response is checked against each, strictly (the response as is) and loosely (also with its
//! first and/or last line removed and `*` deleted: any of the eight variants passing).
//!
//! * [`instruction`]: the 25 instruction kinds, built from their kwargs and checked.
//! * [`keywords`], [`length`], [`format`], [`startend`], [`language`]: the checks by group.
//! * [`punkt`], [`words`], [`json_text`], [`pytext`]: NLTK's sentence and word tokenizers, Python's
//!   `json.loads` grammar and `str` predicates, which the checks count with.
//! * [`task`]: the dataset's rows, greedy generation, and the four metrics.

pub mod format;
pub mod instruction;
pub mod json_text;
pub mod keywords;
pub mod language;
pub mod length;
pub mod punkt;
pub mod pytext;
pub mod startend;
pub mod task;
pub mod words;

pub use instruction::Instruction;

#[derive(Debug, thiserror::Error)]
pub enum IfevalError {
    #[error("{0:?} is not an IFEval instruction id (the harness registers {ids})", ids = instruction::IDS.join(", "))]
    UnknownInstruction(String),
    #[error("{0}")]
    Kwargs(String),
}

/// A response's verdict on each instruction: strict and loose.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdicts {
    pub strict: Vec<bool>,
    pub loose: Vec<bool>,
}

/// The harness's eight loose variants: as is, without `*`, without the first line, the last,
/// both (each stripped), and those three without `*`.
fn loose_variants(response: &str) -> [String; 8] {
    let lines: Vec<&str> = response.split('\n').collect();
    let n = lines.len();
    let join = |ls: &[&str]| pytext::strip(&ls.join("\n")).to_owned();
    let first = join(&lines[1..]);
    let last = join(&lines[..n - 1]);
    let both = if n >= 2 { join(&lines[1..n - 1]) } else { String::new() };
    let no_star = |s: &str| s.replace('*', "");
    let (nf, nl, nb) = (no_star(&first), no_star(&last), no_star(&both));
    [response.to_owned(), no_star(response), first, last, both, nf, nl, nb]
}

/// `test_instruction_following_strict` and `_loose`: a response that is blank once stripped
/// follows nothing.
pub fn verdicts(instructions: &[Instruction], response: &str) -> Verdicts {
    let follows = |i: &Instruction, r: &str| !pytext::strip(r).is_empty() && i.check(r);
    let variants = loose_variants(response);
    Verdicts {
        strict: instructions.iter().map(|i| follows(i, response)).collect(),
        loose: instructions.iter().map(|i| variants.iter().any(|r| follows(i, r))).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::Json;

    fn inst(id: &str, kwargs: &str) -> Instruction {
        Instruction::new(id, &Json::parse(kwargs).unwrap()).unwrap()
    }

    #[test]
    fn loose_scoring_forgives_a_first_line_and_markdown_stars() {
        let quoted = inst("startend:quotation", "{}");
        let r = "Sure, here it is:\n\"hello\"";
        assert_eq!(verdicts(std::slice::from_ref(&quoted), r), Verdicts { strict: vec![false], loose: vec![true] });
        let json = inst("detectable_format:json_format", "{}");
        assert_eq!(
            verdicts(&[json, quoted], "**{\"a\": 1}**"),
            Verdicts { strict: vec![false, false], loose: vec![true, false] }
        );
        // A blank response follows nothing, even an instruction it would pass.
        let comma = inst("punctuation:no_comma", "{}");
        assert_eq!(
            verdicts(std::slice::from_ref(&comma), " \n "),
            Verdicts { strict: vec![false], loose: vec![false] }
        );
        assert_eq!(verdicts(&[comma], "a"), Verdicts { strict: vec![true], loose: vec![true] });
    }

    #[test]
    fn kwargs_are_taken_as_the_harness_takes_them_and_unfixed_ones_refused() {
        // Falsy kwargs are dropped: a null or 0 is as absent, and an absent one is refused.
        let nulls = r#"{"num_words": 120, "relation": "less than", "keywords": null, "letter": ""}"#;
        assert!(matches!(inst("length_constraints:number_words", nulls), Instruction::NumberWords { count: 120, .. }));
        for (id, kwargs, says) in [
            ("length_constraints:number_words", r#"{"num_words": 0, "relation": "at least"}"#, "num_words"),
            ("length_constraints:number_words", r#"{"num_words": 5, "relation": "more than"}"#, "relation"),
            (
                "keywords:letter_frequency",
                r#"{"letter": "ab", "let_frequency": 2, "let_relation": "at least"}"#,
                "letter",
            ),
            (
                "length_constraints:nth_paragraph_first_word",
                r#"{"num_paragraphs": 2, "nth_paragraph": 3, "first_word": "a"}"#,
                "nth_paragraph",
            ),
            ("detectable_format:title", r#"{"num_words": 3}"#, "num_words"),
            ("keywords:existence", r#"{"keywords": ["("]}"#, "pattern"),
            ("language:response_language", r#"{"language": "zh"}"#, "not one the harness names"),
            ("detectable_format:rephrase", "{}", "not an IFEval instruction id"),
        ] {
            let err = Instruction::new(id, &Json::parse(kwargs).unwrap()).unwrap_err().to_string();
            assert!(err.contains(says), "{id} {kwargs}: {err}");
        }
        assert_eq!(instruction::IDS.len(), 25);
        for id in instruction::IDS {
            // Every registered id is built (here with kwargs where it needs them).
            let kwargs = match id.split(':').nth(1) {
                Some("existence") => r#"{"keywords": ["a"]}"#,
                Some("frequency") => r#"{"keyword": "a", "frequency": 2, "relation": "at least"}"#,
                Some("forbidden_words") => r#"{"forbidden_words": ["a"]}"#,
                Some("letter_frequency") => r#"{"letter": "a", "let_frequency": 2, "let_relation": "at least"}"#,
                Some("response_language") => r#"{"language": "en"}"#,
                Some("number_sentences") => r#"{"num_sentences": 2, "relation": "at least"}"#,
                Some("number_paragraphs") => r#"{"num_paragraphs": 2}"#,
                Some("number_words") => r#"{"num_words": 2, "relation": "at least"}"#,
                Some("nth_paragraph_first_word") => r#"{"num_paragraphs": 2, "nth_paragraph": 1, "first_word": "a"}"#,
                Some("number_placeholders") => r#"{"num_placeholders": 2}"#,
                Some("postscript") => r#"{"postscript_marker": "P.S."}"#,
                Some("number_bullet_lists") => r#"{"num_bullets": 2}"#,
                Some("number_highlighted_sections") => r#"{"num_highlights": 2}"#,
                Some("multiple_sections") => r#"{"section_spliter": "Section", "num_sections": 2}"#,
                Some("repeat_prompt") => r#"{"prompt_to_repeat": "a"}"#,
                Some("end_checker") => r#"{"end_phrase": "a"}"#,
                Some("capital_word_frequency") => r#"{"capital_frequency": 2, "capital_relation": "at least"}"#,
                _ => "{}",
            };
            inst(id, kwargs);
        }
    }
}
