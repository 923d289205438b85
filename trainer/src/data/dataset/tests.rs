use std::path::Path;

use super::*;
use crate::batch::IGNORE;

fn recipe(data_yaml: &str, eval_yaml: &str) -> Recipe {
    recipe_with_method(data_yaml, eval_yaml, "{kind: lora, r: 8}")
}

fn recipe_with_method(data_yaml: &str, eval_yaml: &str, method: &str) -> Recipe {
    let src = format!(
        "meta: {{project: p, run_name: r, seed: 7}}\nhardware: {{name: cpu, gpus: 0}}\n\
         model:\n  name: tiny\n  tokenizer: byte\n  config: {{hidden_size: 64, num_layers: 2, num_heads: 4, \
         num_kv_heads: 2, head_dim: 16, intermediate_size: 128, vocab_size: 512}}\n\
         data:\n{data_yaml}\ntrain:\n  method: {method}\n{eval_yaml}"
    );
    Recipe::from_str(&src, "test.yaml").unwrap().recipe
}

fn tiny_demo() -> Recipe {
    let manifest_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let path = manifest_dir
        .ancestors()
        .map(|dir| dir.join("recipes/tiny_cpu_lora.yaml"))
        .find(|p| p.exists())
        .expect("recipes/tiny_cpu_lora.yaml above the crate");
    Recipe::from_path(&path).unwrap().recipe
}

#[test]
fn the_demo_recipe_builds_its_generated_dataset() {
    let t = Tokenizer::byte();
    let ds = Dataset::from_recipe(&tiny_demo(), Path::new("."), &t, DataOptions::default()).unwrap();
    let m = &ds.manifest;
    assert_eq!(m.read_examples, 4000);
    assert_eq!(m.files.len(), 1);
    assert_eq!(m.files[0].path, "generated:tasks");
    assert_eq!(m.generator.as_ref().unwrap().seed, 7);
    assert!(m.duplicates_removed > 0 && m.duplicates_removed < 1000, "{}", m.duplicates_removed);
    let kept = m.read_examples - m.duplicates_removed;
    assert_eq!(m.holdout_examples, (kept as f64 * 0.05).floor() as u64, "fraction 0.05 (under the 200 cap)");
    assert_eq!(m.train_examples + m.holdout_examples + m.duplicates_removed, 4000);
    assert_eq!(m.truncated, 0, "generated tasks fit seq_len 128");
    assert!(m.train_target_tokens > 0 && m.train_target_tokens < m.train_tokens);
    assert_eq!(ds.train_len() as u64, m.train_examples);

    // The same recipe gives the same manifest, digest included.
    let again = Dataset::from_recipe(&tiny_demo(), Path::new("."), &t, DataOptions::default()).unwrap();
    assert_eq!(again.manifest.digest(), m.digest());
    assert_eq!(m.to_json()["blake3"], m.digest());

    let batch = ds.batches(8, DataCursor::default()).unwrap().next_batch().unwrap();
    assert_eq!((batch.batch, batch.seq_len), (8, 128));
    assert!(batch.input_ids.iter().all(|&id| (id as usize) < t.vocab_size()));
    // Packing fills rows: well over one example per row (8 rows).
    let docs_in_batch =
        batch.position_ids.iter().filter(|&&p| p == 0).count() - batch.segment_ids.iter().filter(|&&s| s == 0).count();
    assert!(docs_in_batch >= 10, "{docs_in_batch}");
}

#[test]
fn resumed_dataset_stream_is_identical() {
    let t = Tokenizer::byte();
    let ds = Dataset::from_recipe(&tiny_demo(), Path::new("."), &t, DataOptions::default()).unwrap();
    let mut it = ds.batches(8, DataCursor::default()).unwrap();
    // Into the second epoch and a bit further.
    let mut steps = 0;
    while it.cursor().epoch == 0 && steps < 10_000 {
        it.next_batch().unwrap();
        steps += 1;
    }
    for _ in 0..3 {
        it.next_batch().unwrap();
    }
    let cursor = it.cursor();
    assert!(cursor.epoch >= 1, "{cursor:?}");
    let want: Vec<_> = (0..4).map(|_| it.next_batch().unwrap()).collect();
    let ds2 = Dataset::from_recipe(&tiny_demo(), Path::new("."), &t, DataOptions::default()).unwrap();
    let mut again = ds2.batches(8, cursor).unwrap();
    let got: Vec<_> = (0..4).map(|_| again.next_batch().unwrap()).collect();
    assert_eq!(got, want);
}

#[test]
fn holdout_prompts_end_at_the_answer_and_references_score() {
    let t = Tokenizer::byte();
    let ds = Dataset::from_recipe(&tiny_demo(), Path::new("."), &t, DataOptions::default()).unwrap();
    let items = ds.holdout_prompts(&t).unwrap();
    assert_eq!(items.len() as u64, ds.manifest.holdout_examples);
    for item in &items {
        let text = t.decode(&item.prompt_ids, false).unwrap();
        assert!(text.ends_with("<|im_start|>assistant\n"), "{text}");
        assert!(crate::data::score::answers_match(&item.reference, &item.reference));
    }
    let held = ds.holdout_batches(8).unwrap();
    assert!(held.iter().map(|b| b.target_tokens()).sum::<usize>() > 0);
}

#[test]
fn generated_text_mode_learns_every_token() {
    let r = recipe(
        "  source: generated\n  format: text\n  generator: {kind: tasks, seed: 3, count: 200}\n  seq_len: 128\n  packing: false",
        "",
    );
    let t = Tokenizer::byte();
    let ds = Dataset::from_recipe(&r, Path::new("."), &t, DataOptions::default()).unwrap();
    let b = ds.batches(4, DataCursor::default()).unwrap().next_batch().unwrap();
    for row in 0..4 {
        let at = |i| row * 128 + i;
        let len = (0..128).filter(|&i| b.segment_ids[at(i)] == 1).count();
        // Every token but the last predicts its successor (ending in eos).
        assert!((0..len - 1).all(|i| b.labels[at(i)] != IGNORE));
        assert_eq!(b.labels[at(len - 2)], i64::from(t.eos_id()));
        assert_eq!(b.input_ids[at(0)], t.im_start_id().unwrap());
    }
    assert!(!ds.holdout_prompts(&t).unwrap().is_empty(), "the pre-training holdout can still be scored");
}

#[test]
fn generated_preference_pairs_mask_the_prompt() {
    let data =
        "  source: generated\n  format: preference\n  generator: {kind: tasks, seed: 3, count: 100}\n  seq_len: 128";
    let r = recipe_with_method(data, "", "{kind: dpo}");
    let t = Tokenizer::byte();
    let ds = Dataset::from_recipe(&r, Path::new("."), &t, DataOptions::default()).unwrap();
    assert!(ds.is_preference());
    assert!(ds.batches(2, DataCursor::default()).is_err());
    let b = ds.preference_batches(2, DataCursor::default()).unwrap().next_batch().unwrap();
    for side in [&b.chosen, &b.rejected] {
        let learned: Vec<u32> = side.labels[..128].iter().filter(|&&l| l != IGNORE).map(|&l| l as u32).collect();
        let text = t.decode(&learned, false).unwrap();
        assert!(text.ends_with("<|im_end|>") && !text.contains("user"), "{text}");
    }
    assert_ne!(b.chosen, b.rejected);
}

#[test]
fn jsonl_files_are_hashed_deduped_and_bad_lines_named() {
    let dir = tempfile::tempdir().unwrap();
    let good = r#"{"instruction":"Say hi","output":"hi"}"#;
    let other = r#"{"instruction":"Say yo","output":"yo"}"#;
    std::fs::write(dir.path().join("a.jsonl"), format!("{good}\n{other}\n{good}\n")).unwrap();
    std::fs::write(dir.path().join("b.jsonl"), format!("{good}\n{{\"instruction\": 1}}\n")).unwrap();
    let data = "  source: jsonl\n  format: instruction\n  paths: [a.jsonl, b.jsonl]\n  seq_len: 64";
    let r = recipe(data, "eval: {enabled: false}");
    let t = Tokenizer::byte();

    let err = Dataset::from_recipe(&r, dir.path(), &t, DataOptions::default()).unwrap_err();
    assert_eq!(err.to_string(), "b.jsonl:2: instruction: expected a string, found a number");

    let ds =
        Dataset::from_recipe(&r, dir.path(), &t, DataOptions { skip_bad: true, ..DataOptions::default() }).unwrap();
    let m = &ds.manifest;
    assert_eq!((m.read_examples, m.duplicates_removed, m.skipped_lines, m.train_examples), (4, 2, 1, 2));
    assert_eq!(m.skipped[0].path, "b.jsonl");
    assert_eq!(m.skipped[0].line, 2);
    let a_bytes = std::fs::read(dir.path().join("a.jsonl")).unwrap();
    assert_eq!(m.files[0].blake3, blake3::hash(&a_bytes).to_hex().to_string());

    let digest = m.digest();
    std::fs::write(dir.path().join("a.jsonl"), format!("{good}\n{other}\n")).unwrap();
    let changed =
        Dataset::from_recipe(&r, dir.path(), &t, DataOptions { skip_bad: true, ..DataOptions::default() }).unwrap();
    assert_ne!(changed.manifest.digest(), digest, "any input change changes the digest");
}

#[test]
fn long_examples_are_cut_and_prompt_only_rows_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let long_answer = format!(r#"{{"instruction":"x","output":"{}"}}"#, "a".repeat(100));
    let long_prompt = format!(r#"{{"instruction":"{}","output":"b"}}"#, "q".repeat(100));
    std::fs::write(dir.path().join("d.jsonl"), format!("{long_answer}\n{long_prompt}\n")).unwrap();
    let r =
        recipe("  source: jsonl\n  format: instruction\n  paths: [d.jsonl]\n  seq_len: 64", "eval: {enabled: false}");
    let ds = Dataset::from_recipe(&r, dir.path(), &Tokenizer::byte(), DataOptions::default()).unwrap();
    assert_eq!(ds.manifest.truncated, 2);
    assert_eq!(ds.manifest.dropped_no_target, 1);
    assert_eq!(ds.manifest.train_examples, 1);
    assert_eq!(ds.manifest.train_tokens, 64);
}

#[test]
fn recipe_problems_are_config_errors() {
    let t = Tokenizer::byte();
    // The recipe checker refuses this too; the data layer must not rely on it.
    let mut no_paths = recipe("  source: jsonl\n  format: chat\n  paths: [x.jsonl]\n  seq_len: 64", "");
    no_paths.data.paths.clear();
    assert!(matches!(
        Dataset::from_recipe(&no_paths, Path::new("."), &t, DataOptions::default()),
        Err(DataError::Config(_))
    ));
    let mut near = recipe(
        "  source: generated\n  generator: {kind: tasks, seed: 1, count: 10}\n  dedupe: {near_threshold: 0.8}",
        "",
    );
    near.data.dedupe.near_threshold = Some(1.5);
    let err = Dataset::from_recipe(&near, Path::new("."), &t, DataOptions::default()).unwrap_err();
    assert!(matches!(err, DataError::Config(_)) && err.to_string().contains("near_threshold"), "{err}");
}

#[test]
fn max_samples_caps_after_dedupe() {
    let r = recipe(
        "  source: generated\n  format: chat\n  generator: {kind: tasks, seed: 3, count: 500}\n  max_samples: 100\n  seq_len: 128",
        "eval: {holdout: {fraction: 0.1}}",
    );
    let ds = Dataset::from_recipe(&r, Path::new("."), &Tokenizer::byte(), DataOptions::default()).unwrap();
    let m = &ds.manifest;
    assert_eq!(m.train_examples + m.holdout_examples, 100);
    assert_eq!(m.holdout_examples, 10);
    assert_eq!(m.over_max_samples, 500 - m.duplicates_removed - 100);
}

/// `n` unrelated instruction records of 100 words, then a copy of each of the first `copies`
/// with one word changed (Jaccard similarity ~0.9 to its original), then one exact copy.
fn near_duplicate_lines(n: usize, copies: usize) -> Vec<String> {
    let line = |i: usize, changed: bool| {
        let words: Vec<String> = (0..100)
            .map(|j| if changed && j == 50 { "changed".to_owned() } else { format!("w{}", i * 1000 + j) })
            .collect();
        format!(r#"{{"instruction":"{}","output":"answer {i}"}}"#, words.join(" "))
    };
    let mut lines: Vec<String> = (0..n).map(|i| line(i, false)).collect();
    lines.extend((0..copies).map(|i| line(i, true)));
    lines.push(line(n - 1, false));
    lines
}

#[test]
fn near_dedupe_drops_before_the_split_and_the_manifest_says_so() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("near.jsonl"), near_duplicate_lines(10, 4).join("\n")).unwrap();
    let data = |dedupe: &str| {
        format!("  source: jsonl\n  format: instruction\n  paths: [near.jsonl]\n  seq_len: 1024{dedupe}")
    };
    let t = Tokenizer::byte();
    let eval = "eval: {holdout: {fraction: 0.2}}";

    let near = Dataset::from_recipe(
        &recipe(&data("\n  dedupe: {near_threshold: 0.8}"), eval),
        dir.path(),
        &t,
        DataOptions::default(),
    )
    .unwrap();
    let m = &near.manifest;
    assert_eq!((m.read_examples, m.duplicates_removed, m.near_duplicates_removed), (15, 1, Some(4)));
    assert_eq!((m.train_examples, m.holdout_examples), (8, 2), "the split is of the 10 left");
    let params = m.near_dedupe.as_ref().unwrap();
    assert_eq!((params.threshold, params.bands, params.rows, params.permutations), (0.8, 16, 6, 96));
    let json = m.to_json();
    assert_eq!(json["manifest"]["near_duplicates_removed"], 4);
    assert_eq!(json["manifest"]["near_dedupe"]["shingle"], crate::data::near_dedupe::SHINGLE);

    let exact = Dataset::from_recipe(&recipe(&data(""), eval), dir.path(), &t, DataOptions::default()).unwrap();
    let m = &exact.manifest;
    assert_eq!((m.duplicates_removed, m.train_examples + m.holdout_examples), (1, 14));
    let json = m.to_json();
    assert!(json["manifest"].get("near_duplicates_removed").is_none() && json["manifest"].get("near_dedupe").is_none());
}

/// Blocks are cut at file ends (and every 1,024 lines): the same lines as one file or as three
/// keep the same examples.
#[test]
fn near_dedupe_keeps_the_same_examples_however_the_files_are_cut() {
    let dir = tempfile::tempdir().unwrap();
    let lines = near_duplicate_lines(12, 6);
    std::fs::write(dir.path().join("all.jsonl"), lines.join("\n")).unwrap();
    for (name, part) in [("a.jsonl", &lines[..5]), ("b.jsonl", &lines[5..13]), ("c.jsonl", &lines[13..])] {
        std::fs::write(dir.path().join(name), part.join("\n")).unwrap();
    }
    let t = Tokenizer::byte();
    let examples = |paths: &str| {
        let data = format!(
            "  source: jsonl\n  format: instruction\n  paths: [{paths}]\n  seq_len: 1024\n  dedupe: {{near_threshold: 0.8}}"
        );
        let ds = Dataset::from_recipe(
            &recipe(&data, "eval: {holdout: {fraction: 0.25}}"),
            dir.path(),
            &t,
            DataOptions::default(),
        )
        .unwrap();
        assert_eq!(ds.manifest.near_duplicates_removed, Some(6));
        let train: Vec<Example> = (0..ds.train_len()).map(|i| ds.store.example(Part::Train, i).unwrap()).collect();
        let holdout: Vec<Example> = (0..ds.holdout_len()).map(|i| ds.holdout_example(i).unwrap()).collect();
        (train, holdout)
    };
    assert_eq!(examples("all.jsonl"), examples("a.jsonl, b.jsonl, c.jsonl"));
}

/// The recipe's threshold reaches the run: the same JSONL trains on fewer examples (one step
/// each here) with `near_threshold: 0.8` than without, and the run's dataset.json says why.
#[test]
fn near_duplicates_are_dropped_at_the_recipe_s_threshold() {
    use crate::plan::{Choices, Plan};
    use crate::run::{Quiet, RunSpec};

    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("near.jsonl"), near_duplicate_lines(6, 3).join("\n")).unwrap();
    let train = |dedupe: &str, name: &str| {
        let src = format!(
            "meta: {{project: near, run_name: {name}, seed: 5}}\nhardware: {{name: cpu, gpus: 0}}\n\
             model:\n  name: near-micro\n  family: qwen3\n  tokenizer: byte\n  dtype: fp32\n  random_init: true\n  \
             config: {{hidden_size: 32, num_layers: 1, num_heads: 2, num_kv_heads: 1, head_dim: 16, \
             intermediate_size: 64, vocab_size: 512, max_position_embeddings: 1024, tie_word_embeddings: true}}\n\
             data:\n  source: jsonl\n  format: instruction\n  paths: [near.jsonl]\n  seq_len: 1024\n  packing: false\n{dedupe}\
             train:\n  method: {{kind: lora, r: 4, alpha: 8}}\n  budget: {{epochs: 1}}\n  batch: {{per_device: 1}}\n  \
             precision: fp32\n\
             eval: {{enabled: false}}\nserve: {{max_model_len: 1024}}\n"
        );
        let loaded = Recipe::from_str(&src, "near.yaml").unwrap_or_else(|e| panic!("{e}"));
        let plan = Plan::new(loaded.bytes_blake3, "cpu", Choices::unmeasured(1), vec![], 0, 0, false);
        let out = dir.path().join(name);
        let summary =
            crate::run::train(&RunSpec::new(loaded, dir.path(), plan, &out), &mut crate::events::Discard, &mut Quiet)
                .unwrap_or_else(|e| panic!("{e}"));
        let written: serde_json::Value =
            serde_json::from_slice(&std::fs::read(out.join("dataset.json")).unwrap()).unwrap();
        (summary, written)
    };
    let (all, all_json) = train("", "without");
    let (near, near_json) = train("  dedupe: {near_threshold: 0.8}\n", "near");
    assert_eq!((all.dataset.train_examples, all.steps), (9, 9), "one exact copy removed, one example per step");
    assert_eq!((near.dataset.train_examples, near.steps), (6, 6), "the three changed copies are dropped too");
    assert!(near.tokens < all.tokens);
    assert_eq!(near_json["manifest"]["near_duplicates_removed"], 3);
    assert_eq!(near_json["manifest"]["near_dedupe"]["threshold"], 0.8);
    assert!(all_json["manifest"].get("near_duplicates_removed").is_none());
    assert_ne!(all.dataset_digest, near.dataset_digest);
}
