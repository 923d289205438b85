//! A local anvil started from the project's installed Foundry toolchain.
//!
//! The node's embedded default and the tests run their chain this way: anvil listens on
//! a free loopback port, and is stopped when the handle drops. Stopping sends SIGTERM
//! and waits, so an anvil started with a state file dumps its state before exiting.
//! anvil also gets SIGTERM if the process that started it dies (PR_SET_PDEATHSIG), so a
//! killed node leaves no chain behind.

use crate::network::ANVIL;
use std::io::Read;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use thiserror::Error;

/// Environment variable naming the anvil binary to use.
pub const ANVIL_ENV: &str = "MINDXTRAIN_ANVIL";
/// Where `scripts/setup-contracts` installs anvil, relative to the workspace root.
pub const ANVIL_IN_WORKSPACE: &str = "contracts/node_modules/@foundry-rs/anvil-linux-amd64/bin/anvil";

#[derive(Debug, Error)]
pub enum AnvilError {
    #[error(
        "anvil not found: set {ANVIL_ENV}, or run `bash scripts/setup-contracts` in the workspace (looked in: {looked})"
    )]
    NotFound { looked: String },
    #[error("cannot start {binary}: {source}")]
    Spawn { binary: PathBuf, source: std::io::Error },
    #[error("anvil exited while starting ({status}): {stderr}")]
    Exited { status: String, stderr: String },
    #[error("anvil did not listen on port {port} within {seconds}s: {stderr}")]
    NotListening { port: u16, seconds: u64, stderr: String },
    #[error("no free loopback port: {0}")]
    NoPort(std::io::Error),
}

/// How anvil keeps its chain between runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StateFile {
    /// Load the file if it exists, dump the chain to it on exit (`--state`).
    LoadAndDump(PathBuf),
    /// Load the file, never write it (`--load-state`): for readers beside a writer.
    LoadOnly(PathBuf),
}

#[derive(Debug, Clone, Default)]
pub struct AnvilOptions {
    /// Port to listen on; a free one when `None`.
    pub port: Option<u16>,
    /// Chain id; 31337 when `None`.
    pub chain_id: Option<u64>,
    pub state: Option<StateFile>,
    /// With [`StateFile::LoadAndDump`]: also dump every this many seconds, so that a
    /// killed anvil loses at most that much.
    pub state_interval: Option<u64>,
    /// The binary; found with [`find_anvil`] when `None`.
    pub binary: Option<PathBuf>,
}

/// A running anvil. Dropping it stops anvil (gracefully, then by force).
#[derive(Debug)]
pub struct LocalAnvil {
    child: Option<Child>,
    port: u16,
    chain_id: u64,
    stderr: Arc<Mutex<String>>,
}

impl LocalAnvil {
    /// Starts anvil and waits until it accepts connections.
    pub fn start(opts: AnvilOptions) -> Result<Self, AnvilError> {
        let binary = match &opts.binary {
            Some(b) => b.clone(),
            None => find_anvil()?,
        };
        // A port picked here may be taken before anvil binds it; try a few.
        let tries = if opts.port.is_some() { 1 } else { 3 };
        let mut last = None;
        for _ in 0..tries {
            let port = match opts.port {
                Some(p) => p,
                None => free_port()?,
            };
            match Self::spawn(&binary, port, &opts) {
                Ok(a) => return Ok(a),
                Err(e @ AnvilError::Exited { .. }) => last = Some(e),
                Err(e) => return Err(e),
            }
        }
        Err(last.unwrap_or(AnvilError::NotFound { looked: String::new() }))
    }

    fn spawn(binary: &Path, port: u16, opts: &AnvilOptions) -> Result<Self, AnvilError> {
        let chain_id = opts.chain_id.unwrap_or(ANVIL.chain_id);
        let mut cmd = Command::new(binary);
        cmd.args(["--host", "127.0.0.1", "--port", &port.to_string(), "--chain-id", &chain_id.to_string()]);
        match &opts.state {
            Some(StateFile::LoadAndDump(p)) => {
                cmd.arg("--state").arg(p);
                if let Some(secs) = opts.state_interval {
                    cmd.args(["--state-interval", &secs.to_string()]);
                }
            }
            Some(StateFile::LoadOnly(p)) if p.exists() => {
                cmd.arg("--load-state").arg(p);
            }
            _ => {}
        }
        cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::piped());
        // SAFETY: prctl is async-signal-safe and touches only the child's own state.
        unsafe {
            cmd.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let mut child = cmd.spawn().map_err(|source| AnvilError::Spawn { binary: binary.to_path_buf(), source })?;
        let stderr = Arc::new(Mutex::new(String::new()));
        if let Some(mut pipe) = child.stderr.take() {
            let sink = stderr.clone();
            std::thread::spawn(move || {
                let mut buf = [0u8; 4096];
                while let Ok(n) = pipe.read(&mut buf) {
                    if n == 0 {
                        break;
                    }
                    let mut s = sink.lock().unwrap_or_else(|e| e.into_inner());
                    // Keep the tail only: anvil may run for a long time.
                    if s.len() > 64 << 10 {
                        let cut = s.len() - (32 << 10);
                        let cut = (cut..s.len()).find(|&i| s.is_char_boundary(i)).unwrap_or(s.len());
                        s.drain(..cut);
                    }
                    s.push_str(&String::from_utf8_lossy(&buf[..n]));
                }
            });
        }
        let mut anvil = Self { child: Some(child), port, chain_id, stderr };
        let deadline = Instant::now() + Duration::from_secs(30);
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        loop {
            if let Some(c) = anvil.child.as_mut()
                && let Ok(Some(status)) = c.try_wait()
            {
                anvil.child = None;
                std::thread::sleep(Duration::from_millis(50));
                return Err(AnvilError::Exited { status: status.to_string(), stderr: anvil.stderr_tail() });
            }
            if answers_json_rpc(&addr) {
                return Ok(anvil);
            }
            if Instant::now() > deadline {
                let stderr = anvil.stderr_tail();
                anvil.kill();
                return Err(AnvilError::NotListening { port, seconds: 30, stderr });
            }
            std::thread::sleep(Duration::from_millis(25));
        }
    }

    /// `http://127.0.0.1:<port>`
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn chain_id(&self) -> u64 {
        self.chain_id
    }

    /// The process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// What anvil wrote to stderr (the last 32–64 KiB).
    pub fn stderr_tail(&self) -> String {
        self.stderr.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Kills anvil at once (SIGKILL): no state dump. Tests use it to simulate a crash.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Stops anvil with SIGTERM, so that a state file is written, waiting up to 10 s
    /// before killing it.
    pub fn stop(&mut self) {
        let Some(mut c) = self.child.take() else { return };
        if let Ok(pid) = i32::try_from(c.id()) {
            // SAFETY: plain kill(2) on our own child's pid, which we have not reaped yet.
            unsafe {
                libc::kill(pid, libc::SIGTERM);
            }
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = c.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = c.kill();
        let _ = c.wait();
    }
}

impl Drop for LocalAnvil {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Whether a JSON-RPC server answers at `addr` (a bare TCP accept is not enough: the
/// port may belong to someone else).
fn answers_json_rpc(addr: &SocketAddr) -> bool {
    use std::io::Write;
    let Ok(mut s) = TcpStream::connect_timeout(addr, Duration::from_millis(200)) else { return false };
    let body = r#"{"jsonrpc":"2.0","id":1,"method":"eth_chainId","params":[]}"#;
    let req = format!(
        "POST / HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    if s.set_read_timeout(Some(Duration::from_millis(500))).is_err() || s.write_all(req.as_bytes()).is_err() {
        return false;
    }
    let mut buf = Vec::new();
    let _ = s.read_to_end(&mut buf);
    String::from_utf8_lossy(&buf).contains("\"result\"")
}

/// A loopback port nobody listens on right now.
pub fn free_port() -> Result<u16, AnvilError> {
    let l = TcpListener::bind("127.0.0.1:0").map_err(AnvilError::NoPort)?;
    l.local_addr().map(|a| a.port()).map_err(AnvilError::NoPort)
}

/// The anvil binary: `$MINDXTRAIN_ANVIL`, else the workspace's installed toolchain
/// (searched upwards from the working directory, from this executable, and from the
/// source tree this crate was built from), else `anvil` on `PATH`.
pub fn find_anvil() -> Result<PathBuf, AnvilError> {
    if let Some(p) = std::env::var_os(ANVIL_ENV) {
        return Ok(PathBuf::from(p));
    }
    let mut roots: Vec<PathBuf> = Vec::new();
    if let Ok(cwd) = std::env::current_dir() {
        roots.extend(cwd.ancestors().map(Path::to_path_buf));
    }
    if let Ok(exe) = std::env::current_exe() {
        roots.extend(exe.ancestors().skip(1).map(Path::to_path_buf));
    }
    roots.extend(Path::new(env!("CARGO_MANIFEST_DIR")).ancestors().map(Path::to_path_buf));
    let mut looked = Vec::new();
    for root in roots {
        let candidate = root.join(ANVIL_IN_WORKSPACE);
        if candidate.is_file() {
            return Ok(candidate);
        }
        if root.join("Cargo.toml").is_file() {
            looked.push(candidate.display().to_string());
        }
    }
    if let Some(path) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&path) {
            let candidate = dir.join("anvil");
            if candidate.is_file() {
                return Ok(candidate);
            }
        }
    }
    looked.push("$PATH".into());
    looked.dedup();
    Err(AnvilError::NotFound { looked: looked.join(", ") })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn starts_on_a_free_port_and_stops_on_drop() {
        let anvil = LocalAnvil::start(AnvilOptions::default()).expect("anvil starts");
        let port = anvil.port();
        assert!(TcpStream::connect(("127.0.0.1", port)).is_ok());
        assert_eq!(anvil.chain_id(), 31337);
        drop(anvil);
        assert!(TcpStream::connect(("127.0.0.1", port)).is_err(), "anvil still listens after drop");
    }

    #[test]
    fn a_taken_port_is_reported_with_anvils_own_message() {
        let busy = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = busy.local_addr().unwrap().port();
        let err = LocalAnvil::start(AnvilOptions { port: Some(port), ..Default::default() }).unwrap_err();
        assert!(matches!(err, AnvilError::Exited { .. }), "{err}");
    }

    #[test]
    fn a_missing_binary_is_a_spawn_error() {
        let opts = AnvilOptions { binary: Some("/nonexistent/anvil".into()), ..Default::default() };
        assert!(matches!(LocalAnvil::start(opts), Err(AnvilError::Spawn { .. })));
    }
}
