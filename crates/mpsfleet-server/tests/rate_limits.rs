//! Per-token rate limits on a real server (in-process, on 127.0.0.1): a token past its limit
//! is answered `429` with `Retry-After` and the documented JSON error while other tokens go on,
//! its bucket refills after the time it was told, and requests with unknown or missing tokens
//! from one address share one bucket, so that guessing tokens is throttled.

use mpsfleet_core::clock::SystemClock;
use mpsfleet_server::ratelimit::{Limit, RateLimits};
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

struct TestServer {
    url: String,
    admin: String,
    join: String,
    http: reqwest::Client,
    _dir: tempfile::TempDir,
    _stop: tokio::sync::oneshot::Sender<()>,
}

/// An answer: status, `Retry-After` and `Connection` headers, and the JSON body.
struct Answer {
    status: StatusCode,
    retry_after: Option<String>,
    connection: Option<String>,
    body: Value,
}

impl TestServer {
    async fn start(rate_limits: RateLimits) -> TestServer {
        let dir = tempfile::tempdir().unwrap();
        let mut opened = mpsfleet_server::open(dir.path(), Arc::new(SystemClock)).expect("open");
        let tokens = opened.first_start.take().expect("first start");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let options = mpsfleet_server::ServeOptions { rate_limits, ..Default::default() };
        tokio::spawn(mpsfleet_server::serve(listener, opened.cluster, options, async {
            let _ = stopped.await;
        }));
        TestServer {
            url,
            admin: tokens.admin_token,
            join: tokens.join_token,
            http: reqwest::Client::new(),
            _dir: dir,
            _stop: stop,
        }
    }

    async fn call(&self, method: Method, path: &str, token: Option<&str>, body: Option<Value>) -> Answer {
        let mut req = self.http.request(method, format!("{}{path}", self.url));
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        if let Some(b) = body {
            req = req.json(&b);
        }
        let resp = req.send().await.expect("an answer");
        let header = |name: &str| resp.headers().get(name).map(|v| v.to_str().unwrap().to_string());
        let (status, retry_after, connection) = (resp.status(), header("retry-after"), header("connection"));
        let bytes = resp.bytes().await.unwrap();
        let body = if bytes.is_empty() { Value::Null } else { serde_json::from_slice(&bytes).unwrap() };
        Answer { status, retry_after, connection, body }
    }

    async fn get(&self, path: &str, token: Option<&str>) -> Answer {
        self.call(Method::GET, path, token, None).await
    }
}

/// Limits small enough to reach in a test; one request a second comes back.
fn small() -> RateLimits {
    RateLimits {
        admin: Limit::new(1, 5),
        join: Limit::new(1, 3),
        host: Limit::new(1, 3),
        unknown_per_ip: Limit::new(1, 3),
    }
}

fn registration(hostname: &str) -> Value {
    json!({"pool": "gpu", "hostname": hostname, "mpsAvailable": true, "emulated": true,
        "gpus": [{"uuid": format!("GPU-{hostname}"), "index": 0, "model": "NVIDIA H200",
        "memoryMib": 143771, "computeCapability": "9.0", "maxMpsClients": 48}]})
}

/// Asserts a 429 of the documented shape for `who` under `limit`; returns its Retry-After.
fn assert_refused(a: &Answer, who: &str, limit: Limit) -> Duration {
    assert_eq!(a.status, StatusCode::TOO_MANY_REQUESTS, "{}", a.body);
    assert_eq!(a.body["code"], "TooManyRequests", "{}", a.body);
    let secs: u64 = a.retry_after.as_deref().expect("a Retry-After header").parse().expect("whole seconds");
    assert!(secs >= 1, "Retry-After {secs}");
    let message = format!(
        "rate limit for {who} exceeded: at most {} requests/s (burst {}); retry after {secs} s",
        limit.per_second, limit.burst
    );
    assert_eq!(a.body["message"], message.as_str());
    Duration::from_secs(secs)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_past_its_limit_gets_429_with_retry_after_and_other_tokens_go_on() {
    let limits = small();
    let s = TestServer::start(limits).await;
    let started = Instant::now();
    // The admin token's burst of 5: one create, four reads.
    let created = s.call(Method::POST, "/v1/pools", Some(&s.admin), Some(json!({"name": "gpu"}))).await;
    assert_eq!(created.status, StatusCode::CREATED, "{}", created.body);
    for i in 0..4 {
        let a = s.get("/v1/pools", Some(&s.admin)).await;
        assert_eq!(a.status, StatusCode::OK, "read {i}: {}", a.body);
    }
    let refused = s.get("/v1/pools", Some(&s.admin)).await;
    let retry_after = assert_refused(&refused, "the admin token", limits.admin);
    // A request with a body is refused before its body is read, and its connection closed.
    let post = s.call(Method::POST, "/v1/pools", Some(&s.admin), Some(json!({"name": "other"}))).await;
    assert_refused(&post, "the admin token", limits.admin);
    assert_eq!(post.connection.as_deref(), Some("close"));
    assert!(started.elapsed() < Duration::from_millis(900), "too slow to test a 1/s refill");

    // Other tokens have their own buckets: the join token registers, the host reports.
    let reg = s.call(Method::POST, "/v1/agent/register", Some(&s.join), Some(registration("h1"))).await;
    assert_eq!(reg.status, StatusCode::CREATED, "{}", reg.body);
    let credential = reg.body["credential"].as_str().expect("a credential").to_string();
    let host = reg.body["hostId"].as_str().expect("a host id").to_string();
    let report = json!({"onboarded": true, "checks": []});
    for i in 0..3 {
        let a = s.call(Method::POST, "/v1/agent/status", Some(&credential), Some(report.clone())).await;
        assert_eq!(a.status, StatusCode::OK, "report {i}: {}", a.body);
    }
    // ... within their own limits, and named in the refusal.
    let a = s.call(Method::POST, "/v1/agent/status", Some(&credential), Some(report.clone())).await;
    assert_refused(&a, &format!("the credential of host {host}"), limits.host);
    // The health check takes no token and is never limited.
    for _ in 0..20 {
        assert_eq!(s.get("/v1/healthz", None).await.status, StatusCode::OK);
    }
    // The admin token is still refused until the time it was told, then taken again.
    assert_eq!(s.get("/v1/pools", Some(&s.admin)).await.status, StatusCode::TOO_MANY_REQUESTS);
    tokio::time::sleep_until(started + retry_after + Duration::from_millis(100)).await;
    let again = s.get("/v1/pools", Some(&s.admin)).await;
    assert_eq!(again.status, StatusCode::OK, "{}", again.body);
    assert_eq!(again.retry_after, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_and_missing_tokens_from_one_address_share_one_bucket() {
    let limits = small();
    let s = TestServer::start(limits).await;
    let started = Instant::now();
    // Each guess a new random token: still one bucket, of 127.0.0.1.
    for i in 0..3 {
        let a = s.get("/v1/pools", Some(&format!("mpsf_adm_guess{i}"))).await;
        assert_eq!(a.status, StatusCode::UNAUTHORIZED, "guess {i}: {}", a.body);
        assert_eq!(a.body["code"], "Unauthorized");
    }
    let who = "requests without a known token from 127.0.0.1";
    let guess = s.get("/v1/pools", Some("mpsf_adm_guess-another")).await;
    let retry_after = assert_refused(&guess, who, limits.unknown_per_ip);
    assert_refused(&s.get("/v1/pools", None).await, who, limits.unknown_per_ip);
    let upload = s
        .call(Method::POST, "/v1/taskdefs", Some("mpsf_adm_guess-upload"), Some(json!({"family": "f"})))
        .await;
    assert_refused(&upload, who, limits.unknown_per_ip);
    assert_eq!(upload.connection.as_deref(), Some("close"));
    // A known token from the same address is not charged to that bucket.
    assert!(started.elapsed() < Duration::from_millis(900), "too slow to test a 1/s refill");
    for _ in 0..5 {
        assert_eq!(s.get("/v1/pools", Some(&s.admin)).await.status, StatusCode::OK);
    }
    // After the time it was told, a guess is answered again (and refused as unknown).
    tokio::time::sleep_until(started + retry_after + Duration::from_millis(100)).await;
    let later = s.get("/v1/pools", Some("mpsf_adm_guess-later")).await;
    assert_eq!(later.status, StatusCode::UNAUTHORIZED, "{}", later.body);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_default_limits_take_a_burst_of_registrations_and_reads() {
    let s = TestServer::start(RateLimits::default()).await;
    let created = s.call(Method::POST, "/v1/pools", Some(&s.admin), Some(json!({"name": "gpu"}))).await;
    assert_eq!(created.status, StatusCode::CREATED, "{}", created.body);
    let mut registrations = tokio::task::JoinSet::new();
    for i in 0..300 {
        let (http, url, join) = (s.http.clone(), s.url.clone(), s.join.clone());
        registrations.spawn(async move {
            let resp = http
                .post(format!("{url}/v1/agent/register"))
                .bearer_auth(join)
                .json(&registration(&format!("h{i}")))
                .send()
                .await
                .unwrap();
            resp.status()
        });
    }
    while let Some(status) = registrations.join_next().await {
        assert_eq!(status.unwrap(), StatusCode::CREATED);
    }
    for _ in 0..1000 {
        assert_eq!(s.get("/v1/pools", Some(&s.admin)).await.status, StatusCode::OK);
    }
}
