//! `mpsfleet task exec` through the binary: on a process host the command runs as the task's
//! process does (uid, environment, working directory, read from outside in `/proc`), on Docker
//! in the task's container (what `docker exec` itself answers, and a file only the image has);
//! exit codes, stdin, stderr and terminals pass through; viewers are refused; each session is
//! in the audit log; a session ends when its task stops (and the command with it), when idle,
//! and past the sessions a task may have; tasks started through ECS without
//! `enableExecuteCommand` are refused, and ECS's `ExecuteCommand` names `task exec`.

mod common;

use common::*;
use mpsfleet_client::Client;
use mpsfleet_types::access::{CreateToken, Role};
use mpsfleet_types::*;
use std::io::Write;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const WAIT: Duration = Duration::from_secs(90);

/// What one CLI run gave back.
struct Ran {
    code: i32,
    stdout: String,
    stderr: String,
}

/// `mpsfleet ARGS` against `server` with `token`, `stdin` written to it (then closed).
fn cli(server: &Server, token: &str, args: &[&str], stdin: &[u8]) -> Ran {
    let mut child = cli_command(server, token, args).spawn().expect("start the CLI");
    let mut input = child.stdin.take().expect("stdin");
    input.write_all(stdin).expect("write stdin");
    drop(input);
    let out = child.wait_with_output().expect("the CLI's output");
    Ran {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

fn cli_command(server: &Server, token: &str, args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_mpsfleet"));
    cmd.args(args)
        .env("MPSFLEET_SERVER", &server.url)
        .env("MPSFLEET_TOKEN", token)
        .env("MPSFLEET_CA_FILE", server.ca_file())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd
}

/// The session commands that tick (not the CLIs that asked for them).
fn tickers() -> usize {
    processes_mentioning("while :; do echo tick").iter().filter(|(_, cmd)| cmd.starts_with("sh -c")).count()
}

fn token_req(role: Role, aws: bool) -> CreateToken {
    CreateToken { role, expires_in_s: None, description: "exec test".into(), pool: None, aws }
}

async fn running(admin: &Client, id: &str) -> Task {
    eventually(WAIT, "the task to run", || async {
        admin.describe_task(id).await.ok().filter(|t| t.last_status == TaskStatus::Running)
    })
    .await
}

async fn run_one(admin: &Client, family: &str) -> String {
    let req = RunTask { task_definition: family.into(), count: 1, pool: "gpu".into(), ..Default::default() };
    let id = admin.run_task(&req).await.unwrap().tasks[0].id.to_string();
    running(admin, &id).await;
    id
}

/// A `/proc/PID/status` id line's first value (`Uid:`, `Gid:`).
fn proc_id(pid: u32, key: &str) -> String {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status.lines().find_map(|l| l.strip_prefix(key)).unwrap().split_whitespace().next().unwrap().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[allow(clippy::disallowed_methods)] // the test's own clock: the idle timeout, from outside
async fn exec_runs_beside_a_process_task_as_it_runs_and_is_audited() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start_with(
        &dir.path().join("server"),
        "127.0.0.1:0",
        &["--exec-idle-timeout", "3", "--exec-sessions-per-task", "2"],
    );
    let admin = server.admin();
    create_pool(&admin, "gpu").await;
    let _agent = Agent::start_with_model(&server, &dir.path().join("a"), 1);
    eventually(WAIT, "the host to be ACTIVE", || async {
        admin.list_hosts(None).await.ok().filter(|h| h.len() == 1 && h[0].status == HostStatus::Active)
    })
    .await;
    admin
        .register_taskdef(taskdef(serde_json::json!({
            "family": "app",
            "containerDefinitions": [{
                "name": "main", "command": ["/bin/sh", "-c", "exec sleep 600"], "stopTimeout": 2,
                "environment": [{"name": "GREETING", "value": "hello from the task"}]
            }]
        })))
        .await
        .unwrap();
    let id = run_one(&admin, "app").await;
    let task = admin.describe_task(&id).await.unwrap();
    let pid: u32 = task.containers[0]
        .runtime_id
        .as_deref()
        .and_then(|r| r.strip_prefix("pid "))
        .expect("the task's pid")
        .parse()
        .unwrap();
    let token = server.admin_token();

    // Its id, uid, working directory and environment, as the task's process has them.
    let ran = cli(
        &server,
        &token,
        &["task", "exec", &id, "--", "sh", "-c", "echo $MPSFLEET_TASK_ID; id -u; id -g; pwd; echo $GREETING"],
        b"",
    );
    assert_eq!(ran.code, 0, "{}", ran.stderr);
    let cwd = std::fs::read_link(format!("/proc/{pid}/cwd")).unwrap();
    let want = [
        id.clone(),
        proc_id(pid, "Uid:"),
        proc_id(pid, "Gid:"),
        cwd.display().to_string(),
        "hello from the task".into(),
    ];
    assert_eq!(ran.stdout.lines().collect::<Vec<_>>(), want, "{}", ran.stderr);
    assert_ne!(want[1], "0", "a task of a root agent runs as its own uid, and so does its exec");

    // Exit codes, stderr, stdin, a command that does not exist, a terminal.
    let ran = cli(&server, &token, &["task", "exec", &id, "--", "sh", "-c", "echo oops >&2; exit 3"], b"");
    assert_eq!((ran.code, ran.stderr.as_str(), ran.stdout.as_str()), (3, "oops\n", ""));
    let ran = cli(
        &server,
        &token,
        &["task", "exec", "-i", &id, "--", "sh", "-c", "tr a-z A-Z; echo done"],
        b"piped in\n",
    );
    assert_eq!((ran.code, ran.stdout.as_str()), (0, "PIPED IN\ndone\n"), "{}", ran.stderr);
    let ran = cli(&server, &token, &["task", "exec", &id, "--", "cat"], b"not passed without -i\n");
    assert_eq!((ran.code, ran.stdout.as_str()), (0, ""), "{}", ran.stderr);
    let ran = cli(&server, &token, &["task", "exec", &id, "--", "no-such-command-here"], b"");
    assert_eq!(ran.code, 127, "{}", ran.stderr);
    assert!(ran.stderr.contains("no-such-command-here"), "{}", ran.stderr);
    let ran = cli(
        &server,
        &token,
        &["task", "exec", "-t", &id, "--", "sh", "-c", "tty; test -t 0 && echo on-a-terminal"],
        b"",
    );
    assert_eq!(ran.code, 0, "{}", ran.stderr);
    assert!(ran.stdout.starts_with("/dev/pts/") && ran.stdout.contains("on-a-terminal"), "{:?}", ran.stdout);

    // Bad input names what is wrong.
    let ran = cli(&server, &token, &["task", "exec", "-c", "nope", &id, "--", "true"], b"");
    assert!(
        ran.code == 1 && ran.stderr.contains("no container \"nope\"") && ran.stderr.contains("main"),
        "{}",
        ran.stderr
    );
    let ran = cli(&server, &token, &["task", "exec", "t-00000000000000ff", "--", "true"], b"");
    assert!(ran.code == 1 && ran.stderr.contains("not found"), "{}", ran.stderr);

    // A viewer is refused; an operator may.
    let viewer = admin.create_token(&token_req(Role::Viewer, false)).await.unwrap();
    let ran = cli(&server, &viewer.token, &["task", "exec", &id, "--", "true"], b"");
    assert!(ran.code == 1 && ran.stderr.contains("not open to"), "{}", ran.stderr);
    let operator = admin.create_token(&token_req(Role::Operator, false)).await.unwrap();
    let ran = cli(&server, &operator.token, &["task", "exec", &id, "--", "sh", "-c", "exit 7"], b"");
    assert_eq!(ran.code, 7, "{}", ran.stderr);
    // An operator of another pool does not reach (or see) this one's tasks.
    create_pool(&admin, "other").await;
    let elsewhere = admin
        .create_token(&CreateToken { pool: Some("other".into()), ..token_req(Role::Operator, false) })
        .await
        .unwrap()
        .token;
    let ran = cli(&server, &elsewhere, &["task", "exec", &id, "--", "true"], b"");
    assert!(ran.code == 1 && ran.stderr.contains("not found"), "{}", ran.stderr);

    // The operator's session is audited: who, the task, the command line, its start and end.
    let audit = admin.audit(100).await.unwrap();
    let mine: Vec<_> = audit
        .iter()
        .filter(|e| e.event.actor == format!("token:{}", operator.view.id) && e.event.target.contains(&id))
        .collect();
    assert_eq!(mine.len(), 2, "{audit:#?}");
    assert!(mine.iter().all(|e| e.event.target.ends_with("-- sh -c 'exit 7'")), "{mine:#?}");
    assert!(mine[0].event.result.starts_with("session started"), "{mine:#?}");
    assert!(mine[1].event.result.starts_with("ended: exit code 7"), "{mine:#?}");
    assert!(mine[0].at_ms <= mine[1].at_ms);
    // A call refused for its token's role never reaches the cluster: no entry, no session.
    let viewers = format!("token:{}", viewer.view.id);
    assert!(audit.iter().all(|e| e.event.actor != viewers), "{audit:#?}");

    // Two sessions at most on one task (as configured); a third is refused, naming the limit.
    let ticking = "while :; do echo tick; sleep 0.5; done";
    let mut a =
        cli_command(&server, &token, &["task", "exec", &id, "--", "sh", "-c", ticking]).spawn().unwrap();
    let mut b =
        cli_command(&server, &token, &["task", "exec", &id, "--", "sh", "-c", ticking]).spawn().unwrap();
    eventually(WAIT, "two sessions ticking", || async { (tickers() == 2).then_some(()) }).await;
    let ran = cli(&server, &token, &["task", "exec", &id, "--", "true"], b"");
    assert!(ran.code == 1 && ran.stderr.contains("--exec-sessions-per-task"), "{}", ran.stderr);
    let _ = a.kill();
    let _ = a.wait();
    // The client left: its command is killed, and its seat given back.
    eventually(WAIT, "the left session's command to end", || async { (tickers() == 1).then_some(()) }).await;

    // An idle session is closed after --exec-idle-timeout (3 s), and says so.
    let mut idle = cli_command(&server, &token, &["task", "exec", "-i", &id, "--", "cat"]).spawn().unwrap();
    let began = Instant::now();
    // Held open (and silent): `wait` would close it.
    let _stdin = idle.stdin.take();
    let status = idle.wait().unwrap();
    let mut err = String::new();
    std::io::Read::read_to_string(&mut idle.stderr.take().unwrap(), &mut err).unwrap();
    assert_eq!(status.code(), Some(255), "{err}");
    assert!(err.contains("closed after 3 s without input or output"), "{err}");
    assert!(began.elapsed() >= Duration::from_secs(3), "{:?}", began.elapsed());

    // The task stops: the ticking session ends, the CLI says so, and its command is gone.
    admin.stop_task(&id, Some("done debugging".into())).await.unwrap();
    let status = b.wait().unwrap();
    let mut err = String::new();
    std::io::Read::read_to_string(&mut b.stderr.take().unwrap(), &mut err).unwrap();
    assert_eq!(status.code(), Some(255), "{err}");
    assert!(err.contains(&format!("task {id} stopped")), "{err}");
    eventually(WAIT, "the session's command to end with its task", || async {
        (tickers() == 0).then_some(())
    })
    .await;
    let ran = cli(&server, &token, &["task", "exec", &id, "--", "true"], b"");
    assert!(ran.code == 1 && ran.stderr.contains("RUNNING task"), "{}", ran.stderr);

    // Through ECS, tasks run without enableExecuteCommand unless asked, as in ECS.
    let key = admin.create_token(&token_req(Role::Operator, true)).await.unwrap();
    let key = (key.view.access_key_id.clone().unwrap(), key.token);
    let http = server.http();
    let key_ref = (key.0.as_str(), key.1.as_str());
    let (status, off) = ecs_call(
        &http,
        &server.url,
        key_ref,
        "RunTask",
        serde_json::json!({"cluster": "gpu", "taskDefinition": "app"}),
    )
    .await;
    assert_eq!(status, 200, "{off}");
    assert_eq!(off["tasks"][0]["enableExecuteCommand"], false, "{off}");
    let (_, on) = ecs_call(
        &http,
        &server.url,
        key_ref,
        "RunTask",
        serde_json::json!({"cluster": "gpu", "taskDefinition": "app", "enableExecuteCommand": true}),
    )
    .await;
    assert_eq!(on["tasks"][0]["enableExecuteCommand"], true, "{on}");
    let short = |v: &serde_json::Value| {
        v["tasks"][0]["taskArn"].as_str().unwrap().rsplit('/').next().unwrap().to_string()
    };
    let (off_id, on_id) = (short(&off), short(&on));
    running(&admin, &off_id).await;
    running(&admin, &on_id).await;
    let ran = cli(&server, &token, &["task", "exec", &off_id, "--", "true"], b"");
    assert!(ran.code == 1 && ran.stderr.contains("enableExecuteCommand"), "{}", ran.stderr);
    let ran = cli(&server, &token, &["task", "exec", &on_id, "--", "sh", "-c", "exit 4"], b"");
    assert_eq!(ran.code, 4, "{}", ran.stderr);
    let (_, described) = ecs_call(
        &http,
        &server.url,
        key_ref,
        "DescribeTasks",
        serde_json::json!({"cluster": "gpu", "tasks": [off_id]}),
    )
    .await;
    assert_eq!(described["tasks"][0]["enableExecuteCommand"], false, "{described}");
    // A service made through ECS starts its tasks with it off too, until UpdateService says so.
    let (_, created) = ecs_call(
        &http,
        &server.url,
        key_ref,
        "CreateService",
        serde_json::json!({"cluster": "gpu", "serviceName": "svc", "taskDefinition": "app", "desiredCount": 1}),
    )
    .await;
    assert_eq!(created["service"]["enableExecuteCommand"], false, "{created}");
    let svc_task = eventually(WAIT, "the service's task to run", || async {
        let q = mpsfleet_client::TaskQuery { service: Some("svc".into()), live: true, ..Default::default() };
        let tasks = admin.list_tasks(&q).await.ok()?;
        tasks.into_iter().find(|t| t.last_status == TaskStatus::Running)
    })
    .await;
    assert!(!svc_task.enable_execute_command);
    let ran = cli(&server, &token, &["task", "exec", &svc_task.id.to_string(), "--", "true"], b"");
    assert!(ran.code == 1 && ran.stderr.contains("enableExecuteCommand"), "{}", ran.stderr);
    let (_, updated) = ecs_call(
        &http,
        &server.url,
        key_ref,
        "UpdateService",
        serde_json::json!({"cluster": "gpu", "service": "svc", "enableExecuteCommand": true}),
    )
    .await;
    assert_eq!(updated["service"]["enableExecuteCommand"], true, "{updated}");
    let (status, refused) = ecs_call(
        &http,
        &server.url,
        key_ref,
        "ExecuteCommand",
        serde_json::json!({"cluster": "gpu", "task": on_id, "command": "sh", "interactive": true}),
    )
    .await;
    assert_eq!(status, 400, "{refused}");
    assert!(refused["message"].as_str().unwrap_or_default().contains("mpsfleet task exec"), "{refused}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_runs_in_a_docker_container_as_docker_exec_does() {
    let docker = docker_env();
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("server"));
    let admin = server.admin();
    create_pool(&admin, "gpu").await;
    let _agent = Agent::start_docker(&server, &dir.path().join("a"), "gpu", "exec-docker", &docker, &[]);
    eventually(WAIT, "the host to be ACTIVE", || async {
        admin.list_hosts(None).await.ok().filter(|h| h.len() == 1 && h[0].status == HostStatus::Active)
    })
    .await;
    admin
        .register_taskdef(taskdef(serde_json::json!({
            "family": "boxed",
            "containerDefinitions": [{
                "name": "box", "image": docker.image, "command": ["sh", "-c", "cd /tmp && exec sleep 600"],
                "workingDirectory": "/tmp", "memory": 64, "stopTimeout": 2
            }]
        })))
        .await
        .unwrap();
    let id = run_one(&admin, "boxed").await;
    let container =
        admin.describe_task(&id).await.unwrap().containers[0].runtime_id.clone().expect("its container");
    let token = server.admin_token();

    let ran = cli(
        &server,
        &token,
        &["task", "exec", &id, "--", "sh", "-c", "echo $MPSFLEET_TASK_ID; id -u; pwd; cat /etc/passwd"],
        b"",
    );
    assert_eq!(ran.code, 0, "{}", ran.stderr);
    // What Docker's own exec answers in that container, and the image's own file.
    let uid = docker.cli_ok(&["exec", &container, "id", "-u"]);
    let pwd = docker.cli_ok(&["exec", &container, "pwd"]);
    let image_passwd = docker.cli_ok(&["run", "--rm", &docker.image, "cat", "/etc/passwd"]);
    let host_passwd = std::fs::read_to_string("/etc/passwd").unwrap();
    assert_ne!(image_passwd.trim(), host_passwd.trim(), "the file must be the image's alone");
    assert_eq!(ran.stdout, format!("{id}\n{uid}\n{pwd}\n{image_passwd}\n"), "{}", ran.stderr);

    let ran = cli(&server, &token, &["task", "exec", &id, "--", "sh", "-c", "echo oops >&2; exit 3"], b"");
    assert_eq!((ran.code, ran.stderr.as_str()), (3, "oops\n"));
    let ran = cli(
        &server,
        &token,
        &["task", "exec", "-i", "-c", "box", &id, "--", "sh", "-c", "tr a-z A-Z"],
        b"piped in\n",
    );
    assert_eq!((ran.code, ran.stdout.as_str()), (0, "PIPED IN\n"), "{}", ran.stderr);
    let ran = cli(
        &server,
        &token,
        &["task", "exec", "-t", &id, "--", "sh", "-c", "test -t 0 && echo on-a-terminal"],
        b"",
    );
    assert_eq!((ran.code, ran.stdout.trim()), (0, "on-a-terminal"), "{}", ran.stderr);
    // Output larger than any frame or queue arrives whole, in order.
    let ran = cli(&server, &token, &["task", "exec", &id, "--", "sh", "-c", "seq 1 200000"], b"");
    assert_eq!(ran.code, 0, "{}", ran.stderr);
    let want: String = (1..=200_000).map(|n| format!("{n}\n")).collect();
    assert!(ran.stdout == want, "{} bytes, not {}", ran.stdout.len(), want.len());
}
