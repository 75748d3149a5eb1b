//! Process test: a task's output outlives its host. The agent reports the task's recent
//! output with its states; once the agent is gone (SIGKILL, never restarted), `task logs`
//! shows the last snapshot, both streams interleaved, and says so.

mod common;

use common::*;
use mpsfleet_types::logs::{LogsSource, OutputStream};
use mpsfleet_types::*;
use std::process::Command;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn task_logs_come_from_the_last_snapshot_once_the_agent_is_gone() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("server"));
    let admin = server.admin();
    create_pool(&admin, "gpu").await;
    let mut agent = Agent::start_with_model(&server, &dir.path().join("a"), 1);
    eventually(WAIT, "the host to be ACTIVE", || async {
        admin.list_hosts(None).await.ok().filter(|h| h.len() == 1 && h[0].status == HostStatus::Active)
    })
    .await;
    // Two pipes carry no order between them: writes a moment apart keep theirs.
    let talker =
        "echo out-1; sleep 0.2; echo err-1 >&2; sleep 0.2; echo out-2; sleep 0.2; echo err-2 >&2; exec sleep 600";
    let finisher = "echo done-out; sleep 0.2; echo done-err >&2; exit 3";
    for (family, script) in [("talker", talker), ("finisher", finisher)] {
        admin
            .register_taskdef(taskdef(serde_json::json!({
                "family": family,
                "containerDefinitions": [{"name": "main", "command": ["/bin/sh", "-c", script], "stopTimeout": 2}]
            })))
            .await
            .unwrap();
    }
    let run = |family: &'static str| {
        let admin = admin.clone();
        async move {
            let out = admin
                .run_task(&RunTask { task_definition: family.into(), count: 1, pool: "gpu".into() })
                .await
                .unwrap();
            out.tasks[0].id.to_string()
        }
    };
    let talking = run("talker").await;
    let finished = run("finisher").await;
    // While the agent runs, logs come from it, one stream at a time.
    let live = eventually(WAIT, "the talker's stderr from its agent", || async {
        admin.task_logs(&talking, None, true, 4096).await.ok().filter(|l| l.output().contains("err-2"))
    })
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
    agent.kill9();

    let logs = admin.task_logs(&talking, None, false, 4096).await.unwrap();
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
    let logs = admin.task_logs(&finished, None, false, 4096).await.unwrap();
    assert_eq!(logs.source, LogsSource::Snapshot, "{logs:?}");
    assert_eq!(logs.output(), "done-out\ndone-err\n");

    // The CLI says where the lines come from, on stderr, and keeps each stream on its own.
    let out = Command::new(env!("CARGO_BIN_EXE_mpsfleet"))
        .args(["task", "logs", &talking, "--server", &server.url, "--token", &server.admin_token()])
        .output()
        .unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{stderr}");
    assert_eq!(stdout, "out-1\nout-2\n");
    assert!(stderr.starts_with("showing the last snapshot reported at 20"), "{stderr}");
    assert!(stderr.contains("(host unreachable: "), "{stderr}");
    assert!(stderr.ends_with("err-1\nerr-2\n"), "{stderr}");

    // The shims outlive the killed agent by design: end the talker.
    stop_processes_mentioning(&dir.path().display().to_string());
}
