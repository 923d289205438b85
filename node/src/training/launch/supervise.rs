//! The launcher of node 0 between its ranks and its node: rendezvous, rank 0's events into the
//! log, progress and cancels, and the stop of every rank when one fails.

use super::spawn::LocalRanks;
use super::{Job, Launch, RankCommand};
use mindxtrain_trainer::collective::rendezvous::{Conn, Down, Incoming, Roster, Server, Up};
use mindxtrain_trainer::plan::OpTiming;
use mindxtrain_trainer::run::{EvalReport, Observer, RunSummary, StepReport};
use serde_json::{Value, json};
use std::sync::mpsc::{RecvTimeoutError, channel};
use std::time::{Duration, Instant};

/// How long ranks get to stop by themselves once told to, before they are killed.
const STOP_GRACE: Duration = Duration::from_secs(10);

/// What the ranks did.
#[derive(Debug)]
pub enum Outcome {
    Finished(Box<RunSummary>),
    /// Every rank stopped after `step`, checkpointed (a cancel).
    Cancelled {
        step: u64,
    },
    /// Rank 0's timings (the probe's collective stage).
    Probe(Vec<OpTiming>),
}

/// Events the trainer's rank 0 reports for display, as they travel to the launcher.
pub(super) fn progress_call(call: &str, data: Value) -> Value {
    json!({"call": call, "data": data})
}

fn replay(observer: &mut dyn Observer, v: &Value) {
    let data = &v["data"];
    match v["call"].as_str() {
        Some("started") => {
            observer.started(data["first_step"].as_u64().unwrap_or(0), data["total_steps"].as_u64().unwrap_or(0))
        }
        Some("step") => {
            if let Ok(r) = serde_json::from_value::<StepReport>(data.clone()) {
                observer.step(&r);
            }
        }
        Some("note") => observer.note(data.as_str().unwrap_or_default()),
        Some("evaluated") => {
            if let Ok(r) = serde_json::from_value::<EvalReport>(data.clone()) {
                observer.evaluated(&r);
            }
        }
        _ => {}
    }
}

struct State {
    node_rank: usize,
    ranks_per_node: usize,
    conns: Vec<Option<Conn>>,
    agents: Vec<Conn>,
    welcomed: bool,
    failure: Option<String>,
    stop_by: Option<Instant>,
    outcomes: Vec<Option<Value>>,
    closed: Vec<bool>,
    exited: Vec<bool>,
    run_id: Option<String>,
    terminal: bool,
}

impl State {
    /// Stops the run: the first reason is the run's; every rank is told.
    fn fail(&mut self, reason: String) {
        if self.failure.is_some() {
            return;
        }
        for c in self.conns.iter().flatten() {
            c.send(&Down::Abort { reason: reason.clone() });
        }
        self.failure = Some(reason);
        self.stop_by = Some(Instant::now() + STOP_GRACE);
    }

    fn rank_of(&self, conn: &Conn) -> Option<usize> {
        self.conns.iter().position(|c| c.as_ref().is_some_and(|c| c.id == conn.id))
    }

    fn local(&self, rank: usize) -> bool {
        rank / self.ranks_per_node == self.node_rank
    }

    /// Every local process has exited and every rank's connection has closed (its reader
    /// forwards a rank's last messages before its end, so a result sent just before the exit is
    /// never lost), or the stop's grace period is over.
    fn done(&self) -> bool {
        let local_done = self.exited.iter().all(|e| *e);
        let conns_done = !self.welcomed || self.closed.iter().all(|c| *c);
        local_done && (conns_done || self.stop_by.is_some_and(|d| Instant::now() > d))
    }
}

/// Runs `job` on every rank of `launch` (this node's ranks started as `cmd`) and waits for the
/// outcome. Rank 0's events go to `record` (each acknowledged once it returns); its progress and
/// the cancel question go to `observer`. `Err` is the first failure, already recorded as
/// `run.failed` when rank 0 could not record it.
pub fn supervise(
    launch: &Launch,
    cmd: &RankCommand,
    job: &Job,
    record: &mut dyn FnMut(&str, &str, Value) -> Result<(), String>,
    observer: &mut dyn Observer,
) -> Result<Outcome, String> {
    let (tx, rx) = channel();
    let server = Server::start(launch.rdzv, tx.clone()).map_err(|e| e.to_string())?;
    let job_value = serde_json::to_value(job).map_err(|e| e.to_string())?;
    let mut roster = Roster::new(launch.nnodes, launch.ranks_per_node, &job.recipe_blake3);
    let mut local = LocalRanks::start(launch, cmd, server.addr(), &job.env, Some(tx))?;
    let world = launch.world();
    let mut s = State {
        node_rank: launch.node_rank,
        ranks_per_node: launch.ranks_per_node,
        conns: vec![None; world],
        agents: Vec::new(),
        welcomed: false,
        failure: None,
        stop_by: None,
        outcomes: vec![None; world],
        closed: vec![false; world],
        exited: vec![false; launch.ranks_per_node],
        run_id: None,
        terminal: false,
    };
    let join_by = Instant::now() + launch.timeout;
    let mut refused = false;
    while !s.done() {
        if !s.welcomed && s.failure.is_none() && Instant::now() > join_by {
            let missing: Vec<String> = roster.missing().iter().map(|r| r.to_string()).collect();
            s.fail(format!(
                "rank(s) {} did not join within {} s (train.distributed.timeout_seconds)",
                missing.join(", "),
                launch.timeout.as_secs()
            ));
        }
        if let (Some(reason), false, false) = (&s.failure, s.welcomed, refused) {
            // Ranks waiting for their welcome are told now rather than at their join timeout.
            roster.refuse_all(reason);
            refused = true;
        }
        if s.stop_by.is_some_and(|d| Instant::now() > d) {
            local.kill_all();
        }
        let event = match rx.recv_timeout(Duration::from_millis(100)) {
            Ok(e) => e,
            Err(RecvTimeoutError::Timeout) => continue,
            Err(RecvTimeoutError::Disconnected) => break,
        };
        match event {
            Incoming::Message { conn, msg: Up::Join(j) } => {
                let who = format!("node {} local rank {}", j.node_rank, j.local_rank);
                match roster.add(conn.clone(), j) {
                    Err(reason) => {
                        conn.send(&Down::Refused { reason: reason.clone() });
                        s.fail(reason);
                    }
                    Ok(_) if s.failure.is_some() => {
                        conn.send(&Down::Refused { reason: s.failure.clone().unwrap_or_default() });
                    }
                    Ok(_) if roster.is_complete() => {
                        let conns = roster.welcome(&job_value).map_err(|e| format!("{who}: {e}"))?;
                        s.conns = conns.into_iter().map(Some).collect();
                        s.welcomed = true;
                    }
                    Ok(_) => {}
                }
            }
            Incoming::Message { conn, msg: Up::Agent { node_rank } } => {
                if node_rank == 0 || node_rank >= launch.nnodes {
                    conn.send(&Down::Refused {
                        reason: format!("node rank {node_rank} is not in 1..{}", launch.nnodes),
                    });
                } else {
                    conn.send(&Down::Job { job: job_value.clone() });
                    s.agents.push(conn);
                }
            }
            Incoming::Message { conn, msg } => {
                let Some(rank) = s.rank_of(&conn) else { continue };
                match msg {
                    Up::Event { kind, subject, data } if rank == 0 => {
                        if kind == "run.started" || kind == "run.resumed" {
                            s.run_id = Some(subject.clone());
                        }
                        let terminal = matches!(kind.as_str(), "run.finished" | "run.failed" | "run.cancelled");
                        let result = record(&kind, &subject, data);
                        s.terminal |= terminal && result.is_ok();
                        conn.send(&Down::Ack { error: result.err() });
                    }
                    Up::Progress { data } if rank == 0 => replay(observer, &data),
                    Up::AskCancel => {
                        let stop = observer.cancelled();
                        conn.send(&Down::Cancel { stop });
                    }
                    Up::Report { data } => s.outcomes[rank] = Some(data),
                    Up::Failed { error } => s.fail(format!("rank {rank} failed: {error}")),
                    _ => {}
                }
            }
            Incoming::Closed { conn } => {
                if let Some(rank) = s.rank_of(&conn) {
                    s.closed[rank] = true;
                    if s.outcomes[rank].is_none() && !s.local(rank) {
                        s.fail(format!(
                            "rank {rank} (node {}) closed its connection without a result: its process ended",
                            rank / launch.ranks_per_node
                        ));
                    }
                }
            }
            Incoming::Exited { local_rank, success, status } => {
                s.exited[local_rank] = true;
                let rank = launch.node_rank * launch.ranks_per_node + local_rank;
                // A clean exit's result may still be on its way: missing results are checked at
                // the end.
                if !success {
                    s.fail(format!("rank {rank} (process of local rank {local_rank}) {status}"));
                }
            }
        }
    }
    local.kill_all();
    if s.failure.is_none()
        && let Some(rank) = (0..world).find(|&r| s.outcomes[r].is_none())
    {
        s.failure = Some(format!("rank {rank} ended without a result"));
    }
    if let Some(reason) = s.failure {
        if let (Some(run_id), false) = (&s.run_id, s.terminal) {
            let _ = record("run.failed", run_id, json!({"run_id": run_id, "error": reason, "step": null}));
        }
        return Err(reason);
    }
    let out = s.outcomes[0].take().ok_or("rank 0 ended without a result")?;
    match out["outcome"].as_str() {
        Some("finished") => serde_json::from_value(out["summary"].clone())
            .map(|summary| Outcome::Finished(Box::new(summary)))
            .map_err(|e| format!("rank 0's summary: {e}")),
        Some("cancelled") => Ok(Outcome::Cancelled { step: out["step"].as_u64().unwrap_or(0) }),
        Some("probe") => serde_json::from_value(out["timings"].clone())
            .map(Outcome::Probe)
            .map_err(|e| format!("rank 0's timings: {e}")),
        _ => Err(format!("rank 0 reported {out}")),
    }
}
