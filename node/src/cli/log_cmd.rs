//! `mindxtrain init` and `mindxtrain log ...`.

use super::output::Output;
use super::{EXIT_INVALID_INPUT, EXIT_VERIFY_FAILED};
use anyhow::{Context, Result, bail};
use clap::Subcommand;
use mindxtrain_node::identity::{self, Identity};
use mindxtrain_node::log::checkpoint;
use mindxtrain_node::log::proofs::{self, ProofError};
use mindxtrain_node::log::verify::{self, TrustedKey};
use mindxtrain_node::log::{AppendRequest, Event, LogReader};
use mindxtrain_node::node;
use serde_json::{Value, json};
use std::path::Path;
use std::process::ExitCode;

#[derive(Subcommand, Debug)]
pub enum LogCommand {
    /// Print events (all, or a seq range, or one kind).
    #[command(
        after_help = "Examples:\n  mindxtrain log show\n  mindxtrain log show --from 10 --to 20 --json\n  mindxtrain log show --kind recipe.registered"
    )]
    Show {
        /// First seq to show.
        #[arg(long, default_value_t = 0)]
        from: u64,
        /// Stop before this seq.
        #[arg(long)]
        to: Option<u64>,
        /// Only events whose kind starts with this (`run.` or `run.finished`), as the API's `kind`.
        #[arg(long)]
        kind: Option<String>,
    },
    /// Print the last events; with --follow, keep printing new ones as they become durable.
    #[command(after_help = "Examples:\n  mindxtrain log tail -n 5\n  mindxtrain log tail --follow --json")]
    Tail {
        #[arg(short = 'n', long, default_value_t = 10)]
        lines: u64,
        #[arg(long)]
        follow: bool,
    },
    /// Audit every record: crc, canonical form, seq continuity, chain links, signatures.
    #[command(
        after_help = "Exit code 0 when the log is intact, 3 when any problem was found.\n\nExamples:\n  mindxtrain log verify\n  mindxtrain log verify --trusted-key node.pub --json"
    )]
    Verify {
        /// Public key (hex, or a node.pub file) the signatures must verify under.
        /// Defaults to the node directory's node.pub, else the genesis event's key.
        #[arg(long)]
        trusted_key: Option<String>,
    },
    /// Merkle inclusion proof of one event in the tree of the first SIZE events.
    #[command(after_help = "Example:\n  mindxtrain log proof 3 --json")]
    Proof {
        seq: u64,
        /// Tree size (default: the whole log).
        #[arg(long)]
        size: Option<u64>,
    },
    /// Merkle consistency proof between the tree of OLD events and a later tree.
    #[command(after_help = "Example:\n  mindxtrain log consistency 10 --size 20")]
    Consistency {
        old: u64,
        #[arg(long)]
        size: Option<u64>,
    },
    /// A checkpoint of the whole log, signed by the node key (C2SP signed note).
    #[command(after_help = "Example:\n  mindxtrain log checkpoint > checkpoint.txt")]
    Checkpoint,
    /// Append one event (for scripts; the node's own components append directly).
    #[command(
        after_help = "Example:\n  mindxtrain log append --kind note.added --subject ops --data '{\"text\":\"hello\"}' --id note-1"
    )]
    Append {
        #[arg(long)]
        kind: String,
        #[arg(long, default_value = "")]
        subject: String,
        /// A JSON object.
        #[arg(long, default_value = "{}")]
        data: String,
        /// Idempotency key: retrying with the same id returns the original seq.
        #[arg(long)]
        id: Option<String>,
        /// Fail unless the event would get exactly this seq.
        #[arg(long)]
        expected_seq: Option<u64>,
    },
}

pub fn init(dir: &Path, out: &Output) -> Result<ExitCode> {
    let (id, _report) = node::init(dir)?;
    let public = hex::encode(id.public_bytes());
    out.emit(
        &json!({"node_dir": dir, "public_key": public, "origin": checkpoint::origin_for(&id.public_bytes())}),
        || {
            format!(
                "initialised node at {}\n  public key {public}\n  secret key {} (mode 0600)",
                dir.display(),
                dir.join(identity::SECRET_FILE).display()
            )
        },
    );
    Ok(ExitCode::SUCCESS)
}

pub fn run(cmd: LogCommand, dir: &Path, out: &Output) -> Result<ExitCode> {
    match cmd {
        LogCommand::Show { from, to, kind } => show(dir, out, from, to, kind),
        LogCommand::Tail { lines, follow } => tail(dir, out, lines, follow),
        LogCommand::Verify { trusted_key } => verify_log(dir, out, trusted_key),
        LogCommand::Proof { seq, size } => proof(dir, out, seq, size),
        LogCommand::Consistency { old, size } => consistency(dir, out, old, size),
        LogCommand::Checkpoint => print_checkpoint(dir, out),
        LogCommand::Append { kind, subject, data, id, expected_seq } => {
            let data: Value = serde_json::from_str(&data).context("--data is not valid JSON")?;
            let (log, _, _) = node::open(dir)?;
            let req = AppendRequest { kind, subject, data, id, expected_seq };
            let a = log.append(req)?;
            out.emit(&json!({"seq": a.seq, "hash": hex::encode(a.hash), "duplicate": a.duplicate}), || {
                format!(
                    "{} seq {} hash {}",
                    if a.duplicate { "already appended at" } else { "appended at" },
                    a.seq,
                    hex::encode(a.hash)
                )
            });
            Ok(ExitCode::SUCCESS)
        }
    }
}

fn reader(dir: &Path) -> Result<LogReader> {
    let r = LogReader::open(dir)?;
    if let Some(t) = r.torn() {
        eprintln!(
            "warning: {} ends in a torn record at offset {} ({} bytes: {}); the node truncates it on its next start",
            t.segment.display(),
            t.offset,
            t.bytes,
            t.reason
        );
    }
    Ok(r)
}

pub fn event_line(ev: &Event) -> String {
    let e = &ev.envelope;
    let mut data = serde_json::to_string(&e.data).unwrap_or_default();
    if data.len() > 96 {
        let cut = (0..=96).rev().find(|&i| data.is_char_boundary(i)).unwrap_or(0);
        data.truncate(cut);
        data.push('…');
    }
    format!("{:>6}  {}  {:<20} {:<24} {}  {}", e.seq, e.time, e.kind, e.subject, &hex::encode(ev.hash)[..12], data)
}

fn show(dir: &Path, out: &Output, from: u64, to: Option<u64>, kind: Option<String>) -> Result<ExitCode> {
    let r = reader(dir)?;
    let to = to.unwrap_or(u64::MAX).min(r.view().len());
    let events: Vec<Event> = r
        .view()
        .range(from, to)?
        .into_iter()
        .filter(|e| kind.as_ref().is_none_or(|k| e.envelope.kind.starts_with(k.as_str())))
        .collect();
    let json = Value::Array(events.iter().map(Event::to_json).collect());
    out.emit(&json, || events.iter().map(event_line).collect::<Vec<_>>().join("\n"));
    Ok(ExitCode::SUCCESS)
}

fn tail(dir: &Path, out: &Output, lines: u64, follow: bool) -> Result<ExitCode> {
    let mut r = reader(dir)?;
    let len = r.view().len();
    let mut next = len.saturating_sub(lines);
    loop {
        let len = r.view().len();
        for ev in r.view().range(next, len)? {
            if !out.line(&ev.to_json(), || event_line(&ev)) {
                // The reader went away (`| head`, say): nothing more to do.
                return Ok(ExitCode::SUCCESS);
            }
        }
        next = len;
        if !follow {
            return Ok(ExitCode::SUCCESS);
        }
        // Poll the files: the writer may be another process.
        while r.refresh()? == 0 {
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
    }
}

fn trusted_key(dir: &Path, arg: Option<String>) -> Result<TrustedKey> {
    if let Some(arg) = arg {
        let key = identity::read_public_key(&arg).map_err(anyhow::Error::msg)?;
        return Ok(TrustedKey::pinned(key, "--trusted-key"));
    }
    let pub_file = dir.join(identity::PUBLIC_FILE);
    if pub_file.is_file() {
        let key = identity::read_public_key(&pub_file.to_string_lossy()).map_err(anyhow::Error::msg)?;
        return Ok(TrustedKey::pinned(key, pub_file.display().to_string()));
    }
    Ok(TrustedKey::FromGenesis)
}

fn verify_log(dir: &Path, out: &Output, key: Option<String>) -> Result<ExitCode> {
    let initialised = dir.join(identity::SECRET_FILE).exists();
    if !dir.join(mindxtrain_node::log::LOG_DIR).is_dir() && !initialised {
        bail!("{}: no event log here; run `mindxtrain init --node-dir {}` first", dir.display(), dir.display());
    }
    let report = verify::verify(dir, trusted_key(dir, key)?)?;
    out.emit(&json!({"ok": report.ok(), "report": report, "missing_events": report.missing_events()}), || {
        let mut s = format!(
            "{} in {}, root {}\nsignatures checked against {} ({})\ncompared with {} record(s) of the log; index: {}",
            super::plural(report.events, "event"),
            super::plural(report.segments as u64, "segment"),
            report.root,
            report.key.as_deref().unwrap_or("no key"),
            report.key_source,
            report.witnesses.len(),
            report.index
        );
        if report.ok() {
            s.push_str(
                "\nOK: crc, canonical form, seq continuity, chain links and signatures all verify, and the log holds \
                 every event the node recorded elsewhere",
            );
            return s;
        }
        s.push_str(&format!("\nFAILED: {} problem(s)", report.problems.len() + report.missing.len()));
        for p in &report.problems {
            s.push_str(&format!("\n  {p}"));
        }
        for m in &report.missing {
            s.push_str(&format!("\n  {m}"));
        }
        if let Some((first, last)) = report.missing_events() {
            s.push_str(&format!(
                "\n  events {first}..={last} are missing: restore log/ from a backup (a new log is only ever started by \
                 `mindxtrain init`, in a new node directory)"
            ));
        }
        s
    });
    Ok(if report.ok() { ExitCode::SUCCESS } else { ExitCode::from(EXIT_VERIFY_FAILED) })
}

fn proof(dir: &Path, out: &Output, seq: u64, size: Option<u64>) -> Result<ExitCode> {
    let r = reader(dir)?;
    let v = r.view();
    let doc = match proofs::inclusion(v, seq, size.unwrap_or(v.len())) {
        Ok(d) => d,
        Err(e @ (ProofError::OutOfRange { .. } | ProofError::TooLarge { .. })) => {
            eprintln!("error: {e}");
            return Ok(ExitCode::from(EXIT_INVALID_INPUT));
        }
        Err(e) => return Err(e.into()),
    };
    out.emit(&doc, || {
        format!(
            "seq {seq} in tree of size {}\n  event {}\n  root  {}\n  path  {}",
            doc["tree_size"],
            doc["event_hash"].as_str().unwrap_or_default(),
            doc["root"].as_str().unwrap_or_default(),
            hex_lines(&doc["proof"], "\n        ")
        )
    });
    Ok(ExitCode::SUCCESS)
}

fn consistency(dir: &Path, out: &Output, old: u64, size: Option<u64>) -> Result<ExitCode> {
    let r = reader(dir)?;
    let v = r.view();
    let size = size.unwrap_or(v.len());
    let doc = match proofs::consistency(v, old, size) {
        Ok(d) => d,
        Err(e @ (ProofError::BadSizes { .. } | ProofError::TooLarge { .. })) => {
            eprintln!("error: {e}");
            return Ok(ExitCode::from(EXIT_INVALID_INPUT));
        }
        Err(e) => return Err(e.into()),
    };
    out.emit(&doc, || {
        format!(
            "tree {old} → {size}\n  old root {}\n  new root {}\n  path     {}",
            doc["old_root"].as_str().unwrap_or_default(),
            doc["new_root"].as_str().unwrap_or_default(),
            hex_lines(&doc["proof"], "\n           ")
        )
    });
    Ok(ExitCode::SUCCESS)
}

fn hex_lines(list: &serde_json::Value, sep: &str) -> String {
    list.as_array().map(|a| a.iter().filter_map(|h| h.as_str()).collect::<Vec<_>>().join(sep)).unwrap_or_default()
}

/// Prints a checkpoint of the log as it is on disk now, signed by the node key.
fn print_checkpoint(dir: &Path, out: &Output) -> Result<ExitCode> {
    let id = Identity::load_from(dir)?;
    let (_, doc) = proofs::signed_checkpoint(reader(dir)?.view(), &id)?;
    out.emit(&doc, || doc["note"].as_str().unwrap_or_default().trim_end().to_string());
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_data_is_cut_on_a_char_boundary() {
        let ev = Event {
            envelope: mindxtrain_node::log::Envelope {
                v: 1,
                seq: 1,
                prev: String::new(),
                time: "t".into(),
                kind: "k".into(),
                subject: "s".into(),
                id: "i".into(),
                data: json!({"text": "é".repeat(200)}),
            },
            hash: [0; 32],
            signature: [0; 64],
        };
        assert!(event_line(&ev).ends_with('…'));
    }
}
