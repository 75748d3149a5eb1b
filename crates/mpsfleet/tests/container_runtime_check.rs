//! The `CONTAINER_RUNTIME` check against a Docker Engine that hangs: the agent reaches the real
//! private engine (`scripts/docker-env.sh`) through a socket relay the test can freeze, so a
//! hung engine is a real one for the agent (connections accepted, nothing answered) while the
//! engine itself, shared with other tests, is left alone.

mod common;

use common::*;
use mpsfleet_types::*;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{UnixListener, UnixStream};

/// Relays `socket` to `engine`; while `frozen` is set it forwards nothing in either direction
/// and answers nothing, as a stopped daemon would.
fn relay(socket: &Path, engine: PathBuf, frozen: Arc<AtomicBool>) {
    let listener = UnixListener::bind(socket).expect("bind the relay socket");
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let (engine, frozen) = (engine.clone(), frozen.clone());
            tokio::spawn(async move {
                let Ok(upstream) = UnixStream::connect(&engine).await else { return };
                let (mut cr, mut cw) = client.into_split();
                let (mut ur, mut uw) = upstream.into_split();
                let f1 = frozen.clone();
                let up = async move {
                    let mut buf = vec![0u8; 64 * 1024];
                    loop {
                        let n = match cr.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => n,
                        };
                        while f1.load(Ordering::SeqCst) {
                            tokio::time::sleep(Duration::from_millis(50)).await;
                        }
                        if uw.write_all(&buf[..n]).await.is_err() {
                            return;
                        }
                    }
                };
                let down = async move {
                    let mut buf = vec![0u8; 64 * 1024];
                    loop {
                        let n = match ur.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => n,
                        };
                        while frozen.load(Ordering::SeqCst) {
                            tokio::time::sleep(Duration::from_millis(50)).await;
                        }
                        if cw.write_all(&buf[..n]).await.is_err() {
                            return;
                        }
                    }
                };
                tokio::join!(up, down);
            });
        }
    });
}

async fn runtime_check(admin: &mpsfleet_client::Client, host: &str) -> Option<HostCheck> {
    let h = admin.describe_host(host).await.ok()?;
    h.checks.into_iter().find(|c| c.name == "CONTAINER_RUNTIME")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_docker_engine_impairs_the_host_and_leaves_its_containers_running() {
    let docker = docker_env();
    let dir = tempfile::tempdir().unwrap();
    let frozen = Arc::new(AtomicBool::new(false));
    let socket = dir.path().join("engine.sock");
    relay(&socket, docker.socket.clone(), frozen.clone());
    let server = Server::start(&dir.path().join("server"));
    let admin = server.admin();
    // Self-managed: the incident a hung engine opens is reported, not acted on, so the test
    // can watch the host's containers through it.
    admin
        .create_pool(&CreatePool {
            name: "hang".into(),
            mode: Some(OwnershipMode::SelfManaged),
            ..Default::default()
        })
        .await
        .unwrap();
    let relayed =
        DockerEnv { socket: socket.clone(), image: docker.image.clone(), registry: docker.registry.clone() };
    let _agent = Agent::start_docker(&server, &dir.path().join("a"), "hang", "hang-h0", &relayed, &[]);
    let host = eventually(Duration::from_secs(60), "an ACTIVE docker host", || async {
        let hosts = admin.list_hosts(Some("hang")).await.ok()?;
        hosts
            .into_iter()
            .find(|h| h.status == HostStatus::Active && h.health_status == HealthStatus::Ok)
            .map(|h| h.id.to_string())
    })
    .await;
    let ok = runtime_check(&admin, &host).await.expect("a CONTAINER_RUNTIME check");
    assert_eq!(ok.status, HealthStatus::Ok, "{ok:?}");
    assert!(ok.reason.contains("answers"), "{ok:?}");

    admin
        .register_taskdef(taskdef(serde_json::json!({
            "family": "steady",
            "containerDefinitions": [{"name": "main", "image": docker.image, "command": ["sleep", "600"]}]
        })))
        .await
        .unwrap();
    let run = RunTask {
        task_definition: "steady".into(),
        count: 1,
        pool: "hang".into(),
        client_token: None,
        ..Default::default()
    };
    let id = admin.run_task(&run).await.unwrap().tasks[0].id.to_string();
    let running = eventually(Duration::from_secs(60), "the container to run", || async {
        admin.describe_task(&id).await.ok().filter(|t| t.last_status == TaskStatus::Running)
    })
    .await;
    let cid = running.containers[0].runtime_id.clone().expect("a container id");

    // The engine hangs: pings time out (3 s each), three in a row impair the check and so the
    // host, as a hung MPS daemon would.
    frozen.store(true, Ordering::SeqCst);
    let impaired = eventually(Duration::from_secs(60), "CONTAINER_RUNTIME to be IMPAIRED", || async {
        runtime_check(&admin, &host).await.filter(|c| c.status == HealthStatus::Impaired)
    })
    .await;
    assert!(impaired.reason.contains("ping"), "{impaired:?}");
    let h = admin.describe_host(&host).await.unwrap();
    assert_eq!(h.health_status, HealthStatus::Impaired, "the host follows its worst check");
    // Nothing new is placed there meanwhile, and the running container is left alone.
    let second = admin.run_task(&run).await.unwrap().tasks[0].clone();
    assert!(second.host_id.is_none(), "placed on an impaired host: {second:?}");
    let t = admin.describe_task(&id).await.unwrap();
    assert_eq!(t.last_status, TaskStatus::Running, "a hung engine is no reason to stop tasks: {t:?}");
    assert_eq!(docker.inspect(&cid, "{{.State.Running}}").as_deref(), Some("true"));

    // The engine answers again: the check is OK, the host takes work.
    frozen.store(false, Ordering::SeqCst);
    eventually(Duration::from_secs(60), "CONTAINER_RUNTIME to be OK again", || async {
        runtime_check(&admin, &host).await.filter(|c| c.status == HealthStatus::Ok)
    })
    .await;
    let second_id = second.id.to_string();
    eventually(Duration::from_secs(60), "the waiting task to run", || async {
        admin.describe_task(&second_id).await.ok().filter(|t| t.last_status == TaskStatus::Running)
    })
    .await;
    assert_eq!(docker.inspect(&cid, "{{.RestartCount}}").as_deref(), Some("0"));
    admin.stop_task(&id, None).await.unwrap();
    admin.stop_task(&second_id, None).await.unwrap();
    docker.remove_containers_of_host(&host);
}

/// A stopped task's container is removed once its retention has passed; its output is still
/// there for `task logs`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_tasks_container_is_removed_after_its_retention_and_its_output_stays() {
    let docker = docker_env();
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("server"));
    let admin = server.admin();
    create_pool(&admin, "keep").await;
    let _agent = Agent::start_docker(
        &server,
        &dir.path().join("a"),
        "keep",
        "keep-h0",
        &docker,
        &["--container-retention-s", "3"],
    );
    admin
        .register_taskdef(taskdef(serde_json::json!({
            "family": "brief",
            "containerDefinitions": [{"name": "main", "image": docker.image, "entryPoint": ["sh", "-c"],
                "command": ["echo said-before-exit; exit 4"]}]
        })))
        .await
        .unwrap();
    eventually(Duration::from_secs(60), "an ACTIVE host", || async {
        admin.list_hosts(Some("keep")).await.ok().filter(|h| h.iter().any(|h| h.status == HostStatus::Active))
    })
    .await;
    let run = RunTask {
        task_definition: "brief".into(),
        count: 1,
        pool: "keep".into(),
        client_token: None,
        ..Default::default()
    };
    let id = admin.run_task(&run).await.unwrap().tasks[0].id.to_string();
    let stopped = eventually(Duration::from_secs(60), "the task to stop", || async {
        admin.describe_task(&id).await.ok().filter(|t| t.last_status == TaskStatus::Stopped)
    })
    .await;
    assert_eq!(stopped.containers[0].exit_code, Some(4), "{stopped:?}");
    let cid = stopped.containers[0].runtime_id.clone().expect("a container id");
    assert!(docker.inspect(&cid, "{{.State.Status}}").is_some(), "kept right after the stop");
    eventually(Duration::from_secs(30), "the container to be removed", || async {
        docker.inspect(&cid, "{{.State.Status}}").is_none().then_some(())
    })
    .await;
    let logs =
        admin.task_logs(&id, None, mpsfleet_types::logs::LogStreams::Stdout, 4096, None).await.unwrap();
    assert!(logs.output().contains("said-before-exit"), "{logs:?}");
    docker.remove_containers_of_host(stopped.host_id.as_ref().map_or("", |h| h.as_str()));
}

/// An agent stopped with `--stop-tasks-on-exit` (as `mpsfleet up` runs them) stops its tasks
/// and leaves none of their containers behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_that_stops_its_tasks_on_exit_leaves_no_container_behind() {
    let docker = docker_env();
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("server"));
    let admin = server.admin();
    create_pool(&admin, "bye").await;
    // start_docker passes --stop-tasks-on-exit.
    let mut agent = Agent::start_docker(&server, &dir.path().join("a"), "bye", "bye-h0", &docker, &[]);
    admin
        .register_taskdef(taskdef(serde_json::json!({
            "family": "stay",
            "containerDefinitions": [{"name": "main", "image": docker.image, "command": ["sleep", "600"],
                "stopTimeout": 2}]
        })))
        .await
        .unwrap();
    eventually(Duration::from_secs(60), "an ACTIVE host", || async {
        admin.list_hosts(Some("bye")).await.ok().filter(|h| h.iter().any(|h| h.status == HostStatus::Active))
    })
    .await;
    let run = RunTask {
        task_definition: "stay".into(),
        count: 2,
        pool: "bye".into(),
        client_token: None,
        ..Default::default()
    };
    let ids: Vec<String> =
        admin.run_task(&run).await.unwrap().tasks.iter().map(|t| t.id.to_string()).collect();
    let mut host = String::new();
    for id in &ids {
        let t = eventually(Duration::from_secs(60), "the containers to run", || async {
            admin.describe_task(id).await.ok().filter(|t| t.last_status == TaskStatus::Running)
        })
        .await;
        host = t.host_id.map(|h| h.to_string()).unwrap_or_default();
    }
    assert_eq!(docker.containers_labelled("io.mpsfleet.host", &host).len(), 2);
    agent.terminate();
    for id in &ids {
        let t = admin.describe_task(id).await.unwrap();
        assert_eq!(t.last_status, TaskStatus::Stopped, "reported stopped before the agent left: {t:?}");
    }
    let left = docker.containers_labelled("io.mpsfleet.host", &host);
    assert!(left.is_empty(), "containers left behind: {left:?}");
}
