//! The task lifecycle as the cluster applies it to agents' reports: statuses only move
//! forward, and a STOPPED task never comes back to life.

use mpsfleet_core::clock::ManualClock;
use mpsfleet_server::cluster::Cluster;
use mpsfleet_server::cluster::Error;
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
        plugins: Default::default(),
        platform: Default::default(),
    };
    let host = c.register_host(reg).expect("host").host_id;
    let beat = HostStatusReport { onboarded: true, ..Default::default() };
    c.host_status(&host, &beat).expect("heartbeat");
    let run = RunTask {
        task_definition: "serve".into(),
        count: 1,
        pool: "gpu".into(),
        client_token: None,
        ..Default::default()
    };
    let task = c.run_tasks(run).expect("run").tasks.remove(0);
    let id = task.id.to_string();
    assert_eq!(task.host_id.as_ref(), Some(&host), "placed on the one host");

    assert_eq!(c.report_task(&host, &id, report("RUNNING")).unwrap().last_status, TaskStatus::Running);
    match c.report_task(&host, &id, report("PENDING")) {
        Err(Error::Conflict(m)) => assert!(m.contains("RUNNING cannot go back to PENDING"), "{m}"),
        other => panic!("a report of an earlier status was not refused: {other:?}"),
    }
    assert_eq!(
        c.read().task(&id).unwrap().last_status,
        TaskStatus::Running,
        "a refused report changed the task"
    );

    let stopped = c.report_task(&host, &id, report("STOPPED")).unwrap();
    assert_eq!(stopped.last_status, TaskStatus::Stopped);
    // A late report (sent before the exit, delivered after) changes nothing.
    let late = c.report_task(&host, &id, report("RUNNING")).unwrap();
    assert_eq!((late.last_status, late.desired_status), (TaskStatus::Stopped, TaskStatus::Stopped));
    assert_eq!(c.read().task(&id).unwrap(), stopped, "a stopped task came back to life");
}

/// Static host ports are a placement resource and image tasks need a container host, as in
/// ECS: two tasks holding tcp/8080 land on different Docker hosts (never on the process host),
/// a third waits naming the port, takes the port once a holder stops, and a restart that loads
/// the placed tasks accounts their ports again.
#[test]
fn static_host_ports_keep_tasks_on_different_container_hosts() {
    let clock = Arc::new(ManualClock::new(1_000));
    let store = Arc::new(MemoryStore::new());
    let mut c = Cluster::load(store.clone(), clock.clone(), |_| Ok(())).expect("cluster");
    c.create_pool(CreatePool { name: "gpu".into(), ..CreatePool::default() }).expect("pool");
    let td = r#"{"family": "web", "containerDefinitions": [{"name": "main", "image": "busybox",
        "portMappings": [{"containerPort": 80, "hostPort": 8080}]}]}"#;
    c.register_taskdef(td.as_bytes()).expect("task definition");
    let register = |c: &mut Cluster, name: &str, runtime: RuntimeKind| {
        let reg = HostRegistration {
            pool: PoolName::new("gpu").unwrap(),
            hostname: name.into(),
            gpus: Vec::new(),
            mps_available: false,
            emulated: true,
            runtime,
            runtime_version: None,
            plugins: Default::default(),
            platform: Default::default(),
        };
        let host = c.register_host(reg).expect("host").host_id;
        let beat = HostStatusReport { onboarded: true, ..Default::default() };
        c.host_status(&host, &beat).expect("heartbeat");
        host
    };
    // Registered first, so it would be the first choice of a task that runs no image.
    let process = register(&mut c, "p1", RuntimeKind::Process);
    let docker = [register(&mut c, "d1", RuntimeKind::Docker), register(&mut c, "d2", RuntimeKind::Docker)];
    let run = || RunTask {
        task_definition: "web".into(),
        count: 1,
        pool: "gpu".into(),
        client_token: None,
        ..Default::default()
    };

    let a = c.run_tasks(run()).expect("run").tasks.remove(0);
    let b = c.run_tasks(run()).expect("run").tasks.remove(0);
    let hosts = [a.host_id.clone().expect("a placed"), b.host_id.clone().expect("b placed")];
    assert_ne!(hosts[0], hosts[1], "two tasks hold tcp/8080 on one host");
    assert!(hosts.iter().all(|h| docker.contains(h) && *h != process), "{hosts:?}");

    let waiting = c.run_tasks(run()).expect("run").tasks.remove(0);
    assert_eq!(waiting.host_id, None);
    let reason = waiting.pending_reason.clone().unwrap_or_default();
    assert!(reason.starts_with("no host in pool gpu that fits has host port tcp/8080 free"), "{reason}");

    // A restart loads the placed tasks: their ports are held again.
    let mut c = Cluster::load(store, clock, |_| Ok(())).expect("cluster reloaded");
    let after = c.run_tasks(run()).expect("run").tasks.remove(0);
    assert_eq!(after.host_id, None, "a restart forgot the ports in use");

    c.stop_task(&a.id.to_string(), None).expect("stop");
    c.report_task(&hosts[0], &a.id.to_string(), report("STOPPED")).expect("report");
    // The freed port asks for the pool's placement, which the next pass of the work runs.
    assert_eq!(
        c.read().task(&waiting.id.to_string()).unwrap().host_id,
        None,
        "placed inline, not by the controller"
    );
    c.run_work();
    let placed = c.read().task(&waiting.id.to_string()).unwrap();
    assert_eq!(placed.host_id.as_ref(), Some(&hosts[0]), "the freed port was not reused: {placed:?}");
    assert_eq!(placed.pending_reason, None);
    assert_eq!(
        c.read().task(&after.id.to_string()).unwrap().host_id,
        None,
        "only one task may take the port"
    );
}
