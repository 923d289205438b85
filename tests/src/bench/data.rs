//! `mindxtrain-bench data`: chat examples per second tokenised and packed from one Parquet file,
//! our data path against Hugging Face `datasets` + a tokenizer `map`, same file, same machine.
//!
//! The file: `rows` generated task conversations (the `messages` layout, tool calls included),
//! written by pyarrow with row groups of 1,000. Both sides render each conversation with the
//! same Jinja template (Qwen3's, `tests/fixtures/chat_templates/qwen3.jinja`), tokenise it with
//! the same `tokenizer.json`, mark the assistant tokens and pack the documents into rows of
//! `seq_len`; the work ends with every packed row in memory.
//!
//! Ours: `Dataset::from_recipe` (read, dedupe, render, tokenise, split) and one epoch of
//! `batches` (packing), on a rayon pool of `threads`. Peer (`bench/data_peer.py`):
//! `datasets.load_dataset("parquet")`, `map(apply_chat_template(..., return_assistant_tokens_mask))`
//! (batched) with `num_proc` 1 and `threads`, then the `group_texts` packing `map` of
//! transformers' examples. Each side's time is its best of `2 × repeats` runs (the peer's
//! alternating `num_proc`), each from fresh state (the peer's `datasets` cache directory is new
//! each run; imports are not timed).

use anyhow::{Context, Result, bail};
use mindxtrain_trainer::data::{DataCursor, DataOptions, Dataset, TaskParams, Tokenizer, generate_jsonl};
use mindxtrain_trainer::recipe::{DataFormat, Recipe};
use mindxtrain_trainer::run::thread_pool;
use serde_json::{Value, json};
use std::path::Path;
use std::process::Command;
use std::time::Instant;

pub struct DataBench<'a> {
    pub rows: u32,
    pub threads: usize,
    pub seq_len: u32,
    pub repeats: usize,
    pub python: &'a Path,
    /// bench/data_peer.py.
    pub script: &'a Path,
    /// Qwen3's chat template (tests/fixtures/chat_templates/qwen3.jinja).
    pub template: &'a Path,
}

/// What one side did: examples, packed rows, tokens in them, seconds.
struct Measured {
    examples: u64,
    tokens: u64,
    rows: u64,
    seconds: f64,
    /// User + system CPU seconds: on a machine shared with other work, the wall clock measures
    /// the neighbours too.
    cpu_seconds: f64,
}

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

fn recipe(seq_len: u32) -> Result<Recipe> {
    let src = format!(
        "meta: {{project: bench, run_name: data, seed: 7}}\nhardware: {{name: cpu, gpus: 0}}\n\
         model:\n  name: bench\n  tokenizer: tok/tokenizer.json\n  chat_template: qwen3.jinja\n  \
         config: {{hidden_size: 64, num_layers: 2, num_heads: 4, num_kv_heads: 2, head_dim: 16, \
         intermediate_size: 128, vocab_size: 512}}\n\
         data:\n  source: hf\n  format: chat\n  paths: [train.parquet]\n  seq_len: {seq_len}\n  packing: true\n  \
         shuffle: false\n  dedupe: {{exact: false}}\n\
         train:\n  method: {{kind: full}}\neval: {{enabled: false, holdout: {{fraction: 0.0}}}}\n"
    );
    Ok(Recipe::from_str(&src, "bench.yaml").map_err(|e| anyhow::anyhow!("bench recipe: {e}"))?.recipe)
}

fn ours(cfg: &DataBench, dir: &Path) -> Result<Measured> {
    let recipe = recipe(cfg.seq_len)?;
    let pool = thread_pool(cfg.threads)?;
    pool.install(|| -> Result<Measured> {
        let (start, cpu) = (Instant::now(), cpu_seconds());
        let tokenizer = Tokenizer::from_recipe(&recipe.model, dir, None)?;
        let data = Dataset::from_recipe(&recipe, dir, &tokenizer, DataOptions::default())?;
        let per_device = 64;
        let rows = data.train_rows_per_epoch();
        let mut batches = data.batches(per_device, DataCursor::default())?;
        for _ in 0..rows.div_ceil(per_device) {
            batches.next_batch()?;
        }
        Ok(Measured {
            examples: data.manifest.read_examples,
            tokens: data.manifest.train_tokens,
            rows: rows as u64,
            seconds: start.elapsed().as_secs_f64(),
            cpu_seconds: cpu_seconds() - cpu,
        })
    })
}

fn peer(cfg: &DataBench, dir: &Path, num_proc: usize) -> Result<(Measured, Value)> {
    let out = Command::new(cfg.python)
        .arg(cfg.script)
        .arg("bench")
        .arg("--dir")
        .arg(dir)
        .args(["--seq-len", &cfg.seq_len.to_string(), "--num-proc", &num_proc.to_string()])
        .output()
        .with_context(|| format!("running {} (set it up with scripts/setup-torch)", cfg.python.display()))?;
    if !out.status.success() {
        bail!("peer failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    let v: Value = serde_json::from_slice(&out.stdout).context("peer output")?;
    let get = |k: &str| v[k].as_f64().with_context(|| format!("peer output has no `{k}`: {v}"));
    Ok((
        Measured {
            examples: get("examples")? as u64,
            tokens: get("tokens")? as u64,
            rows: get("rows")? as u64,
            seconds: get("seconds")?,
            cpu_seconds: get("cpu_seconds")?,
        },
        v,
    ))
}

fn prepare(cfg: &DataBench, dir: &Path) -> Result<()> {
    let text = generate_jsonl(&TaskParams::new(3, cfg.rows), DataFormat::Chat);
    std::fs::write(dir.join("train.jsonl"), text)?;
    let tok = dir.join("tok");
    std::fs::create_dir_all(&tok)?;
    for (name, bytes) in Tokenizer::byte().hf_files(512) {
        std::fs::write(tok.join(name), bytes)?;
    }
    std::fs::copy(cfg.template, dir.join("qwen3.jinja"))
        .with_context(|| format!("copying {}", cfg.template.display()))?;
    let out = Command::new(cfg.python).arg(cfg.script).arg("prepare").arg("--dir").arg(dir).output()?;
    if !out.status.success() {
        bail!("writing the Parquet file failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(())
}

/// The 1-minute load average (Linux), recorded beside the result: a busy machine slows both.
fn load_average() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg").ok()?.split_whitespace().next()?.parse().ok()
}

pub fn run(cfg: &DataBench, as_json: bool) -> Result<()> {
    let dir = tempfile::tempdir()?;
    prepare(cfg, dir.path())?;
    let size = std::fs::metadata(dir.path().join("train.parquet"))?.len();
    println!(
        "chat examples tokenised and packed from Parquet: {} conversations ({:.1} MB), Qwen3's template, \
         seq_len {}, {} threads, best of {}",
        cfg.rows,
        size as f64 / 1e6,
        cfg.seq_len,
        cfg.threads,
        cfg.repeats.max(1) * 2
    );
    let best = |mut f: Box<dyn FnMut() -> Result<(Measured, Value)> + '_>| -> Result<(Measured, Value)> {
        let mut best: Option<(Measured, Value)> = None;
        for _ in 0..cfg.repeats.max(1) * 2 {
            let m = f()?;
            if best.as_ref().is_none_or(|b| m.0.seconds < b.0.seconds) {
                best = Some(m);
            }
        }
        Ok(best.expect("at least one run"))
    };
    let (o, _) = best(Box::new(|| Ok((ours(cfg, dir.path())?, Value::Null))))?;
    // The peer at its best: worker processes cost a start-up that one process may not win back.
    let mut procs = vec![1, cfg.threads.max(1)];
    procs.dedup();
    let mut runs = procs.iter().cycle();
    let (p, meta) = best(Box::new(|| peer(cfg, dir.path(), *runs.next().expect("a cycle never ends"))))?;
    // The same work: every example read, rendered and tokenised to the same tokens (ours ends
    // each document with `<|endoftext|>` when it packs, one token more per example).
    if (o.examples, o.tokens) != (p.examples, p.tokens + p.examples) {
        bail!(
            "the two sides did different work: {} examples, {} tokens vs the peer's {}, {}",
            o.examples,
            o.tokens,
            p.examples,
            p.tokens
        );
    }
    let (ours_eps, peer_eps) = (o.examples as f64 / o.seconds, p.examples as f64 / p.seconds);
    let (ours_cpu, peer_cpu) = (o.examples as f64 / o.cpu_seconds, p.examples as f64 / p.cpu_seconds);
    println!(
        "{:>8} {:>10} {:>12} {:>12} {:>16} {:>12}",
        "", "seconds", "examples/s", "CPU seconds", "examples/CPU-s", "packed rows"
    );
    for (who, m, eps, cpu) in [("ours", &o, ours_eps, ours_cpu), ("peer", &p, peer_eps, peer_cpu)] {
        println!("{who:>8} {:>10.2} {eps:>12.0} {:>12.2} {cpu:>16.0} {:>12}", m.seconds, m.cpu_seconds, m.rows);
    }
    println!("ratio {:.2}× (wall), {:.2}× (CPU)", ours_eps / peer_eps, ours_cpu / peer_cpu);
    if as_json {
        let row = json!({"bench": "data", "examples": o.examples, "parquet_bytes": size, "seq_len": cfg.seq_len,
            "threads": cfg.threads, "ours_seconds": o.seconds, "ours_examples_s": ours_eps, "ours_rows": o.rows, "ours_tokens": o.tokens,
            "peer_seconds": p.seconds, "peer_examples_s": peer_eps, "peer_rows": p.rows, "peer_tokens": p.tokens,
            "ratio": ours_eps / peer_eps, "ours_cpu_seconds": o.cpu_seconds, "peer_cpu_seconds": p.cpu_seconds,
            "cpu_ratio": ours_cpu / peer_cpu, "load_average": load_average(), "peer": meta});
        println!("{row}");
    }
    Ok(())
}
