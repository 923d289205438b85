//! Who may call the guarded routes: the operator's bearer token (made at `init`, or at the
//! first `serve` of an older node; kept in `node-dir/api.token` with mode 0600; compared by
//! its hash; never logged), or a request signed with an accepted ed25519 key ([`signed`]).
//!
//! [`signed`]: super::signed

use std::path::{Path, PathBuf};
use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::signed::{self, Keyring};
use crate::fsutil;
use crate::serve::openai::ApiError;

/// The file, in the node directory.
pub const TOKEN_FILE: &str = "api.token";

/// What a token starts with, so one found in a config or a log is recognisable.
const PREFIX: &str = "mxa1.";

/// Fewest characters an operator's own token may have (the made ones have 69): 32
/// characters of even a lowercase alphabet are over 150 bits.
pub const MIN_TOKEN_CHARS: usize = 32;

/// How to make a token, for the messages that refuse one.
const HOW_TO_MAKE_ONE: &str = "delete it and start `mindxtrain serve` again, which writes a fresh one (mode 0600), or \
     write your own: (umask 077; printf 'mxa1.%s' \"$(openssl rand -hex 32)\" > api.token)";

/// Why the token file cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{path} is empty: an empty token would let any `Authorization: Bearer` in; {HOW_TO_MAKE_ONE}")]
    Empty { path: PathBuf },
    #[error("{path} holds {chars} characters; a token needs at least {MIN_TOKEN_CHARS}: {HOW_TO_MAKE_ONE}")]
    Short { path: PathBuf, chars: usize },
    #[error(
        "{path} holds a character a bearer token cannot carry ({what}); a token is letters, digits and \
         `-._~+/` (then `=` padding) on one line: {HOW_TO_MAKE_ONE}"
    )]
    Charset { path: PathBuf, what: String },
    #[error(
        "{path} is readable by group or others (mode {mode:o}), and anyone who reads it is the operator: run \
         `chmod 600 {path}` (or pass --allow-readable-secrets if the file cannot be private)"
    )]
    LoosePermissions { path: PathBuf, mode: u32 },
}

/// The accepted token, held as its BLAKE3 hash (whose equality is constant-time).
pub struct ApiToken {
    hash: blake3::Hash,
}

impl ApiToken {
    /// Reads `node-dir/api.token`, creating it (0600) when missing. Returns whether it was
    /// created. A token that is empty, short, not a bearer token, or in a file group or
    /// others can read is refused, saying how to make a good one.
    pub fn load_or_create(node_dir: &Path) -> Result<(ApiToken, bool), TokenError> {
        let path = node_dir.join(TOKEN_FILE);
        let io = |source| TokenError::Io { path: path.clone(), source };
        match std::fs::metadata(&path) {
            Ok(meta) => {
                if let Some(mode) = crate::identity::loose_mode(&meta) {
                    return Err(TokenError::LoosePermissions { path, mode });
                }
                let text = std::fs::read_to_string(&path).map_err(io)?;
                Ok((ApiToken::from_file_text(&path, &text)?, false))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let mut secret = [0u8; 32];
                getrandom::fill(&mut secret).map_err(|e| io(std::io::Error::other(e.to_string())))?;
                let token = format!("{PREFIX}{}", hex::encode(secret));
                fsutil::write_new_durably(&path, token.as_bytes(), 0o600).map_err(io)?;
                Ok((ApiToken::accepting(&token), true))
            }
            Err(e) => Err(io(e)),
        }
    }

    /// The token a file holds: its one line (a final line break is not part of it).
    fn from_file_text(path: &Path, text: &str) -> Result<ApiToken, TokenError> {
        let token = text.strip_suffix('\n').map(|t| t.strip_suffix('\r').unwrap_or(t)).unwrap_or(text);
        let path = path.to_path_buf();
        if token.trim().is_empty() {
            return Err(TokenError::Empty { path });
        }
        if let Some(c) = token.chars().find(|&c| !is_token_char(c)) {
            let what = if c.is_whitespace() || c.is_control() { format!("{c:?}") } else { format!("`{c}`") };
            return Err(TokenError::Charset { path, what });
        }
        let padding = token.len() - token.trim_end_matches('=').len();
        if token[..token.len() - padding].contains('=') {
            return Err(TokenError::Charset { path, what: "`=` before the end".into() });
        }
        if token.len() < MIN_TOKEN_CHARS {
            return Err(TokenError::Short { path, chars: token.len() });
        }
        Ok(ApiToken::accepting(token))
    }

    pub fn accepting(token: &str) -> ApiToken {
        ApiToken { hash: blake3::hash(token.as_bytes()) }
    }

    pub fn accepts(&self, presented: &str) -> bool {
        blake3::hash(presented.as_bytes()) == self.hash
    }
}

/// RFC 6750's `b64token`: what may follow `Bearer `.
fn is_token_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || "-._~+/=".contains(c)
}

/// Splits `Authorization: <scheme> <rest>`: the scheme is compared case-insensitively (RFC
/// 9110 §11.1), one or more spaces separate it from its credentials, and the credentials
/// are taken as they are: nothing is trimmed into a match.
fn split_credentials(value: &str) -> (&str, &str) {
    match value.split_once(' ') {
        Some((scheme, rest)) => (scheme, rest.trim_start_matches(' ')),
        None => (value, ""),
    }
}

/// What the guard accepts.
pub struct Credentials {
    pub token: ApiToken,
    pub keys: Keyring,
}

/// Lets a request through with `Authorization: Bearer <the token>` or a good `Mxsig`
/// signature; 401 otherwise, saying what was wrong.
pub async fn require(State(creds): State<Arc<Credentials>>, req: Request, next: Next) -> Response {
    let presented = req.headers().get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()).map(str::to_owned);
    let credentials = presented.as_deref().map(split_credentials);
    let refusal = match credentials {
        Some((scheme, token)) if scheme.eq_ignore_ascii_case("bearer") => {
            if !token.is_empty() && token.chars().all(is_token_char) && creds.token.accepts(token) {
                return next.run(req).await;
            }
            if token.is_empty() {
                "`Authorization: Bearer` carries no token (see api.token in the node directory)".to_owned()
            } else {
                "the bearer token is not this node's (see api.token in the node directory)".to_owned()
            }
        }
        Some((scheme, params)) if scheme.eq_ignore_ascii_case(signed::SCHEME) => {
            match check_signed(&creds.keys, params, req).await {
                Ok((req, key_name)) => {
                    tracing::debug!(key = %key_name, "signed operator request");
                    return next.run(req).await;
                }
                Err(refusal) => refusal,
            }
        }
        _ => "this route needs `Authorization: Bearer <token>` (api.token in the node directory) or an \
              `Mxsig` signed request (see docs/formats.md)"
            .to_owned(),
    };
    let mut r =
        ApiError::new(StatusCode::UNAUTHORIZED, "authentication_error", "unauthorized", refusal).into_response();
    r.headers_mut().insert(header::WWW_AUTHENTICATE, header::HeaderValue::from_static("Bearer realm=\"mindxtrain\""));
    r
}

/// Checks a signed request (its body read, up to the size limit, and put back).
async fn check_signed(keys: &Keyring, params: &str, req: Request) -> Result<(Request, String), String> {
    let credential = signed::parse(params).map_err(|e| format!("Mxsig: {e}"))?;
    let (parts, body) = req.into_parts();
    let body = axum::body::to_bytes(body, super::MAX_BODY).await.map_err(|e| format!("reading the body: {e}"))?;
    let path = parts.uri.path_and_query().map_or(parts.uri.path(), |p| p.as_str());
    let message = signed::message(parts.method.as_str(), path, credential.ts, &body);
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let name = keys.check(&credential, &message, now).map_err(|e| format!("Mxsig: {e}"))?.to_owned();
    Ok((Request::from_parts(parts, Body::from(body)), name))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn the_token_is_made_once_with_mode_0600_and_only_it_is_accepted() {
        let dir = tempfile::tempdir().unwrap();
        let (token, created) = ApiToken::load_or_create(dir.path()).unwrap();
        assert!(created);
        let text = std::fs::read_to_string(dir.path().join(TOKEN_FILE)).unwrap();
        assert!(text.starts_with(PREFIX) && text.len() == PREFIX.len() + 64);
        let mode = std::fs::metadata(dir.path().join(TOKEN_FILE)).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        assert!(token.accepts(&text));
        assert!(!token.accepts(&text[..text.len() - 1]));
        assert!(!token.accepts(""));
        let (again, created) = ApiToken::load_or_create(dir.path()).unwrap();
        assert!(!created && again.accepts(&text), "the same token on the next start");
    }

    fn load(text: &str, mode: u32) -> Result<ApiToken, TokenError> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(TOKEN_FILE);
        std::fs::write(&path, text).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
        ApiToken::load_or_create(dir.path()).map(|(t, created)| {
            assert!(!created);
            t
        })
    }

    #[test]
    fn empty_short_odd_and_readable_tokens_are_refused_saying_how_to_make_one() {
        let good = format!("{PREFIX}{}", "ab".repeat(32));
        for (text, want) in [("", "is empty"), ("\n", "is empty"), ("   \n", "is empty"), ("\t", "is empty")] {
            let e = load(text, 0o600).err().unwrap_or_else(|| panic!("{text:?} accepted"));
            assert!(e.to_string().contains(want) && e.to_string().contains("openssl rand"), "{text:?}: {e}");
        }
        let e = load("short-token\n", 0o600).err().unwrap();
        assert!(matches!(e, TokenError::Short { chars: 11, .. }), "{e}");
        for odd in
            [format!(" {good}"), format!("{good} "), format!("{good}\n\n"), format!("a b{good}"), format!("{good}=x")]
        {
            assert!(matches!(load(&odd, 0o600), Err(TokenError::Charset { .. })), "{odd:?} accepted");
        }
        for mode in [0o644, 0o640, 0o604, 0o660] {
            let e = load(&good, mode).err().unwrap_or_else(|| panic!("mode {mode:o} accepted"));
            assert!(matches!(e, TokenError::LoosePermissions { .. }), "{e}");
            assert!(e.to_string().contains("--allow-readable-secrets"), "{e}");
        }
        for text in [good.clone(), format!("{good}\n"), format!("{good}\r\n"), format!("{}==", "A".repeat(40))] {
            let t = load(&text, 0o600).unwrap_or_else(|e| panic!("{text:?}: {e}"));
            assert!(t.accepts(text.trim_end()), "{text:?}");
        }
    }

    #[test]
    fn the_scheme_is_case_insensitive_and_the_token_is_not_trimmed() {
        assert_eq!(split_credentials("Bearer abc"), ("Bearer", "abc"));
        assert_eq!(split_credentials("bearer   abc"), ("bearer", "abc"));
        assert_eq!(split_credentials("Bearer"), ("Bearer", ""));
        assert_eq!(split_credentials("Bearer "), ("Bearer", ""));
        assert_eq!(split_credentials("Bearer abc "), ("Bearer", "abc "));
        assert_eq!(split_credentials("Bearer a\tb"), ("Bearer", "a\tb"));
    }
}
