//! The node's accept loop: HTTP/1.1 connections served with a header read timeout and a
//! cap on connections per client address, then drained on shutdown.
//!
//! `axum::serve` sets no timer on hyper's connections, so hyper's header read timeout never
//! fires there: a client that sends a header byte every few seconds holds its connection
//! (and a task) forever, and a few hundred of them hold the server. Here each connection
//! gets [`Limits::header_read_timeout`] to deliver a request head (also the longest a
//! kept-alive connection may idle before its next request), and one address may hold at
//! most [`Limits::max_connections_per_ip`] connections; the next ones get a bare 503 and are
//! closed.
//!
//! ```no_run
//! # async fn f(app: axum::Router) -> std::io::Result<()> {
//! use mindxtrain_node::api::listener::{self, Limits};
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:8080").await?;
//! listener::serve(listener, app, Limits::default(), std::future::pending()).await
//! # }
//! ```

use std::collections::HashMap;
use std::future::Future;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::Request;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tower::ServiceExt;

/// What one connection and one client may hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Longest a connection may take to deliver a request head, or idle between requests.
    pub header_read_timeout: Duration,
    /// Most connections open at once from one client address.
    pub max_connections_per_ip: usize,
}

/// Defaults of `mindxtrain serve` (`--header-timeout`, `--max-connections-per-ip`).
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
pub const MAX_CONNECTIONS_PER_IP: usize = 512;

impl Default for Limits {
    fn default() -> Self {
        Limits { header_read_timeout: HEADER_READ_TIMEOUT, max_connections_per_ip: MAX_CONNECTIONS_PER_IP }
    }
}

/// Open connections by client address.
#[derive(Default)]
struct Counts(Mutex<HashMap<IpAddr, usize>>);

/// One counted connection; uncounted when dropped.
struct Slot {
    counts: Arc<Counts>,
    ip: IpAddr,
}

impl Counts {
    /// A slot for `ip`, unless it already holds `max`.
    fn take(self: &Arc<Self>, ip: IpAddr, max: usize) -> Option<Slot> {
        let mut map = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let n = map.entry(ip).or_insert(0);
        if *n >= max {
            return None;
        }
        *n += 1;
        Some(Slot { counts: self.clone(), ip })
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut map = self.counts.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = map.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                map.remove(&self.ip);
            }
        }
    }
}

/// What a client over its cap gets before the connection closes.
const OVER_CAP: &str = "{\"error\":{\"message\":\"too many connections from this address\",\"type\":\"server_error\",\"code\":\"too_many_connections\"}}";

/// Serves `app` on `listener` until `shutdown` resolves, then stops accepting and waits for
/// open connections to finish their requests (the caller bounds that wait).
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: Limits,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let counts = Arc::new(Counts::default());
    let graceful = GracefulShutdown::new();
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new()).header_read_timeout(limits.header_read_timeout);
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                // Out of descriptors, a connection reset before it was accepted: the listener
                // itself is fine; wait a moment rather than spin.
                Err(e) => {
                    tracing::debug!("accept: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let Some(slot) = counts.take(peer.ip(), limits.max_connections_per_ip) else {
            tracing::debug!(peer = %peer, "over the per-address connection cap");
            tokio::spawn(refuse(stream));
            continue;
        };
        let service = app.clone().map_request(|req: Request<Incoming>| req.map(Body::new));
        let conn = http.serve_connection(TokioIo::new(stream), TowerToHyperService::new(service));
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            let _slot = slot;
            if let Err(e) = conn.await {
                tracing::debug!(peer = %peer, "connection: {e}");
            }
        });
    }
    drop(listener);
    graceful.shutdown().await;
    Ok(())
}

/// A 503 for a client over its cap, then the connection closes. The request head is read
/// first (within a second, at most 16 KiB), since a client may not look for an answer
/// before it has sent its request.
async fn refuse(mut stream: TcpStream) {
    let head = format!(
        "HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        OVER_CAP.len()
    );
    let answer = async {
        let mut seen = Vec::new();
        let mut buf = [0u8; 4096];
        while seen.len() < 16 << 10 && !seen.windows(4).any(|w| w == b"\r\n\r\n") {
            match stream.read(&mut buf).await? {
                0 => break,
                n => seen.extend_from_slice(&buf[..n]),
            }
        }
        stream.write_all(head.as_bytes()).await?;
        stream.write_all(OVER_CAP.as_bytes()).await?;
        stream.shutdown().await
    };
    let _ = tokio::time::timeout(Duration::from_secs(1), answer).await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::routing::get;

    async fn server(limits: Limits) -> (std::net::SocketAddr, tokio::sync::oneshot::Sender<()>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let app = Router::new().route("/", get(|| async { "ok" }));
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(serve(listener, app, limits, async {
            let _ = rx.await;
        }));
        (addr, tx)
    }

    async fn get_ok(addr: std::net::SocketAddr) -> String {
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n").await.unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).await.unwrap();
        out
    }

    /// Reads until the peer closes; how long that took.
    async fn closed_after(s: &mut TcpStream) -> Duration {
        let t = std::time::Instant::now();
        let mut buf = [0u8; 256];
        while let Ok(n) = s.read(&mut buf).await {
            if n == 0 {
                break;
            }
        }
        t.elapsed()
    }

    #[tokio::test]
    async fn a_client_that_dribbles_its_head_is_dropped_after_the_timeout() {
        let timeout = Duration::from_millis(400);
        let (addr, _stop) = server(Limits { header_read_timeout: timeout, ..Limits::default() }).await;
        let mut slow = TcpStream::connect(addr).await.unwrap();
        let dribble = async {
            for b in b"GET / HTTP/1.1\r\nHost: x\r\nX-Slow: " {
                if slow.write_all(&[*b]).await.is_err() {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        };
        let _ = tokio::time::timeout(Duration::from_secs(5), dribble).await;
        let waited = closed_after(&mut slow).await;
        assert!(waited < Duration::from_secs(3), "held for {waited:?}");
        // An idle connection that sends nothing is dropped too.
        let mut idle = TcpStream::connect(addr).await.unwrap();
        let waited = closed_after(&mut idle).await;
        assert!(waited >= timeout / 2 && waited < Duration::from_secs(3), "{waited:?}");
        assert!(get_ok(addr).await.ends_with("ok"));
    }

    #[tokio::test]
    async fn one_address_may_hold_only_so_many_connections() {
        let (addr, _stop) = server(Limits { max_connections_per_ip: 3, ..Limits::default() }).await;
        let mut held = Vec::new();
        for _ in 0..3 {
            held.push(TcpStream::connect(addr).await.unwrap());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        let over = get_ok(addr).await;
        assert!(over.starts_with("HTTP/1.1 503") && over.contains("too_many_connections"), "{over}");
        drop(held.pop());
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(get_ok(addr).await.ends_with("ok"), "a slot came free");
    }
}
