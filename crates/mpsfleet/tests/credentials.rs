//! Credentials bounded by what made them, through the real binary: the conformance suite's
//! public key works only while `--ecs-conformance` is on (and the flag only on loopback), a
//! console session dies with the token it came from (by expiry or revocation, and so does a
//! session made from that session), and a signed ECS call is charged to its key's rate limit
//! only once its signature holds.

mod common;

use common::*;
use mpsfleet_types::access::{CreateToken, Role};
use serde_json::{json, Value};
use std::time::Duration;

/// `GET /v1/pools` with a bearer token: the status.
async fn rest_status(server: &Server, token: &str) -> u16 {
    let resp = server.http().get(format!("{}/v1/pools", server.url)).bearer_auth(token).send().await.unwrap();
    resp.status().as_u16()
}

#[tokio::test(flavor = "multi_thread")]
async fn the_conformance_key_lives_only_while_the_flag_is_on_and_only_on_loopback() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("server");
    let key = ("FOOBARKEY", "FOOBARSECRET");
    let mut server = Server::start_with(&data, "127.0.0.1:0", &["--insecure-http", "--ecs-conformance"]);
    let (status, body) = ecs_call(&server.http(), &server.url, key, "ListClusters", json!({})).await;
    assert_eq!(status, 200, "the suite's key works while the flag is on: {body}");
    assert_eq!(rest_status(&server, key.1).await, 200);
    let listed = server.admin().list_tokens().await.unwrap();
    assert!(
        listed.iter().all(|t| t.access_key_id.as_deref() != Some(key.0)),
        "never a stored token: {listed:?}"
    );

    // Started again without the flag, on the same data dir: the key is nothing.
    let addr = server.addr();
    server.kill9();
    let server = Server::start_with(&data, &addr, &["--insecure-http"]);
    assert_eq!(rest_status(&server, key.1).await, 401);
    let (status, body) = ecs_call(&server.http(), &server.url, key, "ListClusters", json!({})).await;
    assert_eq!((status, body["__type"].as_str()), (400, Some("UnrecognizedClientException")), "{body}");
    let reset = server.http().post(format!("{}/moto-api/reset", server.url)).send().await.unwrap();
    assert_ne!(reset.status().as_u16(), 200, "no reset without the flag");
    drop(server);

    // The flag on an address other machines reach is refused, saying why.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_mpsfleet"))
        .args(["server", "--listen", "0.0.0.0:0", "--ecs-conformance", "--data-dir"])
        .arg(dir.path().join("open"))
        .env("MPSFLEET_LOG", "warn")
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "started with a public admin key on 0.0.0.0");
    assert!(said.contains("--ecs-conformance") && said.contains("loopback"), "{said}");
}

/// A one-time link asked with `token`, traded for a console session token.
async fn session_from(server: &Server, token: &str) -> Result<String, u16> {
    let http = server.http();
    let link = http.post(format!("{}/v1/console/links", server.url)).bearer_auth(token).send().await.unwrap();
    if link.status().as_u16() != 201 {
        return Err(link.status().as_u16());
    }
    let link: Value = link.json().await.unwrap();
    let session = http
        .post(format!("{}/v1/console/session", server.url))
        .header("x-mpsfleet-console-code", link["code"].as_str().unwrap())
        .send()
        .await
        .unwrap();
    if session.status().as_u16() != 200 {
        return Err(session.status().as_u16());
    }
    let session: Value = session.json().await.unwrap();
    Ok(session["token"].as_str().unwrap().to_string())
}

async fn token(server: &Server, role: Role, expires_in_s: Option<u64>, aws: bool) -> (String, String) {
    let req = CreateToken { role, expires_in_s, description: "credentials test".into(), pool: None, aws };
    let t = server.admin().create_token(&req).await.unwrap();
    (t.view.id, t.token)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_console_session_dies_with_the_token_it_came_from() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("server"));

    // From a 4-second viewer token: a session, and a session made from that session.
    let (short_id, short) = token(&server, Role::Viewer, Some(4), false).await;
    let s1 = session_from(&server, &short).await.unwrap();
    let s2 = session_from(&server, &s1).await.unwrap();
    assert_eq!(rest_status(&server, &s2).await, 200);
    // `token list` shows them under their origin.
    let listed = server.admin().list_tokens().await.unwrap();
    let at = listed.iter().position(|t| t.id == short_id).unwrap();
    assert_eq!(listed[at + 1].parent.as_deref(), Some(short_id.as_str()), "{listed:?}");
    assert_eq!(listed[at + 2].parent.as_deref(), Some(listed[at + 1].id.as_str()), "{listed:?}");
    let expiry = listed[at].expires_at_ms;
    assert!(listed[at + 1..=at + 2].iter().all(|t| t.expires_at_ms == expiry), "{listed:?}");
    tokio::time::sleep(Duration::from_millis(4500)).await;
    for (what, t) in [("the token", &short), ("its session", &s1), ("the session's session", &s2)] {
        assert_eq!(rest_status(&server, t).await, 401, "{what} works after the token expired");
    }
    assert!(session_from(&server, &s1).await.is_err(), "an expired session minted a link");

    // From a token that is then revoked: both sessions are refused at once.
    let (long_id, long) = token(&server, Role::Operator, None, false).await;
    let s1 = session_from(&server, &long).await.unwrap();
    let s2 = session_from(&server, &s1).await.unwrap();
    server.admin().revoke_token(&long_id).await.unwrap();
    for t in [&s1, &s2] {
        assert_eq!(rest_status(&server, t).await, 401);
    }
    let left = server.admin().list_tokens().await.unwrap();
    assert!(left.iter().all(|t| t.parent.as_deref() != Some(long_id.as_str())), "{left:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn signed_calls_with_a_wrong_secret_do_not_spend_the_keys_limit() {
    let dir = tempfile::tempdir().unwrap();
    // Three calls at once for the key; unsigned or badly signed ones are limited per address.
    let server = Server::start_with(
        &dir.path().join("server"),
        "127.0.0.1:0",
        &[
            "--http-rate-admin",
            "1",
            "--http-burst-admin",
            "3",
            "--http-rate-unknown",
            "1",
            "--http-burst-unknown",
            "5",
        ],
    );
    let (_, secret) = token(&server, Role::Viewer, None, true).await;
    let key_id = server
        .admin()
        .list_tokens()
        .await
        .unwrap()
        .into_iter()
        .find_map(|t| t.access_key_id)
        .expect("an access key");
    let http = server.http();
    let mut refused = Vec::new();
    for _ in 0..8 {
        let (status, body) =
            ecs_call(&http, &server.url, (&key_id, "not-the-secret"), "ListClusters", json!({})).await;
        refused.push((status, body["__type"].as_str().unwrap_or("").to_string()));
    }
    // Five signature refusals, then the address's bucket is empty.
    assert!(refused[..5].iter().all(|(s, t)| *s == 400 && t == "InvalidSignatureException"), "{refused:?}");
    assert!(refused[5..].iter().all(|(_, t)| t == "ThrottlingException"), "{refused:?}");
    // The key's own limit is untouched: its burst of three still passes.
    for i in 0..3 {
        let (status, body) =
            ecs_call(&http, &server.url, (&key_id, &secret), "ListClusters", json!({})).await;
        assert_eq!(status, 200, "call {i} with the right secret: {body}");
    }
    let (status, body) = ecs_call(&http, &server.url, (&key_id, &secret), "ListClusters", json!({})).await;
    assert_eq!(
        (status, body["__type"].as_str()),
        (400, Some("ThrottlingException")),
        "the key's limit holds"
    );
}
