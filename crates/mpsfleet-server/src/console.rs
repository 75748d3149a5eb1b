//! The web console at `/`: one page and its script and style, compiled into the binary (no
//! build step, nothing fetched from elsewhere at run time). The page holds no data: its script
//! signs in with a token the user types (kept in the tab's sessionStorage) and reads the REST
//! API, live through `/v1/events` (docs/console.md).
//!
//! Every answer here carries a Content-Security-Policy that allows scripts, styles and
//! connections from this server only and no inline script or style, so text that reached the
//! page as markup could not run even if the script put it there; the script puts every API
//! text in as a text node.

use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;

const INDEX: &str = include_str!("console/index.html");
const SCRIPT: &str = include_str!("console/app.js");
const STYLE: &str = include_str!("console/app.css");

/// What the console's answers allow the browser to do.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
     connect-src 'self'; img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

fn asset(content_type: &'static str, body: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CONTENT_SECURITY_POLICY, CONTENT_SECURITY_POLICY),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            (header::REFERRER_POLICY, "no-referrer"),
            (header::X_FRAME_OPTIONS, "DENY"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
        .into_response()
}

/// `/`, `/console/app.js`, `/console/app.css`: public (they hold no data).
pub fn router() -> Router {
    Router::new()
        .route("/", get(|| async { asset("text/html; charset=utf-8", INDEX) }))
        .route("/console/app.js", get(|| async { asset("text/javascript; charset=utf-8", SCRIPT) }))
        .route("/console/app.css", get(|| async { asset("text/css; charset=utf-8", STYLE) }))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The paths the script calls, each a route of the OpenAPI document.
    #[test]
    fn the_script_calls_only_documented_routes() {
        let doc: serde_json::Value = serde_json::from_str(crate::api::document_json()).unwrap();
        let paths: Vec<&String> = doc["paths"].as_object().unwrap().keys().collect();
        let called: Vec<&str> = SCRIPT
            .split('\'')
            .filter(|s| s.starts_with("/v1/"))
            .map(|s| s.split('?').next().unwrap_or(s).trim_end_matches('/'))
            .collect();
        assert!(called.len() >= 8, "{called:?}");
        for c in called {
            // `/v1/hosts/' + seg(id)` is the template `/v1/hosts/{id}`.
            let ok = paths.iter().any(|p| {
                let prefix = p.split('{').next().unwrap_or(p).trim_end_matches('/');
                *p == c || (p.contains('{') && (prefix == c || p.starts_with(&format!("{c}/"))))
            });
            assert!(ok, "the console calls {c}, which the OpenAPI document does not name");
        }
    }

    #[test]
    fn no_inline_script_or_markup_from_text() {
        assert!(
            !INDEX.contains("<script>") && !INDEX.contains("style="),
            "inline code would need 'unsafe-inline'"
        );
        assert!(
            !SCRIPT.contains("innerHTML")
                && !SCRIPT.contains("outerHTML")
                && !SCRIPT.contains("insertAdjacentHTML")
        );
        assert!(!SCRIPT.contains("eval(") && !SCRIPT.contains("new Function"));
        assert!(
            !SCRIPT.contains("http://") && !SCRIPT.contains("https://"),
            "nothing is fetched from elsewhere"
        );
    }
}
