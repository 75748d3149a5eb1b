//! Process tests of the HTTP layer's limits, over raw TLS connections: a request is
//! authenticated before its body is read, bodies have per-route limits answered with the JSON
//! error, and slow, stalled and idle connections (a stalled TLS handshake too) are closed
//! within their timeouts, at most a capped number open at once.

mod common;

use common::*;
use serde_json::Value;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::{timeout, Instant};

/// A TLS connection to the server, verified against its cluster CA.
type Conn = tokio_rustls::client::TlsStream<TcpStream>;

/// An answer read off a raw connection.
struct Answer {
    status: u16,
    head: String,
    body: Vec<u8>,
}

impl Answer {
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&self.body)))
    }
}

fn addr(server: &Server) -> String {
    server.addr()
}

async fn connect(server: &Server) -> Conn {
    connect_to(&addr(server), &std::fs::read(server.data_dir.join("ca.pem")).expect("ca.pem")).await
}

async fn connect_to(addr: &str, pem: &[u8]) -> Conn {
    let mut roots = rustls::RootCertStore::empty();
    for cert in mpsfleet_client::tls::certificates(pem).expect("the CA") {
        roots.add(cert).expect("the CA");
    }
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let tcp = TcpStream::connect(addr).await.expect("connect to the server");
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
    tokio_rustls::TlsConnector::from(std::sync::Arc::new(config))
        .connect(name, tcp)
        .await
        .expect("a TLS handshake verified against the cluster CA")
}

/// Reads one answer (its head and a Content-Length body).
async fn read_answer(s: &mut Conn) -> Answer {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        let n = s.read(&mut chunk).await.expect("read the answer");
        assert!(n > 0, "the connection closed before an answer: {:?}", String::from_utf8_lossy(&buf));
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_string();
    let status = head.split(' ').nth(1).and_then(|s| s.parse().ok()).expect("a status line");
    let len: usize = head
        .lines()
        .find_map(|l| l.to_ascii_lowercase().strip_prefix("content-length:").map(|v| v.trim().to_string()))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let mut body = buf[head_end..].to_vec();
    while body.len() < len {
        let n = s.read(&mut chunk).await.expect("read the body");
        assert!(n > 0, "the connection closed inside the body");
        body.extend_from_slice(&chunk[..n]);
    }
    Answer { status, head, body }
}

/// Waits up to `limit` for the server to close `s` (EOF or reset); returns how long it took.
async fn closed_within<S: AsyncReadExt + Unpin>(s: &mut S, limit: Duration) -> Option<Duration> {
    let started = Instant::now();
    let mut chunk = [0u8; 4096];
    timeout(limit, async {
        loop {
            match s.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    })
    .await
    .ok()
    .map(|()| started.elapsed())
}

fn post_head(path: &str, token: Option<&str>, length: usize) -> String {
    let auth = token.map(|t| format!("Authorization: Bearer {t}\r\n")).unwrap_or_default();
    format!(
        "POST {path} HTTP/1.1\r\nHost: test\r\n{auth}Content-Type: application/json\r\nContent-Length: {length}\r\n\r\n"
    )
}

fn vm_rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("the server's status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS")
}

const TWO_MB: usize = 2_000_000;

#[tokio::test]
async fn an_upload_without_a_valid_token_is_refused_before_its_body() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("s"));
    let join = server.join_token();
    let cases: [(&str, Option<&str>, u16, &str); 4] = [
        ("/v1/taskdefs", None, 401, "Unauthorized"),
        ("/v1/taskdefs", Some("mpsf_adm_not-a-token"), 401, "Unauthorized"),
        // A real token, but not one this route is open to.
        ("/v1/taskdefs", Some(&join), 403, "Forbidden"),
        ("/v1/agent/status", Some(&join), 403, "Forbidden"),
    ];
    for (path, token, status, code) in cases {
        let mut s = connect(&server).await;
        // Announces 2 MB, sends a little of it, and stalls: the answer must not wait for the rest.
        s.write_all(post_head(path, token, TWO_MB).as_bytes()).await.unwrap();
        s.write_all(&[b' '; 1000]).await.unwrap();
        let a = timeout(Duration::from_secs(2), read_answer(&mut s))
            .await
            .unwrap_or_else(|_| panic!("{path} with {token:?}: no answer while the body is pending"));
        assert_eq!(a.status, status, "{path} with {token:?}: {}", a.head);
        assert_eq!(a.json()["code"], code, "{path} with {token:?}");
        assert!(a.head.to_ascii_lowercase().contains("connection: close"), "{}", a.head);
        assert!(
            closed_within(&mut s, Duration::from_secs(2)).await.is_some(),
            "{path}: the connection stays open after the refusal"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_uploads_and_headers_neither_grow_the_server_nor_stay_open() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start_with(
        &dir.path().join("s"),
        "127.0.0.1:0",
        &["--http-header-timeout-ms", "1000", "--http-body-timeout-ms", "1000"],
    );
    let admin = server.admin_token();
    let pid = server.child.id();
    // Warm up the paths the stalled requests take.
    for _ in 0..3 {
        let mut s = connect(&server).await;
        s.write_all(post_head("/v1/taskdefs", None, 10).as_bytes()).await.unwrap();
        assert_eq!(read_answer(&mut s).await.status, 401);
    }
    let before = vm_rss_kib(pid);

    // 300 unauthenticated 2 MB uploads that stall after 64 KiB.
    let mut unauthenticated = Vec::new();
    for _ in 0..300 {
        let mut s = connect(&server).await;
        s.write_all(post_head("/v1/taskdefs", None, TWO_MB).as_bytes()).await.unwrap();
        let _ = s.write_all(&vec![b' '; 64 << 10]).await;
        unauthenticated.push(s);
    }
    // Authenticated uploads that stall inside their body, and requests that stall inside their
    // headers: closed by the body and the header timeouts.
    let mut slow_bodies = Vec::new();
    for _ in 0..20 {
        let mut s = connect(&server).await;
        s.write_all(post_head("/v1/taskdefs", Some(&admin), 1_000_000).as_bytes()).await.unwrap();
        s.write_all(&[b' '; 10_000]).await.unwrap();
        slow_bodies.push(s);
    }
    let mut slow_heads = Vec::new();
    for _ in 0..20 {
        let mut s = connect(&server).await;
        s.write_all(b"POST /v1/taskdefs HTTP/1.1\r\nHost: test\r\nContent-Le").await.unwrap();
        slow_heads.push(s);
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let during = vm_rss_kib(pid);
    assert!(
        during < before + 40 * 1024,
        "VmRSS grew from {before} KiB to {during} KiB with 300 stalled uploads"
    );

    for s in &mut unauthenticated {
        let a = timeout(Duration::from_secs(5), read_answer(s)).await.expect("an answer to a stalled upload");
        assert_eq!(a.status, 401);
        assert!(closed_within(s, Duration::from_secs(3)).await.is_some(), "a refused upload stays open");
    }
    for s in &mut slow_bodies {
        let a = timeout(Duration::from_secs(4), read_answer(s)).await.expect("an answer to a stalled body");
        assert_eq!(a.status, 408, "{}", a.head);
        assert_eq!(a.json()["code"], "BodyTimeout");
        assert!(closed_within(s, Duration::from_secs(3)).await.is_some(), "a stalled body stays open");
    }
    for s in &mut slow_heads {
        let took = closed_within(s, Duration::from_secs(4)).await;
        assert!(took.is_some(), "a connection stalled in its headers is still open after 4 s");
    }
    let after = vm_rss_kib(pid);
    assert!(after < before + 40 * 1024, "VmRSS grew from {before} KiB to {after} KiB");
    println!("VmRSS: {before} KiB before, {during} KiB with the stalled uploads, {after} KiB after");
}

#[tokio::test]
async fn an_authenticated_body_over_its_route_limit_gets_the_json_413() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("s"));
    let admin = server.admin_token();
    // Announced over the limit: refused at once, without reading it.
    let mut s = connect(&server).await;
    s.write_all(post_head("/v1/pools", Some(&admin), 100_000).as_bytes()).await.unwrap();
    let a = timeout(Duration::from_secs(2), read_answer(&mut s)).await.expect("an answer");
    assert_eq!(a.status, 413, "{}", a.head);
    let body = a.json();
    assert_eq!(body["code"], "PayloadTooLarge", "{body}");
    assert!(body["message"].as_str().unwrap().contains("at most 65536 bytes"), "{body}");
    // The body it announced is read and dropped meanwhile (a client still writing it reads
    // the refusal), and the connection serves the next request.
    assert!(!a.head.to_ascii_lowercase().contains("connection: close"), "{}", a.head);
    s.write_all(&vec![b' '; 100_000]).await.unwrap();
    s.write_all(b"GET /v1/healthz HTTP/1.1\r\nHost: test\r\n\r\n").await.unwrap();
    let a = timeout(Duration::from_secs(5), read_answer(&mut s)).await.expect("the next answer");
    assert_eq!(a.status, 200, "{}", a.head);
    // A huge one is not read: the connection closes after the refusal.
    let mut s = connect(&server).await;
    s.write_all(post_head("/v1/pools", Some(&admin), 100_000_000).as_bytes()).await.unwrap();
    let a = timeout(Duration::from_secs(2), read_answer(&mut s)).await.expect("an answer");
    assert_eq!(a.status, 413, "{}", a.head);
    assert!(a.head.to_ascii_lowercase().contains("connection: close"), "{}", a.head);

    // Sent in chunks with no length: refused once it passes the limit (task definitions
    // take up to 2 MiB).
    let mut s = connect(&server).await;
    let head = format!(
        "POST /v1/taskdefs HTTP/1.1\r\nHost: test\r\nAuthorization: Bearer {admin}\r\n\
         Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
    );
    s.write_all(head.as_bytes()).await.unwrap();
    let chunk = vec![b' '; 64 << 10];
    let mut framed = format!("{:x}\r\n", chunk.len()).into_bytes();
    framed.extend_from_slice(&chunk);
    framed.extend_from_slice(b"\r\n");
    for _ in 0..40 {
        if s.write_all(&framed).await.is_err() {
            break;
        }
    }
    let a = timeout(Duration::from_secs(5), read_answer(&mut s)).await.expect("an answer");
    assert_eq!(a.status, 413, "{}", a.head);
    let body = a.json();
    assert_eq!(body["code"], "PayloadTooLarge", "{body}");
    assert!(body["message"].as_str().unwrap().contains("at most 2097152 bytes"), "{body}");

    // Within the limit, the route answers as before.
    let http = server.http();
    let resp = http
        .post(format!("{}/v1/pools", server.url))
        .bearer_auth(&admin)
        .body(r#"{"name": "gpu"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 201);

    // The HTTP layer's own refusals (here a path that is not UTF-8) are JSON errors too.
    let resp = http.get(format!("{}/v1/hosts/%FF", server.url)).bearer_auth(&admin).send().await.unwrap();
    assert_eq!(resp.status(), 400);
    let body: Value = resp.json().await.expect("a JSON error");
    assert_eq!(body["code"], "BadRequest", "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_connection_is_closed_but_a_long_poll_is_not() {
    let dir = tempfile::tempdir().unwrap();
    let server =
        Server::start_with(&dir.path().join("s"), "127.0.0.1:0", &["--http-idle-timeout-ms", "1000"]);
    let mut s = connect(&server).await;
    s.write_all(b"GET /v1/healthz HTTP/1.1\r\nHost: test\r\n\r\n").await.unwrap();
    assert_eq!(read_answer(&mut s).await.status, 200);
    let took = closed_within(&mut s, Duration::from_secs(5)).await.expect("the idle connection stays open");
    assert!(took >= Duration::from_millis(700), "closed after {took:?}, before the idle timeout");

    // A long poll of 3 s has nothing to send for longer than the idle timeout: it is answered.
    create_pool(&server.admin(), "gpu").await;
    let joiner = server.client(Some(server.join_token()));
    let reg = registration("gpu", "h1", "h1", 1);
    let credential = joiner.register_host(&reg).await.expect("register a host").credential;
    let mut s = connect(&server).await;
    let req = format!(
        "GET /v1/agent/assignments?after=1000000&waitSeconds=3 HTTP/1.1\r\nHost: test\r\n\
         Authorization: Bearer {credential}\r\n\r\n"
    );
    s.write_all(req.as_bytes()).await.unwrap();
    let started = Instant::now();
    let a = timeout(Duration::from_secs(10), read_answer(&mut s)).await.expect("the long poll's answer");
    assert_eq!(a.status, 200, "{}", a.head);
    assert!(started.elapsed() >= Duration::from_millis(2500), "answered after {:?}", started.elapsed());
}

/// The header read timeout runs from a request's first byte: a keep-alive connection that waits
/// longer than it for its next request is answered, and closed by the idle timeout only; a
/// request that starts and stalls in its headers is closed by the header timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keep_alive_connection_waits_for_its_next_request_until_the_idle_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start_with(
        &dir.path().join("s"),
        "127.0.0.1:0",
        &["--http-header-timeout-ms", "500", "--http-idle-timeout-ms", "3000"],
    );
    let healthz = b"GET /v1/healthz HTTP/1.1\r\nHost: test\r\n\r\n";
    let mut s = connect(&server).await;
    for _ in 0..3 {
        s.write_all(healthz).await.unwrap();
        assert_eq!(read_answer(&mut s).await.status, 200);
        // Three header timeouts without a byte: not a request that stalls.
        tokio::time::sleep(Duration::from_millis(1500)).await;
    }
    s.write_all(healthz).await.unwrap();
    assert_eq!(read_answer(&mut s).await.status, 200, "answered after 1.5 s of keep-alive");
    let took = closed_within(&mut s, Duration::from_secs(6)).await.expect("the idle connection stays open");
    assert!(took >= Duration::from_millis(2500), "closed after {took:?}, before the idle timeout");

    // A connection's second request stalls in its headers: closed within the header
    // timeout of its first byte, long before the idle timeout.
    let mut s = connect(&server).await;
    s.write_all(healthz).await.unwrap();
    assert_eq!(read_answer(&mut s).await.status, 200);
    tokio::time::sleep(Duration::from_millis(800)).await;
    s.write_all(b"GET /v1/healthz HTTP/1.1\r\nHo").await.unwrap();
    let took = closed_within(&mut s, Duration::from_secs(3)).await.expect("a stalled header stays open");
    assert!(took < Duration::from_millis(1500), "closed after {took:?}, not by the header timeout");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_the_connection_cap_a_connection_waits_until_another_closes() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start_with(&dir.path().join("s"), "127.0.0.1:0", &["--http-max-connections", "4"]);
    let healthz = b"GET /v1/healthz HTTP/1.1\r\nHost: test\r\n\r\n";
    let mut open = Vec::new();
    for _ in 0..4 {
        let mut s = connect(&server).await;
        s.write_all(healthz).await.unwrap();
        assert_eq!(read_answer(&mut s).await.status, 200);
        open.push(s);
    }
    // The fifth's TLS handshake waits for a slot too: it runs on its own meanwhile.
    let (to, ca) = (addr(&server), std::fs::read(server.data_dir.join("ca.pem")).unwrap());
    let fifth = tokio::spawn(async move {
        let mut s = connect_to(&to, &ca).await;
        s.write_all(healthz).await.unwrap();
        read_answer(&mut s).await.status
    });
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(!fifth.is_finished(), "a fifth connection was served while 4 were open");
    drop(open.pop());
    let status = timeout(Duration::from_secs(5), fifth)
        .await
        .expect("the waiting connection is served once another closes")
        .unwrap();
    assert_eq!(status, 200);
    // The ones still open are served as before.
    let s = &mut open[0];
    s.write_all(healthz).await.unwrap();
    assert_eq!(timeout(Duration::from_secs(5), read_answer(s)).await.expect("an answer").status, 200);
}

/// A connection that never finishes its TLS handshake holds its slot no longer than the header
/// timeout; plain HTTP sent to the HTTPS port gets no answer, only a closed connection.
#[tokio::test]
async fn a_stalled_tls_handshake_is_closed_by_the_header_timeout_and_plain_http_gets_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let server =
        Server::start_with(&dir.path().join("s"), "127.0.0.1:0", &["--http-header-timeout-ms", "1000"]);
    let opened = Instant::now();
    let mut silent = TcpStream::connect(addr(&server)).await.unwrap();
    let mut partial = TcpStream::connect(addr(&server)).await.unwrap();
    // A handshake record's header announcing 80 bytes, and none of them.
    partial.write_all(&[0x16, 0x03, 0x01, 0x00, 0x50]).await.unwrap();
    for (what, s) in [("silent", &mut silent), ("partial", &mut partial)] {
        assert!(
            closed_within(s, Duration::from_secs(4)).await.is_some(),
            "a {what} handshake is open after 4 s"
        );
        let took = opened.elapsed();
        assert!(took >= Duration::from_millis(800), "{what} closed after {took:?}, before its timeout");
    }
    let mut plain = TcpStream::connect(addr(&server)).await.unwrap();
    plain.write_all(b"GET /v1/healthz HTTP/1.1\r\nHost: test\r\n\r\n").await.unwrap();
    let mut got = Vec::new();
    let _ = timeout(Duration::from_secs(4), plain.read_to_end(&mut got)).await.expect("closed");
    assert!(!String::from_utf8_lossy(&got).contains("\"status\""), "plain HTTP was answered: {got:?}");
    // The server still answers over TLS.
    let mut s = connect(&server).await;
    s.write_all(b"GET /v1/healthz HTTP/1.1\r\nHost: test\r\n\r\n").await.unwrap();
    assert_eq!(read_answer(&mut s).await.status, 200);
}
