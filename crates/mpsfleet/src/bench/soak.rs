//! `mpsfleet bench soak`: the whole system under random faults, judged at the process level.
//!
//! One server with a managed pool of local hosts (agents with the real MPS daemon, tasks as
//! processes and, given an image, Docker containers), three services (`steady`: restart,
//! `pinned`: fenced, `boxed`: restart, in Docker), and faults drawn from a seed, one at a time:
//! agent SIGKILL and SIGSTOP, MPS daemon kill and hang, server SIGKILL and restart, Docker
//! Engine restart, the hosts' disk nearly full. A sampler reads `/proc` every 100 ms; after
//! each fault the fleet must settle, and is then checked. See docs/benchmarks.md "Soak".

use super::recovery::epoch_ms;
use super::soak_probe::{data_dir_bytes, fill_disk, processes_of, Fault, FaultKind, Sampler, Violations};
use anyhow::{Context, Result};
use clap::Args;
use mpsfleet_client::Client;
use mpsfleet_types::*;
use std::collections::BTreeMap;
use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::time::Duration;

#[derive(Args)]
pub struct SoakBench {
    /// How long faults are injected (fractions allowed: 1.5).
    #[arg(long, default_value_t = 10.0)]
    minutes: f64,
    /// Seed of the fault schedule: the same seed draws the same faults and targets.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Hosts in the pool (2 emulated H200s each), 2 to 8.
    #[arg(long, default_value_t = 3)]
    hosts: u32,
    /// Mean seconds between the end of one fault's recovery and the next fault.
    #[arg(long, default_value_t = 10)]
    fault_every: u64,
    /// Path of nvidia-cuda-mps-control (default: PATH, then target/mps).
    #[arg(long)]
    mps_control: Option<PathBuf>,
    /// Run the `boxed` service in Docker with this image (Engine at DOCKER_HOST); without one,
    /// every task is a process and the Docker faults are not drawn.
    #[arg(long, env = "MPSFLEET_TEST_IMAGE")]
    image: Option<String>,
    /// A shell command that restarts the Docker Engine (e.g. `bash scripts/docker-env.sh
    /// restart-engine`); without one the engine-restart fault is not drawn.
    #[arg(long)]
    restart_docker: Option<String>,
    /// The state the server and hosts may keep, in MiB, before it counts as unbounded.
    #[arg(long, default_value_t = 512)]
    max_state_mib: u64,
}

/// The services and their replicas.
const SERVICES: [(&str, ResumptionBoundary, u32); 3] = [
    ("steady", ResumptionBoundary::Restart, 4),
    ("pinned", ResumptionBoundary::Fenced, 2),
    ("boxed", ResumptionBoundary::Restart, 2),
];
const POOL: &str = "soak";
const TASK_MIB: u64 = 8192;

pub fn soak(b: SoakBench) -> Result<()> {
    anyhow::ensure!(
        (0.1..=1440.0).contains(&b.minutes),
        "--minutes must be from 0.1 to 1440, got {}",
        b.minutes
    );
    anyhow::ensure!((2..=8).contains(&b.hosts), "--hosts must be from 2 to 8, got {}", b.hosts);
    anyhow::ensure!((1..=3600).contains(&b.fault_every), "--fault-every must be from 1 to 3600 s");
    let mps = crate::up::find_mps_control(b.mps_control.as_deref()).ok_or_else(|| {
        anyhow::anyhow!("nvidia-cuda-mps-control not found: run 'bash scripts/install-mps.sh'")
    })?;
    let dir = std::env::temp_dir().join(format!("mpsf-soak-{}", std::process::id()));
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let result = rt.block_on(run(&b, &mps, &dir));
    super::fleet::stop_everything_in(&dir);
    let _ = std::process::Command::new("umount").arg("-l").arg(dir.join("server/hosts")).status();
    if result.is_ok() || std::env::var_os("MPSFLEET_BENCH_KEEP").is_none() {
        let _ = std::fs::remove_dir_all(&dir);
    }
    let report = result?;
    println!("{report}");
    let violations = report["violations"].as_u64().unwrap_or(0);
    anyhow::ensure!(violations == 0, "{violations} invariant violations (listed above)");
    Ok(())
}

/// The server, restartable on its port and data dir.
struct ServerProc {
    child: std::process::Child,
    listen: String,
    data: PathBuf,
    agent_args: String,
}

impl ServerProc {
    fn start(data: &Path, listen: &str, agent_args: &str) -> Result<(ServerProc, String)> {
        let mut child = std::process::Command::new(std::env::current_exe()?)
            .args(["server", "--listen", listen, "--local-agent-args", agent_args, "--data-dir"])
            .arg(data)
            .env("MPSFLEET_LOG", std::env::var("MPSFLEET_LOG").unwrap_or_else(|_| "error".into()))
            .stdout(std::process::Stdio::piped())
            .spawn()?;
        let stdout = child.stdout.take().context("no server output")?;
        let mut lines = std::io::BufReader::new(stdout).lines();
        let url = lines
            .by_ref()
            .map_while(Result::ok)
            .find_map(|l| l.strip_prefix("mpsfleet server listening on ").map(str::to_string))
            .context("the server did not start")?;
        std::thread::spawn(move || lines.for_each(drop));
        let listen = url.trim_start_matches("https://").to_owned();
        Ok((ServerProc { child, listen, data: data.to_path_buf(), agent_args: agent_args.into() }, url))
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    fn restart(&mut self) -> Result<()> {
        self.kill();
        let (again, _) = ServerProc::start(&self.data, &self.listen, &self.agent_args)?;
        *self = again;
        Ok(())
    }
}

async fn run(b: &SoakBench, mps: &Path, dir: &Path) -> Result<serde_json::Value> {
    let data = dir.join("server");
    let hosts_dir = data.join("hosts");
    std::fs::create_dir_all(&hosts_dir)?;
    // The hosts' disk: a tmpfs of its own when this process may mount one, so that filling it
    // fills nothing else.
    let disk = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=1g", "soak-hosts"])
        .arg(&hosts_dir)
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    let docker = b.image.is_some();
    let mut agent_args = format!(
        "--emulate-gpus H200:143771:2 --mps-control {} --heartbeat-ms 200 --stop-tasks-on-exit --runtime {}",
        mps.display(),
        if docker { "docker" } else { "process" }
    );
    if docker {
        agent_args.push_str(" --image-pull-behavior prefer-cached");
    }
    let (mut server, url) = ServerProc::start(&data, "127.0.0.1:0", &agent_args)?;
    let token = std::fs::read_to_string(data.join("admin.token"))?.trim().to_string();
    let ca = std::fs::read(data.join(mpsfleet_server::CA_FILE))?;
    let admin = Client::with_trust(&url, Some(token), &mpsfleet_client::tls::Trust::Ca(ca))?;
    setup(&admin, b).await?;
    let services: Vec<(&str, ResumptionBoundary, u32)> =
        SERVICES.iter().copied().filter(|(name, ..)| docker || *name != "boxed").collect();
    settle(&admin, &services, Duration::from_secs(180)).await.context("the services never ran")?;

    let mut kinds = vec![
        FaultKind::AgentKill,
        FaultKind::AgentStop,
        FaultKind::DaemonKill,
        FaultKind::DaemonHang,
        FaultKind::ServerKill,
    ];
    let mut left_out = Vec::new();
    match (&b.restart_docker, docker) {
        (Some(_), true) => kinds.push(FaultKind::DockerRestart),
        _ => left_out.push("docker-restart (no --image and --restart-docker)"),
    }
    if disk {
        kinds.push(FaultKind::DiskFull);
    } else {
        left_out.push("disk-full (could not mount a tmpfs for the hosts' disk)");
    }
    let violations = Violations::default();
    let sampler = Sampler::start(hosts_dir.clone(), violations.clone());
    let mut rng = super::Rng(b.seed.wrapping_mul(0x2545_F491_4F6C_DD1D));
    let start_ms = epoch_ms();
    let until = start_ms + (b.minutes * 60_000.0) as u64;
    let mut faults: Vec<Fault> = Vec::new();
    let mut max_state = 0u64;
    let mut gone = BTreeMap::new();
    while epoch_ms() < until {
        sampler.watch(&admin, &services).await;
        let wait = b.fault_every * 500 + rng.below(b.fault_every * 1000);
        tokio::time::sleep(Duration::from_millis(wait)).await;
        let kind = kinds[rng.below(kinds.len() as u64) as usize];
        let live = live_hosts(&admin).await?;
        let Some(host) = live.get(rng.below(live.len().max(1) as u64) as usize).cloned() else { continue };
        let mut fault = Fault::new(kind, &host, epoch_ms());
        inject(&mut fault, &mut server, &hosts_dir, b, &mut rng).await?;
        println!("{} ms: {}", fault.at_ms - start_ms, fault.describe());
        // Give the server the time its bound allows to notice before judging the fleet whole.
        tokio::time::sleep(noticed_within(&admin, fault.kind).await).await;
        let settled = settle(&admin, &services, Duration::from_secs(240)).await;
        fault.settled_ms = settled.ok().map(|t| t.saturating_sub(fault.at_ms));
        sampler.watch(&admin, &services).await;
        judge(&admin, &mut fault, &violations).await?;
        check_fleet(&admin, &hosts_dir, &mut gone, &violations).await?;
        let state = data_dir_bytes(&data);
        max_state = max_state.max(state);
        if state > b.max_state_mib << 20 {
            violations.add(format!("state is {} MiB, past --max-state-mib {}", state >> 20, b.max_state_mib));
        }
        faults.push(fault);
    }
    let max_copies = sampler.stop();
    incidents_without_faults(&admin, &faults, start_ms, &violations).await?;
    server.kill();
    let elapsed = epoch_ms() - start_ms;
    Ok(report(b, &faults, &violations, &left_out, (max_state, max_copies), elapsed))
}

/// How long after a fault the server may take to notice it: the stated detect bound of its
/// kind and a second; 5 s for faults with no stated bound.
async fn noticed_within(admin: &Client, kind: FaultKind) -> Duration {
    let detect = match (kind.failure(), admin.explain_pool(POOL).await) {
        (Some(k), Ok(e)) => e.bounds.of(k).map(|b| b.detect_ms + 1_000),
        _ => None,
    };
    Duration::from_millis(detect.unwrap_or(5_000))
}

async fn setup(admin: &Client, b: &SoakBench) -> Result<()> {
    admin
        .create_pool(&CreatePool {
            name: POOL.into(),
            mode: Some(OwnershipMode::Managed),
            provider: Some(Provider::local(b.hosts)),
            ..Default::default()
        })
        .await?;
    let mps = serde_json::json!([{"type": "GPU", "sharingStrategy": {"nvidiaMps": {"memory": TASK_MIB}}}]);
    let proc_def = serde_json::json!({"family": "soak-proc", "containerDefinitions": [
        {"name": "main", "command": ["sleep", "86400"], "stopTimeout": 2, "resourceRequirements": mps}]});
    admin.register_taskdef(proc_def.to_string().into_bytes()).await?;
    if let Some(image) = &b.image {
        let boxed = serde_json::json!({"family": "soak-box", "containerDefinitions": [
            {"name": "main", "image": image, "command": ["sleep", "86400"], "stopTimeout": 2, "resourceRequirements": mps}]});
        admin.register_taskdef(boxed.to_string().into_bytes()).await?;
    }
    for (name, resumption, replicas) in SERVICES {
        if name == "boxed" && b.image.is_none() {
            continue;
        }
        admin
            .create_service(&CreateService {
                name: name.into(),
                pool: POOL.into(),
                task_definition: if name == "boxed" { "soak-box" } else { "soak-proc" }.into(),
                desired_count: replicas,
                resumption: Some(resumption),
                ..Default::default()
            })
            .await?;
    }
    Ok(())
}

/// Hosts ACTIVE and healthy.
async fn live_hosts(admin: &Client) -> Result<Vec<HostView>> {
    Ok(admin
        .list_hosts(Some(POOL))
        .await?
        .into_iter()
        .filter(|h| h.status == HostStatus::Active && h.health_status == HealthStatus::Ok)
        .collect())
}

/// Waits until every service has its replicas RUNNING on live hosts and no incident is open;
/// returns when (epoch ms). The server may be restarting: errors are retried.
async fn settle(
    admin: &Client,
    services: &[(&str, ResumptionBoundary, u32)],
    limit: Duration,
) -> Result<u64> {
    let until = tokio::time::Instant::now() + limit;
    loop {
        if let Ok(true) = settled(admin, services).await {
            return Ok(epoch_ms());
        }
        anyhow::ensure!(tokio::time::Instant::now() < until, "the fleet did not settle within {limit:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn settled(admin: &Client, services: &[(&str, ResumptionBoundary, u32)]) -> Result<bool> {
    let live: Vec<HostId> = live_hosts(admin).await?.into_iter().map(|h| h.id).collect();
    let tasks = admin.list_tasks(&Default::default()).await?;
    let open = admin.list_incidents().await?.iter().any(|i| i.incident.resolved_at_ms.is_none());
    let full = services.iter().all(|(name, _, replicas)| {
        let running = tasks.iter().filter(|t| {
            t.group.as_ref().is_some_and(|g| g.as_str() == *name)
                && t.last_status == TaskStatus::Running
                && t.desired_status == TaskStatus::Running
                && t.host_id.as_ref().is_some_and(|h| live.contains(h))
        });
        running.count() == *replicas as usize
    });
    Ok(full && !open)
}

async fn inject(
    fault: &mut Fault,
    server: &mut ServerProc,
    hosts_dir: &Path,
    b: &SoakBench,
    rng: &mut super::Rng,
) -> Result<()> {
    let host_dir = hosts_dir.join(&fault.hostname);
    let hold = Duration::from_millis(3_000 + rng.below(22_000));
    match fault.kind {
        FaultKind::AgentKill | FaultKind::AgentStop => {
            let agent = processes_of(&host_dir).into_iter().find(|(_, cmd)| cmd.contains(" agent "));
            let Some((pid, _)) = agent else {
                fault.note = Some("no agent process found".into());
                return Ok(());
            };
            kill_or_pause(pid, fault.kind == FaultKind::AgentKill, hold, fault).await;
        }
        FaultKind::DaemonKill | FaultKind::DaemonHang => {
            let gpu = rng.below(2);
            let record = host_dir.join(format!("mps/log/{gpu}/daemon.json"));
            let pid = std::fs::read(&record)
                .ok()
                .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
                .and_then(|v| v["pid"].as_u64())
                .and_then(|p| u32::try_from(p).ok())
                .filter(|&p| {
                    mpsfleet_proc::cmdline(p)
                        .is_some_and(|c| String::from_utf8_lossy(&c).contains("mps-control"))
                });
            let Some(pid) = pid else {
                fault.note = Some(format!("no live daemon in {}", record.display()));
                return Ok(());
            };
            fault.gpu = Some(gpu as u32);
            kill_or_pause(pid, fault.kind == FaultKind::DaemonKill, hold, fault).await;
        }
        FaultKind::ServerKill => {
            server.kill();
            tokio::time::sleep(Duration::from_millis(500 + rng.below(2_500))).await;
            server.restart()?;
        }
        FaultKind::DockerRestart => {
            let cmd = b.restart_docker.as_deref().unwrap_or("true");
            let ok = std::process::Command::new("sh").args(["-c", cmd]).status().is_ok_and(|s| s.success());
            anyhow::ensure!(ok, "--restart-docker failed: {cmd}");
        }
        FaultKind::DiskFull => {
            let filler = fill_disk(hosts_dir, 1 << 20)?;
            tokio::time::sleep(hold).await;
            let _ = std::fs::remove_file(filler);
            fault.held_ms = Some(hold.as_millis() as u64);
        }
    }
    Ok(())
}

/// SIGKILL, or SIGSTOP held for `hold` and then SIGCONT.
async fn kill_or_pause(pid: u32, kill: bool, hold: Duration, fault: &mut Fault) {
    use nix::sys::signal::Signal;
    if kill {
        signal(pid, Signal::SIGKILL);
    } else {
        signal(pid, Signal::SIGSTOP);
        tokio::time::sleep(hold).await;
        signal(pid, Signal::SIGCONT);
        fault.held_ms = Some(hold.as_millis() as u64);
    }
}

fn signal(pid: u32, sig: nix::sys::signal::Signal) {
    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), sig);
}

/// A fault's recovery against the pool's stated bound for its kind: the services back at
/// their replicas within the total bound (plus how long the fault was held), unless an
/// incident recorded a breach with its cause.
async fn judge(admin: &Client, fault: &mut Fault, violations: &Violations) -> Result<()> {
    let Some(kind) = fault.kind.failure() else { return Ok(()) };
    let bounds = admin.explain_pool(POOL).await?.bounds;
    // The fenced service's bound where it is longer: every service must be back.
    let bound = bounds.of(kind).and_then(|k| k.total_ms.max(k.total_fenced_ms));
    fault.bound_ms = bound.map(|b| b + fault.held_ms.unwrap_or(0));
    let incidents: Vec<IncidentView> = admin
        .list_incidents()
        .await?
        .into_iter()
        .filter(|i| i.incident.host_id == fault.host && i.incident.opened_at_ms + 1_000 >= fault.at_ms)
        .collect();
    fault.incidents = incidents.len();
    let causes: Vec<String> = incidents
        .iter()
        .flat_map(|i| &i.incident.breaches)
        .filter_map(|b| b.cause.map(|c| format!("{c:?}")))
        .collect();
    fault.causes = causes.clone();
    match (fault.settled_ms, fault.bound_ms) {
        (None, _) => violations.add(format!("{}: the services never got back to their replicas", fault.describe())),
        (Some(took), Some(bound)) if took > bound && causes.is_empty() => violations.add(format!(
            "{}: the services were back after {took} ms, past the stated bound of {bound} ms, and no breach names a cause",
            fault.describe()
        )),
        _ => {}
    }
    Ok(())
}

/// How long a deregistered host's processes may take to go.
const LEFTOVER_GRACE_MS: u64 = 15_000;

/// After a fault settled: GPU accounting matches the tasks, and no process of a host
/// deregistered a while ago is left (`gone`: when each was first seen deregistered).
async fn check_fleet(
    admin: &Client,
    hosts_dir: &Path,
    gone: &mut BTreeMap<HostId, u64>,
    violations: &Violations,
) -> Result<()> {
    let tasks = admin.list_tasks(&Default::default()).await?;
    let mut used: BTreeMap<&GpuUuid, u64> = BTreeMap::new();
    for t in tasks.iter().filter(|t| t.last_status != TaskStatus::Stopped) {
        for g in &t.gpu_ids {
            *used.entry(g).or_default() += TASK_MIB;
        }
    }
    let hosts = admin.list_hosts(None).await?;
    for h in &hosts {
        if h.status == HostStatus::Deregistered {
            // Its processes have had their time to go once it was seen gone a while ago.
            let seen = *gone.entry(h.id.clone()).or_insert_with(epoch_ms);
            let left = processes_of(&hosts_dir.join(&h.hostname));
            if epoch_ms() >= seen + LEFTOVER_GRACE_MS && !left.is_empty() {
                violations.add(format!("deregistered host {} still has processes: {left:?}", h.id));
            }
            continue;
        }
        for g in &h.gpus {
            let accounted = g.total_memory_mib - g.remaining_memory_mib;
            let expected = used.get(&g.gpu_id).copied().unwrap_or(0);
            if accounted != expected {
                violations.add(format!(
                    "GPU {} of host {}: the scheduler accounts {accounted} MiB, its tasks hold {expected} MiB",
                    g.gpu_id, h.id
                ));
            }
        }
    }
    Ok(())
}

/// Every incident opened during the run is on a host a fault was injected into, after it.
async fn incidents_without_faults(
    admin: &Client,
    faults: &[Fault],
    start_ms: u64,
    violations: &Violations,
) -> Result<()> {
    for i in admin.list_incidents().await? {
        let inc = &i.incident;
        if inc.opened_at_ms < start_ms {
            continue;
        }
        let explained = faults.iter().any(|f| f.host == inc.host_id && inc.opened_at_ms + 1_000 >= f.at_ms);
        if !explained {
            violations.add(format!(
                "incident {} on host {} opened with no fault injected there",
                inc.id, inc.host_id
            ));
        }
    }
    Ok(())
}

fn report(
    b: &SoakBench,
    faults: &[Fault],
    violations: &Violations,
    left_out: &[&str],
    (max_state, max_copies): (u64, usize),
    elapsed_ms: u64,
) -> serde_json::Value {
    let mut by_kind: BTreeMap<&str, (usize, Vec<u64>, usize)> = BTreeMap::new();
    for f in faults {
        let e = by_kind.entry(f.kind.name()).or_default();
        e.0 += 1;
        e.1.extend(f.settled_ms);
        e.2 += f.incidents;
    }
    println!("soak: {} faults in {:.1} min (seed {})", faults.len(), elapsed_ms as f64 / 60_000.0, b.seed);
    for (kind, (n, times, incidents)) in &by_kind {
        let worst = times.iter().max().copied().unwrap_or(0);
        println!("  {kind}: {n}, {incidents} incidents, back to every replica in at most {worst} ms");
    }
    for f in faults.iter().filter(|f| f.bound_ms.is_some()) {
        println!(
            "  {} recovered in {} ms, bound {} ms{}",
            f.describe(),
            f.settled_ms.map_or("-".into(), |t| t.to_string()),
            f.bound_ms.unwrap_or(0),
            if f.causes.is_empty() {
                String::new()
            } else {
                format!(" (breach causes: {})", f.causes.join(", "))
            }
        );
    }
    for l in left_out {
        println!("  not drawn: {l}");
    }
    let list = violations.list();
    for v in &list {
        println!("VIOLATION {v}");
    }
    serde_json::json!({
        "bench": "soak",
        "minutes": b.minutes,
        "seed": b.seed,
        "hosts": b.hosts,
        "faults": faults.len(),
        "faults_by_kind": by_kind.iter().map(|(k, v)| (k.to_string(), v.0)).collect::<BTreeMap<_, _>>(),
        "incidents": faults.iter().map(|f| f.incidents).sum::<usize>(),
        "max_recovery_ms": faults.iter().filter_map(|f| f.settled_ms).max(),
        "max_state_mib": max_state >> 20,
        "max_fenced_copies": max_copies,
        "violations": list.len(),
    })
}
