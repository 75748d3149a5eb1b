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
                pool: None,
                aws: false,
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

/// `mpsfleet ARGS --server URL --token T --ca-file F -o json`, its stdout parsed; a failure
/// gives its stderr.
fn cli_json<T: serde::de::DeserializeOwned>(
    server: &Server,
    ca_file: &str,
    args: &[&str],
) -> Result<T, String> {
    let out = Command::new(env!("CARGO_BIN_EXE_mpsfleet"))
        .args(args)
        .args(["-o", "json", "--server", &server.url, "--token", &server.admin_token(), "--ca-file", ca_file])
        .output()
        .unwrap();
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    Ok(serde_json::from_slice(&out.stdout).unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ca_rotation_reaches_every_agent_before_the_new_ca_signs() {
    use mpsfleet_types::access::CaRotation;
    within(async {
        let dir = tempfile::tempdir().unwrap();
        let server = Server::start(&dir.path().join("server"));
        let admin = server.admin();
        create_pool(&admin, "gpu").await;
        let agent_dir = dir.path().join("agent");
        let mut agent = Agent::start_with_model(&server, &agent_dir, 1);
        eventually(WAIT, "an ACTIVE host", || async {
            let hosts = admin.list_hosts(Some("gpu")).await.ok()?;
            hosts.iter().any(|h| h.status == HostStatus::Active).then_some(())
        })
        .await;
        // A host that never heartbeats (its machine is off, say) holds the rotation back.
        let (silent, _) = add_host(&server, "gpu", "silent", 1).await;
        let old_ca = std::fs::read_to_string(server.ca_file()).unwrap();
        let old_ca_file = dir.path().join("old-ca.pem");
        std::fs::write(&old_ca_file, &old_ca).unwrap();
        let old_hash = mpsfleet_client::tls::ca_hash(old_ca.as_bytes()).unwrap();

        // Staged, through the CLI: clients trust both, the old CA still signs.
        let staged: CaRotation = cli_json(&server, &server.ca_file(), &["cluster", "ca", "rotate"]).unwrap();
        let next = staged.next.clone().expect("a next CA");
        assert_eq!(staged.active.sha256, old_hash);
        let bundle = mpsfleet_client::tls::ca_hashes(&std::fs::read(server.ca_file()).unwrap()).unwrap();
        assert_eq!(bundle, vec![old_hash.clone(), next.sha256.clone()], "the server's ca.pem holds both");
        assert_eq!(admin.server_certificate().await.unwrap().ca_hash, old_hash);
        // The agent fetches the next CA with its next heartbeat; the silent host does not.
        let rotation = eventually(WAIT, "the agent trusting the next CA", || async {
            let r = admin.ca_rotation().await.ok()?;
            (r.hosts_not_trusting_next == vec![silent.to_string()]).then_some(r)
        })
        .await;
        assert_eq!(rotation.next.as_ref(), Some(&next));
        let kept = std::fs::read(agent_dir.join("ca.pem")).unwrap();
        assert_eq!(mpsfleet_client::tls::ca_hashes(&kept).unwrap(), bundle, "the agent keeps both");
        let held =
            cli_json::<CaRotation>(&server, &server.ca_file(), &["cluster", "ca", "activate"]).unwrap_err();
        assert!(held.contains(silent.as_str()) && held.contains("force"), "{held}");

        // Once the silent host's credential is revoked, nothing holds it back.
        admin.revoke_host_credential(silent.as_str()).await.unwrap();
        let done: CaRotation = cli_json(&server, &server.ca_file(), &["cluster", "ca", "activate"]).unwrap();
        assert_eq!((done.active.sha256.as_str(), done.next.as_ref()), (next.sha256.as_str(), None));
        assert_eq!(served_certificate(&server).await, admin.server_certificate().await.unwrap().sha256);
        assert_eq!(admin.server_certificate().await.unwrap().ca_hash, next.sha256, "issued under the new CA");
        let audit = admin.audit(100).await.unwrap();
        for action in ["POST /v1/cluster/ca/rotation", "POST /v1/cluster/ca/rotation/activate"] {
            assert!(audit.iter().any(|e| e.action == action && e.result == "ok"), "{action}: {audit:#?}");
        }
        // The agent goes on, and drops the old CA; the CLI with the server's ca.pem goes on,
        // with the old CA alone it is refused.
        eventually(WAIT, "the agent trusting the new CA alone", || async {
            let kept = std::fs::read(agent_dir.join("ca.pem")).ok()?;
            (mpsfleet_client::tls::ca_hashes(&kept).ok()? == vec![next.sha256.clone()]).then_some(())
        })
        .await;
        let before = last_heartbeat(&admin).await;
        eventually(WAIT, "heartbeats under the new CA", || async {
            (last_heartbeat(&admin).await > before + 500).then_some(())
        })
        .await;
        let hosts: Vec<mpsfleet_types::HostView> =
            cli_json(&server, &server.ca_file(), &["host", "list"]).unwrap();
        assert_eq!(hosts.len(), 2);
        let refused =
            cli_json::<serde_json::Value>(&server, old_ca_file.to_str().unwrap(), &["host", "list"])
                .unwrap_err();
        assert!(refused.contains("certificate"), "{refused}");

        // Restarted with the join token it joined with (which names the old CA), the agent
        // trusts the CA it kept: it registered already.
        agent.kill9();
        let mut agent = Agent::start_with_model(&server, &agent_dir, 1);
        let before = last_heartbeat(&admin).await;
        eventually(WAIT, "heartbeats after the agent's restart", || async {
            (last_heartbeat(&admin).await > before + 500).then_some(())
        })
        .await;
        agent.kill9();
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_runs_under_an_operators_ca_made_with_openssl() {
    within(async {
        let dir = tempfile::tempdir().unwrap();
        let (cert, key) = (dir.path().join("root.pem"), dir.path().join("root.key"));
        let out = Command::new("openssl")
            .args(["req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"])
            .arg("-keyout")
            .arg(&key)
            .arg("-out")
            .arg(&cert)
            .args(["-days", "3650", "-subj", "/C=DE/O=Example GPU Ops/CN=Example Fleet Root"])
            .args(["-addext", "basicConstraints=critical,CA:TRUE"])
            .args(["-addext", "keyUsage=critical,keyCertSign,cRLSign"])
            .output()
            .expect("openssl (Debian: apt-get install openssl)");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let (cert_s, key_s) = (cert.to_str().unwrap(), key.to_str().unwrap());
        let data = dir.path().join("server");
        let server = Server::start_with(&data, "127.0.0.1:0", &["--ca-cert", cert_s, "--ca-key", key_s]);
        let root_hash = mpsfleet_client::tls::ca_hash(&std::fs::read(&cert).unwrap()).unwrap();
        assert_eq!(split_pin(&server.join_token()).1.as_deref(), Some(root_hash.as_str()));
        // The operator's own file verifies the server, and an agent joins with the join token.
        let admin = Client::with_trust(
            &server.url,
            Some(server.admin_token()),
            &Trust::Ca(std::fs::read(&cert).unwrap()),
        )
        .unwrap();
        create_pool(&admin, "gpu").await;
        let rotation = admin.ca_rotation().await.unwrap();
        assert!(rotation.active.given && rotation.active.subject == "Example Fleet Root", "{rotation:?}");
        let mut agent = Agent::start_with_model(&server, &dir.path().join("agent"), 1);
        eventually(WAIT, "an ACTIVE host", || async {
            let hosts = admin.list_hosts(Some("gpu")).await.ok()?;
            hosts.iter().any(|h| h.status == HostStatus::Active).then_some(())
        })
        .await;
        agent.kill9();
        drop(server);

        // Started again with another CA, the server refuses: replacing it is a rotation.
        let other = dir.path().join("other.pem");
        let other_key = dir.path().join("other.key");
        let made = Command::new("openssl")
            .args(["req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"])
            .arg("-keyout")
            .arg(&other_key)
            .arg("-out")
            .arg(&other)
            .args([
                "-days",
                "3650",
                "-subj",
                "/CN=Another Root",
                "-addext",
                "basicConstraints=critical,CA:TRUE",
            ])
            .output()
            .unwrap();
        assert!(made.status.success());
        let out = Command::new(env!("CARGO_BIN_EXE_mpsfleet"))
            .args(["server", "--listen", "127.0.0.1:0", "--data-dir"])
            .arg(&data)
            .arg("--ca-cert")
            .arg(&other)
            .arg("--ca-key")
            .arg(&other_key)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("already has its CA") && err.contains("cluster ca rotate"), "{err}");
    })
    .await
}
