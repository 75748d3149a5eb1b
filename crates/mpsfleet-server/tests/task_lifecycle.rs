//! The task lifecycle as the cluster applies it to agents' reports: statuses only move
//! forward, and a STOPPED task never comes back to life.

use mpsfleet_core::clock::ManualClock;
use mpsfleet_server::cluster::Cluster;
use mpsfleet_server::error::ApiError;
use mpsfleet_store::MemoryStore;
use mpsfleet_types::api::HostStatusReport;
use mpsfleet_types::*;
use std::sync::Arc;

/// A report as an agent sends it (parsed, so that optional fields keep their defaults).
fn report(status: &str) -> TaskStateReport {
    serde_json::from_value(serde_json::json!({ "lastStatus": status })).expect("a report")
}

#[test]
fn reports_move_a_task_forward_only_and_a_stopped_task_stays_stopped() {
    let clock = Arc::new(ManualClock::new(1_000));
    let mut c = Cluster::load(Arc::new(MemoryStore::new()), clock, |_| Ok(())).expect("cluster");
    c.create_pool(CreatePool { name: "gpu".into(), ..CreatePool::default() }).expect("pool");
    let td = r#"{"family": "serve", "containerDefinitions": [{"name": "main", "command": ["serve"],
        "resourceRequirements": [{"type": "GPU", "value": "1"}]}]}"#;
    c.register_taskdef(td.as_bytes()).expect("task definition");
    let gpu = GpuInventory {
        uuid: GpuUuid::new("GPU-0").unwrap(),
        index: 0,
        model: "H100".into(),
        memory_mib: 81_559,
        compute_capability: "9.0".into(),
        max_mps_clients: DEFAULT_MAX_MPS_CLIENTS,
    };
    let reg = HostRegistration {
        pool: PoolName::new("gpu").unwrap(),
        hostname: "h1".into(),
        gpus: vec![gpu],
        mps_available: true,
        emulated: true,
        runtime: Default::default(),
        runtime_version: None,
    };
    let host = c.register_host(reg).expect("host").host_id;
    let beat = HostStatusReport { onboarded: true, checks: Vec::new(), logs_url: None };
    c.host_status(&host, beat).expect("heartbeat");
    let run = RunTask { task_definition: "serve".into(), count: 1, pool: "gpu".into() };
    let task = c.run_tasks(run).expect("run").tasks.remove(0);
    let id = task.id.to_string();
    assert_eq!(task.host_id.as_ref(), Some(&host), "placed on the one host");

    assert_eq!(c.report_task(&host, &id, report("RUNNING")).unwrap().last_status, TaskStatus::Running);
    match c.report_task(&host, &id, report("PENDING")) {
        Err(ApiError::Conflict(m)) => assert!(m.contains("RUNNING cannot go back to PENDING"), "{m}"),
        other => panic!("a report of an earlier status was not refused: {other:?}"),
    }
    assert_eq!(c.task(&id).unwrap().last_status, TaskStatus::Running, "a refused report changed the task");

    let stopped = c.report_task(&host, &id, report("STOPPED")).unwrap();
    assert_eq!(stopped.last_status, TaskStatus::Stopped);
    // A late report (sent before the exit, delivered after) changes nothing.
    let late = c.report_task(&host, &id, report("RUNNING")).unwrap();
    assert_eq!((late.last_status, late.desired_status), (TaskStatus::Stopped, TaskStatus::Stopped));
    assert_eq!(c.task(&id).unwrap(), stopped, "a stopped task came back to life");
}
