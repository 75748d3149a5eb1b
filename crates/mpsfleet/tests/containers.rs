//! Process tests of the container runtime: the real server and agent binaries, the agent
//! running tasks on the private Docker Engine and registry of `scripts/docker-env.sh`
//! (`eval "$(bash scripts/docker-env.sh env)"` first), checked from the outside with the
//! Docker CLI.

mod common;

use common::*;
use mpsfleet_client::{Client, TaskQuery};
use mpsfleet_types::api::RunTaskResponse;
use mpsfleet_types::*;
use std::io::{Read, Write};
use std::process::Command;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(90);

/// A server, one pool and docker agents in it. Dropping it stops the agents (they stop their
/// tasks on exit) and then removes whatever container of its hosts is left.
struct Fleet {
    agents: Vec<Agent>,
    hosts: Vec<HostId>,
    docker: DockerEnv,
    admin: Client,
    pool: String,
    server: Server,
    dir: tempfile::TempDir,
}

impl Drop for Fleet {
    fn drop(&mut self) {
        self.agents.clear();
        for h in &self.hosts {
            self.docker.remove_containers_of_host(h.as_str());
        }
    }
}

impl Fleet {
    /// A fleet of `hosts` docker agents in pool `pool` (hosts `<pool>-h<i>`).
    async fn start(pool: &str, hosts: usize, extra: &[&str]) -> Fleet {
        let docker = docker_env();
        let dir = tempfile::tempdir().unwrap();
        let server = Server::start(&dir.path().join("server"));
        let admin = server.admin();
        create_pool(&admin, pool).await;
        let mut fleet = Fleet {
            agents: Vec::new(),
            hosts: Vec::new(),
            docker,
            admin,
            pool: pool.to_string(),
            server,
            dir,
        };
        for i in 0..hosts {
            let agent = fleet.start_agent(i, extra);
            fleet.agents.push(agent);
        }
        let pool_name = pool.to_string();
        let admin = fleet.admin.clone();
        let active = eventually(WAIT, &format!("{hosts} ACTIVE hosts in {pool}"), || async {
            admin
                .list_hosts(Some(&pool_name))
                .await
                .ok()
                .filter(|h| h.len() == hosts && h.iter().all(|h| h.status == HostStatus::Active))
        })
        .await;
        fleet.hosts = active.into_iter().map(|h| h.id).collect();
        fleet
    }

    /// Starts (or restarts, on the same data dir) agent `i`.
    fn start_agent(&self, i: usize, extra: &[&str]) -> Agent {
        Agent::start_docker(
            &self.server,
            &self.dir.path().join(format!("a{i}")),
            &self.pool,
            &format!("{}-h{i}", self.pool),
            &self.docker,
            extra,
        )
    }

    fn logs(&self) -> String {
        self.agents.iter().map(Agent::log).collect::<Vec<_>>().join("\n----\n")
    }

    async fn register(&self, def: serde_json::Value) {
        self.admin.register_taskdef(taskdef(def)).await.unwrap();
    }

    async fn run(&self, family: &str, count: u32) -> RunTaskResponse {
        self.admin
            .run_task(&RunTask {
                task_definition: family.into(),
                count,
                pool: self.pool.clone(),
                client_token: None,
                ..Default::default()
            })
            .await
            .unwrap()
    }

    async fn run_one(&self, family: &str) -> Task {
        self.run(family, 1).await.tasks.into_iter().next().unwrap()
    }

    async fn task_in(&self, id: &TaskId, status: TaskStatus) -> Task {
        task_reaching(&self.admin, id, status, WAIT, |_| true, || self.logs()).await
    }

    /// The tail of the task's stdout, as `task logs` shows it (GET /v1/tasks/ID/logs).
    async fn stdout_of(&self, id: &TaskId) -> Option<String> {
        let r = self
            .server
            .http()
            .get(format!("{}/v1/tasks/{id}/logs", self.server.url))
            .query(&[("stream", "stdout"), ("tail", "4096")])
            .bearer_auth(self.server.admin_token())
            .send()
            .await
            .ok()?;
        let logs: mpsfleet_types::logs::TaskLogs = r.error_for_status().ok()?.json().await.ok()?;
        Some(logs.output())
    }

    /// Waits until the task's stdout contains `needle`; returns the output.
    async fn output_with(&self, id: &TaskId, needle: &str) -> String {
        let mut last = String::new();
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            if let Some(out) = self.stdout_of(id).await {
                last = out;
                if last.contains(needle) {
                    return last;
                }
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "task {id} never printed {needle:?}; its output: {last:?}\n{}",
                self.logs()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Stops every task that is not STOPPED yet and waits until they are.
    async fn stop_all(&self) {
        let q = TaskQuery { limit: Some(1000), ..Default::default() };
        let tasks = self.admin.list_tasks(&q).await.unwrap_or_default();
        for t in tasks.iter().filter(|t| t.last_status != TaskStatus::Stopped) {
            let _ = self.admin.stop_task(&t.id.to_string(), None).await;
        }
        for t in tasks.iter().filter(|t| t.last_status != TaskStatus::Stopped && t.host_id.is_some()) {
            self.task_in(&t.id, TaskStatus::Stopped).await;
        }
    }
}

/// The first container's report.
fn report(t: &Task) -> &ContainerReport {
    t.containers.first().unwrap_or_else(|| panic!("task {} has no container report: {t:?}", t.id))
}

fn runtime_id(t: &Task) -> String {
    report(t).runtime_id.clone().unwrap_or_else(|| panic!("task {} has no runtime id: {t:?}", t.id))
}

/// An HTTP/1.0 GET of `/` from `addr`; the body, or None when nothing answers (yet).
fn http_get(addr: &str) -> Option<String> {
    let mut s = std::net::TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    s.write_all(b"GET / HTTP/1.0\r\nHost: test\r\n\r\n").ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    let (head, body) = text.split_once("\r\n\r\n")?;
    head.starts_with("HTTP/1.").then(|| body.to_string())
}

/// Polls `addr` until it answers with a body containing `needle`.
async fn answers(addr: &str, needle: &str) -> String {
    eventually(WAIT, &format!("{addr} to serve {needle:?}"), || async {
        let addr = addr.to_string();
        let body = tokio::task::spawn_blocking(move || http_get(&addr)).await.ok()??;
        body.contains(needle).then_some(body)
    })
    .await
}

/// A definition of one container `main` of the test image with `extra` fields.
fn def(family: &str, image: &str, extra: serde_json::Value) -> serde_json::Value {
    let mut c = serde_json::json!({"name": "main", "image": image});
    if let (Some(c), Some(extra)) = (c.as_object_mut(), extra.as_object()) {
        c.extend(extra.clone());
    }
    serde_json::json!({"family": family, "containerDefinitions": [c]})
}

/// The task definition that serves `/tmp/index.html` (naming the container) on port 8080.
fn web(family: &str, image: &str, host_port: Option<u16>) -> serde_json::Value {
    let mut mapping = serde_json::json!({"containerPort": 8080});
    if let Some(p) = host_port {
        mapping["hostPort"] = p.into();
    }
    let mut d = def(
        family,
        image,
        serde_json::json!({
            "command": ["/bin/sh", "-c", "echo served by $(hostname) > /tmp/index.html; exec httpd -f -p 8080 -h /tmp"],
            "portMappings": [mapping],
            "stopTimeout": 2,
        }),
    );
    d["networkMode"] = "bridge".into();
    d
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_images_default_command_runs() {
    within(async {
        let f = Fleet::start("img", 1, &[]).await;
        f.register(def("img", &f.docker.image, serde_json::json!({}))).await;
        let t = f.run_one("img").await;
        let t = f.task_in(&t.id, TaskStatus::Running).await;
        f.output_with(&t.id, "hello from the image").await;
        let id = runtime_id(&t);
        assert_eq!(report(&t).image.as_deref(), Some(f.docker.image.as_str()));
        assert_eq!(
            f.docker.inspect(&id, "{{index .Config.Labels \"io.mpsfleet.task\"}}").as_deref(),
            Some(t.id.to_string().as_str()),
            "container {id}"
        );
        assert_eq!(f.docker.inspect(&id, "{{.State.Running}}").as_deref(), Some("true"));
        f.stop_all().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overrides_win() {
    within(async {
        let f = Fleet::start("ovr", 1, &[]).await;
        f.register(def(
            "ovr",
            &f.docker.image,
            serde_json::json!({
                "entryPoint": ["/bin/sh", "-c"],
                "command": ["echo got $FOO $(pwd) $(id -u); exec sleep 600"],
                "environment": [{"name": "FOO", "value": "bar-from-def"}],
                "workingDirectory": "/tmp",
                "user": "65534",
            }),
        ))
        .await;
        let t = f.run_one("ovr").await;
        let t = f.task_in(&t.id, TaskStatus::Running).await;
        let out = f.output_with(&t.id, "got ").await;
        assert_eq!(out.trim(), "got bar-from-def /tmp 65534", "{out:?}");
        assert!(!out.contains("hello from the image"), "the image's command ran: {out:?}");
        let id = runtime_id(&t);
        assert_eq!(f.docker.inspect(&id, "{{.Config.User}}").as_deref(), Some("65534"));
        assert_eq!(f.docker.inspect(&id, "{{.Config.WorkingDir}}").as_deref(), Some("/tmp"));
        f.stop_all().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_memory_limit_kills_with_out_of_memory() {
    within(async {
        let f = Fleet::start("oom", 1, &[]).await;
        // dd allocates its whole block (256 MiB) against a limit of 8 MiB. It waits a second
        // first: an OOM kill in the container's first milliseconds can come before containerd
        // watches its cgroup, and then Docker Engine never learns of it (no `oom` event, no
        // `OOMKilled`), which no agent can make up for.
        f.register(def(
            "oom",
            &f.docker.image,
            serde_json::json!({
                "memory": 8,
                "command": ["sh", "-c", "sleep 1; exec dd if=/dev/zero of=/dev/null bs=256M count=4"],
            }),
        ))
        .await;
        let t = f.run_one("oom").await;
        let t = f.task_in(&t.id, TaskStatus::Stopped).await;
        assert_eq!(t.stop_code, Some(StopCode::OutOfMemory), "{t:?}\n{}", f.logs());
        let id = runtime_id(&t);
        assert_eq!(f.docker.inspect(&id, "{{.HostConfig.Memory}}").as_deref(), Some("8388608"));
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_port_mapping_is_reachable_at_the_reported_binding() {
    within(async {
        let f = Fleet::start("ports", 1, &[]).await;
        f.register(web("web", &f.docker.image, None)).await;
        let t = f.run_one("web").await;
        let t = f.task_in(&t.id, TaskStatus::Running).await;
        let b = report(&t).network_bindings.first().cloned().unwrap_or_else(|| panic!("no binding: {t:?}"));
        assert_eq!(b.container_port, 8080);
        assert_ne!(b.host_port, 0);
        let short = &runtime_id(&t)[..12];
        let body = answers(&format!("127.0.0.1:{}", b.host_port), "served by").await;
        assert_eq!(body.trim(), format!("served by {short}"));

        // A service of two replicas: two endpoints, each answering from its own container.
        f.admin
            .create_service(&CreateService {
                name: "web".into(),
                pool: f.pool.clone(),
                task_definition: "web".into(),
                desired_count: 2,
                resumption: None,
                deployment_configuration: None,
                client_token: None,
                ..Default::default()
            })
            .await
            .unwrap();
        let admin = &f.admin;
        let eps = eventually(WAIT, "two endpoints of service web", || async {
            admin.service_endpoints("web").await.ok().filter(|e| e.len() == 2)
        })
        .await;
        let mut bodies = std::collections::BTreeSet::new();
        for e in &eps {
            assert_eq!(e.container_port, 8080);
            assert!(e.address.ends_with(&format!(":{}", e.host_port)), "{e:?}");
            bodies.insert(answers(&e.address, "served by").await);
        }
        assert_eq!(bodies.len(), 2, "the two endpoints are served by two containers: {bodies:?}");
        assert!(!bodies.contains(&body), "the single task is not part of the service");

        // The CLI lists the same ports, as bound: on every address (the agents' default).
        let text = cli(&f, &["service", "endpoints", "web"]);
        for e in &eps {
            let bound = format!("0.0.0.0:{}", e.host_port);
            assert!(text.contains(&bound), "{bound} missing in {text}");
        }
        f.admin.delete_service("web").await.unwrap();
        f.stop_all().await;
    })
    .await;
}

/// The addresses the kernel lists a TCP port listening on, as `ss -ltn` prints them
/// (`0.0.0.0:32768`, `[::]:32768`, `127.0.0.1:32768`), sorted.
fn listening_on(port: u16) -> Vec<String> {
    let out = Command::new("ss")
        .args(["-ltnH", &format!("sport = :{port}")])
        .output()
        .unwrap_or_else(|e| panic!("cannot run ss (iproute2; docker-env.sh installs it): {e}"));
    assert!(out.status.success(), "ss: {}", String::from_utf8_lossy(&out.stderr));
    let mut addrs: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().nth(3).map(str::to_string))
        .collect();
    addrs.sort();
    addrs.dedup();
    addrs
}

/// The CLI against the fleet's server; its standard output, after checking it succeeded.
fn cli(f: &Fleet, args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_mpsfleet"))
        .args(args)
        .args([
            "--server",
            &f.server.url,
            "--token",
            &f.server.admin_token(),
            "--ca-file",
            &f.server.ca_file(),
        ])
        .env("HOME", f.dir.path())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(out.status.success(), "mpsfleet {args:?}: {text}{}", String::from_utf8_lossy(&out.stderr));
    text
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn service_endpoints_show_the_address_the_kernel_lists_the_port_on() {
    within(async {
        // (agent flags, the scope shown); the default is every address, as ECS.
        let cases: [(&str, &[&str], &str); 2] =
            [("bound", &[], "all interfaces"), ("bound-lo", &["--publish-address", "127.0.0.1"], "loopback")];
        for (pool, extra, scope) in cases {
            let f = Fleet::start(pool, 1, extra).await;
            f.register(web("web", &f.docker.image, None)).await;
            f.admin
                .create_service(&CreateService {
                    name: "web".into(),
                    pool: f.pool.clone(),
                    task_definition: "web".into(),
                    desired_count: 1,
                    resumption: None,
                    deployment_configuration: None,
                    client_token: None,
                    ..Default::default()
                })
                .await
                .unwrap();
            let admin = &f.admin;
            let eps = eventually(WAIT, "an endpoint of service web", || async {
                admin.service_endpoints("web").await.ok().filter(|e| e.len() == 1)
            })
            .await;
            let port = eps[0].host_port;
            let kernel = listening_on(port);

            // The table's ADDRESS is where the kernel lists the port: 0.0.0.0 (with [::] beside
            // it where the host has IPv6) for every address, 127.0.0.1 alone for loopback.
            let table = cli(&f, &["service", "endpoints", "web"]);
            let row: Vec<&str> = table.lines().nth(1).unwrap_or_default().split_whitespace().collect();
            let address = row.first().copied().unwrap_or_else(|| panic!("no endpoint row: {table}"));
            let want: Vec<String> = match scope {
                "loopback" => vec![format!("127.0.0.1:{port}")],
                _ => vec![format!("0.0.0.0:{port}"), format!("[::]:{port}")],
            };
            assert_eq!(address, want[0], "{pool}: {table}");
            assert!(
                kernel.contains(&address.to_string()),
                "{pool}: {address} shown, the kernel lists {kernel:?}"
            );
            assert!(
                kernel.iter().all(|a| want.contains(a)),
                "{pool}: the kernel lists {kernel:?}, want {want:?}"
            );
            assert!(table.contains(scope), "{pool}: no scope {scope:?} in {table}");

            // JSON keeps the server's fields and adds the bound address.
            let json: serde_json::Value =
                serde_json::from_str(&cli(&f, &["service", "endpoints", "web", "-o", "json"])).unwrap();
            assert_eq!(json[0]["boundAddress"], address, "{pool}: {json}");
            assert_eq!(json[0]["address"], eps[0].address.as_str(), "{pool}: {json}");
            assert_eq!(json[0]["hostPort"], port, "{pool}: {json}");

            // task describe shows the same binding, and the port answers there.
            let task = eps[0].task_id.to_string();
            let described = cli(&f, &["task", "describe", &task]);
            assert!(described.contains(&format!("{address}->8080/tcp")), "{pool}: {described}");
            answers(address, "served by").await;

            f.admin.delete_service("web").await.unwrap();
            f.stop_all().await;
        }
    })
    .await;
}

/// Host networking on static `port`: the container serves its task id there once the test
/// creates `/tmp/go` in it. All hosts of a test share this machine's network namespace, so
/// the test decides which of the placed containers listens at a time.
fn host_port_web(family: &str, image: &str, port: u16) -> serde_json::Value {
    let script = format!(
        "echo served by $MPSFLEET_TASK_ID > /tmp/index.html; echo waiting; \
         while [ ! -e /tmp/go ]; do sleep 0.2; done; exec httpd -f -p {port} -h /tmp"
    );
    let mut d = def(
        family,
        image,
        serde_json::json!({
            "command": ["/bin/sh", "-c", script],
            "portMappings": [{"containerPort": port, "hostPort": port}],
            "stopTimeout": 2,
        }),
    );
    d["networkMode"] = "host".into();
    d
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_tasks_needing_one_static_host_port_land_on_different_hosts() {
    within(async {
        let f = Fleet::start("static", 2, &[]).await;
        // Host networking is the pool's to allow (docs/pools.md "Task policy").
        let policy = TaskPolicy { allow_host_network: true, ..Default::default() };
        let update = UpdatePool { task_policy: Some(policy), ..Default::default() };
        f.admin.update_pool("static", &update).await.unwrap();
        let port = free_port();
        f.register(host_port_web("static", &f.docker.image, port)).await;
        // Placed in one call: two hosts hold the port, the third task has none left.
        let out = f.run("static", 3).await;
        assert_eq!((out.placed, out.pending), (2, 1), "{out:?}");
        let placed: Vec<&Task> = out.tasks.iter().filter(|t| t.host_id.is_some()).collect();
        assert_ne!(placed[0].host_id, placed[1].host_id, "both on one host: {out:?}");
        let waiting = out.tasks.iter().find(|t| t.host_id.is_none()).unwrap();
        let reason = waiting.pending_reason.clone().unwrap_or_default();
        assert!(reason.contains(&port.to_string()), "pending reason {reason:?} does not name port {port}");
        let described = f.admin.describe_task(&waiting.id.to_string()).await.unwrap();
        assert_eq!(described.last_status, TaskStatus::Pending);
        assert!(
            described.pending_reason.as_deref().unwrap_or_default().contains(&port.to_string()),
            "{described:?}"
        );
        let (first, second) = (
            f.task_in(&placed[0].id, TaskStatus::Running).await,
            f.task_in(&placed[1].id, TaskStatus::Running).await,
        );
        // Still waiting while both run.
        let described = f.admin.describe_task(&waiting.id.to_string()).await.unwrap();
        assert_eq!((described.last_status, described.host_id), (TaskStatus::Pending, None));

        // Each placed container answers on the port of its host.
        for t in [&first, &second] {
            f.output_with(&t.id, "waiting").await;
            f.docker.cli_ok(&["exec", &runtime_id(t), "touch", "/tmp/go"]);
            let body = answers(&format!("127.0.0.1:{port}"), &t.id.to_string()).await;
            assert_eq!(body.trim(), format!("served by {}", t.id));
            f.admin.stop_task(&t.id.to_string(), None).await.unwrap();
            f.task_in(&t.id, TaskStatus::Stopped).await;
        }
        // The port freed on the first host, the waiting task runs there.
        let third = f.task_in(&waiting.id, TaskStatus::Running).await;
        assert!(third.host_id == first.host_id || third.host_id == second.host_id, "{third:?}");
        f.stop_all().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_timeout_is_honoured() {
    within(async {
        let f = Fleet::start("stopto", 1, &[]).await;
        f.register(def(
            "stubborn",
            &f.docker.image,
            serde_json::json!({
                "command": ["/bin/sh", "-c", "trap '' TERM; echo trapped; while true; do sleep 1; done"],
                "stopTimeout": 3,
            }),
        ))
        .await;
        f.register(def(
            "polite",
            &f.docker.image,
            serde_json::json!({"command": ["/bin/sh", "-c", "echo up; exec sleep 600"], "stopTimeout": 3}),
        ))
        .await;

        let t = f.run_one("stubborn").await;
        f.task_in(&t.id, TaskStatus::Running).await;
        f.output_with(&t.id, "trapped").await;
        let started = tokio::time::Instant::now();
        f.admin.stop_task(&t.id.to_string(), None).await.unwrap();
        let t = f.task_in(&t.id, TaskStatus::Stopped).await;
        let took = started.elapsed();
        assert!(took >= Duration::from_secs(3), "stopped after {took:?}, before its stopTimeout of 3 s");
        assert!(took < Duration::from_secs(13), "stopped after {took:?}");
        assert_eq!(t.stop_code, Some(StopCode::UserInitiated));
        assert_eq!(report(&t).exit_code, Some(137), "{t:?}");

        let p = f.run_one("polite").await;
        f.task_in(&p.id, TaskStatus::Running).await;
        f.output_with(&p.id, "up").await;
        let started = tokio::time::Instant::now();
        f.admin.stop_task(&p.id.to_string(), None).await.unwrap();
        let p = f.task_in(&p.id, TaskStatus::Stopped).await;
        let took = started.elapsed();
        assert!(took < Duration::from_secs(3), "a task that exits on TERM took {took:?} to stop: {p:?}");
        assert_ne!(report(&p).exit_code, Some(137), "it was killed, not stopped: {p:?}");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_image_stops_with_cannot_pull() {
    within(async {
        let f = Fleet::start("pull", 1, &[]).await;
        let image = format!("{}/mpsfleet/missing:none", f.docker.registry);
        f.register(def("missing", &image, serde_json::json!({"command": ["true"]}))).await;
        let t = f.run_one("missing").await;
        let t = f.task_in(&t.id, TaskStatus::Stopped).await;
        assert_eq!(t.stop_code, Some(StopCode::CannotPullContainerError), "{t:?}\n{}", f.logs());
        let reason = t.stopped_reason.clone().unwrap_or_default().to_lowercase();
        assert!(
            reason.contains("manifest unknown") || reason.contains("not found"),
            "the reason does not carry the registry's answer: {reason:?}"
        );
        assert!(f.docker.containers_labelled("io.mpsfleet.task", &t.id.to_string()).is_empty());
    })
    .await;
}

/// A rolling update to an image that does not exist, as a user meets it through the CLI:
/// `--wait` names the pull error when it gives up, and so do the service's events; a
/// successful `--wait` says what it reached.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_rollout_says_why_where_the_user_looks() {
    within(async {
        let f = Fleet::start("roll", 1, &[]).await;
        let cli = |args: &[&str]| {
            let out = Command::new(env!("CARGO_BIN_EXE_mpsfleet"))
                .args(args)
                .args(["--server", &f.server.url, "--token", &f.server.admin_token()])
                .args(["--ca-file", &f.server.ca_file()])
                .env("HOME", f.dir.path())
                .output()
                .unwrap();
            let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
            (out.status.code(), text(&out.stdout), text(&out.stderr))
        };
        f.register(def("roll", &f.docker.image, serde_json::json!({"command": ["sleep", "600"]}))).await;
        let (code, _, err) =
            cli(&["service", "create", "roll", "--taskdef", "roll:1", "--desired", "2", "--wait"]);
        assert_eq!(code, Some(0), "{err}\n{}", f.logs());
        assert!(
            err.contains("deployment d-1 of roll completed: 2 of 2 running (no health check)"),
            "no final line: {err}"
        );

        let missing = format!("{}/mpsfleet/missing:none", f.docker.registry);
        f.register(def("roll", &missing, serde_json::json!({"command": ["sleep", "600"]}))).await;
        let (code, _, err) =
            cli(&["service", "update", "roll", "--taskdef", "roll:2", "--wait", "--timeout", "15"]);
        assert_eq!(code, Some(124), "the rollout cannot finish: {err}");
        assert!(err.contains("stopped: CannotPullContainerError: "), "--wait does not say why: {err}");

        let (code, shown, err) = cli(&["service", "describe", "roll"]);
        assert_eq!(code, Some(0), "{err}");
        let failed = shown.lines().find(|l| l.contains("TasksFailed")).unwrap_or_else(|| panic!("{shown}"));
        assert!(failed.contains("task(s) of roll:2 stopped: CannotPullContainerError: "), "{failed}");
        let (_, json, _) = cli(&["service", "deployments", "roll", "-o", "json"]);
        let list: Vec<mpsfleet_types::service::DeploymentView> = serde_json::from_str(&json).unwrap();
        let groups = &list[0].deployment.failures;
        assert!(groups[0].reason.starts_with("CannotPullContainerError: "), "{groups:?}");
        assert!(groups[0].count >= 1 && list[1].healthy_count == 2, "the old tasks serve on: {list:#?}");

        // A scale-down waits for the tasks it stops, and says so.
        let (code, _, err) =
            cli(&["service", "update", "roll", "--taskdef", "roll:1", "--desired", "1", "--wait"]);
        assert_eq!(code, Some(0), "{err}");
        assert!(err.contains("completed: 1 of 1 running (no health check)"), "{err}");
        let live = f
            .admin
            .list_tasks(&TaskQuery { service: Some("roll".into()), live: true, ..Default::default() })
            .await
            .unwrap();
        assert_eq!(live.len(), 1, "--wait returned before the extra tasks stopped: {live:?}");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_kill9_and_restart_adopts_running_containers_and_reports_exits() {
    within(async {
        let mut f = Fleet::start("adopt", 1, &[]).await;
        f.register(def("stays", &f.docker.image, serde_json::json!({"command": ["sleep", "600"]}))).await;
        f.register(def(
            "leaves",
            &f.docker.image,
            serde_json::json!({"command": ["/bin/sh", "-c", "sleep 8; exit 3"]}),
        ))
        .await;
        let stays = f.run_one("stays").await;
        let leaves = f.run_one("leaves").await;
        let stays = f.task_in(&stays.id, TaskStatus::Running).await;
        let leaves = f.task_in(&leaves.id, TaskStatus::Running).await;
        let (stays_id, leaves_id) = (runtime_id(&stays), runtime_id(&leaves));
        let started_at = f.docker.inspect(&stays_id, "{{.State.StartedAt}}").unwrap();

        f.agents[0].kill9();
        assert_eq!(
            f.docker.inspect(&leaves_id, "{{.State.Running}}").as_deref(),
            Some("true"),
            "the short task exited before the agent was killed: the test is mistimed"
        );
        let docker = f.docker.clone();
        eventually(WAIT, "the short container to exit while the agent is down", || async {
            (docker.inspect(&leaves_id, "{{.State.Status}}").as_deref() == Some("exited")).then_some(())
        })
        .await;
        assert_eq!(f.docker.inspect(&leaves_id, "{{.State.ExitCode}}").as_deref(), Some("3"));

        // Known product bug (crates/mpsfleet-agent/src/tasks.rs, `TaskLoop::start` calls
        // `state.load()` on its caller, the async `agent::run`): adopting a Docker container
        // there blocks on the tokio runtime from inside it and the restarted agent panics
        // ("Cannot start a runtime from within a runtime", docker/mod.rs `DockerRuntime::run`).
        let agent = f.start_agent(0, &[]);
        f.agents[0] = agent;
        let left = f.task_in(&leaves.id, TaskStatus::Stopped).await;
        assert_eq!(left.stop_code, Some(StopCode::EssentialContainerExited), "{left:?}\n{}", f.logs());
        assert_eq!(report(&left).exit_code, Some(3), "{left:?}");

        tokio::time::sleep(Duration::from_secs(2)).await;
        let still = f.admin.describe_task(&stays.id.to_string()).await.unwrap();
        assert_eq!(still.last_status, TaskStatus::Running, "{still:?}");
        assert_eq!(runtime_id(&still), stays_id, "the adopted task has another container");
        assert_eq!(f.docker.inspect(&stays_id, "{{.State.Running}}").as_deref(), Some("true"));
        assert_eq!(f.docker.inspect(&stays_id, "{{.State.StartedAt}}"), Some(started_at), "restarted");
        assert_eq!(f.docker.inspect(&stays_id, "{{.RestartCount}}").as_deref(), Some("0"));
        assert_eq!(
            f.docker.containers_labelled("io.mpsfleet.task", &stays.id.to_string()),
            vec![stays_id.clone()],
            "a second container was created for the adopted task"
        );
        assert_eq!(f.admin.list_hosts(None).await.unwrap().len(), 1, "the agent registered a second time");

        // The adopted container is stopped through the API.
        f.admin.stop_task(&stays.id.to_string(), None).await.unwrap();
        let stopped = f.task_in(&stays.id, TaskStatus::Stopped).await;
        assert_eq!(stopped.stop_code, Some(StopCode::UserInitiated));
        assert_eq!(f.docker.inspect(&stays_id, "{{.State.Running}}").as_deref(), Some("false"));

        // Known product gap (crates/mpsfleet-agent/src/tasks.rs, `State::load`, the
        // `Adopted::Ended` arm): the report of a container that exited while the agent was
        // down is rebuilt from the name and image only, so it loses the container's runtime id
        // although the container is still there.
        assert_eq!(
            report(&left).runtime_id.as_deref(),
            Some(leaves_id.as_str()),
            "the exited container's report lost its runtime id: {left:?}"
        );
    })
    .await;
}

fn signal(pid: u32, sig: &str) {
    assert!(Command::new("kill").args([sig, &pid.to_string()]).status().unwrap().success());
}

const APPLIED: &str = "applied the pool's mps health policy";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fail_closed_mps_container_is_never_created_without_the_daemon() {
    let Some(mps) = mps_control() else { return };
    within(async {
        let mps_arg = mps.display().to_string();
        let f = Fleet::start("mpsdock", 1, &["--mps-control", &mps_arg]).await;
        // Probes far apart and a short timeout: the stopped daemon is not restarted meanwhile.
        let before = f.agents[0].log().matches(APPLIED).count();
        let policy =
            HealthPolicy { mps_probe_timeout_ms: 500, mps_probe_interval_ms: 300_000, ..Default::default() };
        let req = UpdatePool { health_policy: Some(policy), ..Default::default() };
        f.admin.update_pool(&f.pool, &req).await.unwrap();
        let agent = &f.agents[0];
        eventually(WAIT, "the agent to apply the pool's policy", || async {
            (agent.log().matches(APPLIED).count() > before).then_some(())
        })
        .await;
        let mps_req =
            serde_json::json!([{"type": "GPU", "sharingStrategy": {"nvidiaMps": {"memory": 1024}}}]);
        f.register(def(
            "mpsc",
            &f.docker.image,
            serde_json::json!({
                "command": ["/bin/sh", "-c",
                    "echo pipe=$CUDA_MPS_PIPE_DIRECTORY; ls $CUDA_MPS_PIPE_DIRECTORY; \
                     [ -S $CUDA_MPS_PIPE_DIRECTORY/control ] && echo control-is-a-socket; \
                     echo limit=$CUDA_MPS_PINNED_DEVICE_MEM_LIMIT; echo done; exec sleep 600"],
                "resourceRequirements": mps_req,
                "stopTimeout": 2,
            }),
        ))
        .await;

        // A stopped daemon accepts connections and never answers.
        let pid = daemon_pid(&f.agents[0].data_dir, 0);
        signal(pid, "-STOP");
        let t = f.run_one("mpsc").await;
        let t = f.task_in(&t.id, TaskStatus::Stopped).await;
        signal(pid, "-CONT");
        assert_eq!(t.stop_code, Some(StopCode::MpsDaemonUnavailable), "{t:?}\n{}", f.logs());
        assert!(
            f.docker.containers_labelled("io.mpsfleet.task", &t.id.to_string()).is_empty(),
            "a container was created for an MPS task whose daemon did not answer"
        );

        // With the daemon answering, the container runs with its limits and the pipe directory.
        let t = f.run_one("mpsc").await;
        let t = f.task_in(&t.id, TaskStatus::Running).await;
        let out = f.output_with(&t.id, "done").await;
        let pipe = out
            .lines()
            .find_map(|l| l.strip_prefix("pipe="))
            .filter(|p| !p.is_empty())
            .unwrap_or_else(|| panic!("no CUDA_MPS_PIPE_DIRECTORY inside: {out:?}"))
            .to_string();
        assert!(out.lines().any(|l| l == "control"), "the pipe directory inside has no control: {out:?}");
        assert!(out.contains("control-is-a-socket"), "{out:?}");
        assert!(out.contains("limit=0=1024M"), "{out:?}");
        let id = runtime_id(&t);
        let mounts = f.docker.inspect(&id, "{{range .Mounts}}{{.Source}}:{{.Destination}} {{end}}").unwrap();
        assert!(
            mounts.contains(&format!("{pipe}:{pipe}")),
            "pipe dir not mounted at the same path: {mounts}"
        );
        let notes = report(&t).notes.join("; ");
        assert!(notes.contains("emulated"), "the report does not say the GPU is emulated: {notes:?}");
        assert_eq!(f.docker.inspect(&id, "{{.HostConfig.DeviceRequests}}").as_deref(), Some("[]"));

        // The socket the container sees is the real daemon's: it answers on that path.
        assert_mps_daemon_answers(&mps, &pipe);
        f.stop_all().await;
    })
    .await;
}
