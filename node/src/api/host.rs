//! The `Host` check of a node bound to loopback, against DNS rebinding.
//!
//! A web page can make a browser send requests to `127.0.0.1` under its own name: it points
//! `evil.example` at 127.0.0.1 after the page has loaded, and the browser, which only
//! checks names, lets the page read the answers. The open routes (receipts, runs, recipes,
//! the log's proofs, the UI) would then serve another site's scripts. Only a request that
//! names the node as a local client does gets through a loopback-bound node: `localhost`,
//! a `*.localhost` name, a loopback address, or a name given with `--allowed-host` (a
//! reverse proxy's public name, say); anything else is 403 `host_not_allowed`. A node bound
//! to another address is reached by names nobody can list in advance and is not checked.

use std::net::IpAddr;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};

use crate::serve::openai::ApiError;

/// The names a loopback-bound node answers to, beyond the local ones.
#[derive(Debug, Clone, Default)]
pub struct AllowedHosts {
    extra: Vec<String>,
}

impl AllowedHosts {
    /// Local names and addresses, and `extra` (names or addresses, without port).
    pub fn new(extra: impl IntoIterator<Item = String>) -> Self {
        AllowedHosts { extra: extra.into_iter().map(|h| h.trim_end_matches('.').to_ascii_lowercase()).collect() }
    }

    /// Whether a `Host` header value (name or address, with an optional port) is allowed.
    pub fn allows(&self, host: &str) -> bool {
        let name = host_name(host).to_ascii_lowercase();
        let name = name.trim_end_matches('.');
        name == "localhost"
            || name.ends_with(".localhost")
            || name.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
            || self.extra.iter().any(|e| e == name)
    }
}

/// The host of a `Host` value: `[::1]:8080` → `::1`, `a.b:80` → `a.b`, `a.b` → `a.b`.
fn host_name(host: &str) -> &str {
    if let Some(rest) = host.strip_prefix('[') {
        return rest.split_once(']').map_or(rest, |(ip, _)| ip);
    }
    match host.rsplit_once(':') {
        Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name,
        _ => host,
    }
}

/// `app` with the check when `bound` is a loopback address; `app` itself otherwise.
pub fn guard(app: axum::Router, bound: IpAddr, allowed: AllowedHosts) -> axum::Router {
    if !bound.is_loopback() {
        return app;
    }
    app.layer(middleware::from_fn_with_state(Arc::new(allowed), check))
}

async fn check(State(allowed): State<Arc<AllowedHosts>>, req: Request, next: Next) -> Response {
    let host = req.headers().get(header::HOST).and_then(|v| v.to_str().ok()).or(req.uri().host());
    match host {
        Some(h) if allowed.allows(h) => next.run(req).await,
        Some(h) => refused(format!(
            "this node listens on loopback and answers only to local names (localhost, 127.0.0.1, [::1]), not {h:?}; \
             start it with --allowed-host NAME to answer to NAME"
        )),
        None => refused("a request to this node must name its host (the Host header)".into()),
    }
}

fn refused(message: String) -> Response {
    ApiError::new(StatusCode::FORBIDDEN, "invalid_request_error", "host_not_allowed", message).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_names_pass_and_others_only_when_allowed() {
        let hosts = AllowedHosts::new(["Node.Example.".to_owned()]);
        for ok in [
            "localhost",
            "LOCALHOST:8080",
            "127.0.0.1",
            "127.0.0.1:80",
            "127.9.9.9:1",
            "[::1]:8080",
            "[::1]",
            "ui.localhost:3000",
            "node.example",
            "node.example:443",
        ] {
            assert!(hosts.allows(ok), "{ok}");
        }
        for bad in [
            "evil.example",
            "evil.example:8080",
            "10.0.0.1",
            "localhost.evil.example",
            "127.0.0.1.evil.example",
            "[::2]:80",
            "",
            "node.example.evil",
        ] {
            assert!(!hosts.allows(bad), "{bad}");
        }
    }
}
