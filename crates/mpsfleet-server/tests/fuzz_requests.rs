//! Random and mutated request bodies against every route that takes one, on a real server
//! (in-process, on 127.0.0.1): no answer is a 5xx, every refusal is the documented JSON error
//! (`{"code", "message"}`), and the server keeps answering. Bounded: a fixed number of cases
//! per route, so it runs in CI on every change.

use mpsfleet_core::clock::SystemClock;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use serde_json::{json, Value};
use std::sync::Arc;

/// JSON of bounded depth and size, strings that include control and non-ASCII characters and
/// the names of real fields, numbers at the edges.
fn arb_json() -> impl Strategy<Value = Value> {
    let names = prop::sample::select(vec![
        "name",
        "family",
        "containerDefinitions",
        "image",
        "command",
        "memory",
        "portMappings",
        "hostPort",
        "containerPort",
        "pool",
        "taskDefinition",
        "count",
        "desiredCount",
        "mode",
        "provider",
        "healthPolicy",
        "lastStatus",
        "containers",
        "networkBindings",
        "reason",
        "gpus",
        "uuid",
        "memoryMib",
        "hostname",
        "logsUrl",
        "checks",
        "output",
        "x",
    ]);
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        prop_oneof![Just(0i64), Just(-1), Just(i64::MAX), Just(i64::MIN), Just(65_536), any::<i64>()]
            .prop_map(Value::from),
        any::<f64>().prop_map(|f| serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number)),
        "(?s).{0,40}".prop_map(Value::String),
        prop::sample::select(vec!["RUNNING", "STOPPED", "managed", "GPU", "tcp", "local", "exec"])
            .prop_map(|s| Value::String(s.into())),
    ];
    leaf.prop_recursive(4, 64, 8, move |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..8).prop_map(Value::Array),
            prop::collection::vec((names.clone(), inner), 0..8)
                .prop_map(|kv| Value::Object(kv.into_iter().map(|(k, v)| (k.to_string(), v)).collect())),
        ]
    })
}

/// A valid body with one field (at any depth) replaced by random JSON.
fn mutate(valid: Value) -> impl Strategy<Value = Value> {
    (arb_json(), any::<prop::sample::Index>()).prop_map(move |(junk, at)| {
        let mut v = valid.clone();
        let mut slots = Vec::new();
        collect_paths(&v, &mut Vec::new(), &mut slots);
        if slots.is_empty() {
            return junk;
        }
        let path = slots[at.index(slots.len())].clone();
        if let Some(slot) = path.iter().try_fold(&mut v, |node, key| match key {
            Key::Field(k) => node.get_mut(k.as_str()),
            Key::Index(i) => node.get_mut(*i),
        }) {
            *slot = junk;
        }
        v
    })
}

#[derive(Clone)]
enum Key {
    Field(String),
    Index(usize),
}

fn collect_paths(v: &Value, at: &mut Vec<Key>, out: &mut Vec<Vec<Key>>) {
    match v {
        Value::Object(m) => {
            for (k, child) in m {
                at.push(Key::Field(k.clone()));
                out.push(at.clone());
                collect_paths(child, at, out);
                at.pop();
            }
        }
        Value::Array(a) => {
            for (i, child) in a.iter().enumerate() {
                at.push(Key::Index(i));
                out.push(at.clone());
                collect_paths(child, at, out);
                at.pop();
            }
        }
        _ => {}
    }
}

#[test]
fn random_and_mutated_bodies_get_documented_errors_and_never_a_5xx() {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut opened = mpsfleet_server::open(dir.path(), Arc::new(SystemClock)).expect("open");
    let tokens = opened.first_start.take().expect("first start");
    let listener = rt.block_on(tokio::net::TcpListener::bind("127.0.0.1:0")).unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = rt.spawn(mpsfleet_server::serve(listener, opened.cluster, Default::default(), async {
        let _ = stop_rx.await;
    }));
    let http = reqwest::Client::new();

    let taskdef = json!({"family": "f", "containerDefinitions": [{"name": "main", "image": "busybox",
        "command": ["sleep", "1"], "memory": 64, "portMappings": [{"containerPort": 80, "hostPort": 8080}],
        "resourceRequirements": [{"type": "GPU", "sharingStrategy": {"nvidiaMps": {"memory": 1024}}}]}]});
    let routes: Vec<(&str, &str, Value, &str)> = vec![
        ("POST", "/v1/taskdefs", taskdef, &tokens.admin_token),
        (
            "POST",
            "/v1/pools",
            json!({"name": "p", "mode": "managed", "strategy": "binpack"}),
            &tokens.admin_token,
        ),
        ("PATCH", "/v1/pools/default", json!({"strategy": "spread"}), &tokens.admin_token),
        (
            "POST",
            "/v1/tasks",
            json!({"taskDefinition": "f", "count": 1, "pool": "default"}),
            &tokens.admin_token,
        ),
        (
            "POST",
            "/v1/services",
            json!({"name": "s", "pool": "default", "taskDefinition": "f", "desiredCount": 1}),
            &tokens.admin_token,
        ),
        ("PATCH", "/v1/services/s", json!({"desiredCount": 2}), &tokens.admin_token),
        ("POST", "/v1/incidents/inc-1/resolve", json!({"reason": "fixed"}), &tokens.admin_token),
        ("POST", "/v1/tasks/t-0000000000000001/stop", json!({"reason": "r"}), &tokens.admin_token),
        (
            "POST",
            "/v1/secrets",
            json!({"name": "arn:aws:ssm:us-east-1:1:parameter/p", "value": "v"}),
            &tokens.admin_token,
        ),
        (
            "POST",
            "/v1/agent/register",
            json!({"pool": "default", "hostname": "h", "gpus": [{"uuid": "GPU-1", "index": 0, "model": "m",
                "memoryMib": 1024}], "mpsAvailable": true, "emulated": true, "runtime": "docker"}),
            &tokens.join_token,
        ),
    ];
    for (method, path, valid, token) in routes {
        // A runner per route: one runner's cases are spent by its first run.
        let mut runner =
            TestRunner::new(Config { cases: 120, failure_persistence: None, ..Config::default() });
        let strategy = prop_oneof![arb_json(), mutate(valid)];
        let statuses = std::cell::RefCell::new(std::collections::BTreeMap::<u16, u32>::new());
        runner
            .run(&strategy, |body| {
                let text = body.to_string();
                let (status, answer) = rt.block_on(async {
                    let req = http
                        .request(method.parse().unwrap(), format!("{url}{path}"))
                        .bearer_auth(token)
                        .header("content-type", "application/json")
                        .body(text.clone());
                    let resp = req.send().await.expect("the server answers");
                    let status = resp.status().as_u16();
                    (status, resp.text().await.unwrap_or_default())
                });
                *statuses.borrow_mut().entry(status).or_default() += 1;
                prop_assert!(status < 500, "{method} {path} with {text}: {status} {answer}");
                if status >= 400 {
                    let v: Value = serde_json::from_str(&answer)
                        .map_err(|e| TestCaseError::fail(format!("{status} not JSON ({e}): {answer}")))?;
                    prop_assert!(
                        v["code"].as_str().is_some_and(|c| !c.is_empty()) && v["message"].is_string(),
                        "{method} {path} with {text}: {status} {answer}"
                    );
                }
                Ok(())
            })
            .unwrap_or_else(|e| panic!("{method} {path}: {e}"));
        let seen = statuses.into_inner();
        println!("{method} {path}: {seen:?}");
        assert!(seen.values().sum::<u32>() >= 120, "every case was sent: {seen:?}");
    }
    // Still answering after all of it.
    let ok = rt
        .block_on(async { http.get(format!("{url}/v1/healthz")).send().await.map(|r| r.status().as_u16()) });
    assert_eq!(ok.ok(), Some(200));
    let _ = stop_tx.send(());
    rt.block_on(server).unwrap().unwrap();
}
