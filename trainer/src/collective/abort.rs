//! Stopping a rank that waits on others: the reason, and the sockets to shut so that a blocked
//! read returns now instead of at the timeout.

use std::net::{Shutdown, TcpStream};
use std::sync::{Condvar, Mutex};
use std::time::Duration;

/// Shared by a rank's collective and its control connection to the launcher: when the launcher
/// says stop (another rank failed), every connection of the mesh is shut down, so a collective
/// blocked on a dead peer fails at once with the launcher's reason.
#[derive(Debug, Default)]
pub struct Abort {
    reason: Mutex<Option<String>>,
    said: Condvar,
    sockets: Mutex<Vec<TcpStream>>,
}

impl Abort {
    pub fn new() -> Abort {
        Abort::default()
    }

    /// Records `reason` (the first one stays) and shuts every registered connection.
    pub fn trigger(&self, reason: &str) {
        {
            let mut r = self.reason.lock().unwrap_or_else(|e| e.into_inner());
            if r.is_none() {
                *r = Some(reason.to_string());
            }
        }
        self.said.notify_all();
        for s in self.sockets.lock().unwrap_or_else(|e| e.into_inner()).iter() {
            let _ = s.shutdown(Shutdown::Both);
        }
    }

    pub fn reason(&self) -> Option<String> {
        self.reason.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The reason, waiting up to `timeout` for one to be said: a peer's connection closing is
    /// usually followed, within milliseconds, by the launcher's account of why.
    pub fn wait_reason(&self, timeout: Duration) -> Option<String> {
        let r = self.reason.lock().unwrap_or_else(|e| e.into_inner());
        let (r, _) = self.said.wait_timeout_while(r, timeout, |r| r.is_none()).unwrap_or_else(|e| e.into_inner());
        r.clone()
    }

    /// Shuts `socket` (a clone of a mesh connection) when the run is stopped.
    pub fn register(&self, socket: &TcpStream) {
        if let Ok(clone) = socket.try_clone() {
            if self.reason().is_some() {
                let _ = clone.shutdown(Shutdown::Both);
            }
            self.sockets.lock().unwrap_or_else(|e| e.into_inner()).push(clone);
        }
    }
}
