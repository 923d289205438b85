//! Checking a recipe costs work linear in its text, whatever the text holds: the property
//! behind "any ≤ 1 MiB recipe validates in under 100 ms". Work is counted, not timed
//! ([`Sink::work`]: nodes and entries the deserializer visits, over every read of the
//! tree), so the bound holds on any machine; one timing check on the worst case known
//! (a megabyte of unknown keys, which took 45 s when recovery read the tree once per error
//! and duplicate keys were found by comparing every pair, and now stops at the node cap)
//! stands beside it.

use proptest::prelude::*;

use super::de::{MAX_KEPT_ERRORS, Sink};
use super::{MAX_NODES, MAX_READS, MAX_RECIPE_BYTES, Recipe};

const BASE: &str = include_str!("../../../recipes/tiny_cpu_lora.yaml");

/// Work of checking `src`, and whether it was valid.
fn work(src: &str) -> (u64, bool) {
    let sink = Sink::default();
    let ok = Recipe::check_counted(src, "x.yaml", &sink).is_ok();
    (sink.work.get(), ok)
}

/// The bound: every visit is of a node or entry, each written with at least one byte, and
/// the tree is read at most [`MAX_READS`] times.
fn bound(src: &str) -> u64 {
    MAX_READS as u64 * (src.len() as u64 + 16)
}

/// Ways to make a recipe big and wrong, each repeated `n` times at some place in it.
fn hostile(kind: u8, n: usize, place: u8) -> String {
    let item = |i: usize| match kind % 8 {
        0 => format!("unk{i:05}: 1\n"),
        1 => format!("k{i}: {{a: [1, 2, {{b: c}}]}}\n"),
        2 => format!("lower_{i}: \"x\"\n"),
        3 => format!("UPPER_{i}: [1]\n"),
        4 => format!("- {i}\n"),
        5 => format!("m{i}:\n  kind: nope\n  x: 1\n"),
        6 => format!("n{i}: {{kind: full, extra_{i}: 1}}\n"),
        _ => format!("deep{i}: {}{}\n", "[".repeat(20), "]".repeat(20)),
    };
    let body: String = (0..n).map(item).collect();
    let indented = |pad: &str| body.lines().map(|l| format!("{pad}{l}\n")).collect::<String>();
    match place % 4 {
        // At the top level.
        0 => format!("{BASE}{body}"),
        // Inside a struct section (unknown fields there).
        1 => BASE.replacen("meta:\n", &format!("meta:\n{}", indented("  ")), 1),
        // Inside the env map (keys checked by rule, values by type).
        2 => format!("{BASE}  env:\n{}", indented("    ")),
        // As a list where a list of strings belongs.
        _ => BASE.replacen("data:\n", &format!("data:\n  paths:\n{}", indented("    ")), 1),
    }
}

#[test]
fn unknown_keys_are_all_counted_in_one_read() {
    // As many as the node cap allows (a key and its value are two nodes).
    let n = MAX_NODES / 2 - 200;
    let src = hostile(0, n, 0);
    let sink = Sink::default();
    let errors = Recipe::check_counted(&src, "x.yaml", &sink).unwrap_err();
    assert_eq!(errors.len() + errors.omitted(), n, "every unknown key counted");
    assert_eq!(errors.len(), MAX_KEPT_ERRORS, "only the first ones listed");
    assert!(errors.to_string().ends_with(&format!("… and {} more problems not listed", n - MAX_KEPT_ERRORS)));
    // One read finds them all; a second would double the work.
    assert!(sink.work.get() < 3 * n as u64, "work {} for {n} keys", sink.work.get());
}

#[test]
fn a_megabyte_of_unknown_keys_stops_at_the_node_cap_in_little_time() {
    let mut src = BASE.to_owned();
    let mut i = 0;
    while src.len() + 13 <= MAX_RECIPE_BYTES as usize {
        src.push_str(&format!("unk{i:05}: 1\n"));
        i += 1;
    }
    assert!(i > 80_000, "{i} keys");
    let t = std::time::Instant::now();
    let errors = Recipe::check_str(&src, "x.yaml").unwrap_err();
    let elapsed = t.elapsed();
    assert_eq!(errors.len(), 1, "{errors}");
    let e = errors.first();
    assert!(e.message().starts_with(&format!("more than {MAX_NODES} keys and values")), "{e}");
    let line = BASE.lines().count() + (MAX_NODES - 200) / 2;
    assert!(e.location().unwrap().line.abs_diff(line) < 200, "{e}");
    // 45 s before (recovery read the tree once per error; duplicate keys were found by
    // comparing every pair); a few ms now, even in a debug build on a busy machine.
    assert!(elapsed.as_millis() < 500, "{elapsed:?}");
}

#[test]
fn work_grows_in_proportion_to_the_text() {
    for kind in 0..8 {
        // Both under the node cap, so the whole text is read.
        let (small_src, big_src) = (hostile(kind, 150, kind), hostile(kind, 1200, kind));
        let ((small, _), (big, _)) = (work(&small_src), work(&big_src));
        let per_byte = |w: u64, s: &str| w as f64 / s.len() as f64;
        let (a, b) = (per_byte(small, &small_src), per_byte(big, &big_src));
        assert!(b <= a * 1.5 + 0.05, "kind {kind}: {a:.3} work/byte at 500 items, {b:.3} at 4000");
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, failure_persistence: None, ..ProptestConfig::default() })]

    /// No recipe, however it is wrong, costs more than the linear bound.
    #[test]
    fn no_recipe_costs_more_than_linear_work(
        parts in prop::collection::vec((any::<u8>(), 1usize..3000, any::<u8>()), 1..4),
    ) {
        let mut src = String::new();
        for (kind, n, place) in parts {
            // Each part is a whole recipe with one hostile block; several concatenated
            // also give duplicate sections (a syntax error) and everything in between.
            src.push_str(&hostile(kind, n, place));
        }
        src.truncate((0..=src.len().min(MAX_RECIPE_BYTES as usize)).rev().find(|&i| src.is_char_boundary(i)).unwrap_or(0));
        let (w, _) = work(&src);
        prop_assert!(w <= bound(&src), "work {} for {} bytes", w, src.len());
    }

    /// The same with the hostile block alone in an otherwise valid recipe, where the
    /// deserializer reaches every part of it.
    #[test]
    fn one_hostile_block_costs_linear_work(kind in any::<u8>(), n in 1usize..8000, place in any::<u8>()) {
        let src = hostile(kind, n, place);
        let (w, _) = work(&src);
        prop_assert!(w <= bound(&src), "work {} for {} bytes", w, src.len());
    }
}
