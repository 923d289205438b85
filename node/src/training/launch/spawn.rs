//! The rank processes of this node: started in a process group of their own (a Ctrl-C at the
//! terminal reaches the launcher, which cancels the run in order), their exits reported to the
//! supervisor, killed when they outlive a stop.

use super::{Launch, RankCommand};
use mindxtrain_trainer::collective::rendezvous::Incoming;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Sender;

/// One rank process.
struct Proc {
    local_rank: usize,
    pid: u32,
    exited: Arc<AtomicBool>,
    handle: Option<std::thread::JoinHandle<ExitStatus>>,
}

/// This node's rank processes.
pub struct LocalRanks {
    procs: Vec<Proc>,
}

/// `exited with status 3`, `was killed by signal 9 (SIGKILL)`.
pub fn describe(status: &ExitStatus) -> String {
    match (status.code(), status.signal()) {
        (Some(c), _) => format!("exited with status {c}"),
        (None, Some(s)) => {
            let name = match s {
                libc::SIGKILL => " (SIGKILL)",
                libc::SIGTERM => " (SIGTERM)",
                libc::SIGSEGV => " (SIGSEGV)",
                libc::SIGABRT => " (SIGABRT)",
                libc::SIGINT => " (SIGINT)",
                _ => "",
            };
            format!("was killed by signal {s}{name}")
        }
        _ => "ended".into(),
    }
}

impl LocalRanks {
    /// Starts this node's ranks, told to join the rendezvous at `rdzv`, with `env` set. With
    /// `events`, each exit is reported there as [`Incoming::Exited`].
    pub fn start(
        launch: &Launch,
        cmd: &RankCommand,
        rdzv: SocketAddr,
        env: &BTreeMap<String, String>,
        events: Option<Sender<Incoming>>,
    ) -> Result<LocalRanks, String> {
        // A wildcard listen address is reached on loopback from this node.
        let rdzv = if rdzv.ip().is_unspecified() { SocketAddr::from(([127, 0, 0, 1], rdzv.port())) } else { rdzv };
        let mut ranks = LocalRanks { procs: Vec::new() };
        for local_rank in 0..launch.ranks_per_node {
            let mut c = Command::new(&cmd.exe);
            c.arg("--node-dir")
                .arg(&cmd.node_dir)
                .arg("rank")
                .arg(&cmd.recipe)
                .arg("--recipe-dir")
                .arg(&cmd.recipe_dir)
                .args(["--rdzv", &rdzv.to_string()])
                .args(["--node-rank", &launch.node_rank.to_string()])
                .args(["--local-rank", &local_rank.to_string()])
                .args(["--nnodes", &launch.nnodes.to_string()])
                .args(["--nproc-per-node", &launch.ranks_per_node.to_string()])
                .args(["--collective", launch.backend.name()])
                .args(["--device", &launch.devices[local_rank]])
                .envs(env)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::inherit())
                .process_group(0);
            let mut child = match c.spawn() {
                Ok(child) => child,
                Err(e) => {
                    ranks.kill_all();
                    return Err(format!("starting rank process {} ({}): {e}", local_rank, cmd.exe.display()));
                }
            };
            let pid = child.id();
            let exited = Arc::new(AtomicBool::new(false));
            let (flag, tx) = (exited.clone(), events.clone());
            let handle = std::thread::Builder::new()
                .name(format!("mindxtrain-rank-{local_rank}"))
                .spawn(move || {
                    let status = child.wait().unwrap_or_else(|_| ExitStatus::from_raw(1 << 8));
                    flag.store(true, Ordering::SeqCst);
                    if let Some(tx) = tx {
                        let _ = tx.send(Incoming::Exited {
                            local_rank,
                            success: status.success(),
                            status: describe(&status),
                        });
                    }
                    status
                })
                .map_err(|e| format!("watching rank process {local_rank}: {e}"))?;
            ranks.procs.push(Proc { local_rank, pid, exited, handle: Some(handle) });
        }
        Ok(ranks)
    }

    /// Kills every rank process still running (SIGKILL to its process group).
    pub fn kill_all(&mut self) {
        for p in &self.procs {
            if !p.exited.load(Ordering::SeqCst) {
                // SAFETY: kill(2) on the group this launcher started; the exited flag is set by
                // the only thread that reaps the child, so the group still exists.
                unsafe {
                    libc::kill(-(p.pid as i32), libc::SIGKILL);
                }
            }
        }
    }

    /// Waits for every rank process; the first that failed, if any.
    pub fn wait_all(&mut self) -> Result<(), String> {
        let mut first = None;
        for p in &mut self.procs {
            if let Some(h) = p.handle.take() {
                let status = h.join().unwrap_or_else(|_| ExitStatus::from_raw(1 << 8));
                if !status.success() && first.is_none() {
                    first = Some(format!("rank process {} (pid {}) {}", p.local_rank, p.pid, describe(&status)));
                }
            }
        }
        first.map_or(Ok(()), Err)
    }
}

impl Drop for LocalRanks {
    fn drop(&mut self) {
        // A launcher that stops for any reason takes its ranks with it.
        self.kill_all();
    }
}
