//! Process tests of the agent: the real server and agent binaries, the real MPS control
//! daemon (from scripts/install-mps.sh), tasks as real processes.

mod common;

use common::*;
use mpsfleet_client::{Client, TaskQuery};
use mpsfleet_types::*;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(60);

async fn task_in(admin: &Client, id: &TaskId, status: TaskStatus) -> Task {
    eventually(WAIT, &format!("task {id} to be {}", status.as_str()), || async {
        admin.describe_task(&id.to_string()).await.ok().filter(|t| t.last_status == status)
    })
    .await
}

async fn run_one(admin: &Client, family: &str) -> Task {
    let out = admin
        .run_task(&RunTask {
            task_definition: family.into(),
            count: 1,
            pool: "gpu".into(),
            client_token: None,
            ..Default::default()
        })
        .await
        .unwrap();
    out.tasks.into_iter().next().unwrap()
}

/// A task that writes its environment to `out` and then sleeps.
fn env_dumper(family: &str, out: &Path, mps: serde_json::Value) -> Vec<u8> {
    taskdef(serde_json::json!({
        "family": family,
        "containerDefinitions": [{
            "name": "main",
            "command": ["/bin/sh", "-c", format!("echo started $MPSFLEET_TASK_ID; env > {}.tmp && mv {0}.tmp {0}; exec sleep 600", out.display())],
            "environment": [{"name": "GREETING", "value": "hello"}],
            "stopTimeout": 5,
            "resourceRequirements": [{"type": "GPU", "sharingStrategy": {"nvidiaMps": mps}}]
        }]
    }))
}

fn env_of(path: &Path) -> Vec<(String, String)> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split_once('=').map(|(k, v)| (k.to_string(), v.to_string())))
        .collect()
}

fn var<'a>(env: &'a [(String, String)], k: &str) -> Option<&'a str> {
    env.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str())
}

fn alive(pid: u32) -> bool {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    !stat.is_empty() && !stat.rsplit(')').next().is_some_and(|r| r.trim_start().starts_with('Z'))
}

fn signal(pid: u32, sig: &str) {
    assert!(Command::new("kill").args([sig, &pid.to_string()]).status().unwrap().success());
}

/// A server with pool `gpu` and one ACTIVE host of `gpus` emulated GPUs with the real daemon.
struct OneHost {
    dir: tempfile::TempDir,
    server: Server,
    admin: Client,
    agent: Agent,
    mps: std::path::PathBuf,
}

async fn one_host(gpus: u32, extra: &[&str]) -> Option<OneHost> {
    let mps = mps_control()?;
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("server"));
    let admin = server.admin();
    create_pool(&admin, "gpu").await;
    let agent = Agent::start(&server, &dir.path().join("a"), gpus, &mps, extra);
    eventually(WAIT, "the host to be ACTIVE", || async {
        admin.list_hosts(None).await.ok().filter(|h| h.len() == 1 && h[0].status == HostStatus::Active)
    })
    .await;
    Some(OneHost { dir, server, admin, agent, mps })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_mps_task_gets_its_limits_and_the_pipe_dir_of_its_daemon() {
    let Some(OneHost { dir, admin, agent, mps, server: _server }) = one_host(2, &[]).await else { return };
    let out = task_writable_dir(dir.path()).join("env.txt");
    admin
        .register_taskdef(env_dumper(
            "dump",
            &out,
            serde_json::json!({"memory": 4096, "maxComputePercent": 25}),
        ))
        .await
        .unwrap();
    let out2 = task_writable_dir(dir.path()).join("env2.txt");
    admin.register_taskdef(env_dumper("dump2", &out2, serde_json::json!({"memory": 2048}))).await.unwrap();
    let t = run_one(&admin, "dump").await;
    let t = task_in(&admin, &t.id, TaskStatus::Running).await;
    let t2 = run_one(&admin, "dump2").await;
    task_in(&admin, &t2.id, TaskStatus::Running).await;
    eventually(WAIT, "the task to write its environment", || async { out.exists().then_some(()) }).await;
    eventually(WAIT, "the second task to write its environment", || async { out2.exists().then_some(()) })
        .await;

    let env = env_of(&out);
    assert_eq!(var(&env, "GREETING"), Some("hello"), "{}", agent.log());
    assert_eq!(var(&env, "CUDA_VISIBLE_DEVICES"), Some(t.gpu_ids[0].as_str()));
    assert_eq!(var(&env, "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"), Some("0=4096M"));
    assert_eq!(var(&env, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"), Some("25"));
    assert_eq!(var(&env_of(&out2), "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"), None, "only when declared");

    // The pipe directory is where this GPU's daemon answers: ask it through that directory.
    let pipe = var(&env, "CUDA_MPS_PIPE_DIRECTORY").expect("CUDA_MPS_PIPE_DIRECTORY").to_string();
    assert_mps_daemon_answers(&mps, &pipe);
    // `task logs` reaches the agent through the server.
    let logs = admin
        .task_logs(&t.id.to_string(), None, mpsfleet_types::logs::LogStreams::Stdout, 4096, None)
        .await
        .unwrap();
    assert_eq!(logs.source, mpsfleet_types::logs::LogsSource::Agent);
    assert_eq!(logs.output().trim(), format!("started {}", t.id));
    let err = admin
        .task_logs(&t.id.to_string(), Some("../../etc"), mpsfleet_types::logs::LogStreams::Stdout, 4096, None)
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some("InvalidParameter"), "{err}");
    let err = admin
        .task_logs(&t.id.to_string(), Some("other"), mpsfleet_types::logs::LogStreams::Stdout, 4096, None)
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some("NotFound"), "{err}");
    let view = admin.describe_host(t.host_id.as_ref().unwrap().as_str()).await.unwrap();
    let of_gpu = |name: &str| {
        view.checks
            .iter()
            .find(|c| c.name == name && c.gpu_id.as_ref() == Some(&t.gpu_ids[0]))
            .map(|c| c.status)
    };
    assert_eq!(of_gpu("MPS_DAEMON"), Some(HealthStatus::Ok), "{:?}", view.checks);
    assert_eq!(of_gpu("GPU"), Some(HealthStatus::Ok), "{:?}", view.checks);
}

/// Replaces pool `gpu`'s health policy and waits until the agent says it applied it.
async fn set_health_policy(admin: &Client, agent: &Agent, policy: HealthPolicy) {
    let before = agent.log().matches(APPLIED).count();
    let req = UpdatePool { health_policy: Some(policy.clone()), ..Default::default() };
    let pool = admin.update_pool("gpu", &req).await.unwrap();
    assert_eq!(pool.health_policy, policy);
    eventually(WAIT, "the agent to apply the pool's policy", || async {
        (agent.log().matches(APPLIED).count() > before).then_some(())
    })
    .await;
}

const APPLIED: &str = "applied the pool's mps health policy";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_update_changes_the_agents_mps_probes_without_a_restart() {
    let Some(OneHost { dir: _dir, admin, agent, server: _server, .. }) = one_host(1, &[]).await else {
        return;
    };
    let agent_dir = agent.data_dir.clone();
    let pid = daemon_pid(&agent_dir, 0);
    // A high threshold keeps the stopped daemon from being restarted while we look.
    let policy = HealthPolicy {
        mps_probe_interval_ms: 1_000,
        mps_probe_timeout_ms: 300,
        mps_failure_threshold: 100,
        ..Default::default()
    };
    set_health_policy(&admin, &agent, policy).await;

    // A stopped daemon never answers: the probe fails after the pool's timeout, not the flag's.
    signal(pid, "-STOP");
    let reason = eventually(WAIT, "the MPS check to time out after 300ms", || async {
        let hosts = admin.list_hosts(None).await.ok()?;
        let view = admin.describe_host(hosts.first()?.id.as_str()).await.ok()?;
        let check = view.checks.iter().find(|c| c.name == "MPS_DAEMON")?;
        check.reason.contains("timed out").then(|| check.reason.clone())
    })
    .await;
    signal(pid, "-CONT");
    assert!(reason.contains("probe timed out after 300ms"), "{reason}\n{}", agent.log());
    eventually(WAIT, "the MPS check to be answering again", || async {
        let hosts = admin.list_hosts(None).await.ok()?;
        let view = admin.describe_host(hosts.first()?.id.as_str()).await.ok()?;
        let check = view.checks.iter().find(|c| c.name == "MPS_DAEMON")?;
        (check.reason == "daemon answering").then_some(())
    })
    .await;
    assert_eq!(daemon_pid(&agent_dir, 0), pid, "the daemon was never restarted");
    assert!(alive(pid));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_mps_task_is_refused_while_its_daemon_does_not_answer() {
    let Some(OneHost { dir, admin, agent, server: _server, .. }) = one_host(1, &[]).await else { return };
    // Probes far apart: the stopped daemon is not restarted during the test.
    let policy =
        HealthPolicy { mps_probe_timeout_ms: 500, mps_probe_interval_ms: 300_000, ..Default::default() };
    set_health_policy(&admin, &agent, policy).await;
    let agent_dir = agent.data_dir.clone();
    let out = task_writable_dir(dir.path()).join("env.txt");
    admin.register_taskdef(env_dumper("dump", &out, serde_json::json!({"memory": 1024}))).await.unwrap();

    // A stopped daemon accepts connections and never answers: the check must time out.
    let pid = daemon_pid(&agent_dir, 0);
    signal(pid, "-STOP");
    let t = run_one(&admin, "dump").await;
    let t = task_in(&admin, &t.id, TaskStatus::Stopped).await;
    signal(pid, "-CONT");
    assert_eq!(t.stop_code, Some(StopCode::MpsDaemonUnavailable), "{}", agent.log());
    let reason = t.stopped_reason.unwrap_or_default();
    assert!(reason.contains("timed out"), "{reason}");
    assert!(!out.exists(), "the task ran although its daemon did not answer");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_kill_9_leaves_tasks_running_and_reports_exits_it_missed() {
    let Some(OneHost { dir, server, admin, mut agent, mps }) = one_host(1, &[]).await else { return };
    let agent_dir = agent.data_dir.clone();
    let marker = task_writable_dir(dir.path()).join("exit-now");
    let pids = task_writable_dir(dir.path());
    for (family, script) in [
        ("stays", format!("echo $$ > {}/stays; exec sleep 600", pids.display())),
        (
            "leaves",
            format!(
                "echo $$ > {}/leaves; while [ ! -e {} ]; do sleep 0.1; done; exit 3",
                pids.display(),
                marker.display()
            ),
        ),
    ] {
        admin
            .register_taskdef(taskdef(serde_json::json!({
                "family": family,
                "containerDefinitions": [{"name": "main", "command": ["/bin/sh", "-c", script], "stopTimeout": 5,
                    "resourceRequirements": [{"type": "GPU", "sharingStrategy": {"nvidiaMps": {"memory": 1024}}}]}]
            })))
            .await
            .unwrap();
    }
    let stays = run_one(&admin, "stays").await;
    let leaves = run_one(&admin, "leaves").await;
    task_in(&admin, &stays.id, TaskStatus::Running).await;
    task_in(&admin, &leaves.id, TaskStatus::Running).await;
    let pid_of = |name: &str| -> u32 {
        std::fs::read_to_string(pids.join(name)).unwrap_or_default().trim().parse().unwrap_or(0)
    };
    eventually(WAIT, "both tasks to write their pids", || async {
        (pid_of("stays") > 0 && pid_of("leaves") > 0).then_some(())
    })
    .await;
    let (stays_pid, leaves_pid) = (pid_of("stays"), pid_of("leaves"));

    agent.kill9();
    assert!(alive(stays_pid) && alive(leaves_pid), "killing the agent killed its tasks");
    std::fs::write(&marker, b"").unwrap();
    eventually(WAIT, "the second task to exit while the agent is down", || async {
        (!alive(leaves_pid)).then_some(())
    })
    .await;

    let agent = Agent::start(&server, &agent_dir, 1, &mps, &[]);
    let left = task_in(&admin, &leaves.id, TaskStatus::Stopped).await;
    assert_eq!(left.stop_code, Some(StopCode::EssentialContainerExited), "{}", agent.log());
    assert!(
        left.stopped_reason.as_deref().unwrap_or_default().contains("status 3"),
        "{:?}",
        left.stopped_reason
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    let still = admin.describe_task(&stays.id.to_string()).await.unwrap();
    assert_eq!(still.last_status, TaskStatus::Running);
    assert!(alive(stays_pid), "the restarted agent restarted or killed a running task");
    assert_eq!(admin.list_hosts(None).await.unwrap().len(), 1, "the agent registered a second time");

    // The adopted task can still be stopped through the API.
    admin.stop_task(&stays.id.to_string(), None).await.unwrap();
    let stopped = task_in(&admin, &stays.id, TaskStatus::Stopped).await;
    assert_eq!(stopped.stop_code, Some(StopCode::UserInitiated));
    assert!(!alive(stays_pid));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_happens_while_the_server_is_down_is_reported_when_it_is_back() {
    let Some(OneHost { dir, mut server, admin, agent, .. }) = one_host(1, &[]).await else { return };
    let server_dir = server.data_dir.clone();
    let listen = server.addr();
    let marker = task_writable_dir(dir.path()).join("exit-now");
    let script = format!("while [ ! -e {} ]; do sleep 0.1; done; exit 4", marker.display());
    admin
        .register_taskdef(taskdef(serde_json::json!({
            "family": "waits",
            "containerDefinitions": [{"name": "main", "command": ["/bin/sh", "-c", script],
                "resourceRequirements": [{"type": "GPU", "sharingStrategy": {"nvidiaMps": {"memory": 1024}}}]}]
        })))
        .await
        .unwrap();
    let t = run_one(&admin, "waits").await;
    task_in(&admin, &t.id, TaskStatus::Running).await;

    server.kill9();
    std::fs::write(&marker, b"").unwrap();
    // Give the agent time to see the exit and fail to report it at least once.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let server = Server::start_on(&server_dir, &listen);
    let admin = server.admin();
    let stopped = task_in(&admin, &t.id, TaskStatus::Stopped).await;
    assert_eq!(stopped.stop_code, Some(StopCode::EssentialContainerExited), "{}", agent.log());
    assert!(
        stopped.stopped_reason.as_deref().unwrap_or_default().contains("status 4"),
        "{:?}",
        stopped.stopped_reason
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_liveness_stops_the_task_and_its_service_replaces_it() {
    let Some(OneHost { dir, admin, server: _server, agent: _agent, .. }) = one_host(1, &[]).await else {
        return;
    };
    let alive_file = task_writable_dir(dir.path()).join("alive");
    admin
        .register_taskdef(taskdef(serde_json::json!({
            "family": "probed",
            "containerDefinitions": [{"name": "main", "command": ["sleep", "600"], "stopTimeout": 2,
                "healthCheck": {"command": ["CMD-SHELL", format!("test -e {}", alive_file.display())],
                    "interval": 5, "timeout": 2, "retries": 1, "startPeriod": 0},
                "resourceRequirements": [{"type": "GPU", "sharingStrategy": {"nvidiaMps": {"memory": 1024}}}]}]
        })))
        .await
        .unwrap();
    std::fs::write(&alive_file, b"").unwrap();
    admin
        .create_service(&CreateService {
            name: "probed".into(),
            pool: "gpu".into(),
            task_definition: "probed".into(),
            desired_count: 1,
            resumption: None,
            deployment_configuration: None,
            client_token: None,
            ..Default::default()
        })
        .await
        .unwrap();
    let q = TaskQuery { service: Some("probed".into()), ..Default::default() };
    let first = eventually(WAIT, "a healthy replica", || async {
        admin.list_tasks(&q).await.ok()?.into_iter().find(|t| t.health_status == TaskHealth::Healthy)
    })
    .await;
    std::fs::remove_file(&alive_file).unwrap();
    let dead = task_in(&admin, &first.id, TaskStatus::Stopped).await;
    assert_eq!(dead.stop_code, Some(StopCode::Unhealthy));
    std::fs::write(&alive_file, b"").unwrap();
    eventually(WAIT, "a replacement replica RUNNING", || async {
        admin
            .list_tasks(&q)
            .await
            .ok()?
            .into_iter()
            .find(|t| t.id != first.id && t.last_status == TaskStatus::Running)
    })
    .await;
}

/// Kills `mpsfleet up` if the test fails before it stops it.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn up_runs_a_spread_service_and_ctrl_c_leaves_no_process_behind() {
    if mps_control().is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let mut up = Command::new(env!("CARGO_BIN_EXE_mpsfleet"))
        .args(["up", "--hosts", "2", "--gpus-per-host", "2", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(&data)
        .current_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join("../.."))
        .env("HOME", dir.path())
        .env_remove("XDG_CONFIG_HOME")
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = up.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let mut up = KillOnDrop(up);
    let mut url = None;
    let mut lines = Vec::new();
    while !lines.iter().any(|l: &String| l.starts_with("try:")) {
        let line = rx.recv_timeout(Duration::from_secs(60)).expect("up printed its summary");
        if let Some(u) = line.strip_prefix("mpsfleet up: server ").and_then(|r| r.split(',').next()) {
            url = Some(u.to_string());
        }
        lines.push(line);
    }
    assert!(lines.iter().any(|l| l.contains("MPS: the real daemon")), "{lines:?}");
    let config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.path().join(".config/mpsfleet/config.json")).unwrap())
            .unwrap();
    // The config `up` writes names the cluster CA the CLI verifies the server with.
    let ca = std::fs::read(config["caFile"].as_str().expect("caFile in the client config")).unwrap();
    let trust = mpsfleet_client::tls::Trust::Ca(ca);
    let admin =
        Client::with_trust(url.as_deref().unwrap(), config["token"].as_str().map(String::from), &trust)
            .unwrap();

    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        eventually(WAIT, "two ACTIVE hosts", || async {
            admin
                .list_hosts(None)
                .await
                .ok()
                .filter(|h| h.len() == 2 && h.iter().all(|h| h.status == HostStatus::Active))
        })
        .await;
        admin.register_taskdef(mps_taskdef("web", 8192)).await.unwrap();
        admin
            .create_service(&CreateService {
                name: "web".into(),
                pool: "default".into(),
                task_definition: "web".into(),
                desired_count: 6,
                resumption: None,
                deployment_configuration: None,
                client_token: None,
                ..Default::default()
            })
            .await
            .unwrap();
        let running = eventually(WAIT, "6 RUNNING tasks", || async {
            let ts = admin.list_tasks(&TaskQuery::default()).await.ok()?;
            (ts.iter().filter(|t| t.last_status == TaskStatus::Running).count() == 6).then_some(ts)
        })
        .await;
        let hosts: std::collections::BTreeSet<_> = running.iter().filter_map(|t| t.host_id.clone()).collect();
        let gpus: std::collections::BTreeSet<_> = running.iter().flat_map(|t| t.gpu_ids.clone()).collect();
        assert_eq!((hosts.len(), gpus.len()), (2, 4), "replicas spread over both hosts and all GPUs");
    });

    assert!(!processes_mentioning(&data.display().to_string()).is_empty(), "up started nothing?");
    signal(up.0.id(), "-INT");
    let status = up.0.wait().unwrap();
    assert!(status.success(), "up exited with {status}");
    let left = processes_mentioning(&data.display().to_string());
    assert!(left.is_empty(), "processes left behind: {left:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_looping_service_is_held_back() {
    let Some(OneHost { admin, server: _server, agent: _agent, .. }) = one_host(1, &[]).await else { return };
    admin
        .register_taskdef(taskdef(serde_json::json!({
            "family": "crash",
            "containerDefinitions": [{"name": "main", "command": ["false"],
                "resourceRequirements": [{"type": "GPU", "sharingStrategy": {"nvidiaMps": {"memory": 1024}}}]}]
        })))
        .await
        .unwrap();
    admin
        .create_service(&CreateService {
            name: "crash".into(),
            pool: "gpu".into(),
            task_definition: "crash".into(),
            desired_count: 1,
            resumption: None,
            deployment_configuration: None,
            client_token: None,
            ..Default::default()
        })
        .await
        .unwrap();
    let q = TaskQuery { service: Some("crash".into()), limit: Some(1000), ..Default::default() };
    // Each failure and replacement takes well under a second here, so without the backoff this
    // window would see many more than the burst of five.
    tokio::time::sleep(Duration::from_secs(8)).await;
    let tasks = admin.list_tasks(&q).await.unwrap();
    let failed = tasks.iter().filter(|t| t.last_status == TaskStatus::Stopped).count();
    assert!(
        failed >= 3,
        "the service should have replaced its failing task: {} stopped: {}",
        failed,
        serde_json::to_string_pretty(&tasks).unwrap()
    );
    assert!(tasks.len() <= 6, "{} tasks in 8 s: the crash loop was not held back", tasks.len());
}
