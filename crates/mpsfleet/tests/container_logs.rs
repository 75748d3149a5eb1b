//! Process test of `task logs` for a task that runs on Docker Engine (the private engine of
//! `scripts/docker-env.sh`): stdout and stderr come from Docker's own log, `stream=all` and
//! `since_ms` from the framed output the agent keeps; once the container is removed the agent
//! still answers from that, and once the agent is gone (SIGKILL) the server shows the last
//! snapshot.

mod common;

use common::*;
use mpsfleet_types::logs::{LogStreams, LogsSource, OutputStream, TaskLogs};
use mpsfleet_types::*;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(90);

/// Removes the containers of host `host` (once it is known), whatever the test's outcome.
struct RemoveContainers<'a> {
    docker: &'a DockerEnv,
    host: Option<String>,
}

impl Drop for RemoveContainers<'_> {
    fn drop(&mut self) {
        if let Some(host) = &self.host {
            self.docker.remove_containers_of_host(host);
        }
    }
}

fn streams_of(logs: &TaskLogs) -> Vec<(OutputStream, String)> {
    logs.lines.as_ref().expect("lines for stream=all").iter().map(|l| (l.stream, l.text.clone())).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn task_logs_of_a_docker_container_by_stream_and_after_it_is_gone() {
    let docker = docker_env();
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("server"));
    let admin = server.admin();
    create_pool(&admin, "gpu").await;
    let mut cleanup = RemoveContainers { docker: &docker, host: None };
    let mut agent = Agent::start_docker(&server, &dir.path().join("a"), "gpu", "logs-host", &docker, &[]);
    let hosts = eventually(WAIT, "the docker host to be ACTIVE", || async {
        admin.list_hosts(None).await.ok().filter(|h| h.len() == 1 && h[0].status == HostStatus::Active)
    })
    .await;
    cleanup.host = Some(hosts[0].id.to_string());

    let script =
        "echo o-1; sleep 0.2; echo e-1 >&2; sleep 0.2; echo o-2; sleep 0.2; echo e-2 >&2; exec sleep 600";
    admin
        .register_taskdef(taskdef(serde_json::json!({
            "family": "both",
            "containerDefinitions": [{
                "name": "main",
                "image": docker.image,
                "entryPoint": ["sh", "-c"],
                "command": [script],
                "stopTimeout": 2
            }]
        })))
        .await
        .unwrap();
    let out = admin
        .run_task(&RunTask {
            task_definition: "both".into(),
            count: 1,
            pool: "gpu".into(),
            client_token: None,
            ..Default::default()
        })
        .await
        .unwrap();
    let id = out.tasks[0].id.to_string();

    // Each stream on its own, from Docker's log.
    let stdout =
        logs_containing(&admin, &id, LogStreams::Stdout, "o-2", WAIT, "the container's stdout").await;
    assert_eq!(stdout.source, LogsSource::Agent, "{stdout:?}\n{}", agent.log());
    assert_eq!(stdout.output(), "o-1\no-2\n");
    let stderr =
        logs_containing(&admin, &id, LogStreams::Stderr, "e-2", WAIT, "the container's stderr").await;
    assert_eq!(stderr.output(), "e-1\ne-2\n");
    let (o, e) = (OutputStream::Stdout, OutputStream::Stderr);
    let want = vec![(o, "o-1\n".to_string()), (e, "e-1\n".into()), (o, "o-2\n".into()), (e, "e-2\n".into())];

    // Both, in the order written, with Docker's times.
    let all = logs_containing(&admin, &id, LogStreams::All, "e-2", WAIT, "both streams").await;
    assert_eq!(streams_of(&all), want);
    let lines = all.lines.clone().unwrap();
    assert!(lines.windows(2).all(|w| w[0].at_ms < w[1].at_ms), "{lines:?}");
    assert_eq!(all.last_at_ms, Some(lines[3].at_ms));
    let later = admin.task_logs(&id, None, LogStreams::All, 4096, Some(lines[1].at_ms)).await.unwrap();
    assert_eq!(streams_of(&later), want[2..].to_vec());
    let err = admin.task_logs(&id, None, LogStreams::Stderr, 4096, Some(lines[1].at_ms)).await.unwrap();
    assert_eq!((err.output().as_str(), err.last_at_ms), ("e-2\n", Some(lines[3].at_ms)));

    // Stopped, and its container removed: the agent answers from the output it kept.
    admin.stop_task(&id, None).await.unwrap();
    eventually(WAIT, "the task to stop", || async {
        admin.describe_task(&id).await.ok().filter(|t| t.last_status == TaskStatus::Stopped)
    })
    .await;
    let containers = docker.containers_labelled("io.mpsfleet.task", &id);
    assert!(!containers.is_empty(), "no container of {id}");
    for c in &containers {
        docker.cli_ok(&["rm", "-f", c]);
    }
    let kept = admin.task_logs(&id, None, LogStreams::Stdout, 4096, None).await.unwrap();
    assert_eq!((kept.source, kept.output().as_str()), (LogsSource::Agent, "o-1\no-2\n"), "{kept:?}");
    let kept = admin.task_logs(&id, None, LogStreams::All, 4096, None).await.unwrap();
    assert_eq!(streams_of(&kept), want);

    // The agent gone for good: the last snapshot, which came with the STOPPED report.
    agent.kill9();
    let snap = admin.task_logs(&id, None, LogStreams::Stdout, 4096, None).await.unwrap();
    assert_eq!(snap.source, LogsSource::Snapshot, "{snap:?}");
    let snapshot = snap.snapshot.as_ref().expect("a snapshot");
    let got: Vec<(OutputStream, String)> =
        snapshot.lines.iter().map(|l| (l.stream, l.text.clone())).collect();
    assert_eq!(got, want);
    // since_ms filters the snapshot's lines by their time too.
    let snap = admin.task_logs(&id, None, LogStreams::All, 4096, Some(lines[2].at_ms)).await.unwrap();
    assert_eq!(snap.source, LogsSource::Snapshot);
    assert_eq!(snap.output(), "e-2\n");
    assert_eq!(snap.last_at_ms, Some(lines[3].at_ms));
}
