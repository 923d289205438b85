//! How the ranks of a run find each other, and how they talk to the process that launched them.
//!
//! The launcher (`mindxtrain train` on node 0) runs a [`Server`] on `--rdzv HOST:PORT` (loopback
//! and a free port by default). Every rank connects, sends [`Join`] (its node and local rank,
//! where it listens for the mesh, the recipe it was given, its device) and waits. When the
//! [`Roster`] is full the launcher answers each with a [`Welcome`]: its global rank
//! (`node_rank × ranks_per_node + local_rank`), every rank's mesh address, NCCL's unique id (made
//! by rank 0 and passed through), the [`Topology`] and the job (what to run, opaque here).
//!
//! The connection stays open as the rank's control channel ([`Control`]): rank 0 sends the run's
//! events up and waits for each to be recorded; any rank says when it fails; the launcher says
//! [`Down::Abort`] to every rank when one fails or its process ends, which shuts the rank's mesh
//! connections at once ([`Abort`]). A launcher that goes away closes the channel, and the rank
//! stops the same way.

use super::wire::{read_json, write_json};
use super::{Abort, CollectiveError};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::io;
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::sync::mpsc::{Receiver, Sender, channel};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// What a rank says first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Join {
    pub node_rank: usize,
    pub local_rank: usize,
    /// Where this rank accepts mesh connections.
    pub mesh: SocketAddr,
    /// BLAKE3 (hex) of the recipe bytes this rank was given: every rank must train the same.
    pub recipe_blake3: String,
    /// `cpu` or `cuda:N`.
    pub device: String,
    pub host: String,
    pub pid: u32,
    /// NCCL's unique id (hex), from global rank 0 of an NCCL run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nccl_id: Option<String>,
}

/// One rank as the run's topology records it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RankInfo {
    pub rank: usize,
    pub node_rank: usize,
    pub local_rank: usize,
    pub host: String,
    pub device: String,
}

/// Where every rank ran: what manifests record as the run's topology.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Topology {
    pub nnodes: usize,
    pub ranks_per_node: usize,
    pub ranks: Vec<RankInfo>,
}

impl Topology {
    pub fn world(&self) -> usize {
        self.nnodes * self.ranks_per_node
    }
}

/// The launcher's answer to a complete roster.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Welcome {
    pub rank: usize,
    pub world: usize,
    /// Every rank's mesh address, in rank order.
    pub peers: Vec<SocketAddr>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nccl_id: Option<String>,
    pub topology: Topology,
    /// What to run: the launcher's business, passed through.
    pub job: Value,
}

/// Rank → launcher.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "t", rename_all = "snake_case")]
pub enum Up {
    Join(Join),
    /// A launcher of another node asks for the job (its ranks' environment) before starting them.
    Agent {
        node_rank: usize,
    },
    /// One of the run's events (rank 0); answered by [`Down::Ack`] once it is recorded.
    Event {
        kind: String,
        subject: String,
        data: Value,
    },
    /// Progress for the launcher's display (no answer).
    Progress {
        data: Value,
    },
    /// Should the run stop after this step? Answered by [`Down::Cancel`].
    AskCancel,
    /// A result for the launcher (the run's summary, probe timings).
    Report {
        data: Value,
    },
    /// This rank failed; the launcher stops the others.
    Failed {
        error: String,
    },
}

/// Launcher → rank.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "t", rename_all = "snake_case")]
pub enum Down {
    Welcome(Welcome),
    /// The job, for a launcher of another node.
    Job {
        job: Value,
    },
    Refused {
        reason: String,
    },
    Ack {
        error: Option<String>,
    },
    Cancel {
        stop: bool,
    },
    Abort {
        reason: String,
    },
}

/// A rank's channel to its launcher.
pub struct Control {
    writer: Mutex<TcpStream>,
    replies: Mutex<Receiver<Down>>,
    abort: Arc<Abort>,
}

fn rdzv(e: impl std::fmt::Display) -> CollectiveError {
    CollectiveError::Rendezvous(e.to_string())
}

fn connect_until(addr: SocketAddr, deadline: Instant) -> io::Result<TcpStream> {
    loop {
        let left = deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(10));
        match TcpStream::connect_timeout(&addr, left) {
            Ok(s) => return Ok(s),
            Err(e) if Instant::now() >= deadline => return Err(e),
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    }
}

/// Sends `first(local address)` to the launcher at `addr` and waits (up to `timeout`) for its
/// first answer. The local address is the interface that reaches the launcher: where the other
/// ranks can reach this one too.
fn hello(
    addr: SocketAddr,
    first: impl FnOnce(IpAddr) -> Result<Up, CollectiveError>,
    timeout: Duration,
) -> Result<(TcpStream, Down), CollectiveError> {
    let deadline = Instant::now() + timeout;
    let mut s = connect_until(addr, deadline)
        .map_err(|e| rdzv(format!("cannot reach the launcher at {addr} within {} s: {e}", timeout.as_secs())))?;
    s.set_nodelay(true).map_err(rdzv)?;
    let first = first(s.local_addr().map_err(rdzv)?.ip())?;
    write_json(&mut s, &first).map_err(rdzv)?;
    s.set_read_timeout(Some(deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(10))))
        .map_err(rdzv)?;
    let answer = match read_json::<Down>(&mut s) {
        Ok(Some(d)) => d,
        Ok(None) => return Err(rdzv(format!("the launcher at {addr} closed the connection before answering"))),
        Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {
            return Err(rdzv(format!(
                "the other ranks did not all join within {} s (the launcher at {addr} is still waiting for them)",
                timeout.as_secs()
            )));
        }
        Err(e) => return Err(rdzv(e)),
    };
    s.set_read_timeout(None).map_err(rdzv)?;
    Ok((s, answer))
}

/// Joins the run at `addr`: `me(ip)` says who this rank is, given the local interface that
/// reaches the launcher (bind the mesh listener there). Waits up to `timeout` for every rank,
/// then keeps the connection as the rank's [`Control`] channel. An [`Down::Abort`] on it, or
/// its end, triggers `abort`.
pub fn join(
    addr: SocketAddr,
    me: impl FnOnce(IpAddr) -> Result<Join, CollectiveError>,
    timeout: Duration,
    abort: Arc<Abort>,
) -> Result<(Welcome, Control), CollectiveError> {
    let (stream, answer) = hello(addr, |ip| me(ip).map(Up::Join), timeout)?;
    let welcome = match answer {
        Down::Welcome(w) => w,
        Down::Refused { reason } | Down::Abort { reason } => return Err(rdzv(reason)),
        other => return Err(rdzv(format!("unexpected answer to a join: {other:?}"))),
    };
    let mut reader = stream.try_clone().map_err(rdzv)?;
    let (tx, rx) = channel();
    let flag = abort.clone();
    std::thread::Builder::new()
        .name("mindxtrain-control".into())
        .spawn(move || {
            loop {
                match read_json::<Down>(&mut reader) {
                    Ok(Some(Down::Abort { reason })) => {
                        flag.trigger(&reason);
                        break;
                    }
                    Ok(Some(d)) => {
                        if tx.send(d).is_err() {
                            break;
                        }
                    }
                    Ok(None) | Err(_) => {
                        flag.trigger("the launcher went away (its process ended or the connection broke)");
                        break;
                    }
                }
            }
        })
        .map_err(rdzv)?;
    Ok((welcome, Control { writer: Mutex::new(stream), replies: Mutex::new(rx), abort }))
}

/// Asks the launcher at `addr` for the job, as a launcher of node `node_rank` (> 0) does before
/// it starts its ranks.
pub fn fetch_job(addr: SocketAddr, node_rank: usize, timeout: Duration) -> Result<Value, CollectiveError> {
    match hello(addr, |_| Ok(Up::Agent { node_rank }), timeout)?.1 {
        Down::Job { job } => Ok(job),
        Down::Refused { reason } | Down::Abort { reason } => Err(rdzv(reason)),
        other => Err(rdzv(format!("unexpected answer to an agent: {other:?}"))),
    }
}

impl Control {
    fn send(&self, msg: &Up) -> Result<(), CollectiveError> {
        let mut w = self.writer.lock().unwrap_or_else(|e| e.into_inner());
        write_json(&mut *w, msg).map_err(|e| CollectiveError::Aborted {
            reason: self.abort.reason().unwrap_or_else(|| format!("the launcher: {e}")),
        })
    }

    fn reply(&self) -> Result<Down, CollectiveError> {
        let rx = self.replies.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            match rx.recv_timeout(Duration::from_millis(200)) {
                Ok(d) => return Ok(d),
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                    if let Some(reason) = self.abort.reason() {
                        return Err(CollectiveError::Aborted { reason });
                    }
                }
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                    let reason = self.abort.reason().unwrap_or_else(|| "the launcher went away".into());
                    return Err(CollectiveError::Aborted { reason });
                }
            }
        }
    }

    /// Records one of the run's events through the launcher; returns once it is durable there.
    pub fn event(&self, kind: &str, subject: &str, data: Value) -> Result<(), CollectiveError> {
        self.send(&Up::Event { kind: kind.into(), subject: subject.into(), data })?;
        match self.reply()? {
            Down::Ack { error: None } => Ok(()),
            Down::Ack { error: Some(e) } => {
                Err(CollectiveError::Aborted { reason: format!("recording an event: {e}") })
            }
            other => Err(rdzv(format!("unexpected answer to an event: {other:?}"))),
        }
    }

    pub fn progress(&self, data: Value) -> Result<(), CollectiveError> {
        self.send(&Up::Progress { data })
    }

    /// Whether the launcher asks the run to stop after this step (SIGINT, an API cancel).
    pub fn ask_cancel(&self) -> Result<bool, CollectiveError> {
        self.send(&Up::AskCancel)?;
        match self.reply()? {
            Down::Cancel { stop } => Ok(stop),
            other => Err(rdzv(format!("unexpected answer to a cancel query: {other:?}"))),
        }
    }

    pub fn report(&self, data: Value) -> Result<(), CollectiveError> {
        self.send(&Up::Report { data })
    }

    /// Tells the launcher this rank failed (it stops the others). Best effort: a launcher that
    /// is gone already knows.
    pub fn failed(&self, error: &str) {
        let _ = self.send(&Up::Failed { error: error.into() });
    }

    pub fn abort(&self) -> &Arc<Abort> {
        &self.abort
    }
}

// ---- the launcher's side ----

/// A connection to one rank (or one node's launcher), for answering it.
#[derive(Debug, Clone)]
pub struct Conn {
    pub id: usize,
    writer: Arc<Mutex<TcpStream>>,
}

impl Conn {
    /// Sends `msg`; a rank that is gone is not an error here (its end is reported separately).
    pub fn send(&self, msg: &Down) -> bool {
        let mut w = self.writer.lock().unwrap_or_else(|e| e.into_inner());
        write_json(&mut *w, msg).is_ok()
    }

    /// Closes the connection (the rank sees its launcher go away).
    pub fn close(&self) {
        let w = self.writer.lock().unwrap_or_else(|e| e.into_inner());
        let _ = w.shutdown(std::net::Shutdown::Both);
    }
}

/// What the server hears, in the order it arrives.
#[derive(Debug)]
pub enum Incoming {
    Message {
        conn: Conn,
        msg: Up,
    },
    /// The connection ended (the rank's process ended, or it closed it).
    Closed {
        conn: Conn,
    },
    /// A rank process the launcher started on this node ended (`status` says how).
    Exited {
        local_rank: usize,
        success: bool,
        status: String,
    },
}

/// The launcher's listening socket; connections are read on threads of their own and arrive as
/// [`Incoming`] on one channel.
pub struct Server {
    addr: SocketAddr,
    stop: Arc<std::sync::atomic::AtomicBool>,
    /// Every connection accepted, to end them with the server.
    accepted: Arc<Mutex<Vec<TcpStream>>>,
}

impl Drop for Server {
    /// Stops listening (the port is free again for the next world a launcher starts on it, as
    /// the probe's stage does once per candidate): the accept loop is woken by a connection.
    /// Connections it accepted are shut down: a node agent that asked for a job just as this
    /// world ended would otherwise wait, unanswered, on a reader thread that outlives the server
    /// (seen as a follower waiting its whole join timeout while node 0 waited for it on the next
    /// server); shut down, it sees the connection close and asks again.
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        for stream in self.accepted.lock().unwrap_or_else(|e| e.into_inner()).drain(..) {
            let _ = stream.shutdown(std::net::Shutdown::Both);
        }
        let wake = if self.addr.ip().is_unspecified() {
            SocketAddr::new(IpAddr::from([127, 0, 0, 1]), self.addr.port())
        } else {
            self.addr
        };
        let _ = TcpStream::connect_timeout(&wake, Duration::from_secs(1));
    }
}

impl Server {
    /// Listens on `addr` (port 0: any free port) and forwards everything to `tx`.
    pub fn start(addr: SocketAddr, tx: Sender<Incoming>) -> Result<Server, CollectiveError> {
        let listener = TcpListener::bind(addr).map_err(|e| rdzv(format!("cannot listen on {addr}: {e}")))?;
        let addr = listener.local_addr().map_err(rdzv)?;
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stopped = stop.clone();
        let accepted: Arc<Mutex<Vec<TcpStream>>> = Arc::default();
        let tracked = accepted.clone();
        std::thread::Builder::new()
            .name("mindxtrain-rdzv".into())
            .spawn(move || {
                let mut next = 0usize;
                for stream in listener.incoming() {
                    if stopped.load(std::sync::atomic::Ordering::SeqCst) {
                        break;
                    }
                    let Ok(stream) = stream else { continue };
                    let (Ok(reader), true) = (stream.try_clone(), stream.set_nodelay(true).is_ok()) else { continue };
                    let Ok(handle) = stream.try_clone() else { continue };
                    {
                        let mut all = tracked.lock().unwrap_or_else(|e| e.into_inner());
                        // Checked under the lock Drop drains: a connection accepted as the server
                        // stops is shut down here rather than missed.
                        if stopped.load(std::sync::atomic::Ordering::SeqCst) {
                            let _ = handle.shutdown(std::net::Shutdown::Both);
                            break;
                        }
                        all.push(handle);
                    }
                    let conn = Conn { id: next, writer: Arc::new(Mutex::new(stream)) };
                    next += 1;
                    let tx = tx.clone();
                    let spawned = std::thread::Builder::new().name("mindxtrain-rdzv-conn".into()).spawn(move || {
                        let mut reader = reader;
                        loop {
                            match read_json::<Up>(&mut reader) {
                                Ok(Some(msg)) => {
                                    if tx.send(Incoming::Message { conn: conn.clone(), msg }).is_err() {
                                        return;
                                    }
                                }
                                _ => {
                                    let _ = tx.send(Incoming::Closed { conn });
                                    return;
                                }
                            }
                        }
                    });
                    if spawned.is_err() {
                        continue;
                    }
                }
            })
            .map_err(rdzv)?;
        Ok(Server { addr, stop, accepted })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

/// The ranks that have joined, until the world is complete.
#[derive(Debug)]
pub struct Roster {
    nnodes: usize,
    ranks_per_node: usize,
    recipe_blake3: String,
    joined: Vec<Option<(Conn, Join)>>,
}

impl Roster {
    pub fn new(nnodes: usize, ranks_per_node: usize, recipe_blake3: &str) -> Roster {
        Roster {
            nnodes,
            ranks_per_node,
            recipe_blake3: recipe_blake3.into(),
            joined: (0..nnodes * ranks_per_node).map(|_| None).collect(),
        }
    }

    pub fn world(&self) -> usize {
        self.joined.len()
    }

    /// Takes a join; `Err` is the refusal to send back (the run cannot go on with that rank).
    pub fn add(&mut self, conn: Conn, j: Join) -> Result<usize, String> {
        if j.node_rank >= self.nnodes || j.local_rank >= self.ranks_per_node {
            return Err(format!(
                "a rank joined as node {} local rank {}, but the run has {} node(s) of {} rank(s) \
                 (every node must be started with the same --nproc-per-node and --nnodes)",
                j.node_rank, j.local_rank, self.nnodes, self.ranks_per_node
            ));
        }
        if j.recipe_blake3 != self.recipe_blake3 {
            return Err(format!(
                "node {} local rank {} was given recipe bytes {}, the launcher has {}: every node must \
                 train the same recipe file",
                j.node_rank, j.local_rank, j.recipe_blake3, self.recipe_blake3
            ));
        }
        let rank = j.node_rank * self.ranks_per_node + j.local_rank;
        if self.joined[rank].is_some() {
            return Err(format!("rank {rank} (node {} local rank {}) joined twice", j.node_rank, j.local_rank));
        }
        self.joined[rank] = Some((conn, j));
        Ok(rank)
    }

    /// The global rank a connection joined as.
    pub fn rank_of(&self, conn: &Conn) -> Option<usize> {
        self.joined.iter().position(|j| j.as_ref().is_some_and(|(c, _)| c.id == conn.id))
    }

    pub fn missing(&self) -> Vec<usize> {
        self.joined.iter().enumerate().filter(|(_, j)| j.is_none()).map(|(r, _)| r).collect()
    }

    pub fn is_complete(&self) -> bool {
        self.joined.iter().all(Option::is_some)
    }

    pub fn topology(&self) -> Topology {
        Topology {
            nnodes: self.nnodes,
            ranks_per_node: self.ranks_per_node,
            ranks: self
                .joined
                .iter()
                .enumerate()
                .filter_map(|(rank, j)| j.as_ref().map(|(_, j)| (rank, j)))
                .map(|(rank, j)| RankInfo {
                    rank,
                    node_rank: j.node_rank,
                    local_rank: j.local_rank,
                    host: j.host.clone(),
                    device: j.device.clone(),
                })
                .collect(),
        }
    }

    /// Refuses every rank that joined (the run stopped before it could start).
    pub fn refuse_all(&self, reason: &str) {
        for (conn, _) in self.joined.iter().flatten() {
            conn.send(&Down::Refused { reason: reason.to_string() });
        }
    }

    /// Sends every rank its welcome; returns the connections in rank order.
    pub fn welcome(&self, job: &Value) -> Result<Vec<Conn>, String> {
        if !self.is_complete() {
            return Err(format!("ranks {:?} have not joined", self.missing()));
        }
        let joined: Vec<&(Conn, Join)> = self.joined.iter().flatten().collect();
        let peers: Vec<SocketAddr> = joined.iter().map(|(_, j)| j.mesh).collect();
        let nccl_id = joined[0].1.nccl_id.clone();
        let topology = self.topology();
        for (rank, (conn, _)) in joined.iter().enumerate() {
            let w = Welcome {
                rank,
                world: joined.len(),
                peers: peers.clone(),
                nccl_id: nccl_id.clone(),
                topology: topology.clone(),
                job: job.clone(),
            };
            conn.send(&Down::Welcome(w));
        }
        Ok(joined.into_iter().map(|(c, _)| c.clone()).collect())
    }
}
