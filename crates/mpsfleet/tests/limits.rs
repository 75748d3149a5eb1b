//! Process test: a burst of the largest task definitions the server takes, and of ones over its
//! limits, while an agent heartbeats. The work such requests cause happens outside the cluster
//! lock or is refused before it starts, so heartbeats keep their grace and the host stays OK.

mod common;

use common::*;
use mpsfleet_core::taskdef::{MAX_CONTAINERS, MAX_DOCUMENT_BYTES};
use mpsfleet_types::*;
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(60);
/// The pool's heartbeat grace: short, so that a stalled lock shows (before, one definition with
/// 65,000 environment variables held the lock for seconds), with room for a machine busy with
/// other work, which delays the agent's heartbeats too.
const GRACE_MS: u64 = 3_000;
/// How long the burst lasts: several graces.
const BURST: Duration = Duration::from_secs(9);
const CLIENTS: usize = 6;
/// Definitions at the limit each client registers (each is stored: kept few).
const AT_LIMIT_EACH: usize = 4;

fn env(n: usize) -> Vec<Value> {
    (0..n).map(|i| json!({"name": format!("V{i}"), "value": "x"})).collect()
}

/// A definition of exactly `len` bytes with the most containers, each with environment
/// variables and commands, padded through one environment value.
fn sized_definition(family: &str, len: usize) -> Vec<u8> {
    let doc = |pad: usize| {
        let containers: Vec<Value> = (0..MAX_CONTAINERS)
            .map(|c| {
                let mut e = env(700);
                if c == 0 {
                    e.push(json!({"name": "PAD", "value": "p".repeat(pad)}));
                }
                let command: Vec<String> = (0..300).map(|i| format!("a{i}")).collect();
                json!({"name": format!("c{c}"), "command": command, "environment": e,
                       "healthCheck": {"command": ["CMD", "true"]}})
            })
            .collect();
        json!({"family": family, "containerDefinitions": containers}).to_string().into_bytes()
    };
    let base = doc(0).len();
    assert!(base <= len, "the unpadded definition has {base} bytes, more than {len}");
    let out = doc(len - base);
    assert_eq!(out.len(), len);
    out
}

/// Wall-clock milliseconds since the epoch, as the server stamps heartbeats.
#[allow(clippy::disallowed_methods)] // the test compares with the server's wall clock
fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// What one request of the burst is, and how the server must answer it.
struct Kind {
    name: &'static str,
    body: Arc<Vec<u8>>,
    status: u16,
    field: Option<&'static str>,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_the_largest_definitions_leaves_heartbeats_and_hosts_alone() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("server"));
    let admin = server.admin();
    let policy = HealthPolicy { agent_heartbeat_grace_ms: GRACE_MS, ..Default::default() };
    admin
        .create_pool(&CreatePool { name: "gpu".into(), health_policy: Some(policy), ..Default::default() })
        .await
        .unwrap();
    let agent = Agent::start_with_model(&server, &dir.path().join("a"), 2);
    let host = eventually(WAIT, "the host ACTIVE and OK", || async {
        let h = admin.list_hosts(None).await.ok()?.into_iter().next()?;
        (h.status == HostStatus::Active && h.health_status == HealthStatus::Ok).then_some(h.id)
    })
    .await;

    let kinds = Arc::new(vec![
        Kind {
            name: "at the document limit",
            body: Arc::new(sized_definition("big", MAX_DOCUMENT_BYTES)),
            status: 201,
            field: None,
        },
        Kind {
            name: "one byte over the document limit",
            body: Arc::new(sized_definition("big", MAX_DOCUMENT_BYTES + 1)),
            status: 400,
            field: Some("$"),
        },
        Kind {
            name: "4097 environment variables",
            body: Arc::new(taskdef(json!({"family": "env", "containerDefinitions": [
                {"name": "a", "command": ["run"], "environment": env(4097)}]}))),
            status: 400,
            field: Some("containerDefinitions[0].environment"),
        },
        Kind {
            name: "65,000 environment variables",
            body: Arc::new(taskdef(json!({"family": "env", "containerDefinitions": [
                {"name": "a", "command": ["run"], "environment": env(65_000)}]}))),
            status: 400,
            field: Some("$"),
        },
    ]);

    let http = server.http();
    let url = format!("{}/v1/taskdefs", server.url);
    let token = server.admin_token();
    let started = tokio::time::Instant::now();
    let mut clients = tokio::task::JoinSet::new();
    for _ in 0..CLIENTS {
        let (http, url, token, kinds) = (http.clone(), url.clone(), token.clone(), kinds.clone());
        clients.spawn(async move {
            // Answers by kind; the definitions at the limit first, then the refused ones in turn.
            let mut answered = vec![0usize; kinds.len()];
            let mut round = 0usize;
            while round < AT_LIMIT_EACH || started.elapsed() < BURST {
                let k = if round < AT_LIMIT_EACH { 0 } else { 1 + round % (kinds.len() - 1) };
                round += 1;
                let kind = &kinds[k];
                let resp = http
                    .post(&url)
                    .bearer_auth(&token)
                    .header("content-type", "application/json")
                    .body(kind.body.as_ref().clone())
                    .send()
                    .await
                    .expect("the server answers");
                let status = resp.status().as_u16();
                let body: Value = resp.json().await.expect("a JSON answer");
                assert_eq!(status, kind.status, "{}: {body}", kind.name);
                if let Some(field) = kind.field {
                    assert_eq!(body["code"], "InvalidTaskDefinition", "{}: {body}", kind.name);
                    assert_eq!(body["field"], field, "{}: {body}", kind.name);
                }
                answered[k] += 1;
            }
            answered
        });
    }

    // While the burst runs, the agent's heartbeats arrive within the grace and the host stays
    // ACTIVE and OK.
    let mut worst_lag_ms = 0u64;
    let mut samples = 0;
    while !clients.is_empty() && started.elapsed() < BURST + WAIT {
        let h = admin.describe_host(host.as_str()).await.unwrap();
        let lag = now_ms().saturating_sub(h.last_heartbeat_ms.unwrap_or(0));
        worst_lag_ms = worst_lag_ms.max(lag);
        if lag > 500 {
            println!("at {:?}: heartbeat {lag} ms old", started.elapsed());
        }
        samples += 1;
        assert_eq!(h.status, HostStatus::Active, "during the burst: {h:?}");
        assert_eq!(h.health_status, HealthStatus::Ok, "during the burst: {:?}", h.checks);
        assert!(lag < GRACE_MS, "a heartbeat {lag} ms old during the burst, grace {GRACE_MS} ms");
        tokio::time::sleep(Duration::from_millis(100)).await;
        while let Some(done) = clients.try_join_next() {
            let answered = done.expect("a client of the burst failed");
            for (i, n) in answered.iter().enumerate() {
                assert!(*n > 0, "no answers to requests {}", kinds[i].name);
            }
        }
    }
    assert!(clients.is_empty(), "the burst did not end");
    assert!(samples >= 20, "only {samples} looks at the host during the burst");

    // The burst happened: every definition at the limit was registered, all of them revisions.
    let stored = admin.list_taskdefs(Some("big")).await.unwrap();
    assert_eq!(stored.len(), CLIENTS * AT_LIMIT_EACH);
    assert!(stored.iter().all(|td| td.container_definitions.len() == MAX_CONTAINERS));

    // And afterwards: no incident, the host ACTIVE and OK.
    assert!(admin.list_incidents().await.unwrap().is_empty(), "an incident was opened");
    let h = admin.describe_host(host.as_str()).await.unwrap();
    assert_eq!((h.status, h.health_status), (HostStatus::Active, HealthStatus::Ok), "{h:?}");
    println!("worst heartbeat age seen during the burst: {worst_lag_ms} ms over {samples} looks");
    drop(agent);
}
