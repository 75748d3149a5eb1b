//! `mpsfleet bench ingest`: status reports from many simulated hosts to the real server.

use super::{
    epoch_ms, healthy_report, proc_cpu_seconds, proc_vm_mib, quantile, register_hosts, round1,
    send_each_once, HttpConn, ServerProcess,
};
use anyhow::{bail, Result};
use clap::Args;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// `mpsfleet bench ingest`: starts `mpsfleet server` (SQLite, temporary data dir), registers
/// the hosts through the API with the join token, and has each host report its status (onboarded,
/// one `MPS_DAEMON` check per GPU) with its own credential once per interval, over a bounded set
/// of keep-alive connections. Measures acknowledged reports per second, their latency, and the
/// server's CPU and memory over the measured window.
#[derive(Args)]
pub struct IngestBench {
    /// Serve plain HTTP (`server --insecure-http`) instead of HTTPS, to compare.
    #[arg(long)]
    insecure_http: bool,
    /// Simulated hosts registered, then each reporting every --interval-ms.
    #[arg(long, default_value_t = 20_000)]
    hosts: u32,
    /// Length of the measured window.
    #[arg(long, default_value_t = 10)]
    seconds: u64,
    /// How often each host reports; 0 sends as fast as the server answers.
    #[arg(long, default_value_t = 1000)]
    interval_ms: u64,
    /// Steady load before the measured window (after every host's first report).
    #[arg(long, default_value_t = 3)]
    warmup_seconds: u64,
    /// Keep-alive connections, hence the most requests in flight at once.
    #[arg(long, default_value_t = 32)]
    connections: u32,
    /// Emulated GPUs each simulated host declares (1 to 64).
    #[arg(long, default_value_t = 8)]
    gpus_per_host: u32,
    /// The pool's heartbeat grace: it must cover onboarding every host (one commit each) before
    /// the steady load reaches the first ones again.
    #[arg(long, default_value_t = 60_000)]
    grace_ms: u64,
}

#[derive(Default)]
struct Counters {
    acked: AtomicU64,
    failed: AtomicU64,
    measuring: AtomicBool,
    stop: AtomicBool,
}

pub fn ingest(b: IngestBench) -> Result<()> {
    anyhow::ensure!(b.hosts >= 1 && b.connections >= 1, "--hosts and --connections must be at least 1");
    anyhow::ensure!((1..=64).contains(&b.gpus_per_host), "--gpus-per-host must be from 1 to 64");
    anyhow::ensure!(b.seconds >= 1, "--seconds must be at least 1");
    // One thread: the load generator shares the machine with the server it measures.
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let server = ServerProcess::start("ingest", b.insecure_http)?;
    rt.block_on(run(&b, &server))
}

#[allow(clippy::disallowed_methods)] // a benchmark measures wall time
async fn run(b: &IngestBench, server: &ServerProcess) -> Result<()> {
    let pid = server.pid().to_string();
    server
        .admin()?
        .create_pool(&mpsfleet_types::CreatePool {
            name: "bench".into(),
            health_policy: Some(mpsfleet_types::HealthPolicy {
                agent_heartbeat_grace_ms: b.grace_ms,
                ..Default::default()
            }),
            ..Default::default()
        })
        .await?;
    let rss_start = proc_vm_mib(&pid, "VmRSS");
    println!("server pid {pid} at {} (RSS {rss_start:.1} MiB); registering {} hosts", server.url, b.hosts);
    let t = Instant::now();
    let hosts = register_hosts(server, "bench", b.hosts, b.gpus_per_host, 16).await?;
    let register_s = t.elapsed().as_secs_f64();
    let rss_registered = proc_vm_mib(&pid, "VmRSS");
    println!(
        "registered {} hosts in {register_s:.1}s ({:.0}/s); server RSS {rss_registered:.1} MiB",
        b.hosts,
        b.hosts as f64 / register_s
    );
    let authority = server.addr.to_string();
    let since = epoch_ms();
    let requests = hosts
        .iter()
        .map(|(reg, credential)| {
            let body = serde_json::to_vec(&healthy_report(reg, since))?;
            Ok(HttpConn::request("POST", "/v1/agent/status", &authority, credential, &body))
        })
        .collect::<Result<Vec<_>>>()?;
    let body_bytes = requests.first().map_or(0, Vec::len);
    drop(hosts);
    let requests = Arc::new(requests);

    // Every host's first report moves it from ONBOARDING to ACTIVE (one commit each).
    let t = Instant::now();
    send_each_once(server.addr.clone(), requests.clone(), b.connections as usize).await?;
    println!("every host reported once (onboarded) in {:.1}s", t.elapsed().as_secs_f64());

    let counters = Arc::new(Counters::default());
    let interval = Duration::from_millis(b.interval_ms);
    let start = Instant::now();
    let k = b.connections.min(b.hosts) as usize;
    let mut workers = tokio::task::JoinSet::new();
    for w in 0..k {
        let mine: Vec<usize> = (w..requests.len()).step_by(k).collect();
        workers.spawn(worker(server.addr.clone(), requests.clone(), mine, interval, start, counters.clone()));
    }
    tokio::time::sleep(Duration::from_secs(b.warmup_seconds)).await;
    let (acked0, failed0) = (counters.acked.load(Ordering::Relaxed), counters.failed.load(Ordering::Relaxed));
    let (cpu0, self0) = (proc_cpu_seconds(&pid), proc_cpu_seconds("self"));
    let t0 = Instant::now();
    counters.measuring.store(true, Ordering::Relaxed);
    let mut last = acked0;
    for s in 1..=b.seconds {
        tokio::time::sleep_until(t0 + Duration::from_secs(s)).await;
        let now = counters.acked.load(Ordering::Relaxed);
        println!("second {s}: {} reports acknowledged", now - last);
        last = now;
    }
    let acked = counters.acked.load(Ordering::Relaxed) - acked0;
    let failed = counters.failed.load(Ordering::Relaxed) - failed0;
    let secs = t0.elapsed().as_secs_f64();
    let (cpu1, self1) = (proc_cpu_seconds(&pid), proc_cpu_seconds("self"));
    counters.measuring.store(false, Ordering::Relaxed);
    counters.stop.store(true, Ordering::Relaxed);
    let (rss, hwm) = (proc_vm_mib(&pid, "VmRSS"), proc_vm_mib(&pid, "VmHWM"));
    let mut latencies = Vec::new();
    while let Some(done) = workers.join_next().await {
        latencies.extend(done??);
    }
    latencies.sort_unstable();
    if failed > 0 {
        bail!("{failed} reports were refused in the measured window; see the server log");
    }
    let ms = |us: u32| (us as f64 / 10.0).round() / 100.0;
    let report = serde_json::json!({
        "bench": "ingest",
        "hosts": b.hosts,
        "gpus_per_host": b.gpus_per_host,
        "interval_ms": b.interval_ms,
        "grace_ms": b.grace_ms,
        "connections": k,
        "request_bytes": body_bytes,
        "seconds": (secs * 1000.0).round() / 1000.0,
        "reports": acked,
        "reports_per_sec": (acked as f64 / secs).round(),
        "offered_per_sec": if b.interval_ms == 0 { serde_json::Value::Null } else { (b.hosts as f64 * 1000.0 / b.interval_ms as f64).round().into() },
        "p50_ms": ms(quantile(&latencies, 0.5)),
        "p99_ms": ms(quantile(&latencies, 0.99)),
        "max_ms": ms(latencies.last().copied().unwrap_or(0)),
        "server_cpu_percent": round1((cpu1 - cpu0) / secs * 100.0),
        "loadgen_cpu_percent": round1((self1 - self0) / secs * 100.0),
        "server_rss_mib": round1(rss),
        "server_peak_rss_mib": round1(hwm),
        "server_rss_start_mib": round1(rss_start),
        "server_rss_registered_mib": round1(rss_registered),
        "server_bytes_per_host": ((rss - rss_start) * 1_048_576.0 / b.hosts as f64).round(),
        "register_per_sec": (b.hosts as f64 / register_s).round(),
    });
    println!("{report}");
    Ok(())
}

/// Sends its hosts' reports, each host at its own offset within every interval (or back to back
/// when the interval is 0), on one keep-alive connection; returns the latencies (µs) seen while
/// measuring. A worker that falls behind sends at once until it has caught up.
#[allow(clippy::disallowed_methods)] // a benchmark measures wall time
async fn worker(
    addr: super::Endpoint,
    requests: Arc<Vec<Vec<u8>>>,
    mine: Vec<usize>,
    interval: Duration,
    start: Instant,
    counters: Arc<Counters>,
) -> Result<Vec<u32>> {
    let mut conn = HttpConn::connect(addr).await?;
    let mut latencies = Vec::new();
    let total = requests.len() as u128;
    let step = interval.as_nanos();
    for round in 0u128.. {
        for &i in &mine {
            if counters.stop.load(Ordering::Relaxed) {
                return Ok(latencies);
            }
            if step > 0 {
                let offset = step * round + step * i as u128 / total;
                let due = start + Duration::from_nanos(offset as u64);
                if Instant::now() < due {
                    tokio::time::sleep_until(due).await;
                }
            }
            let t = Instant::now();
            let (status, body) = conn.send(&requests[i]).await?;
            if status == 200 {
                counters.acked.fetch_add(1, Ordering::Relaxed);
            } else {
                if counters.failed.fetch_add(1, Ordering::Relaxed) == 0 {
                    eprintln!("a report was refused: HTTP {status}: {}", String::from_utf8_lossy(body));
                }
            }
            if counters.measuring.load(Ordering::Relaxed) {
                latencies.push(t.elapsed().as_micros().min(u32::MAX as u128) as u32);
            }
        }
    }
    Ok(latencies)
}
