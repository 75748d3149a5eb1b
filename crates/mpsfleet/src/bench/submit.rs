//! `mpsfleet bench submit`: `task run` batches to the real server, placed and committed.

use super::{
    epoch_ms, healthy_report, proc_cpu_seconds, proc_vm_mib, quantile, register_hosts, round1,
    send_each_once, HttpConn, ServerProcess,
};
use anyhow::{bail, Context, Result};
use clap::Args;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use tokio::time::Instant;

/// `mpsfleet bench submit`: starts `mpsfleet server` (SQLite, temporary data dir), registers
/// enough emulated hosts through the API and makes them ACTIVE with one status report each,
/// registers a task definition with a small MPS demand, then sends `POST /v1/tasks` batches from
/// concurrent clients until `--tasks` tasks are acknowledged (each batch answers after its
/// commit). Every task must be placed.
#[derive(Args)]
pub struct SubmitBench {
    /// Serve plain HTTP (`server --insecure-http`) instead of HTTPS, to compare.
    #[arg(long)]
    insecure_http: bool,
    /// Tasks to submit; enough emulated hosts are registered to place them all.
    #[arg(long, default_value_t = 1_000_000)]
    tasks: u64,
    /// Tasks per request (the API takes at most 10,000).
    #[arg(long, default_value_t = mpsfleet_server::cluster::MAX_RUN_COUNT)]
    batch: u32,
    /// Clients sending batches at once.
    #[arg(long, default_value_t = 2)]
    clients: u32,
    /// MPS memory of each task, in MiB (each takes one MPS client of an H200's 48).
    #[arg(long, default_value_t = 1024)]
    memory_mib: u64,
    /// Emulated GPUs per registered host (1 to 64).
    #[arg(long, default_value_t = 8)]
    gpus_per_host: u32,
    /// Send each request with a client token of its own (`clientToken`), as a client that
    /// retries would: what remembering them costs.
    #[arg(long)]
    client_tokens: bool,
    /// The server's store: `sqlite` (its own file) or `etcd` (at --etcd-endpoints, under a
    /// prefix of this run's; etcd's raw write rate is measured in the same run).
    #[arg(long, value_parser = ["sqlite", "etcd"], default_value = "sqlite")]
    store: String,
    /// The etcd cluster for `--store etcd`.
    #[arg(long, env = "MPSFLEET_ETCD_ENDPOINTS", value_name = "URL[,URL...]")]
    etcd_endpoints: Option<String>,
    /// Then send as many tasks again through the ECS-compatible API (`POST /`, RunTask of
    /// `--batch` tasks, at most 10, each request SigV4-signed with an AWS key), on the same
    /// server: the report gives both runs.
    #[arg(long)]
    ecs: bool,
    /// With --ecs: the ECS run first, then the REST one (the second run works on a larger
    /// state; run both orders to compare).
    #[arg(long, requires = "ecs")]
    ecs_first: bool,
    /// The server's `--events-history`: events it keeps for later readers (0: none), to
    /// compare the submit rate with the history kept and without it.
    #[arg(long, value_name = "N")]
    events_history: Option<usize>,
}

/// How a run's requests are made.
#[derive(Clone)]
enum Api {
    /// `POST /v1/tasks` with the admin token.
    Rest { token: String },
    /// ECS's RunTask at `POST /`, signed with this access key id and secret.
    Ecs { key_id: String, secret: String },
}

impl Api {
    fn request(&self, authority: &str, n: u64, client_token: Option<String>) -> Vec<u8> {
        let token = client_token.map(|t| format!(r#","clientToken":"{t}""#)).unwrap_or_default();
        match self {
            Api::Rest { token: bearer } => {
                let body = format!(r#"{{"taskDefinition":"bench","count":{n},"pool":"bench"{token}}}"#);
                HttpConn::request("POST", "/v1/tasks", authority, bearer, body.as_bytes())
            }
            Api::Ecs { key_id, secret } => {
                let body = format!(r#"{{"cluster":"bench","taskDefinition":"bench","count":{n}{token}}}"#);
                let target = "AmazonEC2ContainerServiceV20141113.RunTask";
                let content_type = "application/x-amz-json-1.1";
                let (date, auth) = mpsfleet_core::sigv4::sign_json_call(
                    authority,
                    target,
                    body.as_bytes(),
                    (key_id, secret),
                    "us-east-1",
                    "ecs",
                    epoch_ms(),
                );
                let mut r = format!(
                    "POST / HTTP/1.1\r\nhost: {authority}\r\nauthorization: {auth}\r\ncontent-type: {content_type}\r\n\
                     x-amz-date: {date}\r\nx-amz-target: {target}\r\ncontent-length: {}\r\n\r\n",
                    body.len()
                )
                .into_bytes();
                r.extend_from_slice(body.as_bytes());
                r
            }
        }
    }

    /// The tasks an answer placed and left pending.
    fn counts(&self, status: u16, answer: &[u8]) -> Result<Counts> {
        match self {
            Api::Rest { .. } if status == 201 => Ok(serde_json::from_slice(answer)?),
            Api::Ecs { .. } if status == 200 => {
                // Only what is counted is read: the client shares the machine with the server.
                #[derive(serde::Deserialize)]
                struct Answer {
                    tasks: Vec<Placed>,
                }
                #[derive(serde::Deserialize)]
                #[serde(rename_all = "camelCase")]
                struct Placed {
                    container_instance_arn: Option<serde::de::IgnoredAny>,
                }
                let a: Answer = serde_json::from_slice(answer)?;
                let placed = a.tasks.iter().filter(|t| t.container_instance_arn.is_some()).count() as u64;
                Ok(Counts { placed, pending: a.tasks.len() as u64 - placed })
            }
            _ => bail!("HTTP {status}: {}", String::from_utf8_lossy(answer)),
        }
    }
}

pub fn submit(b: SubmitBench) -> Result<()> {
    anyhow::ensure!(b.tasks >= 1, "--tasks must be at least 1");
    anyhow::ensure!(
        (1..=mpsfleet_server::cluster::MAX_RUN_COUNT).contains(&b.batch),
        "--batch must be from 1 to {}",
        mpsfleet_server::cluster::MAX_RUN_COUNT
    );
    anyhow::ensure!(b.clients >= 1, "--clients must be at least 1");
    anyhow::ensure!(
        !b.ecs || b.batch <= 10,
        "--ecs sends RunTask, which starts at most 10 tasks: --batch 10 or less"
    );
    anyhow::ensure!((1..=64).contains(&b.gpus_per_host), "--gpus-per-host must be from 1 to 64");
    anyhow::ensure!((1..=143_771).contains(&b.memory_mib), "--memory-mib must be from 1 to 143771");
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let history: Vec<String> =
        b.events_history.iter().flat_map(|n| ["--events-history".to_string(), n.to_string()]).collect();
    if b.store == "sqlite" {
        let server = ServerProcess::start_with("submit", b.insecure_http, "127.0.0.1:0", &history)?;
        return rt.block_on(run(&b, &server, serde_json::Value::Null));
    }
    let endpoints = b
        .etcd_endpoints
        .clone()
        .context("--store etcd needs --etcd-endpoints (or MPSFLEET_ETCD_ENDPOINTS)")?;
    let prefix = format!("/mpsfleet-bench/submit-{}-{}", std::process::id(), epoch_ms());
    let mut probe = mpsfleet_store::EtcdConfig::new(&endpoints);
    probe.prefix = format!("{prefix}-probe");
    // etcd alone, through the same client: what one commit path could reach at best.
    let raw = |clients, puts, bytes| {
        mpsfleet_store::etcd::probe_write_rate(
            &probe,
            clients,
            puts,
            bytes,
            std::time::Duration::from_secs(3),
        )
    };
    let raw = serde_json::json!({
        "one_put_100b_8_clients": raw(8, 1, 100)?,
        "txn_100_puts_1kb_4_clients": raw(4, 100, 1024)?,
    });
    println!("etcd alone: {raw}");
    let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let extra: Vec<String> = ["--store", "etcd", "--etcd-endpoints", &endpoints, "--etcd-prefix", &prefix]
        .iter()
        .map(|s| s.to_string())
        .chain(history)
        .collect();
    let server = ServerProcess::start_with("submit", b.insecure_http, &format!("127.0.0.1:{port}"), &extra)?;
    rt.block_on(run(&b, &server, raw))
}

#[derive(serde::Deserialize)]
struct Counts {
    placed: u64,
    pending: u64,
}

#[allow(clippy::disallowed_methods)] // a benchmark measures wall time
async fn run(b: &SubmitBench, server: &ServerProcess, etcd_alone: serde_json::Value) -> Result<()> {
    let pid = server.pid().to_string();
    let admin = server.admin()?;
    // The hosts get one report and no heartbeats after it: the grace covers the whole run.
    let health = mpsfleet_types::HealthPolicy { agent_heartbeat_grace_ms: 600_000, ..Default::default() };
    admin
        .create_pool(&mpsfleet_types::CreatePool {
            name: "bench".into(),
            health_policy: Some(health),
            ..Default::default()
        })
        .await?;
    // Each GPU takes 48 one-client tasks at most (or fewer by memory).
    let per_gpu = (143_771 / b.memory_mib).min(48);
    let per_host = per_gpu * u64::from(b.gpus_per_host);
    let runs = if b.ecs { 2 } else { 1 };
    let hosts = u32::try_from((runs * b.tasks).div_ceil(per_host) + 1)?;
    let t = Instant::now();
    let registered = register_hosts(server, "bench", hosts, b.gpus_per_host, 16).await?;
    let authority = server.addr.to_string();
    let since = epoch_ms();
    let reports = registered
        .iter()
        .map(|(reg, credential)| {
            let body = serde_json::to_vec(&healthy_report(reg, since))?;
            Ok(HttpConn::request("POST", "/v1/agent/status", &authority, credential, &body))
        })
        .collect::<Result<Vec<_>>>()?;
    send_each_once(server.addr.clone(), Arc::new(reports), 8).await?;
    let active = admin
        .list_hosts(Some("bench"))
        .await?
        .iter()
        .filter(|h| h.status == mpsfleet_types::HostStatus::Active)
        .count();
    anyhow::ensure!(active == hosts as usize, "{active} of {hosts} hosts are ACTIVE");
    println!(
        "{hosts} hosts of {} GPUs registered and ACTIVE in {:.1}s (room for {} tasks)",
        b.gpus_per_host,
        t.elapsed().as_secs_f64(),
        u64::from(hosts) * per_host
    );
    let td = serde_json::json!({"family": "bench", "containerDefinitions": [{"name": "main",
        "command": ["sleep", "3600"], "resourceRequirements": [{"type": "GPU",
        "sharingStrategy": {"nvidiaMps": {"memory": b.memory_mib}}}]}]});
    admin.register_taskdef(td.to_string().into_bytes()).await?;

    let rss_before = proc_vm_mib(&pid, "VmRSS");
    let rest = Api::Rest { token: server.admin_token.clone() };
    let ecs = if b.ecs {
        let req = mpsfleet_types::access::CreateToken {
            role: mpsfleet_types::access::Role::Operator,
            expires_in_s: None,
            description: "bench submit --ecs".into(),
            pool: None,
            aws: true,
        };
        let key = admin.create_token(&req).await?;
        let key_id = key.view.access_key_id.context("the token has no access key id")?;
        Some(Api::Ecs { key_id, secret: key.token })
    } else {
        None
    };
    // Each run with the server's CPU seconds it took (the client shares the machine).
    let pid_ref = &pid;
    let measured = |api| async move {
        let cpu = proc_cpu_seconds(pid_ref);
        let (secs, latencies) = submit_all(b, server, api).await?;
        Ok::<_, anyhow::Error>((secs, latencies, proc_cpu_seconds(pid_ref) - cpu))
    };
    let ecs_run = match (&ecs, b.ecs_first) {
        (Some(api), true) => Some(measured(api).await?),
        _ => None,
    };
    let (secs, latencies, cpu) = measured(&rest).await?;
    let ecs_run = match (&ecs, ecs_run) {
        (Some(api), None) => Some(measured(api).await?),
        (_, run) => run,
    };
    let (rss, hwm) = (proc_vm_mib(&pid, "VmRSS"), proc_vm_mib(&pid, "VmHWM"));
    let mut report = serde_json::json!({
        "bench": "submit",
        "store": b.store,
        "etcd_alone": etcd_alone,
        "tasks": b.tasks,
        "batch": b.batch,
        "clients": b.clients,
        "hosts": hosts,
        "seconds": (secs * 1000.0).round() / 1000.0,
        "tasks_per_sec": (b.tasks as f64 / secs).round(),
        "batch_p50_ms": ms(quantile(&latencies, 0.5)),
        "batch_p99_ms": ms(quantile(&latencies, 0.99)),
        "server_cpu_us_per_task": (cpu * 1e6 / b.tasks as f64).round(),
        "server_rss_before_mib": round1(rss_before),
        "server_rss_mib": round1(rss),
        "server_peak_rss_mib": round1(hwm),
        "server_bytes_per_task": ((rss - rss_before) * 1_048_576.0 / b.tasks as f64).round(),
    });
    if let Some((secs, latencies, cpu)) = ecs_run {
        report["ecs"] = serde_json::json!({
            "seconds": (secs * 1000.0).round() / 1000.0,
            "tasks_per_sec": (b.tasks as f64 / secs).round(),
            "batch_p50_ms": ms(quantile(&latencies, 0.5)),
            "batch_p99_ms": ms(quantile(&latencies, 0.99)),
            "server_cpu_us_per_task": (cpu * 1e6 / b.tasks as f64).round(),
        });
    }
    println!("{report}");
    Ok(())
}

fn ms(us: u32) -> f64 {
    (us as f64 / 100.0).round() / 10.0
}

/// Sends `b.tasks` tasks in batches of `b.batch` from `b.clients` clients through `api`, each
/// answered after its commit and every task placed; the seconds it took and each batch's
/// latency (µs), sorted.
#[allow(clippy::disallowed_methods)] // a benchmark measures wall time
async fn submit_all(b: &SubmitBench, server: &ServerProcess, api: &Api) -> Result<(f64, Vec<u32>)> {
    let authority = server.addr.to_string();
    let left = Arc::new(AtomicU64::new(b.tasks));
    let done = Arc::new(AtomicU64::new(0));
    let sent = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let mut clients = tokio::task::JoinSet::new();
    for _ in 0..b.clients {
        let (left, done, sent, authority, api) =
            (left.clone(), done.clone(), sent.clone(), authority.clone(), api.clone());
        let client_tokens = b.client_tokens;
        let (addr, batch, total) = (server.addr.clone(), u64::from(b.batch), b.tasks);
        clients.spawn(async move {
            let mut conn = HttpConn::connect(addr).await?;
            let mut latencies = Vec::new();
            loop {
                let take =
                    left.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |l| l.checked_sub(l.min(batch)));
                let n = match take {
                    Ok(l) if l > 0 => l.min(batch),
                    _ => return Ok::<_, anyhow::Error>(latencies),
                };
                let token = client_tokens.then(|| format!("bench-{}", sent.fetch_add(1, Ordering::Relaxed)));
                let req = api.request(&authority, n, token);
                let t = Instant::now();
                let (status, answer) = conn.send(&req).await?;
                let counts = api.counts(status, answer)?;
                latencies.push(t.elapsed().as_micros().min(u32::MAX as u128) as u32);
                if counts.placed != n || counts.pending != 0 {
                    bail!(
                        "{} of {n} tasks were placed ({} pending): the pool is too small",
                        counts.placed,
                        counts.pending
                    );
                }
                let before = done.fetch_add(n, Ordering::Relaxed);
                if (before + n) / 100_000 != before / 100_000 || before + n == total {
                    println!("{} tasks placed and committed", before + n);
                }
            }
        });
    }
    let mut latencies = Vec::new();
    while let Some(c) = clients.join_next().await {
        latencies.extend(c??);
    }
    let secs = start.elapsed().as_secs_f64();
    latencies.sort_unstable();
    Ok((secs, latencies))
}
