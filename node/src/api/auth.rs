//! Who may call the guarded routes: the operator's bearer token (made at `init`, or at the
//! first `serve` of an older node; kept in `node-dir/api.token` with mode 0600; compared by
//! its hash; never logged), or a request signed with an accepted ed25519 key ([`signed`]).
//!
//! [`signed`]: super::signed

use std::path::Path;
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

/// The accepted token, held as its BLAKE3 hash (whose equality is constant-time).
pub struct ApiToken {
    hash: blake3::Hash,
}

impl ApiToken {
    /// Reads `node-dir/api.token`, creating it (0600) when missing. Returns whether it was
    /// created.
    pub fn load_or_create(node_dir: &Path) -> std::io::Result<(ApiToken, bool)> {
        let path = node_dir.join(TOKEN_FILE);
        match std::fs::read_to_string(&path) {
            Ok(text) => Ok((ApiToken::accepting(text.trim()), false)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let mut secret = [0u8; 32];
                getrandom::fill(&mut secret).map_err(|e| std::io::Error::other(e.to_string()))?;
                let token = format!("{PREFIX}{}", hex::encode(secret));
                fsutil::write_new_durably(&path, token.as_bytes(), 0o600)?;
                Ok((ApiToken::accepting(&token), true))
            }
            Err(e) => Err(e),
        }
    }

    pub fn accepting(token: &str) -> ApiToken {
        ApiToken { hash: blake3::hash(token.as_bytes()) }
    }

    pub fn accepts(&self, presented: &str) -> bool {
        blake3::hash(presented.as_bytes()) == self.hash
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
    let refusal = match presented.as_deref().map(|v| v.split_once(' ').unwrap_or((v, ""))) {
        Some(("Bearer", t)) if creds.token.accepts(t.trim()) => return next.run(req).await,
        Some(("Bearer", _)) => "the bearer token is not this node's (see api.token in the node directory)".to_owned(),
        Some((signed::SCHEME, params)) => match check_signed(&creds.keys, params, req).await {
            Ok((req, key_name)) => {
                tracing::debug!(key = %key_name, "signed operator request");
                return next.run(req).await;
            }
            Err(refusal) => refusal,
        },
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

    #[test]
    fn the_token_is_made_once_with_mode_0600_and_only_it_is_accepted() {
        use std::os::unix::fs::PermissionsExt;
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
}
