//! `language:response_language` and the English half of `change_case:english_capital` /
//! `english_lowercase`: the harness asks `langdetect` (a port of Google's language-detection,
//! 55 languages, ISO 639-1 codes, `zh-cn`/`zh-tw` for Chinese); this build asks `whatlang`
//! (trigram profiles, 69 languages) and names its answer with langdetect's code.
//!
//! Where they differ (measured by `tests/tests/ifeval.rs` on its cases): langdetect is random
//! unless seeded (the harness does not seed it), so on short or mixed text its answer varies
//! from run to run; whatlang is deterministic. Text with no letters makes langdetect raise,
//! which the harness counts as followed; whatlang finds nothing there, counted the same way.
//! Languages langdetect lacks keep whatlang's ISO 639-3 code and so never equal a requested one;
//! Chinese is `zh-cn`, so a request for `zh` fails in both.

use whatlang::Lang;

/// langdetect's code for a whatlang language (ISO 639-3 where langdetect has none).
fn langdetect_code(lang: Lang) -> &'static str {
    match lang {
        Lang::Afr => "af",
        Lang::Ara => "ar",
        Lang::Bul => "bg",
        Lang::Ben => "bn",
        Lang::Cat => "ca",
        Lang::Ces => "cs",
        Lang::Cym => "cy",
        Lang::Dan => "da",
        Lang::Deu => "de",
        Lang::Ell => "el",
        Lang::Eng => "en",
        Lang::Spa => "es",
        Lang::Est => "et",
        Lang::Pes => "fa",
        Lang::Fin => "fi",
        Lang::Fra => "fr",
        Lang::Guj => "gu",
        Lang::Heb => "he",
        Lang::Hin => "hi",
        Lang::Hrv => "hr",
        Lang::Hun => "hu",
        Lang::Ind => "id",
        Lang::Ita => "it",
        Lang::Jpn => "ja",
        Lang::Kan => "kn",
        Lang::Kor => "ko",
        Lang::Lit => "lt",
        Lang::Lav => "lv",
        Lang::Mkd => "mk",
        Lang::Mal => "ml",
        Lang::Mar => "mr",
        Lang::Nep => "ne",
        Lang::Nld => "nl",
        Lang::Nob => "no",
        Lang::Pan => "pa",
        Lang::Pol => "pl",
        Lang::Por => "pt",
        Lang::Ron => "ro",
        Lang::Rus => "ru",
        Lang::Slk => "sk",
        Lang::Slv => "sl",
        Lang::Swe => "sv",
        Lang::Tam => "ta",
        Lang::Tel => "te",
        Lang::Tha => "th",
        Lang::Tgl => "tl",
        Lang::Tur => "tr",
        Lang::Ukr => "uk",
        Lang::Urd => "ur",
        Lang::Vie => "vi",
        Lang::Cmn => "zh-cn",
        other => other.code(),
    }
}

/// The detected language's code; `None` where no language can be told (langdetect's
/// "No features in text", which the harness counts as followed).
pub fn detect(text: &str) -> Option<&'static str> {
    whatlang::detect_lang(text).map(langdetect_code)
}

/// Whether `text` is in `language`, as the harness's check answers it.
pub fn is_in(text: &str, language: &str) -> bool {
    detect(text).is_none_or(|code| code == language)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clear_text_is_told_apart_and_no_letters_counts_as_followed() {
        assert_eq!(detect("The quick brown fox jumps over the lazy dog, and then it runs away."), Some("en"));
        assert_eq!(detect("Le renard brun saute par-dessus le chien paresseux, puis il s'enfuit."), Some("fr"));
        assert_eq!(detect("Der schnelle braune Fuchs springt über den faulen Hund und rennt davon."), Some("de"));
        assert!(is_in("1234 !!", "en") && is_in("1234 !!", "fr"));
        assert!(!is_in("Я люблю читать книги по вечерам, когда все спят.", "en"));
    }
}
