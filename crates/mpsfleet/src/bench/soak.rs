//! `mpsfleet bench soak`: the whole system under random faults, judged at the process level.
//!
//! One server with a managed pool of local hosts (agents with the real MPS daemon, tasks as
//! processes and, given an image, Docker containers), three services (`steady`: restart,
//! `pinned`: fenced, `boxed`: restart, in Docker), and faults drawn from a seed, one at a time:
//! agent SIGKILL and SIGSTOP, MPS daemon kill and hang, server SIGKILL and restart, Docker
//! Engine restart, the hosts' disk nearly full. A sampler reads `/proc` four times a second and
//! records every copy of every task; after each fault the fleet must settle. At the end a pure
//! judge (`soak_judge`) holds every fault to its kind's stated bound and checks every copy the
//! sampler saw. See docs/benchmarks.md "Soak".

use super::recovery::epoch_ms;
use super::soak_faults::{Fault, FaultKind, Scope, Target};
use super::soak_judge::{self, bound_for, History, IncidentRecord, Judgement, ServicePlan, Violation};
use super::soak_probe::{
    data_dir_bytes, inject, processes_of, service_tag, Sampler, Schedule, ServerProc, SERVICE_ENV,
};
use anyhow::{Context, Result};
use clap::Args;
use mpsfleet_client::Client;
use mpsfleet_types::*;
use std::collections::BTreeMap;
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
    setup(&admin, b, dir).await?;
    let services: Vec<(&str, ResumptionBoundary, u32)> =
        SERVICES.iter().copied().filter(|(name, ..)| docker || *name != "boxed").collect();
    let (_, ready) = settle(&admin, &services, Duration::from_secs(180)).await;
    ready.context("the services never got to their replicas within 180 s")?;
    // The bounds every fault is judged by: the pool's own, as the server states them.
    let bounds = admin.explain_pool(POOL).await.context("the pool's recovery bounds")?.bounds;

    let mut planned: Vec<FaultKind> = FaultKind::ALL.to_vec();
    let mut left_out = Vec::new();
    if b.restart_docker.is_none() || !docker {
        planned.retain(|k| *k != FaultKind::DockerRestart);
        left_out.push("docker-restart (no --image and --restart-docker)");
    }
    if !disk {
        planned.retain(|k| *k != FaultKind::DiskFull);
        left_out.push("disk-full (could not mount a tmpfs for the hosts' disk)");
    }
    let sampler = Sampler::start(dir.to_path_buf());
    let mut rng = super::Rng(b.seed.wrapping_mul(0x2545_F491_4F6C_DD1D));
    let mut schedule = Schedule::new(planned.clone(), &mut rng);
    let start_ms = epoch_ms();
    let until = start_ms + (b.minutes * 60_000.0) as u64;
    let mut faults: Vec<Fault> = Vec::new();
    let mut seen: Vec<Violation> = Vec::new();
    let mut incidents: BTreeMap<String, IncidentRecord> = BTreeMap::new();
    let mut max_state = 0u64;
    let mut gone = BTreeMap::new();
    while let Some(kind) = schedule.next(&mut rng, epoch_ms() < until) {
        let wait = b.fault_every * 500 + rng.below(b.fault_every * 1000);
        tokio::time::sleep(Duration::from_millis(wait)).await;
        let mut host = None;
        let target = match kind.scope() {
            Scope::Fleet => Target::Fleet,
            Scope::Host => {
                let live = live_hosts(&admin).await?;
                host = live.get(rng.below(live.len().max(1) as u64) as usize).cloned();
                match &host {
                    Some(h) => Target::Host { id: h.id.clone(), gpu: None },
                    None => Target::Missed("no ACTIVE, healthy host".into()),
                }
            }
        };
        let fenced = fenced_on(&admin, &services, &target).await?;
        let mut fault = Fault::new(kind, target, epoch_ms());
        if fault.happened() {
            inject(&mut fault, host.as_ref(), &mut server, &hosts_dir, b.restart_docker.as_deref(), &mut rng)
                .await?;
        }
        println!("{} ms: {}", fault.at_ms - start_ms, fault.describe());
        schedule.record(kind, fault.happened());
        if !fault.happened() {
            faults.push(fault);
            continue;
        }
        fault.bound = bound_for(kind, &bounds, fenced, fault.held_ms.unwrap_or(0));
        // Give the server the time its bound allows to notice before judging the fleet whole.
        let detect = bounds.of(kind.judged_as()).map_or(5_000, |k| k.detect_ms + 1_000);
        tokio::time::sleep(Duration::from_millis(detect)).await;
        let limit = fault.bound.map_or(240_000, |b| b.closed() + 60_000);
        let (resumed, settled) = settle(&admin, &services, Duration::from_millis(limit)).await;
        fault.resumed_ms = resumed.map(|t| t.saturating_sub(fault.at_ms));
        fault.settled_ms = settled.map(|t| t.saturating_sub(fault.at_ms));
        for i in admin.list_incidents().await? {
            incidents.insert(i.incident.id.clone(), record_of(&i.incident));
        }
        check_fleet(&admin, &hosts_dir, &mut gone, kind, &mut seen).await?;
        let state = data_dir_bytes(&data);
        max_state = max_state.max(state);
        if state > b.max_state_mib << 20 {
            let what = format!("state is {} MiB, past --max-state-mib {}", state >> 20, b.max_state_mib);
            seen.push(Violation { kind: Some(kind), at_ms: epoch_ms(), what });
        }
        faults.push(fault);
    }
    let (observations, samples) = sampler.stop();
    for i in admin.list_incidents().await? {
        incidents.insert(i.incident.id.clone(), record_of(&i.incident));
    }
    server.kill();
    let elapsed = epoch_ms() - start_ms;
    let history = History {
        start_ms,
        services: services
            .iter()
            .map(|(name, r, n)| ServicePlan {
                name: name.to_string(),
                fenced: *r == ResumptionBoundary::Fenced,
                replicas: *n as usize,
            })
            .collect(),
        planned,
        faults,
        incidents: incidents.into_values().collect(),
        observations,
        seen,
    };
    let judgement = soak_judge::judge(&history);
    let injected = history.faults.iter().filter(|f| f.happened()).count();
    println!(
        "soak: {injected} faults judged, {} found no target, in {:.1} min (seed {}, {samples} samples of /proc)",
        history.faults.len() - injected,
        elapsed as f64 / 60_000.0,
        b.seed
    );
    for line in summary(&history, &judgement) {
        println!("{line}");
    }
    for l in &left_out {
        println!("  not drawn: {l}");
    }
    for v in &judgement.violations {
        let kind = v.kind.map_or(String::new(), |k| format!(" [{}]", k.name()));
        println!("VIOLATION at {} ms{kind}: {}", v.at_ms.saturating_sub(start_ms), v.what);
    }
    let mut report = figures(&history, &judgement);
    for (k, v) in [
        ("bench", serde_json::json!("soak")),
        ("minutes", b.minutes.into()),
        ("seed", b.seed.into()),
        ("hosts", b.hosts.into()),
        ("samples", samples.into()),
        ("max_state_mib", (max_state >> 20).into()),
    ] {
        report[k] = v;
    }
    Ok(report)
}

/// What the judge reads of an incident.
fn record_of(i: &Incident) -> IncidentRecord {
    IncidentRecord {
        id: i.id.clone(),
        host: i.host_id.clone(),
        opened_at_ms: i.opened_at_ms,
        breaches: i
            .breaches
            .iter()
            .map(|b| (b.phase.to_string(), b.cause.map(|c| c.as_str().to_owned())))
            .collect(),
    }
}

async fn setup(admin: &Client, b: &SoakBench, dir: &Path) -> Result<()> {
    admin
        .create_pool(&CreatePool {
            name: POOL.into(),
            mode: Some(OwnershipMode::Managed),
            provider: Some(Provider::local(b.hosts)),
            ..Default::default()
        })
        .await?;
    let mps = serde_json::json!([{"type": "GPU", "sharingStrategy": {"nvidiaMps": {"memory": TASK_MIB}}}]);
    for (name, resumption, replicas) in SERVICES {
        let image = match (name, &b.image) {
            ("boxed", None) => continue,
            ("boxed", Some(image)) => Some(image),
            _ => None,
        };
        // Each service its own family, whose tasks say which service and run they are of.
        let env = [{ serde_json::json!({"name": SERVICE_ENV, "value": service_tag(dir, name)}) }];
        let mut main = serde_json::json!({"name": "main", "command": ["sleep", "86400"], "stopTimeout": 2,
            "environment": env, "resourceRequirements": mps});
        if let Some(image) = image {
            main["image"] = image.as_str().into();
        }
        let family = format!("soak-{name}");
        let def = serde_json::json!({"family": family, "containerDefinitions": [main]});
        admin.register_taskdef(def.to_string().into_bytes()).await?;
        admin
            .create_service(&CreateService {
                name: name.into(),
                pool: POOL.into(),
                task_definition: family,
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

/// Waits until every service has its replicas RUNNING on live hosts and no incident is open.
/// Returns when the services were back (the start of their last stretch all there) and when
/// the fleet settled (epoch ms); None for what did not happen within `limit`. The server may be
/// restarting: errors are retried.
async fn settle(
    admin: &Client,
    services: &[(&str, ResumptionBoundary, u32)],
    limit: Duration,
) -> (Option<u64>, Option<u64>) {
    let until = tokio::time::Instant::now() + limit;
    let mut resumed = None;
    loop {
        if let Ok((full, open)) = fleet_state(admin, services).await {
            resumed = if full { resumed.or(Some(epoch_ms())) } else { None };
            if full && !open {
                return (resumed, Some(epoch_ms()));
            }
        }
        if tokio::time::Instant::now() >= until {
            return (resumed, None);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Whether every service is at its replicas on live hosts, and whether an incident is open.
async fn fleet_state(admin: &Client, services: &[(&str, ResumptionBoundary, u32)]) -> Result<(bool, bool)> {
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
    Ok((full, open))
}

/// Whether a task of a fenced service runs where `target` hits.
async fn fenced_on(
    admin: &Client,
    services: &[(&str, ResumptionBoundary, u32)],
    target: &Target,
) -> Result<bool> {
    let fenced = |t: &Task| {
        let group = t.group.as_ref().map(|g| g.as_str());
        services.iter().any(|(name, r, _)| *r == ResumptionBoundary::Fenced && group == Some(*name))
    };
    let tasks = admin.list_tasks(&Default::default()).await?;
    Ok(tasks.iter().filter(|t| fenced(t) && t.desired_status == TaskStatus::Running).any(|t| match target {
        Target::Host { id, .. } => t.host_id.as_ref() == Some(id),
        Target::Fleet => true,
        Target::Missed(_) => false,
    }))
}

/// How long a deregistered host's processes may take to go.
const LEFTOVER_GRACE_MS: u64 = 15_000;

/// After a fault settled: GPU accounting matches the tasks, and no process of a host
/// deregistered a while ago is left (`gone`: when each was first seen deregistered). What is
/// broken is charged to `kind`.
async fn check_fleet(
    admin: &Client,
    hosts_dir: &Path,
    gone: &mut BTreeMap<HostId, u64>,
    kind: FaultKind,
    seen: &mut Vec<Violation>,
) -> Result<()> {
    let mut broken = |what: String| seen.push(Violation { kind: Some(kind), at_ms: epoch_ms(), what });
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
            let first = *gone.entry(h.id.clone()).or_insert_with(epoch_ms);
            let left = processes_of(&hosts_dir.join(&h.hostname));
            if epoch_ms() >= first + LEFTOVER_GRACE_MS && !left.is_empty() {
                broken(format!("deregistered host {} still has processes: {left:?}", h.id));
            }
            continue;
        }
        for g in &h.gpus {
            let accounted = g.total_memory_mib - g.remaining_memory_mib;
            let expected = used.get(&g.gpu_id).copied().unwrap_or(0);
            if accounted != expected {
                broken(format!(
                    "GPU {} of host {}: the scheduler accounts {accounted} MiB, its tasks hold {expected} MiB",
                    g.gpu_id, h.id
                ));
            }
        }
    }
    Ok(())
}

/// The human summary, line by line, times from the start of the run.
fn summary(h: &History, j: &Judgement) -> Vec<String> {
    let rel = |ms: u64| format!("{:.1} s", ms.saturating_sub(h.start_ms) as f64 / 1000.0);
    let mut out = vec![format!(
        "  {:<15}{:>9}{:>9}{:>8}{:>11}{:>11}{:>11}  slowest resumed / settled (settle bound)",
        "kind", "planned", "injected", "judged", "no-target", "violations", "incidents"
    )];
    for (kind, k) in &j.kinds {
        let ms = |v: Option<u64>| v.map_or("-".into(), |v| format!("{v} ms"));
        let slow = format!(
            "{} / {} ({} as {})",
            ms(k.slowest_resumed_ms),
            ms(k.slowest_ms),
            ms(k.bound_ms),
            kind.judged_as()
        );
        out.push(format!(
            "  {:<15}{:>9}{:>9}{:>8}{:>11}{:>11}{:>11}  {slow}",
            kind.name(),
            if k.planned { "yes" } else { "no" },
            k.injected,
            k.judged,
            k.no_target,
            k.violations,
            k.incidents
        ));
    }
    for ((f, v), own) in h.faults.iter().zip(&j.verdicts).zip(&j.explains) {
        let ids: Vec<&str> = own.iter().map(|&i| h.incidents[i].id.as_str()).collect();
        let incidents =
            if ids.is_empty() { String::new() } else { format!("; incidents {}", ids.join(", ")) };
        let judged_as = f.bound.map_or(String::new(), |b| {
            let resumed = f.resumed_ms.map_or("-".into(), |t| t.to_string());
            let fenced = if b.fenced { "fenced " } else { "" };
            format!(
                " [as {}: resumed in {resumed} ms, bound {} ms ({fenced}total)]",
                b.judged_as,
                b.resumed()
            )
        });
        out.push(format!("  {}: {}: {}{judged_as}{incidents}", rel(f.at_ms), f.describe(), v.words()));
    }
    let copies: Vec<String> = j.copies_seen.iter().map(|(s, n)| format!("{s} {n}")).collect();
    out.push(format!(
        "  copies seen: {}; most fenced copies at once: {}",
        copies.join(", "),
        j.max_fenced_copies
    ));
    out
}

/// The final JSON line's figures from the judgement (the caller adds the run's own).
pub(super) fn figures(h: &History, j: &Judgement) -> serde_json::Value {
    let injected = |f: &&Fault| f.happened();
    let by_kind: BTreeMap<&str, serde_json::Value> = j
        .kinds
        .iter()
        .map(|(kind, k)| {
            let v = serde_json::json!({
                "planned": k.planned, "injected": k.injected, "judged": k.judged,
                "no_target": k.no_target, "violations": k.violations, "incidents": k.incidents,
                "max_resumed_ms": k.slowest_resumed_ms, "max_recovery_ms": k.slowest_ms, "bound_ms": k.bound_ms,
            });
            (kind.name(), v)
        })
        .collect();
    serde_json::json!({
        "faults": h.faults.iter().filter(injected).count(),
        "faults_judged": j.verdicts.iter().filter(|v| v.judged()).count(),
        "faults_no_target": h.faults.iter().filter(|f| !f.happened()).count(),
        "faults_by_kind": j.kinds.iter().filter(|(_, k)| k.injected > 0).map(|(kind, k)| (kind.name(), k.injected)).collect::<BTreeMap<_, _>>(),
        "by_kind": by_kind,
        "planned": h.planned.iter().map(|k| k.name()).collect::<Vec<_>>(),
        "incidents": j.explains.iter().map(Vec::len).sum::<usize>(),
        "unexplained_incidents": j.unexplained,
        "max_recovery_ms": h.faults.iter().filter(injected).filter_map(|f| f.settled_ms).max(),
        "max_fenced_copies": j.max_fenced_copies,
        "copies_seen": j.copies_seen,
        "violations": j.violations.len(),
    })
}
