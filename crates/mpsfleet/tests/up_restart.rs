//! `mpsfleet up`, Ctrl-C, `up` again on the same data dir, as a new user does it: a clean stop
//! and start is a non-event (the same hosts, no incident, no replacement, services back to
//! their count, standalone tasks STOPPED saying why), and a real failure afterwards is still an
//! incident. The real binary, the real MPS daemon, tasks as processes.

mod common;

use common::up::Up;
use common::*;
use mpsfleet_client::{Client, TaskQuery};
use mpsfleet_types::*;
use std::collections::BTreeSet;
use std::process::Command;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(90);

async fn active_hosts(admin: &Client) -> Vec<HostView> {
    eventually(WAIT, "two ACTIVE hosts", || async {
        admin
            .list_hosts(None)
            .await
            .ok()
            .filter(|h| h.len() == 2 && h.iter().all(|h| h.status == HostStatus::Active))
    })
    .await
}

async fn running(admin: &Client, service: Option<&str>, n: usize) -> Vec<Task> {
    let q = TaskQuery { service: service.map(String::from), live: true, ..Default::default() };
    eventually(WAIT, &format!("{n} RUNNING tasks of {service:?}"), || async {
        let ts = admin.list_tasks(&q).await.ok()?;
        (ts.len() == n && ts.iter().all(|t| t.last_status == TaskStatus::Running)).then_some(ts)
    })
    .await
}

#[test]
fn a_restarted_up_is_a_non_event_and_a_real_failure_after_it_is_not() {
    if mps_control().is_none() {
        eprintln!("skipped: the real nvidia-cuda-mps-control is not installed (bash scripts/install-mps.sh)");
        assert!(!on_ci(), "CI installs the MPS daemon");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();

    // The first run: a service of two replicas and one standalone task.
    let up = Up::start(dir.path(), &data, 2);
    let (hosts, first_replicas, solo) = rt.block_on(async {
        let hosts = active_hosts(&up.admin).await;
        up.admin.register_taskdef(mps_taskdef("web", 8192)).await.unwrap();
        up.admin.register_taskdef(mps_taskdef("solo", 1024)).await.unwrap();
        let create = CreateService {
            name: "web".into(),
            pool: "default".into(),
            task_definition: "web".into(),
            desired_count: 2,
            ..Default::default()
        };
        up.admin.create_service(&create).await.unwrap();
        let run = RunTask {
            task_definition: "solo".into(),
            count: 1,
            pool: "default".into(),
            client_token: None,
            ..Default::default()
        };
        let solo = up.admin.run_task(&run).await.unwrap().tasks[0].id;
        let replicas = running(&up.admin, Some("web"), 2).await;
        running(&up.admin, None, 3).await;
        (hosts, replicas, solo)
    });
    let ids = |hs: &[HostView]| hs.iter().map(|h| h.id.clone()).collect::<BTreeSet<_>>();
    let said = up.interrupt();
    assert!(said.iter().any(|l| l.contains("3 task(s) recorded as stopped with up")), "{said:?}");
    let left = processes_mentioning(&data.display().to_string());
    assert!(left.is_empty(), "processes left behind: {left:?}");

    // The second run, on the same data dir: the same hosts come back, nothing else happens.
    let up = Up::start(dir.path(), &data, 2);
    rt.block_on(async {
        let again = active_hosts(&up.admin).await;
        assert_eq!(ids(&again), ids(&hosts), "the same hosts");
        let replicas = running(&up.admin, Some("web"), 2).await;
        assert!(replicas.iter().all(|t| !first_replicas.iter().any(|f| f.id == t.id)), "new replicas");
        // Past every grace a host that never came back would have run out of.
        tokio::time::sleep(Duration::from_secs(20)).await;
        let all = up.admin.list_hosts(None).await.unwrap();
        assert_eq!(ids(&all), ids(&hosts), "no other host, none DEREGISTERED: {all:#?}");
        assert!(
            all.iter().all(|h| h.status == HostStatus::Active && !h.hostname.starts_with("inc-")),
            "{all:#?}"
        );
        assert_eq!(up.admin.list_incidents().await.unwrap().len(), 0, "a clean restart opened an incident");
        running(&up.admin, Some("web"), 2).await;
        let solo = up.admin.describe_task(&solo.to_string()).await.unwrap();
        assert_eq!(solo.last_status, TaskStatus::Stopped);
        assert_eq!(solo.stopped_reason.as_deref(), Some("stopped with up"), "{solo:#?}");
        for f in &first_replicas {
            let t = up.admin.describe_task(&f.id.to_string()).await.unwrap();
            assert_eq!(
                (t.last_status, t.stopped_reason.as_deref()),
                (TaskStatus::Stopped, Some("stopped with up"))
            );
        }

        // A real failure after the restart: one host's agent dies. It is an incident.
        let victim = &hosts[0];
        let pid =
            std::fs::read_to_string(data.join("hosts").join(&victim.hostname).join("agent.pid")).unwrap();
        let pid = pid.split_whitespace().next().unwrap();
        assert!(Command::new("kill").args(["-KILL", pid]).status().unwrap().success());
        let incidents = eventually(WAIT, "an incident for the dead agent", || async {
            let list = up.admin.list_incidents().await.ok()?;
            (!list.is_empty()).then_some(list)
        })
        .await;
        assert_eq!(incidents[0].incident.host_id, victim.id, "{incidents:#?}");
    });
    drop(up);
}

/// `server` stopped cleanly (SIGTERM) and started again on its data dir and address, with its
/// agents running all along: they reconnect and keep their tasks, and nothing is opened.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_restarted_under_running_agents_is_a_non_event() {
    let Some(mps) = mps_control() else {
        eprintln!("skipped: the real nvidia-cuda-mps-control is not installed (bash scripts/install-mps.sh)");
        assert!(!on_ci(), "CI installs the MPS daemon");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let mut server = Server::start(&dir.path().join("server"));
    let admin = server.admin();
    create_pool(&admin, "gpu").await;
    let _agents: Vec<Agent> =
        (0..2).map(|i| Agent::start(&server, &dir.path().join(format!("a{i}")), 2, &mps, &[])).collect();
    let hosts = active_hosts(&admin).await;
    admin.register_taskdef(mps_taskdef("web", 8192)).await.unwrap();
    let create = CreateService {
        name: "web".into(),
        pool: "gpu".into(),
        task_definition: "web".into(),
        desired_count: 2,
        ..Default::default()
    };
    admin.create_service(&create).await.unwrap();
    let before = running(&admin, Some("web"), 2).await;

    let addr = server.addr();
    assert!(Command::new("kill").args(["-TERM", &server.child.id().to_string()]).status().unwrap().success());
    let status = server.child.wait().unwrap();
    assert!(status.success(), "a clean stop: {status}");
    tokio::time::sleep(Duration::from_secs(3)).await;
    let server = Server::start_on(&dir.path().join("server"), &addr);
    let admin = server.admin();
    // Past the heartbeat grace the server counts from its start.
    tokio::time::sleep(Duration::from_secs(20)).await;
    let after = running(&admin, Some("web"), 2).await;
    let ids = |ts: &[Task]| ts.iter().map(|t| t.id).collect::<BTreeSet<_>>();
    assert_eq!(ids(&after), ids(&before), "the same tasks run on");
    let all = admin.list_hosts(None).await.unwrap();
    assert_eq!(all.len(), hosts.len());
    assert!(
        all.iter().all(|h| h.status == HostStatus::Active && h.health_status == HealthStatus::Ok),
        "{all:#?}"
    );
    assert_eq!(admin.list_incidents().await.unwrap().len(), 0, "a clean server restart opened an incident");
}

/// The README's order: `up` before any Docker engine exists (process hosts), Ctrl-C, the
/// private engine started, `up` again on the same data dir: the same hosts come back running
/// containers, the banner and `host list` agree, and an image task runs. Then the engine gone
/// again: back to processes.
#[test]
fn up_brings_its_hosts_back_with_the_runtime_the_machine_has_now() {
    if mps_control().is_none() {
        eprintln!("skipped: the real nvidia-cuda-mps-control is not installed (bash scripts/install-mps.sh)");
        assert!(!on_ci(), "CI installs the MPS daemon");
        return;
    }
    let docker = docker_env();
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let runtimes = |hs: &[HostView]| hs.iter().map(|h| h.runtime.as_str()).collect::<BTreeSet<_>>();

    let up = Up::start(dir.path(), &data, 2);
    let hosts = rt.block_on(active_hosts(&up.admin));
    assert_eq!(runtimes(&hosts), BTreeSet::from(["process"]), "{hosts:#?}");
    // A task that needs a container runtime (its `memory`), in a pool of process hosts whose
    // provider launches process hosts: `--wait` gives up at once, naming the field.
    let def = serde_json::json!({"family": "img", "containerDefinitions": [{
        "name": "main", "image": docker.image, "command": ["sleep", "600"], "memory": 64
    }]});
    rt.block_on(up.admin.register_taskdef(def.to_string().into_bytes())).unwrap();
    let started = tokio::time::Instant::now();
    let out = up.cli(&[
        "service",
        "create",
        "web",
        "--taskdef",
        "img:1",
        "--desired",
        "2",
        "--wait",
        "--timeout",
        "120",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(started.elapsed() < Duration::from_secs(30), "--wait did not give up at once: {err}");
    assert!(
        err.contains("can never be placed as the pool is")
            && err.contains("containerDefinitions[0].memory (only a container runtime honours it)")
            && err.contains("nothing places the task until such a host joins"),
        "{err}"
    );
    up.interrupt();

    let engine = format!("unix://{}", docker.socket.display());
    let up = Up::start_on_engine(dir.path(), &data, 2, &[], &engine);
    let said = up.banner.clone();
    rt.block_on(async {
        let again = active_hosts(&up.admin).await;
        let ids = |hs: &[HostView]| hs.iter().map(|h| h.id.clone()).collect::<BTreeSet<_>>();
        assert_eq!(ids(&again), ids(&hosts), "the same hosts");
        assert_eq!(runtimes(&again), BTreeSet::from(["docker"]), "{again:#?}");
        for h in &hosts {
            assert!(
                said.iter()
                    .any(|l| l
                        .contains(&format!("host {} ({}) now runs tasks as containers", h.id, h.hostname))),
                "{said:?}"
            );
        }
        // The service that could not be placed runs now, as containers.
        let replicas = running(&up.admin, Some("web"), 2).await;
        assert!(
            replicas.iter().all(|t| !t.unplaceable && t.containers.iter().any(|c| c.runtime_id.is_some())),
            "{replicas:#?}"
        );
    });
    assert!(said.iter().any(|l| l.starts_with("containers: Docker Engine")), "{said:?}");
    up.interrupt();

    // The engine gone again (another socket): process hosts once more, as the banner says.
    let up = Up::start(dir.path(), &data, 2);
    let said = up.banner.clone();
    rt.block_on(async {
        let again = active_hosts(&up.admin).await;
        assert_eq!(runtimes(&again), BTreeSet::from(["process"]), "{again:#?}");
    });
    assert!(said.iter().any(|l| l.starts_with("containers: none")), "{said:?}");
    assert!(said.iter().any(|l| l.contains("now runs tasks as processes")), "{said:?}");
    drop(up);
}

/// SIGTERM (a service manager's stop, `kill`) stops `up` as Ctrl-C does: hosts, tasks and MPS
/// daemons stopped, nothing of the data dir left running.
#[test]
fn sigterm_stops_up_as_ctrl_c_does() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let up = Up::start_with(dir.path(), &data, 2, &["--dns-listen", "off"]);
    rt.block_on(active_hosts(&up.admin));
    let printed = up.stop_with("-TERM");
    assert!(printed.iter().any(|l| l == "stopped"), "{printed:?}");
    let left: Vec<u32> = mpsfleet_proc::processes()
        .into_iter()
        .map(|(pid, _)| pid)
        .filter(|&pid| mpsfleet_proc::mentions(pid, &data))
        .collect();
    assert!(left.is_empty(), "processes of the data dir still run: {left:?}");
}
