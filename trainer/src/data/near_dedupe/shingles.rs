//! What an example says, as a set of shingles: the word 5-grams of its text.
//!
//! The text is everything the example carries and nothing the chat template adds: the offered
//! tool schemas, then each message's role, reasoning, content and tool calls (name and
//! arguments), in order; a preference pair's prompt, chosen and rejected turns. The template's
//! markup is left out because it is the same in every example: it would make short unrelated
//! examples look alike. Words are split on Unicode whitespace and lowercased; punctuation stays
//! on its word, so `2+3=5` and `2+3=6` differ. Each word is hashed (XXH3-64), each run of five
//! word hashes is hashed again into one 64-bit shingle; an example of fewer than five words is
//! one shingle of all of them, an example of none is the empty set.

use std::cmp::Ordering;

use crate::data::example::{Example, Message};

/// Words per shingle.
pub const SHINGLE_WORDS: usize = 5;

/// The shingling recorded in the manifest; a change to the rule above gets a new name.
pub const SHINGLE: &str = "words-5-lowercase-xxh3-v1";

/// The example's shingles, sorted, without repeats.
pub fn shingles(example: &Example) -> Vec<u64> {
    let mut words = Vec::new();
    let mut lower = String::new();
    for_each_text(example, &mut |text| {
        for word in text.split_whitespace() {
            words.push(word_hash(word, &mut lower));
        }
    });
    let mut out: Vec<u64> = match words.len() {
        0 => Vec::new(),
        n if n < SHINGLE_WORDS => vec![shingle_hash(&words)],
        _ => words.windows(SHINGLE_WORDS).map(shingle_hash).collect(),
    };
    out.sort_unstable();
    out.dedup();
    out
}

/// |a ∩ b| / |a ∪ b| of two sorted sets without repeats; two empty sets are identical (1).
pub fn jaccard(a: &[u64], b: &[u64]) -> f64 {
    if a.is_empty() && b.is_empty() {
        return 1.0;
    }
    let (mut i, mut j, mut both) = (0, 0, 0usize);
    while i < a.len() && j < b.len() {
        match a[i].cmp(&b[j]) {
            Ordering::Less => i += 1,
            Ordering::Greater => j += 1,
            Ordering::Equal => {
                both += 1;
                i += 1;
                j += 1;
            }
        }
    }
    both as f64 / (a.len() + b.len() - both) as f64
}

fn for_each_text(example: &Example, f: &mut dyn FnMut(&str)) {
    let messages = |messages: &[Message], f: &mut dyn FnMut(&str)| {
        for m in messages {
            f(m.role.as_str());
            if let Some(reasoning) = &m.reasoning {
                f(reasoning);
            }
            f(&m.content);
            for call in &m.tool_calls {
                f(&call.name);
                f(&call.arguments.render());
            }
        }
    };
    match example {
        Example::Text(text) => f(text),
        Example::Chat(c) => {
            for tool in &c.tools {
                f(&tool.to_python_json());
            }
            messages(&c.messages, f);
        }
        Example::Preference(p) => {
            for tool in &p.tools {
                f(&tool.to_python_json());
            }
            for side in [&p.prompt, &p.chosen, &p.rejected] {
                messages(side, f);
            }
        }
    }
}

fn word_hash(word: &str, lower: &mut String) -> u64 {
    let bytes = if word.chars().any(char::is_uppercase) {
        lower.clear();
        lower.extend(word.chars().flat_map(char::to_lowercase));
        lower.as_bytes()
    } else {
        word.as_bytes()
    };
    twox_hash::XxHash3_64::oneshot(bytes)
}

fn shingle_hash(words: &[u64]) -> u64 {
    let mut bytes = [0u8; 8 * SHINGLE_WORDS];
    for (chunk, w) in bytes.chunks_exact_mut(8).zip(words) {
        chunk.copy_from_slice(&w.to_le_bytes());
    }
    twox_hash::XxHash3_64::oneshot(&bytes[..8 * words.len()])
}
