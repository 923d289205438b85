//! What near dedupe costs (docs/recipes.md, "data"): short examples through [`NearDedupe`] alone,
//! in blocks of 1,024 as the dataset pass hands them over, and through `Dataset::from_recipe`
//! (read, exact dedupe, render, tokenise, split) with and without `near_threshold`.
//!
//! Two corpora of `examples` each: `tasks`, the task generator's conversations (short and
//! templated: many pairs share most of their words, the hard case for LSH's candidates), and
//! `text`, unrelated 20–60-word texts of which every tenth is an earlier one with its last word
//! changed (one shingle of 16–56 differs: similarity ≥ 0.88).
//!
//! ```text
//! cargo run --release -p mindxtrain-trainer --example near_dedupe_bench -- examples=100000 threshold=0.8 threads=2
//! ```
//! Prints one line per measurement and one JSON object per corpus.

use std::collections::{BTreeMap, HashSet};
use std::time::Instant;

use mindxtrain_trainer::data::jsonl::parse_line;
use mindxtrain_trainer::data::{
    DataError, DataOptions, Dataset, Example, NearDedupe, TaskParams, Tokenizer, generate_jsonl,
};
use mindxtrain_trainer::recipe::{DataFormat, Recipe};
use mindxtrain_trainer::run::thread_pool;
use serde_json::json;

type Res<T> = Result<T, Box<dyn std::error::Error>>;

/// This process's user + system CPU seconds so far (every thread).
fn cpu_seconds() -> f64 {
    // SAFETY: getrusage writes the struct it is given and nothing else.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) } != 0 {
        return f64::NAN;
    }
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
    secs(usage.ru_utime) + secs(usage.ru_stime)
}

/// Wall and CPU seconds of `f`.
fn timed<T>(f: impl FnOnce() -> T) -> (T, f64, f64) {
    let (start, cpu) = (Instant::now(), cpu_seconds());
    let out = f();
    (out, start.elapsed().as_secs_f64(), cpu_seconds() - cpu)
}

/// Unrelated texts of 20–60 words from a 50,000-word vocabulary; every tenth repeats an earlier
/// one with its last word changed. A fixed LCG: the same corpus every run.
fn text_corpus(n: usize) -> String {
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut next = move || {
        state = state.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        state >> 33
    };
    let mut texts: Vec<Vec<u64>> = Vec::with_capacity(n);
    for i in 0..n {
        let words = if i % 10 == 9 {
            let mut copy = texts[next() as usize % i].clone();
            if let Some(last) = copy.last_mut() {
                *last = 50_000 + next() % 1000;
            }
            copy
        } else {
            (0..20 + next() % 41).map(|_| next() % 50_000).collect()
        };
        texts.push(words);
    }
    texts
        .iter()
        .map(|t| {
            let words: Vec<String> = t.iter().map(|w| format!("w{w}")).collect();
            format!("{{\"text\":\"{}\"}}\n", words.join(" "))
        })
        .collect()
}

fn recipe(format: &str, near: Option<f64>) -> Res<Recipe> {
    let dedupe = near.map(|t| format!("\n  dedupe: {{near_threshold: {t}}}")).unwrap_or_default();
    let src = format!(
        "meta: {{project: bench, run_name: near, seed: 7}}\nhardware: {{name: cpu, gpus: 0}}\n\
         model:\n  name: bench\n  tokenizer: byte\n  config: {{hidden_size: 64, num_layers: 2, num_heads: 4, \
         num_kv_heads: 2, head_dim: 16, intermediate_size: 128, vocab_size: 512}}\n\
         data:\n  source: jsonl\n  format: {format}\n  paths: [corpus.jsonl]\n  seq_len: 1024{dedupe}\n\
         train:\n  method: {{kind: full}}\neval: {{enabled: false}}\n"
    );
    Ok(Recipe::from_str(&src, "bench.yaml").map_err(|e| e.to_string())?.recipe)
}

fn main() -> Res<()> {
    let args: BTreeMap<String, String> =
        std::env::args().skip(1).filter_map(|a| a.split_once('=').map(|(k, v)| (k.into(), v.into()))).collect();
    let num = |k: &str, d: f64| args.get(k).and_then(|v| v.parse().ok()).unwrap_or(d);
    let n = num("examples", 100_000.0) as usize;
    let threshold = num("threshold", 0.8);
    let threads = num("threads", 2.0) as usize;
    let pool = thread_pool(threads)?;
    let dir = tempfile::tempdir()?;
    let corpora = [
        ("tasks", DataFormat::Chat, "chat", generate_jsonl(&TaskParams::new(3, n as u32), DataFormat::Chat)),
        ("text", DataFormat::Text, "text", text_corpus(n)),
    ];
    for (name, format, format_name, jsonl) in corpora {
        // The examples as the pass hands them to near dedupe: parsed, exact duplicates out.
        let mut seen = HashSet::new();
        let examples: Vec<Example> = jsonl
            .lines()
            .filter_map(|l| parse_line(l.as_bytes(), format).ok().flatten())
            .filter(|e| seen.insert(e.digest()))
            .collect();
        let mut near = NearDedupe::new(threshold);
        let (kept, alone, alone_cpu) = timed(|| {
            pool.install(|| -> Result<usize, DataError> {
                let mut kept = 0;
                for block in examples.chunks(1024) {
                    kept += near.filter(&block.iter().collect::<Vec<_>>())?.into_iter().filter(|k| *k).count();
                }
                Ok(kept)
            })
        });
        let kept = kept?;
        let p = near.params();
        println!(
            "{name}: {} examples (after exact dedupe), threshold {threshold} ({} bands × {} rows): {} near duplicates \
             removed in {alone:.2} s, {alone_cpu:.2} CPU s ({:.0} examples/CPU-s, {threads} threads)",
            examples.len(),
            p.bands,
            p.rows,
            near.removed(),
            examples.len() as f64 / alone_cpu
        );
        drop(near);

        std::fs::write(dir.path().join("corpus.jsonl"), &jsonl)?;
        let tokenizer = Tokenizer::byte();
        let mut pipeline = Vec::new();
        for with in [None, Some(threshold)] {
            let recipe = recipe(format_name, with)?;
            let (data, wall, cpu) = timed(|| {
                pool.install(|| Dataset::from_recipe(&recipe, dir.path(), &tokenizer, DataOptions::default()))
            });
            pipeline.push((wall, cpu, data?.manifest.train_examples));
        }
        let [(wall, cpu, without), (near_wall, near_cpu, with)] = pipeline[..] else { unreachable!("two runs") };
        println!(
            "{name}: Dataset::from_recipe {wall:.2} s, {cpu:.2} CPU s without near dedupe ({without} examples); \
             {near_wall:.2} s, {near_cpu:.2} CPU s with ({with} examples)"
        );
        let row = json!({"bench": "near_dedupe", "corpus": name, "examples": examples.len(), "threshold": threshold,
            "bands": p.bands, "rows": p.rows, "kept": kept, "threads": threads, "near_dedupe_seconds": alone,
            "near_dedupe_cpu_seconds": alone_cpu, "pipeline_seconds_without": wall, "pipeline_cpu_seconds_without": cpu,
            "pipeline_seconds_with": near_wall, "pipeline_cpu_seconds_with": near_cpu,
            "train_examples_without": without, "train_examples_with": with});
        println!("{row}");
    }
    Ok(())
}
