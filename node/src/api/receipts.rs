//! Proof of what the node made, over HTTP: a run's manifest, its receipt (exported now,
//! with the anchor's batch proof once anchored), a receipt checked here with every check
//! named, and the anchoring history with explorer links. All read-only, all open: a
//! third party needs no token to check a model.

use std::sync::Arc;

use axum::Json;
use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use serde::Deserialize;
use serde_json::{Value, json};

use super::ApiState;
use super::records::unreadable;
use crate::anchor::session::{Access, ChainOptions, ChainSession};
use crate::anchor::{AnchorError, run as anchor_run};
use crate::receipt::{self, ExportError, Receipt, Status, VerifyInputs, verify};
use crate::serve::openai::ApiError;

/// `GET /api/manifests/{run_id}/envelope`: the sealed manifest (DSSE envelope) of a run.
pub async fn manifest(State(s): State<Arc<ApiState>>, Path(run_id): Path<String>) -> Result<Json<Value>, ApiError> {
    let r = exported(&s, run_id).await?;
    Ok(Json(serde_json::to_value(&r.manifest).map_err(unreadable)?))
}

/// `GET /api/receipts/{run_id}`: the run's receipt bundle, as `mindxtrain receipt export`.
pub async fn export(State(s): State<Arc<ApiState>>, Path(run_id): Path<String>) -> Result<Json<Value>, ApiError> {
    let r = exported(&s, run_id).await?;
    Ok(Json(serde_json::to_value(&r).map_err(unreadable)?))
}

async fn exported(s: &ApiState, run_id: String) -> Result<Receipt, ApiError> {
    let dir = s.node_dir.clone();
    let done = tokio::task::spawn_blocking(move || receipt::export(&dir, &run_id)).await.map_err(unreadable)?;
    done.map_err(|e| match e {
        ExportError::NotSealed(_) => {
            ApiError::new(StatusCode::NOT_FOUND, "invalid_request_error", "not_sealed", e.to_string())
        }
        e => unreadable(e),
    })
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VerifyQuery {
    /// Ask the registry on chain too (default: yes, when this node has a deployment).
    chain: Option<bool>,
    /// Compare the manifest with the run's files, recipe and plan when the run was launched
    /// here (default: yes).
    local: Option<bool>,
}

/// `POST /api/receipts/verify?chain&local`: a receipt bundle (the body) checked offline —
/// manifest signature, statement, event, log inclusion, batch proof; the run's files, recipe
/// and plan when it was launched here — and then against the node's registry on chain. Every
/// check is in the answer, by name; `ok` is whether all passed.
pub async fn verify(
    State(s): State<Arc<ApiState>>,
    Query(q): Query<VerifyQuery>,
    body: Bytes,
) -> Result<Json<Value>, ApiError> {
    let receipt = Receipt::from_json(&body).map_err(|e| ApiError::invalid("receipt", format!("not a receipt: {e}")))?;
    let run_id = serde_json::from_str::<Value>(&receipt.event.envelope)
        .ok()
        .and_then(|e| e.get("subject").and_then(Value::as_str).map(str::to_owned));
    let local = match (q.local.unwrap_or(true), run_id) {
        (true, Some(id)) => {
            let state = s.clone();
            tokio::task::spawn_blocking(move || super::runs::files_of(&state, &id)).await.map_err(unreadable)?
        }
        _ => None,
    };
    // Hashing the run's files and checking signatures is CPU work: on the pool, not the executor.
    let (receipt, mut report) = s
        .cpu
        .run(move || {
            let inputs = match &local {
                Some([files, plan, recipe]) => VerifyInputs {
                    files: Some(files.as_path()),
                    recipe: Some(recipe.as_path()),
                    plan: Some(plan.as_path()),
                    trusted_key: None,
                },
                None => VerifyInputs::default(),
            };
            let report = verify::verify_receipt(&receipt, &inputs);
            (receipt, report)
        })
        .await?;
    if q.chain.unwrap_or(true) {
        let _one_at_a_time = s.chain_checks.lock().await;
        let dir = s.node_dir.clone();
        let session =
            tokio::task::spawn_blocking(move || ChainSession::open(&dir, &ChainOptions::default(), Access::Read))
                .await
                .map_err(unreadable)?;
        match session {
            Ok(session) => verify::check_on_chain(&mut report, receipt.anchor.as_ref(), &session.rpc_url).await,
            Err(AnchorError::Deployment(e)) => report.push("anchor.on_chain", Status::Skipped, e.to_string()),
            Err(e) => report.push("anchor.on_chain", Status::Unreachable, e.to_string()),
        }
    }
    Ok(Json(json!({"ok": report.ok(), "outcome": report.outcome(), "report": report})))
}

/// `GET /api/anchors`: every item to anchor (log checkpoints, manifests) with its state, the
/// confirmed batches with a link to the explorer where the chain has one, and failures.
pub async fn anchors(State(s): State<Arc<ApiState>>) -> Result<Json<Value>, ApiError> {
    let log = s.log.clone();
    let state = tokio::task::spawn_blocking(move || anchor_run::state_of_log(&log)).await.map_err(unreadable)?;
    let state = state.map_err(unreadable)?;
    let items: Vec<Value> = state
        .items
        .iter()
        .map(|item| {
            let confirmed = state.proof_of(&item.digest).map(|(_, c)| c);
            json!({"digest": hex::encode(item.digest), "label": item.label, "seq": item.seq,
                "state": if confirmed.is_some() { "anchored" } else { "pending" },
                "batch_seq": confirmed.map(|c| c.seq)})
        })
        .collect();
    let batches: Vec<Value> = state
        .confirmed
        .iter()
        .map(|c| {
            let tx = format!("{:#x}", c.tx);
            json!({"seq": c.seq, "root": hex::encode(c.root), "items": c.items.len(), "chain_id": c.chain_id,
                "registry": c.registry, "block": c.block, "timestamp": c.timestamp,
                "tx_link": mindxtrain_chain::network::tx_link(c.chain_id, &tx), "tx": tx})
        })
        .collect();
    let failed: Vec<Value> =
        state.failed.iter().map(|(seq, root, error)| json!({"seq": seq, "root": root, "error": error})).collect();
    Ok(Json(json!({"items": items, "batches": batches, "failed": failed})))
}
