//! `--log-format json` and request ids against the real server binary: an API call's id (its
//! own `X-Request-Id`, or one the server makes) comes back in the answer and names the log
//! lines the call caused, inside the cluster's lock too; a log written to a file carries no
//! colour codes in either format.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

/// Starts `mpsfleet server` with `extra`, its log going to `log`; returns it and its URL.
fn server(dir: &std::path::Path, log: &std::path::Path, extra: &[&str]) -> (std::process::Child, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_mpsfleet"))
        .args(["server", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(dir)
        .args(extra)
        .env("MPSFLEET_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(log).unwrap())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let mut lines = BufReader::new(stdout).lines();
    let url = loop {
        let line = lines.next().expect("the server printed its address").unwrap();
        if let Some(url) = line.strip_prefix("mpsfleet server listening on ") {
            break url.to_string();
        }
    };
    std::thread::spawn(move || lines.for_each(drop));
    (child, url)
}

fn http(dir: &std::path::Path) -> reqwest::Client {
    let ca = std::fs::read(dir.join("ca.pem")).unwrap();
    reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(&ca).unwrap())
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_api_call_and_its_log_lines_share_a_request_id() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("server.log");
    let (mut child, url) = server(dir.path(), &log, &["--log-format", "json"]);
    let admin = std::fs::read_to_string(dir.path().join("admin.token")).unwrap();
    let c = http(dir.path());

    let create = |id: Option<&'static str>| {
        let mut req = c
            .post(format!("{url}/v1/tokens"))
            .bearer_auth(admin.trim())
            .json(&serde_json::json!({"role": "viewer", "description": "grafana"}));
        if let Some(id) = id {
            req = req.header("x-request-id", id);
        }
        req.send()
    };
    // The caller's id is kept and answered.
    let resp = create(Some("walk-1")).await.unwrap();
    assert!(resp.status().is_success(), "{}", resp.status());
    assert_eq!(resp.headers()["x-request-id"], "walk-1");
    // One the server makes otherwise; an id with a space in it is not taken.
    let resp = create(Some("not plain")).await.unwrap();
    let made = resp.headers()["x-request-id"].to_str().unwrap().to_string();
    assert_ne!(made, "not plain");
    assert!(made.len() > 8, "{made}");

    // The cluster logged "API token created" (under its lock) in the call's span.
    let lines = common::eventually(Duration::from_secs(10), "the log lines", || {
        let log = log.clone();
        async move {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            (text.matches("API token created").count() >= 2).then_some(text)
        }
    })
    .await;
    assert!(!lines.contains('\u{1b}'), "no escape codes in a log file: {lines}");
    let created: Vec<serde_json::Value> = lines
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .filter(|v| v["fields"]["message"] == "API token created")
        .collect();
    let ids: Vec<&str> = created.iter().map(|v| v["span"]["id"].as_str().unwrap_or("")).collect();
    assert_eq!(ids, ["walk-1", made.as_str()], "{created:?}");
    assert_eq!(created[0]["span"]["method"], "POST");
    assert_eq!(created[0]["span"]["path"], "/v1/tokens");
    assert_eq!(created[0]["level"], "INFO");
    child.kill().unwrap();

    // Text, written to a file, is not coloured either.
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("server.log");
    let (mut child, url) = server(dir.path(), &log, &[]);
    let admin = std::fs::read_to_string(dir.path().join("admin.token")).unwrap();
    let resp = http(dir.path())
        .post(format!("{url}/v1/tokens"))
        .bearer_auth(admin.trim())
        .header("x-request-id", "walk-2")
        .json(&serde_json::json!({"role": "viewer", "description": "x"}))
        .send()
        .await
        .unwrap();
    assert!(resp.status().is_success());
    let text = common::eventually(Duration::from_secs(10), "the text log line", || {
        let log = log.clone();
        async move {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            text.contains("API token created").then_some(text)
        }
    })
    .await;
    assert!(!text.contains('\u{1b}'), "{text}");
    let line = text.lines().find(|l| l.contains("API token created")).unwrap();
    assert!(line.contains("request{id=walk-2 method=POST path=/v1/tokens}"), "{line}");
    child.kill().unwrap();
}
