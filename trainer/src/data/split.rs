//! Exact-duplicate removal and the seeded holdout split.

use std::collections::HashSet;

use super::example::Example;

/// Keeps the first occurrence of every example (by [`Example::digest`]); returns how many
/// were dropped.
pub fn dedupe_exact(examples: &mut Vec<Example>) -> u64 {
    let before = examples.len();
    let mut seen = HashSet::with_capacity(before);
    examples.retain(|e| seen.insert(e.digest()));
    (before - examples.len()) as u64
}

/// Splits off `floor(fraction * n)` examples (at most `max_samples`, and never all of them)
/// as the holdout. Which ones is decided by ranking keyed hashes of the examples, so the
/// choice depends only on the seed and on each example itself (identical examples, kept
/// when dedupe is off, tie-break by position): adding data to a file does
/// not reshuffle which old examples are held out. Both parts keep the input order.
pub fn holdout_split(
    examples: Vec<Example>,
    fraction: f64,
    max_samples: Option<u32>,
    seed: u64,
) -> (Vec<Example>, Vec<Example>) {
    let n = examples.len();
    let wanted =
        if fraction.is_finite() && fraction > 0.0 { (fraction.min(1.0) * n as f64).floor() as usize } else { 0 };
    let k = wanted.min(max_samples.map_or(usize::MAX, |m| m as usize)).min(n.saturating_sub(1));
    if k == 0 {
        return (examples, Vec::new());
    }
    let mut ranked: Vec<([u8; 32], usize)> = examples
        .iter()
        .enumerate()
        .map(|(i, e)| {
            let mut h = blake3::Hasher::new_derive_key("mindxtrain holdout v1");
            h.update(&seed.to_le_bytes());
            h.update(&e.digest());
            (*h.finalize().as_bytes(), i)
        })
        .collect();
    ranked.sort_unstable();
    let mut held = vec![false; n];
    for &(_, i) in &ranked[..k] {
        held[i] = true;
    }
    let (mut train, mut holdout) = (Vec::with_capacity(n - k), Vec::with_capacity(k));
    for (i, e) in examples.into_iter().enumerate() {
        if held[i] { holdout.push(e) } else { train.push(e) }
    }
    (train, holdout)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn texts(range: std::ops::Range<usize>) -> Vec<Example> {
        range.map(|i| Example::Text(format!("doc {i}"))).collect()
    }

    #[test]
    fn dedupe_keeps_first_occurrences_and_counts_the_rest() {
        let mut ex = vec![
            Example::Text("a".into()),
            Example::Text("b".into()),
            Example::Text("a".into()),
            Example::Text("a".into()),
            Example::Text("c".into()),
        ];
        assert_eq!(dedupe_exact(&mut ex), 2);
        assert_eq!(ex, vec![Example::Text("a".into()), Example::Text("b".into()), Example::Text("c".into())]);
        assert_eq!(dedupe_exact(&mut ex), 0);
    }

    #[test]
    fn holdout_is_seeded_sized_and_disjoint() {
        let (train, hold) = holdout_split(texts(0..1000), 0.05, None, 7);
        assert_eq!((train.len(), hold.len()), (950, 50));
        let (train2, hold2) = holdout_split(texts(0..1000), 0.05, None, 7);
        assert_eq!((&train, &hold), (&train2, &hold2));
        let (_, hold3) = holdout_split(texts(0..1000), 0.05, None, 8);
        assert_ne!(hold, hold3);
        assert!(hold.iter().all(|h| !train.contains(h)));
        let (_, capped) = holdout_split(texts(0..1000), 0.05, Some(20), 7);
        assert_eq!(capped.len(), 20);
        assert!(capped.iter().all(|c| hold.contains(c)), "the cap keeps the best-ranked part");
    }

    #[test]
    fn holdout_is_stable_when_data_is_appended() {
        let (_, small) = holdout_split(texts(0..500), 0.1, Some(10), 3);
        let (_, large) = holdout_split(texts(0..5000), 0.1, Some(10_000), 3);
        let kept = small.iter().filter(|s| large.contains(s)).count();
        assert!(kept >= 8, "only {kept} of 10 stayed held out");
    }

    #[test]
    fn holdout_never_takes_everything_or_negative_fractions() {
        assert_eq!(holdout_split(texts(0..3), 1.0, None, 1).0.len(), 1);
        assert_eq!(holdout_split(texts(0..3), -1.0, None, 1).1.len(), 0);
        assert_eq!(holdout_split(texts(0..3), f64::NAN, None, 1).1.len(), 0);
        assert_eq!(holdout_split(Vec::new(), 0.5, None, 1).1.len(), 0);
    }
}
