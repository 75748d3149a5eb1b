//! `mpsfleet bench …`: benchmarks that print one JSON object as their last line.

use anyhow::{bail, Result};
use clap::{Args, Subcommand};
use mpsfleet_core::scheduler::{GpuSpec, HostSpec, PoolConfig, Request, Scheduler};
use mpsfleet_types::{GpuDemand, GpuUuid, HostId, PlacementStrategy, PoolName, Task, TaskDefRef, TaskId};
use std::time::Instant;

#[derive(Subcommand)]
pub enum BenchCommand {
    /// Place a mixed workload on an emulated fleet with the real scheduler.
    Scheduler(SchedulerBench),
    /// Kill an MPS daemon for good in a managed pool and time detection, decision and recovery.
    Recovery(RecoveryBench),
}

#[derive(Args)]
pub struct SchedulerBench {
    #[arg(long, default_value_t = 10_000)]
    hosts: u32,
    #[arg(long, default_value_t = 8)]
    gpus_per_host: u32,
    #[arg(long, default_value_t = 1_000_000)]
    tasks: u32,
    /// GPU memory in MiB (default: an H200's 143,771 MiB).
    #[arg(long, default_value_t = 143_771)]
    gpu_memory_mib: u64,
    #[arg(long, value_parser = ["binpack", "spread"], default_value = "binpack")]
    strategy: String,
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

pub fn run(cmd: BenchCommand) -> Result<()> {
    match cmd {
        BenchCommand::Scheduler(b) => scheduler(b),
        BenchCommand::Recovery(b) => recovery(b),
    }
}

/// splitmix64: a small, seedable generator so that a run is the same workload every time.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// The workload mix: mostly single-client MPS tasks of several sizes and compute limits,
/// some two-client MPS tasks, 1% whole-GPU tasks, and a tenth of the tasks in services.
fn workload_item(rng: &mut Rng) -> (GpuDemand, bool) {
    const MEMORY: [(u64, u64); 6] =
        [(2048, 25), (4096, 25), (8192, 20), (16384, 15), (24576, 10), (40960, 5)];
    const COMPUTE: [u32; 4] = [100, 25, 50, 100];
    let roll = rng.below(1000);
    let demand = if roll < 7 {
        GpuDemand::Whole { count: 1 }
    } else if roll < 10 {
        GpuDemand::Whole { count: 2 }
    } else {
        let mut pick = rng.below(100);
        let memory = MEMORY
            .iter()
            .find(|(_, w)| {
                let hit = pick < *w;
                pick = pick.saturating_sub(*w);
                hit
            })
            .map_or(2048, |(m, _)| *m);
        let compute = COMPUTE[rng.below(4) as usize];
        if roll < 200 {
            GpuDemand::Mps { memory_mib: memory, clients: 2, compute_percent: 2 * compute }
        } else {
            GpuDemand::Mps { memory_mib: memory, clients: 1, compute_percent: compute }
        }
    };
    (demand, rng.below(10) == 0)
}

fn peak_rss_mib() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1).and_then(|kb| kb.parse::<f64>().ok()))
        })
        .map_or(0.0, |kb| kb / 1024.0)
}

#[allow(clippy::disallowed_methods)] // a benchmark measures wall time
fn scheduler(b: SchedulerBench) -> Result<()> {
    if b.hosts == 0 || b.gpus_per_host == 0 {
        bail!("--hosts and --gpus-per-host must be at least 1");
    }
    let strategy =
        if b.strategy == "spread" { PlacementStrategy::Spread } else { PlacementStrategy::Binpack };
    let mut s = Scheduler::new();
    let pool = s.upsert_pool("bench", PoolConfig { strategy, compute_bound: None });
    let build = Instant::now();
    let mut uuids: Vec<GpuUuid> = Vec::with_capacity((b.hosts * b.gpus_per_host) as usize);
    for h in 0..b.hosts {
        let gpus = vec![GpuSpec { memory_mib: b.gpu_memory_mib, max_clients: 48 }; b.gpus_per_host as usize];
        let ix =
            s.add_host(HostSpec { id: HostId::new(format!("h-{h:08x}"))?, pool, mps_available: true, gpus })?;
        s.set_schedulable(ix, true);
        for g in 0..b.gpus_per_host {
            uuids.push(GpuUuid::new(format!("GPU-{h:08x}-{g:04x}"))?);
        }
    }
    let build_s = build.elapsed().as_secs_f64();

    // The workload is generated before the clock starts: the figure is placement alone,
    // plus the task records the server would keep.
    let mut rng = Rng(b.seed);
    let services: Vec<_> = (0..100).map(|i| s.group(&format!("svc-{i}"))).collect();
    let requests: Vec<Request> = (0..b.tasks)
        .map(|_| {
            let (demand, in_service) = workload_item(&mut rng);
            let group = in_service.then(|| services[rng.below(services.len() as u64) as usize]);
            Request { pool, demand, group }
        })
        .collect();
    let family = TaskDefRef::parse("bench:1")?;
    let pool_name = PoolName::new("bench")?;

    let start = Instant::now();
    let mut records: Vec<Task> = Vec::with_capacity(requests.len());
    let (mut placed, mut unplaced) = (0u64, 0u64);
    for (i, r) in requests.iter().enumerate() {
        let outcome = s.place(r);
        let mut task = Task::new(TaskId(i as u64), family.clone(), pool_name.clone(), None, String::new(), 0);
        match outcome {
            Ok(p) => {
                placed += 1;
                task.host_id = Some(s.host_id(p.host).clone());
                task.gpu_ids = p.gpus.iter().map(|&g| uuids[g as usize].clone()).collect();
            }
            Err(why) => {
                unplaced += 1;
                task.pending_reason = Some(why.to_string());
            }
        }
        records.push(task);
    }
    let secs = start.elapsed().as_secs_f64();
    let rate = b.tasks as f64 / secs;
    let report = serde_json::json!({
        "bench": "scheduler",
        "hosts": b.hosts,
        "gpus": b.hosts * b.gpus_per_host,
        "tasks": b.tasks,
        "strategy": b.strategy,
        "placed": placed,
        "unplaced": unplaced,
        "seconds": (secs * 1000.0).round() / 1000.0,
        "placements_per_sec": rate.round(),
        "fleet_build_seconds": (build_s * 1000.0).round() / 1000.0,
        "peak_rss_mib": peak_rss_mib().round(),
    });
    println!("{report}");
    drop(records);
    Ok(())
}

/// `mpsfleet bench recovery`: a managed pool of local hosts with the real MPS daemon; in each
/// trial one daemon is killed for good, and the times from the kill to detection, to the
/// decision and to every affected task RUNNING again are read from the incident.
#[derive(Args)]
pub struct RecoveryBench {
    #[arg(long, default_value_t = 5)]
    trials: u32,
    /// Hosts in the pool (two emulated GPUs each); the service has two replicas per host.
    #[arg(long, default_value_t = 3)]
    hosts: u32,
    /// Override the pool's toleration (default policy: 10000 ms).
    #[arg(long)]
    toleration_ms: Option<u64>,
    /// Path of nvidia-cuda-mps-control (default: PATH, then target/mps).
    #[arg(long)]
    mps_control: Option<std::path::PathBuf>,
}

#[allow(clippy::disallowed_methods)] // a benchmark measures wall time
fn epoch_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

fn recovery(b: RecoveryBench) -> Result<()> {
    let mps = crate::up::find_mps_control(b.mps_control.as_deref()).ok_or_else(|| {
        anyhow::anyhow!("nvidia-cuda-mps-control not found: run 'bash scripts/install-mps.sh'")
    })?;
    anyhow::ensure!((2..=16).contains(&b.hosts), "--hosts must be from 2 to 16, got {}", b.hosts);
    anyhow::ensure!((1..=100).contains(&b.trials), "--trials must be from 1 to 100, got {}", b.trials);
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
        "toleration_ms": b.toleration_ms.unwrap_or(mpsfleet_types::policy::HealthPolicy::default().toleration_ms),
        "median_detect_s": (median(detect) * 1000.0).round() / 1000.0,
        "median_decide_s": (median(decide) * 1000.0).round() / 1000.0,
        "median_failure_to_running_s": (median(running) * 1000.0).round() / 1000.0,
    });
    println!("{report}");
    Ok(())
}

/// SIGTERM (then SIGKILL) every process that mentions `dir`: the trial's server, agents,
/// daemons and tasks.
fn stop_everything_in(dir: &std::path::Path) {
    let needle = dir.display().to_string();
    let find = || -> Vec<i32> {
        let Ok(entries) = std::fs::read_dir("/proc") else { return Vec::new() };
        entries
            .flatten()
            .filter_map(|e| {
                let pid: i32 = e.file_name().to_string_lossy().parse().ok()?;
                let cmd = std::fs::read(e.path().join("cmdline")).ok()?;
                let env = std::fs::read(e.path().join("environ")).unwrap_or_default();
                let hit = String::from_utf8_lossy(&cmd).contains(&needle)
                    || String::from_utf8_lossy(&env).contains(&needle);
                (hit && pid != std::process::id() as i32).then_some(pid)
            })
            .collect()
    };
    for (signal, wait_ms) in [("-TERM", 15_000u64), ("-KILL", 2_000)] {
        for pid in find() {
            let _ = std::process::Command::new("kill")
                .args([signal, &pid.to_string()])
                .stderr(std::process::Stdio::null())
                .status();
        }
        let mut waited = 0;
        while waited < wait_ms && !find().is_empty() {
            std::thread::sleep(std::time::Duration::from_millis(100));
            waited += 100;
        }
    }
}

async fn recovery_trial(
    b: &RecoveryBench,
    mps: &std::path::Path,
    dir: &std::path::Path,
) -> Result<(f64, f64, f64)> {
    use mpsfleet_types::*;
    use std::io::BufRead;
    std::fs::create_dir_all(dir)?;
    // A control binary that fails once `broken` exists: the killed daemon cannot come back.
    let wrapper = dir.join("mps-control");
    let broken = dir.join("broken");
    std::fs::write(
        &wrapper,
        format!("#!/bin/sh\n[ -e {} ] && exit 1\nexec {} \"$@\"\n", broken.display(), mps.display()),
    )?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755))?;
    let agent_args = format!(
        "--emulate-gpus H200:143771:2 --mps-control {} --heartbeat-ms 200 --stop-tasks-on-exit",
        wrapper.display()
    );
    let data = dir.join("server");
    let mut server = std::process::Command::new(std::env::current_exe()?)
        .args(["server", "--listen", "127.0.0.1:0", "--local-agent-args", &agent_args, "--data-dir"])
        .arg(&data)
        .env("MPSFLEET_LOG", "error")
        .stdout(std::process::Stdio::piped())
        .spawn()?;
    let stdout = server.stdout.take().ok_or_else(|| anyhow::anyhow!("no server output"))?;
    let url = std::io::BufReader::new(stdout)
        .lines()
        .map_while(Result::ok)
        .find_map(|l| l.strip_prefix("mpsfleet server listening on ").map(str::to_string))
        .ok_or_else(|| anyhow::anyhow!("the server did not start"))?;
    let token = std::fs::read_to_string(data.join("admin.token"))?.trim().to_string();
    let admin = mpsfleet_client::Client::new(&url, Some(token))?;
    let mut health = HealthPolicy::default();
    if let Some(t) = b.toleration_ms {
        health.toleration_ms = t;
    }
    admin
        .create_pool(&CreatePool {
            name: "bench".into(),
            mode: Some(OwnershipMode::Managed),
            health_policy: Some(health),
            provider: Some(Provider { kind: ProviderKind::Local, exec: None, desired_hosts: b.hosts }),
            ..Default::default()
        })
        .await?;
    let wait = |what: &'static str| anyhow::anyhow!("timed out waiting for {what}");
    let deadline = |s| tokio::time::Instant::now() + std::time::Duration::from_secs(s);
    let until = deadline(120);
    loop {
        let hs = admin.list_hosts(None).await?;
        if hs.iter().filter(|h| h.status == HostStatus::Active && h.health_status == HealthStatus::Ok).count()
            == b.hosts as usize
        {
            break;
        }
        anyhow::ensure!(tokio::time::Instant::now() < until, wait("the hosts"));
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let td = serde_json::json!({"family": "bench", "containerDefinitions": [{"name": "main", "command": ["sleep", "3600"],
        "stopTimeout": 2, "resourceRequirements": [{"type": "GPU", "sharingStrategy": {"nvidiaMps": {"memory": 4096}}}]}]});
    admin.register_taskdef(td.to_string().into_bytes()).await?;
    let replicas = 2 * b.hosts;
    admin
        .create_service(&CreateService {
            name: "bench".into(),
            pool: "bench".into(),
            task_definition: "bench".into(),
            desired_count: replicas,
            resumption: None,
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
    let pid = serde_json::from_slice::<serde_json::Value>(&std::fs::read(&record)?)?["pid"]
        .as_u64()
        .ok_or_else(|| anyhow::anyhow!("no pid in {}", record.display()))?;
    let pipe_dir = data.canonicalize()?.join("hosts").join(&host.hostname).join(format!("mps/{index}"));
    std::fs::write(&broken, pipe_dir.display().to_string())?;
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
    let since =
        |step| incident.first(step).map_or(f64::NAN, |t| t.at_ms.saturating_sub(killed_at) as f64 / 1000.0);
    let result = (since(Step::Detected), since(Step::Decided), since(Step::TasksRunningAgain));
    let _ = server.kill();
    let _ = server.wait();
    Ok(result)
}
