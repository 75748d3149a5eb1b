//! Process tests of the event stream (`GET /v1/events`) and the webhook: the real binary, a
//! host that goes silent past its heartbeat grace, and what an operator's pager would see.

mod common;

use common::*;
use mpsfleet_types::*;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A self-managed pool whose hosts are declared bad 1 s after their last heartbeat.
async fn quick_pool(admin: &mpsfleet_client::Client) {
    admin
        .create_pool(&CreatePool {
            name: "gpu".into(),
            mode: Some(OwnershipMode::SelfManaged),
            health_policy: Some(HealthPolicy {
                agent_heartbeat_grace_ms: 1000,
                toleration_ms: 0,
                ..Default::default()
            }),
            ..Default::default()
        })
        .await
        .expect("create pool");
}

/// One server-sent event: its `event:` name and its `data:` as JSON.
type Sse = (String, serde_json::Value);

/// Reads an SSE response, parsing complete events as they arrive.
struct EventReader {
    resp: reqwest::Response,
    buf: String,
}

impl EventReader {
    async fn open(server: &Server, query: &str) -> EventReader {
        let resp = server
            .http()
            .get(format!("{}/v1/events{query}", server.url))
            .bearer_auth(server.admin_token())
            .send()
            .await
            .expect("open the event stream");
        assert_eq!(resp.status(), 200);
        let ctype = resp.headers().get("content-type").and_then(|v| v.to_str().ok()).unwrap_or_default();
        assert!(ctype.starts_with("text/event-stream"), "{ctype}");
        EventReader { resp, buf: String::new() }
    }

    /// The next event (keep-alive comments skipped), or panics after `limit`.
    async fn next(&mut self, limit: Duration) -> Sse {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            if let Some(end) = self.buf.find("\n\n") {
                let block: String = self.buf.drain(..end + 2).collect();
                let (mut name, mut data) = (String::new(), String::new());
                for line in block.lines() {
                    if let Some(v) = line.strip_prefix("event:") {
                        name = v.trim().to_string();
                    } else if let Some(v) = line.strip_prefix("data:") {
                        data.push_str(v.trim_start());
                    }
                }
                if name.is_empty() && data.is_empty() {
                    continue; // a comment
                }
                return (name, serde_json::from_str(&data).expect("event data is JSON"));
            }
            let chunk = tokio::time::timeout_at(deadline, self.resp.chunk())
                .await
                .unwrap_or_else(|_| panic!("no event within {limit:?}; have {:?}", self.buf))
                .expect("read the event stream")
                .expect("the event stream ended");
            self.buf.push_str(&String::from_utf8_lossy(&chunk));
        }
    }

    /// Events until one of type `name` passes `pred`; returns it and those before it.
    async fn until(
        &mut self,
        name: &str,
        limit: Duration,
        pred: impl Fn(&serde_json::Value) -> bool,
    ) -> Vec<Sse> {
        let deadline = tokio::time::Instant::now() + limit;
        let mut seen = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            assert!(!left.is_zero(), "no {name} event within {limit:?}; saw {seen:?}");
            let ev = self.next(left).await;
            let done = ev.0 == name && pred(&ev.1);
            seen.push(ev);
            if done {
                return seen;
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_host_is_announced_on_the_event_stream() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let admin = server.admin();
    quick_pool(&admin).await;

    // Only the admin may listen, and the filter names known types.
    let http = server.http();
    let anon = http.get(format!("{}/v1/events", server.url)).send().await.unwrap();
    assert_eq!(anon.status(), 401);
    let bad = http
        .get(format!("{}/v1/events?types=incident.nope", server.url))
        .bearer_auth(server.admin_token())
        .send()
        .await
        .unwrap();
    assert_eq!(bad.status(), 400);

    let mut all = EventReader::open(&server, "").await;
    let mut incidents = EventReader::open(&server, "?types=incident.opened").await;
    let (host, _agent) = add_host(&server, "gpu", "n1", 1).await;
    let id = host.to_string();
    let about_host = |v: &serde_json::Value| v["host"]["id"] == id.as_str();

    // Onboarding: ONBOARDING -> ACTIVE, INITIALIZING -> OK.
    all.until("host.status", Duration::from_secs(10), |v| about_host(v) && v["host"]["status"] == "ACTIVE")
        .await;

    // The agent goes silent: past the 1 s grace its health turns, and an incident opens.
    let seen = all
        .until("incident.opened", Duration::from_secs(20), |v| v["incident"]["hostId"] == id.as_str())
        .await;
    let health = seen
        .iter()
        .find(|(n, v)| n == "host.health" && about_host(v) && v["host"]["healthStatus"] == "IMPAIRED")
        .unwrap_or_else(|| panic!("no host.health IMPAIRED before the incident: {seen:?}"));
    assert_eq!(health.1["type"], "host.health");
    assert!(health.1["at_ms"].as_u64().unwrap() > 0);
    let (_, opened) = seen.last().unwrap();
    assert_eq!(opened["type"], "incident.opened");
    assert_eq!(opened["incident"]["owner"], "operator");

    // The filtered stream sees the incident and nothing else.
    let (name, only) = incidents.next(Duration::from_secs(10)).await;
    assert_eq!(name, "incident.opened");
    assert_eq!(only["incident"]["id"], opened["incident"]["id"]);
}

/// The bodies a webhook received, with the request's number (from 0), and each request's
/// timestamp and signature headers.
type Received = Arc<Mutex<Vec<(u32, String)>>>;
type Headers = Arc<Mutex<Vec<(String, String)>>>;

/// A tiny HTTP server that records POST bodies; it answers 500 to the first request.
fn hook_server() -> (u16, Received, Headers) {
    hook_server_with(None)
}

/// A receiver of webhook deliveries on 127.0.0.1 (over TLS with `tls`) that refuses the
/// first with 500 and takes the rest.
fn hook_server_with(tls: Option<Arc<rustls::ServerConfig>>) -> (u16, Received, Headers) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let record = seen.clone();
    let signed = Arc::new(Mutex::new(Vec::new()));
    let record_signed = signed.clone();
    std::thread::spawn(move || {
        let mut n = 0u32;
        for stream in listener.incoming() {
            let Ok(tcp) = stream else { continue };
            let _ = tcp.set_read_timeout(Some(Duration::from_secs(5)));
            let mut stream: Box<dyn ReadWrite> = match &tls {
                None => Box::new(tcp),
                Some(config) => {
                    let Ok(conn) = rustls::ServerConnection::new(config.clone()) else { continue };
                    Box::new(rustls::StreamOwned::new(conn, tcp))
                }
            };
            let mut reader = BufReader::new(&mut stream);
            let mut len = 0usize;
            let (mut timestamp, mut signature) = (String::new(), String::new());
            let mut line = String::new();
            let mut headers = false;
            while reader.read_line(&mut line).is_ok_and(|read| read > 0) && line != "\r\n" {
                headers = true;
                let lower = line.to_ascii_lowercase();
                if let Some(v) = lower.strip_prefix("content-length:") {
                    len = v.trim().parse().unwrap_or(0);
                } else if let Some(v) = lower.strip_prefix("x-mpsfleet-timestamp:") {
                    timestamp = v.trim().to_string();
                } else if let Some(v) = lower.strip_prefix("x-mpsfleet-signature:") {
                    signature = v.trim().to_string();
                }
                line.clear();
            }
            if !headers {
                continue; // a connection that never sent a request (a failed handshake)
            }
            record_signed.lock().unwrap().push((timestamp, signature));
            let mut body = vec![0; len];
            let _ = reader.read_exact(&mut body);
            let status = if n == 0 { "500 Internal Server Error" } else { "200 OK" };
            record.lock().unwrap().push((n, String::from_utf8_lossy(&body).into_owned()));
            n += 1;
            drop(reader);
            let _ = write!(stream, "HTTP/1.1 {status}\r\ncontent-length: 0\r\nconnection: close\r\n\r\n");
            let _ = stream.flush();
        }
    });
    (port, seen, signed)
}

trait ReadWrite: std::io::Read + std::io::Write + Send {}
impl<T: std::io::Read + std::io::Write + Send> ReadWrite for T {}

/// What a receiver checks: `v1=` HMAC-SHA256 of `<timestamp>.<body>` under the secret.
fn signature(secret_hex: &str, timestamp: &str, body: &str) -> String {
    use sha2::{Digest, Sha256};
    let key: Vec<u8> =
        (0..64).step_by(2).map(|i| u8::from_str_radix(&secret_hex[i..i + 2], 16).unwrap()).collect();
    let mut block = [0u8; 64];
    block[..32].copy_from_slice(&key);
    let pad = |b: u8| block.map(|x| x ^ b);
    let msg = format!("{timestamp}.{body}");
    let inner = Sha256::new().chain_update(pad(0x36)).chain_update(msg.as_bytes()).finalize();
    let mac = Sha256::new().chain_update(pad(0x5c)).chain_update(inner).finalize();
    format!("v1={}", mac.iter().map(|b| format!("{b:02x}")).collect::<String>())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_webhook_gets_the_incident_after_a_retry() {
    let (port, seen, signed) = hook_server();
    let dir = tempfile::tempdir().unwrap();
    let url = format!("http://127.0.0.1:{port}/hook");
    let server = Server::start_with(dir.path(), "127.0.0.1:0", &["--webhook", &url]);
    let admin = server.admin();
    quick_pool(&admin).await;
    let (host, _agent) = add_host(&server, "gpu", "n1", 1).await;
    let id = host.to_string();

    let bodies = eventually(Duration::from_secs(30), "an incident.opened webhook", || {
        let seen = seen.clone();
        async move {
            let got = seen.lock().unwrap().clone();
            got.iter().any(|(_, b)| b.contains("\"incident.opened\"")).then_some(got)
        }
    })
    .await;
    // Every delivery is signed with the data dir's webhook secret, over its timestamp and body.
    let secret = std::fs::read_to_string(dir.path().join("webhook.secret")).unwrap();
    let secret = secret.trim();
    let headers = signed.lock().unwrap().clone();
    for ((n, body), (timestamp, sig)) in bodies.iter().zip(&headers) {
        assert_eq!(sig, &signature(secret, timestamp, body), "delivery {n} is not signed right");
        let at: u64 = timestamp.parse().unwrap();
        assert!(at > 1_700_000_000, "timestamp {at}");
        assert_ne!(sig, &signature(secret, &(at - 400).to_string(), body), "the timestamp is covered");
    }
    // The first delivery was refused with 500 and sent again.
    assert!(bodies.len() >= 2, "{bodies:?}");
    assert_eq!(bodies[0].1, bodies[1].1, "the refused event is retried as is");
    let events: Vec<serde_json::Value> =
        bodies.iter().map(|(_, b)| serde_json::from_str(b).expect("webhook body is JSON")).collect();
    for e in &events {
        let t = e["type"].as_str().unwrap();
        assert!(t.starts_with("incident.") || t == "host.health", "only incidents and health: {t}");
    }
    let opened = events.iter().find(|e| e["type"] == "incident.opened").unwrap();
    assert_eq!(opened["incident"]["hostId"], id.as_str());
    assert!(
        events.iter().any(|e| e["type"] == "host.health" && e["host"]["id"] == id.as_str()),
        "{events:?}"
    );

    // A bad URL is refused at start.
    let bad = std::process::Command::new(env!("CARGO_BIN_EXE_mpsfleet"))
        .args(["server", "--listen", "127.0.0.1:0", "--webhook", "ftp://example.com/hook", "--data-dir"])
        .arg(dir.path().join("other"))
        .output()
        .unwrap();
    assert!(!bad.status.success());
    assert!(
        String::from_utf8_lossy(&bad.stderr).contains("webhook"),
        "{}",
        String::from_utf8_lossy(&bad.stderr)
    );
}

/// An https:// receiver gets the same signed deliveries, verified against the CA given with
/// `--webhook-ca-file`; one whose certificate the server cannot verify gets none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_https_webhook_is_verified_and_gets_signed_deliveries() {
    // The receiver's certificate, for 127.0.0.1, under a CA of its own.
    let store = mpsfleet_store::MemoryStore::new();
    let key = mpsfleet_server::auth::ServerKey::random().unwrap();
    let ca = mpsfleet_server::tls::ClusterCa::load_or_create(&store, &key, None, 1_750_000_000_000).unwrap();
    let now = mpsfleet_core::clock::Clock::now_ms(&mpsfleet_core::clock::SystemClock);
    let issued = ca.issue_server(&["127.0.0.1".to_string()], now).unwrap();
    let config =
        rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(issued.chain, issued.key.into())
            .unwrap();
    let config = Arc::new(config);
    let dir = tempfile::tempdir().unwrap();
    let ca_file = dir.path().join("hook-ca.pem");
    std::fs::write(&ca_file, ca.cert_pem()).unwrap();

    // Without the receiver's CA, nothing is delivered: its certificate is not trusted.
    let (untrusted_port, untrusted_seen, _) = hook_server_with(Some(config.clone()));
    let url = format!("https://127.0.0.1:{untrusted_port}/hook");
    let server = Server::start_with(&dir.path().join("a"), "127.0.0.1:0", &["--webhook", &url]);
    quick_pool(&server.admin()).await;
    let (_, _agent) = add_host(&server, "gpu", "n1", 1).await;
    // With it, every delivery arrives, signed.
    let (port, seen, signed) = hook_server_with(Some(config));
    let url = format!("https://127.0.0.1:{port}/hook");
    let ca_arg = ca_file.display().to_string();
    let trusted = Server::start_with(
        &dir.path().join("b"),
        "127.0.0.1:0",
        &["--webhook", &url, "--webhook-ca-file", &ca_arg],
    );
    quick_pool(&trusted.admin()).await;
    let (_, _agent2) = add_host(&trusted, "gpu", "n2", 1).await;
    let bodies = eventually(Duration::from_secs(30), "an incident.opened webhook over https", || {
        let seen = seen.clone();
        async move {
            let got = seen.lock().unwrap().clone();
            got.iter().any(|(_, b)| b.contains("\"incident.opened\"")).then_some(got)
        }
    })
    .await;
    let secret = std::fs::read_to_string(dir.path().join("b").join("webhook.secret")).unwrap();
    let headers = signed.lock().unwrap().clone();
    for ((n, body), (timestamp, sig)) in bodies.iter().zip(&headers) {
        assert_eq!(sig, &signature(secret.trim(), timestamp, body), "delivery {n} is not signed right");
    }
    // The first server had its incident too, and tried to deliver it all along.
    let admin = server.admin();
    eventually(Duration::from_secs(30), "the first server's incident", || async {
        admin.list_incidents().await.ok().filter(|i| !i.is_empty()).map(|_| ())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(untrusted_seen.lock().unwrap().is_empty(), "a receiver the server cannot verify got a delivery");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_provider_attempts_show_on_the_incident_as_they_happen() {
    use mpsfleet_types::policy::Provider;
    let dir = tempfile::tempdir().unwrap();
    // A provider that cannot launch anything: every attempt exits 1 with a reason.
    let launch = dir.path().join("launch.sh");
    std::fs::write(&launch, "#!/bin/sh\necho 'no capacity in zone a' >&2\nexit 1\n").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&launch, std::fs::Permissions::from_mode(0o755)).unwrap();
    let cmd = launch.display().to_string();
    let config = exec_provider_config(dir.path(), "no-capacity", &cmd, &cmd, &cmd);
    let config = config.display().to_string();
    let server = Server::start_with(&dir.path().join("server"), "127.0.0.1:0", &["--config", &config]);
    let admin = server.admin();
    admin
        .create_pool(&CreatePool {
            name: "gpu".into(),
            mode: Some(OwnershipMode::Managed),
            health_policy: Some(HealthPolicy {
                agent_heartbeat_grace_ms: 1000,
                toleration_ms: 0,
                ..Default::default()
            }),
            provider: Some(Provider::exec("no-capacity", 1)),
            ..Default::default()
        })
        .await
        .expect("create pool");
    // The host goes silent after onboarding; its incident asks the provider for a replacement.
    let (host, _agent) = add_host(&server, "gpu", "n1", 1).await;
    let retries = eventually(Duration::from_secs(30), "two provider retries on the incident", || async {
        let i = admin.list_incidents().await.ok()?.into_iter().find(|i| i.incident.host_id == host)?;
        let retries: Vec<TimelineEntry> =
            i.incident.timeline.into_iter().filter(|t| t.step == Step::ProviderRetry).collect();
        (retries.len() >= 2).then_some(retries)
    })
    .await;
    assert!(retries[0].detail.contains("attempt 1 failed"), "{retries:?}");
    assert!(retries[0].detail.contains("no capacity in zone a"), "{retries:?}");
    assert!(retries[0].detail.contains("next attempt in 1s"), "{retries:?}");
    assert!(
        retries[1].detail.contains("attempt 2 failed") && retries[1].detail.contains("next attempt in 2s")
    );
    assert!(retries[1].at_ms >= retries[0].at_ms + 900, "the second attempt waited its backoff: {retries:?}");
}
