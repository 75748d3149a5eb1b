//! `mpsfleet bench failover`: three servers on one etcd cluster, a real agent running a
//! service, emulated hosts for state, and clients submitting with client tokens; each trial
//! SIGKILLs the leader and times how long until a write is acknowledged again.

use super::{emulated_host, epoch_ms, healthy_report};
use anyhow::{Context, Result};
use clap::Args;
use mpsfleet_client::Client;
use mpsfleet_types::*;
use std::collections::{BTreeMap, HashMap};
use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;

#[derive(Args)]
pub struct FailoverBench {
    /// Times the leader is SIGKILLed and the next one's first answer timed.
    #[arg(long, default_value_t = 20)]
    trials: u32,
    /// The etcd cluster (three members for the figures in docs/benchmarks.md).
    #[arg(long, env = "MPSFLEET_ETCD_ENDPOINTS", value_name = "URL[,URL...]")]
    etcd_endpoints: String,
    /// Emulated hosts registered for the state's size (they report once; no heartbeats).
    #[arg(long, default_value_t = 1_000)]
    hosts: u32,
    /// Clients submitting one task at a time, each request with a client token of its own.
    #[arg(long, default_value_t = 4)]
    clients: u32,
    /// The servers' --leader-ttl, in seconds.
    #[arg(long, default_value_t = 2)]
    leader_ttl: u64,
    /// Tasks of the service the real agent runs.
    #[arg(long, default_value_t = 4)]
    service_tasks: u32,
}

/// One of the three servers.
struct Member {
    dir: PathBuf,
    port: u16,
    child: Option<Child>,
}

impl Member {
    fn url(&self) -> String {
        format!("https://127.0.0.1:{}", self.port)
    }

    fn start(
        &mut self,
        endpoints: &str,
        prefix: &str,
        ttl: u64,
    ) -> Result<std::sync::mpsc::Receiver<String>> {
        let mut child = Command::new(std::env::current_exe()?)
            .args(["server", "--store", "etcd", "--etcd-endpoints", endpoints, "--etcd-prefix", prefix])
            .args(["--leader-ttl", &ttl.to_string(), "--listen", &format!("127.0.0.1:{}", self.port)])
            .arg("--data-dir")
            .arg(&self.dir)
            .env("MPSFLEET_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(
                std::fs::OpenOptions::new().create(true).append(true).open(self.dir.with_extension("log"))?,
            )
            .spawn()?;
        let out = child.stdout.take().context("server stdout")?;
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(out).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        self.child = Some(child);
        Ok(rx)
    }

    fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn wait_line(rx: &std::sync::mpsc::Receiver<String>, prefix: &str) -> Result<String> {
    loop {
        let line =
            rx.recv_timeout(Duration::from_secs(60)).with_context(|| format!("no {prefix:?} within 60 s"))?;
        if line.starts_with(prefix) {
            return Ok(line);
        }
    }
}

/// What a server prints, line by line.
type Output = std::sync::mpsc::Receiver<String>;

/// `n` servers on one etcd prefix of this run's, in a temporary directory: the first is
/// elected, the others share its `server.key` and follow. The receivers get each one's output.
fn start_servers(
    name: &str,
    n: usize,
    endpoints: &str,
    ttl: u64,
) -> Result<(PathBuf, String, Vec<Member>, Vec<Output>)> {
    let root = std::env::temp_dir().join(format!("mpsf-bench-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir_all(&root)?;
    let prefix = format!("/mpsfleet-bench/{name}-{}-{}", std::process::id(), epoch_ms());
    let mut members: Vec<Member> = (1..=n)
        .map(|i| {
            let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
            Ok(Member { dir: root.join(format!("s{i}")), port, child: None })
        })
        .collect::<Result<_>>()?;
    let mut outputs = vec![members[0].start(endpoints, &prefix, ttl)?];
    wait_line(&outputs[0], "mpsfleet server listening on ")?;
    for m in &mut members[1..] {
        std::fs::create_dir_all(&m.dir)?;
        std::fs::copy(root.join("s1/server.key"), m.dir.join("server.key"))?;
        let rx = m.start(endpoints, &prefix, ttl)?;
        wait_line(&rx, "following: ")?;
        outputs.push(rx);
    }
    Ok((root, prefix, members, outputs))
}

/// Stops the servers; removes their directory unless the run failed.
fn stop_servers(root: &Path, members: &mut [Member], result: &Result<()>) {
    for m in members {
        m.kill9();
    }
    if result.is_ok() {
        let _ = std::fs::remove_dir_all(root);
    } else {
        eprintln!("kept {} for inspection", root.display());
    }
}

/// The admin and join clients of the servers (every address), and the join token.
fn cluster_clients(root: &Path, members: &[Member]) -> Result<(Client, Client, String)> {
    let all = members.iter().map(Member::url).collect::<Vec<_>>().join(",");
    let dir = root.join("s1");
    let trust = mpsfleet_client::tls::Trust::Ca(std::fs::read(dir.join(mpsfleet_server::CA_FILE))?);
    let read = |f: &str| std::fs::read_to_string(dir.join(f)).map(|t| t.trim().to_string());
    let admin = Client::with_trust(&all, Some(read(mpsfleet_server::ADMIN_TOKEN_FILE)?), &trust)?;
    let join = read(mpsfleet_server::JOIN_TOKEN_FILE)?;
    let joiner = Client::with_trust(&all, Some(join.clone()), &trust)?;
    Ok((admin, joiner, join))
}

pub fn failover(b: FailoverBench) -> Result<()> {
    anyhow::ensure!(b.trials >= 1 && b.clients >= 1, "--trials and --clients must be at least 1");
    let (root, prefix, mut members, _outputs) =
        start_servers("failover", 3, &b.etcd_endpoints, b.leader_ttl)?;
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let result = rt.block_on(run(&b, &mut members, &root, &prefix));
    stop_servers(&root, &mut members, &result);
    result
}

/// The pool `bench` with `hosts` emulated hosts of 8 GPUs, each registered and reported once
/// (a long grace: they send nothing after it), and the task definition `bench` (one MPS client
/// of 1 GiB).
async fn bench_pool(admin: &Client, joiner: &Client, hosts: u32) -> Result<()> {
    let health = HealthPolicy { agent_heartbeat_grace_ms: 600_000, ..Default::default() };
    admin
        .create_pool(&CreatePool { name: "bench".into(), health_policy: Some(health), ..Default::default() })
        .await?;
    let since = epoch_ms();
    let next = Arc::new(std::sync::atomic::AtomicU32::new(0));
    let mut workers = tokio::task::JoinSet::new();
    for _ in 0..16 {
        let (joiner, admin, next) = (joiner.clone(), admin.clone(), next.clone());
        workers.spawn(async move {
            loop {
                let n = next.fetch_add(1, Ordering::Relaxed);
                if n >= hosts {
                    return Ok::<(), anyhow::Error>(());
                }
                let reg = emulated_host("bench", n, 8)?;
                let answer = joiner.register_host(&reg).await?;
                admin.with_token(answer.credential).report_host_status(&healthy_report(&reg, since)).await?;
            }
        });
    }
    while let Some(w) = workers.join_next().await {
        w??;
    }
    let td = serde_json::json!({"family": "bench", "containerDefinitions": [{"name": "main",
        "command": ["sleep", "3600"], "resourceRequirements": [{"type": "GPU",
        "sharingStrategy": {"nvidiaMps": {"memory": 1024}}}]}]});
    admin.register_taskdef(td.to_string().into_bytes()).await?;
    Ok(())
}

/// Acknowledged submissions: client token → task id, and when the last one came.
#[derive(Default)]
struct Acks {
    by_token: BTreeMap<String, TaskId>,
    /// Acknowledgements after the kill of the current trial, by the time they came.
    first_after_kill: Option<Instant>,
    killed_at: Option<Instant>,
    /// A retry of a token answered with another task than its first answer.
    conflicting_answers: u64,
}

#[allow(clippy::disallowed_methods)] // a benchmark measures wall time
async fn run(b: &FailoverBench, members: &mut [Member], root: &Path, prefix: &str) -> Result<()> {
    let all = members.iter().map(Member::url).collect::<Vec<_>>().join(",");
    let (admin, joiner, join) = cluster_clients(root, members)?;

    bench_pool(&admin, &joiner, b.hosts).await?;

    // A real agent (in-process MPS model, emulated GPUs) running a service.
    admin.create_pool(&CreatePool { name: "svc".into(), ..Default::default() }).await?;
    let agent_dir = root.join("agent");
    std::fs::create_dir_all(&agent_dir)?;
    let mut agent = Command::new(std::env::current_exe()?)
        .args(["agent", "--server", &all, "--join-token", &join, "--pool", "svc", "--mps-model"])
        .args([
            "--emulate-gpus",
            "H200:143771:2",
            "--heartbeat-ms",
            "500",
            "--stop-tasks-on-exit",
            "--data-dir",
        ])
        .arg(&agent_dir)
        .env("MPSFLEET_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(root.join("agent.log"))?)
        .spawn()?;
    let outcome = trials(b, members, &admin, prefix).await;
    let _ = Command::new("kill").arg(agent.id().to_string()).status();
    let _ = agent.wait();
    outcome
}

#[allow(clippy::disallowed_methods)] // a benchmark measures wall time
async fn trials(b: &FailoverBench, members: &mut [Member], admin: &Client, prefix: &str) -> Result<()> {
    admin
        .create_service(&CreateService {
            name: "svc".into(),
            pool: "svc".into(),
            task_definition: "bench".into(),
            desired_count: b.service_tasks,
            resumption: None,
            deployment_configuration: None,
            client_token: Some("bench-service".into()),
            ..Default::default()
        })
        .await?;
    let service_query = || mpsfleet_client::TaskQuery {
        service: Some("svc".into()),
        limit: Some(1000),
        ..Default::default()
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    let service_before: Vec<TaskId> = loop {
        let tasks = admin.list_tasks(&service_query()).await?;
        let running: Vec<TaskId> =
            tasks.iter().filter(|t| t.last_status == TaskStatus::Running).map(|t| t.id).collect();
        if running.len() == b.service_tasks as usize {
            break running;
        }
        anyhow::ensure!(Instant::now() < deadline, "the service's tasks did not all reach RUNNING in 60 s");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };

    let acks = Arc::new(Mutex::new(Acks::default()));
    let stop = Arc::new(AtomicBool::new(false));
    let mut clients = tokio::task::JoinSet::new();
    for c in 0..b.clients {
        let (admin, acks, stop) = (admin.clone(), acks.clone(), stop.clone());
        clients.spawn(async move {
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let token = format!("c{c}-{n}");
                let req = RunTask {
                    task_definition: "bench".into(),
                    count: 1,
                    pool: "bench".into(),
                    client_token: Some(token.clone()),
                    ..Default::default()
                };
                // Retried with the same token until it is acknowledged, as a careful client does.
                let id = loop {
                    match admin.run_task(&req).await {
                        Ok(r) if r.tasks.len() == 1 => break r.tasks[0].id,
                        Ok(_) | Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
                    }
                    if stop.load(Ordering::Relaxed) {
                        break TaskId(0);
                    }
                };
                if id == TaskId(0) {
                    break;
                }
                let now = Instant::now();
                {
                    let mut a = acks.lock().expect("acks");
                    if let Some(k) = a.killed_at {
                        if a.first_after_kill.is_none() && now > k {
                            a.first_after_kill = Some(now);
                        }
                    }
                    if let Some(prev) = a.by_token.insert(token, id) {
                        if prev != id {
                            a.conflicting_answers += 1;
                        }
                    }
                }
                n += 1;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Ok::<(), anyhow::Error>(())
        });
    }

    let mut times = Vec::new();
    for trial in 1..=b.trials {
        tokio::time::sleep(Duration::from_secs(2)).await;
        let status = admin.cluster_status().await?;
        let leader_url = status.leader.url.clone().unwrap_or_default();
        let i =
            members.iter().position(|m| m.url() == leader_url).context("the leader is not one of ours")?;
        // From when the leader is gone (SIGKILL delivered and the process reaped): an answer
        // after that can only come from the next leader.
        members[i].kill9();
        let killed = Instant::now();
        {
            let mut a = acks.lock().expect("acks");
            a.first_after_kill = None;
            a.killed_at = Some(killed);
        }
        let took = loop {
            if let Some(t) = acks.lock().expect("acks").first_after_kill {
                break t.duration_since(killed).as_secs_f64();
            }
            anyhow::ensure!(
                killed.elapsed() < Duration::from_secs(60),
                "no write acknowledged within 60 s of the kill"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        };
        let new = admin.cluster_status().await?;
        println!(
            "trial {trial}: killed {}, {} leads, first write acknowledged {took:.3}s after the kill",
            members[i].url(),
            new.leader.id
        );
        times.push(took);
        let rx = members[i].start(&b.etcd_endpoints, prefix, b.leader_ttl)?;
        wait_line(&rx, "following: ")?;
    }
    stop.store(true, Ordering::Relaxed);
    while let Some(c) = clients.join_next().await {
        c??;
    }

    // What the last leader has.
    let tasks = admin
        .list_tasks(&mpsfleet_client::TaskQuery {
            pool: Some("bench".into()),
            limit: Some(1_000_000),
            ..Default::default()
        })
        .await?;
    let ids: HashMap<TaskId, &Task> = tasks.iter().map(|t| (t.id, t)).collect();
    let (acknowledged, lost, duplicates) = {
        let a = acks.lock().expect("acks");
        let lost = a.by_token.values().filter(|id| !ids.contains_key(id)).count();
        (
            a.by_token.len(),
            lost,
            tasks.len().saturating_sub(a.by_token.len()) + a.conflicting_answers as usize,
        )
    };
    let service_after = admin.list_tasks(&service_query()).await?;
    let stopped = service_before
        .iter()
        .filter(|id| !service_after.iter().any(|t| t.id == **id && t.last_status == TaskStatus::Running))
        .count();
    let mut per_gpu: HashMap<String, u64> = HashMap::new();
    for t in tasks.iter().chain(&service_after).filter(|t| t.last_status != TaskStatus::Stopped) {
        for g in &t.gpu_ids {
            *per_gpu.entry(g.to_string()).or_default() += 1;
        }
    }
    // Each task takes one MPS client of 1 GiB: 48 fit on a GPU by the client limit.
    let overcommitted = per_gpu.values().filter(|n| **n > 48).count();
    let mut sorted = times.clone();
    sorted.sort_by(f64::total_cmp);
    let mid = sorted.len() / 2;
    let median = if sorted.len() % 2 == 0 { (sorted[mid - 1] + sorted[mid]) / 2.0 } else { sorted[mid] };
    let max = sorted[sorted.len() - 1];
    let report = serde_json::json!({
        "bench": "failover",
        "trials": b.trials,
        "hosts": b.hosts,
        "clients": b.clients,
        "leader_ttl_s": b.leader_ttl,
        "acknowledged_writes": acknowledged,
        "median_failover_s": (median * 1000.0).round() / 1000.0,
        "max_failover_s": (max * 1000.0).round() / 1000.0,
        "acknowledged_writes_lost": lost,
        "duplicate_tasks": duplicates,
        "tasks_stopped_by_failover": stopped,
        "gpu_overcommitments": overcommitted,
    });
    println!("{report}");
    Ok(())
}

/// `mpsfleet bench takeover`: two servers on etcd, a store holding `--hosts` hosts and
/// `--tasks` tasks; the leader is SIGKILLed and the follower's takeover is timed, from its
/// election to its first acknowledged write (and from the kill, which adds the lease's TTL).
#[derive(Args)]
pub struct TakeoverBench {
    /// The etcd cluster the two servers share.
    #[arg(long, env = "MPSFLEET_ETCD_ENDPOINTS", value_name = "URL[,URL...]")]
    etcd_endpoints: String,
    /// Emulated hosts (8 GPUs each) registered in the store before the kill.
    #[arg(long, default_value_t = 10_000)]
    hosts: u32,
    /// Tasks submitted to the store before the kill.
    #[arg(long, default_value_t = 200_000)]
    tasks: u32,
    /// The servers' --leader-ttl, in seconds.
    #[arg(long, default_value_t = 2)]
    leader_ttl: u64,
}

#[allow(clippy::disallowed_methods)] // a benchmark measures wall time
pub fn takeover(b: TakeoverBench) -> Result<()> {
    let (root, _prefix, mut members, outputs) =
        start_servers("takeover", 2, &b.etcd_endpoints, b.leader_ttl)?;
    let rx2 = &outputs[1];
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let result = rt.block_on(async {
        let (admin, joiner, _) = cluster_clients(&root, &members)?;
        let t = Instant::now();
        bench_pool(&admin, &joiner, b.hosts).await?;
        let mut left = b.tasks;
        while left > 0 {
            let n = left.min(mpsfleet_server::cluster::MAX_RUN_COUNT);
            admin
                .run_task(&RunTask {
                    task_definition: "bench".into(),
                    count: n,
                    pool: "bench".into(),
                    client_token: None,
                    ..Default::default()
                })
                .await?;
            left -= n;
        }
        let before = admin.cluster_status().await?;
        println!(
            "{} hosts and {} tasks in the store (revision {}) in {:.1}s",
            b.hosts,
            b.tasks,
            before.revision,
            t.elapsed().as_secs_f64()
        );
        // Let the follower's replica reach the leader's revision before the kill.
        tokio::time::sleep(Duration::from_secs(2)).await;

        members[0].kill9();
        let killed = Instant::now();
        wait_line(rx2, "elected leader: ")?;
        let elected = Instant::now();
        let probe = RunTask {
            task_definition: "bench".into(),
            count: 1,
            pool: "bench".into(),
            client_token: Some("takeover".into()),
            ..Default::default()
        };
        loop {
            if admin.run_task(&probe).await.is_ok() {
                break;
            }
            anyhow::ensure!(
                killed.elapsed() < Duration::from_secs(120),
                "no write acknowledged within 120 s"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let served = Instant::now();
        let after = admin.cluster_status().await?;
        let tasks = admin
            .list_tasks(&mpsfleet_client::TaskQuery {
                pool: Some("bench".into()),
                limit: Some(1_000_000),
                ..Default::default()
            })
            .await?;
        anyhow::ensure!(
            tasks.len() == b.tasks as usize + 1,
            "the new leader has {} tasks, not {}",
            tasks.len(),
            b.tasks + 1
        );
        let round = |d: Duration| (d.as_secs_f64() * 1000.0).round() / 1000.0;
        let report = serde_json::json!({
            "bench": "takeover",
            "hosts": b.hosts,
            "tasks": b.tasks,
            "store_revision": after.revision,
            "leader_ttl_s": b.leader_ttl,
            "kill_to_elected_s": round(elected - killed),
            "takeover_s": round(served - elected),
            "kill_to_first_write_s": round(served - killed),
        });
        println!("{report}");
        Ok(())
    });
    stop_servers(&root, &mut members, &result);
    result
}
