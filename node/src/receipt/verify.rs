//! Verifying a receipt (or a bare manifest) offline, then optionally on chain. Every
//! check is a named line with a status, so a failure says exactly what was tampered with.

use super::Receipt;
use crate::canonical;
use crate::identity;
use crate::log::checkpoint::{self, Checkpoint};
use crate::log::record::{Envelope as EventEnvelope, SIGNATURE_CONTEXT};
use crate::manifest::digest::{self, Digests, HashOptions, parse_hex32};
use crate::manifest::statement::{Parameter, ReceiptItem, Statement, item_name};
use crate::manifest::{self, Envelope, KIND_SEALED};
use ed25519_dalek::VerifyingKey;
use mindxtrain_chain::batch::BatchProof;
use mindxtrain_chain::merkle;
use mindxtrain_chain::rpc::RetryPolicy;
use mindxtrain_chain::{Anchorer, AnchorerConfig};
use serde::Serialize;
use std::path::{Component, Path};
use std::time::Duration;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    Pass,
    /// The bytes do not match what was signed or proven: tampering (or the wrong input).
    Fail,
    /// An input the check needs is absent (a subject file not in `--files`).
    Missing,
    /// The chain could not be asked.
    Unreachable,
    /// Not checked: the input was not given, or the receipt has no such part.
    Skipped,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Check {
    pub name: String,
    pub status: Status,
    pub detail: String,
}

/// The verdict, worst first: tampering beats a missing input beats an unreachable chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    Verified,
    Tampered,
    MissingInput,
    ChainUnreachable,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct Report {
    pub run_id: Option<String>,
    /// Hex BLAKE3 of the manifest's canonical bytes (the anchored digest).
    pub manifest_blake3: Option<String>,
    pub manifest_sha256: Option<String>,
    /// Hex public key the signatures were checked against.
    pub signer: Option<String>,
    pub key_pinned: bool,
    pub anchored: bool,
    pub checks: Vec<Check>,
}

impl Report {
    pub fn outcome(&self) -> Outcome {
        let has = |s: Status| self.checks.iter().any(|c| c.status == s);
        if has(Status::Fail) {
            Outcome::Tampered
        } else if has(Status::Missing) {
            Outcome::MissingInput
        } else if has(Status::Unreachable) {
            Outcome::ChainUnreachable
        } else {
            Outcome::Verified
        }
    }

    pub fn ok(&self) -> bool {
        self.outcome() == Outcome::Verified
    }

    pub fn push(&mut self, name: impl Into<String>, status: Status, detail: impl Into<String>) {
        self.checks.push(Check { name: name.into(), status, detail: detail.into() });
    }

    fn result(&mut self, name: &str, r: Result<String, String>) -> bool {
        let ok = r.is_ok();
        match r {
            Ok(d) => self.push(name, Status::Pass, d),
            Err(d) => self.push(name, Status::Fail, d),
        }
        ok
    }
}

/// The local inputs to compare against the manifest.
#[derive(Debug, Clone, Default)]
pub struct VerifyInputs<'a> {
    /// Directory holding the subjects (by their relative names) and eval.json.
    pub files: Option<&'a Path>,
    pub recipe: Option<&'a Path>,
    pub plan: Option<&'a Path>,
    /// The key the node must have signed with; without it the envelope's keyid is used.
    pub trusted_key: Option<VerifyingKey>,
}

/// Offline checks of a whole receipt.
pub fn verify_receipt(receipt: &Receipt, inputs: &VerifyInputs) -> Report {
    let mut report = Report::default();
    if receipt.v != super::RECEIPT_VERSION {
        report.push(
            "receipt.version",
            Status::Fail,
            format!("version {} (this build reads {})", receipt.v, super::RECEIPT_VERSION),
        );
    }
    let key = check_manifest(&receipt.manifest, inputs, &mut report);
    let digests = receipt.manifest_digests();
    let event_hash = check_event(receipt, key.as_ref(), &digests, &mut report);
    check_log(receipt, key.as_ref(), event_hash, &mut report);
    check_anchor_offline(receipt.anchor.as_ref(), &digests, &mut report);
    report
}

/// Offline checks of a bare manifest (the seeds' `mindxtrain receipt <manifest.json>`):
/// signature, statement, files, recipe and plan. Log and anchor parts are reported as
/// skipped: a bare manifest carries no proofs.
pub fn verify_manifest(envelope: &Envelope, inputs: &VerifyInputs) -> Report {
    let mut report = Report::default();
    check_manifest(envelope, inputs, &mut report);
    report.push("log.inclusion", Status::Skipped, "a bare manifest carries no log proof (export a receipt)");
    report.push("anchor.batch_proof", Status::Skipped, "a bare manifest carries no anchor proof (export a receipt)");
    report
}

/// Resolves the key, checks the envelope and everything the statement names; returns
/// the key used.
fn check_manifest(envelope: &Envelope, inputs: &VerifyInputs, report: &mut Report) -> Option<VerifyingKey> {
    let digests = Digests::of_bytes(&envelope.to_canonical());
    report.manifest_blake3 = Some(hex::encode(digests.blake3));
    report.manifest_sha256 = Some(hex::encode(digests.sha256));
    let key = match (&inputs.trusted_key, envelope.signer_hint()) {
        (Some(k), _) => {
            report.key_pinned = true;
            Some(*k)
        }
        (None, Ok(k)) => Some(k),
        (None, Err(e)) => {
            report.push("manifest.signature", Status::Fail, e.to_string());
            None
        }
    };
    report.signer = key.map(|k| hex::encode(k.to_bytes()));
    if let Some(k) = &key {
        let how = if report.key_pinned {
            "pinned by --trusted-key"
        } else {
            "key from the envelope; pin it with --trusted-key"
        };
        let r = envelope.verify(k).map(|_| format!("DSSE signature by {} ({how})", hex::encode(k.to_bytes())));
        report.result("manifest.signature", r.map_err(|e| e.to_string()));
    }
    if envelope.payload_type != manifest::dsse::IN_TOTO_PAYLOAD_TYPE {
        report.push("manifest.payload_type", Status::Fail, format!("{:?}", envelope.payload_type));
    }
    // Parse even if the signature failed, so the remaining lines still name what differs.
    let statement = envelope
        .payload_bytes()
        .map_err(|e| e.to_string())
        .and_then(|p| manifest::parse_statement(&p).map_err(|e| e.to_string()));
    let statement = match statement {
        Ok(s) => {
            report.push(
                "manifest.statement",
                Status::Pass,
                format!("in-toto v1, SLSA provenance v1, run {}", s.run_id()),
            );
            report.run_id = Some(s.run_id().to_string());
            s
        }
        Err(e) => {
            report.push("manifest.statement", Status::Fail, e);
            return key;
        }
    };
    check_include(&statement, report);
    check_sealed_checkpoint(&statement, key.as_ref(), report);
    check_files(&statement, inputs.files, report);
    let params = &statement.predicate.build_definition;
    check_parameter("recipe", Some(&params.external_parameters.recipe), inputs.recipe, "--config", report);
    if statement.omitted().contains(&ReceiptItem::Plan) && params.internal_parameters.plan.is_none() {
        report.push(
            "plan",
            Status::Skipped,
            "left out by the recipe's receipt.include: the plan is not compared (the run's plan.json, a subject, \
             is checked with --files)",
        );
    } else {
        check_parameter("plan", params.internal_parameters.plan.as_ref(), inputs.plan, "--plan", report);
    }
    key
}

/// `manifest.include`: what the recipe's `receipt.include` left out of the statement, named, and
/// none of it carried all the same.
fn check_include(s: &Statement, report: &mut Report) {
    const NAME: &str = "manifest.include";
    let Some(items) = &s.predicate.run_details.mindxtrain_receipt else {
        report.push(NAME, Status::Skipped, "sealed before receipt.include was recorded: it carries every item");
        return;
    };
    let names = |items: &[ReceiptItem]| items.iter().map(|i| item_name(*i)).collect::<Vec<_>>().join(", ");
    let carried: Vec<ReceiptItem> = items.omitted.iter().copied().filter(|i| s.carries(*i)).collect();
    let r = if !carried.is_empty() {
        Err(format!("receipt.include left out {}, but the manifest carries it", names(&carried)))
    } else if items.omitted.is_empty() {
        Ok("every item (receipt.include lists them all)".to_string())
    } else {
        Ok(format!("left out by the recipe's receipt.include: {}", names(&items.omitted)))
    };
    report.result(NAME, r);
}

fn check_sealed_checkpoint(s: &Statement, key: Option<&VerifyingKey>, report: &mut Report) {
    let Some(key) = key else { return };
    let Some(pos) = &s.predicate.run_details.mindxtrain_log else {
        report.push(
            "manifest.log_checkpoint",
            Status::Skipped,
            "left out by the recipe's receipt.include (event_log): the manifest names no event range",
        );
        return;
    };
    let r = Checkpoint::verify(&pos.checkpoint, key).map_err(|e| e.to_string()).and_then(|cp| {
        if cp.origin != checkpoint::origin_for(&key.to_bytes()) {
            return Err(format!("origin {} is not the signer's log", cp.origin));
        }
        if pos.last_seq >= cp.size || pos.first_seq > pos.last_seq {
            return Err(format!(
                "run events {}..={} are not inside its {} events",
                pos.first_seq, pos.last_seq, cp.size
            ));
        }
        Ok(format!(
            "events {}..={} in a log of {} events, root {}",
            pos.first_seq,
            pos.last_seq,
            cp.size,
            hex::encode(cp.root)
        ))
    });
    report.result("manifest.log_checkpoint", r);
}

/// A subject name is used as a path under `--files`: only plain relative components.
fn safe_relative(name: &str) -> bool {
    !name.is_empty() && Path::new(name).components().all(|c| matches!(c, Component::Normal(_)))
}

fn check_files(s: &Statement, dir: Option<&Path>, report: &mut Report) {
    let Some(dir) = dir else {
        report.push("files", Status::Skipped, format!("{} subject(s) not checked (no --files DIR)", s.subject.len()));
        return;
    };
    let mut named: Vec<(String, &manifest::digest::DigestSet, bool)> =
        s.subject.iter().map(|sub| (sub.name.clone(), &sub.digest, true)).collect();
    if let Some(eval) = s.eval()
        && let (Some(name), Some(d)) = (&eval.name, &eval.digest)
        && !named.iter().any(|(n, _, _)| n == name)
    {
        named.push((name.clone(), d, false));
    }
    for (name, set, required) in named {
        let label = format!("file:{name}");
        if !safe_relative(&name) {
            report.push(label, Status::Fail, "unsafe subject name (absolute, or with ..)");
            continue;
        }
        let Some(want) = set.digests() else {
            report.push(label, Status::Fail, "the manifest lacks its sha256 and blake3");
            continue;
        };
        let path = dir.join(&name);
        if !path.is_file() {
            let status = if required { Status::Missing } else { Status::Skipped };
            report.push(label, status, format!("{} not found", path.display()));
            continue;
        }
        let r = match digest::hash_file(&path, HashOptions::default()) {
            Ok(got) => compare(&got.digests, &want).map(|()| format!("{} bytes, sha256 and blake3 match", got.size)),
            Err(e) => {
                report.push(label, Status::Missing, format!("{}: {e}", path.display()));
                continue;
            }
        };
        report.result(&label, r);
    }
}

fn compare(got: &Digests, want: &Digests) -> Result<(), String> {
    match (got.sha256 == want.sha256, got.blake3 == want.blake3) {
        (true, true) => Ok(()),
        (false, false) => Err(format!(
            "sha256 {} and blake3 {} differ from the manifest",
            hex::encode(got.sha256),
            hex::encode(got.blake3)
        )),
        (false, true) => Err(format!(
            "sha256 {} differs from the manifest (blake3 matches: a collision attempt?)",
            hex::encode(got.sha256)
        )),
        (true, false) => Err(format!("blake3 {} differs from the manifest (sha256 matches)", hex::encode(got.blake3))),
    }
}

fn check_parameter(name: &str, param: Option<&Parameter>, given: Option<&Path>, flag: &str, report: &mut Report) {
    match (param, given) {
        (None, None) => report.push(name, Status::Skipped, format!("the run had no {name}")),
        (None, Some(p)) => {
            report.push(name, Status::Fail, format!("{} given, but the manifest records no {name}", p.display()))
        }
        (Some(param), None) => report.push(
            name,
            Status::Skipped,
            format!(
                "{} ({}) not compared (pass {flag} FILE)",
                param.name,
                param.digest.blake3.as_deref().unwrap_or("?")
            ),
        ),
        (Some(param), Some(path)) => match (std::fs::read(path), param.digest.digests()) {
            (Err(e), _) => report.push(name, Status::Missing, format!("{}: {e}", path.display())),
            (_, None) => report.push(name, Status::Fail, "the manifest lacks its sha256 and blake3"),
            (Ok(bytes), Some(want)) => {
                let r = compare(&Digests::of_bytes(&bytes), &want)
                    .map(|()| format!("{} matches {} byte for byte", path.display(), param.name));
                report.result(name, r);
            }
        },
    }
}

/// Checks the `manifest.sealed` event; returns the hash of its bytes.
fn check_event(receipt: &Receipt, key: Option<&VerifyingKey>, digests: &Digests, report: &mut Report) -> [u8; 32] {
    let ev = &receipt.event;
    let hash = *blake3::hash(ev.envelope.as_bytes()).as_bytes();
    let parsed: Result<EventEnvelope, String> = serde_json::from_str(&ev.envelope).map_err(|e| e.to_string());
    let r = parsed.and_then(|env| {
        let canon = serde_json::to_value(&env)
            .map_err(|e| e.to_string())
            .and_then(|v| canonical::to_vec(&v).map_err(|e| e.to_string()))?;
        if canon != ev.envelope.as_bytes() {
            return Err("the event envelope is not in canonical form".into());
        }
        if env.kind != KIND_SEALED || env.seq != ev.seq {
            return Err(format!("event is {} at seq {}, expected {KIND_SEALED} at seq {}", env.kind, env.seq, ev.seq));
        }
        let field = |k: &str| env.data.get(k).and_then(|v| v.as_str()).and_then(parse_hex32);
        if field("blake3") != Some(digests.blake3) || field("sha256") != Some(digests.sha256) {
            return Err(format!("the event records another manifest digest than {}", hex::encode(digests.blake3)));
        }
        if let Some(run) = &report.run_id
            && env.subject != *run
        {
            return Err(format!("the event is for run {:?}, the manifest for {run:?}", env.subject));
        }
        Ok(())
    });
    report.result(
        "event.manifest_digest",
        r.map(|()| format!("manifest.sealed at seq {} records this manifest", ev.seq)),
    );
    if let Some(key) = key {
        let sig: Option<[u8; 64]> = hex::decode(&ev.sig).ok().and_then(|b| b.try_into().ok());
        let mut msg = SIGNATURE_CONTEXT.to_vec();
        msg.extend_from_slice(&hash);
        let r = match sig {
            Some(sig) if identity::verify(key, &msg, &sig) => Ok(format!("event hash {}", hex::encode(hash))),
            Some(_) => Err("the event signature does not verify under the signer's key".to_string()),
            None => Err("the event signature is not 64 bytes of hex".to_string()),
        };
        report.result("event.signature", r);
    }
    // Inclusion is about these exact bytes, whatever they say: a digest mismatch above
    // must not also fail the log proof, or one tampering would be reported twice.
    hash
}

fn check_log(receipt: &Receipt, key: Option<&VerifyingKey>, hash: [u8; 32], report: &mut Report) {
    let Some(key) = key else { return };
    let cp = Checkpoint::verify(&receipt.checkpoint, key).map_err(|e| e.to_string()).and_then(|cp| {
        if cp.origin == checkpoint::origin_for(&key.to_bytes()) {
            Ok(cp)
        } else {
            Err(format!("origin {} is not the signer's log", cp.origin))
        }
    });
    let cp = match cp {
        Ok(cp) => {
            report.push("log.checkpoint", Status::Pass, format!("{} events, root {}", cp.size, hex::encode(cp.root)));
            cp
        }
        Err(e) => {
            report.push("log.checkpoint", Status::Fail, e);
            return;
        }
    };
    let proof: Option<Vec<[u8; 32]>> = receipt.inclusion.iter().map(|h| parse_hex32(h)).collect();
    let r = match proof {
        None => Err("a proof hash is not 64 hex digits".to_string()),
        Some(p) => merkle::verify_inclusion(&merkle::leaf_hash(&hash), receipt.event.seq, cp.size, &p, &cp.root)
            .map(|()| {
                format!("event {} is leaf {} of the checkpoint's {}", hex::encode(hash), receipt.event.seq, cp.size)
            })
            .map_err(|e| e.to_string()),
    };
    report.result("log.inclusion", r);
}

fn check_anchor_offline(anchor: Option<&BatchProof>, digests: &Digests, report: &mut Report) {
    let Some(p) = anchor else {
        report.push("anchor.batch_proof", Status::Skipped, "not anchored (the receipt has no anchor)");
        return;
    };
    let r = if p.digest != digests.blake3 {
        Err(format!("the batch proof is for digest {}, not this manifest", hex::encode(p.digest)))
    } else {
        p.verify().map_err(|e| e.to_string()).map(|()| {
            format!(
                "leaf {} of {} under root {} (chain {}, registry {:#x}, block {}, tx {:#x})",
                p.leaf_index,
                p.tree_size,
                hex::encode(p.root),
                p.chain_id,
                p.registry,
                p.block,
                p.tx
            )
        })
    };
    report.anchored = report.result("anchor.batch_proof", r);
}

/// Asks the registry at `rpc_url` whether it holds the proof's root at the claimed block
/// (and time and tx). Adds the `anchor.on_chain` line.
pub async fn check_on_chain(report: &mut Report, anchor: Option<&BatchProof>, rpc_url: &str) {
    const NAME: &str = "anchor.on_chain";
    let Some(p) = anchor else {
        report.push(NAME, Status::Fail, "--rpc-url given, but the receipt is not anchored");
        return;
    };
    let retry = RetryPolicy { attempts: 3, call_timeout: Duration::from_secs(15), ..RetryPolicy::default() };
    let anchorer = match Anchorer::new(AnchorerConfig::new(rpc_url, p.chain_id, p.registry).with_retry(retry)) {
        Ok(a) => a,
        Err(e) => return report.push(NAME, Status::Missing, e.to_string()),
    };
    match anchorer.lookup(p.root_b256()).await {
        Ok(record) => {
            let r = p.verify_against(record.as_ref()).map_err(|e| e.to_string()).map(|()| {
                format!(
                    "registry {:#x} on chain {} holds root {} since block {}",
                    p.registry,
                    p.chain_id,
                    hex::encode(p.root),
                    p.block
                )
            });
            report.result(NAME, r);
        }
        Err(e) if e.is_transient() => report.push(NAME, Status::Unreachable, e.to_string()),
        // A wrong chain id or no registry code at the address: the claim is false there.
        Err(e) => report.push(NAME, Status::Fail, e.to_string()),
    }
}
