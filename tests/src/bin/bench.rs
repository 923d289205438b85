//! `mindxtrain-bench`: performance programs that measure us and a peer in one run and
//! print the ratio. Results go to docs/benchmarks.md by hand, with date and machine.
//!
//! ```text
//! mindxtrain-bench log [--seconds 3] [--appenders 1,16,256] [--dir DIR] [--stages] [--signers N]
//! mindxtrain-bench train [--threads 1,2] [--steps 30] [--full] [--python target/pyenv/bin/python]
//! mindxtrain-bench data [--rows 20000] [--threads 2] [--seq-len 512] [--python target/pyenv/bin/python]
//! ```
//! `log`: durable appends per second (acknowledged only after fdatasync) at several
//! numbers of concurrent appenders, against SQLite (WAL, synchronous=FULL, one row
//! per event, one transaction per event, the same canonical payload bytes).
//! `train`: CPU training steps/s of our engine vs PyTorch + transformers + PEFT, same tiny
//! Qwen3 shape and thread count (see `mindxtrain_tests::bench::train`).
//! `data`: chat examples/s tokenised and packed from one Parquet file vs `datasets` + a
//! tokenizer `map` (see `mindxtrain_tests::bench::data`).

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use mindxtrain_node::identity::Identity;
use mindxtrain_node::log::{AppendRequest, EventLog, LogOptions, WriterTimes};
use mindxtrain_tests::bench::{data, train};
use serde_json::json;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[derive(Parser)]
#[command(about = "mindxtrain benchmark programs (ours vs a peer, same run)")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Durable event appends/s vs SQLite (WAL, synchronous=FULL).
    Log {
        /// Seconds per measurement.
        #[arg(long, default_value_t = 3.0)]
        seconds: f64,
        /// Comma-separated appender counts.
        #[arg(long, default_value = "1,16,256", value_delimiter = ',')]
        appenders: Vec<usize>,
        /// Directory on the disk to measure (default: a temp dir under the current dir).
        #[arg(long)]
        dir: Option<PathBuf>,
        /// Print the table as JSON too.
        #[arg(long)]
        json: bool,
        /// Also print where our writer threads spent the time (tasks run).
        #[arg(long)]
        stages: bool,
        /// Signer threads of our log (0: the log's default, one per CPU).
        #[arg(long, default_value_t = 0)]
        signers: usize,
    },
    /// CPU training steps/s vs PyTorch + PEFT (same shape, same threads).
    Train {
        /// Comma-separated thread counts.
        #[arg(long, default_value = "1,2", value_delimiter = ',')]
        threads: Vec<usize>,
        #[arg(long, default_value_t = 30)]
        steps: usize,
        #[arg(long, default_value_t = 3)]
        warmup: usize,
        #[arg(long, default_value_t = 8)]
        batch: usize,
        #[arg(long, default_value_t = 128)]
        seq: usize,
        /// Train every weight instead of LoRA adapters.
        #[arg(long)]
        full: bool,
        /// The Python of the torch venv (scripts/setup-torch builds it).
        #[arg(long, default_value = "target/pyenv/bin/python")]
        python: PathBuf,
        /// The peer's script (run from the repository root, the default works).
        #[arg(long, default_value = "tests/python/qwen3_tiny.py")]
        script: PathBuf,
        #[arg(long)]
        json: bool,
    },
    /// Chat examples/s tokenised and packed from Parquet vs `datasets` + a tokenizer `map`.
    Data {
        /// Conversations in the Parquet file.
        #[arg(long, default_value_t = 20_000)]
        rows: u32,
        /// Our rayon threads and the peer's `num_proc`.
        #[arg(long, default_value_t = 2)]
        threads: usize,
        #[arg(long, default_value_t = 512)]
        seq_len: u32,
        /// Runs per side; the fastest counts.
        #[arg(long, default_value_t = 2)]
        repeats: usize,
        /// The Python of the torch venv (scripts/setup-torch builds it).
        #[arg(long, default_value = "target/pyenv/bin/python")]
        python: PathBuf,
        /// The peer's script (run from the repository root, the defaults work).
        #[arg(long, default_value = "bench/data_peer.py")]
        script: PathBuf,
        #[arg(long, default_value = "tests/fixtures/chat_templates/qwen3.jinja")]
        template: PathBuf,
        /// Also print the result as one JSON line (for bench/results/data.jsonl).
        #[arg(long)]
        json: bool,
    },
}

fn main() -> Result<()> {
    mindxtrain_node::training::keep_freed_memory();
    match Cli::parse().cmd {
        Cmd::Log { seconds, appenders, dir, json, stages, signers } => {
            let opts = LogOptions { signers, ..LogOptions::default() };
            bench_log(seconds, &appenders, dir, json, stages, &opts)
        }
        Cmd::Train { threads, steps, warmup, batch, seq, full, python, script, json } => {
            let cfg = train::TrainBench {
                threads: &threads,
                steps,
                warmup,
                batch,
                seq,
                full,
                python: &python,
                script: &script,
            };
            train::run(&cfg, json)
        }
        Cmd::Data { rows, threads, seq_len, repeats, python, script, template, json } => {
            let cfg = data::DataBench {
                rows,
                threads,
                seq_len,
                repeats,
                python: &python,
                script: &script,
                template: &template,
            };
            data::run(&cfg, json)
        }
    }
}

/// The payload every appender writes: a realistic training-progress event.
fn payload(i: u64) -> serde_json::Value {
    json!({"run_id": "run-bench", "step": i, "loss": 2.3456 - (i as f64) * 1e-6, "lr": 0.0001, "tok_s": 12345.6})
}

fn bench_log(
    seconds: f64,
    appenders: &[usize],
    dir: Option<PathBuf>,
    as_json: bool,
    stages: bool,
    opts: &LogOptions,
) -> Result<()> {
    let base = match dir {
        Some(d) => d,
        None => std::env::current_dir()?,
    };
    let dur = Duration::from_secs_f64(seconds);
    println!("durable appends/s, {seconds}s per cell, disk under {}", base.display());
    println!("ours: appenders as tokio tasks (how the node's HTTP handlers append) and as OS threads");
    println!(
        "{:>10} {:>14} {:>14} {:>14} {:>8} {:>12}",
        "appenders", "ours tasks/s", "ours threads/s", "sqlite/s", "ratio", "events/sync"
    );
    let mut rows = Vec::new();
    let mut stage_lines = Vec::new();
    for &n in appenders {
        let (tasks, per_sync, times) = run_ours_async(&base, n, dur, opts)?;
        stage_lines.push(stage_line(n, &times));
        let (threads, _) = run_ours(&base, n, dur, opts)?;
        let theirs = run_sqlite(&base, n, dur)?;
        let ratio = tasks / theirs.max(1e-9);
        println!("{n:>10} {tasks:>14.0} {threads:>14.0} {theirs:>14.0} {ratio:>7.1}x {per_sync:>12.1}");
        rows.push(json!({"appenders": n, "ours_tasks_per_s": tasks, "ours_threads_per_s": threads, "sqlite_per_s": theirs, "ratio": ratio, "events_per_sync": per_sync}));
    }
    if stages {
        println!("where the writer threads spent the tasks run (busy = share of the measured time):");
        for l in &stage_lines {
            println!("{l}");
        }
    }
    if as_json {
        println!("{}", serde_json::to_string_pretty(&rows)?);
    }
    Ok(())
}

/// The writer's stage times over a measured run, as the share of wall time each thread
/// was busy and the cost per event (or per sync).
fn stage_line(n: usize, t: &StageTimes) -> String {
    let (w, d) = (&t.times, t.elapsed.as_nanos().max(1) as f64);
    let per_event = |ns: u64| ns as f64 / 1e3 / t.events.max(1) as f64;
    format!(
        "{n:>10} appenders: sequencer busy {:>3.0}% (sequence {:.2} + sign {:.2} + write {:.2} µs/event), \
         signers {:.1} µs/event, syncer busy {:>3.0}% (fdatasync {:.0} µs/sync, ack {:.2} µs/event), \
         {:.0} events/write, process CPU {:.1} of {} cores",
        (w.sequence_ns + w.sign_ns + w.write_ns) as f64 / d * 100.0,
        per_event(w.sequence_ns),
        per_event(w.sign_ns),
        per_event(w.write_ns),
        per_event(w.signers_ns),
        (w.sync_ns + w.ack_ns) as f64 / d * 100.0,
        w.sync_ns as f64 / 1e3 / t.syncs.max(1) as f64,
        per_event(w.ack_ns),
        t.events as f64 / w.batches.max(1) as f64,
        t.cpu_seconds / t.elapsed.as_secs_f64(),
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
    )
}

/// Writer stage times over the measured part of a run.
struct StageTimes {
    times: WriterTimes,
    events: u64,
    syncs: u64,
    elapsed: Duration,
    /// User + system CPU time of the whole process over the run.
    cpu_seconds: f64,
}

/// User + system CPU seconds this process has used (Linux `/proc/self/stat`, in clock
/// ticks of 1/100 s); 0 where that cannot be read.
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the command name, which is in parentheses and may hold spaces.
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let f: Vec<f64> = rest.split_whitespace().map(|x| x.parse().unwrap_or(0.0)).collect();
    // utime and stime are fields 14 and 15 of the line, 12 and 13 after the name.
    (f.get(11).copied().unwrap_or(0.0) + f.get(12).copied().unwrap_or(0.0)) / 100.0
}

/// Runs `n` appender threads calling `op(thread, i)` until the time is up; returns
/// completed operations per second (measured after a short warm-up).
fn drive(n: usize, dur: Duration, op: impl Fn(usize, u64) -> Result<()> + Send + Sync + 'static) -> Result<f64> {
    let op = Arc::new(op);
    let stop = Arc::new(AtomicBool::new(false));
    let count = Arc::new(AtomicU64::new(0));
    let warm = Arc::new(AtomicBool::new(false));
    let threads: Vec<_> = (0..n)
        .map(|t| {
            let (op, stop, count, warm) = (op.clone(), stop.clone(), count.clone(), warm.clone());
            std::thread::spawn(move || -> Result<()> {
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    op(t, i)?;
                    i += 1;
                    if warm.load(Ordering::Relaxed) {
                        count.fetch_add(1, Ordering::Relaxed);
                    }
                }
                Ok(())
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    warm.store(true, Ordering::Relaxed);
    let t0 = Instant::now();
    std::thread::sleep(dur);
    let done = count.load(Ordering::Relaxed);
    let elapsed = t0.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        t.join().map_err(|_| anyhow::anyhow!("appender panicked"))??;
    }
    Ok(done as f64 / elapsed)
}

fn run_ours(base: &Path, n: usize, dur: Duration, opts: &LogOptions) -> Result<(f64, f64)> {
    let tmp = tempfile::Builder::new().prefix("bench-log-").tempdir_in(base)?;
    let (log, _) = EventLog::create(tmp.path(), Identity::from_seed([7; 32]), opts.clone())?;
    let log = Arc::new(log);
    let l2 = log.clone();
    let before = log.stats();
    let rate = drive(n, dur, move |t, i| {
        l2.append(AppendRequest::new("train.progress", format!("t{t}"), payload(i)))?;
        Ok(())
    })?;
    let after = log.stats();
    let per_sync = (after.events - before.events) as f64 / (after.syncs - before.syncs).max(1) as f64;
    Ok((rate, per_sync))
}

/// Same measurement with `n` tokio tasks on a runtime of one worker per core.
fn run_ours_async(base: &Path, n: usize, dur: Duration, opts: &LogOptions) -> Result<(f64, f64, StageTimes)> {
    let tmp = tempfile::Builder::new().prefix("bench-log-").tempdir_in(base)?;
    let (log, _) = EventLog::create(tmp.path(), Identity::from_seed([7; 32]), opts.clone())?;
    let log = Arc::new(log);
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let stop = Arc::new(AtomicBool::new(false));
    let count = Arc::new(AtomicU64::new(0));
    let warm = Arc::new(AtomicBool::new(false));
    let tasks: Vec<_> = (0..n)
        .map(|t| {
            let (log, stop, count, warm) = (log.clone(), stop.clone(), count.clone(), warm.clone());
            rt.spawn(async move {
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    log.append_async(AppendRequest::new("train.progress", format!("t{t}"), payload(i))).await?;
                    i += 1;
                    if warm.load(Ordering::Relaxed) {
                        count.fetch_add(1, Ordering::Relaxed);
                    }
                }
                anyhow::Ok(())
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    warm.store(true, Ordering::Relaxed);
    let before = log.stats();
    let cpu0 = cpu_seconds();
    let t0 = Instant::now();
    std::thread::sleep(dur);
    let done = count.load(Ordering::Relaxed);
    let elapsed = t0.elapsed().as_secs_f64();
    let after = log.stats();
    let cpu = cpu_seconds() - cpu0;
    stop.store(true, Ordering::Relaxed);
    rt.block_on(async {
        for t in tasks {
            t.await??;
        }
        anyhow::Ok(())
    })?;
    let per_sync = (after.events - before.events) as f64 / (after.syncs - before.syncs).max(1) as f64;
    let (a, b) = (after.times, before.times);
    let times = WriterTimes {
        sequence_ns: a.sequence_ns - b.sequence_ns,
        sign_ns: a.sign_ns - b.sign_ns,
        signers_ns: a.signers_ns - b.signers_ns,
        write_ns: a.write_ns - b.write_ns,
        sync_ns: a.sync_ns - b.sync_ns,
        ack_ns: a.ack_ns - b.ack_ns,
        batches: a.batches - b.batches,
    };
    let stages = StageTimes {
        times,
        events: after.events - before.events,
        syncs: after.syncs - before.syncs,
        elapsed: Duration::from_secs_f64(elapsed),
        cpu_seconds: cpu,
    };
    Ok((done as f64 / elapsed, per_sync, stages))
}

fn run_sqlite(base: &Path, n: usize, dur: Duration) -> Result<f64> {
    let tmp = tempfile::Builder::new().prefix("bench-sqlite-").tempdir_in(base)?;
    let conn = rusqlite::Connection::open(tmp.path().join("events.db"))?;
    conn.pragma_update(None, "journal_mode", "WAL")?;
    conn.pragma_update(None, "synchronous", "FULL")?;
    conn.execute_batch(
        "CREATE TABLE events (seq INTEGER PRIMARY KEY AUTOINCREMENT, kind TEXT NOT NULL, subject TEXT NOT NULL, data TEXT NOT NULL)",
    )?;
    // One connection shared under a mutex: SQLite has one writer at a time anyway, and
    // this avoids busy-wait sleeps between connections, its fastest durable setup for
    // one transaction per event.
    let conn = Arc::new(Mutex::new(conn));
    drive(n, dur, move |t, i| {
        let data = mindxtrain_node::canonical::to_vec(&payload(i))?;
        let c = conn.lock().map_err(|_| anyhow::anyhow!("poisoned"))?;
        c.execute(
            "INSERT INTO events (kind, subject, data) VALUES (?1, ?2, ?3)",
            rusqlite::params!["train.progress", format!("t{t}"), data],
        )
        .context("sqlite insert")?;
        Ok(())
    })
}
