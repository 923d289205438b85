//! The TCP mesh: one connection between every pair of ranks; each collective sends every peer
//! its share at once (one writer thread per peer) while reading the peers in rank order, and
//! sums what it received in rank order.
//!
//! Traffic per rank and all-reduce: `2 (N-1)/N` times the buffer, like a ring, in one round
//! trip instead of `2 (N-1)` steps. Fine for the handful of ranks a CPU machine runs.

use super::host::HostBuf;
use super::spans::{self, Span};
use super::wire::{DataHeader, MESH_MAGIC};
use super::{Abort, Backend, Collective, CollectiveError};
use candle_core::Tensor;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The operations, as their data frames name them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    ReduceScatter = 1,
    AllGather = 2,
    Bytes = 3,
}

impl Op {
    fn name(self) -> &'static str {
        match self {
            Op::ReduceScatter => "reduce-scatter",
            Op::AllGather => "all-gather",
            Op::Bytes => "gather of host values",
        }
    }

    fn from_code(c: u8) -> &'static str {
        match c {
            1 => "reduce-scatter",
            2 => "all-gather",
            3 => "gather of host values",
            _ => "an unknown operation",
        }
    }
}

/// A rank's connections to every other rank.
pub struct Mesh {
    rank: usize,
    world: usize,
    readers: Vec<Option<TcpStream>>,
    writers: Vec<Option<TcpStream>>,
    seq: u64,
    timeout: Duration,
    abort: Arc<Abort>,
    /// Set by the first failure: the ranks no longer agree on what was sent, so nothing more is.
    broken: Option<CollectiveError>,
}

fn hello(rank: usize, world: usize) -> [u8; 16] {
    let mut b = [0u8; 16];
    b[..8].copy_from_slice(&MESH_MAGIC);
    b[8..12].copy_from_slice(&(rank as u32).to_le_bytes());
    b[12..16].copy_from_slice(&(world as u32).to_le_bytes());
    b
}

impl Mesh {
    /// Connects rank `rank` to every address in `addrs` (one per rank, in rank order; this rank's
    /// own is `listener`'s). Lower ranks are called, higher ranks call in; all within `timeout`.
    pub fn connect(
        rank: usize,
        addrs: &[SocketAddr],
        listener: TcpListener,
        timeout: Duration,
        abort: Arc<Abort>,
    ) -> Result<Mesh, CollectiveError> {
        let world = addrs.len();
        if rank >= world {
            return Err(CollectiveError::Rendezvous(format!("rank {rank} of a world of {world}")));
        }
        let deadline = Instant::now() + timeout;
        let mut readers: Vec<Option<TcpStream>> = (0..world).map(|_| None).collect();
        for (peer, addr) in addrs.iter().enumerate().take(rank) {
            let mut s = connect_until(*addr, deadline)
                .map_err(|e| CollectiveError::Io { peer, message: format!("connecting to {addr}: {e}") })?;
            s.write_all(&hello(rank, world))
                .map_err(|e| CollectiveError::Io { peer, message: format!("greeting: {e}") })?;
            readers[peer] = Some(s);
        }
        listener.set_nonblocking(true).map_err(|e| CollectiveError::Rendezvous(e.to_string()))?;
        let mut missing = world - rank - 1;
        while missing > 0 {
            match listener.accept() {
                Ok((mut s, from)) => {
                    s.set_nonblocking(false).map_err(|e| CollectiveError::Rendezvous(e.to_string()))?;
                    s.set_read_timeout(Some(deadline.saturating_duration_since(Instant::now()).max(ms(10))))
                        .map_err(|e| CollectiveError::Rendezvous(e.to_string()))?;
                    let mut h = [0u8; 16];
                    if s.read_exact(&mut h).is_err() || h[..8] != MESH_MAGIC {
                        // Not one of ours (a port scan, a stale rank): ignore it.
                        continue;
                    }
                    let peer = u32::from_le_bytes(h[8..12].try_into().unwrap_or_default()) as usize;
                    let their_world = u32::from_le_bytes(h[12..16].try_into().unwrap_or_default()) as usize;
                    if their_world != world || peer <= rank || peer >= world || readers[peer].is_some() {
                        return Err(CollectiveError::Mismatch(format!(
                            "a rank from {from} introduced itself as rank {peer} of {their_world}; \
                             this is rank {rank} of {world}"
                        )));
                    }
                    readers[peer] = Some(s);
                    missing -= 1;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    if Instant::now() >= deadline {
                        let absent: Vec<String> =
                            (rank + 1..world).filter(|&p| readers[p].is_none()).map(|p| p.to_string()).collect();
                        return Err(CollectiveError::Rendezvous(format!(
                            "ranks {} did not connect within {} s",
                            absent.join(", "),
                            timeout.as_secs()
                        )));
                    }
                    std::thread::sleep(ms(2));
                }
                Err(e) => return Err(CollectiveError::Rendezvous(format!("accepting ranks: {e}"))),
            }
        }
        let mut writers = Vec::with_capacity(world);
        for (peer, r) in readers.iter().enumerate() {
            writers.push(match r {
                Some(s) => {
                    let io = |e: io::Error| CollectiveError::Io { peer, message: e.to_string() };
                    s.set_nodelay(true).map_err(io)?;
                    s.set_read_timeout(Some(timeout)).map_err(io)?;
                    s.set_write_timeout(Some(timeout)).map_err(io)?;
                    abort.register(s);
                    Some(s.try_clone().map_err(io)?)
                }
                None => None,
            });
        }
        Ok(Mesh { rank, world, readers, writers, seq: 0, timeout, abort, broken: None })
    }

    /// Sends `outgoing[p]` to every peer `p` and reads each peer's frame in rank order, handing
    /// it to `received(peer, bytes)`; `expect(peer)` is the length each must have, if known.
    fn exchange(
        &mut self,
        op: Op,
        outgoing: &[&[u8]],
        expect: impl Fn(usize) -> Option<usize>,
        mut received: impl FnMut(usize, Vec<u8>) -> Result<(), CollectiveError>,
    ) -> Result<(), CollectiveError> {
        if let Some(e) = &self.broken {
            return Err(e.clone());
        }
        self.seq += 1;
        let (seq, rank, world, secs) = (self.seq, self.rank, self.world, self.timeout.as_secs());
        let outcome = std::thread::scope(|s| {
            let mut sends = Vec::new();
            for (peer, w) in self.writers.iter_mut().enumerate() {
                let Some(w) = w.as_mut() else { continue };
                let payload = outgoing[peer];
                sends.push((
                    peer,
                    s.spawn(move || {
                        let header = DataHeader { op: op as u8, seq, len: payload.len() as u64 };
                        w.write_all(&header.encode())?;
                        w.write_all(payload)?;
                        w.flush()
                    }),
                ));
            }
            let mut result = Ok(());
            for peer in (0..world).filter(|&p| p != rank) {
                let r = self.readers[peer].as_mut().map(|stream| read_frame(stream, peer, op, seq, &expect));
                match r {
                    Some(Ok(bytes)) => {
                        if let Err(e) = received(peer, bytes) {
                            result = Err(Failure::Other(e));
                            break;
                        }
                    }
                    Some(Err(e)) => {
                        result = Err(e);
                        break;
                    }
                    None => {}
                }
            }
            if result.is_err() {
                // The writers may be stuck on a peer that no longer reads.
                for s in self.readers.iter().flatten() {
                    let _ = s.shutdown(std::net::Shutdown::Both);
                }
            }
            for (peer, h) in sends {
                let sent = h.join().unwrap_or_else(|_| Err(io::Error::other("writer thread panicked")));
                if let (Err(e), Ok(())) = (sent, &result) {
                    result = Err(Failure::Io(peer, e));
                }
            }
            result
        });
        outcome.map_err(|f| {
            let e = self.explain(f, op, secs);
            self.broken = Some(e.clone());
            e
        })
    }

    /// The error a failure means, with the launcher's reason when it has given one.
    fn explain(&self, f: Failure, op: Op, secs: u64) -> CollectiveError {
        if let Some(reason) = self.abort.reason() {
            return CollectiveError::Aborted { reason };
        }
        let e = match f {
            Failure::Io(peer, e) => match e.kind() {
                io::ErrorKind::UnexpectedEof
                | io::ErrorKind::ConnectionReset
                | io::ErrorKind::BrokenPipe
                | io::ErrorKind::ConnectionAborted => CollectiveError::PeerClosed { peer, op: op.name() },
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => {
                    CollectiveError::Timeout { peer, op: op.name(), seconds: secs }
                }
                _ => CollectiveError::Io { peer, message: e.to_string() },
            },
            Failure::Other(e) => e,
        };
        if matches!(e, CollectiveError::PeerClosed { .. }) {
            // A peer that went away is usually explained by the launcher a moment later.
            if let Some(reason) = self.abort.wait_reason(Duration::from_secs(3)) {
                return CollectiveError::Aborted { reason };
            }
        }
        e
    }

    fn check_spans(&self, n: usize, spans: &[Span]) -> Result<(), CollectiveError> {
        if spans::total(spans) != n {
            return Err(CollectiveError::Mismatch(format!(
                "a buffer of {n} elements cut into spans of {} in all",
                spans::total(spans)
            )));
        }
        if let Some(s) = spans.iter().find(|s| s.owner >= self.world) {
            return Err(CollectiveError::Mismatch(format!("a span owned by rank {} of {}", s.owner, self.world)));
        }
        Ok(())
    }

    fn reduce_scatter_host(&mut self, buf: &HostBuf, spans: &[Span]) -> Result<HostBuf, CollectiveError> {
        self.check_spans(buf.len(), spans)?;
        let (dtype, size) = (buf.dtype(), buf.elem_size());
        // What each peer owns, from this rank's buffer.
        let mut outgoing: Vec<Vec<u8>> = vec![Vec::new(); self.world];
        for (at, s) in spans::offsets(spans) {
            if s.owner != self.rank {
                outgoing[s.owner].extend_from_slice(buf.bytes(at, s.len));
            }
        }
        let mine_n = spans::owned(spans, self.rank);
        let mut contributions: Vec<Option<HostBuf>> = (0..self.world).map(|_| None).collect();
        let refs: Vec<&[u8]> = outgoing.iter().map(Vec::as_slice).collect();
        self.exchange(
            Op::ReduceScatter,
            &refs,
            |_| Some(mine_n * size),
            |peer, bytes| {
                contributions[peer] = Some(HostBuf::from_bytes(dtype, &bytes)?);
                Ok(())
            },
        )?;
        let mut own = HostBuf::zeros(dtype, mine_n)?;
        for (at, mine, s) in spans::placed(spans, self.rank) {
            if let Some(to) = mine {
                own.copy_from(to, buf, at, s.len)?;
            }
        }
        contributions[self.rank] = Some(own);
        // Rank order: ((x0 + x1) + x2) + …
        let mut parts = contributions.into_iter().map(|c| c.expect("every rank's contribution is in"));
        let mut acc = parts.next().expect("a world of at least one");
        for part in parts {
            acc.add(0, &part, 0, mine_n)?;
        }
        Ok(acc)
    }

    fn all_gather_host(&mut self, mine: &HostBuf, spans: &[Span]) -> Result<HostBuf, CollectiveError> {
        let n = spans::total(spans);
        self.check_spans(n, spans)?;
        let mine_n = spans::owned(spans, self.rank);
        if mine.len() != mine_n {
            return Err(CollectiveError::Mismatch(format!(
                "rank {} gives {} elements to an all-gather where it owns {mine_n}",
                self.rank,
                mine.len()
            )));
        }
        let (dtype, size) = (mine.dtype(), mine.elem_size());
        let payload = mine.bytes(0, mine_n).to_vec();
        let refs: Vec<&[u8]> = vec![payload.as_slice(); self.world];
        let mut parts: Vec<Option<HostBuf>> = (0..self.world).map(|_| None).collect();
        self.exchange(
            Op::AllGather,
            &refs,
            |peer| Some(spans::owned(spans, peer) * size),
            |peer, bytes| {
                parts[peer] = Some(HostBuf::from_bytes(dtype, &bytes)?);
                Ok(())
            },
        )?;
        parts[self.rank] = Some(mine.clone());
        let mut out = HostBuf::zeros(dtype, n)?;
        let mut cursor = vec![0usize; self.world];
        for (at, s) in spans::offsets(spans) {
            let part = parts[s.owner].as_ref().expect("every owner's part is in");
            out.copy_from(at, part, cursor[s.owner], s.len)?;
            cursor[s.owner] += s.len;
        }
        Ok(out)
    }
}

/// What went wrong inside an exchange, before it is explained.
enum Failure {
    Io(usize, io::Error),
    Other(CollectiveError),
}

impl From<CollectiveError> for Failure {
    fn from(e: CollectiveError) -> Failure {
        Failure::Other(e)
    }
}

fn read_frame(
    stream: &mut TcpStream,
    peer: usize,
    op: Op,
    seq: u64,
    expect: &impl Fn(usize) -> Option<usize>,
) -> Result<Vec<u8>, Failure> {
    let mut h = [0u8; DataHeader::SIZE];
    stream.read_exact(&mut h).map_err(|e| Failure::Io(peer, e))?;
    let h = DataHeader::decode(&h);
    if h.op != op as u8 || h.seq != seq {
        return Err(Failure::Other(CollectiveError::Mismatch(format!(
            "rank {peer} sent {} #{} while this rank is at {} #{seq}",
            Op::from_code(h.op),
            h.seq,
            op.name()
        ))));
    }
    if let Some(want) = expect(peer)
        && h.len != want as u64
    {
        return Err(Failure::Other(CollectiveError::Mismatch(format!(
            "rank {peer} sent {} bytes for {} #{seq}, this rank expects {want}",
            h.len,
            op.name()
        ))));
    }
    let mut buf = vec![0u8; h.len as usize];
    stream.read_exact(&mut buf).map_err(|e| Failure::Io(peer, e))?;
    Ok(buf)
}

fn connect_until(addr: SocketAddr, deadline: Instant) -> io::Result<TcpStream> {
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match TcpStream::connect_timeout(&addr, left.max(ms(10))) {
            Ok(s) => return Ok(s),
            Err(e) if Instant::now() >= deadline => return Err(e),
            Err(_) => std::thread::sleep(ms(20)),
        }
    }
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

impl Collective for Mesh {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world(&self) -> usize {
        self.world
    }

    fn backend(&self) -> Backend {
        Backend::Tcp
    }

    fn all_reduce(&mut self, t: &Tensor) -> Result<Tensor, CollectiveError> {
        let buf = HostBuf::from_tensor(t)?;
        let spans = spans::even_spans(buf.len(), self.world);
        let mine = self.reduce_scatter_host(&buf, &spans)?;
        self.all_gather_host(&mine, &spans)?.into_tensor(t.device())
    }

    fn reduce_scatter(&mut self, t: &Tensor, spans: &[Span]) -> Result<Tensor, CollectiveError> {
        let buf = HostBuf::from_tensor(t)?;
        self.reduce_scatter_host(&buf, spans)?.into_tensor(t.device())
    }

    fn all_gather(&mut self, mine: &Tensor, spans: &[Span]) -> Result<Tensor, CollectiveError> {
        let buf = HostBuf::from_tensor(mine)?;
        self.all_gather_host(&buf, spans)?.into_tensor(mine.device())
    }

    fn all_gather_bytes(&mut self, bytes: &[u8]) -> Result<Vec<Vec<u8>>, CollectiveError> {
        let refs: Vec<&[u8]> = vec![bytes; self.world];
        let mut out: Vec<Vec<u8>> = vec![Vec::new(); self.world];
        self.exchange(
            Op::Bytes,
            &refs,
            |_| None,
            |peer, b| {
                out[peer] = b;
                Ok(())
            },
        )?;
        out[self.rank] = bytes.to_vec();
        Ok(out)
    }
}
