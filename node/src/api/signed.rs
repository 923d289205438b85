//! Ed25519-signed operator requests: the alternative to the bearer token for clients that
//! hold a key rather than a shared secret (an agent, a CI job), and whose requests must not
//! be replayable by whoever sees them.
//!
//! ```text
//! Authorization: Mxsig key=<hex public key>,ts=<unix seconds>,sig=<hex signature>
//! signature = Ed25519(key, "mindxtrain/api-request/v1\n" METHOD "\n" PATH?QUERY "\n" ts "\n" hex(BLAKE3(body)))
//! ```
//!
//! A key is accepted when it is the node's own or listed in `node-dir/api.keys` (one hex
//! public key per line, then an optional name; `#` starts a comment). A signature is good
//! for [`WINDOW_SECS`] either side of the node's clock, and once: a second request with
//! the same signature inside the window is refused.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Mutex;

use ed25519_dalek::VerifyingKey;

use crate::identity::{self, Identity};

/// The file of extra keys, in the node directory.
pub const KEYS_FILE: &str = "api.keys";

/// The `Authorization` scheme.
pub const SCHEME: &str = "Mxsig";

/// How far a request's `ts` may be from the node's clock.
pub const WINDOW_SECS: u64 = 300;

const DOMAIN: &str = "mindxtrain/api-request/v1\n";

/// The bytes a request's signature covers.
pub fn message(method: &str, path_and_query: &str, ts: u64, body: &[u8]) -> Vec<u8> {
    format!("{DOMAIN}{method}\n{path_and_query}\n{ts}\n{}", blake3::hash(body).to_hex()).into_bytes()
}

/// The `Authorization` header value of a request signed by `key` at `ts`.
pub fn authorization(key: &Identity, method: &str, path_and_query: &str, ts: u64, body: &[u8]) -> String {
    let sig = key.sign(&message(method, path_and_query, ts, body));
    format!("{SCHEME} key={},ts={ts},sig={}", hex::encode(key.public_bytes()), hex::encode(sig))
}

/// A parsed `Mxsig` credential.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Credential {
    pub key: [u8; 32],
    pub ts: u64,
    pub sig: [u8; 64],
}

/// Parses the part of the header after `Mxsig `.
pub fn parse(params: &str) -> Result<Credential, String> {
    let (mut key, mut ts, mut sig) = (None, None, None);
    for part in params.split(',') {
        let (name, value) = part.trim().split_once('=').ok_or_else(|| format!("{part:?} is not name=value"))?;
        let value = value.trim().trim_matches('"');
        match name.trim() {
            "key" => key = Some(identity::parse_key_hex(value).ok_or("key is not 32 bytes of hex")?),
            "ts" => ts = Some(value.parse::<u64>().map_err(|_| "ts is not unix seconds")?),
            "sig" => {
                let bytes = hex::decode(value).map_err(|_| "sig is not hex")?;
                sig = Some(<[u8; 64]>::try_from(bytes).map_err(|_| "sig is not 64 bytes")?);
            }
            other => return Err(format!("unknown parameter {other:?} (key, ts, sig)")),
        }
    }
    Ok(Credential { key: key.ok_or("no key=")?, ts: ts.ok_or("no ts=")?, sig: sig.ok_or("no sig=")? })
}

/// The keys a node accepts and the signatures it has seen lately.
pub struct Keyring {
    keys: Vec<(VerifyingKey, String)>,
    seen: Mutex<HashMap<[u8; 64], u64>>,
}

impl Keyring {
    /// The node's own key and those of `node-dir/api.keys` (a missing file is no extra keys).
    pub fn load(node_dir: &Path, own: &Identity) -> Result<Self, String> {
        let mut keys = vec![(own.verifying_key(), "node".to_owned())];
        let path = node_dir.join(KEYS_FILE);
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
            Err(e) => return Err(format!("{}: {e}", path.display())),
        };
        for (i, line) in text.lines().enumerate() {
            let line = line.split('#').next().unwrap_or_default().trim();
            if line.is_empty() {
                continue;
            }
            let (hex_key, name) = line.split_once(char::is_whitespace).unwrap_or((line, ""));
            let key = identity::read_public_key(hex_key).map_err(|e| format!("{}:{}: {e}", path.display(), i + 1))?;
            keys.push((key, name.trim().to_owned()));
        }
        Ok(Keyring { keys, seen: Mutex::new(HashMap::new()) })
    }

    /// Checks a credential for a request; returns the key's name.
    pub fn check(&self, c: &Credential, message: &[u8], now: u64) -> Result<&str, String> {
        let (key, name) = self
            .keys
            .iter()
            .find(|(k, _)| k.as_bytes() == &c.key)
            .ok_or("the key is not this node's nor in api.keys")?;
        if c.ts.abs_diff(now) > WINDOW_SECS {
            return Err(format!("ts {} is more than {WINDOW_SECS} s from the node's clock ({now})", c.ts));
        }
        if !identity::verify(key, message, &c.sig) {
            return Err("the signature does not match this request (method, path, ts, body)".into());
        }
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        seen.retain(|_, ts| ts.abs_diff(now) <= WINDOW_SECS);
        if seen.insert(c.sig, c.ts).is_some() {
            return Err("this signed request was already used (sign each request anew)".into());
        }
        Ok(name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn setup() -> (tempfile::TempDir, Identity, Identity, Keyring) {
        let dir = tempfile::tempdir().unwrap();
        let (own, agent) = (Identity::from_seed([1; 32]), Identity::from_seed([2; 32]));
        let listed = format!("# agents\n{} ci-agent\n\n", hex::encode(agent.public_bytes()));
        std::fs::write(dir.path().join(KEYS_FILE), listed).unwrap();
        let ring = Keyring::load(dir.path(), &own).unwrap();
        (dir, own, agent, ring)
    }

    fn check(ring: &Keyring, header: &str, method: &str, path: &str, body: &[u8], now: u64) -> Result<String, String> {
        let c = parse(header.strip_prefix("Mxsig ").unwrap())?;
        ring.check(&c, &message(method, path, c.ts, body), now).map(str::to_owned)
    }

    #[test]
    fn listed_and_own_keys_sign_once_within_the_window() {
        let (_d, own, agent, ring) = setup();
        let h = authorization(&agent, "POST", "/api/runs", 1000, b"{}");
        assert_eq!(check(&ring, &h, "POST", "/api/runs", b"{}", 1100).unwrap(), "ci-agent");
        assert!(check(&ring, &h, "POST", "/api/runs", b"{}", 1100).unwrap_err().contains("already used"));
        let h = authorization(&own, "GET", "/metrics", 1000, b"");
        assert_eq!(check(&ring, &h, "GET", "/metrics", b"", 1000).unwrap(), "node");
        let late = authorization(&own, "GET", "/metrics", 1000, b"");
        assert!(check(&ring, &late, "GET", "/metrics", b"", 1000 + WINDOW_SECS + 1).unwrap_err().contains("clock"));
        let stranger = authorization(&Identity::from_seed([3; 32]), "GET", "/metrics", 1000, b"");
        assert!(check(&ring, &stranger, "GET", "/metrics", b"", 1000).unwrap_err().contains("api.keys"));
    }

    #[test]
    fn a_bad_keys_file_names_its_line() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(KEYS_FILE), "# ok\nnot-a-key someone\n").unwrap();
        let e = Keyring::load(dir.path(), &Identity::from_seed([1; 32])).err().unwrap();
        assert!(e.contains("api.keys:2"), "{e}");
    }

    proptest! {
        /// A signature covers method, path, ts and body: changing any one refuses it.
        #[test]
        fn any_change_to_a_signed_request_is_refused(
            path in "/[a-z/]{0,20}", body in proptest::collection::vec(any::<u8>(), 0..64),
            which in 0usize..4, ts in 1_000u64..2_000,
        ) {
            let (_d, _own, agent, ring) = setup();
            let h = authorization(&agent, "POST", &path, ts, &body);
            let (mut m, mut p, mut t, mut b) = ("POST", path.clone(), ts, body.clone());
            match which {
                0 => m = "GET",
                1 => p.push('x'),
                2 => t += 1,
                _ => b.push(1),
            }
            let c = parse(h.strip_prefix("Mxsig ").unwrap()).unwrap();
            let c = Credential { ts: t, ..c };
            prop_assert!(ring.check(&c, &message(m, &p, t, &b), ts).is_err());
        }

        /// The header parser refuses garbage without panicking.
        #[test]
        fn parsing_never_panics(s in ".{0,200}") {
            let _ = parse(&s);
        }
    }
}
