use super::verify::{self, TrustedKey};
use super::*;
use crate::identity::Identity;
use serde_json::json;
use std::collections::BTreeSet;

fn key() -> Identity {
    Identity::from_seed([11; 32])
}

/// Opens the log in `dir`, creating it (with its genesis) the first time.
fn open(dir: &Path, opts: LogOptions) -> (EventLog, OpenReport) {
    if dir.join(LOG_DIR).exists() {
        EventLog::open(dir, key(), opts).unwrap()
    } else {
        EventLog::create(dir, key(), opts).unwrap()
    }
}

/// A log in `dir` that nothing else of the node vouches for (no index, no signed
/// checkpoint), as after a crash before the node ever closed it: tests write its segment
/// themselves.
fn bare_log(dir: &Path) {
    drop(open(dir, LogOptions::default()));
    std::fs::remove_dir_all(dir.join(INDEX_DIR)).unwrap();
    std::fs::remove_file(dir.join(witness::CHECKPOINT_FILE)).unwrap();
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
    let (log, _) = open(dir.path(), LogOptions { max_segment_bytes: 64 << 10, signers: 3 });
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
    // 1600 new events (the retries need no sync of their own): group commit must have
    // shared syncs between appenders, not merely skipped the duplicates'.
    let syncs = log.stats().syncs;
    assert!(syncs < 1200, "group commit shares syncs: {syncs} fdatasyncs for 1600 events");
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
fn index_answers_queries_and_is_rebuilt_when_missing_corrupt_or_empty() {
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
    // Empty: rebuilt too.
    std::fs::remove_dir_all(dir.path().join(INDEX_DIR)).unwrap();
    std::fs::create_dir(dir.path().join(INDEX_DIR)).unwrap();
    let (log, report) = open(dir.path(), LogOptions::default());
    assert!(matches!(report.index, index::Reconciled::Rebuilt { .. }), "{:?}", report.index);
    assert_eq!(log.query(&index::Query::Kind("train.progress".into())).unwrap().len(), 9);
}

/// Copies a directory tree (an index taken from another log, say).
pub(super) fn copy_dir(from: &Path, to: &Path) {
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

/// Writes a log of a few events and returns (dir, the records of its only segment
/// without the pre-written zeros after them, offset of the last record).
fn small_log() -> (tempfile::TempDir, Vec<u8>, u64) {
    let dir = tempfile::tempdir().unwrap();
    let (log, _) = open(dir.path(), LogOptions::default());
    fill(&log, 4);
    let last_off = log.read(|v| v.positions_for_test(4));
    drop(log);
    let mut bytes = std::fs::read(&segments(dir.path())[0]).unwrap();
    let end = *record_starts(&bytes).last().unwrap();
    assert!(bytes.len() > end as usize, "space after the records is pre-written");
    assert!(bytes[end as usize..].iter().all(|&b| b == 0), "and holds zeros");
    bytes.truncate(end as usize);
    (dir, bytes, last_off)
}

/// Zeros as the writer leaves them after the last record.
const ZERO_TAIL: usize = 5000;

fn with_zero_tail(bytes: &[u8]) -> Vec<u8> {
    [bytes, &[0u8; ZERO_TAIL][..]].concat()
}

#[test]
fn torn_last_record_is_truncated_at_every_byte_offset() {
    let (_dir, bytes, last_off) = small_log();
    // A torn write leaves a prefix of the record, then whatever the file held after it:
    // nothing (an append), pre-written zeros, or zeros after a few bytes that are
    // neither (a write whose later sectors reached the disk but not its first ones).
    let garbage: Vec<u8> = (0..37u8).map(|i| i.wrapping_mul(97) | 1).collect();
    for layout in ["appended", "zeros after", "garbage then zeros"] {
        for cut in last_off as usize..bytes.len() {
            let dir = tempfile::tempdir().unwrap();
            bare_log(dir.path());
            let seg = &segments(dir.path())[0];
            let content = match layout {
                "appended" => bytes[..cut].to_vec(),
                "zeros after" => with_zero_tail(&bytes[..cut]),
                _ => with_zero_tail(&[&bytes[..cut], &garbage[..]].concat()),
            };
            std::fs::write(seg, &content).unwrap();
            // A record whose cut-off bytes are what the layout happened to put after the cut
            // is whole again (a signature may end in 0x00, or in the garbage's first byte;
            // signatures differ per run, as the envelope holds the time): it is the record,
            // not a tear, and only what follows it can be torn.
            let restored = layout != "appended" && content.get(cut..bytes.len()) == Some(&bytes[cut..]);
            let (log, report) = EventLog::open(dir.path(), key(), LogOptions::default()).unwrap();
            let (kept, valid_end) = if restored { (5, bytes.len() as u64) } else { (4, last_off) };
            assert_eq!(log.len(), kept, "{layout}, cut at {cut}: the valid prefix survives");
            let torn = layout == "garbage then zeros" || (!restored && cut > last_off as usize);
            assert_eq!(report.torn.is_some(), torn, "{layout}, cut at {cut}");
            if let Some(t) = &report.torn {
                // What was set aside is everything after the valid prefix but the zeros.
                let saved = std::fs::read(report.torn_saved_to.as_ref().unwrap()).unwrap();
                let want = &content[valid_end as usize..segment::nonzero_end(&content)];
                assert_eq!((t.offset, saved.as_slice()), (valid_end, want), "{layout}, cut at {cut}");
            }
            // Appends continue on the clean prefix.
            assert_eq!(log.append(AppendRequest::new("a.b", "s", json!({}))).unwrap().seq, kept);
            drop(log);
            assert!(verify::verify(dir.path(), pinned()).unwrap().ok());
            let reopened = LogReader::open(dir.path()).unwrap();
            assert_eq!((reopened.view().len(), reopened.torn()), (kept + 1, None), "{layout}, cut at {cut}");
        }
    }
}

#[test]
fn garbled_last_record_is_truncated_and_preserved() {
    let (_dir, bytes, last_off) = small_log();
    for pos in last_off as usize..bytes.len() {
        let dir = tempfile::tempdir().unwrap();
        bare_log(dir.path());
        let mut garbled = bytes.clone();
        garbled[pos] ^= 0x5a;
        std::fs::write(&segments(dir.path())[0], with_zero_tail(&garbled)).unwrap();
        // `log verify` (read-only) names the place before anything is repaired.
        let report = verify::verify(dir.path(), pinned()).unwrap();
        assert!(!report.ok(), "flip at {pos} undetected");
        assert_eq!(report.problems[0].offset, last_off, "flip at {pos}");
        let (log, report) = EventLog::open(dir.path(), key(), LogOptions::default()).unwrap();
        assert_eq!(log.len(), 4, "flip at {pos}");
        let saved = report.torn_saved_to.expect("torn bytes preserved");
        let end = segment::nonzero_end(&garbled);
        assert_eq!(std::fs::read(saved).unwrap(), garbled[last_off as usize..end].to_vec());
    }
}

#[test]
fn appends_overwrite_pre_written_space_and_zeros_end_every_segment() {
    let dir = tempfile::tempdir().unwrap();
    let size = |p: &Path| std::fs::metadata(p).unwrap().len();
    {
        let (log, _) = open(dir.path(), LogOptions { max_segment_bytes: 256 << 10, ..Default::default() });
        fill(&log, 3);
        let seg = &segments(dir.path())[0];
        let before = size(seg);
        fill(&log, 20);
        assert_eq!(size(seg), before, "appends inside pre-written space do not change the file size");
        // Enough to grow the space and to start more segments.
        for i in 0..40 {
            let pad = "p".repeat(20_000);
            log.append(AppendRequest::new("big.x", "s", json!({"i": i, "pad": pad}))).unwrap();
        }
    }
    let segs = segments(dir.path());
    assert!(segs.len() > 2, "rotation happened");
    for seg in &segs {
        let bytes = std::fs::read(seg).unwrap();
        assert!(bytes.len() as u64 <= 256 << 10, "{} is {} bytes", seg.display(), bytes.len());
    }
    assert!(verify::verify(dir.path(), pinned()).unwrap().ok());
    let (log, report) = open(dir.path(), LogOptions { max_segment_bytes: 256 << 10, ..Default::default() });
    assert_eq!((report.events, report.torn), (64, None));
    assert_eq!(log.append(AppendRequest::new("a.b", "s", json!({}))).unwrap().seq, 64);
    drop(log);
    let reader = LogReader::open(dir.path()).unwrap();
    assert_eq!(reader.view().len(), 65);
    assert_eq!(reader.view().event(64).unwrap().envelope.kind, "a.b");
}

#[test]
fn a_zero_hole_before_a_whole_record_is_damage_not_the_end() {
    let (_dir, bytes, last_off) = small_log();
    let dir = tempfile::tempdir().unwrap();
    bare_log(dir.path());
    // The record before the last one reads as zeros: the last one proves it was written.
    let starts = record_starts(&bytes);
    let hole = starts[starts.len() - 3] as usize;
    let mut damaged = bytes.clone();
    damaged[hole..last_off as usize].fill(0);
    let seg = segments(dir.path())[0].clone();
    std::fs::write(&seg, with_zero_tail(&damaged)).unwrap();
    let report = verify::verify(dir.path(), pinned()).unwrap();
    assert_eq!(report.problems[0].offset, hole as u64, "{:?}", report.problems);
    assert!(LogReader::open(dir.path()).is_err(), "readers refuse it too");
    let err = EventLog::open(dir.path(), key(), LogOptions::default()).err().expect("must refuse");
    assert!(err.to_string().contains(&format!("offset {hole}, seq 3")), "{err}");
    assert_eq!(std::fs::read(&seg).unwrap(), with_zero_tail(&damaged), "nothing was repaired");
}

#[test]
fn damage_before_the_tail_is_a_hard_error_naming_the_place() {
    let (_dir, bytes, _) = small_log();
    let dir = tempfile::tempdir().unwrap();
    bare_log(dir.path());
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
    bare_log(dir.path());
    let seg = segments(dir.path())[0].clone();
    for pos in 0..bytes.len() {
        let mut t = bytes.clone();
        t[pos] ^= 0x01;
        std::fs::write(&seg, with_zero_tail(&t)).unwrap();
        let report = verify::verify(dir.path(), pinned()).unwrap();
        assert!(!report.ok(), "flip at byte {pos} undetected");
        let owner = *starts.iter().rfind(|&&s| s <= pos as u64).unwrap();
        assert!(report.problems.iter().any(|p| p.offset == owner), "flip at {pos}: {:?}", report.problems);
    }
}

/// Where each record starts, and last where the records end (at the end of the bytes or
/// at a zero length).
fn record_starts(bytes: &[u8]) -> Vec<u64> {
    let mut out = vec![];
    let mut off = 0usize;
    while off < bytes.len() {
        out.push(off as u64);
        let len = record::parse_header(&bytes[off..]).0;
        if len == 0 {
            return out;
        }
        off += record::HEADER_LEN + len;
    }
    out.push(off as u64);
    out
}

#[test]
fn resigned_reordered_and_deleted_events_are_detected() {
    let (_dir, bytes, _) = small_log();
    let starts = record_starts(&bytes);
    let recs: Vec<Vec<u8>> = starts.windows(2).map(|w| bytes[w[0] as usize..w[1] as usize].to_vec()).collect();
    let dir = tempfile::tempdir().unwrap();
    bare_log(dir.path());
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
    let (log, _) = open(dir.path(), LogOptions { max_segment_bytes: 2048, ..Default::default() });
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

#[test]
fn a_failed_write_refuses_its_batch_and_the_batches_after_it_and_the_log_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let (log, _) = open(dir.path(), LogOptions::default());
    fill(&log, 3);
    let log = Arc::new(log);
    log.fail_next_write(std::io::ErrorKind::Other);
    let threads: Vec<_> = (0..8)
        .map(|t| {
            let log = log.clone();
            std::thread::spawn(move || {
                (0..40)
                    .map(|i| {
                        let r = AppendRequest::new("w.x", "s", json!({"t": t, "i": i})).with_id(format!("t{t}-{i}"));
                        (r.clone(), log.append(r))
                    })
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    let results: Vec<_> = threads.into_iter().flat_map(|t| t.join().unwrap()).collect();
    let refused: Vec<_> = results.iter().filter(|(_, r)| r.is_err()).collect();
    assert!(!refused.is_empty(), "the injected failure refused something");
    for (_, r) in &refused {
        assert!(matches!(r, Err(AppendError::Io(m)) if m.contains("injected write failure")), "{r:?}");
    }
    // A refused id is free again: the retry gets a new seq.
    for (req, _) in &refused {
        assert!(!log.append(req.clone()).unwrap().duplicate);
    }
    let acked: Vec<u64> = results.iter().filter_map(|(_, r)| r.as_ref().ok().map(|a| a.seq)).collect();
    assert_eq!(acked.iter().collect::<BTreeSet<_>>().len(), acked.len(), "no seq given twice");
    assert_eq!(log.len(), 4 + 320, "every append stored once");
    drop(log);
    assert!(verify::verify(dir.path(), pinned()).unwrap().ok());
    let (log, report) = open(dir.path(), LogOptions::default());
    assert_eq!((report.events, report.torn), (4 + 320, None));
    for seq in 1..log.len() {
        let id = log.get(seq).unwrap().envelope.id;
        if seq > 3 {
            assert!(id.starts_with('t'), "seq {seq} holds {id}");
        }
    }
}
