//! Process tests of multi-container tasks: `dependsOn` (START, COMPLETE, SUCCESS, HEALTHY),
//! `startTimeout`, `essential` and the stop order, with the real server and agent binaries,
//! on both runtimes: processes (containers with a command and no image) and the private
//! Docker Engine of `scripts/docker-env.sh` (`eval "$(bash scripts/docker-env.sh env)"` first).
//!
//! The containers write when they start and stop into files (processes) or are read back with
//! Docker's `State.StartedAt` and `State.FinishedAt`, so that each test asserts the order in
//! which things happened, not only the task's final status.

mod common;

use common::*;
use mpsfleet_client::Client;
use mpsfleet_types::*;
use serde_json::{json, Value};
use std::path::PathBuf;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(90);

/// A server, pool `gpu` and one agent (processes with the in-process MPS model, or Docker).
struct Fleet {
    agent: Option<Agent>,
    docker: Option<DockerEnv>,
    host: Option<HostId>,
    admin: Client,
    server: Server,
    dir: tempfile::TempDir,
    /// Where process containers write (every task uid may write there).
    shared: PathBuf,
}

impl Drop for Fleet {
    fn drop(&mut self) {
        self.agent = None;
        if let (Some(d), Some(h)) = (&self.docker, &self.host) {
            d.remove_containers_of_host(h.as_str());
        }
    }
}

impl Fleet {
    async fn processes() -> Fleet {
        Fleet::start(None).await
    }

    async fn docker(hostname: &str) -> Fleet {
        Fleet::start(Some(hostname)).await
    }

    async fn start(docker_host: Option<&str>) -> Fleet {
        let dir = tempfile::tempdir().unwrap();
        let shared = task_writable_dir(dir.path());
        let server = Server::start(&dir.path().join("server"));
        let admin = server.admin();
        create_pool(&admin, "gpu").await;
        let mut fleet =
            Fleet { agent: None, docker: None, host: None, admin, server, dir, shared: shared.clone() };
        fleet.docker = docker_host.map(|_| docker_env());
        fleet.agent = Some(fleet.start_agent(docker_host));
        let admin = fleet.admin.clone();
        let hosts = eventually(WAIT, "an ACTIVE host", || async {
            admin
                .list_hosts(Some("gpu"))
                .await
                .ok()
                .filter(|h| h.len() == 1 && h[0].status == HostStatus::Active)
        })
        .await;
        fleet.host = Some(hosts[0].id.clone());
        fleet
    }

    fn start_agent(&self, docker_host: Option<&str>) -> Agent {
        let data = self.dir.path().join("agent");
        match (docker_host, &self.docker) {
            (Some(name), Some(docker)) => Agent::start_docker(&self.server, &data, "gpu", name, docker, &[]),
            _ => Agent::start_with_model(&self.server, &data, 1),
        }
    }

    fn logs(&self) -> String {
        self.agent.as_ref().map(Agent::log).unwrap_or_default()
    }

    async fn run(&self, def: Value) -> TaskId {
        let family = def["family"].as_str().unwrap().to_string();
        self.admin.register_taskdef(taskdef(def)).await.unwrap();
        let out = self
            .admin
            .run_task(&RunTask {
                task_definition: family,
                count: 1,
                pool: "gpu".into(),
                client_token: None,
                ..Default::default()
            })
            .await
            .unwrap();
        out.tasks[0].id
    }

    async fn describe(&self, id: &TaskId) -> Task {
        self.admin.describe_task(&id.to_string()).await.unwrap()
    }

    async fn task_in(&self, id: &TaskId, status: TaskStatus) -> Task {
        task_reaching(&self.admin, id, status, WAIT, |_| true, || self.logs()).await
    }

    /// `path` in the shared directory, for a container's command.
    fn at(&self, name: &str) -> String {
        self.shared.join(name).display().to_string()
    }

    /// Docker's `State.<field>` (StartedAt, FinishedAt) of the task's container `name`, as
    /// nanoseconds since the epoch.
    fn docker_time(&self, task: &Task, name: &str, field: &str) -> i128 {
        let c =
            task.containers.iter().find(|c| c.name == name).unwrap_or_else(|| panic!("{name} in {task:?}"));
        let id = c.runtime_id.as_deref().unwrap_or_else(|| panic!("{name} has no runtime id: {c:?}"));
        let docker = self.docker.as_ref().expect("a docker fleet");
        let text = docker.inspect(id, &format!("{{{{.State.{field}}}}}")).expect("the container");
        rfc3339_ns(&text).unwrap_or_else(|| panic!("{field} {text:?} of {name}"))
    }
}

/// Nanoseconds since the epoch of an RFC 3339 time as Docker writes it
/// (`2024-05-01T10:11:12.123456789Z`).
fn rfc3339_ns(s: &str) -> Option<i128> {
    let (date, time) = s.trim().trim_end_matches('Z').split_once('T')?;
    let mut d = date.split('-').map(|x| x.parse::<i64>().ok());
    let (y, m, day) = (d.next()??, d.next()??, d.next()??);
    let (hms, frac) = time.split_once('.').unwrap_or((time, "0"));
    let mut t = hms.split(':').map(|x| x.parse::<i64>().ok());
    let (hh, mm, ss) = (t.next()??, t.next()??, t.next()??);
    // Days from the civil date (Howard Hinnant's algorithm).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let frac: String = frac.chars().chain(std::iter::repeat('0')).take(9).collect();
    let secs = i128::from(days * 86_400 + hh * 3600 + mm * 60 + ss);
    Some(secs * 1_000_000_000 + frac.parse::<i128>().ok()?)
}

/// A process container `name` running shell `script`.
fn sh(name: &str, essential: bool, script: &str) -> Value {
    json!({"name": name, "essential": essential, "command": ["/bin/sh", "-c", script], "stopTimeout": 5})
}

/// A Docker container `name` of the test image running shell `script`.
fn docker_sh(image: &str, name: &str, essential: bool, script: &str) -> Value {
    json!({"name": name, "image": image, "essential": essential, "command": ["sh", "-c", script], "stopTimeout": 5})
}

fn with(mut c: Value, extra: Value) -> Value {
    if let (Some(o), Some(x)) = (c.as_object_mut(), extra.as_object()) {
        o.extend(x.clone());
    }
    c
}

fn depends(on: &[(&str, &str)]) -> Value {
    let list: Vec<Value> = on.iter().map(|(n, c)| json!({"containerName": n, "condition": c})).collect();
    json!({"dependsOn": list})
}

/// Nanoseconds since the epoch written by `date +%s%N` into `path` (its first line).
fn stamp(path: &str) -> Option<i128> {
    std::fs::read_to_string(path).ok()?.lines().next()?.trim().parse().ok()
}

/// Waits until `path` holds a time stamp.
async fn stamp_of(path: &str, what: &str) -> i128 {
    eventually(WAIT, what, || async { stamp(path) }).await
}

fn exit_code_of(task: &Task, name: &str) -> Option<i64> {
    task.containers.iter().find(|c| c.name == name).and_then(|c| c.exit_code)
}

// ---------------------------------------------------------------------------------------------
// Processes

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn process_healthy_dependency_starts_the_dependent_only_once_its_health_check_passed() {
    within(async {
        let f = Fleet::processes().await;
        let (ready, app) = (f.at("db.ready"), f.at("app.started"));
        let db = with(
            sh("db", true, &format!("sleep 2; date +%s%N > {ready}; exec sleep 300")),
            json!({"healthCheck": {"command": ["CMD-SHELL", format!("test -f {ready}")],
                                   "interval": 5, "retries": 10, "startPeriod": 30}}),
        );
        let app_c = with(
            sh("app", true, &format!("date +%s%N > {app}; exec sleep 300")),
            depends(&[("db", "HEALTHY")]),
        );
        let id = f.run(json!({"family": "healthy", "containerDefinitions": [db, app_c]})).await;
        // While the dependency is not yet healthy, the task is PENDING and the dependent waits.
        let db_ready = stamp_of(&ready, "db to be ready").await;
        assert!(stamp(&app).is_none(), "app started before db's health check passed");
        assert_eq!(f.describe(&id).await.last_status, TaskStatus::Pending);
        let task = f.task_in(&id, TaskStatus::Running).await;
        let app_started = stamp(&app).expect("app started once the task runs");
        assert!(app_started > db_ready, "app started at {app_started}, db was ready at {db_ready}");
        assert_eq!(task.containers.len(), 2, "{task:?}");
        assert!(task.containers.iter().all(|c| c.runtime_id.is_some()), "{task:?}");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn process_success_waits_for_a_zero_exit_and_a_non_zero_exit_stops_the_task_naming_it() {
    within(async {
        let f = Fleet::processes().await;
        let (done, app) = (f.at("init.done"), f.at("app.started"));
        let init = sh("init", false, &format!("sleep 1; date +%s%N > {done}; exit 0"));
        let app_c = with(
            sh("app", true, &format!("date +%s%N > {app}; exec sleep 300")),
            depends(&[("init", "SUCCESS")]),
        );
        let id = f.run(json!({"family": "success", "containerDefinitions": [init, app_c]})).await;
        let task = f.task_in(&id, TaskStatus::Running).await;
        let (init_done, app_started) = (stamp(&done).unwrap(), stamp(&app).unwrap());
        assert!(app_started > init_done, "app started at {app_started}, before init exited ({init_done})");
        // The init container's exit (non-essential, 0) leaves the task running.
        assert_eq!(exit_code_of(&task, "init"), Some(0), "{task:?}");

        let app2 = f.at("app2.started");
        let bad = sh("init", false, "sleep 1; exit 3");
        let app_c = with(
            sh("app", true, &format!("date +%s%N > {app2}; exec sleep 300")),
            depends(&[("init", "SUCCESS")]),
        );
        let id = f.run(json!({"family": "failure", "containerDefinitions": [bad, app_c]})).await;
        let task = f.task_in(&id, TaskStatus::Stopped).await;
        assert_eq!(task.stop_code, Some(StopCode::TaskFailedToStart), "{task:?}");
        let reason = task.stopped_reason.clone().unwrap_or_default();
        assert!(
            reason.contains("container app was not started: dependency init exited with status 3"),
            "{reason}"
        );
        assert!(stamp(&app2).is_none(), "app started although init failed");
        let app_report = task.containers.iter().find(|c| c.name == "app").expect("app reported");
        assert!(app_report.reason.as_deref().unwrap_or("").contains("dependency init"), "{app_report:?}");
        assert_eq!(exit_code_of(&task, "init"), Some(3));
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn process_start_and_complete_conditions() {
    within(async {
        let f = Fleet::processes().await;
        let (a, b, d, c) = (f.at("a"), f.at("b"), f.at("d"), f.at("c"));
        let a_c = sh("a", true, &format!("sleep 1; date +%s%N > {a}; exec sleep 300"));
        // START: b starts once a has started (a writes its stamp a second after it starts).
        let b_c =
            with(sh("b", true, &format!("date +%s%N > {b}; exec sleep 300")), depends(&[("a", "START")]));
        // COMPLETE: any exit will do, a failing one too.
        let d_c = sh("d", false, &format!("sleep 1; date +%s%N > {d}; exit 5"));
        let c_c =
            with(sh("c", true, &format!("date +%s%N > {c}; exec sleep 300")), depends(&[("d", "COMPLETE")]));
        let id =
            f.run(json!({"family": "start-complete", "containerDefinitions": [a_c, b_c, d_c, c_c]})).await;
        let task = f.task_in(&id, TaskStatus::Running).await;
        let (a_at, b_at) = (stamp_of(&a, "a").await, stamp_of(&b, "b").await);
        // b did not wait for a's stamp: START is met when a has started, not when it is done.
        assert!(b_at < a_at, "b started at {b_at}, after a's first second ({a_at})");
        let (d_at, c_at) = (stamp(&d).unwrap(), stamp(&c).unwrap());
        assert!(c_at > d_at, "c started at {c_at}, before d exited ({d_at})");
        assert_eq!(exit_code_of(&task, "d"), Some(5), "{task:?}");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn process_non_essential_exit_leaves_the_task_running_an_essential_one_stops_it() {
    within(async {
        let f = Fleet::processes().await;
        let side_done = f.at("side.done");
        let side = sh("side", false, &format!("sleep 1; touch {side_done}; exit 4"));
        let app = sh("app", true, "sleep 6; exit 7");
        let id = f.run(json!({"family": "essential", "containerDefinitions": [side, app]})).await;
        f.task_in(&id, TaskStatus::Running).await;
        let task = eventually(WAIT, "side's exit to be reported", || async {
            let t = f.describe(&id).await;
            exit_code_of(&t, "side").is_some().then_some(t)
        })
        .await;
        assert_eq!(task.last_status, TaskStatus::Running, "{task:?}");
        assert_eq!(exit_code_of(&task, "side"), Some(4));
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(f.describe(&id).await.last_status, TaskStatus::Running);
        let task = f.task_in(&id, TaskStatus::Stopped).await;
        assert_eq!(task.stop_code, Some(StopCode::EssentialContainerExited), "{task:?}");
        let reason = task.stopped_reason.unwrap_or_default();
        assert!(reason.contains("essential container app exited"), "{reason}");
    })
    .await;
}

/// As in ECS, only essential containers' health checks decide the task's health: non-essential
/// sidecars whose checks keep failing leave the task RUNNING and not unhealthy. Two sidecars
/// and the app launch at once, and each one's check runs, whichever launch finishes last.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn process_a_failing_health_check_of_a_non_essential_container_leaves_the_task_running() {
    within(async {
        let f = Fleet::processes().await;
        let sidecar = |name: &str| {
            let checked = f.at(&format!("{name}.checked"));
            with(
                sh(name, false, "sleep 60"),
                json!({"healthCheck": {"command": ["CMD-SHELL", format!("touch {checked}; false")],
                       "interval": 5, "timeout": 2, "retries": 1, "startPeriod": 0}}),
            )
        };
        let app_checked = f.at("app.checked");
        let app = with(
            sh("app", true, "sleep 60"),
            json!({"healthCheck": {"command": ["CMD-SHELL", format!("touch {app_checked}")],
                   "interval": 5, "timeout": 2, "retries": 1, "startPeriod": 0}}),
        );
        let def = json!({"family": "sick-sidecar", "containerDefinitions": [sidecar("side1"), sidecar("side2"), app]});
        let id = f.run(def).await;
        f.task_in(&id, TaskStatus::Running).await;
        // Every container's check ran; the sidecars' failed (more than once: retries 1, interval 5 s).
        for name in ["side1", "side2", "app"] {
            let checked = f.at(&format!("{name}.checked"));
            eventually(WAIT, &format!("{name}'s check to run"), || async {
                std::fs::metadata(&checked).ok().map(|_| ())
            })
            .await;
        }
        tokio::time::sleep(Duration::from_secs(12)).await;
        let task = f.describe(&id).await;
        assert_eq!(task.last_status, TaskStatus::Running, "{task:?}\n{}", f.logs());
        assert!(task.stop_code.is_none(), "{task:?}");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn process_stop_order_is_dependents_first_each_with_its_stop_timeout() {
    within(async {
        let f = Fleet::processes().await;
        let order = f.at("order");
        // Each writes its name and the time when it gets SIGTERM; proxy ignores it and is killed
        // after its stopTimeout of 2 s, and only then is app signalled.
        let on_term = |name: &str| {
            format!("trap 'echo {name} $(date +%s%N) >> {order}; exit 0' TERM; while :; do sleep 0.1; done")
        };
        let db = sh("db", true, &on_term("db"));
        let app = with(sh("app", true, &on_term("app")), depends(&[("db", "START")]));
        let proxy = with(
            sh(
                "proxy",
                true,
                &format!("trap 'echo proxy $(date +%s%N) >> {order}' TERM; while :; do sleep 0.1; done"),
            ),
            json!({"dependsOn": [{"containerName": "app", "condition": "START"}], "stopTimeout": 2}),
        );
        let id = f.run(json!({"family": "stop-order", "containerDefinitions": [proxy, db, app]})).await;
        f.task_in(&id, TaskStatus::Running).await;
        tokio::time::sleep(Duration::from_millis(500)).await;
        let asked =
            i128::from(mpsfleet_core::clock::Clock::now_ms(&mpsfleet_core::clock::SystemClock)) * 1_000_000;
        f.admin.stop_task(&id.to_string(), Some("test".into())).await.unwrap();
        f.task_in(&id, TaskStatus::Stopped).await;
        let text = std::fs::read_to_string(&order).unwrap_or_default();
        let lines: Vec<(String, i128)> = text
            .lines()
            .filter_map(|l| l.split_once(' ').map(|(n, t)| (n.to_string(), t.trim().parse().unwrap_or(0))))
            .collect();
        let names: Vec<&str> = lines.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["proxy", "app", "db"], "{text}");
        let app_at = lines[1].1;
        assert!(
            app_at - asked >= 1_900_000_000,
            "app was signalled {} ms after the stop, before proxy's 2 s stopTimeout ran out",
            (app_at - asked) / 1_000_000
        );
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn process_start_timeout_gives_up_naming_the_dependency_and_condition() {
    within(async {
        let f = Fleet::processes().await;
        let app_at = f.at("app.started");
        let db = with(
            sh("db", true, "exec sleep 300"),
            json!({"startTimeout": 3,
                   "healthCheck": {"command": ["CMD-SHELL", "false"], "interval": 5, "retries": 10, "startPeriod": 60}}),
        );
        let app = with(sh("app", true, &format!("date +%s%N > {app_at}; exec sleep 300")), depends(&[("db", "HEALTHY")]));
        let id = f.run(json!({"family": "timeout", "containerDefinitions": [db, app]})).await;
        let task = f.task_in(&id, TaskStatus::Stopped).await;
        assert_eq!(task.stop_code, Some(StopCode::TaskFailedToStart), "{task:?}");
        let reason = task.stopped_reason.unwrap_or_default();
        assert!(
            reason.contains("container app was not started: dependency db did not reach HEALTHY within startTimeout 3s"),
            "{reason}"
        );
        assert!(stamp(&app_at).is_none(), "app started");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn process_agent_restart_mid_ordering_adopts_what_runs_and_starts_the_rest() {
    within(async {
        let mut f = Fleet::processes().await;
        let (go, pids, app_at) = (f.at("go"), f.at("db.pids"), f.at("app.started"));
        let db = with(
            sh("db", true, &format!("echo $$ >> {pids}; exec sleep 300")),
            json!({"healthCheck": {"command": ["CMD-SHELL", format!("test -f {go}")],
                                   "interval": 5, "retries": 10, "startPeriod": 120}}),
        );
        let app = with(
            sh("app", true, &format!("date +%s%N > {app_at}; exec sleep 300")),
            depends(&[("db", "HEALTHY")]),
        );
        let id = f.run(json!({"family": "restart", "containerDefinitions": [db, app]})).await;
        eventually(WAIT, "db to start", || async {
            std::fs::read_to_string(&pids).ok().filter(|s| !s.is_empty())
        })
        .await;
        // And its shim to have recorded it (the pid record the next agent adopts it by). A
        // kill -9 in the moment between db's start and that record makes the next agent start
        // db again: that window is not what this test is about.
        let record = f.dir.path().join(format!("agent/tasks/{id}/containers/db/proc.json"));
        eventually(WAIT, "db's pid record", || async { record.is_file().then_some(()) }).await;
        assert_eq!(f.describe(&id).await.last_status, TaskStatus::Pending);
        // kill -9: the shims and db run on.
        f.agent.as_mut().unwrap().kill9();
        f.agent = Some(f.start_agent(None));
        std::fs::write(&go, "").unwrap();
        let task = f.task_in(&id, TaskStatus::Running).await;
        assert!(stamp(&app_at).is_some(), "app started after the restart");
        let started: Vec<String> =
            std::fs::read_to_string(&pids).unwrap().lines().map(str::to_string).collect();
        assert_eq!(started.len(), 1, "db was started again: {started:?}");
        assert!(task.containers.iter().all(|c| c.runtime_id.is_some()), "{task:?}");
    })
    .await;
}

// ---------------------------------------------------------------------------------------------
// Docker

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn docker_healthy_dependency_starts_the_dependent_only_once_healthy() {
    within(async {
        let f = Fleet::docker("deps-healthy").await;
        let image = f.docker.as_ref().unwrap().image.clone();
        let db = with(
            docker_sh(&image, "db", true, "sleep 3; touch /tmp/ready; exec sleep 300"),
            json!({"healthCheck": {"command": ["CMD-SHELL", "test -f /tmp/ready"],
                                   "interval": 5, "retries": 10, "startPeriod": 30}}),
        );
        let app = with(docker_sh(&image, "app", true, "exec sleep 300"), depends(&[("db", "HEALTHY")]));
        let id = f.run(json!({"family": "dhealthy", "containerDefinitions": [db, app]})).await;
        let task = f.task_in(&id, TaskStatus::Running).await;
        let db_started = f.docker_time(&task, "db", "StartedAt");
        let app_started = f.docker_time(&task, "app", "StartedAt");
        assert!(
            app_started - db_started >= 3_000_000_000,
            "app started {} ms after db, before db could be healthy (3 s)\n{}",
            (app_started - db_started) / 1_000_000,
            f.logs()
        );
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn docker_success_and_essential_and_stop_order() {
    within(async {
        let f = Fleet::docker("deps-order").await;
        let image = f.docker.as_ref().unwrap().image.clone();
        let term = "trap 'exit 0' TERM; while :; do sleep 1; done";
        // init must exit 0 before app starts; side's exit leaves the task running.
        let init = docker_sh(&image, "init", false, "sleep 1; exit 0");
        let side = docker_sh(&image, "side", false, "sleep 2; exit 4");
        let db = docker_sh(&image, "db", true, term);
        let app =
            with(docker_sh(&image, "app", true, term), depends(&[("init", "SUCCESS"), ("db", "START")]));
        let proxy = with(docker_sh(&image, "proxy", true, term), depends(&[("app", "START")]));
        let id =
            f.run(json!({"family": "dorder", "containerDefinitions": [proxy, app, db, init, side]})).await;
        let task = f.task_in(&id, TaskStatus::Running).await;
        let init_finished = f.docker_time(&task, "init", "FinishedAt");
        let app_started = f.docker_time(&task, "app", "StartedAt");
        assert!(app_started > init_finished, "app started before init exited");
        let task = eventually(WAIT, "side's exit", || async {
            let t = f.describe(&id).await;
            exit_code_of(&t, "side").is_some().then_some(t)
        })
        .await;
        assert_eq!(task.last_status, TaskStatus::Running, "a non-essential exit stopped the task: {task:?}");
        f.admin.stop_task(&id.to_string(), Some("test".into())).await.unwrap();
        let task = f.task_in(&id, TaskStatus::Stopped).await;
        let (p, a, d) = (
            f.docker_time(&task, "proxy", "FinishedAt"),
            f.docker_time(&task, "app", "FinishedAt"),
            f.docker_time(&task, "db", "FinishedAt"),
        );
        assert!(p < a && a < d, "stop order proxy {p}, app {a}, db {d}: dependents first\n{}", f.logs());

        // A non-zero exit under SUCCESS stops the task, naming the dependency; app never runs.
        let bad = docker_sh(&image, "init", false, "exit 3");
        let app = with(docker_sh(&image, "app", true, "exec sleep 300"), depends(&[("init", "SUCCESS")]));
        let id = f.run(json!({"family": "dfail", "containerDefinitions": [bad, app]})).await;
        let task = f.task_in(&id, TaskStatus::Stopped).await;
        assert_eq!(task.stop_code, Some(StopCode::TaskFailedToStart), "{task:?}");
        let reason = task.stopped_reason.clone().unwrap_or_default();
        assert!(reason.contains("dependency init exited with status 3"), "{reason}");
        let app_report = task.containers.iter().find(|c| c.name == "app").expect("app reported");
        assert!(app_report.runtime_id.is_none(), "app was created: {app_report:?}");
    })
    .await;
}

#[test]
fn docker_times_parse() {
    assert_eq!(rfc3339_ns("1970-01-01T00:00:01.5Z"), Some(1_500_000_000));
    assert_eq!(rfc3339_ns("2024-03-01T00:00:00Z"), Some(1_709_251_200 * 1_000_000_000));
    assert_eq!(rfc3339_ns("2024-03-01T00:00:00.000000001Z"), Some(1_709_251_200 * 1_000_000_000 + 1));
}
