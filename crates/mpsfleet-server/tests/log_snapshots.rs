//! The last output snapshots agents report with their tasks' states, as the cluster keeps them
//! for `task logs`: the latest one wins, a late STOPPED report still brings its snapshot, and
//! the snapshot is where logs come from when the agent cannot be asked.

use mpsfleet_core::clock::ManualClock;
use mpsfleet_server::cluster::Cluster;
use mpsfleet_server::cluster::Error;
use mpsfleet_store::MemoryStore;
use mpsfleet_types::api::HostStatusReport;
use mpsfleet_types::logs::SNAPSHOT_MAX_BYTES;
use mpsfleet_types::*;
use std::sync::Arc;

/// A report as an agent sends it, with a snapshot holding `lines` of stdout.
fn report(status: &str, lines: &[&str]) -> TaskStateReport {
    let lines: Vec<serde_json::Value> = lines
        .iter()
        .map(|l| serde_json::json!({"atMs": 5, "container": "main", "stream": "stdout", "text": l}))
        .collect();
    serde_json::from_value(serde_json::json!({
        "lastStatus": status,
        "output": {"takenAtMs": 5, "lines": lines},
    }))
    .expect("a report")
}

fn setup() -> (Cluster, Arc<ManualClock>, HostId, String) {
    let clock = Arc::new(ManualClock::new(1_000));
    let mut c = Cluster::load(Arc::new(MemoryStore::new()), clock.clone(), |_| Ok(())).expect("cluster");
    c.create_pool(CreatePool { name: "gpu".into(), ..CreatePool::default() }).expect("pool");
    let td = r#"{"family": "talk", "containerDefinitions": [{"name": "main", "command": ["talk"]}]}"#;
    c.register_taskdef(td.as_bytes()).expect("task definition");
    let reg = HostRegistration {
        pool: PoolName::new("gpu").unwrap(),
        hostname: "h1".into(),
        gpus: vec![GpuInventory {
            uuid: GpuUuid::new("GPU-0").unwrap(),
            index: 0,
            model: "H100".into(),
            memory_mib: 81_559,
            compute_capability: "9.0".into(),
            max_mps_clients: DEFAULT_MAX_MPS_CLIENTS,
        }],
        mps_available: true,
        emulated: true,
        runtime: Default::default(),
        runtime_version: None,
        plugins: Default::default(),
        platform: Default::default(),
    };
    let host = c.register_host(reg).expect("host").host_id;
    c.host_status(
        &host,
        &HostStatusReport {
            onboarded: true,
            checks: Vec::new(),
            logs_url: None,
            logs_cert_sha256: None,
            ..HostStatusReport::default()
        },
    )
    .expect("heartbeat");
    let run = RunTask {
        task_definition: "talk".into(),
        count: 1,
        pool: "gpu".into(),
        client_token: None,
        ..Default::default()
    };
    let task = c.run_tasks(run).expect("run").tasks.remove(0);
    assert_eq!(task.host_id.as_ref(), Some(&host), "placed on the one host");
    (c, clock, host, task.id.to_string())
}

#[test]
fn the_latest_snapshot_is_kept_and_served_when_the_agent_cannot_be_asked() {
    let (mut c, clock, host, id) = setup();
    let plan = c.logs_plan(&id).unwrap();
    assert!(plan.snapshot.is_none(), "no snapshot before any report");

    c.report_task(&host, &id, report("RUNNING", &["one\n"])).unwrap();
    let plan = c.logs_plan(&id).unwrap();
    let (at, snap) = plan.snapshot.expect("the snapshot");
    assert_eq!((at, snap.text()), (1_000, "one\n".to_string()));
    // The agent never said where it serves logs: the snapshot stands in, and the plan says why.
    let why = plan.agent.expect_err("no agent to ask");
    assert!(why.contains("has not reported where it serves its endpoint"), "{why}");

    // A report that changes nothing else still replaces the snapshot; one that is too big is
    // trimmed to the bound, newest lines kept.
    clock.advance(std::time::Duration::from_secs(30));
    let big = "x".repeat(1000) + "\n";
    let many: Vec<&str> = std::iter::repeat_n(big.as_str(), 40).chain(["last\n"]).collect();
    c.report_task(&host, &id, report("RUNNING", &many)).unwrap();
    let (at, snap) = c.logs_plan(&id).unwrap().snapshot.unwrap();
    assert_eq!(at, 31_000);
    assert!(snap.cost() <= SNAPSHOT_MAX_BYTES, "{}", snap.cost());
    assert_eq!(snap.lines.last().unwrap().text, "last\n");
    assert!(snap.dropped_bytes > 0);

    // The STOPPED report brings the last words, and so does a late one after it.
    c.report_task(&host, &id, report("STOPPED", &["bye\n"])).unwrap();
    assert_eq!(c.logs_plan(&id).unwrap().snapshot.unwrap().1.text(), "bye\n");
    c.report_task(&host, &id, report("STOPPED", &["bye\n", "really\n"])).unwrap();
    assert_eq!(c.logs_plan(&id).unwrap().snapshot.unwrap().1.text(), "bye\nreally\n");

    // Once the agent says where it serves logs, it is asked first.
    c.host_status(
        &host,
        &HostStatusReport {
            onboarded: true,
            checks: Vec::new(),
            logs_url: Some("http://10.0.0.1:7071".into()),
            logs_cert_sha256: None,
            ..HostStatusReport::default()
        },
    )
    .unwrap();
    let url = c.logs_plan(&id).unwrap().agent.expect("the agent's address").url;
    assert_eq!(url, "http://10.0.0.1:7071");
}

#[test]
fn a_report_from_another_host_leaves_the_snapshot_alone_and_unknown_tasks_are_not_found() {
    let (mut c, _clock, host, id) = setup();
    c.report_task(&host, &id, report("RUNNING", &["mine\n"])).unwrap();
    let other = HostId::new("h-someone-else").unwrap();
    assert!(matches!(c.report_task(&other, &id, report("RUNNING", &["theirs\n"])), Err(Error::Forbidden(_))));
    assert_eq!(c.logs_plan(&id).unwrap().snapshot.unwrap().1.text(), "mine\n");
    assert!(matches!(c.logs_plan("t-00000000000000ff"), Err(Error::NotFound { .. })));
}
