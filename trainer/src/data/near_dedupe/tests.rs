use proptest::prelude::*;
use proptest::sample::Index;
use proptest::test_runner::{Config, RngSeed};

use super::store::ShingleStore;
use super::*;
use crate::data::example::{Conversation, Message, Role, ToolArguments, ToolCall};
use crate::data::json::Json;

/// A word of letters for a number (distinct numbers, distinct words).
fn word(n: u32) -> String {
    let mut n = u64::from(n) + 26;
    let mut w = String::new();
    while n > 0 {
        w.push(char::from(b'a' + (n % 26) as u8));
        n /= 26;
    }
    w
}

fn words(ids: &[u32]) -> Vec<String> {
    ids.iter().map(|&n| word(n)).collect()
}

fn text(words: &[String]) -> Example {
    Example::Text(words.join(" "))
}

/// `base` with the words at `changes` replaced (an index picks the place, the number the word).
fn changed(base: &[String], changes: &[(Index, u32)]) -> Vec<String> {
    let mut out = base.to_vec();
    for (at, n) in changes {
        // Numbers above 2^31 never occur in a base (see `near_groups`), so each change is one.
        out[at.index(base.len())] = word(n | 1 << 31);
    }
    out
}

/// What one pass keeps of `examples`, handed over `block` at a time.
fn kept(examples: &[Example], threshold: f64, block: usize) -> Vec<bool> {
    let mut near = NearDedupe::new(threshold);
    let mut out = Vec::new();
    for chunk in examples.chunks(block.max(1)) {
        out.extend(near.filter(&chunk.iter().collect::<Vec<_>>()).unwrap());
    }
    assert_eq!(near.removed(), out.iter().filter(|k| !**k).count() as u64);
    out
}

/// The rule itself, by brute force: drop an example whose exact Jaccard similarity to any
/// earlier kept example reaches the threshold.
fn reference(examples: &[Example], threshold: f64) -> Vec<bool> {
    let sets: Vec<Vec<u64>> = examples.iter().map(shingles).collect();
    let mut kept: Vec<usize> = Vec::new();
    (0..sets.len())
        .map(|i| {
            let duplicate = kept.iter().any(|&k| jaccard(&sets[i], &sets[k]) >= threshold);
            if !duplicate {
                kept.push(i);
            }
            !duplicate
        })
        .collect()
}

/// Groups of examples, shuffled: each an unrelated text of 400–600 words and copies of it with
/// one or two words changed. Any two of a group are ≥ 0.9 similar, two of different groups
/// share nothing, so every pair is clear of a threshold of 0.8 by 0.1 or more.
fn near_groups() -> impl Strategy<Value = Vec<Example>> {
    let base = prop::collection::vec(0u32..1 << 31, 400..600);
    let copies = prop::collection::vec(prop::collection::vec((any::<Index>(), any::<u32>()), 1..=2), 0..4);
    prop::collection::vec((base, copies), 1..6)
        .prop_map(|groups| {
            let mut out = Vec::new();
            for (base, copies) in groups {
                let base = words(&base);
                out.push(text(&base));
                out.extend(copies.iter().map(|c| text(&changed(&base, c))));
            }
            out
        })
        .prop_shuffle()
}

/// Properties whose outcome rests on LSH finding a pair (≥ 99.999% at 0.9 similarity for a
/// threshold of 0.8) run on a fixed seed, so they are the same cases every run and cannot flake.
fn fixed_seed(cases: u32) -> Config {
    Config { cases, rng_seed: RngSeed::Fixed(46), failure_persistence: None, ..Config::default() }
}

proptest! {
    #![proptest_config(fixed_seed(96))]

    #[test]
    fn a_copy_with_a_few_words_changed_is_dropped(
        base in prop::collection::vec(0u32..1 << 31, 200..400),
        changes in prop::collection::vec((any::<Index>(), any::<u32>()), 1..=2),
    ) {
        let base = words(&base);
        let copy = changed(&base, &changes);
        let similarity = jaccard(&shingles(&text(&base)), &shingles(&text(&copy)));
        prop_assert!(similarity >= 0.9, "{similarity}");
        prop_assert_eq!(kept(&[text(&base), text(&copy)], 0.8, 1024), vec![true, false]);
        // And the other way round: the first of the two is the one kept.
        prop_assert_eq!(kept(&[text(&copy), text(&base)], 0.8, 1024), vec![true, false]);
    }

    #[test]
    fn the_kept_set_is_the_brute_force_rule_s_for_any_block_size(
        examples in near_groups(),
        block in 1usize..8,
    ) {
        let want = reference(&examples, 0.8);
        prop_assert_eq!(&kept(&examples, 0.8, block), &want);
        prop_assert_eq!(&kept(&examples, 0.8, examples.len()), &want);
    }
}

proptest! {
    #[test]
    fn a_copy_rewritten_below_the_threshold_is_kept(
        base in prop::collection::vec(0u32..1 << 31, 30..200),
        changes in prop::collection::vec((any::<Index>(), any::<u32>()), 1..60),
        threshold in 0.05f64..=1.0,
    ) {
        let base = words(&base);
        let copy = changed(&base, &changes);
        let similarity = jaccard(&shingles(&text(&base)), &shingles(&text(&copy)));
        let flags = kept(&[text(&base), text(&copy)], threshold, 2);
        if similarity < threshold {
            prop_assert_eq!(flags, vec![true, true], "similarity {} < {}", similarity, threshold);
        }
    }

    #[test]
    fn unrelated_examples_are_kept(
        texts in prop::collection::vec(prop::collection::vec(0u32..1 << 31, 5..80), 1..40),
        threshold in 0.05f64..=1.0,
        block in 1usize..10,
    ) {
        let examples: Vec<Example> = texts.iter().map(|t| text(&words(t))).collect();
        prop_assert!(kept(&examples, threshold, block).into_iter().all(|k| k));
    }

    /// Whatever LSH proposes, an example is only dropped for an earlier kept one at least
    /// `threshold` similar (the exact comparison decides).
    #[test]
    fn every_dropped_example_is_that_similar_to_an_earlier_kept_one(
        bases in prop::collection::vec(prop::collection::vec(0u32..1 << 31, 10..100), 1..5),
        copies in prop::collection::vec((any::<Index>(), prop::collection::vec((any::<Index>(), any::<u32>()), 0..30)), 0..20),
        threshold in 0.3f64..=1.0,
        block in 1usize..10,
    ) {
        let bases: Vec<Vec<String>> = bases.iter().map(|b| words(b)).collect();
        let mut examples: Vec<Example> = bases.iter().map(|b| text(b)).collect();
        examples.extend(copies.iter().map(|(of, c)| text(&changed(&bases[of.index(bases.len())], c))));
        let sets: Vec<Vec<u64>> = examples.iter().map(shingles).collect();
        let flags = kept(&examples, threshold, block);
        for (i, keep) in flags.iter().enumerate() {
            if !keep {
                let reason = (0..i).filter(|&k| flags[k]).map(|k| jaccard(&sets[i], &sets[k])).fold(0.0, f64::max);
                prop_assert!(reason >= threshold, "example {} dropped at similarity {}", i, reason);
            }
        }
    }

    /// At 1.0 exactly the examples whose shingle set is an earlier kept one's go: copies,
    /// copies in other case or spacing; a copy with one word changed or added stays.
    #[test]
    fn threshold_one_drops_only_identical_shingle_sets(
        bases in prop::collection::vec(prop::collection::vec(0u32..1 << 31, 1..40), 1..6),
        variants in prop::collection::vec((any::<Index>(), 0u8..5, any::<Index>()), 0..20),
    ) {
        let bases: Vec<Vec<String>> = bases.iter().map(|b| words(b)).collect();
        let mut examples: Vec<Example> = bases.iter().map(|b| text(b)).collect();
        for (of, how, at) in &variants {
            let base = &bases[of.index(bases.len())];
            let mut w = base.clone();
            let i = at.index(w.len());
            let variant = match how {
                0 => w.join(" "),
                1 => { w[i] = w[i].to_uppercase(); w.join(" ") }
                2 => w.join(" \n\t "),
                3 => { w[i] = word(u32::MAX); w.join(" ") }
                _ => { w.push(word(u32::MAX)); w.join(" ") }
            };
            examples.push(Example::Text(variant));
        }
        let flags = kept(&examples, 1.0, 3);
        prop_assert_eq!(&flags, &reference(&examples, 1.0));
        let sets: Vec<Vec<u64>> = examples.iter().map(shingles).collect();
        for (i, keep) in flags.iter().enumerate() {
            prop_assert_eq!(!keep, (0..i).any(|k| flags[k] && sets[k] == sets[i]), "example {}", i);
        }
    }

    #[test]
    fn shingles_spilled_to_the_file_read_back_as_written(
        sets in prop::collection::vec(prop::collection::vec(any::<u64>(), 0..20), 1..60),
        limit in 1usize..40,
    ) {
        let mut store = ShingleStore::new(limit);
        for s in &sets {
            store.push(s).unwrap();
        }
        let mut scratch = Vec::new();
        for (id, s) in sets.iter().enumerate() {
            prop_assert_eq!(store.count(id as u32), s.len());
            prop_assert_eq!(store.get(id as u32, &mut scratch).unwrap(), s.as_slice());
        }
    }
}

#[test]
fn threshold_zero_keeps_only_the_first_example() {
    let examples: Vec<Example> = (0..5).map(|i| text(&words(&[i * 10, i * 10 + 1]))).collect();
    assert_eq!(kept(&examples, 0.0, 2), vec![true, false, false, false, false]);
}

#[test]
fn bands_and_rows_find_a_pair_at_the_threshold_99_times_in_100() {
    for percent in 4..=100 {
        let t = f64::from(percent) / 100.0;
        let (bands, rows) = bands_and_rows(t);
        assert!(bands * rows <= PERMUTATIONS as usize, "{t}: {bands} × {rows}");
        let missed = (1.0 - t.powi(rows as i32)).powi(bands as i32);
        assert!(missed <= MISS_AT_THRESHOLD, "{t}: {bands} × {rows} misses {missed}");
        // One row more per band (fewer false candidates) cannot reach the bound.
        let more = (1..=PERMUTATIONS as usize / (rows + 1))
            .any(|b| (1.0 - t.powi(rows as i32 + 1)).powi(b as i32) <= MISS_AT_THRESHOLD);
        assert!(!more, "{t}: {} rows would do", rows + 1);
    }
    assert_eq!(bands_and_rows(0.8), (16, 6));
    assert_eq!(bands_and_rows(1.0), (1, 128));
    let p = NearDedupe::new(0.8).params();
    assert_eq!((p.permutations, p.bands, p.rows, p.shingle.as_str()), (96, 16, 6, SHINGLE));
}

/// MinHash's defining property: two sets agree at a permutation with probability equal to their
/// Jaccard similarity. Pairs at similarities from ~0.1 to 1; 128 permutations each.
#[test]
fn signatures_agree_in_proportion_to_the_jaccard_similarity() {
    let near = NearDedupe::new(1.0);
    let base: Vec<String> = (0..300).map(|i| word(i * 7919)).collect();
    let (mut error_sum, pairs) = (0.0, 40u32);
    for k in 0..pairs as usize {
        // The first 7k words rewritten: similarity falls from 1 towards ~0.1.
        let mut other = base.clone();
        for w in other.iter_mut().take(7 * k) {
            *w = format!("{w}x");
        }
        let (a, b) = (shingles(&text(&base)), shingles(&text(&other)));
        let j = jaccard(&a, &b);
        let (sa, sb) = (near.signature(&a), near.signature(&b));
        let agree = sa.iter().zip(&sb).filter(|(x, y)| x == y).count() as f64 / sa.len() as f64;
        assert!((agree - j).abs() < 0.2, "pair {k}: similarity {j}, signatures agree at {agree}");
        error_sum += agree - j;
    }
    assert!((error_sum / f64::from(pairs)).abs() < 0.03, "mean bias {}", error_sum / f64::from(pairs));
}

#[test]
fn shingles_ignore_case_and_spacing_but_not_punctuation() {
    let s = |t: &str| shingles(&Example::Text(t.into()));
    assert_eq!(s("One two THREE four five six"), s("one  two\nthree\tfour five six"));
    assert_ne!(s("one two three four 2+3=5"), s("one two three four 2+3=6"));
    assert_eq!(s("one two three four five six").len(), 2, "two 5-word windows");
    assert_eq!(s("one two").len(), 1, "fewer than five words are one shingle");
    assert_ne!(s("one two"), s("two one"));
    assert!(s(" \n ").is_empty());
    assert_eq!(jaccard(&[], &[]), 1.0, "two empty examples are identical");
}

/// A conversation's text is its tools, roles, reasoning, contents and tool calls, in order:
/// none of the chat template's markup.
#[test]
fn a_conversation_is_shingled_as_its_roles_and_contents() {
    let tool = Json::Object(vec![("name".into(), Json::String("get_weather".into()))]);
    let mut answer = Message::new(Role::Assistant, "Rain in Paris");
    answer.reasoning = Some("look it up".into());
    answer.tool_calls = vec![ToolCall { name: "get_weather".into(), arguments: ToolArguments::Raw("Paris".into()) }];
    let chat = Example::Chat(Conversation {
        messages: vec![Message::new(Role::User, "What is the weather?"), answer],
        tools: vec![tool.clone()],
    });
    let flat = format!(
        "{} user What is the weather? assistant look it up Rain in Paris get_weather Paris",
        tool.to_python_json()
    );
    assert_eq!(shingles(&chat), shingles(&Example::Text(flat)));
}
