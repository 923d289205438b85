//! `exact_match`: 1 when the completion answers like the reference (the held-out evaluation's
//! rule, [`crate::data::answers_match`]: text equal after trimming, tool calls equal as parsed
//! JSON, a leading think block ignored), else 0. Every completion is scored.

use super::Sample;

/// This file and the scorer it calls: what the manifest's digest covers.
pub const SOURCES: &[&str] = &[include_str!("exact_match.rs"), include_str!("../../data/score.rs")];

pub fn score(s: &Sample<'_>) -> Option<f64> {
    Some(if crate::data::answers_match(s.reference, s.text) { 1.0 } else { 0.0 })
}
