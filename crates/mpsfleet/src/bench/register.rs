//! `mpsfleet bench register`: host registrations from concurrent clients to the real server.

use super::{emulated_host, proc_cpu_seconds, quantile, round1, HttpConn, ServerProcess};
use anyhow::{bail, Result};
use clap::Args;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use tokio::time::Instant;

/// `mpsfleet bench register`: starts `mpsfleet server` (SQLite with `synchronous=FULL`,
/// temporary data dir), creates a pool, and registers `--hosts` emulated hosts of
/// `--gpus-per-host` GPUs each (every GPU UUID unique) through `POST /v1/agent/register` with
/// the join token, from `--clients` concurrent keep-alive connections. Each registration is
/// answered after its commit; every one must succeed, and the server must list them all.
#[derive(Args)]
pub struct RegisterBench {
    /// Serve plain HTTP (`server --insecure-http`) instead of HTTPS, to compare.
    #[arg(long)]
    insecure_http: bool,
    /// Emulated hosts to register.
    #[arg(long, default_value_t = 20_000)]
    hosts: u32,
    /// Emulated GPUs each host declares (1 to 64).
    #[arg(long, default_value_t = 8)]
    gpus_per_host: u32,
    /// Registrations in flight at once (agents of a fleet coming up together).
    #[arg(long, default_value_t = 256)]
    clients: u32,
}

pub fn register(b: RegisterBench) -> Result<()> {
    anyhow::ensure!(b.hosts >= 1, "--hosts must be at least 1");
    anyhow::ensure!((1..=64).contains(&b.gpus_per_host), "--gpus-per-host must be from 1 to 64");
    anyhow::ensure!((1..=4096).contains(&b.clients), "--clients must be from 1 to 4096");
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let server = ServerProcess::start("register", b.insecure_http)?;
    rt.block_on(run(&b, &server))
}

#[allow(clippy::disallowed_methods)] // a benchmark measures wall time
async fn run(b: &RegisterBench, server: &ServerProcess) -> Result<()> {
    let pid = server.pid().to_string();
    let admin = server.admin()?;
    admin.create_pool(&mpsfleet_types::CreatePool { name: "bench".into(), ..Default::default() }).await?;
    // The requests are prepared before the clock starts: the figure is the server's.
    let authority = server.addr.to_string();
    let requests = (0..b.hosts)
        .map(|n| {
            let body = serde_json::to_vec(&emulated_host("bench", n, b.gpus_per_host)?)?;
            Ok(HttpConn::request("POST", "/v1/agent/register", &authority, &server.join_token, &body))
        })
        .collect::<Result<Vec<_>>>()?;
    let requests = Arc::new(requests);
    let cpu_before = proc_cpu_seconds(&pid);
    let next = Arc::new(AtomicUsize::new(0));
    let start = Instant::now();
    let mut clients = tokio::task::JoinSet::new();
    for _ in 0..b.clients {
        let (requests, next, addr) = (requests.clone(), next.clone(), server.addr.clone());
        clients.spawn(async move {
            let mut conn = HttpConn::connect(addr).await?;
            let mut latencies = Vec::new();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(r) = requests.get(i) else { return Ok::<_, anyhow::Error>(latencies) };
                let t = Instant::now();
                let (status, answer) = conn.send(r).await?;
                if status != 201 {
                    bail!("registration {i}: HTTP {status}: {}", String::from_utf8_lossy(answer));
                }
                latencies.push(t.elapsed().as_micros().min(u32::MAX as u128) as u32);
            }
        });
    }
    let mut latencies = Vec::with_capacity(b.hosts as usize);
    while let Some(c) = clients.join_next().await {
        latencies.extend(c??);
    }
    let secs = start.elapsed().as_secs_f64();
    let cpu = proc_cpu_seconds(&pid) - cpu_before;
    let listed = admin.list_hosts(Some("bench")).await?;
    let gpus: std::collections::HashSet<_> =
        listed.iter().flat_map(|h| h.gpus.iter().map(|g| g.gpu_id.clone())).collect();
    anyhow::ensure!(
        listed.len() == b.hosts as usize,
        "the server lists {} of {} hosts",
        listed.len(),
        b.hosts
    );
    anyhow::ensure!(
        gpus.len() == (b.hosts * b.gpus_per_host) as usize,
        "the server lists {} distinct GPUs, expected {}",
        gpus.len(),
        b.hosts * b.gpus_per_host
    );
    latencies.sort_unstable();
    let ms = |us: u32| (us as f64 / 100.0).round() / 10.0;
    let report = serde_json::json!({
        "bench": "register",
        "hosts": b.hosts,
        "gpus_per_host": b.gpus_per_host,
        "clients": b.clients,
        "seconds": (secs * 1000.0).round() / 1000.0,
        "registrations_per_sec": (f64::from(b.hosts) / secs).round(),
        "p50_ms": ms(quantile(&latencies, 0.5)),
        "p99_ms": ms(quantile(&latencies, 0.99)),
        "server_cpu_seconds": round1(cpu),
    });
    println!("{report}");
    Ok(())
}
