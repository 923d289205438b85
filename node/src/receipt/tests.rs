//! Every kind of tampering is caught and named, from a real sealed run.

use super::verify::{Outcome, Status, VerifyInputs, verify_receipt};
use super::*;
use crate::manifest::tests::{Fixture, recipe_hash_only, sealed_run, sealed_run_of};
use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use mindxtrain_chain::batch::{AnchorPlace, Batch};
use mindxtrain_chain::{Address, B256};
use proptest::prelude::*;

fn anchored(f: &Fixture) -> Receipt {
    let mut r = export(f.node(), "run-1").unwrap();
    assert!(r.anchor.is_none(), "nothing was anchored on a chain");
    let d = r.manifest_digests().blake3;
    let batch = Batch::new([[9u8; 32], d, [7u8; 32]]).unwrap();
    let at = AnchorPlace {
        chain_id: 31337,
        registry: Address::repeat_byte(1),
        tx: B256::repeat_byte(2),
        block: 7,
        timestamp: 1_795_000_700,
    };
    r.anchor = Some(batch.proof(&d, &at).unwrap());
    r
}

fn inputs(f: &Fixture) -> (std::path::PathBuf, std::path::PathBuf, std::path::PathBuf) {
    (f.out(), f.node().join("recipe.yaml"), f.node().join("plan.json"))
}

/// Statuses of the named checks that did not pass.
fn failures(report: &Report) -> Vec<(String, Status)> {
    report
        .checks
        .iter()
        .filter(|c| !matches!(c.status, Status::Pass | Status::Skipped))
        .map(|c| (c.name.clone(), c.status))
        .collect()
}

fn run_checks(f: &Fixture, r: &Receipt, key: Option<ed25519_dalek::VerifyingKey>) -> Report {
    let (out, recipe, plan) = inputs(f);
    verify_receipt(r, &VerifyInputs { files: Some(&out), recipe: Some(&recipe), plan: Some(&plan), trusted_key: key })
}

fn flip(path: &std::path::Path, at: usize) {
    let mut b = std::fs::read(path).unwrap();
    let i = at.min(b.len() - 1);
    b[i] ^= 0x01;
    std::fs::write(path, b).unwrap();
}

#[test]
fn an_untouched_receipt_verifies_every_line() {
    let f = sealed_run();
    let r = anchored(&f);
    let report = run_checks(&f, &r, Some(f.key.verifying_key()));
    assert!(report.ok(), "{:#?}", report.checks);
    assert!(report.anchored && report.key_pinned);
    let names: Vec<&str> = report.checks.iter().map(|c| c.name.as_str()).collect();
    for want in [
        "manifest.signature",
        "manifest.statement",
        "manifest.log_checkpoint",
        "file:adapter/adapter_model.safetensors",
        "file:eval.json",
        "recipe",
        "plan",
        "event.manifest_digest",
        "event.signature",
        "log.checkpoint",
        "log.inclusion",
        "anchor.batch_proof",
    ] {
        assert!(names.contains(&want), "missing check {want}: {names:?}");
    }
    // The receipt survives its JSON round trip byte for byte.
    assert_eq!(Receipt::from_json(&r.to_json_pretty()).unwrap(), r);
}

#[test]
fn an_unanchored_receipt_says_so_and_still_verifies_offline() {
    let f = sealed_run();
    let r = export(f.node(), "run-1").unwrap();
    let report = run_checks(&f, &r, None);
    assert!(report.ok() && !report.anchored);
    let line = report.checks.iter().find(|c| c.name == "anchor.batch_proof").unwrap();
    assert_eq!(line.status, Status::Skipped);
    assert!(line.detail.contains("not anchored"));
}

#[test]
fn one_byte_of_a_weight_file_is_caught() {
    let f = sealed_run();
    let r = anchored(&f);
    flip(&f.out().join("adapter/adapter_model.safetensors"), 123_456);
    let rep = run_checks(&f, &r, None);
    assert_eq!(failures(&rep), [("file:adapter/adapter_model.safetensors".to_string(), Status::Fail)]);
    assert_eq!(rep.outcome(), Outcome::Tampered);
}

#[test]
fn recipe_plan_and_eval_changes_are_caught_and_named() {
    let f = sealed_run();
    let r = anchored(&f);
    let (out, recipe, plan) = inputs(&f);
    flip(&recipe, 10);
    flip(&plan, 3);
    flip(&out.join("eval.json"), 5);
    let got = failures(&run_checks(&f, &r, None));
    assert_eq!(
        got,
        [
            ("file:eval.json".to_string(), Status::Fail),
            ("recipe".to_string(), Status::Fail),
            ("plan".to_string(), Status::Fail)
        ]
    );
}

#[test]
fn a_missing_file_is_missing_input_not_tampering() {
    let f = sealed_run();
    let r = anchored(&f);
    std::fs::remove_file(f.out().join("adapter/adapter_config.json")).unwrap();
    let rep = run_checks(&f, &r, None);
    assert_eq!(failures(&rep), [("file:adapter/adapter_config.json".to_string(), Status::Missing)]);
    assert_eq!(rep.outcome(), Outcome::MissingInput);
}

#[test]
fn a_changed_manifest_or_signature_is_caught() {
    let f = sealed_run();
    let r = anchored(&f);
    // The payload: one byte of the statement.
    let mut changed = r.clone();
    let mut payload = changed.manifest.payload_bytes().unwrap();
    let at = payload.windows(4).position(|w| w == b"1.25").unwrap();
    payload[at] = b'0';
    changed.manifest.payload = B64.encode(&payload);
    let got = failures(&run_checks(&f, &changed, None));
    assert!(got.contains(&("manifest.signature".into(), Status::Fail)), "{got:?}");
    // The digest moved too, so the log event and the anchor no longer vouch for it.
    assert!(got.contains(&("event.manifest_digest".into(), Status::Fail)), "{got:?}");
    assert!(got.contains(&("anchor.batch_proof".into(), Status::Fail)), "{got:?}");

    let mut sig = r.clone();
    let mut raw = B64.decode(&sig.manifest.signatures[0].sig).unwrap();
    raw[5] ^= 0x40;
    sig.manifest.signatures[0].sig = B64.encode(raw);
    let got = failures(&run_checks(&f, &sig, None));
    assert!(got.contains(&("manifest.signature".into(), Status::Fail)), "{got:?}");
}

#[test]
fn a_different_signing_key_is_caught_with_and_without_pinning() {
    let f = sealed_run();
    let r = anchored(&f);
    let other = crate::identity::Identity::from_seed([42; 32]);
    // Pinned to another key: nothing verifies under it.
    let got = failures(&run_checks(&f, &r, Some(other.verifying_key())));
    assert!(got.contains(&("manifest.signature".into(), Status::Fail)), "{got:?}");
    assert!(got.contains(&("log.checkpoint".into(), Status::Fail)), "{got:?}");
    // Re-signed by another key (keyid too): the log's event and checkpoint betray it.
    let mut resigned = r.clone();
    resigned.manifest = Envelope::sign(&r.manifest.payload_type, &r.manifest.payload_bytes().unwrap(), &other);
    let got = failures(&run_checks(&f, &resigned, None));
    assert!(got.contains(&("event.signature".into(), Status::Fail)), "{got:?}");
    assert!(got.contains(&("manifest.log_checkpoint".into(), Status::Fail)), "{got:?}");
    let got = failures(&run_checks(&f, &resigned, Some(f.key.verifying_key())));
    assert!(got.contains(&("manifest.signature".into(), Status::Fail)), "{got:?}");
}

#[test]
fn proof_hashes_roots_and_checkpoints_are_checked() {
    let f = sealed_run();
    let r = anchored(&f);
    let mut bad_path = r.clone();
    let h = &mut bad_path.inclusion[0];
    *h = format!("{}{}", if h.starts_with('0') { "1" } else { "0" }, &h[1..]);
    assert_eq!(failures(&run_checks(&f, &bad_path, None)), [("log.inclusion".to_string(), Status::Fail)]);

    let mut wrong_root = r.clone();
    wrong_root.anchor.as_mut().unwrap().root[0] ^= 1;
    assert_eq!(failures(&run_checks(&f, &wrong_root, None)), [("anchor.batch_proof".to_string(), Status::Fail)]);

    let mut batch_path = r.clone();
    batch_path.anchor.as_mut().unwrap().proof[0][31] ^= 1;
    assert_eq!(failures(&run_checks(&f, &batch_path, None)), [("anchor.batch_proof".to_string(), Status::Fail)]);

    let mut note = r.clone();
    note.checkpoint =
        note.checkpoint.replacen(&format!("\n{}\n", note.event.seq + 2), &format!("\n{}\n", note.event.seq + 3), 1);
    let got = failures(&run_checks(&f, &note, None));
    assert!(got.contains(&("log.checkpoint".into(), Status::Fail)), "{got:?}");

    let mut event = r.clone();
    event.event.envelope = event.event.envelope.replacen("\"run-1\"", "\"run-2\"", 1);
    let got = failures(&run_checks(&f, &event, None));
    assert!(got.contains(&("event.signature".into(), Status::Fail)), "{got:?}");
}

#[test]
fn verification_needs_nothing_from_the_node() {
    let f = sealed_run();
    let r = anchored(&f);
    // Copy the run's files out, then delete the node directory entirely.
    let elsewhere = tempfile::tempdir().unwrap();
    let files = elsewhere.path().join("files");
    std::fs::create_dir_all(files.join("adapter")).unwrap();
    std::fs::create_dir_all(files.join("checkpoints/step-00000010")).unwrap();
    for name in [
        "adapter/adapter_model.safetensors",
        "adapter/adapter_config.json",
        "checkpoints/step-00000010/adapter_config.json",
        "eval.json",
    ] {
        std::fs::copy(f.out().join(name), files.join(name)).unwrap();
    }
    let recipe = elsewhere.path().join("run.yaml");
    std::fs::copy(f.node().join("recipe.yaml"), &recipe).unwrap();
    let pinned = f.key.verifying_key();
    let Fixture { dir, log, .. } = f;
    drop(log);
    drop(dir);
    let rep = verify_receipt(
        &r,
        &VerifyInputs { files: Some(&files), recipe: Some(&recipe), plan: None, trusted_key: Some(pinned) },
    );
    assert!(rep.ok(), "{:#?}", rep.checks);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_bytes_never_panic_the_parser(bytes in proptest::collection::vec(any::<u8>(), 0..2048)) {
        let _ = Receipt::from_json(&bytes);
    }

    #[test]
    fn mutated_receipts_never_panic_and_never_pass(seed in any::<u64>()) {
        thread_local! {
            static FIX: (Fixture, Vec<u8>) = {
                let f = sealed_run();
                let bytes = anchored(&f).to_json_pretty();
                (f, bytes)
            };
        }
        FIX.with(|(f, bytes)| {
            let mut b = bytes.clone();
            let i = (seed as usize) % b.len();
            let new = (seed >> 32) as u8;
            let changed = b[i] != new;
            b[i] = new;
            if let Ok(r) = Receipt::from_json(&b) {
                let rep = run_checks(f, &r, None);
                let original = Receipt::from_json(bytes).unwrap();
                // Where the root was anchored (chain, registry, tx, block, time) is only
                // checkable on chain; the hex case of a value carries no meaning.
                let mut same = r.clone();
                if let (Some(a), Some(o)) = (same.anchor.as_mut(), original.anchor.as_ref()) {
                    (a.chain_id, a.registry, a.tx, a.block, a.timestamp) = (o.chain_id, o.registry, o.tx, o.block, o.timestamp);
                }
                let harmless = !changed || same == original || bytes[i].eq_ignore_ascii_case(&new);
                prop_assert!(!rep.ok() || harmless, "byte {i} {:?}->{:?} passed", bytes[i] as char, new as char);
            }
            Ok(())
        })?;
    }
}

#[test]
fn a_receipt_whose_manifest_leaves_items_out_verifies_and_names_them() {
    let f = sealed_run_of(&recipe_hash_only());
    let r = export(f.node(), "run-1").unwrap();
    let report = run_checks(&f, &r, Some(f.key.verifying_key()));
    assert!(report.ok(), "{:#?}", report.checks);
    let line = |name: &str| report.checks.iter().find(|c| c.name == name).unwrap_or_else(|| panic!("no {name}"));
    let include = line("manifest.include");
    assert_eq!(include.status, Status::Pass);
    for item in
        ["dataset_hashes", "code_version", "hardware", "plan", "eval_report", "energy_kwh", "event_log", "checkpoints"]
    {
        assert!(include.detail.contains(item), "{item} not named: {}", include.detail);
    }
    let (log, plan) = (line("manifest.log_checkpoint"), line("plan"));
    assert!(log.status == Status::Skipped && log.detail.contains("event_log"), "{log:?}");
    assert!(plan.status == Status::Skipped && plan.detail.contains("receipt.include"), "{plan:?}");
    // The files it still binds are checked: eval.json is a subject, not a byproduct now.
    assert_eq!(line("file:eval.json").status, Status::Pass);
    assert!(report.checks.iter().all(|c| !c.name.starts_with("file:checkpoints/")), "no step checkpoint is a subject");

    // A full manifest says so; one that carries what it claims to leave out is refused.
    let full = sealed_run();
    let report = run_checks(&full, &export(full.node(), "run-1").unwrap(), Some(full.key.verifying_key()));
    let include = report.checks.iter().find(|c| c.name == "manifest.include").unwrap();
    assert!(include.status == Status::Pass && include.detail.contains("every item"), "{include:?}");
}

/// `r` as a receipt of run `id` (its statement edited, its signature no longer valid: the
/// writer reads the run id, it does not verify).
fn receipt_of(r: &Receipt, id: &str) -> Receipt {
    let mut statement: serde_json::Value = serde_json::from_slice(&r.manifest.payload_bytes().unwrap()).unwrap();
    statement["predicate"]["runDetails"]["metadata"]["invocationId"] = id.into();
    let mut other = r.clone();
    other.manifest.payload = B64.encode(serde_json::to_vec(&statement).unwrap());
    other
}

#[test]
fn a_runs_receipt_replaces_its_own_and_never_another_runs() {
    let f = sealed_run();
    let r = export(f.node(), "run-1").unwrap();
    let path = f.node().join("sub/r.json");
    write_for_run(&path, &r).unwrap();
    assert_eq!(Receipt::from_json(&std::fs::read(&path).unwrap()).unwrap(), r);
    write_for_run(&path, &r).unwrap();
    assert_eq!(occupant(&path, Some("run-1")).unwrap(), None);

    let other = receipt_of(&r, "run-2");
    std::fs::write(&path, other.to_json_pretty()).unwrap();
    let e = write_for_run(&path, &r).unwrap_err().to_string();
    assert!(e.contains("the receipt of run run-2") && e.contains("receipt.output"), "{e}");
    assert_eq!(Receipt::from_json(&std::fs::read(&path).unwrap()).unwrap(), other, "left as it was");
    std::fs::write(&path, b"my notes").unwrap();
    assert!(write_for_run(&path, &r).unwrap_err().to_string().contains("not a receipt"));
    assert_eq!(occupant(&path, None).unwrap().as_deref(), Some("a file that is not a receipt"));
}
