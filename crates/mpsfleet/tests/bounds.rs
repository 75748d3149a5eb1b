//! A pool's recovery bounds through the CLI against a real server: `pool explain -o json`
//! states a bound for every phase and failure kind with its inputs, a policy change moves the
//! bounds by what the formulas say and is recorded in the pool's events, and a policy that
//! cannot meet `maxResumeSeconds` is refused, naming the limit and the bound.

mod common;

use common::*;
use serde_json::{json, Value};
use std::process::{Command, Output};

fn cli(server: &Server, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_mpsfleet"))
        .args(args)
        .args(["--server", &server.url, "--token", &server.admin_token(), "--ca-file", &server.ca_file()])
        .output()
        .expect("run the CLI")
}

fn json_of(out: Output) -> Value {
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)))
}

fn file(dir: &std::path::Path, name: &str, v: Value) -> String {
    let p = dir.join(name);
    std::fs::write(&p, v.to_string()).unwrap();
    p.display().to_string()
}

fn detect(explained: &Value, kind: &str) -> u64 {
    let row = explained["bounds"]["kinds"].as_array().unwrap().iter().find(|k| k["kind"] == kind).unwrap();
    row["detectMs"].as_u64().unwrap()
}

#[test]
fn pool_explain_states_bounds_that_follow_the_policy() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("server"));
    let pool = file(dir.path(), "pool.json", json!({"provider": {"kind": "local", "desiredHosts": 0}}));
    json_of(cli(&server, &["pool", "create", "gpu", "--mode", "managed", "--file", &pool, "-o", "json"]));

    let e = json_of(cli(&server, &["pool", "explain", "gpu", "-o", "json"]));
    let kinds = e["bounds"]["kinds"].as_array().unwrap();
    let names: Vec<&str> = kinds.iter().map(|k| k["kind"].as_str().unwrap()).collect();
    assert_eq!(names, ["daemon-exit", "daemon-hang", "agent-lost", "gpu-check-fail", "host-lost"]);
    for k in kinds {
        for phase in ["detectMs", "notifyMs", "decideMs", "replaceMs", "totalMs", "totalFencedMs"] {
            assert!(k[phase].as_u64().is_some_and(|ms| ms > 0), "{phase} of {k}");
        }
        let (d, t) = (k["detectMs"].as_u64().unwrap(), k["totalMs"].as_u64().unwrap());
        assert!(d < t, "{k}");
    }
    let inputs = &e["bounds"]["inputs"];
    assert_eq!(inputs["mpsProbeIntervalMs"], 5000);
    assert_eq!(inputs["launchTimeoutMs"], 60000, "the local provider's default launch timeout");
    // The server's own intervals stand beside the pool's settings, by the same names.
    assert_eq!(
        (inputs["agentHeartbeatMs"].as_u64(), inputs["healthTickMs"].as_u64()),
        (Some(1000), Some(250))
    );
    assert_eq!(e["bounds"]["owner"], "mpsfleet");
    assert!(!e["bounds"]["formulas"].as_array().unwrap().is_empty());

    // Two seconds more between probes: the hang bound grows by (threshold - 1) intervals.
    let slower = file(dir.path(), "slower.json", json!({"healthPolicy": {"mpsProbeIntervalMs": 7000}}));
    json_of(cli(&server, &["pool", "update", "gpu", "--file", &slower, "-o", "json"]));
    let after = json_of(cli(&server, &["pool", "explain", "gpu", "-o", "json"]));
    assert_eq!(detect(&after, "daemon-hang") - detect(&e, "daemon-hang"), 2 * 2_000);
    assert_eq!(detect(&after, "daemon-exit"), detect(&e, "daemon-exit"));
    let p = json_of(cli(&server, &["pool", "describe", "gpu", "-o", "json"]));
    let events = p["events"]["entries"].as_array().unwrap();
    let changed = events.iter().find(|e| e["reason"] == "BoundsChanged").expect("a BoundsChanged event");
    assert!(changed["message"].as_str().unwrap().contains("daemon-hang detect 16.5s -> 20.5s"), "{changed}");

    // A limit the policy cannot meet is refused, naming it and the bound; nothing changes.
    let out = cli(&server, &["pool", "update", "gpu", "--max-resume-seconds", "30"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("maxResumeSeconds") && err.contains("more than maxResumeSeconds (30s)"), "{err}");
    let p = json_of(cli(&server, &["pool", "describe", "gpu", "-o", "json"]));
    assert!(p.get("maxResumeSeconds").is_none(), "{p}");

    // The table names each kind, and the self-managed pool says the rest is the operator's.
    let out = cli(&server, &["pool", "explain", "gpu"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("recovery bounds") && text.contains("daemon-hang") && text.contains("20.5s"),
        "{text}"
    );
    json_of(cli(&server, &["pool", "create", "ops", "--mode", "self-managed", "-o", "json"]));
    let ops = json_of(cli(&server, &["pool", "explain", "ops", "-o", "json"]));
    assert_eq!(ops["bounds"]["owner"], "operator");
    for k in ops["bounds"]["kinds"].as_array().unwrap() {
        assert!(k["detectMs"].as_u64().is_some() && k["notifyMs"].as_u64().is_some(), "{k}");
        assert!(k.get("totalMs").is_none_or(Value::is_null), "{k}");
    }
}
