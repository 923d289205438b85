//! A lost log is refused, not replaced: a zero-filled or deleted segment, a removed `log/`
//! and a lost last segment, each against every record the node keeps of its log, on open,
//! in a reader and in `log verify`; only `create` (init) writes a genesis.

use super::verify::{self, TrustedKey};
use super::*;
use crate::identity::Identity;
use serde_json::json;

fn key() -> Identity {
    Identity::from_seed([21; 32])
}

fn pinned() -> TrustedKey {
    TrustedKey::pinned(key().verifying_key(), "test")
}

/// A node directory whose log holds `n` events after the genesis, in segments of
/// `segment_bytes`, closed cleanly (so its index and signed checkpoint cover every event).
fn node(n: u64, segment_bytes: u64) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let opts = LogOptions { max_segment_bytes: segment_bytes, ..Default::default() };
    let (log, _) = EventLog::create(dir.path(), key(), opts).unwrap();
    // As `init` leaves it: readers check the node's records against this key.
    std::fs::write(dir.path().join(crate::identity::PUBLIC_FILE), format!("{}\n", hex::encode(key().public_bytes())))
        .unwrap();
    for i in 0..n {
        log.append(AppendRequest::new(
            "train.progress",
            "run-1",
            json!({"run_id": "run-1", "step": i, "pad": "x".repeat(400)}),
        ))
        .unwrap();
    }
    dir
}

fn segments(dir: &Path) -> Vec<PathBuf> {
    segment::list_segments(&dir.join(LOG_DIR)).unwrap().into_iter().map(|(_, p)| p).collect()
}

/// Everything under `dir`, to show that a refusal changed nothing.
fn snapshot(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            // sled rewrites its own files when it opens; the index is not the record.
            if p.starts_with(dir.join(INDEX_DIR)) || p.ends_with(LOCK_FILE) {
                continue;
            }
            if p.is_dir() { stack.push(p) } else { out.push((p.clone(), std::fs::read(&p).unwrap())) }
        }
    }
    out.sort();
    out
}

/// The open, a reader and `log verify` all refuse the log, naming `want` in their messages,
/// and nothing in the node directory changes.
fn refused_everywhere(dir: &Path, want: &[&str]) {
    let before = snapshot(dir);
    let err = EventLog::open(dir, key(), LogOptions::default()).err().expect("the open must refuse");
    assert!(matches!(err, OpenError::Lost(_)), "{err}");
    let msg = err.to_string();
    for w in want {
        assert!(msg.contains(w), "open: {w:?} not in: {msg}");
    }
    assert!(msg.contains("Restore log/ from a backup"), "{msg}");
    let err = LogReader::open(dir).err().expect("a reader must refuse");
    assert!(matches!(err, ReadError::Lost(_)), "{err}");
    let report = verify::verify(dir, pinned()).unwrap();
    assert!(!report.ok(), "verify passed a lost log: {report:?}");
    let listed: String = report
        .problems
        .iter()
        .map(|p| p.to_string())
        .chain(report.missing.iter().map(|m| m.to_string()))
        .collect::<Vec<_>>()
        .join("\n");
    for w in want.iter().filter(|w| !w.starts_with("Events") && !w.starts_with("holds ")) {
        assert!(listed.contains(w), "verify: {w:?} not in: {listed}");
    }
    assert_eq!(snapshot(dir), before, "a refusal changes nothing");
}

#[test]
fn a_zero_filled_only_segment_is_refused_naming_the_lost_events() {
    let dir = node(5, 64 << 20);
    let seg = &segments(dir.path())[0];
    let len = std::fs::metadata(seg).unwrap().len();
    std::fs::write(seg, vec![0u8; len as usize]).unwrap();
    refused_everywhere(
        dir.path(),
        &[
            "holds no events",
            "the latest signed checkpoint",
            "was signed at 6 events",
            "names event 5",
            "Events 0..=5 are missing",
        ],
    );
    let report = verify::verify(dir.path(), pinned()).unwrap();
    assert_eq!(report.missing_events(), Some((0, 5)));
}

#[test]
fn a_deleted_only_segment_and_a_removed_log_dir_are_refused() {
    let dir = node(3, 64 << 20);
    std::fs::remove_file(&segments(dir.path())[0]).unwrap();
    refused_everywhere(dir.path(), &["holds no events", "was signed at 4 events", "Events 0..=3 are missing"]);

    let dir = node(3, 64 << 20);
    std::fs::remove_dir_all(dir.path().join(LOG_DIR)).unwrap();
    refused_everywhere(dir.path(), &["is missing", "was signed at 4 events", "Events 0..=3 are missing"]);
    assert!(!dir.path().join(LOG_DIR).exists(), "no new log/ was made");
}

#[test]
fn a_lost_last_segment_is_refused_though_the_rest_is_intact() {
    let dir = node(40, 8 << 10);
    let segs = segments(dir.path());
    assert!(segs.len() >= 3, "{segs:?}");
    let last = segs.last().unwrap();
    let first_lost: u64 = last.file_stem().unwrap().to_str().unwrap().parse().unwrap();
    std::fs::remove_file(last).unwrap();
    let holds = format!("holds {first_lost} events");
    let missing = format!("Events {first_lost}..=40 are missing");
    refused_everywhere(dir.path(), &[&holds, "was signed at 41 events", "names event 40", &missing]);

    // Zero-filled instead of deleted: the same (zeros read as pre-written space).
    let dir = node(40, 8 << 10);
    let last = segments(dir.path()).pop().unwrap();
    let len = std::fs::metadata(&last).unwrap().len();
    std::fs::write(&last, vec![0u8; len as usize]).unwrap();
    refused_everywhere(dir.path(), &[&holds, &missing]);
}

#[test]
fn each_record_alone_is_enough() {
    // The signed checkpoint alone (no index).
    let dir = node(4, 64 << 20);
    std::fs::remove_dir_all(dir.path().join(INDEX_DIR)).unwrap();
    std::fs::remove_file(&segments(dir.path())[0]).unwrap();
    refused_everywhere(dir.path(), &["the latest signed checkpoint", "Events 0..=4 are missing"]);
    // The index alone (no signed checkpoint): readers cannot see it, the writer can.
    let dir = node(4, 64 << 20);
    std::fs::remove_file(dir.path().join(witness::CHECKPOINT_FILE)).unwrap();
    let seg = segments(dir.path())[0].clone();
    let bytes = std::fs::read(&seg).unwrap();
    let cut = {
        let v = LogReader::open(dir.path()).unwrap();
        v.view().positions_for_test(3) as usize
    };
    std::fs::write(&seg, &bytes[..cut]).unwrap();
    let msg = EventLog::open(dir.path(), key(), LogOptions::default()).err().unwrap().to_string();
    assert!(msg.contains("the index's last indexed event") && msg.contains("Events 3..=4 are missing"), "{msg}");
    let report = verify::verify(dir.path(), pinned()).unwrap();
    assert_eq!(report.missing_events(), Some((3, 4)), "{report:?}");
    assert_eq!(std::fs::read(&seg).unwrap(), &bytes[..cut], "no torn tail was cut away");
}

#[test]
fn a_replaced_log_is_refused_and_only_create_writes_a_genesis() {
    let dir = node(2, 64 << 20);
    // Another log by the same key, started afresh where the first one was.
    std::fs::remove_dir_all(dir.path().join(LOG_DIR)).unwrap();
    let other = node(2, 64 << 20);
    super::tests::copy_dir(&other.path().join(LOG_DIR), &dir.path().join(LOG_DIR));
    let msg = EventLog::open(dir.path(), key(), LogOptions::default()).err().unwrap().to_string();
    assert!(msg.contains("holds 3 events") && msg.contains("replaced or rewritten"), "{msg}");
    assert!(!msg.contains("are missing"), "{msg}");

    // `create` refuses a directory that holds a log; `open` never starts one.
    let dir = node(0, 64 << 20);
    assert!(matches!(EventLog::create(dir.path(), key(), LogOptions::default()), Err(OpenError::Exists(_))));
    let fresh = tempfile::tempdir().unwrap();
    assert!(matches!(EventLog::open(fresh.path(), key(), LogOptions::default()), Err(OpenError::Lost(_))));
    assert!(!fresh.path().join(LOG_DIR).exists());
}

#[test]
fn a_run_manifest_names_its_events_when_they_are_lost() {
    let f = crate::manifest::tests::sealed_run();
    let position = f.sealed.statement.predicate.run_details.mindxtrain_log.as_ref().unwrap();
    let (first, last) = (position.first_seq, position.last_seq);
    let (node_dir, key) = (f.dir.path().to_path_buf(), f.key.clone());
    drop(f.log);
    // The manifest alone vouches for the log now.
    std::fs::remove_dir_all(node_dir.join(INDEX_DIR)).unwrap();
    std::fs::remove_file(node_dir.join(witness::CHECKPOINT_FILE)).unwrap();
    std::fs::remove_dir_all(node_dir.join(LOG_DIR)).unwrap();
    let msg = EventLog::open(&node_dir, key, LogOptions::default()).err().unwrap().to_string();
    assert!(msg.contains("run run-1's manifest") && msg.contains(&format!("names events {first}..={last}")), "{msg}");
    drop(f.dir);
}
