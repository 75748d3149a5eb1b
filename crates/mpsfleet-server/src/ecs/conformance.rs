//! Conformance mode (`mpsfleet server --ecs-conformance`), for running moto's ECS test suite
//! against the server: it signs with the fixed key `FOOBARKEY` / `FOOBARSECRET` (installed as an
//! admin access key at start) and POSTs `/moto-api/reset` before each test, which empties what
//! the ECS-compatible API shows. Never on by default: the key is public.

use super::Ecs;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;

/// The access key id and secret the suite signs with.
pub const KEY_ID: &str = "FOOBARKEY";
pub const SECRET: &str = "FOOBARSECRET";
/// The account id the suite's ARNs carry.
pub const ACCOUNT_ID: &str = "123456789012";

/// `POST /moto-api/reset`.
pub(super) async fn reset(State(ecs): State<Ecs>) -> impl IntoResponse {
    let st = ecs.serving.state.clone();
    match st.tick(|c| c.empty_for_conformance().map(|()| Vec::new())).await {
        Ok(()) => (StatusCode::OK, r#"{"status": "ok"}"#).into_response(),
        Err(e) => crate::error::ApiError::from(e).into_response(),
    }
}
