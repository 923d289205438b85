//! The 25 instruction kinds of IFEval (lm-evaluation-harness's `INSTRUCTION_DICT`), each built
//! from its dataset kwargs as the harness's `build_description` takes them, and checked.
//!
//! The harness drops falsy kwargs (`None`, `0`, `""`, `[]`) and, where one it needs is then
//! missing, out of range or negative, draws a value at random; such a row has no fixed verdict,
//! so it is refused here with the kwarg named (the published dataset has none).

use regex::Regex;

use super::IfevalError;
use super::format::{self, Postscript};
use super::keywords::{self, Relation};
use super::length;
use super::punkt;
use super::startend;
use super::words::count_words;
use crate::data::Json;

/// One instruction, ready to check a response.
#[derive(Debug, Clone)]
pub enum Instruction {
    KeywordsExistence(Vec<Regex>),
    KeywordFrequency { keyword: Regex, frequency: i64, relation: Relation },
    ForbiddenWords(Vec<Regex>),
    LetterFrequency { letter: char, frequency: i64, relation: Relation },
    ResponseLanguage(String),
    NumberSentences { count: i64, relation: Relation },
    NumberParagraphs(i64),
    NumberWords { count: i64, relation: Relation },
    NthParagraphFirstWord { paragraphs: i64, nth: i64, first_word: String },
    NumberPlaceholders(i64),
    Postscript(Postscript),
    NumberBulletLists(i64),
    ConstrainedResponse,
    NumberHighlightedSections(i64),
    MultipleSections { splitter: Regex, count: i64 },
    JsonFormat,
    Title,
    TwoResponses,
    RepeatPrompt(String),
    EndChecker(String),
    CapitalWordFrequency { count: i64, relation: Relation },
    EnglishCapital,
    EnglishLowercase,
    NoComma,
    Quotation,
}

/// Every instruction id the harness registers.
pub const IDS: [&str; 25] = [
    "keywords:existence",
    "keywords:frequency",
    "keywords:forbidden_words",
    "keywords:letter_frequency",
    "language:response_language",
    "length_constraints:number_sentences",
    "length_constraints:number_paragraphs",
    "length_constraints:number_words",
    "length_constraints:nth_paragraph_first_word",
    "detectable_content:number_placeholders",
    "detectable_content:postscript",
    "detectable_format:number_bullet_lists",
    "detectable_format:constrained_response",
    "detectable_format:number_highlighted_sections",
    "detectable_format:multiple_sections",
    "detectable_format:json_format",
    "detectable_format:title",
    "combination:two_responses",
    "combination:repeat_prompt",
    "startend:end_checker",
    "change_case:capital_word_frequency",
    "change_case:english_capital",
    "change_case:english_lowercase",
    "punctuation:no_comma",
    "startend:quotation",
];

/// The languages `language:response_language` may ask for (the harness's `LANGUAGE_CODES`).
pub const LANGUAGES: [&str; 30] = [
    "ar", "bg", "bn", "de", "en", "es", "fa", "fi", "fr", "gu", "he", "hi", "it", "ja", "kn", "ko", "ml", "mr", "ne",
    "pa", "pl", "pt", "ru", "sw", "ta", "te", "th", "uk", "ur", "vi",
];

/// The kwargs the harness passes: falsy values left out.
struct Kwargs<'a> {
    id: &'a str,
    given: Vec<(&'a str, &'a Json)>,
}

impl<'a> Kwargs<'a> {
    fn new(id: &'a str, kwargs: &'a Json) -> Result<Kwargs<'a>, IfevalError> {
        let fields: &[(String, Json)] = match kwargs {
            Json::Object(fields) => fields,
            Json::Null => &[],
            other => {
                return Err(IfevalError::Kwargs(format!("{id}: kwargs {} is not a record", other.to_python_json())));
            }
        };
        let truthy = |v: &Json| match v {
            Json::Null => false,
            Json::Bool(b) => *b,
            Json::Int(i) => *i != 0,
            Json::Float(f) => *f != 0.0,
            Json::String(s) => !s.is_empty(),
            Json::Array(a) => !a.is_empty(),
            Json::Object(o) => !o.is_empty(),
        };
        let given = fields.iter().filter(|(_, v)| truthy(v)).map(|(k, v)| (k.as_str(), v)).collect();
        Ok(Kwargs { id, given })
    }

    fn err(&self, message: String) -> IfevalError {
        IfevalError::Kwargs(format!("{}: {message}", self.id))
    }

    /// Refuses kwargs the instruction does not take (Python's `TypeError`).
    fn only(&self, names: &[&str]) -> Result<(), IfevalError> {
        match self.given.iter().find(|(k, _)| !names.contains(k)) {
            Some((k, _)) => Err(self.err(format!("takes no kwarg `{k}` (it takes: {})", names.join(", ")))),
            None => Ok(()),
        }
    }

    fn get(&self, name: &str) -> Result<&'a Json, IfevalError> {
        self.given
            .iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| *v)
            .ok_or_else(|| self.err(format!("kwarg `{name}` is missing (the harness would draw one at random)")))
    }

    fn text(&self, name: &str) -> Result<&'a str, IfevalError> {
        match self.get(name)? {
            Json::String(s) => Ok(s),
            other => Err(self.err(format!("kwarg `{name}` is not text: {}", other.to_python_json()))),
        }
    }

    fn texts(&self, name: &str) -> Result<Vec<&'a str>, IfevalError> {
        match self.get(name)? {
            Json::Array(items) => items
                .iter()
                .map(|v| match v {
                    Json::String(s) => Ok(s.as_str()),
                    other => Err(self.err(format!("kwarg `{name}` holds {}", other.to_python_json()))),
                })
                .collect(),
            other => Err(self.err(format!("kwarg `{name}` is not a list: {}", other.to_python_json()))),
        }
    }

    /// A count; negative ones the harness replaces at random (`capital_frequency` excepted).
    fn int(&self, name: &str, negative_ok: bool) -> Result<i64, IfevalError> {
        let n = match self.get(name)? {
            Json::Int(i) => i64::try_from(*i).ok(),
            Json::Float(f) if f.fract() == 0.0 && f.abs() < 9e15 => Some(*f as i64),
            _ => None,
        };
        match n {
            Some(n) if n >= 0 || negative_ok => Ok(n),
            _ => Err(self.err(format!("kwarg `{name}` is not a count: {}", self.get(name)?.to_python_json()))),
        }
    }

    fn relation(&self, name: &str) -> Result<Relation, IfevalError> {
        Relation::parse(self.text(name)?).map_err(|e| self.err(e))
    }
}

impl Instruction {
    /// The instruction `id` with its dataset `kwargs`.
    pub fn new(id: &str, kwargs: &Json) -> Result<Instruction, IfevalError> {
        let k = Kwargs::new(id, kwargs)?;
        let names: &[&str] = match id {
            "keywords:existence" => &["keywords"],
            "keywords:frequency" => &["keyword", "frequency", "relation"],
            "keywords:forbidden_words" => &["forbidden_words"],
            "keywords:letter_frequency" => &["letter", "let_frequency", "let_relation"],
            "language:response_language" => &["language"],
            "length_constraints:number_sentences" => &["num_sentences", "relation"],
            "length_constraints:number_paragraphs" => &["num_paragraphs"],
            "length_constraints:number_words" => &["num_words", "relation"],
            "length_constraints:nth_paragraph_first_word" => &["num_paragraphs", "nth_paragraph", "first_word"],
            "detectable_content:number_placeholders" => &["num_placeholders"],
            "detectable_content:postscript" => &["postscript_marker"],
            "detectable_format:number_bullet_lists" => &["num_bullets"],
            "detectable_format:number_highlighted_sections" => &["num_highlights"],
            "detectable_format:multiple_sections" => &["section_spliter", "num_sections"],
            "combination:repeat_prompt" => &["prompt_to_repeat"],
            "startend:end_checker" => &["end_phrase"],
            "change_case:capital_word_frequency" => &["capital_frequency", "capital_relation"],
            _ if IDS.contains(&id) => &[],
            _ => return Err(IfevalError::UnknownInstruction(id.to_owned())),
        };
        k.only(names)?;
        let patterns = |words: Vec<&str>| words.into_iter().map(keywords::pattern).collect::<Result<Vec<_>, _>>();
        Ok(match id {
            "keywords:existence" => Instruction::KeywordsExistence(patterns(k.texts("keywords")?)?),
            "keywords:frequency" => Instruction::KeywordFrequency {
                keyword: keywords::pattern(super::pytext::strip(k.text("keyword")?))?,
                frequency: k.int("frequency", false)?,
                relation: k.relation("relation")?,
            },
            "keywords:forbidden_words" => Instruction::ForbiddenWords(patterns(k.texts("forbidden_words")?)?),
            "keywords:letter_frequency" => {
                let letter = k.text("letter")?;
                let mut chars = letter.chars();
                let (Some(c), None) = (chars.next(), chars.next()) else {
                    return Err(k.err(format!("letter {letter:?} is not one letter (the harness would draw one)")));
                };
                if !c.is_ascii_alphabetic() {
                    return Err(k.err(format!("letter {letter:?} is not a-z (the harness would draw one)")));
                }
                Instruction::LetterFrequency {
                    letter: c.to_ascii_lowercase(),
                    frequency: k.int("let_frequency", false)?,
                    relation: k.relation("let_relation")?,
                }
            }
            "language:response_language" => {
                let language = k.text("language")?;
                if !LANGUAGES.contains(&language) {
                    return Err(k.err(format!(
                        "language {language:?} is not one the harness names (it fails on it); it names {}",
                        LANGUAGES.join(", ")
                    )));
                }
                Instruction::ResponseLanguage(language.to_owned())
            }
            "length_constraints:number_sentences" => Instruction::NumberSentences {
                count: k.int("num_sentences", false)?,
                relation: k.relation("relation")?,
            },
            "length_constraints:number_paragraphs" => Instruction::NumberParagraphs(k.int("num_paragraphs", false)?),
            "length_constraints:number_words" => {
                Instruction::NumberWords { count: k.int("num_words", false)?, relation: k.relation("relation")? }
            }
            "length_constraints:nth_paragraph_first_word" => {
                let (paragraphs, nth) = (k.int("num_paragraphs", false)?, k.int("nth_paragraph", false)?);
                if nth == 0 || nth > paragraphs {
                    return Err(k.err(format!("nth_paragraph {nth} is not within 1..={paragraphs}")));
                }
                Instruction::NthParagraphFirstWord { paragraphs, nth, first_word: k.text("first_word")?.to_lowercase() }
            }
            "detectable_content:number_placeholders" => {
                Instruction::NumberPlaceholders(k.int("num_placeholders", false)?)
            }
            "detectable_content:postscript" => {
                Instruction::Postscript(Postscript::new(super::pytext::strip(k.text("postscript_marker")?))?)
            }
            "detectable_format:number_bullet_lists" => Instruction::NumberBulletLists(k.int("num_bullets", false)?),
            "detectable_format:constrained_response" => Instruction::ConstrainedResponse,
            "detectable_format:number_highlighted_sections" => {
                Instruction::NumberHighlightedSections(k.int("num_highlights", false)?)
            }
            "detectable_format:multiple_sections" => Instruction::MultipleSections {
                splitter: format::section_pattern(super::pytext::strip(k.text("section_spliter")?))?,
                count: k.int("num_sections", false)?,
            },
            "detectable_format:json_format" => Instruction::JsonFormat,
            "detectable_format:title" => Instruction::Title,
            "combination:two_responses" => Instruction::TwoResponses,
            "combination:repeat_prompt" => Instruction::RepeatPrompt(k.text("prompt_to_repeat")?.to_owned()),
            "startend:end_checker" => Instruction::EndChecker(k.text("end_phrase")?.to_owned()),
            "change_case:capital_word_frequency" => Instruction::CapitalWordFrequency {
                count: k.int("capital_frequency", true)?,
                relation: k.relation("capital_relation")?,
            },
            "change_case:english_capital" => Instruction::EnglishCapital,
            "change_case:english_lowercase" => Instruction::EnglishLowercase,
            "punctuation:no_comma" => Instruction::NoComma,
            "startend:quotation" => Instruction::Quotation,
            other => return Err(IfevalError::UnknownInstruction(other.to_owned())),
        })
    }

    /// `check_following(response)`.
    pub fn check(&self, r: &str) -> bool {
        match self {
            Instruction::KeywordsExistence(k) => keywords::all_present(k, r),
            Instruction::KeywordFrequency { keyword, frequency, relation } => {
                relation.holds(keywords::occurrences(keyword, r), *frequency)
            }
            Instruction::ForbiddenWords(w) => keywords::none_present(w, r),
            Instruction::LetterFrequency { letter, frequency, relation } => {
                relation.holds(keywords::letter_count(*letter, r), *frequency)
            }
            Instruction::ResponseLanguage(language) => super::language::is_in(r, language),
            Instruction::NumberSentences { count, relation } => relation.holds(punkt::sentence_spans(r).len(), *count),
            Instruction::NumberParagraphs(n) => length::paragraphs_exactly(r, *n),
            Instruction::NumberWords { count, relation } => relation.holds(count_words(r), *count),
            Instruction::NthParagraphFirstWord { paragraphs, nth, first_word } => {
                length::nth_paragraph_starts_with(r, *paragraphs, *nth, first_word)
            }
            Instruction::NumberPlaceholders(n) => Relation::AtLeast.holds(format::placeholders(r), *n),
            Instruction::Postscript(p) => p.found(r),
            Instruction::NumberBulletLists(n) => i64::try_from(format::bullets(r)).is_ok_and(|b| b == *n),
            Instruction::ConstrainedResponse => format::constrained(r),
            Instruction::NumberHighlightedSections(n) => Relation::AtLeast.holds(format::highlights(r), *n),
            Instruction::MultipleSections { splitter, count } => {
                Relation::AtLeast.holds(format::sections(splitter, r), *count)
            }
            Instruction::JsonFormat => format::is_json(r),
            Instruction::Title => format::has_title(r),
            Instruction::TwoResponses => startend::two_responses(r),
            Instruction::RepeatPrompt(prompt) => startend::repeats(r, prompt),
            Instruction::EndChecker(phrase) => startend::ends_with(r, phrase),
            Instruction::CapitalWordFrequency { count, relation } => relation.holds(startend::capital_words(r), *count),
            Instruction::EnglishCapital => startend::english_capital(r),
            Instruction::EnglishLowercase => startend::english_lowercase(r),
            Instruction::NoComma => startend::no_comma(r),
            Instruction::Quotation => startend::quoted(r),
        }
    }
}
