//! The managed-scaling scenario (`mpsfleet sim --scenario scaling`): one managed pool with
//! managed scaling, the real [`Cluster`] on a [`ManualClock`], and a day of demand: standalone
//! MPS tasks arriving on a diurnal curve (quiet at midnight, busiest at noon) plus bursts at
//! 09:00 and 15:00, each running for 10 to 60 minutes and then exiting.
//!
//! Simulated machines boot 60 to 120 s after their launch and join with their launch token;
//! agents heartbeat every 3 s, look for their tasks every second, start them at once and
//! report them stopped when their run ends. A terminated machine is gone at once.
//!
//! The report: how long tasks waited for a host (p50, p99, the longest; to the second, the
//! agents' polling period), the host-hours used (from a machine's launch to its termination,
//! as a cloud bills), and the host-hours an oracle with perfect foresight would have used: at
//! each minute, the fewest hosts that hold every task alive then, packed afresh
//! (`mpsfleet_core::scaling::pack`), never below `minHosts`. Same seed, same report.

use crate::rng::Rng;
use mpsfleet_core::clock::ManualClock;
use mpsfleet_core::scaling::{pack, Shape};
use mpsfleet_server::cluster::{Cluster, ProviderJob, ProviderOutcome};
use mpsfleet_server::provider::ExternalProvider;
use mpsfleet_store::MemoryStore;
use mpsfleet_types::api::HostStatusReport;
use mpsfleet_types::policy::{HostShape, Provider};
use mpsfleet_types::scaling::ManagedScaling;
use mpsfleet_types::*;
use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

const POOL: &str = "gpu";
const GPU_MIB: u64 = 143_771;
const TICK_MS: u64 = 250;

/// The task shapes: (family, MPS MiB, share of arrivals in percent).
const SHAPES: [(&str, u64, u64); 3] = [("infer", 20_480, 70), ("embed", 10_240, 20), ("big", 70_000, 10)];

/// What the scenario is run with.
#[derive(Debug, Clone)]
pub struct ScalingConfig {
    pub max_hosts: u32,
    pub min_hosts: u32,
    pub gpus_per_host: u32,
    pub duration_ms: u64,
    pub seed: u64,
}

/// What it came to.
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ScalingReport {
    pub scenario: &'static str,
    pub seed: u64,
    pub duration_s: u64,
    pub min_hosts: u32,
    pub max_hosts: u32,
    pub tasks_submitted: u64,
    pub tasks_placed: u64,
    pub tasks_still_waiting: u64,
    pub pending_p50_s: f64,
    pub pending_p99_s: f64,
    pub pending_max_s: f64,
    pub host_hours: f64,
    pub oracle_host_hours: f64,
    pub peak_hosts: u32,
    pub scale_out_steps: u64,
    pub scale_in_hosts: u64,
    pub server_errors: u64,
}

impl ScalingReport {
    pub fn render(&self) -> String {
        let ratio = if self.oracle_host_hours > 0.0 { self.host_hours / self.oracle_host_hours } else { 0.0 };
        format!(
            "scenario:             scaling (seed {}, {} s, {}..{} hosts)\n\
             tasks:                {} submitted, {} placed, {} still waiting at the end\n\
             waited for a host:    p50 {:.0} s, p99 {:.0} s, longest {:.0} s\n\
             host-hours:           {:.1} used, {:.1} for an oracle ({ratio:.2}x)\n\
             hosts:                peak {}; {} scale-out step(s), {} host(s) scaled in\n\
             server errors:        {}\n",
            self.seed,
            self.duration_s,
            self.min_hosts,
            self.max_hosts,
            self.tasks_submitted,
            self.tasks_placed,
            self.tasks_still_waiting,
            self.pending_p50_s,
            self.pending_p99_s,
            self.pending_max_s,
            self.host_hours,
            self.oracle_host_hours,
            self.peak_hosts,
            self.scale_out_steps,
            self.scale_in_hosts,
            self.server_errors,
        )
    }
}

/// One simulated machine.
struct Machine {
    name: String,
    /// When it boots and joins; then its host id.
    boots_at_ms: u64,
    token: String,
    id: Option<HostId>,
    /// Its tasks running, and when each ends.
    running: BTreeMap<TaskId, u64>,
}

/// One task of the workload, as the simulation follows it.
struct Job {
    demand: GpuDemand,
    created_ms: u64,
    /// How long it runs once started.
    runs_ms: u64,
    placed_ms: Option<u64>,
    done: bool,
}

fn err(e: impl std::fmt::Display) -> String {
    e.to_string()
}

/// Runs the scenario.
pub fn run(cfg: &ScalingConfig) -> Result<ScalingReport, String> {
    let clock = Arc::new(ManualClock::new(1_000_000));
    let start = 1_000_000;
    let mut c = Cluster::load(Arc::new(MemoryStore::new()), clock.clone(), |_| Ok(())).map_err(err)?;
    let scaling = ManagedScaling { min_hosts: cfg.min_hosts, max_hosts: cfg.max_hosts, ..Default::default() };
    let provider = Provider {
        host_shape: Some(HostShape {
            gpus: cfg.gpus_per_host,
            gpu_memory_mib: GPU_MIB,
            max_mps_clients: 48,
            cpu: None,
            memory_mib: None,
        }),
        managed_scaling: Some(scaling),
        launch_timeout_seconds: Some(600),
        ..Provider::local(cfg.min_hosts)
    };
    let pool = c
        .create_pool(CreatePool {
            name: POOL.into(),
            mode: Some(OwnershipMode::Managed),
            provider: Some(provider),
            ..Default::default()
        })
        .map_err(err)?;
    c.set_provider(pool.name.clone(), Arc::new(ExternalProvider));
    let mut demands = BTreeMap::new();
    for (family, mib, _) in SHAPES {
        let td = serde_json::json!({"family": family, "containerDefinitions": [{"name": "main", "command": ["work"],
            "resourceRequirements": [{"type": "GPU", "sharingStrategy": {"nvidiaMps": {"memory": mib, "maxComputePercent": 25}}}]}]});
        let r = c.register_taskdef(td.to_string().as_bytes()).map_err(err)?;
        demands.insert(family, GpuDemand::Mps { memory_mib: mib, clients: 1, compute_percent: 25 });
        let _ = r;
    }
    let shape = Shape {
        gpus: cfg.gpus_per_host,
        gpu_memory_mib: GPU_MIB,
        max_clients: 48,
        // The scheduler's bound for the pool: none unless it sets computeOvercommitPercent.
        compute_bound: pool.compute_overcommit_percent,
        cpu: None,
        memory_mib: None,
    };

    // Arrivals, minute by minute, from the seed: a diurnal rate sized to the pool (its peak
    // about two thirds of what maxHosts hold), plus two bursts a day.
    let mut rng = Rng::new(cfg.seed);
    let per_host = u64::from(cfg.gpus_per_host) * 6; // about 6 tasks of the mix per GPU's memory
    let peak_alive = (per_host * u64::from(cfg.max_hosts) * 2 / 3) as f64;
    let peak_rate = peak_alive / 35.0; // mean run of 35 minutes
    let minutes = cfg.duration_ms / 60_000;
    let mut arrivals: BTreeMap<u64, Vec<&'static str>> = BTreeMap::new();
    let pick = |rng: &mut Rng| {
        let mut roll = rng.range(0, 99);
        for (family, _, share) in SHAPES {
            if roll < share {
                return family;
            }
            roll -= share;
        }
        SHAPES[0].0
    };
    for m in 0..minutes {
        let day = (m % 1440) as f64 / 1440.0;
        let rate = peak_rate * (0.55 - 0.45 * (2.0 * std::f64::consts::PI * day).cos());
        let mut n = rate.floor() as u64;
        if (rng.range(0, 999) as f64) < (rate - rate.floor()) * 1_000.0 {
            n += 1;
        }
        if m % 1440 == 9 * 60 || m % 1440 == 15 * 60 {
            n += (peak_alive / 3.0) as u64;
        }
        let at = m * 60_000;
        for _ in 0..n {
            let f = pick(&mut rng);
            arrivals.entry(at).or_default().push(f);
        }
    }

    let mut report = ScalingReport {
        scenario: "scaling",
        seed: cfg.seed,
        duration_s: cfg.duration_ms / 1000,
        min_hosts: cfg.min_hosts,
        max_hosts: cfg.max_hosts,
        ..Default::default()
    };
    let mut jobs: BTreeMap<TaskId, Job> = BTreeMap::new();
    let mut machines: Vec<Machine> = Vec::new();
    let mut launched_ms: BTreeMap<String, u64> = BTreeMap::new();
    let mut host_ms: u64 = 0;
    let mut oracle_minutes: u64 = 0;
    let (mut scaled_out, mut scaled_in) = (0u64, 0u64);
    let mut now = 0u64;
    while now < cfg.duration_ms {
        now += TICK_MS;
        clock.advance(Duration::from_millis(TICK_MS));
        let at_ms = start + now;

        // Work arriving this minute: one call per shape.
        if now % 60_000 == TICK_MS {
            if let Some(list) = arrivals.remove(&(now - TICK_MS)) {
                let mut by_family: BTreeMap<&str, u32> = BTreeMap::new();
                for f in list {
                    *by_family.entry(f).or_default() += 1;
                }
                for (family, count) in by_family {
                    let mut left = count;
                    while left > 0 {
                        let n = left.min(100);
                        left -= n;
                        let req = RunTask {
                            task_definition: family.into(),
                            count: n,
                            pool: POOL.into(),
                            ..Default::default()
                        };
                        match c.run_tasks(req) {
                            Ok(out) => {
                                for t in out.tasks {
                                    let runs_ms = rng.range(10, 60) * 60_000;
                                    jobs.insert(
                                        t.id,
                                        Job {
                                            demand: demands[family],
                                            created_ms: at_ms,
                                            runs_ms,
                                            placed_ms: None,
                                            done: false,
                                        },
                                    );
                                    report.tasks_submitted += 1;
                                }
                            }
                            Err(_) => report.server_errors += 1,
                        }
                    }
                }
            }
        }

        // The controllers' tick, and the provider's calls.
        let mut pending_jobs = match c.health_tick() {
            Ok(j) => j,
            Err(_) => {
                report.server_errors += 1;
                Vec::new()
            }
        };
        if now.is_multiple_of(5_000) && c.resync().is_err() {
            report.server_errors += 1;
        }
        pending_jobs.extend(c.take_jobs());
        while let Some(job) = pending_jobs.pop() {
            match &job {
                ProviderJob::Launch { name, token, .. } => {
                    let boots = rng.range(60_000, 120_000);
                    launched_ms.insert(name.clone(), now);
                    machines.push(Machine {
                        name: name.clone(),
                        boots_at_ms: now + boots,
                        token: token.as_ref().map(|t| t.0.clone()).unwrap_or_default(),
                        id: None,
                        running: BTreeMap::new(),
                    });
                }
                ProviderJob::Terminate { name, .. } => {
                    if let Some(i) = machines.iter().position(|m| &m.name == name) {
                        machines.remove(i);
                    }
                    if let Some(t) = launched_ms.remove(name) {
                        host_ms += now - t;
                    }
                    scaled_in += 1;
                }
            }
            match c.provider_done(&job, ProviderOutcome::Done) {
                Ok(more) => pending_jobs.extend(more),
                Err(_) => report.server_errors += 1,
            }
        }

        // Machines boot, heartbeat, take their tasks and finish them.
        for m in machines.iter_mut() {
            if m.id.is_none() && now >= m.boots_at_ms {
                let reg = registration(&m.name, cfg.gpus_per_host);
                match c.register_host_with_token(reg, &m.token) {
                    Ok(r) => m.id = Some(r.host_id),
                    Err(_) => report.server_errors += 1,
                }
            }
            let Some(id) = m.id.clone() else { continue };
            if (now - m.boots_at_ms) % 3_000 < TICK_MS && c.host_status(&id, &heartbeat(&c, &id)).is_err() {
                report.server_errors += 1;
            }
            if now.is_multiple_of(1_000) {
                if let Ok((_, a)) = c.read().assignments(&id) {
                    for t in a.tasks {
                        if t.desired_status == TaskStatus::Stopped || m.running.contains_key(&t.id) {
                            continue;
                        }
                        let Some(j) = jobs.get_mut(&t.id) else { continue };
                        j.placed_ms.get_or_insert(at_ms);
                        m.running.insert(t.id, now + j.runs_ms);
                        let r = report_of(TaskStatus::Running, None);
                        if c.report_task(&id, &t.id.to_string(), r).is_err() {
                            report.server_errors += 1;
                        }
                    }
                }
            }
            let ended: Vec<TaskId> =
                m.running.iter().filter(|(_, end)| **end <= now).map(|(t, _)| *t).collect();
            for t in ended {
                m.running.remove(&t);
                if let Some(j) = jobs.get_mut(&t) {
                    j.done = true;
                }
                let r = report_of(TaskStatus::Stopped, Some(StopCode::EssentialContainerExited));
                if c.report_task(&id, &t.to_string(), r).is_err() {
                    report.server_errors += 1;
                }
            }
        }
        let alive_hosts = launched_ms.len() as u32;
        report.peak_hosts = report.peak_hosts.max(alive_hosts);

        // The oracle, once a minute: every task alive now, packed afresh.
        if now.is_multiple_of(60_000) {
            let alive: Vec<GpuDemand> =
                jobs.values().filter(|j| !j.done && j.created_ms <= at_ms).map(|j| j.demand).collect();
            oracle_minutes += u64::from(pack(&shape, &alive).hosts.max(cfg.min_hosts));
        }
    }
    for t in launched_ms.values() {
        host_ms += cfg.duration_ms - t;
    }
    if let Ok(p) = c.read().pool(POOL) {
        scaled_out = p.events.iter().filter(|e| e.reason == "ScaledOut").count() as u64;
    }
    let mut waits: Vec<u64> = jobs.values().filter_map(|j| j.placed_ms.map(|p| p - j.created_ms)).collect();
    waits.sort_unstable();
    let q = |p: f64| {
        waits.get(((waits.len() as f64 - 1.0) * p).round() as usize).map_or(0.0, |ms| *ms as f64 / 1000.0)
    };
    report.tasks_placed = waits.len() as u64;
    report.tasks_still_waiting = report.tasks_submitted - report.tasks_placed;
    report.pending_p50_s = q(0.50);
    report.pending_p99_s = q(0.99);
    report.pending_max_s = waits.last().map_or(0.0, |ms| *ms as f64 / 1000.0);
    report.host_hours = host_ms as f64 / 3_600_000.0;
    report.oracle_host_hours = oracle_minutes as f64 / 60.0;
    report.scale_out_steps = scaled_out;
    report.scale_in_hosts = scaled_in;
    Ok(report)
}

fn registration(name: &str, gpus: u32) -> HostRegistration {
    HostRegistration {
        pool: PoolName::new(POOL).expect("a valid pool name"),
        hostname: name.to_string(),
        gpus: (0..gpus)
            .map(|g| GpuInventory {
                uuid: GpuUuid::new(format!("GPU-{name}-{g}")).expect("a valid GPU uuid"),
                index: g,
                model: "NVIDIA H200".into(),
                memory_mib: GPU_MIB,
                compute_capability: "9.0".into(),
                max_mps_clients: 48,
            })
            .collect(),
        mps_available: true,
        emulated: true,
        runtime: Default::default(),
        runtime_version: None,
        plugins: Default::default(),
        platform: Default::default(),
    }
}

/// A healthy agent's heartbeat: onboarded, every GPU's MPS daemon answering.
fn heartbeat(c: &Cluster, id: &HostId) -> HostStatusReport {
    let gpus = c
        .read()
        .host(id.as_str())
        .map(|h| h.gpus.iter().map(|g| g.gpu_id.clone()).collect())
        .unwrap_or_default();
    let gpus: Vec<GpuUuid> = gpus;
    HostStatusReport {
        onboarded: true,
        checks: gpus
            .into_iter()
            .map(|g| HostCheck {
                name: "MPS_DAEMON".into(),
                gpu_id: Some(g),
                status: HealthStatus::Ok,
                reason: "daemon answers".into(),
                since_ms: 5,
                restarts: 0,
                first_failure_age_ms: None,
                repair_ages_ms: Vec::new(),
            })
            .collect(),
        heartbeat_ms: Some(3_000),
        ..Default::default()
    }
}

fn report_of(status: TaskStatus, code: Option<StopCode>) -> TaskStateReport {
    TaskStateReport {
        last_status: status,
        health_status: None,
        ready: Some(true),
        stop_code: code,
        stopped_reason: code.map(|_| "the work is done".into()),
        output: None,
        containers: None,
        pull: None,
    }
}
