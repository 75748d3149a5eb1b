//! The Docker runtime against a real Docker Engine: `bash scripts/docker-env.sh start`, then
//! `eval "$(bash scripts/docker-env.sh env)"` (DOCKER_HOST, MPSFLEET_TEST_IMAGE).

use bollard::query_parameters::InspectContainerOptions;
use mpsfleet_agent::docker::{
    image_record, DockerConfig, DockerError, DockerHandle, DockerLaunch, DockerRuntime, GpuWiring,
    ImagePolicy, PullBehavior,
};
use mpsfleet_agent::output::decode_header;
use mpsfleet_agent::runtime::{stop_for_exit, ContainerState, ExitRecord};
use mpsfleet_types::logs::OutputStream;
use mpsfleet_types::task::StopCode;
use mpsfleet_types::{ContainerDefinition, Protocol, Task, TaskDefinition};
use std::io::{Read, Write};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

fn docker_host() -> String {
    match std::env::var("DOCKER_HOST") {
        Ok(h) if !h.is_empty() => h,
        _ => panic!(
            "DOCKER_HOST is not set: these tests need the private Docker Engine; run \
             `bash scripts/docker-env.sh start` and `eval \"$(bash scripts/docker-env.sh env)\"`"
        ),
    }
}

fn test_image() -> String {
    docker_host();
    std::env::var("MPSFLEET_TEST_IMAGE").unwrap_or_else(|_| {
        panic!("MPSFLEET_TEST_IMAGE is not set: run `eval \"$(bash scripts/docker-env.sh env)\"`")
    })
}

static SEQ: AtomicU32 = AtomicU32::new(0);

/// One runtime with a host id of its own; removes the host's containers when dropped.
struct Fixture {
    rt: DockerRuntime,
    tokio: tokio::runtime::Runtime,
    _dir: tempfile::TempDir,
    dir: PathBuf,
}

impl Fixture {
    fn new(tag: &str) -> Fixture {
        Self::with(tag, PullBehavior::Default)
    }

    fn with(tag: &str, pull: PullBehavior) -> Fixture {
        let host = format!("t{}-{tag}-{}", std::process::id(), SEQ.fetch_add(1, Ordering::SeqCst));
        Self::for_host(host, pull)
    }

    fn for_host(host: String, pull: PullBehavior) -> Fixture {
        Self::publishing_for(host, pull, None)
    }

    /// Ports published on `address` (`--publish-address`), or on every address.
    fn publishing(tag: &str, address: Option<std::net::IpAddr>) -> Fixture {
        let host = format!("t{}-{tag}-{}", std::process::id(), SEQ.fetch_add(1, Ordering::SeqCst));
        Self::publishing_for(host, PullBehavior::Default, address)
    }

    fn publishing_for(
        host: String,
        pull: PullBehavior,
        publish_address: Option<std::net::IpAddr>,
    ) -> Fixture {
        let tokio = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("tokio runtime");
        let dir = tempfile::tempdir().expect("tempdir");
        let cfg = DockerConfig {
            socket: mpsfleet_agent::docker::socket_from(Some(&docker_host())),
            host_id: host,
            pull,
            pull_timeout: Duration::from_secs(60),
            gpu_wiring: Some(GpuWiring::DeviceRequests),
            data_dir: dir.path().join("docker"),
            publish_address,
        };
        let rt = DockerRuntime::connect(cfg, tokio.handle().clone()).expect("connect");
        Fixture { rt, tokio, dir: dir.path().to_path_buf(), _dir: dir }
    }

    fn launch(&self, container: serde_json::Value) -> DockerHandle {
        self.launch_in(container, None)
    }

    fn launch_in(&self, container: serde_json::Value, network_mode: Option<&str>) -> DockerHandle {
        let l = launch_of(container, network_mode);
        match self.rt.launch(&l) {
            Ok(h) => h,
            Err((code, reason)) => panic!("launch failed: {code:?} {reason}"),
        }
    }

    fn inspect(&self, id: &str) -> bollard::models::ContainerInspectResponse {
        let docker =
            bollard::Docker::connect_with_unix(&docker_host(), 30, &mpsfleet_agent::docker::API_VERSION)
                .expect("bollard");
        let id = id.to_string();
        self.tokio
            .block_on(async move { docker.inspect_container(&id, None::<InspectContainerOptions>).await })
            .expect("inspect")
    }

    fn wait_exited(&self, h: &DockerHandle, limit: Duration) -> ExitRecord {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            match self.rt.status(h).expect("status") {
                ContainerState::Exited(e) => return e,
                ContainerState::Lost { reason } => panic!("lost: {reason}"),
                ContainerState::Running { .. } => {}
            }
            assert!(tokio::time::Instant::now() < deadline, "{} still running after {limit:?}", h.name);
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        if let Ok(ours) = self.rt.list_ours() {
            for c in ours {
                let _ = self.rt.remove(&c.task_id, &c.container);
            }
        }
    }
}

fn task_id() -> String {
    format!("t-{:08x}{:08x}", std::process::id(), SEQ.fetch_add(1, Ordering::SeqCst))
}

fn launch_of(container: serde_json::Value, network_mode: Option<&str>) -> DockerLaunch {
    let task: Task = serde_json::from_value(serde_json::json!({
        "id": task_id(), "taskDefinition": "fam:2", "pool": "p",
        "lastStatus": "PENDING", "desiredStatus": "RUNNING", "healthStatus": "UNKNOWN",
        "startedBy": "run:x", "createdAtMs": 1,
    }))
    .expect("task json");
    let mut c = serde_json::json!({"name": "app", "image": test_image(), "essential": true});
    if let (Some(b), Some(extra)) = (c.as_object_mut(), container.as_object()) {
        b.extend(extra.clone());
    }
    let container: ContainerDefinition = serde_json::from_value(c).expect("container json");
    let definition: TaskDefinition = serde_json::from_value(serde_json::json!({
        "family": "fam", "revision": 2, "containerDefinitions": [], "networkMode": network_mode,
    }))
    .expect("definition json");
    let env = mpsfleet_agent::env::container_env(&task, &container, None);
    DockerLaunch {
        task,
        definition,
        container,
        env,
        mps_pipe_dir: None,
        gpus_emulated: false,
        stop_timeout: Duration::from_secs(2),
    }
}

fn task_of(h: &DockerHandle) -> String {
    // mpsfleet-<host>-<task>-app
    let rest = h.name.strip_suffix("-app").expect("name ends in the container");
    let at = rest.rfind("-t-").expect("task id in the name");
    rest[at + 1..].to_string()
}

fn sh(script: &str) -> serde_json::Value {
    serde_json::json!({"entryPoint": ["sh", "-c"], "command": [script]})
}

#[test]
fn ping_reports_the_engine_version_and_a_hung_daemon_times_out() {
    let f = Fixture::new("ping");
    let version = f.rt.ping(Duration::from_secs(10)).expect("ping");
    assert!(
        version.starts_with("20.") || version.chars().next().is_some_and(|c| c.is_ascii_digit()),
        "{version}"
    );

    // A socket that accepts and never answers.
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("hung.sock");
    let listener = std::os::unix::net::UnixListener::bind(&path).expect("bind");
    let keep = std::thread::spawn(move || {
        let conns: Vec<_> = listener.incoming().take(1).collect();
        std::thread::sleep(Duration::from_secs(3));
        drop(conns);
    });
    let mut cfg = f.rt.config().clone();
    cfg.socket = path.clone();
    let hung = DockerRuntime::connect(cfg.clone(), f.tokio.handle().clone()).expect("connect");
    let started = tokio::time::Instant::now();
    let err = hung.ping(Duration::from_millis(500)).expect_err("a hung daemon must not answer");
    assert!(matches!(err, DockerError::Timeout { .. }), "{err:?}");
    assert!(started.elapsed() < Duration::from_secs(3), "took {:?}", started.elapsed());
    let _ = keep.join();

    cfg.socket = dir.path().join("absent.sock");
    match DockerRuntime::connect(cfg, f.tokio.handle().clone()) {
        Err(DockerError::Unreachable { .. }) => {}
        Err(e) => panic!("expected Unreachable, got {e:?}"),
        Ok(rt) => {
            let e = rt.ping(Duration::from_secs(2)).expect_err("no daemon there");
            assert!(matches!(e, DockerError::Unreachable { .. }), "{e:?}");
        }
    }
}

#[test]
fn the_images_default_command_runs() {
    let f = Fixture::new("default");
    let h = f.launch(serde_json::json!({}));
    assert!(h.id.len() >= 12, "{h:?}");
    assert!(h.pid.is_some_and(|p| p > 0), "{h:?}");
    assert!(h.ip.is_some(), "a bridge container has an address: {h:?}");
    assert!(h.image_digest.as_deref().is_some_and(|d| d.starts_with("sha256:")), "{h:?}");
    let info = f.inspect(&h.id);
    let config = info.config.expect("config");
    assert_eq!(config.entrypoint, None);
    assert_eq!(
        config.cmd,
        Some(vec![
            "/bin/sh".to_string(),
            "-c".to_string(),
            "echo hello from the image; sleep 3600".to_string()
        ])
    );
    let hc = info.host_config.expect("host config");
    assert_eq!(hc.init, Some(true));
    assert_eq!(hc.cpu_shares, Some(2));
    let task = task_of(&h);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let out = f.rt.logs(&task, "app", true, true, None).expect("logs");
        if out == b"hello from the image\n" {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "logs: {:?}", String::from_utf8_lossy(&out));
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(f.rt.status(&h).expect("status").is_running());
}

#[test]
fn an_entry_point_without_a_command_drops_the_images_command() {
    let f = Fixture::new("entry");
    let h = f.launch(serde_json::json!({"entryPoint": ["echo", "from-entrypoint"]}));
    let exit = f.wait_exited(&h, Duration::from_secs(20));
    assert_eq!(exit.code, Some(0));
    let out = f.rt.logs(&task_of(&h), "app", true, true, None).expect("logs");
    assert_eq!(String::from_utf8_lossy(&out), "from-entrypoint\n");

    // A command alone replaces the image's command.
    let h = f.launch(serde_json::json!({"command": ["echo", "from-command"]}));
    f.wait_exited(&h, Duration::from_secs(20));
    let out = f.rt.logs(&task_of(&h), "app", true, true, None).expect("logs");
    assert_eq!(String::from_utf8_lossy(&out), "from-command\n");
}

#[test]
fn env_user_working_directory_and_labels_reach_the_container_and_exec_returns_exit_codes() {
    let f = Fixture::new("env");
    let mut c = sh("sleep 30");
    c["environment"] = serde_json::json!([{"name": "FOO", "value": "bar baz"}]);
    c["user"] = "65534:65534".into();
    c["workingDirectory"] = "/tmp".into();
    c["dockerLabels"] = serde_json::json!({"team": "ml", "io.mpsfleet.host": "forged"});
    c["cpu"] = 512.into();
    c["memory"] = 64.into();
    let h = f.launch(c);
    let argv = |s: &str| vec!["sh".to_string(), "-c".to_string(), s.to_string()];
    let out =
        f.rt.exec(&h, &argv("echo \"$FOO\"; id -u; id -g; pwd"), Duration::from_secs(20)).expect("exec");
    assert_eq!(out.exit_code, 0, "{out:?}");
    assert_eq!(out.output, "bar baz\n65534\n65534\n/tmp\n");
    let out = f.rt.exec(&h, &argv("echo oops >&2; exit 3"), Duration::from_secs(20)).expect("exec");
    assert_eq!(out.exit_code, 3);
    assert_eq!(out.output, "oops\n");
    let e = f.rt.exec(&h, &argv("sleep 23"), Duration::from_millis(500)).expect_err("must time out");
    assert!(matches!(e, DockerError::Timeout { .. }), "{e:?}");
    // A check that overran is killed, not left to pile up inside the container.
    let ps = f.rt.exec(&h, &argv("ps -o args"), Duration::from_secs(20)).expect("ps");
    assert!(!ps.output.contains("sleep 23"), "the timed-out exec still runs: {}", ps.output);

    let info = f.inspect(&h.id);
    let labels = info.config.and_then(|c| c.labels).expect("labels");
    assert_eq!(labels.get("team").map(String::as_str), Some("ml"));
    assert_eq!(labels.get("io.mpsfleet.host").map(String::as_str), Some(f.rt.host_id()));
    assert_eq!(labels.get("io.mpsfleet.task").map(String::as_str), Some(task_of(&h).as_str()));
    assert_eq!(labels.get("io.mpsfleet.container").map(String::as_str), Some("app"));
    assert_eq!(labels.get("com.amazonaws.ecs.task-definition-family").map(String::as_str), Some("fam"));
    assert_eq!(labels.get("com.amazonaws.ecs.task-definition-version").map(String::as_str), Some("2"));
    let hc = info.host_config.expect("host config");
    assert_eq!(hc.cpu_shares, Some(512));
    assert_eq!(hc.memory, Some(64 << 20));
    let log = hc.log_config.expect("log config");
    assert_eq!(log.typ.as_deref(), Some("json-file"));
    assert_eq!(log.config.as_ref().and_then(|c| c.get("max-size")).map(String::as_str), Some("10m"));
}

#[test]
fn a_container_past_its_memory_limit_is_oom_killed() {
    let f = Fixture::new("oom");
    // `tail` keeps the last lines; /dev/zero has no newline, so it keeps everything.
    let h = f.launch(serde_json::json!({"command": ["tail", "/dev/zero"], "memory": 8}));
    let exit = f.wait_exited(&h, Duration::from_secs(60));
    assert!(exit.oom_killed, "{exit:?}");
    assert_eq!(exit.code, Some(137), "{exit:?}");
    assert!(exit.finished_at_ms > 1_700_000_000_000, "{exit:?}");
    let (code, reason) = stop_for_exit("app", &exit);
    assert_eq!(code, StopCode::OutOfMemory, "{reason}");
}

fn http_get(port: u16) -> std::io::Result<String> {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    s.write_all(b"GET /index.html HTTP/1.0\r\nHost: x\r\n\r\n")?;
    let mut out = String::new();
    s.read_to_string(&mut out)?;
    Ok(out)
}

#[test]
fn a_bridge_port_without_host_port_is_published_on_a_port_docker_chooses() {
    let f = Fixture::new("port");
    let mut c = sh("mkdir -p /tmp/www && echo hello-from-httpd > /tmp/www/index.html && exec httpd -f -p 8080 -h /tmp/www");
    c["portMappings"] = serde_json::json!([{"containerPort": 8080}]);
    let h = f.launch(c);
    assert_eq!(h.network_bindings.len(), 1, "{h:?}");
    let b = &h.network_bindings[0];
    assert_eq!((b.bind_ip.as_str(), b.container_port, b.protocol), ("0.0.0.0", 8080, Protocol::Tcp));
    assert!(b.host_port > 0);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    loop {
        match http_get(b.host_port) {
            Ok(body) if body.contains("hello-from-httpd") => break,
            other => {
                assert!(tokio::time::Instant::now() < deadline, "no answer on {}: {other:?}", b.host_port)
            }
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The addresses the kernel lists a TCP port listening on (`ss -ltnH`), as ss prints them:
/// `0.0.0.0:32768`, `[::]:32768`, `127.0.0.1:32768`.
fn listening_on(port: u16) -> Vec<String> {
    let out = std::process::Command::new("ss")
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

#[test]
fn the_reported_binding_is_where_the_kernel_says_the_port_listens() {
    let ipv6 =
        std::fs::read_to_string("/proc/net/if_inet6").is_ok_and(|s| s.lines().any(|l| l.ends_with(" lo")));
    // (--publish-address, the bind address reported, addresses the port must listen on, and
    // those it may listen on besides)
    type Row<'a> = (Option<&'a str>, &'a str, Vec<&'a str>, Vec<&'a str>);
    let mut table: Vec<Row> = vec![
        // Every address, as ECS: Docker binds 0.0.0.0 and, where its daemon binds IPv6 too
        // (its choice, which differs between engines), ::. 0.0.0.0 is what is reported.
        (None, "0.0.0.0", vec!["0.0.0.0"], if ipv6 { vec!["[::]"] } else { vec![] }),
        (Some("127.0.0.1"), "127.0.0.1", vec!["127.0.0.1"], vec![]),
    ];
    if ipv6 {
        table.push((Some("::1"), "::1", vec!["[::1]"], vec![]));
    } else {
        eprintln!("no IPv6 on lo: the ::1 row is not run");
    }
    for (publish, reported, must, may) in table {
        let f = Fixture::publishing("bound", publish.map(|p| p.parse().expect("address")));
        let mut c = sh("exec httpd -f -p 8080 -h /tmp");
        c["portMappings"] = serde_json::json!([{"containerPort": 8080}]);
        let h = f.launch(c);
        assert_eq!(h.network_bindings.len(), 1, "{publish:?}: {h:?}");
        let b = &h.network_bindings[0];
        assert_eq!((b.bind_ip.as_str(), b.container_port), (reported, 8080), "{publish:?}");
        let at = |a: &&str| format!("{a}:{}", b.host_port);
        let kernel = listening_on(b.host_port);
        for want in must.iter().map(at) {
            assert!(
                kernel.contains(&want),
                "{publish:?}: the kernel lists port {} on {kernel:?}, not {want}",
                b.host_port
            );
        }
        let allowed: Vec<String> = must.iter().chain(&may).map(at).collect();
        assert!(
            kernel.iter().all(|k| allowed.contains(k)),
            "{publish:?}: the kernel lists port {} on {kernel:?}, beyond {allowed:?}",
            b.host_port
        );
        assert!(
            kernel.contains(&b.address()),
            "{publish:?}: reported {} but listening on {kernel:?}",
            b.address()
        );
    }
}

#[test]
fn stop_kills_a_container_that_ignores_sigterm_after_the_timeout() {
    let f = Fixture::new("stop");
    let h = f.launch(sh("trap '' TERM; echo ready; while true; do sleep 1; done"));
    std::thread::sleep(Duration::from_millis(500));
    let started = tokio::time::Instant::now();
    let out = f.rt.stop(&h, Duration::from_secs(2)).expect("stop");
    let took = started.elapsed();
    assert!(out.killed, "{out:?}");
    assert!(took >= Duration::from_millis(1900) && took < Duration::from_secs(10), "took {took:?}");
    match &out.state {
        ContainerState::Exited(e) => assert_eq!((e.code, e.oom_killed), (Some(137), false)),
        other => panic!("{other:?}"),
    }

    // A container that stops on SIGTERM (the init forwards it to the shell) is not killed.
    let h = f.launch(sh("sleep 300"));
    std::thread::sleep(Duration::from_millis(300));
    let started = tokio::time::Instant::now();
    let out = f.rt.stop(&h, Duration::from_secs(10)).expect("stop");
    assert!(!out.killed, "{out:?}");
    assert!(started.elapsed() < Duration::from_secs(5), "took {:?}", started.elapsed());
    assert!(matches!(out.state, ContainerState::Exited(ExitRecord { code: Some(143), .. })), "{out:?}");
    // Stopping a stopped container is fine.
    let again = f.rt.stop(&h, Duration::from_secs(1)).expect("stop again");
    assert!(!again.state.is_running());
}

#[test]
fn a_missing_image_fails_with_cannot_pull_and_the_registrys_message() {
    for pull in [PullBehavior::Default, PullBehavior::Always, PullBehavior::Once, PullBehavior::PreferCached]
    {
        let f = Fixture::with("pull", pull);
        let l = launch_of(serde_json::json!({"image": "127.0.0.1:5000/mpsfleet/missing:none"}), None);
        let (code, reason) = f.rt.launch(&l).expect_err("the image does not exist");
        assert_eq!(code, StopCode::CannotPullContainerError, "{pull:?}: {reason}");
        assert!(reason.starts_with("CannotPullContainerError: "), "{reason}");
        assert!(reason.contains("manifest unknown") || reason.contains("not found"), "{pull:?}: {reason}");
        assert!(f.rt.list_ours().expect("list").is_empty(), "no container is left behind");
    }
}

#[test]
fn pull_once_is_recorded_and_a_failed_pull_uses_the_cached_image_under_default() {
    let f = Fixture::with("once", PullBehavior::Once);
    let h = f.launch(sh("sleep 30"));
    let reference = test_image();
    let (pulled, last_used) = image_record(&f.dir.join("docker"), &reference).expect("record");
    assert!(pulled && last_used > 0);
    f.rt.remove(&task_of(&h), "app").expect("remove");

    // A tag only this engine has (never pushed): the pull fails, the cached copy is used.
    let local = format!("127.0.0.1:5000/mpsfleet/local-only-{}:t", std::process::id());
    tag(&f, &reference, &local);
    let f2 = Fixture::with("cached", PullBehavior::Default);
    let mut l = launch_of(sh("sleep 30"), None);
    l.container.image = Some(local.clone());
    let h = f2.rt.launch(&l).expect("cached image used");
    assert!(h.notes.iter().any(|n| n.contains("cached image was used")), "{:?}", h.notes);
    let f3 = Fixture::with("always", PullBehavior::Always);
    let (code, _) = f3.rt.launch(&l).expect_err("always needs the pull to succeed");
    assert_eq!(code, StopCode::CannotPullContainerError);
    drop(f2);
    untag(&f, &local);
}

fn tag(f: &Fixture, from: &str, to: &str) {
    let docker = bollard::Docker::connect_with_unix(&docker_host(), 30, &mpsfleet_agent::docker::API_VERSION)
        .expect("bollard");
    let (repo, tag) = to.rsplit_once(':').expect("tag");
    let opts = bollard::query_parameters::TagImageOptions { repo: Some(repo.into()), tag: Some(tag.into()) };
    let from = from.to_string();
    f.tokio.block_on(async move { docker.tag_image(&from, Some(opts)).await }).expect("tag");
}

fn commit(f: &Fixture, container: &str, to: &str) {
    let docker = bollard::Docker::connect_with_unix(&docker_host(), 30, &mpsfleet_agent::docker::API_VERSION)
        .expect("bollard");
    let (repo, tag) = to.rsplit_once(':').expect("tag");
    let opts = bollard::query_parameters::CommitContainerOptions {
        container: Some(container.into()),
        repo: Some(repo.into()),
        tag: Some(tag.into()),
        ..Default::default()
    };
    f.tokio
        .block_on(
            async move { docker.commit_container(opts, bollard::models::ContainerConfig::default()).await },
        )
        .expect("commit");
}

fn untag(f: &Fixture, reference: &str) {
    let docker = bollard::Docker::connect_with_unix(&docker_host(), 30, &mpsfleet_agent::docker::API_VERSION)
        .expect("bollard");
    let reference = reference.to_string();
    let _ = f.tokio.block_on(async move {
        docker.remove_image(&reference, None::<bollard::query_parameters::RemoveImageOptions>, None).await
    });
}

/// Removes the image when the test ends, passed or not.
struct Untag<'a>(&'a Fixture, String);

impl Drop for Untag<'_> {
    fn drop(&mut self) {
        untag(self.0, &self.1);
    }
}

fn image_exists(f: &Fixture, reference: &str) -> bool {
    let docker = bollard::Docker::connect_with_unix(&docker_host(), 30, &mpsfleet_agent::docker::API_VERSION)
        .expect("bollard");
    let reference = reference.to_string();
    f.tokio.block_on(async move { docker.inspect_image(&reference).await }).is_ok()
}

#[test]
fn adopt_finds_a_running_container_by_name() {
    let f = Fixture::new("adopt");
    let h = f.launch(sh("sleep 30"));
    let task = task_of(&h);
    // A new runtime (as after a restart) with the same host id.
    let again = Fixture::for_host(f.rt.host_id().to_string(), PullBehavior::Default);
    let (found, state) = again.rt.adopt(&task, "app").expect("adopt").expect("found");
    assert_eq!(found.id, h.id);
    assert_eq!(found.name, h.name);
    assert_eq!(state, ContainerState::Running { pid: h.pid.expect("pid") });
    assert!(again.rt.adopt(&task, "other").expect("adopt").is_none());
    assert!(again.rt.adopt("t-00000000000000ff", "app").expect("adopt").is_none());
    // The adopted handle sees the stop.
    let out = again.rt.stop(&found, Duration::from_secs(5)).expect("stop");
    assert!(matches!(out.state, ContainerState::Exited(_)), "{out:?}");
}

#[test]
fn status_sees_an_exit_through_events_before_the_refresh() {
    let f = Fixture::new("events");
    let h = f.launch(sh("sleep 1; exit 3"));
    let started = tokio::time::Instant::now();
    let exit = f.wait_exited(&h, Duration::from_secs(20));
    assert_eq!(exit.code, Some(3));
    assert!(!exit.oom_killed);
    // Well under the 5 s refresh after the 1 s sleep: the die event marked it.
    assert!(started.elapsed() < Duration::from_millis(3500), "took {:?}", started.elapsed());
    f.rt.remove(&task_of(&h), "app").expect("remove");
    // Gone: Lost, not an error.
    let state = f.rt.status(&DockerHandle { ..h.clone() });
    match state {
        Ok(ContainerState::Lost { .. }) | Ok(ContainerState::Exited(_)) => {}
        other => panic!("{other:?}"),
    }
}

fn frames(path: &std::path::Path) -> Vec<(OutputStream, u64, String)> {
    let buf = std::fs::read(path).unwrap_or_default();
    let mut out = Vec::new();
    let mut pos = 0;
    while pos < buf.len() {
        let (stream, at, len, head) = decode_header(&buf[pos..]).expect("frame").expect("whole frame");
        out.push((stream, at, String::from_utf8_lossy(&buf[pos + head..pos + head + len]).into_owned()));
        pos += head + len;
    }
    out
}

#[test]
fn logs_and_follow_output_capture_both_streams() {
    let f = Fixture::new("logs");
    let h = f.launch(sh("echo out1; sleep 1; echo err1 >&2; sleep 1; echo out2"));
    let path = f.dir.join("output.log");
    let follower = f.rt.follow_output(&h, path.clone()).expect("follow");
    f.wait_exited(&h, Duration::from_secs(20));
    // The follower ends with the container's log stream.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !follower.is_finished() {
        assert!(tokio::time::Instant::now() < deadline, "follower still running");
        std::thread::sleep(Duration::from_millis(50));
    }
    let got = frames(&path);
    let texts: Vec<(OutputStream, &str)> = got.iter().map(|(s, _, t)| (*s, t.as_str())).collect();
    assert_eq!(
        texts,
        vec![
            (OutputStream::Stdout, "out1\n"),
            (OutputStream::Stderr, "err1\n"),
            (OutputStream::Stdout, "out2\n")
        ]
    );
    assert!(got.windows(2).all(|w| w[0].1 <= w[1].1), "times in order: {got:?}");
    assert!(got[2].1 >= got[0].1 + 1900, "Docker's own times: {got:?}");

    // Following again (after a restart) adds nothing already there.
    let again = f.rt.follow_output(&h, path.clone()).expect("follow");
    again.join().expect("join");
    assert_eq!(frames(&path).len(), 3);

    let task = task_of(&h);
    let both = f.rt.logs(&task, "app", true, true, None).expect("logs");
    assert_eq!(String::from_utf8_lossy(&both), "out1\nerr1\nout2\n");
    let stdout = f.rt.logs(&task, "app", true, false, None).expect("logs");
    assert_eq!(String::from_utf8_lossy(&stdout), "out1\nout2\n");
    let stderr = f.rt.logs(&task, "app", false, true, None).expect("logs");
    assert_eq!(String::from_utf8_lossy(&stderr), "err1\n");
    let tail = f.rt.logs(&task, "app", true, true, Some(5)).expect("logs");
    assert_eq!(String::from_utf8_lossy(&tail), "out2\n");
}

#[test]
fn list_ours_lists_only_this_hosts_containers_and_remove_removes() {
    let a = Fixture::new("lista");
    let b = Fixture::new("listb");
    let ha = a.launch(sh("sleep 30"));
    let hb = b.launch(sh("exit 0"));
    b.wait_exited(&hb, Duration::from_secs(20));
    let ours = a.rt.list_ours().expect("list");
    assert_eq!(ours.len(), 1, "{ours:?}");
    assert_eq!(
        (ours[0].id.as_str(), ours[0].task_id.as_str(), ours[0].container.as_str()),
        (ha.id.as_str(), task_of(&ha).as_str(), "app")
    );
    assert!(ours[0].running);
    assert_eq!(ours[0].finished_at_ms, None);
    let theirs = b.rt.list_ours().expect("list");
    assert_eq!(theirs.len(), 1, "{theirs:?}");
    assert!(!theirs[0].running);
    assert!(theirs[0].finished_at_ms.is_some_and(|t| t > 1_700_000_000_000), "{theirs:?}");

    a.rt.remove(&task_of(&ha), "app").expect("remove");
    assert!(a.rt.list_ours().expect("list").is_empty());
    assert!(a.rt.adopt(&task_of(&ha), "app").expect("adopt").is_none());
    a.rt.remove(&task_of(&ha), "app").expect("removing a missing container is fine");
    assert!(matches!(a.rt.status(&ha).expect("status"), ContainerState::Lost { .. }));
}

#[test]
fn a_leftover_container_of_the_same_name_is_replaced() {
    let f = Fixture::new("left");
    let l = launch_of(sh("sleep 30"), None);
    let first = f.rt.launch(&l).expect("launch");
    // The same task and container again, as after a crash between create and the record.
    let second = f.rt.launch(&l).expect("launch again");
    assert_eq!(first.name, second.name);
    assert_ne!(first.id, second.id);
    assert_eq!(f.rt.list_ours().expect("list").len(), 1);
}

#[test]
fn unused_images_are_removed_per_the_policy() {
    let f = Fixture::with("images", PullBehavior::PreferCached);
    let reference = format!("127.0.0.1:5000/mpsfleet/cleanup-{}:t", std::process::id());
    // An image of its own (a tag of the test image would share its id with every other
    // test's containers, and an image in use is never removed).
    // The test image runs here too (the maker below), so this runtime records it as used; a
    // container of it running throughout keeps it in use, whatever other tests run meanwhile.
    let holder = f.launch(sh("sleep 300"));
    let maker = f.launch(sh(&format!("echo {} > /marker", std::process::id())));
    f.wait_exited(&maker, Duration::from_secs(20));
    commit(&f, &maker.id, &reference);
    let _untag = Untag(&f, reference.clone());
    f.rt.remove(&task_of(&maker), "app").expect("remove");
    let mut l = launch_of(sh("exit 0"), None);
    l.container.image = Some(reference.clone());
    let h = f.rt.launch(&l).expect("launch");
    f.wait_exited(&h, Duration::from_secs(20));
    let (_, used_at) = image_record(&f.dir.join("docker"), &reference).expect("recorded");
    let policy = ImagePolicy::default();
    assert_eq!(
        policy,
        ImagePolicy {
            interval: Duration::from_secs(1800),
            min_age: Duration::from_secs(3600),
            max_per_cycle: 5
        }
    );
    let later = used_at + 2 * 3600 * 1000;
    // Used by a (stopped) container: kept.
    assert!(f.rt.remove_unused_images(&policy, later).expect("cleanup").is_empty());
    f.rt.remove(&task_of(&h), "app").expect("remove");
    // Not old enough: kept.
    assert!(f.rt.remove_unused_images(&policy, used_at + 1000).expect("cleanup").is_empty());
    assert!(image_exists(&f, &reference));
    // At most max_per_cycle.
    let none = ImagePolicy { max_per_cycle: 0, ..policy.clone() };
    assert!(f.rt.remove_unused_images(&none, later).expect("cleanup").is_empty());
    assert_eq!(f.rt.remove_unused_images(&policy, later).expect("cleanup"), vec![reference.clone()]);
    assert!(!image_exists(&f, &reference));
    assert!(image_record(&f.dir.join("docker"), &reference).is_none());
    // The test image, in use by the holder: never a candidate.
    assert!(image_exists(&f, &test_image()));
    f.rt.remove(&task_of(&holder), "app").expect("remove");
}

#[test]
fn create_and_start_failures_fail_the_task_and_leave_no_container() {
    let f = Fixture::new("fail");
    // 2 MiB is raised to 4 MiB as ECS does; Docker 20.10 refuses anything under 6 MiB at create.
    let l = launch_of(serde_json::json!({"command": ["true"], "memory": 2}), None);
    let (code, reason) = f.rt.launch(&l).expect_err("below Docker's minimum");
    assert_eq!(code, StopCode::TaskFailedToStart, "{reason}");
    assert!(reason.starts_with("CannotCreateContainerError: "), "{reason}");
    assert!(reason.contains("emory"), "{reason}");
    assert!(f.rt.list_ours().expect("list").is_empty());

    // Docker resolves the user when it starts the container.
    let l = launch_of(serde_json::json!({"command": ["true"], "user": "nosuchuser"}), None);
    let (code, reason) = f.rt.launch(&l).expect_err("no such user");
    assert_eq!(code, StopCode::TaskFailedToStart, "{reason}");
    assert!(reason.starts_with("CannotStartContainerError: "), "{reason}");
    assert!(reason.contains("nosuchuser"), "{reason}");
    assert!(f.rt.list_ours().expect("list").is_empty(), "the half-made container is removed");

    // A missing executable is found by the init inside the container, after the start: the
    // container exits 127 and says why on stderr.
    let h = f.launch(serde_json::json!({"command": ["/no/such/binary"]}));
    let exit = f.wait_exited(&h, Duration::from_secs(20));
    assert_eq!(exit.code, Some(127), "{exit:?}");
    let err = f.rt.logs(&task_of(&h), "app", false, true, None).expect("logs");
    assert!(String::from_utf8_lossy(&err).contains("/no/such/binary"), "{}", String::from_utf8_lossy(&err));
}

#[test]
fn status_is_served_from_the_last_inspect_while_nothing_changed() {
    let f = Fixture::new("cheap");
    let h = f.launch(sh("sleep 30"));
    let started = tokio::time::Instant::now();
    for _ in 0..2000 {
        assert!(f.rt.status(&h).expect("status").is_running());
    }
    // 2000 inspects over the socket take seconds; served from memory it is a few ms.
    assert!(started.elapsed() < Duration::from_millis(500), "took {:?}", started.elapsed());
}

const GPU: &str = "GPU-11111111-2222-3333-4444-555555555555";

fn mps_launch(pipe_dir: &std::path::Path) -> DockerLaunch {
    let mut l = launch_of(
        serde_json::json!({
            "entryPoint": ["sh", "-c"],
            "command": ["echo \"$CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_PINNED_DEVICE_MEM_LIMIT\" > \"$CUDA_MPS_PIPE_DIRECTORY/seen\"; sleep 30"],
            "resourceRequirements": [{"type": "GPU", "sharingStrategy": {"nvidiaMps": {"memory": 1024}}}],
        }),
        None,
    );
    l.task.gpu_ids = vec![serde_json::from_value(serde_json::json!(GPU)).expect("gpu uuid")];
    l.env = mpsfleet_agent::env::container_env(&l.task, &l.container, Some(pipe_dir));
    l.mps_pipe_dir = Some(pipe_dir.to_path_buf());
    l
}

#[test]
fn an_mps_container_gets_the_pipe_directory_and_an_emulated_gpu_gets_no_device_request() {
    let f = Fixture::new("mps");
    let pipe = f.dir.join("mps-pipe");
    std::fs::create_dir_all(&pipe).expect("pipe dir");
    let mut l = mps_launch(&pipe);
    l.gpus_emulated = true;
    let h = f.rt.launch(&l).expect("launch");
    assert_eq!(
        h.notes.iter().filter(|n| n.contains(&format!("GPU {GPU} is emulated"))).count(),
        1,
        "{:?}",
        h.notes
    );
    let seen = pipe.join("seen");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    // The shell creates the file before `echo` writes its line: wait for the whole line.
    let text = loop {
        let text = std::fs::read_to_string(&seen).unwrap_or_default();
        if text.ends_with('\n') {
            break text;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the container never wrote its line to the mounted pipe directory (so far: {text:?})"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(text, format!("{} 0=1024M\n", pipe.display()));
    let hc = f.inspect(&h.id).host_config.expect("host config");
    assert_eq!(hc.device_requests.unwrap_or_default(), vec![]);
    assert_eq!(hc.runtime.as_deref(), Some("runc"));
}

#[test]
fn a_real_gpu_reaches_docker_as_a_device_request_when_there_is_no_nvidia_runtime() {
    let mut f = Fixture::new("gpu");
    // Decide from `docker info`: this engine has no `nvidia` runtime.
    let mut cfg = f.rt.config().clone();
    cfg.gpu_wiring = None;
    f.rt = DockerRuntime::connect(cfg, f.tokio.handle().clone()).expect("connect");
    assert_eq!(f.rt.gpu_wiring().expect("docker info"), GpuWiring::DeviceRequests);
    let pipe = f.dir.join("mps-pipe");
    std::fs::create_dir_all(&pipe).expect("pipe dir");
    let l = mps_launch(&pipe);
    // Docker accepts the request at create and needs a GPU driver for it at start; this
    // machine's engine has none, so the start fails, naming the request.
    let (code, reason) = f.rt.launch(&l).expect_err("no GPU driver in this engine");
    assert_eq!(code, StopCode::TaskFailedToStart, "{reason}");
    assert!(reason.starts_with("CannotStartContainerError: "), "{reason}");
    assert!(reason.contains("gpu"), "{reason}");
    assert!(f.rt.list_ours().expect("list").is_empty());
}
