//! Recovery with the real MPS daemon: hosts started by the server's local provider, a daemon
//! killed for good, and what the pool's ownership mode makes of it.

mod common;

// The fault `mpsfleet bench recovery` injects: a daemon killed again after each local restart.
#[path = "../src/bench/kill.rs"]
mod kill;
use kill::keep_killing;

use common::*;
use mpsfleet_client::{Client, TaskQuery};
use mpsfleet_types::policy::*;
use mpsfleet_types::*;
use std::path::{Path, PathBuf};
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(40);

/// Fast detection for tests: probes every 300 ms with a 200 ms timeout, IMPAIRED after 2
/// failures; `restarts` local daemon restarts.
fn agent_args(mps: &Path, restarts: u32) -> String {
    format!(
        "--emulate-gpus H200:143771:2 --mps-control {} --mps-max-restarts {restarts} --mps-probe-interval-ms 300 \
         --mps-probe-timeout-ms 200 --mps-failure-threshold 2 --heartbeat-ms 200 --stop-tasks-on-exit",
        mps.display()
    )
}

/// A server whose local provider starts `hosts` hosts in pool `gpu`. Stops every process it
/// started when dropped.
struct Fleet {
    dir: tempfile::TempDir,
    server: Server,
    admin: Client,
    agent_args: String,
}

impl Drop for Fleet {
    fn drop(&mut self) {
        stop_processes_mentioning(&self.dir.path().display().to_string());
    }
}

impl Fleet {
    fn host_dir(&self, hostname: &str) -> PathBuf {
        self.dir.path().join("server/hosts").join(hostname)
    }

    /// The CLI against this fleet's server: (exit code, stdout, stderr).
    fn cli(&self, args: &[&str]) -> (Option<i32>, String, String) {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_mpsfleet"))
            .args(args)
            .args(["--server", &self.server.url, "--token", &self.server.admin_token()])
            .args(["--ca-file", &self.server.ca_file()])
            .env("HOME", self.dir.path())
            .output()
            .unwrap();
        let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
        (out.status.code(), text(&out.stdout), text(&out.stderr))
    }
}

async fn fleet(mode: OwnershipMode, hosts: u32, restarts: u32) -> Option<Fleet> {
    let health = HealthPolicy {
        agent_heartbeat_grace_ms: 3_000,
        mps_probe_interval_ms: 1_000,
        mps_probe_timeout_ms: 200,
        mps_failure_threshold: 2,
        local_daemon_restarts: restarts,
        toleration_ms: 500,
    };
    fleet_with(mode, hosts, health).await
}

async fn fleet_with(mode: OwnershipMode, hosts: u32, health: HealthPolicy) -> Option<Fleet> {
    let mps = mps_control()?;
    let dir = tempfile::tempdir().unwrap();
    let args = agent_args(&mps, health.local_daemon_restarts);
    let server =
        Server::start_with(&dir.path().join("server"), "127.0.0.1:0", &["--local-agent-args", &args]);
    let admin = server.admin();
    admin
        .create_pool(&CreatePool {
            name: "gpu".into(),
            mode: Some(mode),
            health_policy: Some(health),
            provider: Some(Provider::local(hosts)),
            ..Default::default()
        })
        .await
        .unwrap();
    let fleet = Fleet { dir, server, admin, agent_args: args };
    eventually(WAIT, "the provider's hosts to be ACTIVE", || async {
        let hs = fleet.admin.list_hosts(None).await.ok()?;
        (hs.len() == hosts as usize && hs.iter().all(|h| h.status == HostStatus::Active)).then_some(())
    })
    .await;
    Some(fleet)
}

async fn service_of(admin: &Client, name: &str, count: u32) -> Vec<Task> {
    admin.register_taskdef(mps_taskdef(name, 1024)).await.unwrap();
    admin
        .create_service(&CreateService {
            name: name.into(),
            pool: "gpu".into(),
            task_definition: name.into(),
            desired_count: count,
            resumption: None,
            deployment_configuration: None,
            client_token: None,
            ..Default::default()
        })
        .await
        .unwrap();
    running(admin, name, count).await
}

/// Waits until the service has `count` RUNNING tasks and returns them.
async fn running(admin: &Client, service: &str, count: u32) -> Vec<Task> {
    let q = TaskQuery { service: Some(service.into()), ..Default::default() };
    eventually(WAIT, &format!("{count} RUNNING tasks of {service}"), || async {
        let ts: Vec<Task> = admin
            .list_tasks(&q)
            .await
            .ok()?
            .into_iter()
            .filter(|t| t.last_status == TaskStatus::Running && t.desired_status == TaskStatus::Running)
            .collect();
        (ts.len() == count as usize).then_some(ts)
    })
    .await
}

/// Kills the MPS daemon of the task's GPU (its pid is in the daemon record).
async fn kill_daemon_of(fleet: &Fleet, task: &Task) -> HostView {
    signal_daemon_of(fleet, task, "-9").await
}

/// The pid of the MPS daemon of the task's GPU, from its daemon record (None while there is
/// none, e.g. during a restart).
async fn daemon_pid_of(fleet: &Fleet, task: &Task) -> (HostView, Option<u64>) {
    let host = fleet.admin.describe_host(task.host_id.as_ref().unwrap().as_str()).await.unwrap();
    let index = host.gpus.iter().find(|g| g.gpu_id == task.gpu_ids[0]).unwrap().index;
    let record = fleet.host_dir(&host.hostname).join(format!("mps/log/{index}/daemon.json"));
    let pid = std::fs::read(&record)
        .ok()
        .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
        .and_then(|v| v["pid"].as_u64());
    (host, pid)
}

/// Sends `signal` to the MPS daemon of the task's GPU.
async fn signal_daemon_of(fleet: &Fleet, task: &Task, signal: &str) -> HostView {
    let (host, pid) = daemon_pid_of(fleet, task).await;
    let pid = pid.expect("a daemon record");
    assert!(std::process::Command::new("kill").args([signal, &pid.to_string()]).status().unwrap().success());
    host
}

async fn incident_of(admin: &Client, host: &HostId) -> IncidentView {
    eventually(WAIT, &format!("an incident for host {host}"), || async {
        admin.list_incidents().await.ok()?.into_iter().find(|i| &i.incident.host_id == host)
    })
    .await
}

/// Waits for the incident to be resolved; on timeout, fails with the incident as it stands.
async fn resolved(admin: &Client, id: &str) -> IncidentView {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let i = admin.describe_incident(id).await.unwrap();
        if i.incident.state == IncidentState::Resolved {
            return i;
        }
        if tokio::time::Instant::now() > deadline {
            let tasks = admin.list_tasks(&TaskQuery::default()).await.unwrap();
            panic!(
                "incident {id} not resolved: {}\ntasks: {}",
                serde_json::to_string_pretty(&i).unwrap(),
                serde_json::to_string_pretty(&tasks).unwrap()
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn steps(i: &Incident) -> Vec<Step> {
    i.timeline.iter().map(|t| t.step).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn managed_pool_replaces_a_host_whose_daemon_died_for_good() {
    let Some(fleet) = fleet(OwnershipMode::Managed, 2, 0).await else { return };
    let admin = &fleet.admin;
    let tasks = service_of(admin, "web", 2).await;
    let host = kill_daemon_of(&fleet, &tasks[0]).await;

    let opened = incident_of(admin, &host.id).await;
    assert_eq!(opened.incident.owner, IncidentOwner::Mpsfleet);
    assert_eq!(opened.incident.trigger.check, "MPS_DAEMON");
    assert!(opened.incident.trigger.reason.contains("daemon exited"), "{:?}", opened.incident.trigger);
    let id = opened.incident.id.clone();
    let done = resolved(admin, &id).await;
    let s = steps(&done.incident);
    for step in [
        Step::Detected,
        Step::Decided,
        Step::Cordoned,
        Step::DrainStarted,
        Step::ReplacementRequested,
        Step::ReplacementReady,
        Step::TasksRescheduled,
        Step::OldHostTerminated,
        Step::TasksRunningAgain,
        Step::Resolved,
    ] {
        assert!(s.contains(&step), "{step:?} missing from {s:?}");
    }
    assert!(
        done.durations.detect_ms.is_some() && done.durations.recover_ms.is_some(),
        "{:?}",
        done.durations
    );
    println!("durations: {:?}", done.durations);

    // The service is back at its count, on healthy hosts; the old host is gone.
    let now = running(admin, "web", 2).await;
    assert!(now.iter().all(|t| t.host_id.as_ref() != Some(&host.id)), "a replica still runs on the bad host");
    let old = admin.describe_host(host.id.as_str()).await.unwrap();
    assert_eq!(old.status, HostStatus::Deregistered);
    let replacement = mpsfleet_types::Incident::clone(&done.incident).id + "-r";
    assert!(admin
        .list_hosts(None)
        .await
        .unwrap()
        .iter()
        .any(|h| h.hostname == replacement && h.status == HostStatus::Active));
    let moved = &done.incident.affected_tasks;
    assert!(moved.iter().any(|a| a.task_id == tasks[0].id && a.replacement.is_some()), "{moved:?}");
    assert!(
        processes_mentioning(&fleet.host_dir(&host.hostname).display().to_string()).is_empty(),
        "the old host's agent or daemons still run"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn self_managed_pool_reports_and_waits_for_the_operator() {
    let Some(fleet) = fleet(OwnershipMode::SelfManaged, 2, 0).await else { return };
    let admin = &fleet.admin;
    let tasks = service_of(admin, "web", 2).await;
    let host = kill_daemon_of(&fleet, &tasks[0]).await;

    let opened = incident_of(admin, &host.id).await;
    assert_eq!(opened.incident.owner, IncidentOwner::Operator);
    assert_eq!(opened.incident.state, IncidentState::Open);
    let view = admin.describe_host(host.id.as_str()).await.unwrap();
    assert_eq!(view.health_status, HealthStatus::Impaired);
    assert!(!view.cordoned && view.status == HostStatus::Active, "nothing is done without the operator");

    // New work avoids the impaired host; the tasks on it are not moved.
    admin.register_taskdef(mps_taskdef("batch", 1024)).await.unwrap();
    let out = admin
        .run_task(&RunTask {
            task_definition: "batch".into(),
            count: 3,
            pool: "gpu".into(),
            client_token: None,
            ..Default::default()
        })
        .await
        .unwrap();
    assert!(out.tasks.iter().all(|t| t.host_id.as_ref() != Some(&host.id)), "placed on an impaired host");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let still = admin.describe_task(&tasks[0].id.to_string()).await.unwrap();
    assert_eq!((still.desired_status, still.host_id.as_ref()), (TaskStatus::Running, Some(&host.id)));
    assert_eq!(
        admin.describe_incident(&opened.incident.id).await.unwrap().incident.state,
        IncidentState::Open
    );

    // The operator replaces the host: the managed steps run, recorded on the same incident.
    let acted = admin.host_action(host.id.as_str(), "replace").await.unwrap();
    assert_eq!(acted.incident.id, opened.incident.id);
    assert_eq!(acted.incident.operator_requested, Some(OperatorAction::Replace));
    let id = opened.incident.id.clone();
    let done = resolved(admin, &id).await;
    assert!(steps(&done.incident).contains(&Step::OldHostTerminated), "{:?}", steps(&done.incident));
    let now = running(admin, "web", 2).await;
    assert!(now.iter().all(|t| t.host_id.as_ref() != Some(&host.id)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daemon_restarted_by_local_repair_opens_no_incident() {
    let Some(fleet) = fleet(OwnershipMode::Managed, 1, 3).await else { return };
    let admin = &fleet.admin;
    let tasks = service_of(admin, "web", 1).await;
    let (_, before) = daemon_pid_of(&fleet, &tasks[0]).await;
    let host = kill_daemon_of(&fleet, &tasks[0]).await;
    // The kill was seen: the agent started a new daemon, and it answers.
    eventually(WAIT, "a new daemon answering", || async {
        let (view, pid) = daemon_pid_of(&fleet, &tasks[0]).await;
        (pid.is_some() && pid != before && view.health_status == HealthStatus::Ok).then_some(())
    })
    .await;
    // The agent restarts the daemon at once; the check never stays IMPAIRED for the toleration.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let view = admin.describe_host(host.id.as_str()).await.unwrap();
    assert_eq!(view.health_status, HealthStatus::Ok, "{:?}", view.checks);
    assert!(admin.list_incidents().await.unwrap().is_empty(), "a repaired failure opened an incident");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_daemon_replaced_by_local_repair_opens_no_incident() {
    // The default toleration (2 s) and probe timeout (3 s): asking a hung daemon to `quit`
    // would alone outlast the toleration; the agent kills it instead, and starts and probes a
    // new one at once.
    let health =
        HealthPolicy { mps_probe_interval_ms: 4_000, mps_failure_threshold: 2, ..Default::default() };
    let toleration = health.toleration_ms;
    let Some(fleet) = fleet_with(OwnershipMode::Managed, 1, health).await else { return };
    let admin = &fleet.admin;
    let tasks = service_of(admin, "web", 1).await;
    let (_, before) = daemon_pid_of(&fleet, &tasks[0]).await;
    let host = signal_daemon_of(&fleet, &tasks[0], "-STOP").await;
    eventually(WAIT, "a new daemon answering", || async {
        let (view, pid) = daemon_pid_of(&fleet, &tasks[0]).await;
        (pid.is_some() && pid != before && view.health_status == HealthStatus::Ok).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_millis(toleration + 1_000)).await;
    let view = admin.describe_host(host.id.as_str()).await.unwrap();
    assert_eq!(view.health_status, HealthStatus::Ok, "{:?}", view.checks);
    assert!(admin.list_incidents().await.unwrap().is_empty(), "a repaired hang opened an incident");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_killed_mid_remediation_finishes_it_exactly_once() {
    let Some(mut fleet) = fleet(OwnershipMode::Managed, 2, 0).await else { return };
    let tasks = service_of(&fleet.admin, "web", 2).await;
    let host = kill_daemon_of(&fleet, &tasks[0]).await;
    let admin = fleet.admin.clone();
    let opened = eventually(WAIT, "remediation to start", || async {
        admin.list_incidents().await.ok()?.into_iter().find(|i| {
            i.incident.host_id == host.id && i.incident.timeline.iter().any(|t| t.step == Step::Cordoned)
        })
    })
    .await;

    let listen = fleet.server.addr();
    let data = fleet.server.data_dir.clone();
    fleet.server.kill9();
    let args = fleet.agent_args.clone();
    fleet.server = Server::start_with(&data, &listen, &["--local-agent-args", &args]);
    let admin = fleet.server.admin();
    let done = resolved(&admin, &opened.incident.id).await;

    for step in
        [Step::Decided, Step::Cordoned, Step::ReplacementRequested, Step::OldHostTerminated, Step::Resolved]
    {
        let n = done.incident.timeline.iter().filter(|t| t.step == step).count();
        assert_eq!(n, 1, "{step:?} recorded {n} times: {:?}", steps(&done.incident));
    }
    let hosts = admin.list_hosts(None).await.unwrap();
    let replacements = hosts.iter().filter(|h| h.hostname == format!("{}-r", done.incident.id)).count();
    assert_eq!(replacements, 1, "{hosts:?}");
    assert_eq!(
        hosts.iter().filter(|h| h.status == HostStatus::Active).count(),
        2,
        "the pool is back at its size"
    );
    let now = running(&admin, "web", 2).await;
    assert!(now.iter().all(|t| t.host_id.as_ref() != Some(&host.id)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_daemon_is_detected_through_the_probe_timeout() {
    let Some(fleet) = fleet(OwnershipMode::SelfManaged, 1, 0).await else { return };
    let tasks = service_of(&fleet.admin, "web", 1).await;
    let host = signal_daemon_of(&fleet, &tasks[0], "-STOP").await;
    let opened = incident_of(&fleet.admin, &host.id).await;
    signal_daemon_of(&fleet, &tasks[0], "-CONT").await;
    assert_eq!(opened.incident.trigger.check, "MPS_DAEMON");
    assert!(
        opened.incident.trigger.reason.contains("timed out after 200ms"),
        "{:?}",
        opened.incident.trigger
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_storm_breaker_lets_one_of_three_failed_hosts_be_replaced() {
    let Some(fleet) = fleet(OwnershipMode::Managed, 5, 0).await else { return };
    let admin = &fleet.admin;
    let tasks = service_of(admin, "web", 5).await;
    let mut by_host: Vec<&Task> = Vec::new();
    for t in &tasks {
        if by_host.iter().all(|o| o.host_id != t.host_id) {
            by_host.push(t);
        }
    }
    assert_eq!(by_host.len(), 5, "replicas spread over the five hosts");
    let mut failed = Vec::new();
    for t in &by_host[..3] {
        failed.push(kill_daemon_of(&fleet, t).await.id);
    }
    let deadline = tokio::time::Instant::now() + WAIT;
    let incidents = loop {
        let list = admin.list_incidents().await.unwrap();
        let resolved = list.iter().filter(|i| i.incident.state == IncidentState::Resolved).count();
        let blocked =
            list.iter().filter(|i| matches!(i.incident.state, IncidentState::Blocked { .. })).count();
        if list.len() == 3 && resolved == 1 && blocked == 2 {
            break list;
        }
        if tokio::time::Instant::now() > deadline {
            let states: Vec<_> = list
                .iter()
                .map(|i| {
                    (
                        &i.incident.state,
                        i.incident
                            .timeline
                            .iter()
                            .map(|t| (t.at_ms, t.step, t.detail.clone()))
                            .collect::<Vec<_>>(),
                    )
                })
                .collect();
            panic!("expected one resolved and two blocked incidents, got {states:?}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    for i in &incidents {
        assert!(failed.contains(&i.incident.host_id));
        if let IncidentState::Blocked { reason } = &i.incident.state {
            assert!(reason.contains("storm breaker"), "{reason}");
            assert!(
                !steps(&i.incident).contains(&Step::ReplacementRequested),
                "a blocked incident replaced its host"
            );
        }
    }
    let replacements =
        admin.list_hosts(None).await.unwrap().iter().filter(|h| h.hostname.ends_with("-r")).count();
    assert_eq!(replacements, 1, "the breaker allows one replacement");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fenced_services_wait_for_termination_and_restart_services_do_not() {
    let Some(fleet) = fleet(OwnershipMode::Managed, 2, 0).await else { return };
    let admin = &fleet.admin;
    for (name, resumption) in
        [("fenced", ResumptionBoundary::Fenced), ("restart", ResumptionBoundary::Restart)]
    {
        admin.register_taskdef(mps_taskdef(name, 1024)).await.unwrap();
        admin
            .create_service(&CreateService {
                name: name.into(),
                pool: "gpu".into(),
                task_definition: name.into(),
                desired_count: 2,
                resumption: Some(resumption),
                deployment_configuration: None,
                client_token: None,
                ..Default::default()
            })
            .await
            .unwrap();
    }
    let fenced = running(admin, "fenced", 2).await;
    running(admin, "restart", 2).await;
    let host = kill_daemon_of(&fleet, &fenced[0]).await;
    let id = incident_of(admin, &host.id).await.incident.id;
    let done = resolved(admin, &id).await;
    let terminated = done.incident.first(Step::OldHostTerminated).expect("old host terminated");
    // At most once: every fenced task started after the failure started after the old copy on
    // the bad host had stopped (the host was terminated, or its agent stopped the task on the way
    // down), whether the incident moved it or its service replaced it.
    let old = admin.describe_task(&fenced[0].id.to_string()).await.unwrap();
    let old_stopped = old.stopped_at_ms.expect("the fenced task on the bad host stopped");
    let fenced_now = running(admin, "fenced", 2).await;
    let new_fenced: Vec<&Task> = fenced_now.iter().filter(|t| t.id != fenced[1].id).collect();
    assert!(!new_fenced.is_empty(), "the fenced task on the bad host was not replaced");
    for t in new_fenced {
        assert!(t.created_at_ms >= old_stopped, "a fenced replacement started while the old copy still ran");
    }
    // The restart task was moved at once, before termination.
    let moved = done
        .incident
        .affected_tasks
        .iter()
        .find(|a| a.service.as_ref().is_some_and(|s| s.as_str() == "restart"));
    let new = moved.and_then(|a| a.replacement).expect("the restart task was moved by the incident");
    let t = admin.describe_task(&new.to_string()).await.unwrap();
    assert!(t.created_at_ms < terminated, "a restart replacement waited for termination");
}

/// The operator's path of docs/pools.md in a self-managed pool, as written there: an impaired
/// host is acknowledged and drained, refused activation while its daemon is hung, repaired,
/// activated, takes new tasks again, and the incident's timeline shows each step with who ran it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operators_path_in_a_self_managed_pool_as_documented() {
    let Some(fleet) = fleet(OwnershipMode::SelfManaged, 2, 0).await else { return };
    let admin = &fleet.admin;
    let tasks = service_of(admin, "web", 2).await;
    let host = signal_daemon_of(&fleet, &tasks[0], "-STOP").await;
    let on_host: Vec<TaskId> =
        tasks.iter().filter(|t| t.host_id.as_ref() == Some(&host.id)).map(|t| t.id).collect();
    let opened = incident_of(admin, &host.id).await;
    let id = opened.incident.id.clone();
    assert_eq!(opened.incident.owner, IncidentOwner::Operator);

    // Where the work is: the service and the task name the impaired host and the incident.
    let shown = fleet.cli(&["service", "describe", "web"]).1;
    let line =
        shown.lines().find(|l| l.contains(&format!("incident {id}"))).unwrap_or_else(|| panic!("{shown}"));
    assert!(line.contains(host.id.as_str()) && line.contains("IMPAIRED"), "{line}");
    let shown = fleet.cli(&["task", "describe", &on_host[0].to_string()]).1;
    assert!(shown.contains(&format!("incident {id} (OPEN, owner operator)")), "{shown}");

    let acked = admin.acknowledge_incident(&id).await.unwrap();
    assert_eq!(acked.incident.acknowledged_by.as_deref(), Some("admin"));
    admin.host_action(host.id.as_str(), "drain").await.unwrap();
    // The service's tasks leave the host; the host stays DRAINING and the incident open.
    eventually(WAIT, "the service's tasks off the drained host", || async {
        let now = running(admin, "web", 2).await;
        now.iter().all(|t| t.host_id.as_ref() != Some(&host.id)).then_some(())
    })
    .await;
    let drained = admin.describe_host(host.id.as_str()).await.unwrap();
    assert_eq!((drained.status, drained.cordoned), (HostStatus::Draining, true));
    assert_ne!(admin.describe_incident(&id).await.unwrap().incident.state, IncidentState::Resolved);

    let err = admin.activate_host(host.id.as_str()).await.unwrap_err().to_string();
    assert!(err.contains("MPS_DAEMON") && err.contains("not healthy"), "{err}");

    // The repair: the daemon answers again, and every check turns OK.
    signal_daemon_of(&fleet, &tasks[0], "-CONT").await;
    eventually(WAIT, "the repaired host's checks OK", || async {
        let h = admin.describe_host(host.id.as_str()).await.ok()?;
        (h.health_status == HealthStatus::Ok && h.checks.iter().all(|c| c.status == HealthStatus::Ok))
            .then_some(())
    })
    .await;
    let activated = admin.activate_host(host.id.as_str()).await.unwrap();
    let view = activated.host.expect("the host");
    assert_eq!((view.status, view.cordoned), (HostStatus::Active, false));
    let done = activated.incident.expect("the incident");
    assert_eq!(done.incident.state, IncidentState::Resolved);

    // New tasks land on it again (the other host is cordoned so that the choice is forced).
    let other = admin.list_hosts(None).await.unwrap().into_iter().find(|h| h.id != host.id).unwrap();
    admin.cordon_host(other.id.as_str(), true).await.unwrap();
    admin.register_taskdef(mps_taskdef("after", 1024)).await.unwrap();
    let out = admin
        .run_task(&RunTask {
            task_definition: "after".into(),
            count: 1,
            pool: "gpu".into(),
            client_token: None,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(out.tasks[0].host_id.as_ref(), Some(&host.id), "{:?}", out.tasks[0]);

    let i = admin.describe_incident(&id).await.unwrap().incident;
    let by = |s: Step| i.timeline.iter().find(|e| e.step == s).map(|e| e.by.clone());
    assert_eq!(by(Step::Acknowledged), Some(Some("admin".into())), "{:#?}", i.timeline);
    assert_eq!(by(Step::OperatorCommand), Some(Some("admin".into())));
    assert_eq!(by(Step::HostActivated), Some(Some("admin".into())));
    for s in [
        Step::Detected,
        Step::Decided,
        Step::Cordoned,
        Step::DrainStarted,
        Step::TasksRescheduled,
        Step::Resolved,
    ] {
        assert!(i.has(s), "{s:?} missing: {:#?}", i.timeline);
    }
    for t in &on_host {
        assert!(i.affected(*t).is_some(), "task {t} missing from the affected tasks: {:?}", i.affected_tasks);
    }
}

/// Probes every second, IMPAIRED after two failures, two local restarts, and `toleration_ms`.
fn two_restarts(toleration_ms: u64) -> HealthPolicy {
    HealthPolicy {
        agent_heartbeat_grace_ms: 3_000,
        mps_probe_interval_ms: 1_000,
        mps_probe_timeout_ms: 200,
        mps_failure_threshold: 2,
        local_daemon_restarts: 2,
        toleration_ms,
    }
}

#[allow(clippy::disallowed_methods)] // the test's own clock, to check the server's figures from outside
fn epoch_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as u64
}

/// A daemon killed again after each local restart until the agent gives up, on one host of a
/// managed pool with a 3-replica service: the incident's timeline starts at the first kill and
/// shows each local restart, and its total (first failure to resumed) is what the test itself
/// measures from its first kill to every replica RUNNING again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_incidents_total_runs_from_the_first_failure_to_resumed() {
    // A toleration longer than the local restarts take (the second waits a 1 s backoff), so
    // the agent has given up before the host is declared bad, as with the defaults.
    let health = two_restarts(3_000);
    let Some(fleet) = fleet_with(OwnershipMode::Managed, 3, health).await else { return };
    let admin = &fleet.admin;
    // Copies once the failure is confirmed, as the incident's own record follows them; at the
    // first exit (the default) they run seconds before the incident opens, which
    // `tests/restart_copies.rs` checks.
    let confirmed = UpdatePool { restart_copies: Some(RestartCopies::Confirmed), ..Default::default() };
    admin.update_pool("gpu", &confirmed).await.unwrap();
    let tasks = service_of(admin, "web", 3).await;
    let victim = &tasks[0];
    let (host, pid) = daemon_pid_of(&fleet, victim).await;
    assert!(pid.is_some());
    let index = host.gpus.iter().find(|g| g.gpu_id == victim.gpu_ids[0]).unwrap().index;
    let record = fleet.host_dir(&host.hostname).join(format!("mps/log/{index}/daemon.json"));
    let on_victim: Vec<TaskId> = tasks
        .iter()
        .filter(|t| t.host_id == victim.host_id && t.gpu_ids == victim.gpu_ids)
        .map(|t| t.id)
        .collect();

    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let first_kill = epoch_ms();
    let killer = keep_killing(record, stop.clone());

    // Every replica RUNNING again on a healthy daemon (the `restart` service starts copies
    // elsewhere once the daemon's failure is confirmed; the old ones may still run there
    // meanwhile): the test's own clock.
    let q = TaskQuery { service: Some("web".into()), ..Default::default() };
    let resumed = loop {
        let ts = admin.list_tasks(&q).await.unwrap();
        let running: Vec<&Task> = ts
            .iter()
            .filter(|t| t.last_status == TaskStatus::Running && t.desired_status == TaskStatus::Running)
            .collect();
        if running.iter().filter(|t| !on_victim.contains(&t.id)).count() >= 3 {
            break epoch_ms();
        }
        assert!(epoch_ms() < first_kill + 60_000, "the replicas never ran again: {ts:#?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let measured = resumed - first_kill;
    let opened = incident_of(admin, &host.id).await;
    let i = eventually(WAIT, "the incident's resumed moment", || async {
        let i = admin.describe_incident(&opened.incident.id).await.ok()?;
        i.timing.resumed_at_ms.is_some().then_some(i)
    })
    .await;
    // Until the agent gives up (the incident may open before, once the check is IMPAIRED
    // for the pool's toleration): the host's events say what happened, restarted and then
    // given up on.
    let events = eventually(WAIT, "the agent to give up on the daemon", || async {
        let events = admin.describe_host(host.id.as_str()).await.ok()?.events;
        events.iter().any(|e| e.reason == "LocalRepairExhausted").then_some(events)
    })
    .await;
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let kills = killer.join().unwrap();
    assert!(kills >= 3, "the daemon and its two local restarts were killed: {kills}");
    let gave_up = events.iter().find(|e| e.reason == "LocalRepairExhausted").unwrap();
    assert!(gave_up.message.contains("after 2 local restart(s)"), "{events:#?}");
    let restarted: u64 = events.iter().filter(|e| e.reason == "DaemonRestarted").map(|e| e.count).sum();
    assert_eq!(restarted, 2, "{events:#?}");

    let t = i.timing;
    let recorded = t.total_ms.unwrap();
    println!("measured {measured} ms from the first kill, the incident says {recorded} ms: {t:?}");
    assert!(recorded.abs_diff(measured) <= 500, "recorded {recorded} ms, measured {measured} ms: {t:#?}");
    let first = t.first_failure_at_ms.unwrap();
    assert!(first.abs_diff(first_kill) <= 500, "first failure {first}, first kill {first_kill}");
    assert!(first < t.detected_at_ms.unwrap(), "{t:?}");
    // The timeline reads in order: the first failure, the local restarts before detection,
    // then detection.
    let steps: Vec<Step> = i.incident.timeline.iter().map(|e| e.step).collect();
    let decided = steps.iter().position(|s| *s == Step::Decided).unwrap();
    assert_eq!(steps[0], Step::FirstFailure, "{:#?}", i.incident.timeline);
    let repairs = steps[..decided].iter().filter(|s| **s == Step::LocalRepairAttempt).count();
    assert_eq!(repairs, 2, "both local restarts, before the decision: {:#?}", i.incident.timeline);
    assert!(steps[..decided].contains(&Step::Detected), "{steps:?}");
    assert!(t.detect_ms.unwrap() >= 3_000, "the host was declared bad after the toleration: {t:?}");
    let at: Vec<u64> = i.incident.timeline.iter().map(|e| e.at_ms).collect();
    assert!(at.windows(2).all(|w| w[0] <= w[1]), "{at:?}");
    // Held to the pool's bounds for a daemon that exits, and within each of them: what the
    // pool states is what this recovery took, measured from outside above.
    let b = i.incident.bounds.expect("the incident's bounds");
    assert_eq!(b.kind, mpsfleet_types::FailureKind::DaemonExit, "{:?}", i.incident.trigger);
    let stated = admin.explain_pool("gpu").await.unwrap().bounds;
    let row = stated.of(b.kind).unwrap();
    assert_eq!((b.detect_ms, b.total_ms), (row.detect_ms, row.total_ms));
    println!("judged: {:?}", i.judgement);
    for j in &i.judgement {
        use mpsfleet_types::{PhaseVerdict, RecoveryPhase};
        match j.phase {
            RecoveryPhase::Detect | RecoveryPhase::Decide | RecoveryPhase::Total => {
                assert_eq!(j.verdict, PhaseVerdict::Within, "{j:?}: {:#?}", i.judgement)
            }
            RecoveryPhase::Replace => {}
        }
    }
    assert!(measured <= b.total_ms.unwrap(), "measured {measured} ms, bound {:?}", b.total_ms);
    assert!(i.incident.breaches.is_empty(), "{:?}", i.incident.breaches);
}

/// Kills the daemon recorded at `record` once (SIGKILL); its pid.
fn kill_once(record: &Path) -> u64 {
    let pid = std::fs::read(record)
        .ok()
        .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
        .and_then(|v| v["pid"].as_u64())
        .expect("a daemon record");
    assert!(std::process::Command::new("kill").args(["-9", &pid.to_string()]).status().unwrap().success());
    pid
}

/// An earlier failure that local repair fixed is over once the daemon has answered the
/// failure threshold's probes in a row again: a later failure of the same daemon (host A), or
/// of another GPU's daemon (host B), is timed from its own first signal, not the earlier one's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_later_failure_is_timed_from_its_own_first_signal_not_a_repaired_one() {
    let health = two_restarts(1_000);
    let Some(fleet) = fleet_with(OwnershipMode::SelfManaged, 2, health).await else { return };
    let admin = &fleet.admin;
    let hosts = admin.list_hosts(None).await.unwrap();
    let record =
        |h: &HostView, gpu: u32| fleet.host_dir(&h.hostname).join(format!("mps/log/{gpu}/daemon.json"));
    // One crash of GPU 0's daemon on each host, which local repair fixes.
    let first_kill = epoch_ms();
    let old: Vec<u64> = hosts.iter().map(|h| kill_once(&record(h, 0))).collect();
    for (h, pid) in hosts.iter().zip(&old) {
        eventually(WAIT, "GPU 0's daemon restarted and answering", || async {
            let now = admin.describe_host(h.id.as_str()).await.ok()?;
            let restarted = std::fs::read(record(h, 0))
                .ok()
                .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
                .and_then(|v| v["pid"].as_u64())
                .is_some_and(|p| p != *pid);
            (restarted && now.health_status == HealthStatus::Ok).then_some(())
        })
        .await;
    }
    // More than the threshold's probes (two, a second apart) answered: the first failure is
    // over.
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert!(admin.list_incidents().await.unwrap().is_empty(), "a repaired crash opened an incident");

    // Then A's same daemon, and B's other GPU's daemon, fail for good.
    let (a, b) = (&hosts[0], &hosts[1]);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let second_kill = epoch_ms();
    let killers = [keep_killing(record(a, 0), stop.clone()), keep_killing(record(b, 1), stop.clone())];
    let incidents = [incident_of(admin, &a.id).await, incident_of(admin, &b.id).await];
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    for k in killers {
        assert!(k.join().unwrap() >= 1);
    }
    for (i, gpu) in incidents.iter().zip([0u32, 1]) {
        let host = hosts.iter().find(|h| h.id == i.incident.host_id).unwrap();
        let uuid = &host.gpus.iter().find(|g| g.index == gpu).unwrap().gpu_id;
        assert_eq!(i.incident.trigger.gpu_id.as_ref(), Some(uuid), "{:?}", i.incident.trigger);
        let first = i.timing.first_failure_at_ms.expect("a first failure");
        assert!(
            first.abs_diff(second_kill) <= 500,
            "host {}: first failure {first}, the failure's first kill {second_kill}, the repaired crash's \
             {first_kill}: {:?}",
            host.hostname,
            i.timing
        );
    }
}

/// Draining a self-managed pool's only host: the CLI warns that nothing can take its tasks,
/// and once the operator activates the host again the incident names where each replacement
/// landed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn draining_the_only_host_says_nothing_can_take_its_tasks() {
    let Some(fleet) = fleet(OwnershipMode::SelfManaged, 1, 0).await else { return };
    let admin = &fleet.admin;
    let tasks = service_of(admin, "web", 2).await;
    let host = tasks[0].host_id.clone().unwrap();
    let (code, _, err) = fleet.cli(&["host", "drain", host.as_str()]);
    assert_eq!(code, Some(0), "{err}");
    assert!(err.contains("warning: the pool has no capacity now for 2 task(s) moved off the host"), "{err}");
    let id = incident_of(admin, &host).await.incident.id;
    fleet.cli(&["host", "activate", host.as_str()]);
    running(admin, "web", 2).await;
    let i = eventually(WAIT, "the replacements' host on the incident", || async {
        let i = admin.describe_incident(&id).await.ok()?.incident;
        i.affected_tasks.iter().all(|a| a.replacement_host.is_some()).then_some(i)
    })
    .await;
    assert!(
        i.affected_tasks.iter().all(|a| a.replacement_host.as_ref() == Some(&host)),
        "{:#?}",
        i.affected_tasks
    );
    let shown = fleet.cli(&["incident", "describe", &id]).1;
    for a in &i.affected_tasks {
        let row = shown
            .lines()
            .find(|l| l.starts_with(&a.task_id.to_string()))
            .unwrap_or_else(|| panic!("{shown}"));
        assert!(row.ends_with(host.as_str()), "the replacement's host is named: {row}");
    }
}

/// A self-managed pool's daemon that the agent gave up restarting: `host activate` is refused
/// while its check is IMPAIRED; after the operator's fix, `host recheck` re-arms local repair
/// (the agent starts the daemon again), the check turns OK and `host activate` resolves the
/// incident; the recheck is on its timeline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_recheck_rearms_local_repair_after_the_operator_fixed_the_host() {
    let Some(fleet) = fleet(OwnershipMode::SelfManaged, 2, 1).await else { return };
    let admin = &fleet.admin;
    let tasks = service_of(admin, "web", 2).await;
    let victim = &tasks[0];
    let (host, _) = daemon_pid_of(&fleet, victim).await;
    let index = host.gpus.iter().find(|g| g.gpu_id == victim.gpu_ids[0]).unwrap().index;
    let record = fleet.host_dir(&host.hostname).join(format!("mps/log/{index}/daemon.json"));
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let killer = keep_killing(record, stop.clone());
    eventually(WAIT, "the agent to give up on the daemon", || async {
        let h = admin.describe_host(host.id.as_str()).await.ok()?;
        h.events.iter().any(|e| e.reason == "LocalRepairExhausted").then_some(())
    })
    .await;
    // The operator's fix: nothing kills the daemon any more. It stays down: the agent gave up.
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    killer.join().unwrap();
    let id = incident_of(admin, &host.id).await.incident.id;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let err = admin.activate_host(host.id.as_str()).await.unwrap_err().to_string();
    assert!(err.contains("local restarts exhausted"), "{err}");

    let (code, out, err) = fleet.cli(&["host", "recheck", host.id.as_str()]);
    assert_eq!(code, Some(0), "{out}{err}");
    eventually(WAIT, "the re-armed daemon's check OK", || async {
        let h = admin.describe_host(host.id.as_str()).await.ok()?;
        (h.health_status == HealthStatus::Ok).then_some(())
    })
    .await;
    let activated = admin.activate_host(host.id.as_str()).await.unwrap();
    assert_eq!(
        activated.host.map(|h| (h.status, h.health_status)),
        Some((HostStatus::Active, HealthStatus::Ok))
    );
    let i = admin.describe_incident(&id).await.unwrap().incident;
    assert_eq!(i.state, IncidentState::Resolved, "{:#?}", i.timeline);
    let recheck =
        i.timeline.iter().find(|e| e.step == Step::OperatorCommand && e.detail.starts_with("host recheck"));
    assert_eq!(recheck.and_then(|e| e.by.clone()).as_deref(), Some("admin"), "{:#?}", i.timeline);
    let h = admin.describe_host(host.id.as_str()).await.unwrap();
    assert!(h.events.iter().any(|e| e.reason == "RecheckRequested"), "{:#?}", h.events);
}

/// A full pool recovers its important service by preemption: two 1-GPU hosts, each full with
/// one replica of a priority-90 service and two of a priority-10 one; the daemon under a
/// priority-90 replica dies for good. The replica runs again on the surviving, full host
/// before the replacement host serves anything, the priority-10 tasks there stop with a
/// reason naming the preemption, and the priority-10 service is back at its count once the
/// replacement host has joined.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_pool_preempts_low_priority_work_to_recover_at_once() {
    let Some(mps) = mps_control() else { return };
    let dir = tempfile::tempdir().unwrap();
    let args = agent_args(&mps, 0).replace("H200:143771:2", "H200:143771:1");
    let server =
        Server::start_with(&dir.path().join("server"), "127.0.0.1:0", &["--local-agent-args", &args]);
    let admin = server.admin();
    let health = HealthPolicy {
        agent_heartbeat_grace_ms: 3_000,
        mps_probe_interval_ms: 1_000,
        mps_probe_timeout_ms: 200,
        mps_failure_threshold: 2,
        local_daemon_restarts: 0,
        toleration_ms: 500,
    };
    admin
        .create_pool(&CreatePool {
            name: "gpu".into(),
            health_policy: Some(health),
            provider: Some(Provider::local(2)),
            preemption: Some(Preemption::Recovery),
            ..Default::default()
        })
        .await
        .unwrap();
    let fleet = Fleet { dir, server, admin, agent_args: args };
    let admin = &fleet.admin;
    eventually(WAIT, "two ACTIVE hosts", || async {
        let hs = admin.list_hosts(None).await.ok()?;
        (hs.len() == 2 && hs.iter().all(|h| h.status == HostStatus::Active)).then_some(())
    })
    .await;
    // 71,885 + 2 x 35,942 = 143,769 of each GPU's 143,771 MiB: nothing else fits anywhere.
    for (name, memory, count, priority) in [("infer", 71_885, 2, 90), ("batch", 35_942, 4, 10)] {
        admin.register_taskdef(mps_taskdef(name, memory)).await.unwrap();
        let svc = CreateService {
            name: name.into(),
            pool: "gpu".into(),
            task_definition: name.into(),
            desired_count: count,
            deregistration_delay_seconds: Some(0),
            priority: Some(priority),
            ..Default::default()
        };
        admin.create_service(&svc).await.unwrap();
        running(admin, name, count).await;
    }
    let infer = running(admin, "infer", 2).await;
    assert!(infer.iter().all(|t| t.priority == 90), "{infer:?}");
    let (lost, kept) = (&infer[0], &infer[1]);
    assert_ne!(lost.host_id, kept.host_id, "one replica per host");
    let survivor = kept.host_id.clone().unwrap();
    let killed_at = epoch_ms();
    let bad = kill_daemon_of(&fleet, lost).await;

    // A copy of the lost replica runs on the surviving host, which was full.
    let copy = eventually(WAIT, "the priority-90 copy RUNNING on the surviving host", || async {
        let q = TaskQuery { service: Some("infer".into()), ..Default::default() };
        let ts = admin.list_tasks(&q).await.ok()?;
        ts.into_iter().find(|t| {
            t.id != lost.id
                && t.id != kept.id
                && t.host_id.as_ref() == Some(&survivor)
                && t.last_status == TaskStatus::Running
        })
    })
    .await;
    assert_eq!(copy.recovery_from.as_ref(), Some(&bad.id), "{copy:?}");
    let after = copy.started_at_ms.unwrap().saturating_sub(killed_at);
    println!("the priority-90 copy RUNNING {after} ms after its daemon was killed");
    // Before any replacement host served it: none had a task RUNNING before the copy started.
    let hosts = admin.list_hosts(None).await.unwrap();
    for h in hosts.iter().filter(|h| h.id != survivor && h.id != bad.id) {
        let q = TaskQuery { host: Some(h.id.to_string()), ..Default::default() };
        for t in admin.list_tasks(&q).await.unwrap() {
            let started = t.started_at_ms.unwrap_or(u64::MAX);
            assert!(started >= copy.started_at_ms.unwrap(), "{} ran on {} first: {t:?}", t.id, h.id);
        }
    }
    // The priority-10 tasks of the surviving host stopped, saying why.
    let q = TaskQuery { service: Some("batch".into()), ..Default::default() };
    let batch = admin.list_tasks(&q).await.unwrap();
    let preempted: Vec<&Task> = batch.iter().filter(|t| t.stop_code == Some(StopCode::Preempted)).collect();
    assert!(!preempted.is_empty(), "no task preempted: {batch:?}");
    for t in &preempted {
        assert_eq!(t.host_id.as_ref(), Some(&survivor), "{t:?}");
        let why = t.stopped_reason.as_deref().unwrap_or_default();
        assert!(
            why.contains("preempted") && why.contains(&copy.id.to_string()) && why.contains("priority 90"),
            "{why}"
        );
        assert!(why.contains("priority being 10"), "{why}");
    }
    let events = admin.describe_service("batch").await.unwrap();
    assert!(
        events.service.events.iter().any(|e| e.event.reason == "Preempted"),
        "{:?}",
        events.service.events
    );
    // Capacity returns (the incident's replacement host): the priority-10 service is whole again.
    running(admin, "batch", 4).await;
    let incident = incident_of(admin, &bad.id).await;
    let done = resolved(admin, &incident.incident.id).await;
    assert!(steps(&done.incident).contains(&Step::Preempted), "{:?}", steps(&done.incident));
}
