//! The Coach web UI: three files embedded in the binary at build time and served by the node
//! itself (no build server, nothing fetched at run time), under a CSP that allows only the
//! node's own scripts, styles and API.

use axum::http::header;
use axum::response::{IntoResponse, Redirect, Response};

const INDEX: &str = include_str!("ui/index.html");
const SCRIPT: &str = include_str!("ui/app.js");
const STYLE: &str = include_str!("ui/app.css");

/// Only this node's own code and API; no inline script, no framing.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
                   connect-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'";

fn asset(content_type: &'static str, body: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CONTENT_SECURITY_POLICY, CSP),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            (header::CACHE_CONTROL, "no-cache"),
            (header::REFERRER_POLICY, "no-referrer"),
        ],
        body,
    )
        .into_response()
}

/// `GET /`: to the UI.
pub async fn root() -> Redirect {
    Redirect::to("/ui/")
}

/// `GET /ui/`.
pub async fn index() -> Response {
    asset("text/html; charset=utf-8", INDEX)
}

/// `GET /ui/app.js`.
pub async fn script() -> Response {
    asset("text/javascript; charset=utf-8", SCRIPT)
}

/// `GET /ui/app.css`.
pub async fn style() -> Response {
    asset("text/css; charset=utf-8", STYLE)
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_page_loads_only_its_own_files_and_inserts_no_html() {
        for asset in ["/ui/app.js", "/ui/app.css"] {
            assert!(super::INDEX.contains(asset), "{asset}");
        }
        assert!(!super::INDEX.contains("http"), "nothing from elsewhere");
        // Node data goes in as text: the script never assigns HTML.
        assert!(!super::SCRIPT.contains("innerHTML") && !super::SCRIPT.contains("outerHTML"));
    }
}
