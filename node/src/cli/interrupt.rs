//! Ctrl-C (SIGINT) and SIGTERM while a command trains: the first asks the run to stop
//! after its current step with a checkpoint (the trainer's `Observer::cancelled`); a second
//! one quits at once, as a user pressing Ctrl-C twice expects.

use std::sync::atomic::{AtomicI32, Ordering};

/// The first signal received (0: none yet).
static FIRST: AtomicI32 = AtomicI32::new(0);

const NOTICE: &[u8] = b"\nstopping after this step with a checkpoint (Ctrl-C again quits without one)\n";

extern "C" fn on_signal(signal: libc::c_int) {
    if FIRST.compare_exchange(0, signal, Ordering::SeqCst, Ordering::SeqCst).is_ok() {
        // SAFETY: write(2) is async-signal-safe; the buffer is a static.
        unsafe { libc::write(2, NOTICE.as_ptr().cast(), NOTICE.len()) };
    } else {
        // SAFETY: _exit(2) is async-signal-safe; a second signal means "now".
        unsafe { libc::_exit(128 + signal) };
    }
}

/// Catches SIGINT and SIGTERM until dropped (the default actions come back then).
pub struct Guard {
    previous: [(libc::c_int, libc::sighandler_t); 2],
}

impl Guard {
    pub fn install() -> Guard {
        FIRST.store(0, Ordering::SeqCst);
        let handler = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
        // SAFETY: the handler only touches an atomic and calls async-signal-safe functions.
        let previous = [libc::SIGINT, libc::SIGTERM].map(|s| (s, unsafe { libc::signal(s, handler) }));
        Guard { previous }
    }

    /// The signal that asked the run to stop, if any.
    pub fn received(&self) -> Option<Signal> {
        match FIRST.load(Ordering::SeqCst) {
            libc::SIGINT => Some(Signal::Interrupt),
            libc::SIGTERM => Some(Signal::Terminate),
            _ => None,
        }
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        for (s, h) in self.previous {
            // SAFETY: restores what was installed before.
            unsafe { libc::signal(s, h) };
        }
    }
}

/// A signal that stops a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signal {
    Interrupt,
    Terminate,
}

impl Signal {
    pub fn name(self) -> &'static str {
        match self {
            Signal::Interrupt => "SIGINT",
            Signal::Terminate => "SIGTERM",
        }
    }

    /// The shell's exit status for a process ended by the signal.
    pub fn exit_code(self) -> u8 {
        match self {
            Signal::Interrupt => 130,
            Signal::Terminate => 143,
        }
    }
}
