//! TLS with trust pinned at join, against the real server and agent binaries: a new agent
//! joins over HTTPS with only the join token (the CA hash inside) and refuses a server of
//! another cluster; clients trust the cluster CA and nothing else; after the server's
//! certificate is rotated, live and by a restart, agents and the CLI keep working; plain HTTP
//! is only served on loopback, when asked for.

mod common;

use common::*;
use mpsfleet_client::tls::{split_pin, Trust};
use mpsfleet_client::Client;
use mpsfleet_types::HostStatus;
use std::process::{Command, Stdio};
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(30);

fn agent_command(url: &str, join_token: &str, data_dir: &std::path::Path) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_mpsfleet"));
    cmd.arg("agent")
        .args(["--server", url, "--pool", "gpu", "--mps-model", "--heartbeat-ms", "200"])
        .args(["--emulate-gpus", &format!("H200:{H200_MIB}:1"), "--stop-tasks-on-exit"])
        .arg("--data-dir")
        .arg(data_dir)
        .env("MPSFLEET_JOIN_TOKEN", join_token)
        .env("MPSFLEET_LOG", "warn");
    cmd
}

/// The DER certificate the server at `url` presents to a new connection, as `sha256:<hex>`.
async fn served_certificate(server: &Server) -> String {
    let http = reqwest::Client::builder()
        .use_rustls_tls()
        .tls_built_in_root_certs(false)
        .add_root_certificate(
            reqwest::Certificate::from_pem(&std::fs::read(server.ca_file()).unwrap()).unwrap(),
        )
        .tls_info(true)
        .pool_max_idle_per_host(0)
        .build()
        .unwrap();
    let resp = http.get(format!("{}/v1/healthz", server.url)).send().await.expect("healthz over TLS");
    let info = resp.extensions().get::<reqwest::tls::TlsInfo>().expect("TLS info");
    mpsfleet_client::tls::der_hash(info.peer_certificate().expect("a peer certificate"))
}

async fn last_heartbeat(admin: &Client) -> u64 {
    let hosts = admin.list_hosts(Some("gpu")).await.unwrap();
    hosts[0].last_heartbeat_ms.unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_trusts_the_ca_its_join_token_names_and_refuses_another_cluster() {
    within(async {
        let dir = tempfile::tempdir().unwrap();
        let ours = Server::start(&dir.path().join("ours"));
        let theirs = Server::start(&dir.path().join("theirs"));
        for s in [&ours, &theirs] {
            assert!(s.url.starts_with("https://"), "{}", s.url);
            create_pool(&s.admin(), "gpu").await;
        }
        let join = ours.join_token();
        let (_, pin) = split_pin(&join);
        let ca_hash = pin.expect("the join token carries the CA hash");
        let ca = std::fs::read(ours.ca_file()).unwrap();
        assert_eq!(mpsfleet_client::tls::ca_hash(&ca).unwrap(), ca_hash);

        // Our token, their server: refused before anything is sent, and said why.
        let astray = dir.path().join("astray");
        let out = agent_command(&theirs.url, &join, &astray).stdout(Stdio::null()).output().unwrap();
        assert!(!out.status.success(), "an agent joined a server of another cluster");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains("not the") && stderr.contains(&ca_hash), "{stderr}");
        assert!(theirs.admin().list_hosts(None).await.unwrap().is_empty(), "their server got a host");
        assert!(!astray.join("ca.pem").exists() && !astray.join("identity.json").exists());

        // A client that trusts our CA refuses their server, whatever token it holds.
        let wrong =
            Client::with_trust(&theirs.url, Some(theirs.admin_token()), &Trust::Ca(ca.clone())).unwrap();
        let e = wrong.list_pools().await.unwrap_err();
        assert!(matches!(e, mpsfleet_client::ClientError::Transport { .. }), "{e}");
        assert!(e.to_string().to_lowercase().contains("certificate"), "{e}");
        // So does the CLI given our CA file.
        let out = Command::new(env!("CARGO_BIN_EXE_mpsfleet"))
            .args(["host", "list", "--server", &theirs.url, "--token", &theirs.admin_token()])
            .args(["--ca-file", &ours.ca_file()])
            .output()
            .unwrap();
        assert!(!out.status.success());
        // And no client goes to an https:// server without a CA to verify it with.
        let e = Client::new(&ours.url, None).expect_err("refused");
        assert!(e.to_string().contains("--ca-file"), "{e}");

        // Our server: joined with the token alone, and the CA is kept for every later start.
        let data = dir.path().join("agent");
        let mut agent = agent_command(&ours.url, &join, &data).stdout(Stdio::null()).spawn().unwrap();
        let admin = ours.admin();
        eventually(WAIT, "an ACTIVE host", || async {
            let hosts = admin.list_hosts(Some("gpu")).await.ok()?;
            hosts.iter().any(|h| h.status == HostStatus::Active).then_some(())
        })
        .await;
        let kept = std::fs::read(data.join("ca.pem")).expect("the agent keeps the CA");
        assert_eq!(mpsfleet_client::tls::ca_hash(&kept).unwrap(), ca_hash);
        let _ = agent.kill();
        let _ = agent.wait();
        // Restarted without any token, it still trusts that CA (and only it).
        let mut agent =
            agent_command(&ours.url, "", &data).env_remove("MPSFLEET_JOIN_TOKEN").spawn().unwrap();
        let before = last_heartbeat(&admin).await;
        eventually(WAIT, "heartbeats after the restart", || async {
            (last_heartbeat(&admin).await > before + 500).then_some(())
        })
        .await;
        let _ = agent.kill();
        let _ = agent.wait();
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_the_server_certificate_is_rotated_agents_and_the_cli_keep_working() {
    within(async {
        let dir = tempfile::tempdir().unwrap();
        let mut server = Server::start(&dir.path().join("server"));
        let admin = server.admin();
        create_pool(&admin, "gpu").await;
        let _agent = Agent::start_with_model(&server, &dir.path().join("agent"), 1);
        eventually(WAIT, "an ACTIVE host", || async {
            let hosts = admin.list_hosts(Some("gpu")).await.ok()?;
            hosts.iter().any(|h| h.status == HostStatus::Active).then_some(())
        })
        .await;
        // The agent's own endpoint is HTTPS, with the certificate it reported.
        let host = admin.list_hosts(Some("gpu")).await.unwrap().remove(0);
        let logs_url = host.logs_url.clone().expect("a logs endpoint");
        assert!(logs_url.starts_with("https://"), "{logs_url}");
        let http = mpsfleet_client::tls::pinned_cert_builder(host.logs_cert_sha256.as_deref().unwrap())
            .unwrap()
            .build()
            .unwrap();
        let unauthenticated = http.get(format!("{logs_url}/v1/logs/t-1")).send().await.expect("pinned TLS");
        assert_eq!(unauthenticated.status(), 401);
        let first = admin.server_certificate().await.unwrap();
        assert_eq!(served_certificate(&server).await, first.sha256);
        assert!(first.names.contains(&"127.0.0.1".to_string()), "{first:?}");
        let ca_hash = split_pin(&server.join_token()).1.unwrap();
        assert_eq!(first.ca_hash, ca_hash);

        // Rotated live, through the CLI: new connections get the new certificate.
        let out = Command::new(env!("CARGO_BIN_EXE_mpsfleet"))
            .args(["cluster", "rotate-certificate", "-o", "json", "--server", &server.url])
            .args(["--token", &server.admin_token(), "--ca-file", &server.ca_file()])
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let rotated: mpsfleet_types::access::ServerCertificate = serde_json::from_slice(&out.stdout).unwrap();
        assert_ne!(rotated.sha256, first.sha256);
        assert_eq!(rotated.ca_hash, ca_hash, "the same CA");
        assert_eq!(served_certificate(&server).await, rotated.sha256);
        let audit = admin.audit(100).await.unwrap();
        assert!(audit.iter().any(|e| e.action == "POST /v1/cluster/certificate/rotate"), "{audit:#?}");
        // The agent keeps heartbeating, and a viewer may look but not rotate.
        let before = last_heartbeat(&admin).await;
        eventually(WAIT, "heartbeats after the rotation", || async {
            (last_heartbeat(&admin).await > before + 500).then_some(())
        })
        .await;
        let viewer_token = admin
            .create_token(&mpsfleet_types::access::CreateToken {
                role: mpsfleet_types::access::Role::Viewer,
                expires_in_s: None,
                description: "look".into(),
            })
            .await
            .unwrap()
            .token;
        let viewer = server.client(Some(viewer_token));
        assert_eq!(viewer.server_certificate().await.unwrap(), rotated);
        assert_eq!(viewer.rotate_certificate().await.unwrap_err().code(), Some("Forbidden"));

        // A restart issues another one under the same CA: the agent and the CLI go on.
        let listen = server.addr();
        server.kill9();
        let server = Server::start_on(&dir.path().join("server"), &listen);
        let admin = server.admin();
        let restarted = admin.server_certificate().await.unwrap();
        assert!(restarted.sha256 != rotated.sha256 && restarted.ca_hash == ca_hash, "{restarted:?}");
        let before = last_heartbeat(&admin).await;
        eventually(Duration::from_secs(60), "heartbeats after the restart", || async {
            let hosts = admin.list_hosts(Some("gpu")).await.ok()?;
            (hosts[0].last_heartbeat_ms.unwrap_or(0) > before + 500 && hosts[0].status == HostStatus::Active)
                .then_some(())
        })
        .await;
        let out = Command::new(env!("CARGO_BIN_EXE_mpsfleet"))
            .args(["host", "list", "--server", &server.url, "--token", &server.admin_token()])
            .args(["--ca-file", &server.ca_file()])
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_http_only_on_loopback_and_only_when_asked() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_mpsfleet"))
        .args(["server", "--listen", "0.0.0.0:0", "--insecure-http", "--data-dir"])
        .arg(dir.path().join("open"))
        .output()
        .unwrap();
    assert!(!out.status.success(), "plain HTTP served on every interface");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--insecure-http") && stderr.contains("loopback"), "{stderr}");

    let server = Server::start_with(&dir.path().join("plain"), "127.0.0.1:0", &["--insecure-http"]);
    assert!(server.url.starts_with("http://"), "{}", server.url);
    let admin = server.admin();
    admin.list_pools().await.expect("plain HTTP on loopback");
    let e = admin.server_certificate().await.unwrap_err();
    assert_eq!(e.code(), Some("Conflict"), "{e}");
}
