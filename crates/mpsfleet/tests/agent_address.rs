//! Process tests of where the server reaches an agent: at the address its heartbeats come from
//! and the port of the `logsUrl` it reports, never at a host it names; an agent's redirect is
//! not followed; an answer past the limit is not read to its end.
//!
//! The agents here are fakes: a host registered through the API reports a task RUNNING, and
//! plain TCP listeners answer the server's `GET /v1/logs/{task}` the way each test needs.

mod common;

use common::*;
use mpsfleet_client::{Client, ClientError};
use mpsfleet_types::api::HostStatusReport;
use mpsfleet_types::logs::{LogStreams, LogsSource};
use mpsfleet_types::*;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// How a fake agent answers.
#[derive(Clone)]
enum Answer {
    /// 200 with this text.
    Text(&'static str),
    /// 302 to this URL.
    Redirect(String),
    /// 200 with no length, as much as `bytes` (until the server stops reading).
    Endless { bytes: u64 },
}

/// A fake agent's listener: the requests it got, and the bytes of body it wrote.
struct Fake {
    port: u16,
    hits: Arc<AtomicUsize>,
    written: Arc<AtomicU64>,
    /// The hash of the certificate it serves (none over plain HTTP).
    cert: Option<String>,
}

/// A fake agent over plain HTTP, as agents before HTTPS endpoints were.
async fn listen_plain(addr: &str, answer: Answer) -> Fake {
    let listener = TcpListener::bind(addr).await.unwrap_or_else(|e| panic!("bind {addr}: {e}"));
    let port = listener.local_addr().unwrap().port();
    let hits = Arc::new(AtomicUsize::new(0));
    let written = Arc::new(AtomicU64::new(0));
    let (h, w) = (hits.clone(), written.clone());
    tokio::spawn(async move {
        while let Ok((conn, _)) = listener.accept().await {
            tokio::spawn(serve_one(conn, h.clone(), w.clone(), answer.clone()));
        }
    });
    Fake { port, hits, written, cert: None }
}

/// A fake agent's HTTPS listener at `addr`, with a certificate of its own as the real agent's
/// endpoint has.
async fn listen(addr: &str, answer: Answer) -> Fake {
    use axum::serve::Listener as _;
    let cert = mpsfleet_agent::endpoint::EndpointCert::generate().unwrap();
    let tcp = TcpListener::bind(addr).await.unwrap_or_else(|e| panic!("bind {addr}: {e}"));
    let port = tcp.local_addr().unwrap().port();
    let mut tls = mpsfleet_agent::endpoint::TlsListener::new(tcp, &cert).unwrap();
    let hits = Arc::new(AtomicUsize::new(0));
    let written = Arc::new(AtomicU64::new(0));
    let (h, w) = (hits.clone(), written.clone());
    tokio::spawn(async move {
        loop {
            let (conn, _) = tls.accept().await;
            tokio::spawn(serve_one(conn, h.clone(), w.clone(), answer.clone()));
        }
    });
    Fake { port, hits, written, cert: Some(cert.sha256) }
}

/// Reads one request's head from `conn` and answers it as `answer` says.
async fn serve_one<S>(mut conn: S, h: Arc<AtomicUsize>, w: Arc<AtomicU64>, answer: Answer)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let mut head = Vec::new();
    let mut buf = [0u8; 4096];
    while !head.windows(4).any(|x| x == b"\r\n\r\n") {
        match conn.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
    }
    h.fetch_add(1, Ordering::SeqCst);
    match answer {
        Answer::Text(t) => {
            let r = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{t}",
                t.len()
            );
            let _ = conn.write_all(r.as_bytes()).await;
        }
        Answer::Redirect(to) => {
            let r = format!(
                "HTTP/1.1 302 Found\r\nlocation: {to}\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
            );
            let _ = conn.write_all(r.as_bytes()).await;
        }
        Answer::Endless { bytes } => {
            let r = "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\nconnection: close\r\n\r\n";
            if conn.write_all(r.as_bytes()).await.is_err() {
                return;
            }
            let chunk = vec![b'x'; 64 << 10];
            while w.load(Ordering::SeqCst) < bytes {
                if conn.write_all(&chunk).await.is_err() {
                    return;
                }
                w.fetch_add(chunk.len() as u64, Ordering::SeqCst);
            }
        }
    }
    let _ = conn.shutdown().await;
}

/// A server with pool "gpu", one fake host and one task it reports RUNNING (with no output
/// snapshot); the host's client and the task's id.
async fn one_running_task(server: &Server) -> (Client, String) {
    let admin = server.admin();
    create_pool(&admin, "gpu").await;
    admin.register_taskdef(mps_taskdef("infer", 1000)).await.unwrap();
    let (_host, agent) = add_host(server, "gpu", "a", 1).await;
    let out = admin
        .run_task(&RunTask {
            task_definition: "infer".into(),
            count: 1,
            pool: "gpu".into(),
            client_token: None,
            ..Default::default()
        })
        .await
        .unwrap();
    let task = &out.tasks[0];
    let running = TaskStateReport {
        last_status: TaskStatus::Running,
        health_status: None,
        ready: None,
        stop_code: None,
        stopped_reason: None,
        output: None,
        containers: None,
        pull: None,
    };
    agent.report_task(&task.id, &running).await.unwrap();
    (agent, task.id.to_string())
}

async fn report_logs_url(agent: &Client, url: &str) -> Result<(), ClientError> {
    report_endpoint(agent, url, None).await
}

async fn report_endpoint(agent: &Client, url: &str, cert: Option<&str>) -> Result<(), ClientError> {
    agent
        .report_host_status(&HostStatusReport {
            onboarded: true,
            checks: Vec::new(),
            logs_url: Some(url.to_string()),
            logs_cert_sha256: cert.map(str::to_string),
            ..HostStatusReport::default()
        })
        .await
        .map(|_| ())
}

fn code_of(e: &ClientError) -> (u16, String, Option<String>) {
    match e {
        ClientError::Api { status, body } => (*status, body.code.clone(), body.field.clone()),
        other => panic!("expected an API error, got {other}"),
    }
}

fn vm_rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).expect("VmRSS");
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logs_are_fetched_from_the_heartbeat_address_at_the_reported_port_only() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let admin = server.admin();
    let (agent, task) = one_running_task(&server).await;
    // The real one listens where the heartbeats come from (127.0.0.1); the victim on another
    // address at the same port, and another on the same address at another port.
    let peer = listen("127.0.0.1:0", Answer::Text("from-the-peer\n")).await;
    let victim = listen(&format!("127.0.0.2:{}", peer.port), Answer::Text("from-the-victim\n")).await;
    let other_port = listen("127.0.0.2:0", Answer::Text("from-the-victim\n")).await;

    report_endpoint(&agent, &format!("https://127.0.0.2:{}", peer.port), peer.cert.as_deref()).await.unwrap();
    let logs = admin.task_logs(&task, None, LogStreams::Stdout, 4096, None).await.unwrap();
    assert_eq!(logs.source, LogsSource::Agent, "{logs:?}");
    assert_eq!(logs.output(), "from-the-peer\n");
    assert_eq!(peer.hits.load(Ordering::SeqCst), 1);
    assert_eq!(victim.hits.load(Ordering::SeqCst), 0, "the server called the host the agent named");
    let hosts = admin.list_hosts(None).await.unwrap();
    assert_eq!(hosts[0].logs_url.as_deref(), Some(format!("https://127.0.0.1:{}", peer.port).as_str()));

    // A metadata address is no different: only its port counts.
    report_endpoint(&agent, &format!("https://169.254.169.254:{}", peer.port), peer.cert.as_deref())
        .await
        .unwrap();
    let logs = admin.task_logs(&task, None, LogStreams::Stdout, 4096, None).await.unwrap();
    assert_eq!(logs.output(), "from-the-peer\n");
    assert_eq!(peer.hits.load(Ordering::SeqCst), 2);

    // A URL that is not https://HOST:PORT (or http://) is refused and the last good address
    // stays.
    for bad in [
        "ftp://127.0.0.1:443",
        "http://127.0.0.1",
        "http://127.0.0.1:0",
        "http://127.0.0.1:65536",
        "http://127.0.0.1:80/v1",
        "http://user@127.0.0.1:80",
        "http://::1:80",
        "127.0.0.1:80",
    ] {
        let e = report_logs_url(&agent, bad).await.unwrap_err();
        assert_eq!(
            code_of(&e),
            (400, "InvalidParameter".to_string(), Some("logsUrl".to_string())),
            "{bad}: {e}"
        );
    }
    report_endpoint(&agent, &format!("https://[::1]:{}", peer.port), peer.cert.as_deref()).await.unwrap();
    let logs = admin.task_logs(&task, None, LogStreams::Stdout, 4096, None).await.unwrap();
    assert_eq!(logs.output(), "from-the-peer\n");
    assert_eq!(peer.hits.load(Ordering::SeqCst), 3);
    assert_eq!(victim.hits.load(Ordering::SeqCst) + other_port.hits.load(Ordering::SeqCst), 0);

    // An agent that serves plain HTTP (one older than HTTPS endpoints) keeps heartbeating, but
    // an HTTPS server sends it no token: the agent token would cross the network in the clear.
    let plain = listen_plain("127.0.0.1:0", Answer::Text("in-the-clear\n")).await;
    report_logs_url(&agent, &format!("http://127.0.0.1:{}", plain.port)).await.unwrap();
    let e = admin.task_logs(&task, None, LogStreams::Stdout, 4096, None).await.unwrap_err();
    assert_eq!(code_of(&e).0, 502, "{e}");
    assert!(e.to_string().contains("plain HTTP"), "{e}");
    assert_eq!(plain.hits.load(Ordering::SeqCst), 0, "a request went out in the clear");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_https_endpoint_is_trusted_by_the_certificate_its_agent_reported_and_no_other() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let admin = server.admin();
    let (agent, task) = one_running_task(&server).await;
    let endpoint = listen("127.0.0.1:0", Answer::Text("over-tls\n")).await;
    let hash = endpoint.cert.clone().unwrap();
    let url = format!("https://127.0.0.1:{}", endpoint.port);

    report_endpoint(&agent, &url, Some(&hash)).await.unwrap();
    let logs = admin.task_logs(&task, None, LogStreams::Stdout, 4096, None).await.unwrap();
    assert_eq!((logs.source, logs.output()), (LogsSource::Agent, "over-tls\n".to_string()));
    let hosts = admin.list_hosts(None).await.unwrap();
    assert_eq!(hosts[0].logs_cert_sha256.as_deref(), Some(hash.as_str()));
    assert_eq!(endpoint.hits.load(Ordering::SeqCst), 1);

    // Another certificate at the same address (an impostor on the agent's port): the
    // handshake fails, and no request (with the agent's token) is sent.
    let other = mpsfleet_agent::endpoint::EndpointCert::generate().unwrap().sha256;
    report_endpoint(&agent, &url, Some(&other)).await.unwrap();
    let e = admin.task_logs(&task, None, LogStreams::Stdout, 4096, None).await.unwrap_err();
    let (status, code, _) = code_of(&e);
    assert_eq!((status, code.as_str()), (502, "Unavailable"), "{e}");
    assert!(e.to_string().contains("certificate"), "{e}");
    assert_eq!(endpoint.hits.load(Ordering::SeqCst), 1, "a request went to a certificate not reported");

    // An https:// endpoint without its certificate's hash, or a hash that is not one, is
    // refused; a hash goes with https:// only.
    for (url, cert) in [
        (url.as_str(), None),
        (url.as_str(), Some("sha256:abc")),
        (url.as_str(), Some(hash.trim_start_matches("sha256:"))),
        ("http://127.0.0.1:80", Some(hash.as_str())),
    ] {
        let e = report_endpoint(&agent, url, cert).await.unwrap_err();
        assert_eq!(
            code_of(&e),
            (400, "InvalidParameter".to_string(), Some("logsCertSha256".to_string())),
            "{url} {cert:?}: {e}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_redirect_is_not_followed() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let admin = server.admin();
    let (agent, task) = one_running_task(&server).await;
    let victim = listen("127.0.0.1:0", Answer::Text("secret\n")).await;
    let redirecting = listen(
        "127.0.0.1:0",
        Answer::Redirect(format!("http://127.0.0.1:{}/latest/meta-data/", victim.port)),
    )
    .await;
    report_endpoint(&agent, &format!("https://0.0.0.0:{}", redirecting.port), redirecting.cert.as_deref())
        .await
        .unwrap();

    let e = admin.task_logs(&task, None, LogStreams::Stdout, 4096, None).await.unwrap_err();
    let (status, code, _) = code_of(&e);
    assert_eq!((status, code.as_str()), (502, "Unavailable"), "{e}");
    assert!(e.to_string().contains("redirect"), "{e}");
    assert!(!e.to_string().contains("secret"), "{e}");
    assert_eq!(redirecting.hits.load(Ordering::SeqCst), 1);
    assert_eq!(victim.hits.load(Ordering::SeqCst), 0, "the redirect was followed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_past_the_limit_is_not_read_to_its_end() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let admin = server.admin();
    let (agent, task) = one_running_task(&server).await;
    const OFFERED: u64 = 1536 << 20;
    let endless = listen("127.0.0.1:0", Answer::Endless { bytes: OFFERED }).await;
    report_endpoint(&agent, &format!("https://127.0.0.1:{}", endless.port), endless.cert.as_deref())
        .await
        .unwrap();
    let pid = server.child.id();
    let before = vm_rss_kib(pid);

    // The most `tail` there is: the limit is at its highest.
    let tail = mpsfleet_server::api::MAX_LOG_TAIL;
    let limit = mpsfleet_server::api::agent_answer_limit(false, tail);
    let e = admin.task_logs(&task, None, LogStreams::Stdout, tail, None).await.unwrap_err();
    let (status, code, _) = code_of(&e);
    assert_eq!((status, code.as_str()), (502, "Unavailable"), "{e}");
    assert!(e.to_string().contains(&format!("more than {limit} bytes")), "{e}");
    assert_eq!(endless.hits.load(Ordering::SeqCst), 1);
    // The server stopped reading: the writer is blocked or broken well before its end.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let written = endless.written.load(Ordering::SeqCst);
    assert!(written < 4 * limit, "the server read {written} bytes of an answer limited to {limit}");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(endless.written.load(Ordering::SeqCst), written, "the server is still reading");

    let after = vm_rss_kib(pid);
    let margin_kib = 48 << 10; // the limit, 16 MiB, and the allocator's slack
    assert!(after < before + margin_kib, "the server's RSS grew from {before} KiB to {after} KiB");
}
