//! `mpsfleet bench metrics`: the server's `/metrics` scraped at fleet scale. Registers and
//! onboards the hosts (8 GPUs each by default), places MPS tasks, then scrapes `/metrics` over
//! HTTPS with a viewer's token again and again, as Prometheus would, and reports the scrape
//! time (median, p99, max), the answer's size and its series count, next to the series count
//! of the same pool with a single host (the API's series aside, whose routes and codes depend
//! on the calls made): the cardinality budget says they match.

use super::{
    epoch_ms, healthy_report, quantile, register_hosts, round1, send_each_once, HttpConn, ServerProcess,
};
use anyhow::{bail, Result};
use clap::Args;
use mpsfleet_types::{CreatePool, HealthPolicy, RunTask};
use std::time::Instant;

#[derive(Args)]
pub struct MetricsBench {
    /// Emulated hosts registered and onboarded.
    #[arg(long, default_value_t = 20_000)]
    hosts: u32,
    /// GPUs per emulated host.
    #[arg(long, default_value_t = 8)]
    gpus_per_host: u32,
    /// MPS tasks placed before the scrapes (1 GiB each).
    #[arg(long, default_value_t = 100_000)]
    tasks: u32,
    /// Scrapes timed.
    #[arg(long, default_value_t = 50)]
    scrapes: u32,
}

/// The series in an exposition: its sample lines.
fn series(text: &str) -> usize {
    text.lines().filter(|l| !l.is_empty() && !l.starts_with('#')).count()
}

/// The series but the API's, whose routes and status codes depend on the calls made.
fn state_series(text: &str) -> usize {
    text.lines().filter(|l| !l.is_empty() && !l.starts_with('#') && !l.starts_with("mpsfleet_api_")).count()
}

/// A pool `bench` on `server` with `hosts` onboarded hosts and `tasks` MPS tasks of 1 GiB.
pub(super) async fn populate(
    server: &ServerProcess,
    hosts: u32,
    gpus: u32,
    tasks: u32,
) -> Result<mpsfleet_client::Client> {
    let admin = server.admin()?;
    let health = HealthPolicy { agent_heartbeat_grace_ms: 600_000, ..Default::default() };
    admin
        .create_pool(&CreatePool { name: "bench".into(), health_policy: Some(health), ..Default::default() })
        .await?;
    let td = serde_json::json!({"family": "bench", "containerDefinitions": [{"name": "main",
        "command": ["sleep", "3600"], "resourceRequirements": [{"type": "GPU",
        "sharingStrategy": {"nvidiaMps": {"memory": 1024}}}]}]});
    admin.register_taskdef(td.to_string().into_bytes()).await?;
    let registered = register_hosts(server, "bench", hosts, gpus, 16).await?;
    let since = epoch_ms();
    let authority = server.addr.to_string();
    let onboard = registered
        .iter()
        .map(|(reg, credential)| {
            let body = serde_json::to_vec(&healthy_report(reg, since))?;
            Ok(HttpConn::request("POST", "/v1/agent/status", &authority, credential, &body))
        })
        .collect::<Result<Vec<_>>>()?;
    drop(registered);
    send_each_once(server.addr.clone(), std::sync::Arc::new(onboard), 16).await?;
    let mut left = tasks;
    while left > 0 {
        let n = left.min(mpsfleet_server::cluster::MAX_RUN_COUNT);
        let run = RunTask {
            task_definition: "bench".into(),
            count: n,
            pool: "bench".into(),
            client_token: None,
            ..Default::default()
        };
        admin.run_task(&run).await?;
        left -= n;
    }
    Ok(admin)
}

/// One scrape: how long it took, and the answer.
#[allow(clippy::disallowed_methods)] // a benchmark measures wall time
async fn scrape(admin: &mpsfleet_client::Client) -> Result<(std::time::Duration, String)> {
    let t = Instant::now();
    let text = admin.metrics().await?;
    let took = t.elapsed();
    if !text.contains("mpsfleet_hosts") {
        bail!("/metrics answered without mpsfleet_hosts");
    }
    Ok((took, text))
}

pub fn metrics(b: MetricsBench) -> Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    rt.block_on(async {
        // The same pool and service set with a single host: what the series must not grow from.
        let small = {
            let server = ServerProcess::start("metrics-small", false)?;
            let admin = populate(&server, 1, b.gpus_per_host, 1).await?;
            scrape(&admin).await?.1
        };
        let server = ServerProcess::start("metrics", false)?;
        println!("registering {} hosts of {} GPUs, then {} tasks", b.hosts, b.gpus_per_host, b.tasks);
        let admin = populate(&server, b.hosts, b.gpus_per_host, b.tasks).await?;
        println!("scraping {} times", b.scrapes);
        let mut times = Vec::new();
        let mut last = String::new();
        for _ in 0..b.scrapes {
            let (took, text) = scrape(&admin).await?;
            times.push(took.as_micros() as u32);
            last = text;
        }
        times.sort_unstable();
        let ms = |us: u32| (us as f64 / 10.0).round() / 100.0;
        let report = serde_json::json!({
            "bench": "metrics",
            "hosts": b.hosts,
            "gpus": u64::from(b.hosts) * u64::from(b.gpus_per_host),
            "tasks": b.tasks,
            "scrapes": b.scrapes,
            "scrape_p50_ms": ms(quantile(&times, 0.5)),
            "scrape_p99_ms": ms(quantile(&times, 0.99)),
            "scrape_max_ms": ms(times.last().copied().unwrap_or(0)),
            "bytes": last.len(),
            "series": series(&last),
            "series_but_api": state_series(&last),
            "series_but_api_with_one_host": state_series(&small),
            "kib": round1(last.len() as f64 / 1024.0),
        });
        println!("{report}");
        Ok(())
    })
}
