//! Join tokens expire and rotate, and host credentials are revoked, against the real server
//! and CLI. The first start's join token expires a day after it was made; `join-token create`
//! makes more, each shown once with the CA hash after it; an expired or revoked one registers
//! nothing, and says why.

mod common;

use common::*;
use mpsfleet_types::access::{CreatedJoinToken, JoinTokenView, DEFAULT_JOIN_TOKEN_LIFETIME_S};
use std::process::Command;
use std::time::Duration;

fn cli(server: &Server, args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_mpsfleet"))
        .args(args)
        .args(["-o", "json", "--server", &server.url, "--token", &server.admin_token()])
        .args(["--ca-file", &server.ca_file()])
        .output()
        .expect("run the CLI")
}

fn json<T: serde::de::DeserializeOwned>(out: std::process::Output) -> T {
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn join_tokens_expire_and_rotate() {
    within(async {
        let dir = tempfile::tempdir().unwrap();
        let server = Server::start(dir.path());
        create_pool(&server.admin(), "gpu").await;
        let ca_hash = mpsfleet_client::tls::split_pin(&server.join_token()).1.unwrap();

        // The first start's token expires a day after it was made.
        let listed: Vec<JoinTokenView> = json(cli(&server, &["join-token", "list"]));
        assert_eq!(listed.len(), 1, "{listed:?}");
        let first = &listed[0];
        assert_eq!(first.expires_at_ms - first.created_at_ms, DEFAULT_JOIN_TOKEN_LIFETIME_S * 1000);
        assert_eq!(first.created_by, "first start");

        // A short-lived one works, then stops, saying how to get another.
        let short: CreatedJoinToken =
            json(cli(&server, &["join-token", "create", "--expires-in", "2s", "--description", "rack 7"]));
        assert!(short.token.ends_with(&ca_hash.replace("sha256:", ".sha256:")), "{}", short.token);
        let joiner = server.client(Some(short.token.clone()));
        joiner
            .register_host(&registration("gpu", "early", "early", 1))
            .await
            .expect("a fresh token registers");
        tokio::time::sleep(Duration::from_millis(2500)).await;
        let e = joiner.register_host(&registration("gpu", "late", "late", 1)).await.unwrap_err();
        assert_eq!(e.code(), Some("Unauthorized"), "{e}");
        assert!(e.to_string().contains("expired") && e.to_string().contains("join-token create"), "{e}");

        // Rotation: a new one handed out, the old one revoked; the hosts it registered stay.
        let next: CreatedJoinToken = json(cli(&server, &["join-token", "create"]));
        let revoked: JoinTokenView = json(cli(&server, &["join-token", "revoke", &first.id]));
        assert_eq!(revoked.id, first.id);
        let old = server.client(Some(server.join_token()));
        let e = old.register_host(&registration("gpu", "old", "old", 1)).await.unwrap_err();
        assert_eq!(e.code(), Some("Unauthorized"), "{e}");
        let fresh = server.client(Some(next.token.clone()));
        fresh.register_host(&registration("gpu", "new", "new", 1)).await.expect("the new token registers");
        let hosts = server.admin().list_hosts(Some("gpu")).await.unwrap();
        let names: Vec<&str> = hosts.iter().map(|h| h.hostname.as_str()).collect();
        assert!(names.contains(&"early") && names.contains(&"new"), "{names:?}");

        // Listed without their values; every change is in the audit log.
        let listed = String::from_utf8(cli(&server, &["join-token", "list"]).stdout).unwrap();
        assert!(!listed.contains(&next.token) && !listed.contains("mpsf_join_"), "{listed}");
        let audit = server.admin().audit(100).await.unwrap();
        for action in ["POST /v1/join-tokens", "DELETE /v1/join-tokens/{id}"] {
            assert!(audit.iter().any(|e| e.action == action && e.result == "ok"), "{action}: {audit:#?}");
        }
    })
    .await;
}

/// `host revoke-credential`: the credential is refused at once, after a restart too; the host
/// shows when, and the revocation is in the audit log. Only an admin may revoke.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_host_credential_is_refused_at_once_and_after_a_restart() {
    within(async {
        let dir = tempfile::tempdir().unwrap();
        let mut server = Server::start(dir.path());
        create_pool(&server.admin(), "gpu").await;
        let joiner = server.client(Some(server.join_token()));
        let reg = joiner.register_host(&registration("gpu", "leaky", "leaky", 1)).await.unwrap();
        let host = server.client(Some(reg.credential.clone()));
        host.report_host_status(&Default::default()).await.expect("the credential works");

        let operator = server
            .admin()
            .create_token(&mpsfleet_types::access::CreateToken {
                role: mpsfleet_types::access::Role::Operator,
                expires_in_s: None,
                description: "ops".into(),
                pool: None,
                aws: false,
            })
            .await
            .unwrap()
            .token;
        let e = server.client(Some(operator)).revoke_host_credential(reg.host_id.as_str()).await.unwrap_err();
        assert_eq!(e.code(), Some("Forbidden"), "{e}");

        let view: mpsfleet_types::HostView =
            json(cli(&server, &["host", "revoke-credential", reg.host_id.as_str()]));
        assert!(view.credential_revoked_at_ms.is_some(), "{view:?}");
        let e = host.report_host_status(&Default::default()).await.unwrap_err();
        assert_eq!(e.code(), Some("Unauthorized"), "{e}");
        let again = cli(&server, &["host", "revoke-credential", reg.host_id.as_str()]);
        assert!(
            !again.status.success() && String::from_utf8_lossy(&again.stderr).contains("already revoked")
        );

        let listen = server.addr();
        server.kill9();
        let server = Server::start_on(dir.path(), &listen);
        let host = server.client(Some(reg.credential.clone()));
        let e = host.report_host_status(&Default::default()).await.unwrap_err();
        assert_eq!(e.code(), Some("Unauthorized"), "refused after a restart too: {e}");
        let audit = server.admin().audit(100).await.unwrap();
        assert!(audit
            .iter()
            .any(|e| e.action == "POST /v1/hosts/{id}/revoke-credential" && e.result == "ok"));
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bootstrap_admin_token_rotates_and_the_old_one_is_refused_at_once() {
    within(async {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("server");
        let mut server = Server::start(&data);
        let old = server.admin_token();
        let old_client = server.admin();
        old_client.healthz().await.unwrap();
        create_pool(&old_client, "gpu").await;

        let rotated: mpsfleet_types::access::RotatedAdminToken =
            json(cli(&server, &["token", "rotate-admin"]));
        assert!(rotated.token.starts_with("mpsf_adm_") && rotated.token != old);
        // The server's admin.token holds the new one (and no staged copy is left).
        assert_eq!(server.admin_token(), rotated.token);
        assert!(!data.join("admin.token.new").exists());
        let e = old_client.list_pools().await.unwrap_err();
        assert_eq!(e.code(), Some("Unauthorized"), "{e}");
        let new_client = server.client(Some(rotated.token.clone()));
        assert_eq!(new_client.list_pools().await.unwrap().len(), 1);
        let audit = new_client.audit(10).await.unwrap();
        assert!(
            audit.iter().any(|a| a.action == "POST /v1/admin-token/rotate" && a.result == "ok"),
            "{audit:#?}"
        );

        // It stays rotated across a restart. A crash after the commit, before the rename,
        // leaves the new token in admin.token.new and the old one in admin.token: the next
        // start finishes the rotation. A staged token never committed is removed.
        let listen = server.addr();
        server.kill9();
        std::fs::rename(data.join("admin.token"), data.join("admin.token.new")).unwrap();
        std::fs::write(data.join("admin.token"), format!("{old}\n")).unwrap();
        let mut server = Server::start_on(&data, &listen);
        assert_eq!(server.admin_token(), rotated.token);
        assert!(!data.join("admin.token.new").exists());
        server.kill9();
        std::fs::write(data.join("admin.token.new"), "mpsf_adm_never_committed\n").unwrap();
        let server = Server::start_on(&data, &listen);
        assert!(!data.join("admin.token.new").exists());
        assert_eq!(server.admin_token(), rotated.token);
        assert_eq!(server.admin().list_pools().await.unwrap().len(), 1);
        let e = server.client(Some(old)).list_pools().await.unwrap_err();
        assert_eq!(e.code(), Some("Unauthorized"), "{e}");
    })
    .await
}
