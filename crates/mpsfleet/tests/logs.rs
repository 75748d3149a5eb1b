//! Process tests of `task logs`: a task's output outlives its host (the agent reports the
//! task's recent output with its states; once the agent is gone, SIGKILL and never restarted,
//! `task logs` shows the last snapshot, both streams interleaved, and says so); `stream=all`
//! interleaves both streams in the order written; `since_ms` returns only later output; and
//! `task logs --follow` prints a task's output as it comes and ends with the task.

mod common;

use common::*;
use mpsfleet_client::{Client, TaskQuery};
use mpsfleet_types::logs::{LogStreams, LogsSource, OutputStream};
use mpsfleet_types::*;
use std::process::Command;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(60);

/// A server with pool "gpu" and one ACTIVE agent on the MPS model, and a task definition
/// for each `(family, script)`: one container "main" that runs `/bin/sh -c SCRIPT`.
/// Fields drop in order: the agent first, the data directory last.
struct Fleet {
    agent: Agent,
    admin: Client,
    server: Server,
    dir: tempfile::TempDir,
}

impl Fleet {
    async fn start(families: &[(&str, &str)]) -> Fleet {
        let dir = tempfile::tempdir().unwrap();
        let server = Server::start(&dir.path().join("server"));
        let admin = server.admin();
        create_pool(&admin, "gpu").await;
        let agent = Agent::start_with_model(&server, &dir.path().join("a"), 1);
        eventually(WAIT, "the host to be ACTIVE", || async {
            admin.list_hosts(None).await.ok().filter(|h| h.len() == 1 && h[0].status == HostStatus::Active)
        })
        .await;
        for (family, script) in families {
            admin
                .register_taskdef(taskdef(serde_json::json!({
                    "family": family,
                    "containerDefinitions": [{"name": "main", "command": ["/bin/sh", "-c", script], "stopTimeout": 2}]
                })))
                .await
                .unwrap();
        }
        Fleet { agent, admin, server, dir }
    }

    /// Runs one task of `family` in pool "gpu"; its id.
    async fn run(&self, family: &str) -> String {
        let out = self
            .admin
            .run_task(&RunTask {
                task_definition: family.into(),
                count: 1,
                pool: "gpu".into(),
                client_token: None,
                ..Default::default()
            })
            .await
            .unwrap();
        out.tasks[0].id.to_string()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn task_logs_come_from_the_last_snapshot_once_the_agent_is_gone() {
    // Two pipes carry no order between them: writes a moment apart keep theirs.
    let talker =
        "echo out-1; sleep 0.2; echo err-1 >&2; sleep 0.2; echo out-2; sleep 0.2; echo err-2 >&2; exec sleep 600";
    let finisher = "echo done-out; sleep 0.2; echo done-err >&2; exit 3";
    let mut fleet = Fleet::start(&[("talker", talker), ("finisher", finisher)]).await;
    let admin = fleet.admin.clone();
    let talking = fleet.run("talker").await;
    let finished = fleet.run("finisher").await;
    // While the agent runs, logs come from it, one stream at a time.
    let live = logs_containing(
        &admin,
        &talking,
        LogStreams::Stderr,
        "err-2",
        WAIT,
        "the talker's stderr from its agent",
    )
    .await;
    assert_eq!(live.source, LogsSource::Agent);
    assert_eq!(live.output(), "err-1\nerr-2\n");
    let done = eventually(WAIT, "the finisher to stop", || async {
        admin.describe_task(&finished).await.ok().filter(|t| t.last_status == TaskStatus::Stopped)
    })
    .await;
    assert_eq!(done.stop_code, Some(StopCode::EssentialContainerExited));
    // The talker's first snapshot went with the report after its first line; the rest waits
    // for the next one, 30 s later (OUTPUT_REPORT_EVERY). Then the agent dies for good.
    let since_start = eventually(WAIT, "the talker to be RUNNING", || async {
        admin.describe_task(&talking).await.ok().and_then(|t| t.started_at_ms)
    })
    .await;
    let now_ms = mpsfleet_core::clock::Clock::now_ms(&mpsfleet_core::clock::SystemClock);
    let next_report = since_start + mpsfleet_agent::tasks::OUTPUT_REPORT_EVERY.as_millis() as u64 + 2_000;
    tokio::time::sleep(Duration::from_millis(next_report.saturating_sub(now_ms))).await;
    fleet.agent.kill9();

    let logs = admin.task_logs(&talking, None, LogStreams::Stdout, 4096, None).await.unwrap();
    assert_eq!(logs.source, LogsSource::Snapshot, "{logs:?}");
    assert!(logs.note.as_deref().unwrap_or("").starts_with("host unreachable"), "{logs:?}");
    let snapshot = logs.snapshot.as_ref().expect("a snapshot");
    let lines: Vec<(OutputStream, &str)> =
        snapshot.lines.iter().map(|l| (l.stream, l.text.as_str())).collect();
    assert_eq!(
        lines,
        vec![
            (OutputStream::Stdout, "out-1\n"),
            (OutputStream::Stderr, "err-1\n"),
            (OutputStream::Stdout, "out-2\n"),
            (OutputStream::Stderr, "err-2\n"),
        ],
        "both streams, in the order written"
    );
    assert!(snapshot.lines.iter().all(|l| l.container == "main" && l.at_ms > 0));
    assert!(logs.reported_at_ms.is_some_and(|at| at >= snapshot.taken_at_ms.saturating_sub(5_000)));

    // The task that ended sent its last output with its STOPPED report.
    let logs = admin.task_logs(&finished, None, LogStreams::Stdout, 4096, None).await.unwrap();
    assert_eq!(logs.source, LogsSource::Snapshot, "{logs:?}");
    assert_eq!(logs.output(), "done-out\ndone-err\n");

    // The CLI says where the lines come from, on stderr, and keeps each stream on its own.
    let out = Command::new(env!("CARGO_BIN_EXE_mpsfleet"))
        .args([
            "task",
            "logs",
            &talking,
            "--server",
            &fleet.server.url,
            "--token",
            &fleet.server.admin_token(),
            "--ca-file",
            &fleet.server.ca_file(),
        ])
        .output()
        .unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{stderr}");
    assert_eq!(stdout, "out-1\nout-2\n");
    assert!(stderr.starts_with("showing the last snapshot reported at 20"), "{stderr}");
    assert!(stderr.contains("(host unreachable: "), "{stderr}");
    assert!(stderr.ends_with("err-1\nerr-2\n"), "{stderr}");

    // The shims outlive the killed agent by design: end the talker.
    stop_processes_mentioning(&fleet.dir.path().display().to_string());
}

/// The lines of an answer for `stream=all`: stream, text.
fn streams_of(logs: &mpsfleet_types::logs::TaskLogs) -> Vec<(OutputStream, String)> {
    logs.lines.as_ref().expect("lines for stream=all").iter().map(|l| (l.stream, l.text.clone())).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn task_logs_interleave_both_streams_give_later_output_and_follow_a_task_to_its_end() {
    let both =
        "echo o-1; sleep 0.2; echo e-1 >&2; sleep 0.2; echo o-2; sleep 0.2; echo e-2 >&2; exec sleep 600";
    let ticker = "for i in 1 2 3 4 5 6 7 8 9 10; do echo tick-$i; sleep 0.2; done; echo bye >&2";
    let fleet = Fleet::start(&[("both", both), ("ticker", ticker)]).await;
    let (admin, server) = (&fleet.admin, &fleet.server);

    // Both streams, in the order written, each line with its stream and time.
    let id = fleet.run("both").await;
    let all =
        logs_containing(admin, &id, LogStreams::All, "e-2", WAIT, "all four lines from the agent").await;
    assert_eq!(all.source, LogsSource::Agent, "{all:?}");
    assert_eq!(all.stream, Some(LogStreams::All));
    let (o, e) = (OutputStream::Stdout, OutputStream::Stderr);
    assert_eq!(
        streams_of(&all),
        vec![(o, "o-1\n".into()), (e, "e-1\n".into()), (o, "o-2\n".into()), (e, "e-2\n".into())]
    );
    let lines = all.lines.clone().unwrap();
    assert!(lines.windows(2).all(|w| w[0].at_ms < w[1].at_ms), "{lines:?}");
    assert!(lines.iter().all(|l| l.container == "main"));
    assert_eq!(all.last_at_ms, Some(lines[3].at_ms));
    // The tail counts bytes from the end, cutting the oldest line kept.
    let tail = admin.task_logs(&id, None, LogStreams::All, 5, None).await.unwrap();
    assert_eq!(streams_of(&tail), vec![(o, "\n".into()), (e, "e-2\n".into())]);

    // since_ms: only what was written strictly after it, for any stream.
    let later = admin.task_logs(&id, None, LogStreams::All, 4096, Some(lines[1].at_ms)).await.unwrap();
    assert_eq!(streams_of(&later), vec![(o, "o-2\n".into()), (e, "e-2\n".into())]);
    assert_eq!(later.last_at_ms, Some(lines[3].at_ms));
    let out = admin.task_logs(&id, None, LogStreams::Stdout, 4096, Some(lines[0].at_ms)).await.unwrap();
    assert_eq!((out.output().as_str(), out.last_at_ms), ("o-2\n", Some(lines[2].at_ms)));
    let err = admin.task_logs(&id, None, LogStreams::Stderr, 4096, Some(0)).await.unwrap();
    assert_eq!(err.output(), "e-1\ne-2\n");
    let none = admin.task_logs(&id, None, LogStreams::All, 4096, Some(lines[3].at_ms)).await.unwrap();
    assert_eq!((streams_of(&none), none.last_at_ms), (vec![], Some(lines[3].at_ms)), "nothing newer");

    // Bad values are refused, naming the parameter.
    let http = server.http();
    for (query, field) in [("stream=both", "stream"), ("since_ms=soon", "since_ms"), ("tail=0", "tail")] {
        let resp = http
            .get(format!("{}/v1/tasks/{id}/logs?{query}", server.url))
            .bearer_auth(server.admin_token())
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 400, "{query}");
        let body = resp.text().await.unwrap();
        assert!(body.contains(field), "{query}: {body}");
    }

    // `--follow` prints every line once, each stream to its own, and ends with the task.
    let ticking = fleet.run("ticker").await;
    eventually(WAIT, "the ticker to be RUNNING", || async {
        admin.describe_task(&ticking).await.ok().filter(|t| t.last_status == TaskStatus::Running)
    })
    .await;
    let mut follow = Command::new(env!("CARGO_BIN_EXE_mpsfleet"))
        .args(["task", "logs", &ticking, "--follow", "--stream", "all"])
        .args(["--server", &server.url, "--token", &server.admin_token(), "--ca-file", &server.ca_file()])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let drain = |mut pipe: Box<dyn std::io::Read + Send>| {
        std::thread::spawn(move || {
            let mut s = String::new();
            pipe.read_to_string(&mut s).map(|_| s)
        })
    };
    let out = drain(Box::new(follow.stdout.take().unwrap()));
    let err = drain(Box::new(follow.stderr.take().unwrap()));
    let deadline = tokio::time::Instant::now() + WAIT;
    let status = loop {
        if let Some(status) = follow.try_wait().unwrap() {
            break status;
        }
        if tokio::time::Instant::now() > deadline {
            let _ = follow.kill();
            panic!("task logs --follow did not end with its task");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let (out, err) = (out.join().unwrap().unwrap(), err.join().unwrap().unwrap());
    let want: String = (1..=10).map(|i| format!("tick-{i}\n")).collect();
    assert_eq!(out, want, "stderr: {err}");
    assert_eq!(err, "bye\n");
    assert!(status.success(), "{status:?}: {err}");
    let done = admin.describe_task(&ticking).await.unwrap();
    assert_eq!(done.last_status, TaskStatus::Stopped);
    admin.stop_task(&id, None).await.unwrap();
}

/// Runs the CLI against the fleet's server; its stdout (the test fails on a non-zero exit).
fn cli(server: &Server, args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_mpsfleet"))
        .args(args)
        .args(["--server", &server.url, "--token", &server.admin_token(), "--ca-file", &server.ca_file()])
        .output()
        .unwrap();
    assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn service_logs_interleave_every_replica_and_task_logs_take_since_and_timestamps() {
    let chatty = "i=0; while true; do i=$((i+1)); echo \"line-$i from $$\"; sleep 0.3; done";
    let late = "echo early; sleep 3; echo late; exec sleep 600";
    let fleet = Fleet::start(&[("chatty", chatty), ("late", late)]).await;
    let (admin, server) = (&fleet.admin, &fleet.server);

    // task logs --since keeps only what was written that recently; --timestamps says when.
    let id = fleet.run("late").await;
    let all = logs_containing(admin, &id, LogStreams::All, "late", WAIT, "both lines").await;
    let at_late = all.lines.as_ref().unwrap().iter().find(|l| l.text == "late\n").unwrap().at_ms;
    let recent = cli(server, &["task", "logs", &id, "--since", "2s", "--timestamps"]);
    let lines: Vec<&str> = recent.lines().collect();
    assert_eq!(lines.len(), 1, "only the late line is 2 s recent: {recent}");
    let (stamp, text) = lines[0].split_once(' ').unwrap();
    assert_eq!((stamp, text), (mpsfleet_types::utc(at_late).as_str(), "late"), "{recent}");
    assert_eq!(cli(server, &["task", "logs", &id]), "early\nlate\n");

    // service logs: every replica's lines, each prefixed with its task, in time order.
    admin
        .create_service(&CreateService {
            name: "chatty".into(),
            pool: "gpu".into(),
            task_definition: "chatty".into(),
            desired_count: 2,
            ..Default::default()
        })
        .await
        .unwrap();
    let q = TaskQuery { service: Some("chatty".into()), live: true, ..Default::default() };
    let replicas = eventually(WAIT, "two RUNNING replicas", || async {
        let tasks = admin.list_tasks(&q).await.ok()?;
        (tasks.len() == 2 && tasks.iter().all(|t| t.last_status == TaskStatus::Running)).then_some(tasks)
    })
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await; // a few lines each
    let out = cli(server, &["service", "logs", "chatty", "--timestamps"]);
    for t in &replicas {
        let prefix = format!("[task/{}/main] ", t.id);
        assert!(out.lines().filter(|l| l.starts_with(&prefix)).count() >= 2, "{prefix}: {out}");
    }
    let stamps: Vec<&str> = out.lines().map(|l| l.split(' ').nth(1).unwrap()).collect();
    let mut sorted = stamps.clone();
    sorted.sort();
    assert_eq!(stamps, sorted, "lines interleave by time: {out}");

    // --follow: new lines of both replicas as they are written.
    let mut follow = Command::new(env!("CARGO_BIN_EXE_mpsfleet"))
        .args(["service", "logs", "chatty", "--follow", "--tail", "1", "-o", "json"])
        .args(["--server", &server.url, "--token", &server.admin_token(), "--ca-file", &server.ca_file()])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = follow.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel::<serde_json::Value>();
    std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(serde_json::from_str(&line).expect("a JSON line"));
        }
    });
    let mut seen: std::collections::BTreeMap<String, Vec<String>> = Default::default();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while seen.len() < 2 || seen.values().any(|v| v.len() < 4) {
        assert!(tokio::time::Instant::now() < deadline, "lines of both replicas while following: {seen:?}");
        if let Ok(v) = rx.recv_timeout(Duration::from_secs(1)) {
            let task = v["taskId"].as_str().unwrap().to_string();
            seen.entry(task).or_default().push(v["text"].as_str().unwrap().to_string());
        }
    }
    let _ = follow.kill();
    let _ = follow.wait();
    for (task, lines) in &seen {
        // Each replica's lines come once each, in order: line-N, line-N+1, ...
        let n: Vec<u64> = lines
            .iter()
            .map(|l| l.trim_start_matches("line-").split(' ').next().unwrap().parse().unwrap())
            .collect();
        assert!(n.windows(2).all(|w| w[1] == w[0] + 1), "{task}: {lines:?}");
    }
}
