//! Request ids. Every API call gets one: the caller's `X-Request-Id` when it is a plain token
//! (1 to 64 of `A-Z a-z 0-9 - _ . :`), else one made here. The answer carries it back in
//! `X-Request-Id`, a follower forwards it to the leader, and a tracing span named `request`
//! carries it (with the method and path) to every log line the call causes, in the handlers
//! and in the cluster under its lock ([`crate::api::AppState`] enters the span there).

use axum::extract::Request;
use axum::http::HeaderValue;
use axum::middleware::Next;
use axum::response::Response;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use tracing::Instrument;

pub const HEADER: &str = "x-request-id";

/// The longest id taken from a caller.
pub const MAX_LEN: usize = 64;

/// Whether a caller's id is taken as it is: short, and nothing a log reader could mistake.
pub fn acceptable(id: &str) -> bool {
    (1..=MAX_LEN).contains(&id.len())
        && id.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b':'))
}

/// A new id: this process's random prefix and a counter, `3f9a61c2-000000000000002a`.
pub fn new_id() -> String {
    static PREFIX: OnceLock<u32> = OnceLock::new();
    static NEXT: AtomicU64 = AtomicU64::new(1);
    let prefix = *PREFIX.get_or_init(|| crate::auth::random_u64().map_or(0, |r| r as u32));
    format!("{prefix:08x}-{:016x}", NEXT.fetch_add(1, Ordering::Relaxed))
}

/// The outermost middleware: names the request, runs it in its span, answers with its id.
pub async fn middleware(mut req: Request, next: Next) -> Response {
    let given = req.headers().get(HEADER).and_then(|v| v.to_str().ok()).filter(|v| acceptable(v));
    let id = given.map_or_else(new_id, str::to_string);
    let value = HeaderValue::from_str(&id).unwrap_or_else(|_| HeaderValue::from_static("-"));
    req.headers_mut().insert(HEADER, value.clone());
    let span = tracing::info_span!("request", id = %id, method = %req.method(), path = %req.uri().path());
    let mut resp = next.run(req).instrument(span.clone()).await;
    span.in_scope(|| tracing::debug!(status = resp.status().as_u16(), "answered"));
    resp.headers_mut().insert(HEADER, value);
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_plain_ids_are_taken() {
        assert!(acceptable("walk-1") && acceptable("a.b:c_d"));
        assert!(!acceptable("") && !acceptable(&"x".repeat(65)));
        assert!(!acceptable("a b") && !acceptable("x\u{1b}[2J") && !acceptable("a\"b"));
        let (a, b) = (new_id(), new_id());
        assert_ne!(a, b);
        assert!(acceptable(&a), "{a}");
    }
}
