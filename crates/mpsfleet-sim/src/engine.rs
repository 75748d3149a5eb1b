//! The simulation loop: the real [`Cluster`] on a [`ManualClock`], driven the way the server's
//! loops drive it (a health tick every 250 ms, a resync every 5 s, provider calls outside the
//! cluster, their outcomes fed back), against simulated hosts that behave like the agent.
//!
//! Everything happens in one thread, in virtual time, from one queue ordered by (time,
//! insertion order). Randomness comes only from the seed, through per-host and per-provider
//! streams; nothing iterates a `HashMap`. The server itself draws random ids (hosts,
//! incidents); the simulator never lets those leak into what it records, names hosts by its
//! own labels, and makes task ids a function of the seed (see `reseed_task_ids`).

use crate::config::{fmt_time, plan_faults, Config, Fault, FaultKind, WARMUP_MS};
use crate::invariants::{self, Checker, GpuLoad, Violation};
use crate::report::{Shortfall, Stats};
use crate::rng::Rng;
use mpsfleet_core::clock::ManualClock;
use mpsfleet_core::lifecycle::mps::{
    self as mh, pool_mps_policy, DaemonHealth, Effect, Event as MpsEvent, MpsPolicy, Phase,
};
use mpsfleet_server::cluster::{Cluster, ProviderJob, ProviderOutcome};
use mpsfleet_server::provider::{AttemptRecord, ExternalProvider, Retry};
use mpsfleet_store::{MemoryStore, Revision, Store};
use mpsfleet_types::api::HostStatusReport;
use mpsfleet_types::policy::Provider;
use mpsfleet_types::*;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;

/// An H100's memory and the MPS client limit on Volta and newer.
pub const GPU_MEMORY_MIB: u64 = 81_559;
pub const MAX_MPS_CLIENTS: u32 = 48;
/// The server's loops (crates/mpsfleet-server/src/lib.rs).
pub const HEALTH_TICK_MS: u64 = mpsfleet_server::HEALTH_INTERVAL.as_millis() as u64;
pub const RESYNC_MS: u64 = mpsfleet_server::RESYNC_INTERVAL.as_millis() as u64;
/// A long-poll answer reaching its agent.
pub const FETCH_LATENCY_MS: u64 = 20;
/// Stopping a daemon and starting it again.
pub const DAEMON_RESTART_MS: u64 = 300;
/// From "start" to RUNNING, and from "stop" to STOPPED.
pub const TASK_START_MS: (u64, u64) = (2_000, 10_000);
pub const TASK_STOP_MS: (u64, u64) = (500, 3_000);
/// MPS clients exit this long after their server reported a fatal fault.
pub const CLIENT_EXIT_MS: u64 = 1_000;

pub const MANAGED_POOL: &str = "gpu";
pub const SELF_POOL: &str = "gpu-self";

/// A task definition the workload uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Demand {
    pub mps: bool,
    pub memory_mib: u64,
}

/// One service of the workload.
#[derive(Debug, Clone)]
pub struct SvcSpec {
    pub name: String,
    pub pool: String,
    pub family: &'static str,
    pub desired: u32,
    pub resumption: ResumptionBoundary,
}

/// The task definitions: two MPS shapes and one whole-GPU job.
pub const FAMILIES: [(&str, Demand); 3] = [
    ("infer", Demand { mps: true, memory_mib: 20_480 }),
    ("embed", Demand { mps: true, memory_mib: 10_240 }),
    ("train", Demand { mps: false, memory_mib: 0 }),
];

/// Per pool: `restart` inference on half its GPUs, `fenced` embedding on half, whole-GPU
/// training on an eighth: about half the fleet's memory, so there is room to recover.
pub fn workload(pool: &str, hosts: u32, gpus_per_host: u32) -> Vec<SvcSpec> {
    let gpus = hosts * gpus_per_host;
    if gpus == 0 {
        return Vec::new();
    }
    let svc = |suffix: &str, family, desired: u32, resumption| SvcSpec {
        name: format!("{pool}-{suffix}"),
        pool: pool.to_string(),
        family,
        desired: desired.max(1),
        resumption,
    };
    vec![
        svc("infer", "infer", gpus / 2, ResumptionBoundary::Restart),
        svc("embed", "embed", gpus / 2, ResumptionBoundary::Fenced),
        svc("train", "train", gpus / 8, ResumptionBoundary::Restart),
    ]
}

/// One GPU's MPS control daemon, as the world has it and as the agent's state machine sees it.
struct Daemon {
    running: bool,
    hung: bool,
    hang_for_good: bool,
    broken_for_good: bool,
    /// The MPS server is in FAULT; `true`: a client is stuck and keeps it there.
    fault: Option<bool>,
    xid_since: Option<u64>,
    health: DaemonHealth,
    /// Bumped on every (re)start and crash: results of older ones are dropped.
    gen: u64,
    /// The probe event that counts; older queued probes are dropped.
    probe_token: u64,
    probe_queued: bool,
}

impl Daemon {
    /// Probing changes nothing: the daemon answers and the check is OK with no failures.
    fn steady(&self) -> bool {
        self.running
            && !self.hung
            && self.fault.is_none()
            && self.health.phase == Phase::Running
            && self.health.check.status == HealthStatus::Ok
            && self.health.check.consecutive_failures == 0
    }
    fn answers(&self) -> bool {
        self.running && !self.hung
    }
}

/// A task process on a simulated host.
struct LocalTask {
    gpus: Vec<usize>,
    demand: Demand,
    service: Option<ServiceName>,
    running_since: Option<u64>,
    stopping: bool,
    /// The stop code the server gave when it asked the task to stop; reported back with the
    /// exit, as the agent does.
    stop_code: Option<StopCode>,
}

struct SimHost {
    label: String,
    name: String,
    /// The one-time registration token the provider launched the host with (a replacement).
    token: Option<String>,
    pool: usize,
    slot: Option<u32>,
    id: Option<HostId>,
    up: bool,
    partitioned_until: Option<u64>,
    gpu_uuids: Vec<GpuUuid>,
    daemons: Vec<Daemon>,
    tasks: BTreeMap<TaskId, LocalTask>,
    /// Tasks this host started and finished: never started again.
    finished: BTreeSet<TaskId>,
    outbox: Vec<(TaskId, TaskStateReport)>,
    policy: MpsPolicy,
    rng: Rng,
    /// The last injected fault: when and what.
    fault: Option<(u64, &'static str)>,
    fetch_queued: bool,
    /// Delay of the first heartbeat after boot.
    phase_ms: u64,
    /// Terminated or vanished: never comes back.
    gone: bool,
}

enum Ev {
    HealthTick,
    Resync,
    Fault(usize),
    Boot(usize),
    Heartbeat(usize),
    Probe { h: usize, g: usize, token: u64 },
    ProbeResult { h: usize, g: usize, gen: u64, ev: MpsEvent },
    RestartDone { h: usize, g: usize, gen: u64 },
    Fetch(usize),
    Started { h: usize, t: TaskId },
    Stopped { h: usize, t: TaskId },
    ClientsExit { h: usize, g: usize },
    Heal(usize),
    ProviderDone { job: ProviderJob, ok: bool, epoch: u32, launch: Option<usize> },
    ProviderRetry { job: ProviderJob, record: AttemptRecord, epoch: u32 },
}

/// Per service, what the world really runs.
struct SvcWorld {
    desired: u32,
    pool: String,
    demand: Demand,
    fenced: bool,
    running: u32,
    last_ms: u64,
    /// Why the missing replicas are missing, as classified at the end of the last step that
    /// could change it; the shortfall accrues by these until the next classification.
    shortfall: Vec<(Shortfall, u32)>,
}

/// A pool's room for one more task, for the shortfall breakdown.
struct PoolRoom {
    mps: bool,
    whole_gpu: bool,
    /// An unresolved incident of the pool has asked for a replacement host that is not yet
    /// running the tasks again.
    replacement_coming: bool,
}

/// A service task as the server has it (from the change feed), while it is not STOPPED.
struct SrvTask {
    stop_requested: bool,
    host: Option<HostId>,
    last: TaskStatus,
}

pub struct Sim {
    pub cfg: Config,
    pub faults: Vec<Fault>,
    store: Arc<MemoryStore>,
    clock: Arc<ManualClock>,
    cluster: Option<Cluster>,
    now: u64,
    queue: BTreeMap<(u64, u64), Ev>,
    seq: u64,
    hosts: Vec<SimHost>,
    by_id: BTreeMap<HostId, usize>,
    by_name: BTreeMap<String, usize>,
    slots: BTreeMap<u32, usize>,
    pool_names: Vec<PoolName>,
    demands: BTreeMap<TaskDefRef, Demand>,
    svcs: BTreeMap<ServiceName, SvcWorld>,
    provider_rng: Rng,
    /// (fail percent, extra delay, until)
    provider_degraded: Option<(u32, u64, u64)>,
    /// Bumped on every control-plane restart: outcomes of calls made before are not reported.
    epoch: u32,
    feed_rev: Revision,
    incidents: BTreeMap<String, Incident>,
    pub trace: Vec<String>,
    pub stats: Stats,
    pub checker: Checker,
    pub violation: Option<Violation>,
    /// Services below their count with spare capacity, since when.
    below_since: BTreeMap<ServiceName, u64>,
    /// The server's live service tasks by service, mirrored from the change feed.
    srv_tasks: BTreeMap<ServiceName, BTreeMap<TaskId, SrvTask>>,
    /// Stop times of failed tasks per service, as the server's crash-loop hold-back counts them.
    svc_failures: BTreeMap<ServiceName, VecDeque<u64>>,
    /// The unresolved incident of each host, by incident id.
    open_incidents: BTreeMap<HostId, String>,
    /// Services whose shortfall is classified again at the end of this step; `all_dirty`: all.
    dirty_svcs: BTreeSet<ServiceName>,
    all_dirty: bool,
    /// Index of the event being processed, for the report.
    pub steps: u64,
}

fn err(e: impl std::fmt::Display) -> String {
    e.to_string()
}

impl Sim {
    pub fn new(cfg: Config) -> Result<Sim, String> {
        let faults = cfg.faults.clone().unwrap_or_else(|| plan_faults(&cfg));
        let store = Arc::new(MemoryStore::new());
        let clock = Arc::new(ManualClock::new(0));
        let mut cluster = Cluster::load(store.clone(), clock.clone(), |_| Ok(())).map_err(err)?;
        cluster.reseed_task_ids(cfg.seed);
        let mut sim = Sim {
            provider_rng: Rng::fork(cfg.seed, "provider"),
            cfg,
            faults,
            store,
            clock,
            cluster: Some(cluster),
            now: 0,
            queue: BTreeMap::new(),
            seq: 0,
            hosts: Vec::new(),
            by_id: BTreeMap::new(),
            by_name: BTreeMap::new(),
            slots: BTreeMap::new(),
            pool_names: Vec::new(),
            demands: BTreeMap::new(),
            svcs: BTreeMap::new(),
            provider_degraded: None,
            epoch: 0,
            feed_rev: 0,
            incidents: BTreeMap::new(),
            trace: Vec::new(),
            stats: Stats::default(),
            checker: Checker::default(),
            violation: None,
            below_since: BTreeMap::new(),
            srv_tasks: BTreeMap::new(),
            svc_failures: BTreeMap::new(),
            open_incidents: BTreeMap::new(),
            dirty_svcs: BTreeSet::new(),
            all_dirty: true,
            steps: 0,
        };
        sim.setup()?;
        Ok(sim)
    }

    fn c(&mut self) -> &mut Cluster {
        self.cluster.as_mut().expect("the cluster is loaded between steps")
    }

    fn at(&mut self, t: u64, ev: Ev) {
        self.seq += 1;
        self.queue.insert((t.max(self.now), self.seq), ev);
    }

    fn log(&mut self, line: String) {
        self.trace.push(format!("{} {line}", fmt_time(self.now)));
    }

    /// Pools, task definitions, services and the initial hosts.
    fn setup(&mut self) -> Result<(), String> {
        let (managed, self_managed) = crate::config::pool_sizes(self.cfg.hosts);
        let mut specs = Vec::new();
        for (i, (name, mode, size)) in [
            (MANAGED_POOL, OwnershipMode::Managed, managed),
            (SELF_POOL, OwnershipMode::SelfManaged, self_managed),
        ]
        .into_iter()
        .enumerate()
        {
            if size == 0 && i > 0 {
                continue;
            }
            let provider = (mode == OwnershipMode::Managed).then_some(Provider::local(size));
            let pool = self
                .c()
                .create_pool(CreatePool {
                    name: name.to_string(),
                    mode: Some(mode),
                    provider,
                    ..CreatePool::default()
                })
                .map_err(err)?;
            if mode == OwnershipMode::Managed {
                self.c().set_provider(pool.name.clone(), Arc::new(ExternalProvider));
            }
            for part in [
                ("detector", mpsfleet_core::explain::explain(&pool).detector.what),
                ("decision", mpsfleet_core::explain::explain(&pool).decision.what),
                ("replacement", mpsfleet_core::explain::explain(&pool).replacement.what),
                ("resumption", mpsfleet_core::explain::explain(&pool).resumption.what),
            ] {
                self.checker.checks += 1;
                if part.1.trim().is_empty() {
                    return Err(format!("pool {name}: explain has no {}", part.0));
                }
            }
            self.pool_names.push(pool.name.clone());
            specs.extend(workload(name, size, self.cfg.gpus_per_host));
        }
        for (family, demand) in FAMILIES {
            let gpu = if demand.mps {
                serde_json::json!({"type": "GPU", "sharingStrategy": {"nvidiaMps": {"memory": demand.memory_mib, "maxComputePercent": 50}}})
            } else {
                serde_json::json!({"type": "GPU", "value": "1"})
            };
            let td = serde_json::json!({"family": family, "containerDefinitions": [{"name": "main",
                "command": ["serve"], "resourceRequirements": [gpu]}]});
            let r = self.c().register_taskdef(td.to_string().as_bytes()).map_err(err)?;
            self.demands.insert(r.task_definition, demand);
        }
        for s in specs {
            let demand = FAMILIES.iter().find(|f| f.0 == s.family).map(|f| f.1).unwrap_or(FAMILIES[0].1);
            let view = self
                .c()
                .create_service(CreateService {
                    name: s.name.clone(),
                    pool: s.pool.clone(),
                    task_definition: s.family.to_string(),
                    desired_count: s.desired,
                    resumption: Some(s.resumption),
                    deployment_configuration: None,
                    client_token: None,
                })
                .map_err(err)?;
            self.svcs.insert(
                view.service.name,
                SvcWorld {
                    desired: s.desired,
                    pool: s.pool,
                    demand,
                    fenced: s.resumption == ResumptionBoundary::Fenced,
                    running: 0,
                    last_ms: WARMUP_MS,
                    shortfall: Vec::new(),
                },
            );
        }
        let n = self.cfg.hosts.max(1);
        for k in 0..self.cfg.hosts {
            let (pool, index) = if k < managed { (0, k) } else { (1, k - managed) };
            let name = format!("{}-{index}", self.pool_names[pool]);
            let h = self.add_host(name.clone(), name, pool, Some(k));
            // All register at once (before the first health tick, so the pool is at its size),
            // and heartbeat each at its own phase.
            // The first beat comes after the daemons answered, so hosts turn ACTIVE (and fill
            // up, binpack) in slot order.
            self.hosts[h].phase_ms = DAEMON_RESTART_MS
                + 200
                + u64::from(k) * self.cfg.heartbeat_ms / u64::from(n)
                + u64::from(k % 7);
            self.at(0, Ev::Boot(h));
        }
        for i in 0..self.faults.len() {
            let t = self.faults[i].at_ms;
            self.at(t, Ev::Fault(i));
        }
        self.at(HEALTH_TICK_MS, Ev::HealthTick);
        self.at(RESYNC_MS, Ev::Resync);
        self.after_step();
        Ok(())
    }

    fn add_host(&mut self, label: String, name: String, pool: usize, slot: Option<u32>) -> usize {
        let h = self.hosts.len();
        let gpus = self.cfg.gpus_per_host as usize;
        let gpu_uuids = (0..gpus)
            .map(|g| {
                GpuUuid::new(format!("GPU-{label}-{g}")).unwrap_or_else(|_| GpuUuid::new("GPU-x").unwrap())
            })
            .collect();
        let daemons = (0..gpus)
            .map(|_| Daemon {
                running: false,
                hung: false,
                hang_for_good: false,
                broken_for_good: false,
                fault: None,
                xid_since: None,
                health: DaemonHealth::new(0),
                gen: 0,
                probe_token: 0,
                probe_queued: false,
            })
            .collect();
        self.hosts.push(SimHost {
            rng: Rng::fork(self.cfg.seed, &label),
            label,
            name: name.clone(),
            token: None,
            pool,
            slot,
            id: None,
            up: false,
            partitioned_until: None,
            gpu_uuids,
            daemons,
            tasks: BTreeMap::new(),
            finished: BTreeSet::new(),
            outbox: Vec::new(),
            policy: MpsPolicy::default(),
            fault: None,
            fetch_queued: false,
            phase_ms: 0,
            gone: false,
        });
        self.by_name.insert(name, h);
        if let Some(s) = slot {
            self.slots.insert(s, h);
        }
        h
    }

    /// Runs to the end (or the first broken invariant).
    pub fn run(&mut self) {
        let end = self.cfg.stop_at_ms.unwrap_or(self.cfg.duration_ms).min(self.cfg.duration_ms);
        while let Some(entry) = self.queue.first_entry() {
            let (t, _) = *entry.key();
            if t > end {
                break;
            }
            let ev = entry.remove();
            self.now = t;
            self.clock_set(t);
            self.steps += 1;
            self.handle(ev);
            self.after_step();
            if self.violation.is_some() {
                return;
            }
        }
        self.now = end;
        self.clock_set(end);
        self.finish_accounting();
        if self.violation.is_none() {
            self.final_checks();
        }
    }

    fn clock_set(&self, t: u64) {
        let cur = mpsfleet_core::clock::Clock::now_ms(self.clock.as_ref());
        if t > cur {
            self.clock.advance(Duration::from_millis(t - cur));
        }
    }

    fn handle(&mut self, ev: Ev) {
        if matches!(ev, Ev::Resync | Ev::Fault(_) | Ev::Boot(_) | Ev::Heal(_) | Ev::ProviderDone { .. }) {
            // Hosts, incidents or the crash-loop window may have changed: a safety net over
            // the per-service marks.
            self.all_dirty = true;
        }
        match ev {
            Ev::HealthTick => {
                let jobs = self.c().health_tick();
                self.after_call(jobs.map_err(err));
                self.at(self.now + HEALTH_TICK_MS, Ev::HealthTick);
            }
            Ev::Resync => {
                let r = self.c().resync().and_then(|()| {
                    let c = self.c();
                    c.compact_feed(mpsfleet_server::FEED_RETAINED_REVISIONS)
                });
                self.after_call(r.map(|()| Vec::new()).map_err(err));
                self.check_recovery();
                self.at(self.now + RESYNC_MS, Ev::Resync);
            }
            Ev::Fault(i) => {
                let f = self.faults[i].clone();
                self.apply_fault(&f);
            }
            Ev::Boot(h) => self.boot(h),
            Ev::Heartbeat(h) => self.heartbeat(h),
            Ev::Probe { h, g, token } => self.probe(h, g, token),
            Ev::ProbeResult { h, g, gen, ev } => {
                if self.hosts[h].up && self.hosts[h].daemons[g].gen == gen {
                    self.daemon_step(h, g, ev);
                }
            }
            Ev::RestartDone { h, g, gen } => self.restart_done(h, g, gen),
            Ev::Fetch(h) => self.fetch(h),
            Ev::Started { h, t } => self.started(h, t),
            Ev::Stopped { h, t } => {
                if self.hosts[h].up && self.hosts[h].tasks.contains_key(&t) {
                    let code = self.hosts[h].tasks.get(&t).and_then(|l| l.stop_code);
                    self.remove_task(h, t, true);
                    self.report(h, t, stopped(code, None));
                }
            }
            Ev::ClientsExit { h, g } => {
                if self.hosts[h].up {
                    let reason = "MPS server reported a fatal GPU exception to its clients";
                    self.kill_tasks(h, g, true, false, StopCode::EssentialContainerExited, reason);
                    self.clear_fault_if_idle(h, g);
                }
            }
            Ev::Heal(h) => {
                if self.hosts[h].up && self.hosts[h].partitioned_until == Some(self.now) {
                    self.hosts[h].partitioned_until = None;
                    let label = self.hosts[h].label.clone();
                    self.log(format!("heal {label}: the agent reaches the control plane again"));
                    let outbox = std::mem::take(&mut self.hosts[h].outbox);
                    for (t, r) in outbox {
                        self.report(h, t, r);
                    }
                    self.queue_fetch(h);
                }
            }
            Ev::ProviderDone { job, ok, epoch, launch } => self.provider_done(job, ok, epoch, launch),
            Ev::ProviderRetry { job, record, epoch } => {
                if epoch == self.epoch {
                    let r = self.c().provider_attempt_failed(&job, &record);
                    self.after_call(r.map(|()| Vec::new()).map_err(err));
                }
            }
        }
    }

    /// Provider jobs from a cluster call: run them the way `run_jobs` does, in a canonical
    /// order (the server's own order follows its random incident ids).
    fn after_call(&mut self, r: Result<Vec<ProviderJob>, String>) {
        let mut jobs = match r {
            Ok(j) => j,
            Err(e) => {
                self.stats.server_errors += 1;
                self.log(format!("server error: {e}"));
                Vec::new()
            }
        };
        jobs.extend(self.c().take_jobs());
        if jobs.is_empty() {
            return;
        }
        let mut keyed: Vec<(String, ProviderJob)> = jobs.into_iter().map(|j| (self.job_key(&j), j)).collect();
        keyed.sort_by(|a, b| a.0.cmp(&b.0));
        for (_, job) in keyed {
            self.dispatch(job);
        }
    }

    /// The label of the host an incident is about.
    fn incident_label(&self, incident: &str) -> Option<(usize, String)> {
        let i = self.cluster.as_ref()?.incident(incident).ok()?;
        let h = *self.by_id.get(&i.host_id)?;
        Some((h, self.hosts[h].label.clone()))
    }

    fn job_key(&self, job: &ProviderJob) -> String {
        match job {
            ProviderJob::Launch { incident, pool, name, .. } if incident.is_empty() => {
                format!("0 {pool} {name}")
            }
            ProviderJob::Launch { incident, pool, .. } => {
                format!("1 {pool} {}", self.incident_label(incident).map(|x| x.1).unwrap_or_default())
            }
            ProviderJob::Terminate { pool, name, .. } => {
                let label = self.by_name.get(name).map(|&h| self.hosts[h].label.clone()).unwrap_or_default();
                format!("2 {pool} {label}")
            }
        }
    }

    /// One provider call with `Retry::default()`'s attempts and backoff, each attempt taking
    /// the model's delay and failing with its probability (raised while a fault degrades it).
    fn provider_call(&mut self, job: &ProviderJob, range: (u64, u64)) -> (u64, bool) {
        let retry = Retry::default();
        let (fail, extra) = match self.provider_degraded {
            Some((p, extra, until)) if self.now < until => (f64::from(p) / 100.0, extra),
            _ => (self.cfg.provider.failure_probability, 0),
        };
        let max_attempts = retry.max_attempts.max(1);
        let mut delay = 0;
        for attempt in 1..=max_attempts {
            delay += self.provider_rng.range(range.0, range.1) + extra;
            if !self.provider_rng.chance(fail) {
                return (delay, true);
            }
            self.stats.provider_attempts_failed += 1;
            if attempt < max_attempts {
                // `run_jobs` records each failed attempt on the incident before its backoff.
                let backoff = retry.backoff_after(attempt).as_millis() as u64;
                let record = AttemptRecord {
                    attempt,
                    error: "the provider refused the call".into(),
                    backoff_ms: Some(backoff),
                };
                let epoch = self.epoch;
                self.at(self.now + delay, Ev::ProviderRetry { job: job.clone(), record, epoch });
                delay += backoff;
            }
        }
        (delay, false)
    }

    fn dispatch(&mut self, job: ProviderJob) {
        match &job {
            ProviderJob::Launch { incident, pool, name, token } => {
                let pool_ix = self.pool_names.iter().position(|p| p == pool).unwrap_or(0);
                let (label, slot) = if incident.is_empty() {
                    (name.clone(), None)
                } else {
                    match self.incident_label(incident) {
                        Some((h, label)) => (format!("{label}r"), self.hosts[h].slot),
                        None => (name.clone(), None),
                    }
                };
                let (delay, ok) = self.provider_call(&job, self.cfg.provider.launch_ms);
                // Launch is idempotent by name: a host already launched under it is the answer.
                let existing = self.by_name.get(name).copied().filter(|&h| !self.hosts[h].gone);
                let launch = match existing {
                    Some(_) => None,
                    None if ok => Some(self.add_host(label.clone(), name.clone(), pool_ix, None)),
                    None => None,
                };
                if let Some(h) = launch {
                    // Slot faults follow the host's replacement once it is up.
                    self.hosts[h].slot = slot;
                    self.hosts[h].token = token.as_ref().map(|t| t.0.clone());
                }
                self.stats.provider_launches += 1;
                self.log(format!(
                    "provider launch {label} ({})",
                    if ok { "will succeed" } else { "will fail" }
                ));
                let epoch = self.epoch;
                self.at(self.now + delay, Ev::ProviderDone { job, ok, epoch, launch });
            }
            ProviderJob::Terminate { .. } => {
                let (delay, ok) = self.provider_call(&job, self.cfg.provider.terminate_ms);
                self.stats.provider_terminations += 1;
                let epoch = self.epoch;
                self.at(self.now + delay, Ev::ProviderDone { job, ok, epoch, launch: None });
            }
        }
    }

    fn provider_done(&mut self, job: ProviderJob, ok: bool, epoch: u32, launch: Option<usize>) {
        match &job {
            ProviderJob::Launch { .. } => {
                if let Some(h) = launch {
                    let boot =
                        self.provider_rng.range(self.cfg.provider.boot_ms.0, self.cfg.provider.boot_ms.1);
                    self.at(self.now + boot, Ev::Boot(h));
                }
                if !ok {
                    self.stats.provider_failures += 1;
                }
            }
            ProviderJob::Terminate { name, .. } => {
                if ok {
                    if let Some(&h) = self.by_name.get(name) {
                        if self.hosts[h].up {
                            let label = self.hosts[h].label.clone();
                            self.log(format!("provider terminated {label}"));
                            self.remove_host(h);
                        }
                    }
                } else {
                    self.stats.provider_failures += 1;
                }
            }
        }
        // A call made by a control plane that has since restarted reports to nobody.
        if epoch != self.epoch {
            return;
        }
        let outcome =
            if ok { ProviderOutcome::Done } else { ProviderOutcome::Failed("provider call failed".into()) };
        let r = self.c().provider_done(&job, outcome);
        self.after_call(r.map_err(err));
    }

    // ---- hosts ------------------------------------------------------------------------------

    fn boot(&mut self, h: usize) {
        let pool = self.pool_names[self.hosts[h].pool].clone();
        let gpus: Vec<GpuInventory> = self.hosts[h]
            .gpu_uuids
            .iter()
            .enumerate()
            .map(|(i, u)| GpuInventory {
                uuid: u.clone(),
                index: i as u32,
                model: "NVIDIA H100 80GB HBM3".into(),
                memory_mib: GPU_MEMORY_MIB,
                compute_capability: "9.0".into(),
                max_mps_clients: MAX_MPS_CLIENTS,
            })
            .collect();
        let reg = HostRegistration {
            pool,
            hostname: self.hosts[h].name.clone(),
            gpus,
            mps_available: true,
            emulated: true,
            runtime: Default::default(),
            runtime_version: None,
            plugins: Default::default(),
        };
        let r = match self.hosts[h].token.clone() {
            Some(token) => self.c().register_host_with_token(reg, &token),
            None => self.c().register_host(reg),
        };
        let id = match r {
            Ok(r) => r.host_id,
            Err(e) => {
                self.stats.server_errors += 1;
                let label = self.hosts[h].label.clone();
                self.log(format!("host {label} could not register: {e}"));
                return;
            }
        };
        self.by_id.insert(id.clone(), h);
        let label = self.hosts[h].label.clone();
        self.hosts[h].id = Some(id);
        self.hosts[h].up = true;
        if label != self.hosts[h].name || self.hosts[h].slot.is_none() {
            self.log(format!("host {label} joined"));
        }
        if let Some(s) = self.hosts[h].slot {
            self.slots.insert(s, h);
        }
        for g in 0..self.hosts[h].daemons.len() {
            self.hosts[h].daemons[g].health = DaemonHealth::new(self.now);
            self.daemon_step(h, g, MpsEvent::Tick);
        }
        self.at(self.now + 1 + self.hosts[h].phase_ms, Ev::Heartbeat(h));
    }

    fn heartbeat(&mut self, h: usize) {
        if !self.hosts[h].up {
            return;
        }
        self.at(self.now + self.cfg.heartbeat_ms, Ev::Heartbeat(h));
        if self.hosts[h].partitioned_until.is_some() {
            return;
        }
        let host = &self.hosts[h];
        let mut checks = Vec::with_capacity(host.daemons.len() * 2);
        for (g, d) in host.daemons.iter().enumerate() {
            let c = &d.health.check;
            checks.push(HostCheck {
                name: mpsfleet_core::health::MPS_DAEMON.into(),
                gpu_id: Some(host.gpu_uuids[g].clone()),
                status: c.status,
                reason: c.reason.clone(),
                since_ms: c.since_ms,
                restarts: 0,
                first_failure_age_ms: c.failing_since_ms.map(|t| self.now.saturating_sub(t)),
                repair_ages_ms: c.repairs_ms.iter().map(|t| self.now.saturating_sub(*t)).collect(),
            });
        }
        let mps_onboarded = checks.iter().all(|c| c.status != HealthStatus::Initializing);
        for (g, d) in host.daemons.iter().enumerate() {
            let (status, reason, since) = match d.xid_since {
                Some(t) => (HealthStatus::Impaired, "Xid 79: GPU has fallen off the bus".to_string(), t),
                None => (HealthStatus::Ok, "no Xid errors".to_string(), 0),
            };
            checks.push(HostCheck {
                name: mpsfleet_core::health::GPU.into(),
                gpu_id: Some(host.gpu_uuids[g].clone()),
                status,
                reason,
                since_ms: since,
                restarts: 0,
                first_failure_age_ms: d.xid_since.map(|t| self.now.saturating_sub(t)),
                repair_ages_ms: Vec::new(),
            });
        }
        let report = HostStatusReport {
            onboarded: mps_onboarded,
            checks,
            logs_url: None,
            logs_cert_sha256: None,
            ..HostStatusReport::default()
        };
        let Some(id) = host.id.clone() else { return };
        self.stats.heartbeats += 1;
        match self.c().host_status(&id, report) {
            Ok(answer) => {
                let wanted = pool_mps_policy(&answer.health_policy, &self.hosts[h].policy);
                if wanted != self.hosts[h].policy && wanted.validate().is_ok() {
                    self.hosts[h].policy = wanted;
                }
                self.after_call(Ok(Vec::new()));
            }
            Err(e) => self.after_call(Err(err(e))),
        }
    }

    fn queue_fetch(&mut self, h: usize) {
        if !self.hosts[h].fetch_queued && self.hosts[h].up {
            self.hosts[h].fetch_queued = true;
            self.at(self.now + FETCH_LATENCY_MS, Ev::Fetch(h));
        }
    }

    fn remove_host(&mut self, h: usize) {
        let ids: Vec<TaskId> = self.hosts[h].tasks.keys().copied().collect();
        for t in ids {
            self.remove_task(h, t, true);
        }
        let host = &mut self.hosts[h];
        host.up = false;
        host.gone = true;
        host.outbox.clear();
        for d in &mut host.daemons {
            d.gen += 1;
            d.running = false;
        }
    }

    // ---- MPS daemons ------------------------------------------------------------------------

    fn daemon_step(&mut self, h: usize, g: usize, ev: MpsEvent) {
        let now = self.now;
        let policy = self.hosts[h].policy.clone();
        let d = &mut self.hosts[h].daemons[g];
        let (next, effects) = mh::step(d.health.clone(), ev, now, &policy);
        d.health = next;
        for e in effects {
            if e == Effect::Restart {
                let d = &mut self.hosts[h].daemons[g];
                // Whatever is left of the daemon goes, and its server with it.
                let had_daemon = d.running;
                d.running = false;
                d.fault = None;
                d.gen += 1;
                let gen = d.gen;
                if had_daemon {
                    self.kill_tasks(
                        h,
                        g,
                        true,
                        false,
                        StopCode::EssentialContainerExited,
                        "MPS daemon restarted",
                    );
                }
                self.at(now + DAEMON_RESTART_MS, Ev::RestartDone { h, g, gen });
            }
        }
        self.ensure_probe(h, g, self.hosts[h].policy.probe_interval.as_millis() as u64);
    }

    fn ensure_probe(&mut self, h: usize, g: usize, after: u64) {
        let up = self.hosts[h].up;
        let d = &mut self.hosts[h].daemons[g];
        if d.probe_queued || d.steady() || !up {
            return;
        }
        d.probe_queued = true;
        d.probe_token += 1;
        let token = d.probe_token;
        self.at(self.now + after, Ev::Probe { h, g, token });
    }

    fn probe(&mut self, h: usize, g: usize, token: u64) {
        let host = &mut self.hosts[h];
        if !host.up || host.daemons[g].probe_token != token {
            return;
        }
        let interval = host.policy.probe_interval.as_millis() as u64;
        let timeout = host.policy.probe_timeout;
        let d = &mut host.daemons[g];
        d.probe_queued = false;
        if !d.health.wants_probe() {
            // Starting or a restart is due: time passes for the state machine.
            self.daemon_step(h, g, MpsEvent::Tick);
            self.ensure_probe(h, g, interval);
            return;
        }
        let gen = d.gen;
        if d.running && d.hung {
            let reason = format!(
                "probe timed out after {}",
                mpsfleet_core::health::fmt_ms(timeout.as_millis() as u64)
            );
            self.at(
                self.now + timeout.as_millis() as u64,
                Ev::ProbeResult { h, g, gen, ev: MpsEvent::ProbeFailed { reason } },
            );
        } else {
            let ev = if !d.running {
                MpsEvent::ProbeFailed { reason: "Cannot find MPS control daemon process".into() }
            } else if d.fault.is_some() {
                MpsEvent::ServersUnhealthy { reason: "MPS server in FAULT".into() }
            } else {
                MpsEvent::ProbeOk
            };
            self.daemon_step(h, g, ev);
        }
        self.ensure_probe(h, g, interval);
    }

    fn restart_done(&mut self, h: usize, g: usize, gen: u64) {
        if !self.hosts[h].up || self.hosts[h].daemons[g].gen != gen {
            return;
        }
        let d = &mut self.hosts[h].daemons[g];
        if d.broken_for_good {
            d.running = false;
            self.daemon_step(h, g, MpsEvent::RestartFailed { reason: "daemon exited with status 1".into() });
            return;
        }
        d.running = true;
        d.hung = d.hang_for_good;
        d.fault = None;
        self.daemon_step(h, g, MpsEvent::RestartSucceeded);
        // The agent probes a new daemon at once.
        let d = &mut self.hosts[h].daemons[g];
        d.probe_queued = false;
        self.ensure_probe(h, g, 0);
    }

    fn crash_daemon(&mut self, h: usize, g: usize, for_good: bool) {
        let d = &mut self.hosts[h].daemons[g];
        d.broken_for_good |= for_good;
        let starting = d.health.phase == Phase::Starting;
        d.running = false;
        d.gen += 1;
        self.kill_tasks(h, g, true, false, StopCode::EssentialContainerExited, "MPS daemon exited");
        let ev = if starting {
            MpsEvent::RestartFailed { reason: "daemon exited during start".into() }
        } else {
            MpsEvent::DaemonExited { reason: "daemon exited (signal 9)".into() }
        };
        self.daemon_step(h, g, ev);
    }

    /// The first GPU from `start` on (cyclically) with an MPS client: faults strike where
    /// there is work, or they would go unseen.
    fn busy_gpu(&self, h: usize, start: usize) -> Option<usize> {
        let n = self.hosts[h].daemons.len();
        let busy = |g: usize| self.hosts[h].tasks.values().any(|t| t.demand.mps && t.gpus.contains(&g));
        (0..n).map(|i| (start + i) % n).find(|&g| busy(g))
    }

    fn clear_fault_if_idle(&mut self, h: usize, g: usize) {
        let busy = self.hosts[h].tasks.values().any(|t| t.demand.mps && t.gpus.contains(&g));
        if !busy {
            self.hosts[h].daemons[g].fault = None;
        }
    }

    // ---- faults -----------------------------------------------------------------------------

    fn apply_fault(&mut self, f: &Fault) {
        match &f.kind {
            FaultKind::ControlPlaneRestart => {
                self.log(format!("fault {}", f.kind.cause()));
                self.stats.fault(f.kind.cause());
                self.restart_control_plane();
                return;
            }
            FaultKind::ProviderDegraded { fail_percent, extra_delay_ms, for_ms } => {
                self.log(format!("fault {f}"));
                self.stats.fault(f.kind.cause());
                self.provider_degraded = Some((*fail_percent, *extra_delay_ms, self.now + for_ms));
                return;
            }
            _ => {}
        }
        let Some(h) = self.slots.get(&f.slot).copied().filter(|&h| self.hosts[h].up) else {
            self.log(format!("fault {} slot {}: no host up, skipped", f.kind.cause(), f.slot));
            return;
        };
        let label = self.hosts[h].label.clone();
        let gpus = self.hosts[h].daemons.len();
        let gpu_of = |g: u32| (g as usize).min(gpus.saturating_sub(1));
        self.log(format!(
            "fault {} on {label}{}",
            f.kind.cause(),
            match &f.kind {
                FaultKind::DaemonCrash { gpu, .. }
                | FaultKind::DaemonHang { gpu, .. }
                | FaultKind::ServerFault { gpu, .. }
                | FaultKind::GpuXid { gpu } => format!(" gpu {}", gpu_of(*gpu)),
                FaultKind::Partition { for_ms } => format!(" for {}", fmt_time(*for_ms)),
                _ => String::new(),
            }
        ));
        self.stats.fault(f.kind.cause());
        if self.hosts[h].partitioned_until.is_none() || !matches!(f.kind, FaultKind::Partition { .. }) {
            self.hosts[h].fault = Some((self.now, f.kind.cause()));
        }
        if gpus == 0 && !matches!(f.kind, FaultKind::Partition { .. } | FaultKind::Vanish) {
            return;
        }
        match f.kind {
            FaultKind::DaemonCrash { gpu, for_good } => {
                let g = self.busy_gpu(h, gpu_of(gpu)).unwrap_or(gpu_of(gpu));
                self.crash_daemon(h, g, for_good)
            }
            FaultKind::BadDriver => {
                for g in 0..gpus {
                    self.crash_daemon(h, g, true);
                }
            }
            FaultKind::DaemonHang { gpu, for_good } => {
                let g = self.busy_gpu(h, gpu_of(gpu)).unwrap_or(gpu_of(gpu));
                let d = &mut self.hosts[h].daemons[g];
                if d.running {
                    d.hung = true;
                }
                d.hang_for_good |= for_good;
                self.ensure_probe(h, g, 0);
            }
            FaultKind::ServerFault { gpu, stuck_client } => {
                // A server faults because of a client: the first GPU from `gpu` on that has one.
                let Some(g) = self.busy_gpu(h, gpu_of(gpu)) else {
                    self.log("no MPS client on the host: nothing to fault".into());
                    return;
                };
                if self.hosts[h].daemons[g].running {
                    self.hosts[h].daemons[g].fault = Some(stuck_client);
                    if !stuck_client {
                        self.at(self.now + CLIENT_EXIT_MS, Ev::ClientsExit { h, g });
                    }
                    self.clear_fault_if_idle(h, g);
                    self.ensure_probe(h, g, 0);
                }
            }
            FaultKind::GpuXid { gpu } => {
                let g = gpu_of(gpu);
                self.hosts[h].daemons[g].xid_since.get_or_insert(self.now);
                self.kill_tasks(
                    h,
                    g,
                    true,
                    true,
                    StopCode::EssentialContainerExited,
                    "GPU fell off the bus (Xid 79)",
                );
            }
            FaultKind::Partition { for_ms } => {
                if self.hosts[h].partitioned_until.is_none() {
                    let until = self.now + for_ms.max(1);
                    self.hosts[h].partitioned_until = Some(until);
                    self.at(until, Ev::Heal(h));
                }
            }
            FaultKind::Vanish => self.remove_host(h),
            FaultKind::ControlPlaneRestart | FaultKind::ProviderDegraded { .. } => {}
        }
    }

    /// Drops the `Cluster` and loads a new one from the same store, as a restarted server does.
    fn restart_control_plane(&mut self) {
        self.cluster = None;
        self.epoch += 1;
        self.stats.control_plane_restarts += 1;
        match Cluster::load(self.store.clone(), self.clock.clone(), |_| Ok(())) {
            Ok(mut c) => {
                c.reseed_task_ids(self.cfg.seed ^ (u64::from(self.epoch) << 48));
                for p in &self.pool_names {
                    if p.as_str() == MANAGED_POOL {
                        c.set_provider(p.clone(), Arc::new(ExternalProvider));
                    }
                }
                self.cluster = Some(c);
            }
            Err(e) => {
                self.violation = Some(Violation {
                    invariant: "control-plane-reload",
                    at_ms: self.now,
                    detail: format!("the cluster did not reload from its store: {e}"),
                });
                return;
            }
        }
        // Agents' long-polls reconnect and read their assignments again.
        for h in 0..self.hosts.len() {
            if self.hosts[h].up {
                self.queue_fetch(h);
            }
        }
        let r = self.c().take_jobs();
        self.after_call(Ok(r));
    }

    // ---- tasks ------------------------------------------------------------------------------

    fn report(&mut self, h: usize, t: TaskId, r: TaskStateReport) {
        if !self.hosts[h].up {
            return;
        }
        if self.hosts[h].partitioned_until.is_some() {
            self.hosts[h].outbox.push((t, r));
            return;
        }
        let Some(id) = self.hosts[h].id.clone() else { return };
        self.stats.reports += 1;
        let res = self.c().report_task(&id, &t.to_string(), r);
        if res.is_err() {
            self.stats.rejected_reports += 1;
        }
        self.after_call(Ok(Vec::new()));
    }

    fn fetch(&mut self, h: usize) {
        self.hosts[h].fetch_queued = false;
        if !self.hosts[h].up || self.hosts[h].partitioned_until.is_some() {
            return;
        }
        let Some(id) = self.hosts[h].id.clone() else { return };
        let Ok((_, a)) = self.c().assignments(&id) else { return };
        let mut listed = BTreeSet::new();
        let mut tasks = a.tasks;
        tasks.sort_by_key(|t| (t.created_at_ms, t.id));
        for task in tasks {
            listed.insert(task.id);
            let local = self.hosts[h].tasks.get(&task.id).map(|l| l.stopping);
            if task.desired_status == TaskStatus::Stopped {
                match local {
                    Some(false) => {
                        if let Some(l) = self.hosts[h].tasks.get_mut(&task.id) {
                            l.stopping = true;
                            l.stop_code = Some(task.stop_code.unwrap_or(StopCode::UserInitiated));
                        }
                        let d = self.hosts[h].rng.range(TASK_STOP_MS.0, TASK_STOP_MS.1);
                        self.at(self.now + d, Ev::Stopped { h, t: task.id });
                    }
                    Some(true) => {}
                    None if task.last_status != TaskStatus::Stopped
                        && !self.hosts[h].finished.contains(&task.id) =>
                    {
                        self.hosts[h].finished.insert(task.id);
                        let code = task.stop_code.unwrap_or(StopCode::UserInitiated);
                        self.report(h, task.id, stopped(Some(code), None));
                    }
                    None => {}
                }
            } else if local.is_none()
                && task.last_status < TaskStatus::Running
                && !self.hosts[h].finished.contains(&task.id)
            {
                self.start_task(h, &task);
            }
        }
        // What the server no longer lists has been stopped there (the host left the fleet).
        let gone: Vec<TaskId> = self.hosts[h].tasks.keys().filter(|t| !listed.contains(t)).copied().collect();
        for t in gone {
            self.remove_task(h, t, true);
        }
    }

    fn start_task(&mut self, h: usize, task: &Task) {
        let demand = self.demands.get(&task.task_definition).copied().unwrap_or(FAMILIES[0].1);
        let gpus: Vec<usize> =
            task.gpu_ids.iter().filter_map(|u| self.hosts[h].gpu_uuids.iter().position(|x| x == u)).collect();
        self.hosts[h].finished.insert(task.id);
        let xid = gpus.iter().any(|&g| self.hosts[h].daemons[g].xid_since.is_some());
        if xid || gpus.is_empty() {
            self.report(
                h,
                task.id,
                stopped(Some(StopCode::TaskFailedToStart), Some("GPU unusable (Xid 79)")),
            );
            return;
        }
        // The deliberate bug of test builds: the agent skips its daemon check (fails open).
        let fail_open = self.cfg.break_invariant && cfg!(any(test, feature = "broken-invariant"));
        if demand.mps {
            let (answers, faulted) = {
                let d = &self.hosts[h].daemons[gpus[0]];
                (d.answers(), d.fault.is_some())
            };
            if !answers && fail_open {
                self.checker.checks += 1;
                let label = self.hosts[h].label.clone();
                let detail = format!(
                    "MPS task {} started on {label} gpu {} while its daemon was not answering: it runs without its limits",
                    task.id, gpus[0]
                );
                self.fail("mps-fail-closed", detail);
            } else if !answers {
                self.stats.fail_closed += 1;
                let why = "MPS daemon not answering: not started without its limits";
                self.report(h, task.id, stopped(Some(StopCode::MpsDaemonUnavailable), Some(why)));
                return;
            }
            if faulted {
                let why = "MPS server in FAULT refuses new clients";
                self.report(h, task.id, stopped(Some(StopCode::TaskFailedToStart), Some(why)));
                return;
            }
        }
        self.hosts[h].finished.remove(&task.id);
        self.hosts[h].tasks.insert(
            task.id,
            LocalTask {
                gpus: gpus.clone(),
                demand,
                service: task.group.clone(),
                running_since: None,
                stopping: false,
                stop_code: None,
            },
        );
        self.mark(h);
        let d = self.hosts[h].rng.range(TASK_START_MS.0, TASK_START_MS.1);
        self.at(self.now + d, Ev::Started { h, t: task.id });
    }

    fn started(&mut self, h: usize, t: TaskId) {
        let now = self.now;
        let up = self.hosts[h].up;
        let Some(l) = self.hosts[h].tasks.get_mut(&t) else { return };
        if !up || l.running_since.is_some() || l.stopping {
            return;
        }
        l.running_since = Some(now);
        let svc = l.service.clone();
        if let Some(s) = svc {
            self.svc_change(&s, 1);
            if let Some(w) = self.svcs.get(&s) {
                self.checker.checks += 1;
                if w.fenced && w.running > w.desired {
                    let detail = format!(
                        "fenced service {s} runs {} copies, desired {}: a replacement started before the old copy was fenced",
                        w.running, w.desired
                    );
                    self.fail("fenced-single-copy", detail);
                }
            }
        }
        self.report(
            h,
            t,
            TaskStateReport {
                last_status: TaskStatus::Running,
                health_status: None,
                ready: Some(true),
                stop_code: None,
                stopped_reason: None,
                output: None,
                containers: None,
            },
        );
    }

    /// Accrues the service's missing replicas since the last change (by cause, as last
    /// classified), then applies `delta` to its running count.
    fn svc_change(&mut self, s: &ServiceName, delta: i32) {
        let now = self.now;
        let Some(w) = self.svcs.get_mut(s) else { return };
        if now > w.last_ms {
            let dt = u128::from(now - w.last_ms);
            let missing = w.desired.saturating_sub(w.running);
            // Kept as it goes, so that a run stopped by a broken invariant reports it too.
            self.stats.deficit_ms += dt * u128::from(missing);
            let mut left = missing;
            for &(cause, n) in &w.shortfall {
                let k = n.min(left);
                if k > 0 {
                    *self.stats.shortfall_ms.entry(cause).or_default() += dt * u128::from(k);
                }
                left -= k;
            }
            if left > 0 {
                *self.stats.shortfall_ms.entry(Shortfall::Other).or_default() += dt * u128::from(left);
            }
            w.last_ms = now;
        }
        w.running = (i64::from(w.running) + i64::from(delta)).max(0) as u32;
        if delta != 0 {
            self.dirty_svcs.insert(s.clone());
        }
    }

    // ---- the shortfall breakdown ------------------------------------------------------------

    /// A service task record from the change feed: kept while live, counted as a failure when
    /// it stops with a code the server counts against the service.
    fn mirror_task(&mut self, t: &Task) {
        let Some(s) = t.group.clone() else { return };
        self.dirty_svcs.insert(s.clone());
        let tasks = self.srv_tasks.entry(s.clone()).or_default();
        if t.last_status == TaskStatus::Stopped {
            let was_live = tasks.remove(&t.id).is_some();
            let failed = !matches!(
                t.stop_code,
                Some(
                    StopCode::UserInitiated
                        | StopCode::ServiceSchedulerInitiated
                        | StopCode::HostReplaced
                        | StopCode::HostLost
                )
            );
            if was_live && failed {
                self.svc_failures.entry(s).or_default().push_back(t.stopped_at_ms.unwrap_or(self.now));
            }
        } else {
            let rec = SrvTask {
                stop_requested: t.desired_status == TaskStatus::Stopped,
                host: t.host_id.clone(),
                last: t.last_status,
            };
            tasks.insert(t.id, rec);
        }
    }

    /// Classifies the missing replicas of the services marked since the last step; each
    /// service first accrues its shortfall so far by the classification it had.
    fn classify_dirty(&mut self) {
        if self.now < WARMUP_MS {
            // Nothing is counted yet; classify everything once counting starts.
            self.all_dirty = true;
            self.dirty_svcs.clear();
            return;
        }
        let names: Vec<ServiceName> = if std::mem::take(&mut self.all_dirty) {
            self.dirty_svcs.clear();
            self.svcs.keys().cloned().collect()
        } else {
            std::mem::take(&mut self.dirty_svcs).into_iter().collect()
        };
        let window = mpsfleet_server::cluster::SERVICE_RESTART_WINDOW_MS;
        let now = self.now;
        for f in self.svc_failures.values_mut() {
            while f.front().is_some_and(|&t| now.saturating_sub(t) > window) {
                f.pop_front();
            }
        }
        let mut pools: BTreeMap<String, PoolRoom> = BTreeMap::new();
        for s in names {
            self.svc_change(&s, 0);
            let shortfall = self.classify(&s, &mut pools);
            if let Some(w) = self.svcs.get_mut(&s) {
                w.shortfall = shortfall;
            }
        }
    }

    /// Why each missing replica of `s` is missing, now.
    fn classify(&self, s: &ServiceName, pools: &mut BTreeMap<String, PoolRoom>) -> Vec<(Shortfall, u32)> {
        let Some(w) = self.svcs.get(s) else { return Vec::new() };
        if w.running >= w.desired {
            return Vec::new();
        }
        let mut by_cause: BTreeMap<Shortfall, u32> = BTreeMap::new();
        let mut current = 0;
        for (id, t) in self.srv_tasks.get(s).into_iter().flatten() {
            if t.stop_requested {
                // Its replacement exists already (the service counts it no more).
                continue;
            }
            current += 1;
            let host = t.host.as_ref().and_then(|id| self.by_id.get(id).copied());
            if host.is_some_and(|h| self.hosts[h].tasks.get(id).is_some_and(|l| l.running_since.is_some())) {
                continue;
            }
            *by_cause.entry(self.task_shortfall(w, t, host, pools)).or_default() += 1;
        }
        let not_created = w.desired.saturating_sub(current);
        if not_created > 0 {
            let burst = mpsfleet_server::cluster::SERVICE_RESTART_BURST;
            let held = self.svc_failures.get(s).is_some_and(|f| f.len() >= burst);
            let cause = if held { Shortfall::CrashLoopHoldBack } else { Shortfall::Other };
            *by_cause.entry(cause).or_default() += not_created;
        }
        by_cause.into_iter().collect()
    }

    /// Why a live task of the service that the world does not run is not running.
    fn task_shortfall(
        &self,
        w: &SvcWorld,
        t: &SrvTask,
        host: Option<usize>,
        pools: &mut BTreeMap<String, PoolRoom>,
    ) -> Shortfall {
        let Some(id) = &t.host else {
            let room = pools.entry(w.pool.clone()).or_insert_with(|| self.pool_room(&w.pool));
            let fits = if w.demand.mps { room.mps } else { room.whole_gpu };
            return match (fits, room.replacement_coming) {
                (true, _) => Shortfall::UnplacedWithRoom,
                (false, true) => Shortfall::ReplacementHost,
                (false, false) => Shortfall::NoCapacity,
            };
        };
        if let Some(i) = self.open_incidents.get(id).and_then(|i| self.incidents.get(i)) {
            return match i.state {
                IncidentState::Blocked { .. } => Shortfall::RemediationBlocked,
                _ if i.owner == IncidentOwner::Operator => Shortfall::OperatorHold,
                _ if w.fenced => Shortfall::FencedTermination,
                _ => Shortfall::OnBadHost,
            };
        }
        match host.map(|h| &self.hosts[h]) {
            None => Shortfall::HostUnreachable,
            Some(h) if !h.up || h.partitioned_until.is_some() => Shortfall::HostUnreachable,
            Some(_) if t.last < TaskStatus::Running => Shortfall::Starting,
            Some(_) => Shortfall::Other,
        }
    }

    /// Whether the pool has room for another task (of either kind) now, and whether a
    /// replacement host is on its way.
    fn pool_room(&self, pool: &str) -> PoolRoom {
        let (mps, whole_gpu) = self.cluster.as_ref().map_or((false, false), |c| spare_capacity(c, pool));
        let replacement_coming =
            self.open_incidents.values().filter_map(|i| self.incidents.get(i)).any(|i| {
                i.pool.as_str() == pool
                    && i.has(Step::ReplacementRequested)
                    && !i.has(Step::TasksRunningAgain)
            });
        PoolRoom { mps, whole_gpu, replacement_coming }
    }

    /// The process is gone; `lost`: the work it had done is lost (it starts again elsewhere).
    fn remove_task(&mut self, h: usize, t: TaskId, lost: bool) {
        let Some(l) = self.hosts[h].tasks.remove(&t) else { return };
        self.mark(h);
        self.hosts[h].finished.insert(t);
        if let Some(since) = l.running_since {
            if lost {
                self.stats.work_lost_ms += u128::from(self.now.saturating_sub(since));
            }
            if let Some(s) = &l.service {
                self.svc_change(s, -1);
            }
        }
        for g in l.gpus {
            if self.hosts[h].daemons.get(g).is_some_and(|d| d.fault == Some(true)) {
                self.clear_fault_if_idle(h, g);
            }
        }
    }

    /// Tasks on GPU `g` exit: MPS clients (`mps`) and, with `all`, whole-GPU ones too.
    fn kill_tasks(&mut self, h: usize, g: usize, mps: bool, all: bool, code: StopCode, reason: &str) {
        let victims: Vec<TaskId> = self.hosts[h]
            .tasks
            .iter()
            .filter(|(_, l)| l.gpus.contains(&g) && ((mps && l.demand.mps) || all))
            .map(|(t, _)| *t)
            .collect();
        for t in victims {
            self.stats.tasks_killed += 1;
            self.remove_task(h, t, true);
            self.report(h, t, stopped(Some(code), Some(reason)));
        }
    }

    // ---- after every step: the change feed and the invariants ---------------------------------

    fn after_step(&mut self) {
        let Some(c) = self.cluster.as_ref() else { return };
        let rev = c.revision();
        let mut changed_hosts = BTreeSet::new();
        if rev != self.feed_rev {
            let changes = match self.store.changes_since(self.feed_rev, usize::MAX) {
                Ok(c) => c,
                Err(e) => {
                    self.fail("store-feed", format!("cannot read the change feed: {e}"));
                    return;
                }
            };
            self.feed_rev = rev;
            let mut incidents = Vec::new();
            for ch in changes {
                let Some(value) = ch.value else { continue };
                match ch.kind.as_str() {
                    "task" => {
                        if let Ok(t) = serde_json::from_slice::<Task>(&value) {
                            self.mirror_task(&t);
                            if let Some(&h) = t.host_id.as_ref().and_then(|id| self.by_id.get(id)) {
                                changed_hosts.insert(h);
                            }
                        }
                    }
                    "incident" => {
                        if let Ok(i) = serde_json::from_slice::<Incident>(&value) {
                            incidents.push(i);
                        }
                    }
                    "host" => self.all_dirty = true,
                    _ => {}
                }
            }
            for &h in &changed_hosts {
                self.queue_fetch(h);
                self.check_server_gpus(h);
            }
            for i in incidents {
                self.incident_changed(i);
            }
        }
        self.classify_dirty();
        // The world: what the hosts really run, on the hosts this step may have touched.
        if self.violation.is_none() {
            self.check_world();
        }
    }

    fn check_server_gpus(&mut self, h: usize) {
        let Some(id) = self.hosts[h].id.clone() else { return };
        let Some(c) = self.cluster.as_ref() else { return };
        let Ok((_, a)) = c.assignments(&id) else { return };
        let mut load: Vec<GpuLoad> = vec![GpuLoad::default(); self.hosts[h].gpu_uuids.len()];
        for t in a.tasks.iter().filter(|t| t.last_status != TaskStatus::Stopped) {
            let demand = self.demands.get(&t.task_definition).copied().unwrap_or(FAMILIES[0].1);
            for u in &t.gpu_ids {
                if let Some(g) = self.hosts[h].gpu_uuids.iter().position(|x| x == u) {
                    load[g].add(demand, t.id);
                }
            }
        }
        self.checker.checks += 1;
        if let Some(why) = invariants::gpu_limits(&load, GPU_MEMORY_MIB, MAX_MPS_CLIENTS) {
            let label = self.hosts[h].label.clone();
            self.fail("gpu-limits", format!("server placement on {label}: {why}"));
        }
    }

    fn check_world(&mut self) {
        // Only hosts with tasks can break a GPU limit; checking all of them after every step
        // would cost O(hosts) per event, so each host is checked when its tasks change.
        let dirty: Vec<usize> = std::mem::take(&mut self.checker.dirty_hosts).into_iter().collect();
        for h in dirty {
            let host = &self.hosts[h];
            let mut load: Vec<GpuLoad> = vec![GpuLoad::default(); host.gpu_uuids.len()];
            for (t, l) in &host.tasks {
                for &g in &l.gpus {
                    load[g].add(l.demand, *t);
                }
            }
            self.checker.checks += 1;
            if let Some(why) = invariants::gpu_limits(&load, GPU_MEMORY_MIB, MAX_MPS_CLIENTS) {
                let label = host.label.clone();
                self.fail("gpu-limits", format!("world on {label}: {why}"));
                return;
            }
        }
    }

    fn incident_changed(&mut self, i: Incident) {
        let h = self.by_id.get(&i.host_id).copied();
        let label = h.map(|h| self.hosts[h].label.clone()).unwrap_or_else(|| "?".into());
        let prev_len = self.incidents.get(&i.id).map(|p| p.timeline.len());
        self.all_dirty = true;
        if i.state == IncidentState::Resolved {
            if self.open_incidents.get(&i.host_id) == Some(&i.id) {
                self.open_incidents.remove(&i.host_id);
            }
        } else {
            self.open_incidents.insert(i.host_id.clone(), i.id.clone());
        }
        if prev_len.is_none() {
            let (onset, cause) = h
                .and_then(|h| self.hosts[h].fault)
                .map_or((None, "no injected fault"), |(t, c)| (Some(t), c));
            let tie = self.incidents.values().any(|x| x.pool == i.pool && x.opened_at_ms == i.opened_at_ms);
            if tie {
                // The server ranks incidents opened in the same millisecond by their hosts'
                // registration order; counted, because the storm breaker lets the first through.
                self.stats.incident_ties += 1;
                self.log(format!(
                    "incident on {label} opened in the same millisecond as another in its pool"
                ));
            }
            self.stats.incident_opened(&i.id, cause, onset, i.opened_at_ms, label.clone());
            self.log(format!(
                "incident on {label}: {} IMPAIRED ({cause}), owner {}",
                i.trigger.check,
                i.owner.as_str()
            ));
        }
        for e in i.timeline.iter().skip(prev_len.unwrap_or(0)) {
            let line = match e.step {
                Step::Blocked => Some(format!("incident on {label}: BLOCKED: {}", e.detail)),
                Step::ReplacementRequested => Some(format!("incident on {label}: replacement requested")),
                Step::OldHostTerminated => Some(format!("incident on {label}: old host terminated")),
                Step::TasksRunningAgain => Some(format!("incident on {label}: tasks running again")),
                Step::Resolved => Some(format!("incident on {label}: resolved: {}", e.detail)),
                _ => None,
            };
            if let Some(l) = line {
                self.log(l);
            }
        }
        let pool_mode = self
            .cluster
            .as_ref()
            .and_then(|c| c.pool(i.pool.as_str()).ok())
            .map(|p| (p.mode, p.remediation_policy));
        self.incidents.insert(i.id.clone(), i.clone());
        let Some((mode, policy)) = pool_mode else { return };
        self.checker.checks += 1;
        if let Some(why) = invariants::incident_record(&i, mode) {
            self.fail("incident-record", format!("incident on {label}: {why}"));
            return;
        }
        let pool: Vec<&Incident> = self.incidents.values().filter(|x| x.pool == i.pool).collect();
        self.checker.checks += 1;
        if let Some(why) = invariants::replacement_limits(&pool, &policy, self.now) {
            self.fail("storm-breaker", format!("pool {}: {why}", i.pool));
        }
    }

    /// At every resync: a service below its count while its pool has room recovers within
    /// [`invariants::recovery_bound_ms`].
    fn check_recovery(&mut self) {
        if self.now < WARMUP_MS {
            return;
        }
        let Some(c) = self.cluster.as_ref() else { return };
        let views = c.services();
        let mut room: BTreeMap<String, (bool, bool)> = BTreeMap::new();
        let mut below = Vec::new();
        for v in views {
            let Some(w) = self.svcs.get(&v.service.name) else { continue };
            if v.running_count >= v.service.desired_count {
                continue;
            }
            let pool = w.pool.clone();
            let fits = *room.entry(pool.clone()).or_insert_with(|| spare_capacity(c, &pool));
            let has_room = if w.demand.mps { fits.0 } else { fits.1 };
            if has_room {
                below.push(v.service.name.clone());
            }
        }
        let bound = invariants::recovery_bound_ms(&HealthPolicy::default(), self.cfg.heartbeat_ms);
        let now = self.now;
        self.below_since.retain(|k, _| below.contains(k));
        for s in below {
            let since = *self.below_since.entry(s.clone()).or_insert(now);
            self.checker.checks += 1;
            if now - since > bound {
                let detail = format!(
                    "service {s} below its desired count for {} with spare capacity in its pool (bound {})",
                    fmt_time(now - since),
                    fmt_time(bound)
                );
                self.fail("service-recovery", detail);
                return;
            }
        }
    }

    fn fail(&mut self, invariant: &'static str, detail: String) {
        if self.violation.is_some() {
            return;
        }
        self.log(format!("INVARIANT BROKEN {invariant}: {detail}"));
        self.violation = Some(Violation { invariant, at_ms: self.now, detail });
    }

    fn final_checks(&mut self) {
        let mut all: Vec<Incident> = self.incidents.values().cloned().collect();
        all.sort_by(|a, b| (a.opened_at_ms, &a.host_id).cmp(&(b.opened_at_ms, &b.host_id)));
        for i in all {
            let mode = self.cluster.as_ref().and_then(|c| c.pool(i.pool.as_str()).ok()).map(|p| p.mode);
            let Some(mode) = mode else { continue };
            self.checker.checks += 1;
            if let Some(why) = invariants::incident_record(&i, mode) {
                self.fail("incident-record", why);
                return;
            }
        }
    }

    fn finish_accounting(&mut self) {
        let names: Vec<ServiceName> = self.svcs.keys().cloned().collect();
        for s in names {
            self.svc_change(&s, 0);
        }
        let mut opened: Vec<&Incident> = self.incidents.values().collect();
        opened.sort_by(|a, b| (a.opened_at_ms, &a.host_id).cmp(&(b.opened_at_ms, &b.host_id)));
        for i in opened {
            self.stats.incident_final(&i.id, i);
        }
        let (running, desired): (u32, u32) =
            self.svcs.values().fold((0, 0), |(r, d), w| (r + w.running.min(w.desired), d + w.desired));
        self.stats.replicas_running_at_end = running;
        self.stats.replicas_desired = desired;
        if let Some(c) = self.cluster.as_ref() {
            for v in c.services() {
                self.stats.services_at_end.push((
                    v.service.name.to_string(),
                    v.running_count,
                    v.service.desired_count,
                ));
            }
            for p in &self.pool_names {
                let hosts = c.hosts(Some(p.as_str()));
                let blocked = self
                    .incidents
                    .values()
                    .filter(|i| &i.pool == p && matches!(i.state, IncidentState::Blocked { .. }))
                    .count();
                let active = hosts.iter().filter(|h| h.status == HostStatus::Active).count();
                self.stats.pools_at_end.push((p.to_string(), active, hosts.len(), blocked));
            }
        }
    }

    /// Called by the world code whenever a host's processes change.
    pub(crate) fn mark(&mut self, h: usize) {
        self.checker.dirty_hosts.insert(h);
    }
}

/// Whether a pool has room now for one more MPS task of the largest shape (`.0`) and for a
/// whole-GPU task (`.1`), on hosts that take new work.
fn spare_capacity(c: &Cluster, pool: &str) -> (bool, bool) {
    let biggest = FAMILIES.iter().filter(|f| f.1.mps).map(|f| f.1.memory_mib).max().unwrap_or(0);
    let mut out = (false, false);
    for h in c.hosts(Some(pool)) {
        if h.status != HostStatus::Active || h.health_status != HealthStatus::Ok || h.cordoned {
            continue;
        }
        for g in &h.gpus {
            if g.sharing_mode == SharingMode::Idle {
                out = (true, true);
            } else if g.sharing_mode == SharingMode::NvidiaMps
                && g.remaining_memory_mib >= biggest
                && g.client_count < g.max_clients
            {
                out.0 = true;
            }
        }
        if out == (true, true) {
            break;
        }
    }
    out
}

fn stopped(code: Option<StopCode>, reason: Option<&str>) -> TaskStateReport {
    TaskStateReport {
        last_status: TaskStatus::Stopped,
        health_status: None,
        ready: Some(false),
        stop_code: code,
        stopped_reason: reason.map(str::to_string),
        output: None,
        containers: None,
    }
}
