//! Child process for the crash test: appends from several threads and prints one line
//! per acknowledged event (`ack <seq> <id> <hash>`), flushed immediately, until it is
//! killed. Each run uses ids prefixed by its cycle number so the parent can tell runs
//! apart.

use mindxtrain_node::log::AppendRequest;
use mindxtrain_node::node;
use std::io::Write;
use std::sync::{Arc, Mutex};

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let dir = std::path::PathBuf::from(args.next().ok_or_else(|| anyhow::anyhow!("usage: crash-appender DIR CYCLE"))?);
    let cycle = args.next().unwrap_or_else(|| "0".into());
    let (log, _, report) = node::open(&dir)?;
    if let Some(t) = &report.torn {
        eprintln!("recovered torn tail at offset {} ({} bytes)", t.offset, t.bytes);
    }
    let log = Arc::new(log);
    let stdout = Arc::new(Mutex::new(std::io::stdout()));
    println!("ready {}", log.len());
    std::io::stdout().flush()?;
    let workers: Vec<_> = (0..8)
        .map(|t| {
            let (log, stdout) = (log.clone(), stdout.clone());
            let cycle = cycle.clone();
            std::thread::spawn(move || {
                for i in 0u64.. {
                    let id = format!("c{cycle}-t{t}-{i}");
                    let req = AppendRequest::new(
                        "crash.test",
                        format!("t{t}"),
                        serde_json::json!({"i": i, "pad": "x".repeat((i % 200) as usize)}),
                    )
                    .with_id(id.clone());
                    match log.append(req) {
                        Ok(a) => {
                            let mut out = stdout.lock().unwrap_or_else(|e| e.into_inner());
                            let _ = writeln!(out, "ack {} {} {}", a.seq, id, hex::encode(a.hash));
                            let _ = out.flush();
                        }
                        Err(e) => {
                            eprintln!("append failed: {e}");
                            return;
                        }
                    }
                }
            })
        })
        .collect();
    for w in workers {
        let _ = w.join();
    }
    Ok(())
}
