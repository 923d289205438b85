use super::verify::{self, TrustedKey};
use super::*;
use crate::identity::Identity;
use serde_json::json;
use std::collections::BTreeSet;

fn key() -> Identity {
    Identity::from_seed([11; 32])
}

fn open(dir: &Path, opts: LogOptions) -> (EventLog, OpenReport) {
    EventLog::open(dir, key(), opts).unwrap()
}

fn fill(log: &EventLog, n: u64) {
    for i in 0..n {
        let run = format!("run-{}", i % 3);
        log.append(AppendRequest::new("train.progress", run.clone(), json!({"run_id": run, "step": i}))).unwrap();
    }
}

fn pinned() -> TrustedKey {
    TrustedKey::pinned(key().verifying_key(), "test")
}

fn segments(dir: &Path) -> Vec<PathBuf> {
    segment::list_segments(&dir.join(LOG_DIR)).unwrap().into_iter().map(|(_, p)| p).collect()
}

#[test]
fn appends_are_chained_signed_and_readable_after_reopen() {
    let dir = tempfile::tempdir().unwrap();
    {
        let (log, report) = open(dir.path(), LogOptions::default());
        assert_eq!(report.events, 1, "genesis written");
        fill(&log, 20);
        assert_eq!(log.len(), 21);
    }
    let (log, report) = open(dir.path(), LogOptions::default());
    assert_eq!(report.events, 21);
    assert!(report.torn.is_none());
    let genesis = log.get(0).unwrap();
    assert_eq!(genesis.envelope.kind, GENESIS_KIND);
    for seq in 1..21 {
        let ev = log.get(seq).unwrap();
        assert_eq!(ev.envelope.prev, hex::encode(log.get(seq - 1).unwrap().hash));
        assert!(ev.verify_signature(&key().verifying_key()));
    }
    assert!(verify::verify(dir.path(), pinned()).unwrap().ok());
}

#[test]
fn expected_seq_mismatch_is_a_typed_error_and_stores_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (log, _) = open(dir.path(), LogOptions::default());
    let ok = log.append(AppendRequest::new("a.b", "s", json!({})).expecting_seq(1)).unwrap();
    assert_eq!(ok.seq, 1);
    let err = log.append(AppendRequest::new("a.b", "s", json!({})).expecting_seq(1)).unwrap_err();
    assert_eq!(err, AppendError::SeqMismatch { expected: 1, next: 2 });
    assert_eq!(log.len(), 2);
}

#[test]
fn retried_id_returns_original_seq_and_conflicting_reuse_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let first;
    {
        let (log, _) = open(dir.path(), LogOptions::default());
        first = log.append(AppendRequest::new("pay.x", "s", json!({"n": 1})).with_id("req-1")).unwrap();
        let again = log.append(AppendRequest::new("pay.x", "s", json!({"n": 1})).with_id("req-1")).unwrap();
        assert_eq!((again.seq, again.hash, again.duplicate), (first.seq, first.hash, true));
        let conflict = log.append(AppendRequest::new("pay.x", "s", json!({"n": 2})).with_id("req-1")).unwrap_err();
        assert_eq!(conflict, AppendError::IdConflict { id: "req-1".into(), seq: first.seq });
    }
    // Ids survive a restart: they live in the signed records, not only in memory.
    let (log, _) = open(dir.path(), LogOptions::default());
    let again =
        log.append(AppendRequest::new("pay.x", "s", json!({"n": 1})).with_id("req-1").expecting_seq(99)).unwrap();
    assert_eq!(again.seq, first.seq);
    assert_eq!(log.len(), 2);
}

#[test]
fn invalid_events_are_refused_with_reasons() {
    let dir = tempfile::tempdir().unwrap();
    let (log, _) = open(dir.path(), LogOptions::default());
    assert!(matches!(log.append(AppendRequest::new("Bad Kind", "s", json!({}))), Err(AppendError::Invalid(_))));
    assert!(matches!(log.append(AppendRequest::new("a", "s", json!([1]))), Err(AppendError::Invalid(_))));
    assert!(matches!(log.append(AppendRequest::new("a", "x".repeat(300), json!({}))), Err(AppendError::Invalid(_))));
    assert_eq!(log.len(), 1);
}

#[test]
fn concurrent_appenders_get_no_duplicates_and_no_gaps() {
    let dir = tempfile::tempdir().unwrap();
    let (log, _) = open(dir.path(), LogOptions { max_segment_bytes: 64 << 10 });
    let log = Arc::new(log);
    let threads: Vec<_> = (0..16)
        .map(|t| {
            let log = log.clone();
            std::thread::spawn(move || {
                (0..100)
                    .map(|i| {
                        let id = format!("t{t}-{i}");
                        let r = AppendRequest::new("c.x", "s", json!({"t": t, "i": i})).with_id(id.clone());
                        let a = log.append(r.clone()).unwrap();
                        // Every retry of the same id answers the same seq.
                        assert_eq!(log.append(r).unwrap().seq, a.seq);
                        a.seq
                    })
                    .collect::<Vec<u64>>()
            })
        })
        .collect();
    let seqs: Vec<u64> = threads.into_iter().flat_map(|t| t.join().unwrap()).collect();
    let unique: BTreeSet<u64> = seqs.iter().copied().collect();
    assert_eq!(unique.len(), 1600);
    assert_eq!(unique.iter().copied().collect::<Vec<_>>(), (1..=1600).collect::<Vec<_>>());
    assert!(log.stats().syncs < 3200, "group commit shares syncs");
    drop(log);
    assert!(segments(dir.path()).len() > 1, "rotation happened");
    assert!(verify::verify(dir.path(), pinned()).unwrap().ok());
}

#[test]
fn optimistic_concurrency_lets_exactly_one_writer_win_each_seq() {
    let dir = tempfile::tempdir().unwrap();
    let (log, _) = open(dir.path(), LogOptions::default());
    let log = Arc::new(log);
    let wins: Vec<_> = (0..8)
        .map(|t| {
            let log = log.clone();
            std::thread::spawn(move || {
                let mut won = 0;
                for _ in 0..50 {
                    let next = log.len();
                    match log.append(AppendRequest::new("occ.x", "s", json!({"t": t})).expecting_seq(next)) {
                        Ok(a) => {
                            assert_eq!(a.seq, next);
                            won += 1;
                        }
                        Err(AppendError::SeqMismatch { .. }) => {}
                        Err(e) => panic!("{e}"),
                    }
                }
                won
            })
        })
        .collect();
    let total: u64 = wins.into_iter().map(|t| t.join().unwrap()).sum();
    assert_eq!(log.len(), total + 1);
}

#[test]
fn index_answers_queries_and_is_rebuilt_when_missing_stale_or_corrupt() {
    let dir = tempfile::tempdir().unwrap();
    {
        let (log, _) = open(dir.path(), LogOptions::default());
        fill(&log, 9);
        assert_eq!(log.query(&index::Query::Run("run-1".into())).unwrap(), vec![2, 5, 8]);
        assert_eq!(log.query(&index::Query::Kind("train.progress".into())).unwrap().len(), 9);
        assert_eq!(log.query(&index::Query::Subject("run-0".into())).unwrap(), vec![1, 4, 7]);
    }
    // Missing.
    std::fs::remove_dir_all(dir.path().join(INDEX_DIR)).unwrap();
    {
        let (log, report) = open(dir.path(), LogOptions::default());
        assert!(matches!(report.index, index::Reconciled::Rebuilt { .. }), "{:?}", report.index);
        assert_eq!(log.query(&index::Query::Run("run-1".into())).unwrap(), vec![2, 5, 8]);
    }
    // Garbage in place of the sled files.
    for entry in std::fs::read_dir(dir.path().join(INDEX_DIR)).unwrap() {
        let p = entry.unwrap().path();
        if p.is_file() {
            std::fs::write(&p, b"not sled at all").unwrap();
        }
    }
    {
        let (log, report) = open(dir.path(), LogOptions::default());
        assert!(matches!(report.index, index::Reconciled::Rebuilt { .. }), "{:?}", report.index);
        assert_eq!(log.query(&index::Query::Run("run-2".into())).unwrap(), vec![3, 6, 9]);
    }
    // Stale: a copy of an index from a longer, different log.
    let other = tempfile::tempdir().unwrap();
    {
        let (log, _) = open(other.path(), LogOptions::default());
        fill(&log, 30);
    }
    std::fs::remove_dir_all(dir.path().join(INDEX_DIR)).unwrap();
    copy_dir(&other.path().join(INDEX_DIR), &dir.path().join(INDEX_DIR));
    let (log, report) = open(dir.path(), LogOptions::default());
    assert!(matches!(report.index, index::Reconciled::Rebuilt { .. }), "{:?}", report.index);
    assert_eq!(log.query(&index::Query::Kind("train.progress".into())).unwrap().len(), 9);
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let target = to.join(e.file_name());
        if e.path().is_dir() {
            copy_dir(&e.path(), &target)
        } else {
            std::fs::copy(e.path(), target).unwrap();
        }
    }
}

/// Writes a log of a few events and returns (dir, bytes of its only segment, offset of
/// the last record).
fn small_log() -> (tempfile::TempDir, Vec<u8>, u64) {
    let dir = tempfile::tempdir().unwrap();
    let (log, _) = open(dir.path(), LogOptions::default());
    fill(&log, 4);
    let last_off = log.read(|v| v.positions_for_test(4));
    drop(log);
    let bytes = std::fs::read(&segments(dir.path())[0]).unwrap();
    (dir, bytes, last_off)
}

#[test]
fn torn_last_record_is_truncated_at_every_byte_offset() {
    let (_dir, bytes, last_off) = small_log();
    for cut in last_off as usize..bytes.len() {
        let dir = tempfile::tempdir().unwrap();
        let (log, _) = open(dir.path(), LogOptions::default());
        drop(log);
        let seg = &segments(dir.path())[0];
        std::fs::write(seg, &bytes[..cut]).unwrap();
        let (log, report) = EventLog::open(dir.path(), key(), LogOptions::default()).unwrap();
        assert_eq!(log.len(), 4, "cut at {cut}: the valid prefix (genesis + 3) survives");
        assert_eq!(report.torn.is_some(), cut > last_off as usize, "cut at {cut}");
        // Appends continue on the clean prefix.
        assert_eq!(log.append(AppendRequest::new("a.b", "s", json!({}))).unwrap().seq, 4);
        drop(log);
        assert!(verify::verify(dir.path(), pinned()).unwrap().ok());
    }
}

#[test]
fn garbled_last_record_is_truncated_and_preserved() {
    let (_dir, bytes, last_off) = small_log();
    for pos in last_off as usize..bytes.len() {
        let dir = tempfile::tempdir().unwrap();
        drop(open(dir.path(), LogOptions::default()));
        let mut garbled = bytes.clone();
        garbled[pos] ^= 0x5a;
        std::fs::write(&segments(dir.path())[0], &garbled).unwrap();
        // `log verify` (read-only) names the place before anything is repaired.
        let report = verify::verify(dir.path(), pinned()).unwrap();
        assert!(!report.ok(), "flip at {pos} undetected");
        assert_eq!(report.problems[0].offset, last_off, "flip at {pos}");
        let (log, report) = EventLog::open(dir.path(), key(), LogOptions::default()).unwrap();
        assert_eq!(log.len(), 4, "flip at {pos}");
        let saved = report.torn_saved_to.expect("torn bytes preserved");
        assert_eq!(std::fs::read(saved).unwrap(), garbled[last_off as usize..].to_vec());
    }
}

#[test]
fn damage_before_the_tail_is_a_hard_error_naming_the_place() {
    let (_dir, bytes, _) = small_log();
    let dir = tempfile::tempdir().unwrap();
    drop(open(dir.path(), LogOptions::default()));
    let second = {
        let (len, _) = record::parse_header(&bytes);
        HEADER_LEN_U64 + len as u64
    };
    let mut damaged = bytes.clone();
    damaged[second as usize + 20] ^= 1;
    std::fs::write(&segments(dir.path())[0], &damaged).unwrap();
    let err = EventLog::open(dir.path(), key(), LogOptions::default()).err().expect("must refuse");
    let msg = err.to_string();
    assert!(msg.contains(&format!("offset {second}")) && msg.contains("seq 1"), "{msg}");
    // Nothing was truncated.
    assert_eq!(std::fs::read(&segments(dir.path())[0]).unwrap(), damaged);
}

const HEADER_LEN_U64: u64 = record::HEADER_LEN as u64;

#[test]
fn flipping_any_byte_fails_verify_and_names_the_record() {
    let (_dir, bytes, _) = small_log();
    let starts = record_starts(&bytes);
    let dir = tempfile::tempdir().unwrap();
    drop(open(dir.path(), LogOptions::default()));
    let seg = segments(dir.path())[0].clone();
    for pos in 0..bytes.len() {
        let mut t = bytes.clone();
        t[pos] ^= 0x01;
        std::fs::write(&seg, &t).unwrap();
        let report = verify::verify(dir.path(), pinned()).unwrap();
        assert!(!report.ok(), "flip at byte {pos} undetected");
        let owner = *starts.iter().rfind(|&&s| s <= pos as u64).unwrap();
        assert!(report.problems.iter().any(|p| p.offset == owner), "flip at {pos}: {:?}", report.problems);
    }
}

fn record_starts(bytes: &[u8]) -> Vec<u64> {
    let mut out = vec![];
    let mut off = 0usize;
    while off < bytes.len() {
        out.push(off as u64);
        off += record::HEADER_LEN + record::parse_header(&bytes[off..]).0;
    }
    out
}

#[test]
fn resigned_reordered_and_deleted_events_are_detected() {
    let (_dir, bytes, _) = small_log();
    let starts = record_starts(&bytes);
    let recs: Vec<Vec<u8>> = starts
        .iter()
        .zip(starts.iter().skip(1).chain([bytes.len() as u64].iter()))
        .map(|(&a, &b)| bytes[a as usize..b as usize].to_vec())
        .collect();
    let dir = tempfile::tempdir().unwrap();
    drop(open(dir.path(), LogOptions::default()));
    let seg = segments(dir.path())[0].clone();
    let check = |content: Vec<u8>, needle: &str| {
        std::fs::write(&seg, &content).unwrap();
        let report = verify::verify(dir.path(), pinned()).unwrap();
        assert!(report.problems.iter().any(|p| p.what.contains(needle)), "{needle}: {:?}", report.problems);
    };
    // Re-sign event 2 with another key: same envelope, valid crc, wrong signer.
    let other = Identity::from_seed([99; 32]);
    let body = &recs[2][record::HEADER_LEN..];
    let env = &body[..body.len() - record::SIG_LEN];
    let (resigned, _) = record::seal(env, &other);
    let mut v = recs.clone();
    v[2] = resigned;
    check(v.concat(), "signature does not verify");
    // Swap events 2 and 3.
    let mut v = recs.clone();
    v.swap(2, 3);
    check(v.concat(), "reordered");
    // Delete event 2.
    let mut v = recs.clone();
    v.remove(2);
    check(v.concat(), "seq");
    // An entire log re-signed by another key is caught against the pinned key.
    std::fs::write(&seg, &bytes).unwrap();
    let report = verify::verify(dir.path(), TrustedKey::pinned(other.verifying_key(), "pinned")).unwrap();
    assert!(report.problems.iter().any(|p| p.what.contains("trusted key")));
}

#[test]
fn opening_with_the_wrong_key_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    drop(open(dir.path(), LogOptions::default()));
    let err = EventLog::open(dir.path(), Identity::from_seed([1; 32]), LogOptions::default()).err().unwrap();
    assert!(matches!(err, OpenError::KeyMismatch { .. }));
}

#[test]
fn second_writer_is_locked_out() {
    let dir = tempfile::tempdir().unwrap();
    let (_log, _) = open(dir.path(), LogOptions::default());
    assert!(matches!(EventLog::open(dir.path(), key(), LogOptions::default()), Err(OpenError::Locked(_))));
}

#[test]
fn proofs_and_checkpoints_verify_against_the_view() {
    let dir = tempfile::tempdir().unwrap();
    let (log, _) = open(dir.path(), LogOptions::default());
    fill(&log, 12);
    let size = log.len();
    log.read(|v| {
        let root = v.root(size).unwrap();
        for seq in 0..size {
            let proof = v.inclusion_proof(seq, size).unwrap();
            mindxtrain_chain::merkle::verify_inclusion(&v.leaf(seq).unwrap(), seq, size, &proof, &root).unwrap();
        }
        let old = v.root(5).unwrap();
        let p = v.consistency_proof(5, size).unwrap();
        mindxtrain_chain::merkle::verify_consistency(5, size, &old, &root, &p).unwrap();
        let cp = checkpoint::Checkpoint { origin: checkpoint::origin_for(&key().public_bytes()), size, root };
        let note = cp.sign(&key());
        assert_eq!(checkpoint::Checkpoint::verify(&note, &key().verifying_key()).unwrap(), cp);
    });
}

#[test]
fn reader_follows_a_live_writer() {
    let dir = tempfile::tempdir().unwrap();
    let (log, _) = open(dir.path(), LogOptions { max_segment_bytes: 2048 });
    let mut reader = LogReader::open(dir.path()).unwrap();
    assert_eq!(reader.view().len(), 1);
    fill(&log, 30);
    assert_eq!(reader.refresh().unwrap(), 30);
    assert_eq!(reader.view().event(30).unwrap().envelope.seq, 30);
}

#[test]
fn an_fsync_error_stops_the_writer_and_acknowledges_nothing_more() {
    let dir = tempfile::tempdir().unwrap();
    {
        let (log, _) = open(dir.path(), LogOptions::default());
        fill(&log, 3);
        log.fail_next_sync(std::io::ErrorKind::Other);
        let err = log.append(AppendRequest::new("a.b", "s", json!({}))).unwrap_err();
        assert!(matches!(err, AppendError::Stopped(ref r) if r.contains("fdatasync failed")), "{err}");
        // Every later append is refused too, even though the disk would now work.
        let later = log.append(AppendRequest::new("a.b", "s", json!({}))).unwrap_err();
        assert!(matches!(later, AppendError::Stopped(_)));
        assert_eq!(log.len(), 4, "nothing past the failed sync is visible");
    }
    // A restart recovers from the files: the acknowledged prefix is intact.
    let (log, _) = open(dir.path(), LogOptions::default());
    assert!(log.len() >= 4);
    for seq in 0..4 {
        log.get(seq).unwrap();
    }
    drop(log);
    assert!(verify::verify(dir.path(), pinned()).unwrap().ok());
}
