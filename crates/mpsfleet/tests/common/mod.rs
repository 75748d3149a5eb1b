//! Shared helpers of the process tests: start the real `mpsfleet server` binary on
//! 127.0.0.1:0 with a temporary data directory, and talk to it over HTTP.

#![allow(dead_code)]

use mpsfleet_client::Client;
use mpsfleet_types::api::{HostStatusReport, RegisterHostResponse};
use mpsfleet_types::logs::{LogStreams, TaskLogs};
use mpsfleet_types::*;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

pub mod dns;
pub mod up;

pub const H200_MIB: u64 = mpsfleet_types::H200_MEMORY_MIB;

/// A TCP port free now on every address (the kernel's pick), for a process the test starts.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("0.0.0.0:0").expect("bind").local_addr().expect("addr").port()
}

/// The pid of the MPS daemon an agent started for GPU `index` (from its daemon record).
pub fn daemon_pid(agent_dir: &Path, index: u32) -> u32 {
    let path = agent_dir.canonicalize().unwrap().join(format!("mps/log/{index}/daemon.json"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    u32::try_from(v["pid"].as_u64().expect("pid in daemon.json")).unwrap()
}

/// A running server process. Killed (SIGKILL) when dropped.
pub struct Server {
    pub child: Child,
    pub url: String,
    pub data_dir: PathBuf,
}

impl Server {
    /// Starts the binary on a free port and waits until it listens.
    pub fn start(data_dir: &Path) -> Server {
        Server::start_on(data_dir, "127.0.0.1:0")
    }

    /// Starts the binary on `listen` (to restart a server at the address its agents know).
    pub fn start_on(data_dir: &Path, listen: &str) -> Server {
        Server::start_with(data_dir, listen, &[])
    }

    /// Starts the binary with extra `server` arguments.
    pub fn start_with(data_dir: &Path, listen: &str, extra: &[&str]) -> Server {
        let (child, lines) = Server::spawn(data_dir, listen, extra);
        let url = loop {
            // A few lines (the first start's tokens) come before the address.
            let line = lines
                .recv_timeout(Duration::from_secs(30))
                .expect("server did not start listening within 30 s");
            if let Some(url) = line.strip_prefix("mpsfleet server listening on ") {
                break url.to_string();
            }
        };
        Server { child, url, data_dir: data_dir.to_path_buf() }
    }

    /// Starts the binary without waiting for it; the receiver gets each line it prints (a
    /// server on etcd that follows prints no address until it is elected).
    pub fn spawn(
        data_dir: &Path,
        listen: &str,
        extra: &[&str],
    ) -> (Child, std::sync::mpsc::Receiver<String>) {
        let mut child = Command::new(env!("CARGO_BIN_EXE_mpsfleet"))
            .args(["server", "--listen", listen, "--data-dir"])
            .arg(data_dir)
            .args(extra)
            .env("MPSFLEET_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start mpsfleet server");
        let stdout = child.stdout.take().expect("server stdout");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        (child, rx)
    }

    pub fn admin_token(&self) -> String {
        std::fs::read_to_string(self.data_dir.join("admin.token")).expect("admin.token").trim().to_string()
    }

    pub fn join_token(&self) -> String {
        std::fs::read_to_string(self.data_dir.join("join.token")).expect("join.token").trim().to_string()
    }

    pub fn admin(&self) -> Client {
        self.client(Some(self.admin_token()))
    }

    pub fn anonymous(&self) -> Client {
        self.client(None)
    }

    /// The cluster CA the server wrote to its data dir (`ca.pem`); plain HTTP for a server
    /// started with `--insecure-http`.
    pub fn trust(&self) -> mpsfleet_client::tls::Trust {
        if self.url.starts_with("http://") {
            return mpsfleet_client::tls::Trust::PlainHttp;
        }
        mpsfleet_client::tls::Trust::Ca(std::fs::read(self.data_dir.join("ca.pem")).expect("ca.pem"))
    }

    /// The address it listens on (`127.0.0.1:PORT`), to start it again there.
    pub fn addr(&self) -> String {
        self.url.trim_start_matches("https://").trim_start_matches("http://").to_string()
    }

    /// The cluster CA's file, for the CLI's `--ca-file`.
    pub fn ca_file(&self) -> String {
        self.data_dir.join("ca.pem").display().to_string()
    }

    /// A client with `token` that trusts the server's cluster CA.
    pub fn client(&self, token: Option<String>) -> Client {
        Client::with_trust(&self.url, token, &self.trust()).expect("client")
    }

    /// A plain reqwest client that trusts the server's cluster CA (and nothing else).
    pub fn http(&self) -> reqwest::Client {
        let mut builder = reqwest::Client::builder().use_rustls_tls().tls_built_in_root_certs(false);
        if let mpsfleet_client::tls::Trust::Ca(pem) = self.trust() {
            builder = builder.add_root_certificate(reqwest::Certificate::from_pem(&pem).expect("the CA"));
        }
        builder.timeout(Duration::from_secs(30)).build().expect("http client")
    }

    /// SIGKILL, and wait for the process to be gone.
    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// An MPS task definition of `memory` MiB per task.
pub fn mps_taskdef(family: &str, memory: u64) -> Vec<u8> {
    serde_json::json!({
        "family": family,
        "containerDefinitions": [{
            "name": "main",
            "command": ["sleep", "3600"],
            "resourceRequirements": [{"type": "GPU", "sharingStrategy": {"nvidiaMps": {"memory": memory, "maxComputePercent": 50}}}]
        }]
    })
    .to_string()
    .into_bytes()
}

/// A registration of host `hostname` in `pool` with `gpus` emulated H200s, whose UUIDs are
/// `GPU-<uuid_key>-<i>` (a key apart from the hostname, which a test may make unprintable).
pub fn registration(pool: &str, hostname: &str, uuid_key: &str, gpus: u32) -> HostRegistration {
    HostRegistration {
        pool: PoolName::new(pool).unwrap(),
        hostname: hostname.to_string(),
        gpus: (0..gpus)
            .map(|i| GpuInventory {
                uuid: GpuUuid::new(format!("GPU-{uuid_key}-{i}")).unwrap(),
                index: i,
                model: "NVIDIA H200".into(),
                memory_mib: H200_MIB,
                compute_capability: "9.0".into(),
                max_mps_clients: 48,
            })
            .collect(),
        mps_available: true,
        emulated: true,
        runtime: Default::default(),
        runtime_version: None,
        plugins: Default::default(),
        platform: Default::default(),
    }
}

/// Registers a host with `gpus` H200s through the agent API and makes it ACTIVE; returns
/// its id and a client holding its credential.
pub async fn add_host(server: &Server, pool: &str, name: &str, gpus: u32) -> (HostId, Client) {
    let joiner = server.client(Some(server.join_token()));
    let reg = registration(pool, name, name, gpus);
    let RegisterHostResponse { host_id, credential, .. } =
        joiner.register_host(&reg).await.expect("register host");
    let agent = joiner.with_token(credential);
    agent
        .report_host_status(&HostStatusReport { onboarded: true, ..Default::default() })
        .await
        .expect("onboard");
    (host_id, agent)
}

pub async fn create_pool(admin: &Client, name: &str) {
    admin
        .create_pool(&CreatePool {
            name: name.into(),
            mode: None,
            strategy: None,
            compute_overcommit_percent: None,
            ..Default::default()
        })
        .await
        .expect("create pool");
}

/// Whether the `CI` variable asks for every test to run: set, and neither empty, `0` nor
/// `false`.
pub fn on_ci() -> bool {
    std::env::var_os("CI").is_some_and(|v| !v.is_empty() && v != "0" && !v.eq_ignore_ascii_case("false"))
}

/// The real `nvidia-cuda-mps-control`: `MPSFLEET_MPS_CONTROL`, PATH, or the copy
/// `scripts/install-mps.sh` keeps in `target/mps`. None (and a printed reason) when absent;
/// on CI ([`on_ci`]) a missing binary panics instead, so that its tests fail rather than skip.
pub fn mps_control() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("MPSFLEET_MPS_CONTROL") {
        return Some(PathBuf::from(p));
    }
    let on_path = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths).map(|d| d.join("nvidia-cuda-mps-control")).find(|p| p.is_file())
    });
    let local =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/mps/usr/bin/nvidia-cuda-mps-control");
    let found = on_path.or_else(|| local.is_file().then_some(local));
    if found.is_none() {
        assert!(
            !on_ci(),
            "nvidia-cuda-mps-control not found and CI is set, so this test must not skip: \
             run scripts/install-mps.sh or set MPSFLEET_MPS_CONTROL"
        );
        println!("skipped: nvidia-cuda-mps-control not found; run scripts/install-mps.sh");
    }
    found
}

/// The AWS CLI, boto3 and moto's ECS tests from PyPI that `scripts/ecs-env.sh` puts in
/// `target/ecs-env` (or `MPSFLEET_ECS_ENV`). None (and a printed reason) when absent; on CI a
/// missing one panics instead.
pub fn ecs_env() -> Option<PathBuf> {
    let dir = std::env::var_os("MPSFLEET_ECS_ENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/ecs-env"));
    let found = dir.join("sdk/bin/python").is_file() && dir.join("cli/bin/aws").is_file();
    if !found {
        assert!(!on_ci(), "{} has no AWS CLI and boto3 and CI is set: run scripts/ecs-env.sh", dir.display());
        println!("skipped: no AWS CLI and boto3 in {}; run scripts/ecs-env.sh", dir.display());
    }
    found.then_some(dir)
}

/// An ECS call (`POST /`, AWS JSON 1.1) to `url`, SigV4-signed with the access key `key` and
/// its secret (mpsfleet's own signer): the answer's status and JSON.
#[allow(clippy::disallowed_methods)] // a signature carries the wall-clock time
pub async fn ecs_call(
    http: &reqwest::Client,
    url: &str,
    key: (&str, &str),
    operation: &str,
    body: serde_json::Value,
) -> (u16, serde_json::Value) {
    let host = url.trim_start_matches("https://").trim_start_matches("http://").trim_end_matches('/');
    let body = body.to_string();
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as u64;
    let target = format!("AmazonEC2ContainerServiceV20141113.{operation}");
    let (date, auth) =
        mpsfleet_core::sigv4::sign_json_call(host, &target, body.as_bytes(), key, "us-east-1", "ecs", now);
    let resp = http
        .post(format!("{}/", url.trim_end_matches('/')))
        .header("content-type", "application/x-amz-json-1.1")
        .header("x-amz-date", &date)
        .header("x-amz-target", &target)
        .header("authorization", auth)
        .body(body)
        .send()
        .await
        .expect("send an ECS call");
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(serde_json::Value::Null))
}

/// A running `mpsfleet agent` process. Killed (SIGKILL) when dropped.
pub struct Agent {
    pub child: Child,
    pub data_dir: PathBuf,
}

impl Agent {
    /// Starts an agent with `gpus` emulated H200s and the real MPS daemon at `mps`.
    pub fn start(server: &Server, data_dir: &Path, gpus: u32, mps: &Path, extra: &[&str]) -> Agent {
        let mut args = vec![std::ffi::OsString::from("--mps-control"), mps.into()];
        args.extend(extra.iter().map(Into::into));
        Agent::spawn(server, data_dir, gpus, &args)
    }

    /// Starts an agent with `gpus` emulated H200s and the in-process MPS model.
    pub fn start_with_model(server: &Server, data_dir: &Path, gpus: u32) -> Agent {
        Agent::spawn(server, data_dir, gpus, &["--mps-model".into()])
    }

    fn spawn(server: &Server, data_dir: &Path, gpus: u32, mps_args: &[std::ffi::OsString]) -> Agent {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_mpsfleet"));
        cmd.arg("agent")
            .args(["--server", &server.url, "--join-token", &server.join_token(), "--pool", "gpu"])
            .arg("--data-dir")
            .arg(data_dir)
            .args([
                "--emulate-gpus",
                &format!("H200:{H200_MIB}:{gpus}"),
                "--heartbeat-ms",
                "200",
                "--stop-tasks-on-exit",
            ])
            .args(mps_args);
        Agent::spawn_logged(cmd, data_dir)
    }

    /// Runs `cmd` (an `mpsfleet agent` command line) at log level info, its output going to
    /// `DATA_DIR.log` ([`Agent::log`]).
    fn spawn_logged(mut cmd: Command, data_dir: &Path) -> Agent {
        let log = std::fs::File::create(data_dir.with_extension("log")).expect("agent log");
        let child = cmd
            .env("MPSFLEET_LOG", "info")
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("start mpsfleet agent");
        Agent { child, data_dir: data_dir.to_path_buf() }
    }

    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGTERM and wait (bounded).
    pub fn terminate(&mut self) {
        if let Ok(Some(_)) = self.child.try_wait() {
            return;
        }
        let _ = Command::new("kill").arg(self.child.id().to_string()).status();
        for _ in 0..600 {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        self.kill9();
    }

    /// The agent's log, for failure messages.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.data_dir.with_extension("log")).unwrap_or_default()
    }
}

impl Drop for Agent {
    /// A clean stop, so the agent quits its MPS daemons (a test that wants kill -9 calls it).
    fn drop(&mut self) {
        self.terminate();
    }
}

/// Polls `f` every 100 ms until it returns Some, or panics with `what` after `limit`.
pub async fn eventually<T, F, Fut>(limit: Duration, what: &str, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(tokio::time::Instant::now() < deadline, "timed out after {limit:?} waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A task definition from a JSON value.
pub fn taskdef(value: serde_json::Value) -> Vec<u8> {
    value.to_string().into_bytes()
}

/// Processes whose command line or environment mention `needle` (e.g. a test's temp dir).
pub fn processes_mentioning(needle: &str) -> Vec<(u32, String)> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir("/proc") else { return out };
    for e in entries.flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else { continue };
        if pid == std::process::id() {
            continue;
        }
        let stat = std::fs::read_to_string(e.path().join("stat")).unwrap_or_default();
        if stat.rsplit(')').next().is_some_and(|rest| rest.trim_start().starts_with('Z')) {
            continue; // a zombie holds nothing
        }
        let cmd = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
        let env = std::fs::read(e.path().join("environ")).unwrap_or_default();
        let text = String::from_utf8_lossy(&cmd).replace('\0', " ");
        if text.contains(needle) || String::from_utf8_lossy(&env).contains(needle) {
            out.push((pid, text));
        }
    }
    out
}

/// Stops (SIGTERM, then SIGKILL after 20 s) every process that mentions `needle`: hosts a
/// server's local provider started outlive the server by design.
pub fn stop_processes_mentioning(needle: &str) {
    let signal_all = |sig: &str| {
        for (pid, _) in processes_mentioning(needle) {
            let _ = Command::new("kill").args([sig, &pid.to_string()]).stderr(Stdio::null()).status();
        }
    };
    signal_all("-TERM");
    for _ in 0..200 {
        if processes_mentioning(needle).is_empty() {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    signal_all("-KILL");
}

/// The private Docker Engine and registry of `scripts/docker-env.sh`.
#[derive(Debug, Clone)]
pub struct DockerEnv {
    /// The engine's Unix socket (from `DOCKER_HOST=unix://PATH`).
    pub socket: PathBuf,
    /// The busybox test image in the private registry (`MPSFLEET_TEST_IMAGE`).
    pub image: String,
    /// The private registry, `HOST:PORT` (`MPSFLEET_TEST_REGISTRY`).
    pub registry: String,
}

const DOCKER_ENV_HINT: &str =
    "run `bash scripts/docker-env.sh start` and `eval \"$(bash scripts/docker-env.sh env)\"` first";

/// The private Docker Engine from the environment; panics (never skips) when it is not set.
pub fn docker_env() -> DockerEnv {
    let var = |name: &str| {
        std::env::var(name)
            .ok()
            .filter(|v| !v.is_empty())
            .unwrap_or_else(|| panic!("{name} is not set: {DOCKER_ENV_HINT}"))
    };
    let host = var("DOCKER_HOST");
    let socket = host
        .strip_prefix("unix://")
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| panic!("DOCKER_HOST={host} is not unix://PATH: {DOCKER_ENV_HINT}"));
    assert!(socket.exists(), "{} does not exist: {DOCKER_ENV_HINT}", socket.display());
    DockerEnv { socket, image: var("MPSFLEET_TEST_IMAGE"), registry: var("MPSFLEET_TEST_REGISTRY") }
}

impl DockerEnv {
    /// Runs Debian's docker CLI against this engine (for checks and clean-up in tests only).
    pub fn cli(&self, args: &[&str]) -> std::process::Output {
        Command::new("/usr/bin/docker")
            .arg("-H")
            .arg(format!("unix://{}", self.socket.display()))
            .args(args)
            .stdin(Stdio::null())
            .output()
            .expect("run /usr/bin/docker")
    }

    /// The CLI's stdout, trimmed; panics with its stderr when it fails.
    pub fn cli_ok(&self, args: &[&str]) -> String {
        let out = self.cli(args);
        assert!(out.status.success(), "docker {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    /// `docker inspect --format FORMAT ID`, or None when the container is not there.
    pub fn inspect(&self, id: &str, format: &str) -> Option<String> {
        let out = self.cli(&["inspect", "--type", "container", "--format", format, id]);
        out.status.success().then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
    }

    /// Ids of all containers (running or not) with label `key=value`.
    pub fn containers_labelled(&self, key: &str, value: &str) -> Vec<String> {
        let filter = format!("label={key}={value}");
        self.cli_ok(&["ps", "-aq", "--no-trunc", "--filter", &filter])
            .lines()
            .map(str::to_string)
            .filter(|l| !l.is_empty())
            .collect()
    }

    /// Removes (forcibly) every container of host `host_id`.
    pub fn remove_containers_of_host(&self, host_id: &str) {
        let ids = self.containers_labelled("io.mpsfleet.host", host_id);
        if !ids.is_empty() {
            let mut args = vec!["rm", "-f"];
            args.extend(ids.iter().map(String::as_str));
            let _ = self.cli(&args);
        }
    }
}

impl Agent {
    /// Starts an agent that runs tasks on Docker Engine (`--runtime docker --docker-socket`),
    /// in `pool`, registered as `hostname`, with one emulated H200 and `extra` arguments.
    /// Without `--mps-control` in `extra` it uses the in-process MPS model.
    pub fn start_docker(
        server: &Server,
        data_dir: &Path,
        pool: &str,
        hostname: &str,
        docker: &DockerEnv,
        extra: &[&str],
    ) -> Agent {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_mpsfleet"));
        cmd.arg("agent")
            .args(["--server", &server.url, "--join-token", &server.join_token(), "--pool", pool])
            .args(["--hostname", hostname])
            .arg("--data-dir")
            .arg(data_dir)
            .args(["--heartbeat-ms", "200", "--stop-tasks-on-exit", "--runtime", "docker", "--docker-socket"])
            .arg(&docker.socket);
        if !extra.contains(&"--emulate-gpus") {
            cmd.args(["--emulate-gpus", &format!("H200:{H200_MIB}:1")]);
        }
        if !extra.iter().any(|a| *a == "--mps-control" || *a == "--mps-model") {
            cmd.arg("--mps-model");
        }
        cmd.args(extra);
        Agent::spawn_logged(cmd, data_dir)
    }
}

/// Asks the MPS daemon that answers in pipe directory `pipe` (with the real control binary
/// `mps`) for its default active thread percentage, and checks it answers 100.0.
pub fn assert_mps_daemon_answers(mps: &Path, pipe: &str) {
    use std::io::Write;
    let mut ask = Command::new(mps)
        .env("CUDA_MPS_PIPE_DIRECTORY", pipe)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("start {}: {e}", mps.display()));
    ask.stdin.take().expect("stdin").write_all(b"get_default_active_thread_percentage\n").expect("ask");
    let answer = ask.wait_with_output().expect("the answer");
    assert!(answer.status.success(), "no daemon answered on {pipe}");
    assert_eq!(String::from_utf8_lossy(&answer.stdout).trim(), "100.0");
}

/// Polls `task logs` of task `id` for `streams` (tail 4096 bytes) until its output contains
/// `needle`, or panics with `what` after `limit`.
pub async fn logs_containing(
    admin: &Client,
    id: &str,
    streams: LogStreams,
    needle: &str,
    limit: Duration,
    what: &str,
) -> TaskLogs {
    eventually(limit, what, || async {
        admin.task_logs(id, None, streams, 4096, None).await.ok().filter(|l| l.output().contains(needle))
    })
    .await
}

/// Writes a server configuration file (0600) with one exec provider `name` running these
/// commands, and returns its path for `--config`.
pub fn exec_provider_config(
    dir: &Path,
    name: &str,
    launch: &str,
    terminate: &str,
    describe: &str,
) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join("server-config.json");
    let config = serde_json::json!({"providers": {name: {
        "launch": [launch], "terminate": [terminate], "describe": [describe]}}});
    std::fs::write(&path, config.to_string()).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    path
}

/// A directory in `dir` that every task may write in and reach (sticky, as `/tmp`): an agent
/// running as root runs process tasks as unprivileged uids of their own, so a test that reads
/// what a task writes, or shows a task a file, uses this one.
pub fn task_writable_dir(dir: &Path) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(dir).expect("the test's directory").permissions().mode();
    if mode & 0o001 == 0 {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode | 0o711)).unwrap();
    }
    let shared = dir.join("shared");
    std::fs::create_dir_all(&shared).unwrap();
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o1777)).unwrap();
    shared
}

/// The most one container test may take: past it, it fails saying so rather than hanging.
pub const TEST_LIMIT: Duration = Duration::from_secs(300);

/// Runs `body`, failing the test if it takes more than [`TEST_LIMIT`].
pub async fn within(body: impl std::future::Future<Output = ()>) {
    if tokio::time::timeout(TEST_LIMIT, body).await.is_err() {
        panic!("the test did not finish within {TEST_LIMIT:?}");
    }
}

/// Waits up to `limit` for task `id` to be in `status` with `also` true of it, and fails at
/// once (with `logs()`) if it stops while something else was awaited.
pub async fn task_reaching(
    admin: &Client,
    id: &TaskId,
    status: TaskStatus,
    limit: Duration,
    also: impl Fn(&Task) -> bool,
    logs: impl Fn() -> String,
) -> Task {
    let what = format!("task {id} to be {}", status.as_str());
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        if let Ok(t) = admin.describe_task(&id.to_string()).await {
            if t.last_status == status && also(&t) {
                return t;
            }
            assert!(
                !(t.last_status == TaskStatus::Stopped && status != TaskStatus::Stopped),
                "waiting for {what}, it stopped: {t:?}\n{}",
                logs()
            );
        }
        assert!(tokio::time::Instant::now() < deadline, "timed out waiting for {what}\n{}", logs());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
