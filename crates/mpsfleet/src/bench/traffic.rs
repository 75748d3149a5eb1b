//! `mpsfleet bench traffic`: what users of a service see of its recovery and its planned
//! changes, measured as failed requests. A managed pool of 3 local Docker hosts runs a service
//! of 3 replicas (an image answering with its task id, each with an MPS share); stock HAProxy,
//! with the configuration shipped in deploy/haproxy/, finds them only through the server's
//! DNS; an open-loop client sends a fixed rate of GET requests through it (each sent at its
//! time whatever the others do) and records each one's start, status, latency and the replica
//! that answered. Through each event (a rolling deployment, a scale-in 3 -> 2, a host drain,
//! and a drill that kills one host's MPS daemon for good, again after each local restart,
//! until the incident it opens has moved the replica and replaced the host):
//! requests sent and failed, latency p50/p99 against the steady state before, the time from
//! the event to the last request a leaving replica served, and to the first one a new
//! replica served. One summary line per event, then a JSON line.

use super::fleet::{quantile_f, remove_containers, stop_everything_in, Fleet};
use anyhow::{Context, Result};
use clap::Args;
use mpsfleet_types::service::RolloutState;
use mpsfleet_types::*;
use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The events a run may go through.
const EVENTS: [&str; 4] = ["deployment", "scale-in", "drain", "drill"];

/// The configuration users run, as shipped.
const HAPROXY_CFG: &str = include_str!("../../../../deploy/haproxy/haproxy.cfg");

#[derive(Args)]
pub struct TrafficBench {
    /// Times the whole sequence of events is run (each on a fresh fleet).
    #[arg(long, default_value_t = 1)]
    runs: u32,
    /// Requests a second, sent open-loop (1 to 2000).
    #[arg(long, default_value_t = 100)]
    rate: u32,
    /// The events, in order: `deployment`, `scale-in`, `drain`, `drill` (a daemon killed for
    /// good under one replica, through a drill's `daemon-exit` fault).
    #[arg(long, value_delimiter = ',', default_value = "deployment,scale-in,drain,drill")]
    events: Vec<String>,
    /// The image to serve from [default: MPSFLEET_TEST_IMAGE]: busybox's `httpd` is enough.
    #[arg(long, env = "MPSFLEET_TEST_IMAGE")]
    image: Option<String>,
    /// The service's `deregistrationDelaySeconds`.
    #[arg(long, default_value_t = 2)]
    deregistration_delay: u32,
    /// Run HAProxy without its retries (`retries 0`, no `retry-on`, no `option redispatch`):
    /// what the failures are when nothing resends a request.
    #[arg(long)]
    no_retries: bool,
    /// The HAProxy binary (Debian's haproxy).
    #[arg(long, default_value = "haproxy")]
    haproxy: String,
}

#[allow(clippy::disallowed_methods)] // a benchmark measures wall time
fn now() -> std::time::Instant {
    std::time::Instant::now()
}

/// One request: when it was sent (ms since the load began), its status (0: no answer), its
/// latency, and the task that answered.
#[derive(Debug, Clone)]
struct Sample {
    at_ms: f64,
    status: u16,
    latency_ms: f64,
    replica: String,
}

/// What one event did to the traffic.
#[derive(Debug, Clone, serde::Serialize)]
struct EventFigures {
    event: String,
    sent: usize,
    failed: usize,
    p50_ms: f64,
    p99_ms: f64,
    steady_p50_ms: f64,
    steady_p99_ms: f64,
    /// From the event to the last request a replica that left served (None: none left).
    last_served_by_leaving_ms: Option<f64>,
    /// From the event to the first request a new replica served (None: none came).
    first_served_by_new_ms: Option<f64>,
}

pub fn traffic(b: TrafficBench) -> Result<()> {
    anyhow::ensure!((1..=2000).contains(&b.rate), "--rate must be from 1 to 2000, got {}", b.rate);
    anyhow::ensure!((1..=100).contains(&b.runs), "--runs must be from 1 to 100, got {}", b.runs);
    for e in &b.events {
        anyhow::ensure!(EVENTS.contains(&e.as_str()), "--events: {e:?} is not one of {}", EVENTS.join(", "));
    }
    let image =
        b.image.clone().context("--image (or MPSFLEET_TEST_IMAGE) is required: an image with busybox")?;
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let mut all = Vec::new();
    for run in 0..b.runs {
        let dir = std::env::temp_dir().join(format!("mpsf-bench-traffic-{}-{run}", std::process::id()));
        let result = rt.block_on(one_run(&b, &image, &dir));
        stop_everything_in(&dir);
        let _ = std::fs::remove_dir_all(&dir);
        for f in result? {
            println!(
                "run {}: {}: {} sent, {} failed; p50 {:.1} ms, p99 {:.1} ms (steady {:.1} / {:.1}); last served by a leaving replica {}; first by a new one {}",
                run + 1,
                f.event,
                f.sent,
                f.failed,
                f.p50_ms,
                f.p99_ms,
                f.steady_p50_ms,
                f.steady_p99_ms,
                f.last_served_by_leaving_ms.map_or("-".into(), |t| format!("{t:.0} ms after")),
                f.first_served_by_new_ms.map_or("-".into(), |t| format!("{t:.0} ms after")),
            );
            all.push(f);
        }
    }
    let report = serde_json::json!({
        "bench": "traffic",
        "runs": b.runs,
        "rate": b.rate,
        "deregistration_delay_s": b.deregistration_delay,
        "haproxy_retries": !b.no_retries,
        "sent": all.iter().map(|f| f.sent).sum::<usize>(),
        "failed": all.iter().map(|f| f.failed).sum::<usize>(),
        "events": all,
    });
    println!("{report}");
    Ok(())
}

async fn one_run(b: &TrafficBench, image: &str, dir: &std::path::Path) -> Result<Vec<EventFigures>> {
    let dns = format!("127.0.0.1:{}", free_port()?);
    let agent_args = "--emulate-gpus H200:143771:1 --heartbeat-ms 200 --stop-tasks-on-exit --runtime docker \
                      --mps-model --image-pull-behavior prefer-cached --allow-fault-injection";
    let fleet =
        Fleet::start_with(dir, agent_args, "bench", 3, HealthPolicy::default(), &["--dns-listen", &dns])
            .await?;
    let admin = fleet.admin.clone();
    let td = serde_json::json!({
        "family": "web",
        "networkMode": "bridge",
        "containerDefinitions": [{
            "name": "main",
            "image": image,
            "command": ["/bin/sh", "-c", "echo $MPSFLEET_TASK_ID > /tmp/index.html; exec httpd -f -p 8080 -h /tmp"],
            "portMappings": [{"containerPort": 8080, "name": "http"}],
            "stopTimeout": 2,
            "resourceRequirements": [{"type": "GPU", "sharingStrategy": {"nvidiaMps": {"memory": 1024, "maxComputePercent": 30}}}],
        }]
    });
    admin.register_taskdef(td.to_string().into_bytes()).await?;
    let create = CreateService {
        name: "web".into(),
        pool: "bench".into(),
        task_definition: "web".into(),
        desired_count: 3,
        deregistration_delay_seconds: Some(b.deregistration_delay),
        ..Default::default()
    };
    admin.create_service(&create).await?;
    settled(&admin, 3).await?;

    let front = free_port()?;
    let cfg = HAPROXY_CFG
        .replace("nameserver mpsfleet 127.0.0.1:8600", &format!("nameserver mpsfleet {dns}"))
        .replace("bind 127.0.0.1:8080", &format!("bind 127.0.0.1:{front}"))
        .replace("/tmp/haproxy-mpsfleet.sock", &dir.join("haproxy.sock").display().to_string())
        .replace("_http._tcp.web.default.mpsfleet", "_http._tcp.web.bench.mpsfleet");
    let cfg = if b.no_retries { without_retries(&cfg)? } else { cfg };
    std::fs::write(dir.join("haproxy.cfg"), cfg)?;
    let mut haproxy = std::process::Command::new(&b.haproxy)
        .args(["-db", "-f"])
        .arg(dir.join("haproxy.cfg"))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .with_context(|| format!("cannot start {} (Debian: apt-get install haproxy)", b.haproxy))?;
    let url = format!("http://127.0.0.1:{front}/");
    let http = reqwest::Client::builder().timeout(Duration::from_secs(5)).build()?;
    let result = events(b, &admin, &http, &url).await;
    let _ = haproxy.kill();
    let _ = haproxy.wait();
    let hosts = fleet.host_ids().await.unwrap_or_default();
    drop(fleet);
    stop_everything_in(dir);
    remove_containers(hosts, dir.join("docker")).await?;
    result
}

async fn events(
    b: &TrafficBench,
    admin: &mpsfleet_client::Client,
    http: &reqwest::Client,
    url: &str,
) -> Result<Vec<EventFigures>> {
    // HAProxy serving all three replicas before the clock starts.
    let until = now() + Duration::from_secs(60);
    let mut seen = BTreeSet::new();
    while seen.len() < 3 {
        anyhow::ensure!(now() < until, "HAProxy did not serve the 3 replicas within 60 s");
        if let Ok(r) = http.get(url).send().await {
            if r.status().is_success() {
                seen.insert(r.text().await.unwrap_or_default().trim().to_string());
            }
        }
    }
    let samples = Arc::new(Mutex::new(Vec::new()));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let start = now();
    let load =
        tokio::spawn(load(http.clone(), url.to_string(), b.rate, start, samples.clone(), stop.clone()));
    tokio::time::sleep(Duration::from_secs(3)).await;
    let steady_until = ms_since(start);
    let mut windows = Vec::new();
    for e in &b.events {
        let mut drained = None;
        let before = replicas(admin).await?;
        let at = ms_since(start);
        match e.as_str() {
            "deployment" => {
                let req = UpdateService { force_new_deployment: true, ..Default::default() };
                admin.update_service("web", &req).await?;
                settled(admin, 3).await?;
            }
            "scale-in" => {
                admin
                    .update_service("web", &UpdateService { desired_count: Some(2), ..Default::default() })
                    .await?;
                settled(admin, 2).await?;
            }
            "drain" => {
                let host = a_replicas_host(admin).await?;
                admin.host_action(host.as_str(), "drain").await?;
                settled_off(admin, 3, &host).await?;
                drained = Some(host);
            }
            _ => {
                // The drill picks its target among the pool's healthy hosts, each running one
                // replica: the daemon under one replica, killed for good.
                let req = mpsfleet_types::drill::CreateDrill {
                    pool: "bench".into(),
                    fault: "daemon-exit".into(),
                    hosts: Some("1".into()),
                    dry_run: false,
                    once: false,
                };
                let drill = match admin.run_drill(&req).await? {
                    mpsfleet_client::DrillAnswer::Started(d) => d,
                    mpsfleet_client::DrillAnswer::Plan(_) => anyhow::bail!("the drill answered a plan"),
                };
                let host =
                    drill.targets.first().map(|t| t.host_id.clone()).context("a drill without a target")?;
                settled_off(admin, 3, &host).await?;
                drill_ended(admin, &drill.id).await?;
            }
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
        let after = replicas(admin).await?;
        windows.push((e.clone(), at, ms_since(start), before, after));
        // The drained host back in service (its incident resolved), outside any window: a
        // drill starts only in a pool without an open incident.
        if let Some(host) = drained {
            admin.activate_host(host.as_str()).await?;
        }
        // Back to three replicas before the next event, outside any window.
        if e == "scale-in" {
            admin
                .update_service("web", &UpdateService { desired_count: Some(3), ..Default::default() })
                .await?;
            settled(admin, 3).await?;
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
    }
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    load.await?;
    let samples = samples.lock().map(|s| s.clone()).unwrap_or_default();
    let steady: Vec<&Sample> = samples.iter().filter(|s| s.at_ms < steady_until).collect();
    let lat = |v: &[&Sample], q| {
        quantile_f(v.iter().filter(|s| s.status == 200).map(|s| s.latency_ms).collect(), q)
    };
    let (steady_p50, steady_p99) = (lat(&steady, 0.5), lat(&steady, 0.99));
    let round = |x: f64| (x * 10.0).round() / 10.0;
    Ok(windows
        .into_iter()
        .map(|(event, from, to, before, after)| {
            let w: Vec<&Sample> = samples.iter().filter(|s| s.at_ms >= from && s.at_ms < to).collect();
            let leaving: BTreeSet<&String> = before.difference(&after).collect();
            let new: BTreeSet<&String> = after.difference(&before).collect();
            let served = |set: &BTreeSet<&String>, last: bool| {
                let times =
                    w.iter().filter(|s| s.status == 200 && set.contains(&s.replica)).map(|s| s.at_ms - from);
                if last {
                    times.reduce(f64::max)
                } else {
                    times.reduce(f64::min)
                }
            };
            EventFigures {
                event,
                sent: w.len(),
                failed: w.iter().filter(|s| s.status != 200).count(),
                p50_ms: round(lat(&w, 0.5)),
                p99_ms: round(lat(&w, 0.99)),
                steady_p50_ms: round(steady_p50),
                steady_p99_ms: round(steady_p99),
                last_served_by_leaving_ms: served(&leaving, true).map(round),
                first_served_by_new_ms: served(&new, false).map(round),
            }
        })
        .collect())
}

/// Sends a GET every `1/rate` s until `stop`, each on its own task: open loop.
async fn load(
    http: reqwest::Client,
    url: String,
    rate: u32,
    start: std::time::Instant,
    samples: Arc<Mutex<Vec<Sample>>>,
    stop: Arc<std::sync::atomic::AtomicBool>,
) {
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / f64::from(rate)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let mut sent = Vec::new();
    while !stop.load(std::sync::atomic::Ordering::SeqCst) {
        tick.tick().await;
        let (http, url, samples) = (http.clone(), url.clone(), samples.clone());
        sent.push(tokio::spawn(async move {
            let at_ms = ms_since(start);
            let t0 = now();
            let (status, replica) = match http.get(&url).send().await {
                Ok(r) => {
                    let status = r.status().as_u16();
                    (status, r.text().await.unwrap_or_default().trim().to_string())
                }
                Err(_) => (0, String::new()),
            };
            let latency_ms = t0.elapsed().as_secs_f64() * 1000.0;
            if let Ok(mut s) = samples.lock() {
                s.push(Sample { at_ms, status, latency_ms, replica });
            }
        }));
    }
    for s in sent {
        let _ = s.await;
    }
}

/// The shipped configuration with its retries taken out; an error if it no longer has them.
fn without_retries(cfg: &str) -> Result<String> {
    let retrying = ["retries 3", "option redispatch 1", "retry-on "];
    let out: Vec<&str> = (cfg.lines())
        .map(|l| if l.trim_start().starts_with("retries 3") { "    retries 0" } else { l })
        .filter(|l| !retrying[1..].iter().any(|r| l.trim_start().starts_with(r)))
        .collect();
    let found = retrying.iter().all(|r| cfg.lines().any(|l| l.trim_start().starts_with(r)));
    anyhow::ensure!(
        found,
        "deploy/haproxy/haproxy.cfg changed shape: its retries are not where --no-retries looks"
    );
    Ok(out.join("\n") + "\n")
}

fn ms_since(start: std::time::Instant) -> f64 {
    start.elapsed().as_secs_f64() * 1000.0
}

fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// The ids of the service's live replicas.
async fn replicas(admin: &mpsfleet_client::Client) -> Result<BTreeSet<String>> {
    let tasks = admin.list_tasks(&Default::default()).await?;
    Ok(tasks.iter().filter(|t| t.last_status != TaskStatus::Stopped).map(|t| t.id.to_string()).collect())
}

/// Waits (up to 120 s) until the service's PRIMARY deployment completed with exactly `n`
/// replicas left running.
async fn settled(admin: &mpsfleet_client::Client, n: usize) -> Result<()> {
    let until = now() + Duration::from_secs(120);
    loop {
        let d = admin.service_deployments("web").await?;
        let live = replicas(admin).await?.len();
        if d.first().is_some_and(|d| d.deployment.rollout_state == RolloutState::Completed) && live == n {
            return Ok(());
        }
        anyhow::ensure!(now() < until, "the service did not settle at {n} replicas within 120 s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The host of one of the service's live replicas.
async fn a_replicas_host(admin: &mpsfleet_client::Client) -> Result<HostId> {
    let tasks = admin.list_tasks(&Default::default()).await?;
    (tasks.iter())
        .find(|t| t.desired_status != TaskStatus::Stopped)
        .and_then(|t| t.host_id.clone())
        .context("no replica to drain a host under")
}

/// Waits (up to 120 s) until drill `id` has ended, its verdict given.
async fn drill_ended(admin: &mpsfleet_client::Client, id: &str) -> Result<()> {
    let until = now() + Duration::from_secs(120);
    loop {
        let d = admin.list_drills().await?.into_iter().find(|d| d.id == id);
        if d.is_some_and(|d| d.status == mpsfleet_types::drill::DrillStatus::Ended) {
            return Ok(());
        }
        anyhow::ensure!(now() < until, "drill {id} did not end within 120 s");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Waits (up to 120 s) until `n` replicas run and none on `host`.
async fn settled_off(admin: &mpsfleet_client::Client, n: usize, host: &HostId) -> Result<()> {
    let until = now() + Duration::from_secs(120);
    loop {
        let tasks = admin.list_tasks(&Default::default()).await?;
        let live: Vec<&Task> = tasks.iter().filter(|t| t.last_status != TaskStatus::Stopped).collect();
        let running = live.iter().filter(|t| t.last_status == TaskStatus::Running).count();
        if running == n && live.len() == n && live.iter().all(|t| t.host_id.as_ref() != Some(host)) {
            return Ok(());
        }
        anyhow::ensure!(now() < until, "the replicas did not leave host {host} within 120 s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[cfg(test)]
mod tests {
    /// `--no-retries` takes every retry out of the shipped configuration, and refuses one that
    /// no longer has them where it looks.
    #[test]
    fn no_retries_takes_out_every_retry_of_the_shipped_configuration() {
        let out = super::without_retries(super::HAPROXY_CFG).unwrap();
        assert!(out.contains("    retries 0\n"), "{out}");
        let settings: Vec<&str> = out.lines().map(str::trim_start).filter(|l| !l.starts_with('#')).collect();
        for gone in ["retries 3", "option redispatch", "retry-on"] {
            assert!(!settings.iter().any(|l| l.starts_with(gone)), "{gone} is still in:\n{out}");
        }
        assert_eq!(out.lines().count(), super::HAPROXY_CFG.lines().count() - 2);
        assert!(super::without_retries("defaults\n    mode http\n").is_err());
    }
}
