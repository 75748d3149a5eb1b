//! `mpsfleet bench recovery`: time from the first kill of an MPS daemon that cannot stay up
//! (killed again after each local restart, as a user meets it) to its tasks running elsewhere.

use super::fleet::{median, quantile_f, remove_containers, stop_everything_in, Fleet};
use super::kill::keep_killing;
use super::timeline::{self, Steps};
use anyhow::Result;
use clap::Args;

/// `mpsfleet bench recovery`: a managed pool of local hosts with the real MPS daemon; in each
/// trial one daemon is killed, and killed again each time the agent's local repair restarts
/// it, until the agent gives up; the times from the first kill to the incident opening, to the
/// decision and to the service's every replica RUNNING elsewhere (on a healthy daemon) are
/// measured, and the incident's own total (first failure to resumed) is reported beside them;
/// and each step of the path, read from the server's and agents' `timeline` log lines.
#[derive(Args)]
pub struct RecoveryBench {
    /// Trials, each a fresh server and pool whose MPS daemon is killed (1 to 100).
    #[arg(long, default_value_t = 5)]
    trials: u32,
    /// Hosts in the pool (two emulated GPUs each); the service has two replicas per host.
    #[arg(long, default_value_t = 3)]
    hosts: u32,
    /// Override the pool's toleration (default policy: 2000 ms).
    #[arg(long)]
    toleration_ms: Option<u64>,
    /// Path of nvidia-cuda-mps-control (default: PATH, then target/mps).
    #[arg(long)]
    mps_control: Option<std::path::PathBuf>,
    /// How the hosts run the service's tasks: `process`, or `docker` (containers of `--image`
    /// on the Docker Engine at DOCKER_HOST).
    #[arg(long, value_parser = ["process", "docker"], default_value = "process")]
    runtime: String,
    /// The image the tasks run with `--runtime docker` [default: MPSFLEET_TEST_IMAGE].
    #[arg(long, env = "MPSFLEET_TEST_IMAGE")]
    image: Option<String>,
    /// The pool's `restartCopies`: `first-exit` starts a `restart` service's copies at the
    /// daemon's first exit, `confirmed` once its failure is confirmed.
    #[arg(long, value_parser = ["first-exit", "confirmed"], default_value = "first-exit")]
    restart_copies: String,
}

#[allow(clippy::disallowed_methods)] // a benchmark measures wall time
pub(super) fn epoch_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

pub fn recovery(b: RecoveryBench) -> Result<()> {
    let mps = crate::up::find_mps_control(b.mps_control.as_deref()).ok_or_else(|| {
        anyhow::anyhow!("nvidia-cuda-mps-control not found: run 'bash scripts/install-mps.sh'")
    })?;
    anyhow::ensure!((2..=16).contains(&b.hosts), "--hosts must be from 2 to 16, got {}", b.hosts);
    anyhow::ensure!((1..=100).contains(&b.trials), "--trials must be from 1 to 100, got {}", b.trials);
    anyhow::ensure!(
        b.runtime == "process" || b.image.is_some(),
        "--runtime docker needs --image (or MPSFLEET_TEST_IMAGE)"
    );
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let (mut detect, mut decide, mut running, mut recorded, mut acted) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut steps: Vec<(String, Vec<f64>)> = Vec::new();
    let mut bound_s = f64::NAN;
    for trial in 1..=b.trials {
        let dir = std::env::temp_dir().join(format!("mpsf-bench-{}-{trial}", std::process::id()));
        let result = rt.block_on(recovery_trial(&b, &mps, &dir));
        if result.is_err() && std::env::var_os("MPSFLEET_BENCH_KEEP").is_some() {
            eprintln!("kept {} for inspection", dir.display());
            return result.map(|_| ());
        }
        stop_everything_in(&dir);
        let _ = std::fs::remove_dir_all(&dir);
        let t = result?;
        println!(
            "trial {trial}: incident opened {:.3}s, decided {:.3}s, every replica RUNNING on a healthy daemon {:.3}s after \
             the first kill ({} kills); the incident's total {:.3}s",
            t.detected, t.decided, t.running, t.kills, t.recorded
        );
        let words: Vec<String> = t.steps.iter().map(|(n, ms)| format!("{n} {ms:.1}")).collect();
        println!("  steps (ms): {}", words.join(", "));
        for (name, ms) in &t.steps {
            match steps.iter_mut().find(|(n, _)| n == name) {
                Some((_, v)) => v.push(*ms),
                None => steps.push((name.clone(), vec![*ms])),
            }
        }
        acted.push(t.acted_to_running);
        detect.push(t.detected);
        decide.push(t.decided);
        running.push(t.running);
        recorded.push(t.recorded);
        bound_s = t.bound;
    }
    let report = serde_json::json!({
        "bench": "recovery",
        "fault": "daemon killed again after each local restart",
        "trials": b.trials,
        "hosts": b.hosts,
        "runtime": b.runtime,
        "toleration_ms": b.toleration_ms.unwrap_or(mpsfleet_types::policy::HealthPolicy::default().toleration_ms),
        "median_detect_s": (median(detect) * 1000.0).round() / 1000.0,
        "median_decide_s": (median(decide) * 1000.0).round() / 1000.0,
        "max_failure_to_running_s": (running.iter().copied().fold(0.0_f64, f64::max) * 1000.0).round() / 1000.0,
        "stated_bound_total_s": bound_s,
        "median_failure_to_running_s": (median(running.clone()) * 1000.0).round() / 1000.0,
        "median_incident_total_s": (median(recorded) * 1000.0).round() / 1000.0,
        "restart_copies": b.restart_copies,
        "median_acted_to_running_s": (median(acted.clone()) * 1000.0).round() / 1000.0,
        "p99_acted_to_running_s": (quantile_f(acted, 0.99) * 1000.0).round() / 1000.0,
        "p99_failure_to_running_s": (quantile_f(running.clone(), 0.99) * 1000.0).round() / 1000.0,
        "steps": steps.iter().map(|(name, v)| serde_json::json!({
            "step": name,
            "trials": v.len(),
            "median_ms": (median(v.clone()) * 10.0).round() / 10.0,
            "p99_ms": (quantile_f(v.clone(), 0.99) * 10.0).round() / 10.0,
        })).collect::<Vec<_>>(),
    });
    println!("{:<40} {:>10} {:>10}", "STEP", "MEDIAN MS", "P99 MS");
    for (name, v) in &steps {
        println!("{name:<40} {:>10.1} {:>10.1}", median(v.clone()), quantile_f(v.clone(), 0.99));
    }
    println!("{report}");
    Ok(())
}

/// One trial's figures: seconds from the first kill, as measured here, and the incident's own
/// total.
struct Trial {
    detected: f64,
    decided: f64,
    running: f64,
    recorded: f64,
    kills: u32,
    /// The pool's stated total bound for a daemon that exits (restart services).
    bound: f64,
    /// Each step of the path, in ms ([`timeline::steps`]).
    steps: Steps,
    /// From the check the server acted on (the failure confirmed, or the first exit) to every
    /// replica RUNNING, in seconds.
    acted_to_running: f64,
}

async fn recovery_trial(b: &RecoveryBench, mps: &std::path::Path, dir: &std::path::Path) -> Result<Trial> {
    use mpsfleet_types::*;
    std::fs::create_dir_all(dir)?;
    let mut agent_args = format!(
        "--emulate-gpus H200:143771:2 --mps-control {} --heartbeat-ms 200 --stop-tasks-on-exit --runtime {}",
        mps.display(),
        b.runtime
    );
    let mut container = serde_json::json!({"name": "main", "command": ["sleep", "3600"], "stopTimeout": 2,
        "resourceRequirements": [{"type": "GPU", "sharingStrategy": {"nvidiaMps": {"memory": 4096}}}]});
    if let (true, Some(image)) = (b.runtime == "docker", &b.image) {
        agent_args.push_str(" --image-pull-behavior prefer-cached");
        container["image"] = image.clone().into();
    }
    let mut health = HealthPolicy::default();
    if let Some(t) = b.toleration_ms {
        health.toleration_ms = t;
    }
    let create = CreatePool {
        name: "bench".into(),
        mode: Some(OwnershipMode::Managed),
        health_policy: Some(health),
        provider: Some(Provider::local(b.hosts)),
        restart_copies: Some(b.restart_copies.parse().map_err(anyhow::Error::msg)?),
        ..Default::default()
    };
    let fleet = Fleet::start_pool(dir, &agent_args, create, b.hosts, &[], true).await?;
    let result = recovery_measure(&fleet, b, container).await;
    if b.runtime == "docker" {
        let hosts = fleet.host_ids().await?;
        stop_everything_in(dir);
        remove_containers(hosts, dir.join("docker")).await?;
    }
    let mut server = fleet.server;
    let _ = server.kill();
    let _ = server.wait();
    result
}

async fn recovery_measure(fleet: &Fleet, b: &RecoveryBench, container: serde_json::Value) -> Result<Trial> {
    use mpsfleet_types::*;
    let (admin, data) = (&fleet.admin, &fleet.data);
    let wait = |what: &'static str| anyhow::anyhow!("timed out waiting for {what}");
    let deadline = |s| tokio::time::Instant::now() + std::time::Duration::from_secs(s);
    let td = serde_json::json!({"family": "bench", "containerDefinitions": [container]});
    admin.register_taskdef(td.to_string().into_bytes()).await?;
    let replicas = 2 * b.hosts;
    admin
        .create_service(&CreateService {
            name: "bench".into(),
            pool: "bench".into(),
            task_definition: "bench".into(),
            desired_count: replicas,
            resumption: None,
            deployment_configuration: None,
            client_token: None,
            ..Default::default()
        })
        .await?;
    let q = mpsfleet_client::TaskQuery { service: Some("bench".into()), ..Default::default() };
    let until = deadline(120);
    let tasks = loop {
        let ts: Vec<Task> = admin
            .list_tasks(&q)
            .await?
            .into_iter()
            .filter(|t| t.last_status == TaskStatus::Running)
            .collect();
        if ts.len() == replicas as usize {
            break ts;
        }
        anyhow::ensure!(tokio::time::Instant::now() < until, wait("the service"));
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    };
    // Let the hosts settle (first probes of the pool's policy) before the failure.
    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    let victim = &tasks[0];
    let host = admin.describe_host(victim.host_id.as_ref().map_or("", |h| h.as_str())).await?;
    let index = host.gpus.iter().find(|g| Some(&g.gpu_id) == victim.gpu_ids.first()).map_or(0, |g| g.index);
    let record = data.join("hosts").join(&host.hostname).join(format!("mps/log/{index}/daemon.json"));
    let daemon: serde_json::Value = serde_json::from_slice(&std::fs::read(&record)?)?;
    anyhow::ensure!(daemon["pid"].as_u64().is_some(), "no pid in {}", record.display());
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let killed_us = mpsfleet_core::clock::wall_us();
    let killed_at = killed_us / 1000;
    let killer = keep_killing(record, stop.clone());
    let on_daemon: Vec<TaskId> = tasks
        .iter()
        .filter(|t| t.host_id == victim.host_id && t.gpu_ids == victim.gpu_ids)
        .map(|t| t.id)
        .collect();
    // Every replica RUNNING again elsewhere, on a healthy daemon (copies on the failed one,
    // which a `restart` service no longer counts, may still run meanwhile): measured here.
    let until = deadline(90);
    let seen_us = loop {
        let ts = admin.list_tasks(&q).await?;
        let live: Vec<&Task> = ts
            .iter()
            .filter(|t| t.last_status == TaskStatus::Running && t.desired_status == TaskStatus::Running)
            .collect();
        if live.iter().filter(|t| !on_daemon.contains(&t.id)).count() >= replicas as usize {
            break mpsfleet_core::clock::wall_us();
        }
        if tokio::time::Instant::now() >= until {
            stop.store(true, std::sync::atomic::Ordering::SeqCst);
            anyhow::bail!("timed out waiting for the tasks to run again");
        }
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    };
    let incident = loop {
        let list = admin.list_incidents().await?;
        if let Some(i) =
            list.into_iter().find(|i| i.incident.host_id == host.id && i.timing.resumed_at_ms.is_some())
        {
            break i;
        }
        if tokio::time::Instant::now() >= until {
            stop.store(true, std::sync::atomic::Ordering::SeqCst);
            anyhow::bail!("timed out waiting for the incident to say the tasks resumed");
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let kills = killer.join().map_err(|_| anyhow::anyhow!("the killing thread panicked"))?;
    let t = incident.timing;
    let stated = admin.explain_pool("bench").await?.bounds;
    let bound =
        stated.of(FailureKind::DaemonExit).and_then(|k| k.total_ms).map_or(f64::NAN, |ms| ms as f64 / 1000.0);
    let since = |at: Option<u64>| at.map_or(f64::NAN, |t| t.saturating_sub(killed_at) as f64 / 1000.0);
    let lines = |p: &std::path::Path| timeline::read(p);
    let hosts = fleet.data.join("hosts");
    let mut agents: Vec<timeline::Line> = std::fs::read_dir(&hosts)?
        .filter_map(|e| e.ok())
        .flat_map(|e| lines(&e.path().join("agent.log")))
        .collect();
    agents.sort_by_key(|l| l.at_us);
    let gpu = victim.gpu_ids.first().map(ToString::to_string).unwrap_or_default();
    let steps = timeline::steps(&timeline::Logs {
        agent: &lines(&hosts.join(&host.hostname).join("agent.log")),
        server: &lines(&fleet.data.with_file_name("server.log")),
        agents: &agents,
        gpu: &gpu,
        killed_us,
        seen_running_us: seen_us,
    })
    .map_err(|e| anyhow::anyhow!("breaking the recovery into steps: {e}"))?;
    let from = steps.iter().position(|(n, _)| n == "reported to the server").unwrap_or(steps.len());
    let acted_to_running = steps[from..].iter().map(|(_, ms)| ms).sum::<f64>() / 1000.0;
    Ok(Trial {
        steps,
        acted_to_running,
        detected: since(t.detected_at_ms),
        decided: since(t.decided_at_ms),
        running: seen_us.saturating_sub(killed_us) as f64 / 1_000_000.0,
        recorded: t.total_ms.map_or(f64::NAN, |ms| ms as f64 / 1000.0),
        kills,
        bound,
    })
}
