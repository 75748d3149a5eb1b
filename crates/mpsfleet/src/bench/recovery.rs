//! `mpsfleet bench recovery`: time from killing an MPS daemon for good to its tasks running elsewhere.

use super::fleet::{median, remove_containers, stop_everything_in, Fleet};
use anyhow::Result;
use clap::Args;

/// `mpsfleet bench recovery`: a managed pool of local hosts with the real MPS daemon; in each
/// trial one daemon is killed for good, and the times from the kill to detection, to the
/// decision and to every affected task RUNNING again are read from the incident.
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
    let (mut detect, mut decide, mut running) = (Vec::new(), Vec::new(), Vec::new());
    for trial in 1..=b.trials {
        let dir = std::env::temp_dir().join(format!("mpsf-bench-{}-{trial}", std::process::id()));
        let result = rt.block_on(recovery_trial(&b, &mps, &dir));
        if result.is_err() && std::env::var_os("MPSFLEET_BENCH_KEEP").is_some() {
            eprintln!("kept {} for inspection", dir.display());
            return result.map(|_| ());
        }
        stop_everything_in(&dir);
        let _ = std::fs::remove_dir_all(&dir);
        let (d, c, r) = result?;
        println!("trial {trial}: detected {d:.3}s, decided {c:.3}s, all affected tasks RUNNING again {r:.3}s after the kill");
        detect.push(d);
        decide.push(c);
        running.push(r);
    }
    let report = serde_json::json!({
        "bench": "recovery",
        "trials": b.trials,
        "hosts": b.hosts,
        "runtime": b.runtime,
        "toleration_ms": b.toleration_ms.unwrap_or(mpsfleet_types::policy::HealthPolicy::default().toleration_ms),
        "median_detect_s": (median(detect) * 1000.0).round() / 1000.0,
        "median_decide_s": (median(decide) * 1000.0).round() / 1000.0,
        "median_failure_to_running_s": (median(running) * 1000.0).round() / 1000.0,
    });
    println!("{report}");
    Ok(())
}

async fn recovery_trial(
    b: &RecoveryBench,
    mps: &std::path::Path,
    dir: &std::path::Path,
) -> Result<(f64, f64, f64)> {
    use mpsfleet_types::*;
    std::fs::create_dir_all(dir)?;
    // A control binary that refuses the one pipe directory named in `broken` (once that file
    // exists): the killed daemon cannot come back, every other daemon and probe is untouched.
    let wrapper = dir.join("mps-control");
    let broken = dir.join("broken");
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\n[ -e {b} ] && [ \"$CUDA_MPS_PIPE_DIRECTORY\" = \"$(cat {b})\" ] && exit 1\nexec {m} \"$@\"\n",
            b = broken.display(),
            m = mps.display()
        ),
    )?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755))?;
    let mut agent_args = format!(
        "--emulate-gpus H200:143771:2 --mps-control {} --heartbeat-ms 200 --stop-tasks-on-exit --runtime {}",
        wrapper.display(),
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
    let fleet = Fleet::start(dir, &agent_args, "bench", b.hosts, health).await?;
    let result = recovery_measure(&fleet, b, &broken, container).await;
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

async fn recovery_measure(
    fleet: &Fleet,
    b: &RecoveryBench,
    broken: &std::path::Path,
    container: serde_json::Value,
) -> Result<(f64, f64, f64)> {
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
    let (Some(pid), Some(pipe_dir)) = (daemon["pid"].as_u64(), daemon["pipe_dir"].as_str()) else {
        anyhow::bail!("no pid or pipe_dir in {}", record.display());
    };
    std::fs::write(broken, pipe_dir)?;
    let killed_at = epoch_ms();
    std::process::Command::new("kill").args(["-9", &pid.to_string()]).status()?;
    let until = deadline(60);
    let incident = loop {
        let list = admin.list_incidents().await?;
        if let Some(i) = list
            .into_iter()
            .find(|i| i.incident.host_id == host.id && i.incident.has(Step::TasksRunningAgain))
        {
            break i.incident;
        }
        if tokio::time::Instant::now() >= until {
            let tasks = admin.list_tasks(&mpsfleet_client::TaskQuery::default()).await?;
            let brief: Vec<_> = tasks
                .iter()
                .map(|t| {
                    (
                        t.id.to_string(),
                        t.last_status,
                        t.desired_status,
                        t.host_id.clone(),
                        t.stopped_reason.clone(),
                    )
                })
                .collect();
            anyhow::bail!("timed out waiting for the tasks to run again; tasks: {brief:?}");
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    let since = |step| incident.first(step).map_or(f64::NAN, |t| t.saturating_sub(killed_at) as f64 / 1000.0);
    Ok((since(Step::Detected), since(Step::Decided), since(Step::TasksRunningAgain)))
}
