//! kill -9 at random moments: no acknowledged event may ever be missing.
//!
//! A child process appends from 8 threads and prints each acknowledged (seq, id,
//! hash). The parent kills it with SIGKILL after a random delay, then checks that every
//! acknowledged event is in the log with that id and hash, that the whole log audits
//! clean, and starts the next cycle, which must append on top. 50 cycles by default;
//! set MINDXTRAIN_CRASH_CYCLES for more.

use mindxtrain_node::identity::Identity;
use mindxtrain_node::log::LogReader;
use mindxtrain_node::log::verify::{self, TrustedKey};
use mindxtrain_tests::workspace_bin;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

struct Ack {
    seq: u64,
    id: String,
    hash: String,
}

/// Small deterministic generator: the test's randomness is reproducible from the seed
/// it prints.
fn next(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

#[test]
fn no_acknowledged_event_is_lost_across_kill_9() {
    let cycles: u64 = std::env::var("MINDXTRAIN_CRASH_CYCLES").ok().and_then(|v| v.parse().ok()).unwrap_or(50);
    let mut rng = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64 | 1;
    eprintln!("crash test seed {rng}, {cycles} cycles");
    let dir = tempfile::tempdir().unwrap();
    let node_dir = dir.path().join("node");
    mindxtrain_node::node::init(&node_dir).unwrap();
    let key = Identity::load_from(&node_dir).unwrap();
    let mut acked: Vec<Ack> = Vec::new();
    let mut total_torn = 0;
    let mut cycles_with_appends = 0u64;
    for cycle in 0..cycles {
        let mut child = Command::new(workspace_bin("crash-appender"))
            .arg(&node_dir)
            .arg(cycle.to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn crash-appender");
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel::<String>();
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        // Wait until it is appending, then kill at a random moment.
        let ready = rx.recv_timeout(Duration::from_secs(30)).expect("child never became ready");
        assert!(ready.starts_with("ready"), "{ready}");
        let delay = Duration::from_millis(5 + next(&mut rng) % 120);
        let t0 = Instant::now();
        while t0.elapsed() < delay {
            std::thread::sleep(Duration::from_millis(1));
        }
        child.kill().unwrap(); // SIGKILL
        let status = child.wait().unwrap();
        assert!(!status.success());
        reader.join().unwrap();
        let mut stderr = String::new();
        use std::io::Read;
        child.stderr.take().unwrap().read_to_string(&mut stderr).unwrap();
        if stderr.contains("recovered torn tail") {
            total_torn += 1;
        }
        assert!(!stderr.contains("append failed"), "cycle {cycle}: {stderr}");
        let before = acked.iter().map(|a| a.seq).max();
        let acked_before = acked.len();
        for line in rx.try_iter() {
            let mut parts = line.split_whitespace();
            if parts.next() == Some("ack") {
                let seq = parts.next().unwrap().parse().unwrap();
                acked.push(Ack { seq, id: parts.next().unwrap().into(), hash: parts.next().unwrap().into() });
            }
        }
        // Appends continue on top of what the kill left: nothing acknowledged now reuses
        // a seq acknowledged before the restart.
        if let (Some(before), Some(first)) = (before, acked[acked_before..].iter().map(|a| a.seq).min()) {
            assert!(first > before, "cycle {cycle}: seq {first} acknowledged again after {before}");
        }
        if acked.len() > acked_before {
            cycles_with_appends += 1;
        }
        // Every acknowledged event, from every cycle so far, must be there.
        let reader = LogReader::open(&node_dir).unwrap();
        for a in &acked {
            let ev = reader
                .view()
                .event(a.seq)
                .unwrap_or_else(|e| panic!("cycle {cycle}: acked seq {} missing: {e}", a.seq));
            assert_eq!(ev.envelope.id, a.id, "cycle {cycle}: seq {} holds another event", a.seq);
            assert_eq!(hex::encode(ev.hash), a.hash);
        }
    }
    // Let the writer recover the last tail, then audit everything.
    drop(mindxtrain_node::node::open(&node_dir).unwrap());
    let report = verify::verify(&node_dir, TrustedKey::pinned(key.verifying_key(), "test")).unwrap();
    assert!(report.ok(), "{:?}", report.problems);
    assert!(acked.len() as u64 > cycles, "the child must have made progress");
    // A kill can land before a restarted child's first acknowledgement, but most
    // restarts must go on appending.
    assert!(cycles_with_appends * 2 > cycles, "only {cycles_with_appends} of {cycles} restarts appended");
    eprintln!(
        "{} acknowledged events over {cycles} kills, all present; {} torn tails recovered",
        acked.len(),
        total_torn
    );
}
