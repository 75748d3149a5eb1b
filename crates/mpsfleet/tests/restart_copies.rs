//! Restart copies with the real MPS daemon: in a pool with `restartCopies: first-exit` (the
//! default), one exit of a daemon, which local repair mends, starts copies of its `restart`
//! replicas on healthy daemons at once; once the daemon has answered its probes again the
//! extras stop, the newest first, and the service is what it was.

mod common;

use common::*;
use mpsfleet_client::{Client, TaskQuery};
use mpsfleet_types::policy::*;
use mpsfleet_types::*;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(40);

/// The tasks of `web` that run and are meant to.
async fn live(admin: &Client) -> Vec<Task> {
    let q = TaskQuery { service: Some("web".into()), ..Default::default() };
    let ts = admin.list_tasks(&q).await.unwrap_or_default();
    ts.into_iter()
        .filter(|t| t.last_status == TaskStatus::Running && t.desired_status == TaskStatus::Running)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daemons_first_exit_starts_copies_at_once_and_its_repair_stops_them() {
    let Some(mps) = mps_control() else { return };
    let dir = tempfile::tempdir().unwrap();
    // Three local restarts: one kill is mended, the failure is never confirmed.
    let args = format!(
        "--emulate-gpus H200:143771:2 --mps-control {} --mps-probe-interval-ms 300 --mps-probe-timeout-ms 200 \
         --heartbeat-ms 200 --stop-tasks-on-exit",
        mps.display()
    );
    let server =
        Server::start_with(&dir.path().join("server"), "127.0.0.1:0", &["--local-agent-args", &args]);
    let _cleanup = Cleanup(dir.path().display().to_string());
    let admin = server.admin();
    let health = HealthPolicy {
        mps_probe_interval_ms: 1_000,
        mps_probe_timeout_ms: 200,
        mps_failure_threshold: 2,
        local_daemon_restarts: 3,
        ..Default::default()
    };
    admin
        .create_pool(&CreatePool {
            name: "gpu".into(),
            health_policy: Some(health),
            provider: Some(Provider::local(2)),
            ..Default::default()
        })
        .await
        .unwrap();
    let pool = admin.describe_pool("gpu").await.unwrap();
    assert_eq!(pool.restart_copies, RestartCopies::FirstExit, "the default");
    eventually(WAIT, "two ACTIVE hosts", || async {
        let hs = admin.list_hosts(None).await.ok()?;
        (hs.len() == 2 && hs.iter().all(|h| h.status == HostStatus::Active)).then_some(())
    })
    .await;
    admin.register_taskdef(mps_taskdef("web", 1024)).await.unwrap();
    admin
        .create_service(&CreateService {
            name: "web".into(),
            pool: "gpu".into(),
            task_definition: "web".into(),
            desired_count: 2,
            ..Default::default()
        })
        .await
        .unwrap();
    let first = eventually(WAIT, "2 RUNNING replicas", || async {
        let ts = live(&admin).await;
        (ts.len() == 2).then_some(ts)
    })
    .await;
    let victim = &first[0];
    let host = admin.describe_host(victim.host_id.as_ref().unwrap().as_str()).await.unwrap();
    let index = host.gpus.iter().find(|g| g.gpu_id == victim.gpu_ids[0]).unwrap().index;
    let record =
        dir.path().join("server/hosts").join(&host.hostname).join(format!("mps/log/{index}/daemon.json"));
    let on_daemon = first.iter().filter(|t| t.gpu_ids == victim.gpu_ids).count();

    // One kill: local repair restarts the daemon at once, and the copies start meanwhile.
    let pid = std::fs::read(&record)
        .ok()
        .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
        .and_then(|v| v["pid"].as_u64())
        .expect("a daemon record");
    assert!(std::process::Command::new("kill").args(["-9", &pid.to_string()]).status().unwrap().success());
    let copies = eventually(WAIT, "the copies RUNNING on other daemons", || async {
        let ts = live(&admin).await;
        let copies: Vec<Task> = ts.into_iter().filter(|t| !first.iter().any(|f| f.id == t.id)).collect();
        (copies.len() == on_daemon).then_some(copies)
    })
    .await;
    for c in &copies {
        assert_ne!(c.gpu_ids, victim.gpu_ids, "a copy on the failed daemon: {c:#?}");
        assert_eq!(c.recovery_from.as_ref(), Some(&host.id), "{c:#?}");
    }
    let events = admin.describe_service("web").await.unwrap().service.events;
    assert!(
        events.iter().any(|e| e.reason == "TasksStarted" && e.message.contains("on a failed MPS daemon")),
        "{events:#?}"
    );
    // Never confirmed: the host stayed healthy and no incident opened.
    let view = admin.describe_host(host.id.as_str()).await.unwrap();
    assert_eq!(view.health_status, HealthStatus::Ok, "{:?}", view.checks);

    // Repaired: the daemon answers its probes again, the copies stop, the first replicas stay.
    let kept: Vec<TaskId> = eventually(WAIT, "the extras stopped", || async {
        let ts = live(&admin).await;
        (ts.len() == 2 && ts.iter().all(|t| first.iter().any(|f| f.id == t.id)))
            .then(|| ts.iter().map(|t| t.id).collect())
    })
    .await;
    assert_eq!(kept.len(), 2);
    assert!(admin.list_incidents().await.unwrap().is_empty(), "a mended exit opened an incident");
}

/// Stops every process the test started (server, agents, daemons, tasks) when dropped.
struct Cleanup(String);

impl Drop for Cleanup {
    fn drop(&mut self) {
        stop_processes_mentioning(&self.0);
    }
}
