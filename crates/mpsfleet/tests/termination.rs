//! Termination that is true and shutdown that is not a failure, with real processes counted
//! through `/proc`: a host the `local` provider terminates leaves nothing running (agent,
//! shims, tasks, MPS daemons) before its `fenced` tasks run elsewhere, and a server stopped
//! with SIGINT stops its controllers first, exits at once and opens no incident about its own
//! absence.

mod common;

use common::*;
use mpsfleet_client::{Client, TaskQuery};
use mpsfleet_proc::Liveness;
use mpsfleet_types::policy::*;
use mpsfleet_types::*;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

const WAIT: Duration = Duration::from_secs(60);
const GRACE_MS: u64 = 3_000;

/// One process as `/proc` showed it: pid and start time name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Proc {
    pid: u32,
    start_time: u64,
}

impl Proc {
    fn alive(&self) -> bool {
        mpsfleet_proc::liveness(self.pid, self.start_time) == Liveness::Alive
    }
}

fn environ(pid: u32) -> BTreeMap<String, String> {
    let raw = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
    raw.split(|b| *b == 0)
        .filter_map(|kv| {
            let kv = String::from_utf8_lossy(kv);
            let (k, v) = kv.split_once('=')?;
            Some((k.to_string(), v.to_string()))
        })
        .collect()
}

fn cmdline(pid: u32) -> String {
    String::from_utf8_lossy(&std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default())
        .replace('\0', " ")
}

/// The live task processes (`sleep 3600`) carrying `MARK=<mark>` (this test's tasks), by task
/// id. Their shims carry the task's environment too, and are left out.
fn task_processes(mark: &str) -> BTreeMap<String, Vec<Proc>> {
    let mut out: BTreeMap<String, Vec<Proc>> = BTreeMap::new();
    for (pid, s) in mpsfleet_proc::processes() {
        if s.is_dead() || !cmdline(pid).starts_with("sleep ") {
            continue;
        }
        let env = environ(pid);
        if env.get("MARK").map(String::as_str) != Some(mark) {
            continue;
        }
        if let Some(task) = env.get("MPSFLEET_TASK_ID") {
            out.entry(task.clone()).or_default().push(Proc { pid, start_time: s.start_time });
        }
    }
    out
}

/// The live processes of the session `sid` (a local host's agent leads one).
fn session(sid: u32) -> Vec<Proc> {
    mpsfleet_proc::processes()
        .into_iter()
        .filter(|(_, s)| s.sid == sid && !s.is_dead())
        .map(|(pid, s)| Proc { pid, start_time: s.start_time })
        .collect()
}

/// The agent a local host's pid file names: `PID START_TIME`.
fn agent_of(host_dir: &Path) -> Proc {
    let text = std::fs::read_to_string(host_dir.join("agent.pid")).expect("agent.pid");
    let mut parts = text.split_whitespace().map(|p| p.parse::<u64>().expect("a number"));
    let (pid, start_time) = (parts.next().unwrap(), parts.next().unwrap());
    Proc { pid: pid as u32, start_time }
}

/// Ends every process of the hosts under `hosts_dir` and everything that names `dir`: hosts
/// outlive the server that launched them.
fn stop_everything(dir: &Path, hosts_dir: &Path) {
    for _ in 0..50 {
        let mut left: BTreeSet<u32> =
            processes_mentioning(&dir.display().to_string()).into_iter().map(|(pid, _)| pid).collect();
        for entry in std::fs::read_dir(hosts_dir).into_iter().flatten().flatten() {
            if entry.path().join("agent.pid").is_file() {
                left.extend(session(agent_of(&entry.path()).pid).iter().map(|p| p.pid));
            }
        }
        if left.is_empty() {
            return;
        }
        for pid in left {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), nix::sys::signal::SIGKILL);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A server whose `local` provider keeps a managed pool `gpu` at its size. Ends every
/// process it started when dropped.
struct Fleet {
    dir: tempfile::TempDir,
    server: Server,
    admin: Client,
    agent_args: String,
}

impl Drop for Fleet {
    fn drop(&mut self) {
        self.server.kill9();
        stop_everything(self.dir.path(), &self.hosts_dir());
    }
}

impl Fleet {
    fn hosts_dir(&self) -> PathBuf {
        self.dir.path().join("server/hosts")
    }

    fn mark(&self) -> String {
        self.dir.path().display().to_string()
    }

    async fn start(hosts: u32, mps: Option<&Path>) -> Fleet {
        let dir = tempfile::tempdir().unwrap();
        let mps_args = match mps {
            Some(p) => format!(
                "--mps-control {} --mps-max-restarts 0 --mps-probe-interval-ms 300 --mps-probe-timeout-ms 200 \
                 --mps-failure-threshold 2",
                p.display()
            ),
            None => "--mps-model".to_string(),
        };
        let agent_args =
            format!("--emulate-gpus H200:143771:2 {mps_args} --heartbeat-ms 200 --stop-tasks-on-exit");
        let server = Server::start_with(
            &dir.path().join("server"),
            "127.0.0.1:0",
            &["--local-agent-args", &agent_args],
        );
        let admin = server.admin();
        let health = HealthPolicy {
            agent_heartbeat_grace_ms: GRACE_MS,
            mps_probe_interval_ms: 1_000,
            mps_probe_timeout_ms: 200,
            mps_failure_threshold: 2,
            local_daemon_restarts: 0,
            toleration_ms: 500,
        };
        admin
            .create_pool(&CreatePool {
                name: "gpu".into(),
                mode: Some(OwnershipMode::Managed),
                health_policy: Some(health),
                provider: Some(Provider::local(hosts)),
                ..Default::default()
            })
            .await
            .unwrap();
        let fleet = Fleet { dir, server, admin, agent_args };
        fleet.healthy_hosts(hosts).await;
        fleet
    }

    async fn healthy_hosts(&self, n: u32) -> Vec<HostView> {
        eventually(WAIT, &format!("{n} ACTIVE, healthy hosts"), || async {
            let hs: Vec<HostView> = self
                .admin
                .list_hosts(None)
                .await
                .ok()?
                .into_iter()
                .filter(|h| h.status == HostStatus::Active)
                .collect();
            (hs.len() == n as usize && hs.iter().all(|h| h.health_status == HealthStatus::Ok)).then_some(hs)
        })
        .await
    }

    /// A service of `count` MPS tasks whose processes carry `MARK=<this test's dir>`.
    async fn service(&self, name: &str, count: u32, resumption: ResumptionBoundary) -> Vec<Task> {
        let def = taskdef(serde_json::json!({
            "family": name,
            "containerDefinitions": [{
                "name": "main",
                "command": ["sleep", "3600"],
                "environment": [{"name": "MARK", "value": self.mark()}],
                "resourceRequirements": [{"type": "GPU", "sharingStrategy": {"nvidiaMps": {"memory": 1024}}}]
            }]
        }));
        self.admin.register_taskdef(def).await.unwrap();
        self.admin
            .create_service(&CreateService {
                name: name.into(),
                pool: "gpu".into(),
                task_definition: name.into(),
                desired_count: count,
                resumption: Some(resumption),
                deployment_configuration: None,
                client_token: None,
                ..Default::default()
            })
            .await
            .unwrap();
        self.running(name, count).await
    }

    async fn running(&self, service: &str, count: u32) -> Vec<Task> {
        let q = TaskQuery { service: Some(service.into()), ..Default::default() };
        eventually(WAIT, &format!("{count} RUNNING tasks of {service}"), || async {
            let ts: Vec<Task> = self
                .admin
                .list_tasks(&q)
                .await
                .ok()?
                .into_iter()
                .filter(|t| t.last_status == TaskStatus::Running && t.desired_status == TaskStatus::Running)
                .collect();
            (ts.len() == count as usize).then_some(ts)
        })
        .await
    }
}

/// Waits for the incident to be resolved; on timeout, fails with the incident as it stands.
async fn resolved(admin: &Client, id: &str, hosts_dir: &Path) -> IncidentView {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let i = admin.describe_incident(id).await.unwrap();
        if i.incident.state == IncidentState::Resolved {
            return i;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "incident {id} not resolved: {}\n{}",
            serde_json::to_string_pretty(&i).unwrap(),
            host_logs(hosts_dir)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The last lines of every local host's agent log, for failure messages.
fn host_logs(hosts_dir: &Path) -> String {
    let mut out = String::new();
    for entry in std::fs::read_dir(hosts_dir).into_iter().flatten().flatten() {
        let log = std::fs::read_to_string(entry.path().join("agent.log")).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        let tail = lines[lines.len().saturating_sub(15)..].join("\n");
        out += &format!("--- {}\n{tail}\n", entry.file_name().to_string_lossy());
    }
    out
}

/// Samples the live task processes of `mark` every 20 ms until stopped; returns the most alive
/// at once, and every moment a task id had two live processes.
struct Sampler {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<(usize, Vec<String>, usize)>,
}

impl Sampler {
    fn start(mark: String) -> Sampler {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let (mut most, mut doubles, mut samples) = (0, Vec::new(), 0);
            while !flag.load(Ordering::SeqCst) {
                let now = task_processes(&mark);
                most = most.max(now.values().map(Vec::len).sum());
                for (task, procs) in &now {
                    if procs.len() > 1 {
                        doubles.push(format!("task {task}: {procs:?}"));
                    }
                }
                samples += 1;
                std::thread::sleep(Duration::from_millis(20));
            }
            (most, doubles, samples)
        });
        Sampler { stop, thread }
    }

    fn finish(self) -> (usize, Vec<String>, usize) {
        self.stop.store(true, Ordering::SeqCst);
        self.thread.join().expect("sampler")
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_agents_host_is_terminated_whole_before_its_fenced_tasks_run_again() {
    let Some(mps) = mps_control() else { return };
    let fleet = Fleet::start(2, Some(&mps)).await;
    let desired = 3;
    let tasks = fleet.service("fenced", desired, ResumptionBoundary::Fenced).await;
    let sampler = Sampler::start(fleet.mark());

    // The host of the first task, and everything it runs, as /proc shows it.
    let host = fleet.admin.describe_host(tasks[0].host_id.as_ref().unwrap().as_str()).await.unwrap();
    let host_dir = fleet.hosts_dir().join(&host.hostname);
    let agent = agent_of(&host_dir);
    let before = session(agent.pid);
    let on_host: Vec<&Task> = tasks.iter().filter(|t| t.host_id.as_ref() == Some(&host.id)).collect();
    let task_procs: Vec<Proc> = task_processes(&fleet.mark())
        .into_iter()
        .filter(|(id, _)| on_host.iter().any(|t| t.id.to_string() == *id))
        .flat_map(|(_, p)| p)
        .collect();
    assert_eq!(task_procs.len(), on_host.len(), "one process per task of the host");
    assert!(task_procs.iter().all(|p| before.contains(p)), "the host's tasks are in its session");
    let daemons = before.iter().filter(|p| cmdline(p.pid).contains("nvidia-cuda-mps-control")).count();
    assert!(daemons >= 1, "the host runs an MPS daemon: {:?}", before);
    let shims = before.iter().filter(|p| cmdline(p.pid).contains(" shim ")).count();
    assert!(shims >= on_host.len(), "a shim per task: {:?}", before);

    // The agent dies; its shims, tasks and daemons live on, as they do across agent restarts.
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(agent.pid as i32), nix::sys::signal::SIGKILL).unwrap();
    let incident = eventually(WAIT, "an incident for the killed agent's host", || async {
        fleet.admin.list_incidents().await.ok()?.into_iter().find(|i| i.incident.host_id == host.id)
    })
    .await;
    let id = incident.incident.id.clone();
    let done = resolved(&fleet.admin, &id, &fleet.hosts_dir()).await;
    assert!(done.incident.has(Step::OldHostTerminated), "{:?}", done.incident.timeline);
    println!("{} processes of the host before its agent was killed: {before:?}", before.len());
    let now = fleet.running("fenced", desired).await;
    assert!(now.iter().all(|t| t.host_id.as_ref() != Some(&host.id)), "a replica still runs on the old host");
    // Let the sampler see the replicas' processes start.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (most, doubles, samples) = sampler.finish();
    println!("{samples} samples; at most {most} live processes of {desired} fenced replicas");

    assert!(doubles.is_empty(), "two live processes of one fenced task: {doubles:?}");
    assert!(
        most <= desired as usize,
        "{most} live processes of {desired} fenced replicas at once: an old copy ran beside its replacement"
    );
    let left: Vec<&Proc> = before.iter().filter(|p| p.alive()).collect();
    assert!(left.is_empty(), "processes of the terminated host still run: {left:?}");
    assert!(session(agent.pid).is_empty(), "the terminated host's session has live processes");
    assert!(
        processes_mentioning(&host_dir.display().to_string()).is_empty(),
        "processes naming the terminated host's data dir still run"
    );
    let live = task_processes(&fleet.mark());
    assert_eq!(live.values().map(Vec::len).sum::<usize>(), desired as usize, "{live:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_stopped_with_sigint_exits_at_once_and_opens_no_incident() {
    let mut fleet = Fleet::start(2, None).await;
    let hosts = fleet.healthy_hosts(2).await;
    let agents: Vec<Proc> = hosts.iter().map(|h| agent_of(&fleet.hosts_dir().join(&h.hostname))).collect();

    let asked = Instant::now();
    let pid = nix::unistd::Pid::from_raw(fleet.server.child.id() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::SIGINT).unwrap();
    let status = loop {
        if let Some(status) = fleet.server.child.try_wait().unwrap() {
            break status;
        }
        assert!(asked.elapsed() < Duration::from_secs(10), "the server still runs 10 s after SIGINT");
        std::thread::sleep(Duration::from_millis(20));
    };
    let took = asked.elapsed();
    println!("the server exited {took:?} after SIGINT: {status}");
    assert!(status.success(), "the server did not stop cleanly: {status}");
    assert!(took < Duration::from_secs(5), "the server took {took:?} to exit after SIGINT");

    // Local hosts are machines: they outlive the server, and wait for it longer than the
    // heartbeat grace.
    tokio::time::sleep(Duration::from_millis(GRACE_MS + 1_000)).await;
    assert!(agents.iter().all(Proc::alive), "a host's agent stopped with the server");

    // Restarted at the address its agents know, the server gives them their grace again: the
    // agents, held still, heartbeat only 2 s after the restart, when their last heartbeat is
    // far older than the grace.
    let signal_agents = |sig| {
        for a in &agents {
            nix::sys::signal::kill(nix::unistd::Pid::from_raw(a.pid as i32), sig).unwrap();
        }
    };
    signal_agents(nix::sys::signal::SIGSTOP);
    let listen = fleet.server.addr();
    let data = fleet.server.data_dir.clone();
    let args = fleet.agent_args.clone();
    fleet.server = Server::start_with(&data, &listen, &["--local-agent-args", &args]);
    fleet.admin = fleet.server.admin();
    tokio::time::sleep(Duration::from_millis(GRACE_MS - 1_000)).await;
    signal_agents(nix::sys::signal::SIGCONT);
    tokio::time::sleep(Duration::from_millis(2 * GRACE_MS)).await;
    let incidents = fleet.admin.list_incidents().await.unwrap();
    assert!(incidents.is_empty(), "the server's absence opened incidents: {incidents:?}");
    let after = fleet.healthy_hosts(2).await;
    let ids = |hs: &[HostView]| hs.iter().map(|h| h.id.clone()).collect::<BTreeSet<_>>();
    assert_eq!(ids(&after), ids(&hosts), "the same hosts, none replaced");
    assert!(agents.iter().all(Proc::alive), "the same agents");
}

/// `mpsfleet up` run in `dir` until its banner; the process and its URL.
fn up(dir: &Path, config: &Path, mps: &Path) -> (std::process::Child, String) {
    use std::io::{BufRead, BufReader};
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_mpsfleet"))
        .args(["up", "--hosts", "2", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(dir)
        .arg("--mps-control")
        .arg(mps)
        .env("XDG_CONFIG_HOME", config)
        .env("MPSFLEET_LOG", "warn")
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("start mpsfleet up");
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if let Some(rest) = line.strip_prefix("mpsfleet up: server ") {
                let _ = tx.send(rest.split(',').next().unwrap_or_default().to_string());
            }
        }
    });
    let url = rx.recv_timeout(Duration::from_secs(30)).expect("up printed no banner within 30 s");
    (child, url)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ctrl_c_stops_every_host_up_started_in_its_data_dir_earlier_runs_too() {
    let Some(mps) = mps_control() else { return };
    let root = tempfile::tempdir().unwrap();
    let (dir, config) = (root.path().join("data"), root.path().join("config"));
    let hosts_dir = dir.join("hosts");
    let _cleanup = Cleanup(root.path().to_path_buf(), hosts_dir.clone());

    // A first run, killed: its hosts keep running, as machines do.
    let (mut first, url) = up(&dir, &config, &mps);
    let token = std::fs::read_to_string(dir.join("admin.token")).unwrap().trim().to_string();
    let trust = mpsfleet_client::tls::Trust::Ca(std::fs::read(dir.join("ca.pem")).unwrap());
    let admin = Client::with_trust(&url, Some(token.clone()), &trust).unwrap();
    eventually(WAIT, "two hosts of the first run", || async {
        let hs = admin.list_hosts(None).await.ok()?;
        (hs.iter().filter(|h| h.status == HostStatus::Active).count() == 2).then_some(())
    })
    .await;
    first.kill().unwrap();
    first.wait().unwrap();
    let earlier: Vec<Proc> = std::fs::read_dir(&hosts_dir)
        .unwrap()
        .flatten()
        .filter(|e| e.path().join("agent.pid").is_file())
        .flat_map(|e| session(agent_of(&e.path()).pid))
        .collect();
    assert!(earlier.len() >= 4, "two agents and their MPS daemons: {earlier:?}");

    // A second run; Ctrl-C stops its hosts and the first run's.
    let (mut second, url) = up(&dir, &config, &mps);
    let admin = Client::with_trust(&url, Some(token), &trust).unwrap();
    admin.list_hosts(None).await.expect("the second run answers");
    let asked = Instant::now();
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(second.id() as i32), nix::sys::signal::SIGINT).unwrap();
    let status = loop {
        if let Some(status) = second.try_wait().unwrap() {
            break status;
        }
        assert!(asked.elapsed() < Duration::from_secs(60), "up still runs 60 s after Ctrl-C");
        std::thread::sleep(Duration::from_millis(50));
    };
    println!("up stopped {:?} after Ctrl-C: {status}", asked.elapsed());
    assert!(status.success(), "{status}");
    let left: Vec<&Proc> = earlier.iter().filter(|p| p.alive()).collect();
    assert!(left.is_empty(), "processes of the first run's hosts still run: {left:?}");
    let named = processes_mentioning(&dir.display().to_string());
    assert!(named.is_empty(), "processes of up's data dir still run: {named:?}");
}

/// Ends whatever a test left running under its directory, even when it fails.
struct Cleanup(PathBuf, PathBuf);

impl Drop for Cleanup {
    fn drop(&mut self) {
        stop_everything(&self.0, &self.1);
    }
}
