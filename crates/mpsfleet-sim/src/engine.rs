//! The simulation loop: the real [`Cluster`] on a [`ManualClock`], driven the way the server's
//! loops drive it (a health tick every 250 ms, a resync every 5 s, provider calls outside the
//! cluster, their outcomes fed back), against simulated hosts that behave like the agent.
//!
//! Everything happens in one thread, in virtual time, from one queue ordered by (time,
//! insertion order). Randomness comes only from the seed, through per-host and per-provider
//! streams; nothing iterates a `HashMap`. The server itself draws random ids (hosts,
//! incidents); the simulator never lets those leak into what it records, names hosts by its
//! own labels, and makes task ids a function of the seed (see `reseed_task_ids`).

mod checks;
mod preempt;
mod shortfall;
mod spread;
mod traffic;
pub use traffic::REQUESTS_PER_SECOND;

use crate::config::{fmt_time, plan_faults, Config, Fault, FaultKind, Sabotage, Scenario, WARMUP_MS};
use crate::invariants::{Checker, Violation};
use crate::report::Stats;
use crate::rng::Rng;
use crate::world::{LocalTask, SimHost, World};
use mpsfleet_core::clock::ManualClock;
use mpsfleet_core::lifecycle::mps::{
    self as mh, pool_mps_policy, DaemonHealth, Effect, Event as MpsEvent, Phase,
};
use mpsfleet_core::mps_model::{Probe, Refused};
use mpsfleet_server::cluster::{Cluster, ProviderJob, ProviderOutcome};
use mpsfleet_server::provider::{AttemptRecord, ExternalProvider, Retry};
use mpsfleet_store::{MemoryStore, Revision};
use mpsfleet_types::policy::Provider;
use mpsfleet_types::*;
use shortfall::{Mirror, RoomCache, SvcWorld};
use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap};
use std::sync::Arc;
use std::time::Duration;

pub use crate::timing::*;
pub use crate::world::Demand;

/// One service of the workload.
#[derive(Debug, Clone)]
pub struct SvcSpec {
    pub name: String,
    pub pool: String,
    pub family: &'static str,
    pub desired: u32,
    pub resumption: ResumptionBoundary,
    /// `CreateService.priority`; None: the server's default (50).
    pub priority: Option<u32>,
}

/// The task definitions: two MPS shapes and one whole-GPU job.
pub const FAMILIES: [(&str, Demand); 3] = [
    ("infer", Demand { mps: true, memory_mib: 20_480 }),
    ("embed", Demand { mps: true, memory_mib: 10_240 }),
    ("train", Demand { mps: false, memory_mib: 0 }),
];

/// The `full-pool` scenario's task definitions: a high-priority shape of half a GPU's memory
/// and a low-priority one of a quarter (each a little less, so that four quarters fit in
/// 81,559 MiB): a GPU holds 80,000 MiB of them however they mix, and is full.
pub const FULL_POOL_FAMILIES: [(&str, Demand); 2] = [
    ("critical", Demand { mps: true, memory_mib: 40_000 }),
    ("batch", Demand { mps: true, memory_mib: 20_000 }),
];

/// The priorities of the `full-pool` scenario's services: 80 apart, so that every
/// high-priority replica may preempt every low-priority one.
pub const HIGH_PRIORITY: u32 = 90;
pub const LOW_PRIORITY: u32 = 10;

/// The task definitions a scenario registers.
pub fn families(scenario: Scenario) -> &'static [(&'static str, Demand)] {
    match scenario {
        Scenario::FullPool => &FULL_POOL_FAMILIES,
        _ => &FAMILIES,
    }
}

/// The compute share each MPS task of the workload asks for (`maxComputePercent`).
pub const MPS_COMPUTE_PERCENT: u32 = 50;

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
        priority: None,
    };
    vec![
        svc("infer", "infer", gpus / 2, ResumptionBoundary::Restart),
        svc("embed", "embed", gpus / 2, ResumptionBoundary::Fenced),
        svc("train", "train", gpus / 8, ResumptionBoundary::Restart),
    ]
}

/// The `full-pool` workload: a quarter of the pool's MPS memory in two high-priority
/// services (`critical`, half a GPU each), the other three quarters in two low-priority ones
/// (`batch`, a quarter each). Placed highest priority first, they fill every GPU to 80,000
/// MiB, so no replica fits anywhere once one is lost. All `restart`: a lost replica may start
/// again at once wherever there is room.
pub fn full_pool_workload(pool: &str, hosts: u32, gpus_per_host: u32) -> Vec<SvcSpec> {
    let gpus = hosts * gpus_per_host;
    if gpus == 0 {
        return Vec::new();
    }
    let high = gpus / 2;
    let low = 4 * gpus - 2 * high;
    let svc = |suffix: &str, family, desired: u32, priority| SvcSpec {
        name: format!("{pool}-{suffix}"),
        pool: pool.to_string(),
        family,
        desired: desired.max(1),
        resumption: ResumptionBoundary::Restart,
        priority: Some(priority),
    };
    vec![
        svc("critical-a", "critical", high / 2, HIGH_PRIORITY),
        svc("critical-b", "critical", high - high / 2, HIGH_PRIORITY),
        svc("batch-a", "batch", low / 2, LOW_PRIORITY),
        svc("batch-b", "batch", low - low / 2, LOW_PRIORITY),
    ]
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
    // The provider's events are rare and their jobs large: boxed, so that every queued
    // heartbeat and probe does not carry their size.
    ProviderDone(Box<ProviderDone>),
    ProviderRetry(Box<(ProviderJob, AttemptRecord, u32)>),
}

/// A provider call's outcome, due when the call returns.
struct ProviderDone {
    job: ProviderJob,
    ok: bool,
    /// The control plane's epoch when the call was made.
    epoch: u32,
    /// The host a launch made, to boot.
    launch: Option<usize>,
}

/// A queued event: due at `at`, in insertion order (`seq`) among events due at once.
struct Queued {
    at: u64,
    seq: u64,
    ev: Ev,
}

impl PartialEq for Queued {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}
impl Eq for Queued {}
impl PartialOrd for Queued {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Queued {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.at, self.seq).cmp(&(other.at, other.seq))
    }
}

pub struct Sim {
    pub cfg: Config,
    pub faults: Vec<Fault>,
    store: Arc<MemoryStore>,
    clock: Arc<ManualClock>,
    cluster: Option<Cluster>,
    now: u64,
    /// Due events, earliest first (by time, then insertion order).
    queue: BinaryHeap<Reverse<Queued>>,
    seq: u64,
    world: World,
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
    /// Services crowded on a host, since when, and each pool's bound (`service-spread`).
    spread: spread::Spread,
    /// The server's live service tasks, mirrored from the change feed.
    mirror: Mirror,
    /// Spare capacity per pool, while the cluster has committed nothing since.
    room_cache: RoomCache,
    /// The unresolved incident of each host, by incident id.
    open_incidents: BTreeMap<HostId, String>,
    /// Services whose shortfall is classified again at the end of this step; `all_dirty`: all.
    dirty_svcs: BTreeSet<ServiceName>,
    all_dirty: bool,
    /// Index of the event being processed, for the report.
    pub steps: u64,
    /// Replicas a fault struck, until the server takes them out of rotation (`traffic.rs`).
    rotation: traffic::Rotation,
    /// The preemptions seen, for their invariants, and each service's replicas lost and not
    /// yet back (`preempt.rs`).
    preemptions: crate::preemption::History,
    losses: preempt::Losses,
}

fn err(e: impl std::fmt::Display) -> String {
    e.to_string()
}

impl Sim {
    pub fn new(cfg: Config) -> Result<Sim, String> {
        let heartbeat_ms = cfg.heartbeat_ms;
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
            queue: BinaryHeap::new(),
            seq: 0,
            world: World::new(heartbeat_ms),
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
            spread: spread::Spread::default(),
            mirror: Mirror::default(),
            room_cache: RoomCache::new(),
            open_incidents: BTreeMap::new(),
            dirty_svcs: BTreeSet::new(),
            all_dirty: true,
            steps: 0,
            rotation: traffic::Rotation::default(),
            preemptions: Default::default(),
            losses: Default::default(),
        };
        sim.setup()?;
        Ok(sim)
    }

    fn c(&mut self) -> &mut Cluster {
        self.cluster.as_mut().expect("the cluster is loaded between steps")
    }

    fn at(&mut self, t: u64, ev: Ev) {
        self.seq += 1;
        self.queue.push(Reverse(Queued { at: t.max(self.now), seq: self.seq, ev }));
    }

    fn log(&mut self, line: String) {
        self.trace.push(format!("{} {line}", fmt_time(self.now)));
    }

    /// Pools, task definitions, services and the initial hosts.
    fn setup(&mut self) -> Result<(), String> {
        let (managed, self_managed) = self.cfg.pools();
        let full_pool = self.cfg.scenario == Scenario::FullPool;
        // Said for full-pool (only replicas replacing ones lost to a failure preempt, the
        // server's default), unless the run names its own.
        let preemption = self.cfg.preemption.or(full_pool.then_some(Preemption::Recovery));
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
            let provider = (mode == OwnershipMode::Managed).then(|| Provider {
                launch_timeout_seconds: Some(self.cfg.launch_timeout_seconds),
                ..Provider::local(size)
            });
            let pool = self
                .c()
                .create_pool(CreatePool {
                    name: name.to_string(),
                    mode: Some(mode),
                    provider,
                    preemption,
                    ..CreatePool::default()
                })
                .map_err(err)?;
            if mode == OwnershipMode::Managed {
                self.c().set_provider(pool.name.clone(), Arc::new(ExternalProvider));
            }
            let explained =
                mpsfleet_core::explain::explain(&pool, &mpsfleet_server::cluster::bounds::intervals());
            for part in [
                ("detector", explained.detector.what),
                ("decision", explained.decision.what),
                ("replacement", explained.replacement.what),
                ("resumption", explained.resumption.what),
            ] {
                self.checker.checks += 1;
                if part.1.trim().is_empty() {
                    return Err(format!("pool {name}: explain has no {}", part.0));
                }
            }
            self.spread.add_pool(&pool);
            self.stats.spread = self.spread.stats();
            self.pool_names.push(pool.name.clone());
            if full_pool {
                specs.extend(full_pool_workload(name, size, self.cfg.gpus_per_host));
            } else {
                specs.extend(workload(name, size, self.cfg.gpus_per_host));
            }
        }
        let families = families(self.cfg.scenario);
        for &(family, demand) in families {
            let gpu = if demand.mps {
                serde_json::json!({"type": "GPU", "sharingStrategy": {"nvidiaMps": {"memory": demand.memory_mib, "maxComputePercent": MPS_COMPUTE_PERCENT}}})
            } else {
                serde_json::json!({"type": "GPU", "value": "1"})
            };
            let td = serde_json::json!({"family": family, "containerDefinitions": [{"name": "main",
                "command": ["serve"], "resourceRequirements": [gpu]}]});
            let r = self.c().register_taskdef(td.to_string().as_bytes()).map_err(err)?;
            self.demands.insert(r.task_definition, demand);
        }
        for s in specs {
            let demand = families.iter().find(|f| f.0 == s.family).map(|f| f.1).unwrap_or(families[0].1);
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
                    priority: s.priority,
                    ..Default::default()
                })
                .map_err(err)?;
            self.svcs.insert(
                view.service.name,
                SvcWorld {
                    desired: s.desired,
                    pool: s.pool,
                    demand,
                    fenced: s.resumption == ResumptionBoundary::Fenced,
                    rebalance_fenced: view.service.deployment_configuration.rebalance_fenced,
                    priority: view.service.priority,
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
            self.world[h].phase_ms = DAEMON_RESTART_MS
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
        let gpus = self.cfg.gpus_per_host as usize;
        self.world.add(SimHost::new(label, name, pool, slot, gpus, self.cfg.seed))
    }

    /// Runs to the end (or the first broken invariant).
    pub fn run(&mut self) {
        let end = self.cfg.stop_at_ms.unwrap_or(self.cfg.duration_ms).min(self.cfg.duration_ms);
        while self.queue.peek().is_some_and(|q| q.0.at <= end) {
            let Some(Reverse(Queued { at: t, ev, .. })) = self.queue.pop() else { break };
            self.now = t;
            self.clock_set(t);
            self.steps += 1;
            self.handle(ev);
            self.after_step();
            self.follow_rotation();
            if cfg!(debug_assertions) {
                // Debug builds (the tests) rebuild every index from the records after every
                // step: a drifted index is a bug of the simulator, not of the control plane.
                if let Err(e) = self.world.audit().and_then(|()| self.mirror.audit(&self.world)) {
                    panic!("the simulator's indexes drifted from its records at {}: {e}", fmt_time(t));
                }
            }
            if self.violation.is_some() {
                return;
            }
        }
        self.now = end;
        self.clock_set(end);
        self.finish_rotation();
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
                if self.violation.is_none() {
                    self.check_spread();
                }
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
                if self.world[h].up && self.world[h].daemons[g].gen == gen {
                    self.daemon_step(h, g, ev);
                }
            }
            Ev::RestartDone { h, g, gen } => self.restart_done(h, g, gen),
            Ev::Fetch(h) => self.fetch(h),
            Ev::Started { h, t } => self.started(h, t),
            Ev::Stopped { h, t } => {
                if self.world[h].up && self.world[h].tasks().contains_key(&t) {
                    let code = self.world[h].tasks().get(&t).and_then(|l| l.stop_code);
                    self.remove_task(h, t, true);
                    self.report(h, t, stopped(code, None));
                }
            }
            Ev::ClientsExit { h, g } => {
                if self.world[h].up {
                    let reason = "MPS server reported a fatal GPU exception to its clients";
                    self.kill_tasks(h, g, true, false, StopCode::EssentialContainerExited, reason);
                    self.clear_fault_if_idle(h, g);
                }
            }
            Ev::Heal(h) => {
                if self.world[h].up && self.world[h].partitioned_until == Some(self.now) {
                    self.world[h].partitioned_until = None;
                    let label = self.world[h].label.clone();
                    self.log(format!("heal {label}: the agent reaches the control plane again"));
                    let outbox = std::mem::take(&mut self.world[h].outbox);
                    for (t, r) in outbox {
                        self.report(h, t, r);
                    }
                    self.queue_fetch(h);
                }
            }
            Ev::ProviderDone(d) => self.provider_done(d.job, d.ok, d.epoch, d.launch),
            Ev::ProviderRetry(r) => {
                let (job, record, epoch) = *r;
                if epoch == self.epoch {
                    let r = self.c().provider_attempt_failed(&job, &record);
                    self.after_call(r.map(|()| Vec::new()).map_err(err));
                }
            }
        }
    }

    /// Provider jobs from a cluster call: run them the way `loops::run_provider_jobs` does, in a canonical
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
        // An incident a call asked for runs at once, as the server's health loop is woken.
        if self.c().take_wake() {
            self.c().run_work();
        }
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
        let i = self.cluster.as_ref()?.read().incident(incident).ok()?;
        let h = self.world.by_id(&i.host_id)?;
        Some((h, self.world[h].label.clone()))
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
                let label = self.world.by_name(name).map(|h| self.world[h].label.clone()).unwrap_or_default();
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
                // `loops::run_provider_jobs` records each failed attempt on the incident before its backoff.
                let backoff = retry.backoff_after(attempt).as_millis() as u64;
                let record = AttemptRecord {
                    attempt,
                    error: "the provider refused the call".into(),
                    backoff_ms: Some(backoff),
                };
                let epoch = self.epoch;
                self.at(self.now + delay, Ev::ProviderRetry(Box::new((job.clone(), record, epoch))));
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
                        Some((h, label)) => (format!("{label}r"), self.world[h].slot()),
                        None => (name.clone(), None),
                    }
                };
                let (delay, ok) = self.provider_call(&job, self.cfg.provider.launch_ms);
                // Launch is idempotent by name: a host already launched under it is the answer.
                let existing = self.world.by_name(name).filter(|&h| !self.world[h].gone);
                let launch = match existing {
                    Some(_) => None,
                    None if ok => Some(self.add_host(label.clone(), name.clone(), pool_ix, None)),
                    None => None,
                };
                if let Some(h) = launch {
                    // Slot faults follow the host's replacement once it is up.
                    self.world.assign_slot(h, slot);
                    self.world[h].token = token.as_ref().map(|t| t.0.clone());
                }
                self.stats.provider_launches += 1;
                self.log(format!(
                    "provider launch {label} ({})",
                    if ok { "will succeed" } else { "will fail" }
                ));
                let epoch = self.epoch;
                self.at(
                    self.now + delay,
                    Ev::ProviderDone(Box::new(ProviderDone { job, ok, epoch, launch })),
                );
            }
            ProviderJob::Terminate { .. } => {
                let (delay, ok) = self.provider_call(&job, self.cfg.provider.terminate_ms);
                self.stats.provider_terminations += 1;
                let epoch = self.epoch;
                self.at(
                    self.now + delay,
                    Ev::ProviderDone(Box::new(ProviderDone { job, ok, epoch, launch: None })),
                );
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
                    if let Some(h) = self.world.by_name(name) {
                        if self.world[h].up {
                            let label = self.world[h].label.clone();
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
        let pool = self.pool_names[self.world[h].pool].clone();
        let gpus: Vec<GpuInventory> = self.world[h]
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
            hostname: self.world[h].name().to_string(),
            gpus,
            mps_available: true,
            emulated: true,
            runtime: Default::default(),
            runtime_version: None,
            plugins: Default::default(),
            platform: Default::default(),
        };
        let r = match self.world[h].token.clone() {
            Some(token) => self.c().register_host_with_token(reg, &token),
            None => self.c().register_host(reg),
        };
        let id = match r {
            Ok(r) => r.host_id,
            Err(e) => {
                self.stats.server_errors += 1;
                let label = self.world[h].label.clone();
                self.log(format!("host {label} could not register: {e}"));
                return;
            }
        };
        let label = self.world[h].label.clone();
        // Indexed by its id, and serving its slot (a replacement takes over its old host's).
        self.world.registered(h, id);
        self.world[h].up = true;
        if label != self.world[h].name() || self.world[h].slot().is_none() {
            self.log(format!("host {label} joined"));
        }
        for g in 0..self.world[h].daemons.len() {
            self.world[h].set_health(g, DaemonHealth::new(self.now));
            self.daemon_step(h, g, MpsEvent::Tick);
        }
        self.at(self.now + 1 + self.world[h].phase_ms, Ev::Heartbeat(h));
    }

    fn heartbeat(&mut self, h: usize) {
        if !self.world[h].up {
            return;
        }
        self.at(self.now + self.cfg.heartbeat_ms, Ev::Heartbeat(h));
        if self.world[h].partitioned_until.is_some() {
            return;
        }
        let Some((id, report)) = self.world.heartbeat(h, self.now) else { return };
        self.stats.heartbeats += 1;
        let cluster = self.cluster.as_mut().expect("the cluster is loaded between steps");
        let mut answered = cluster.host_status(id, report);
        if answered.as_ref().is_ok_and(|a| self.world.answered(h, a.checks_rev)) {
            // The server does not hold the checks the heartbeat left out: they go in full.
            let (id, report) = self.world.heartbeat(h, self.now).expect("registered above");
            let cluster = self.cluster.as_mut().expect("the cluster is loaded between steps");
            answered = cluster.host_status(id, report);
            if let Ok(a) = &answered {
                self.world.answered(h, a.checks_rev);
            }
        }
        match answered {
            Ok(answer) => {
                let wanted = pool_mps_policy(&answer.health_policy, &self.world[h].policy);
                if wanted != self.world[h].policy && wanted.validate().is_ok() {
                    self.world[h].policy = wanted;
                }
                self.after_call(Ok(Vec::new()));
            }
            Err(e) => self.after_call(Err(err(e))),
        }
    }

    fn queue_fetch(&mut self, h: usize) {
        if !self.world[h].fetch_queued && self.world[h].up {
            self.world[h].fetch_queued = true;
            self.at(self.now + FETCH_LATENCY_MS, Ev::Fetch(h));
        }
    }

    fn remove_host(&mut self, h: usize) {
        let ids: Vec<TaskId> = self.world[h].tasks().keys().copied().collect();
        for t in ids {
            self.remove_task(h, t, true);
        }
        let host = &mut self.world[h];
        host.up = false;
        host.gone = true;
        host.outbox.clear();
        for d in &mut host.daemons {
            d.gen += 1;
            d.model.exit();
        }
    }

    // ---- MPS daemons ------------------------------------------------------------------------

    fn daemon_step(&mut self, h: usize, g: usize, ev: MpsEvent) {
        let now = self.now;
        let policy = self.world[h].policy.clone();
        let d = &mut self.world[h].daemons[g];
        let (next, effects) = mh::step(d.health().clone(), ev, now, &policy);
        let due = match next.phase {
            Phase::StartDue { at_ms } if at_ms > now => Some(at_ms - now),
            _ => None,
        };
        self.world[h].set_health(g, next);
        if let Some(after) = due {
            // The agent's supervisor ticks every 100 ms: a restart due after its backoff
            // happens then, not at the next probe. The queued probe gives way to it.
            self.world[h].daemons[g].probe_queued = false;
            self.ensure_probe(h, g, after);
        }
        for e in effects {
            if e == Effect::Restart {
                let d = &mut self.world[h].daemons[g];
                // Whatever is left of the daemon goes, and its server with it.
                let had_daemon = d.model.exit();
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
        self.ensure_probe(h, g, self.world[h].policy.probe_interval.as_millis() as u64);
    }

    fn ensure_probe(&mut self, h: usize, g: usize, after: u64) {
        let up = self.world[h].up;
        let d = &mut self.world[h].daemons[g];
        if d.probe_queued || d.steady() || !up {
            return;
        }
        d.probe_queued = true;
        d.probe_token += 1;
        let token = d.probe_token;
        self.at(self.now + after, Ev::Probe { h, g, token });
    }

    fn probe(&mut self, h: usize, g: usize, token: u64) {
        let host = &mut self.world[h];
        if !host.up || host.daemons[g].probe_token != token {
            return;
        }
        let interval = host.policy.probe_interval.as_millis() as u64;
        let timeout = host.policy.probe_timeout;
        let d = &mut host.daemons[g];
        d.probe_queued = false;
        if !d.health().wants_probe() {
            // Starting or a restart is due: time passes for the state machine.
            self.daemon_step(h, g, MpsEvent::Tick);
            self.ensure_probe(h, g, interval);
            return;
        }
        let gen = d.gen;
        let ev = match d.model.probe() {
            Probe::TimedOut => {
                // Its answer is the timeout, that long from now.
                let reason = format!(
                    "probe timed out after {}",
                    mpsfleet_core::health::fmt_ms(timeout.as_millis() as u64)
                );
                let ev = MpsEvent::ProbeFailed { reason };
                self.at(self.now + timeout.as_millis() as u64, Ev::ProbeResult { h, g, gen, ev });
                None
            }
            Probe::NoDaemon => {
                Some(MpsEvent::ProbeFailed { reason: "Cannot find MPS control daemon process".into() })
            }
            Probe::ServerFault => Some(MpsEvent::ServersUnhealthy { reason: "MPS server in FAULT".into() }),
            Probe::Ok => Some(MpsEvent::ProbeOk),
        };
        if let Some(ev) = ev {
            self.daemon_step(h, g, ev);
        }
        self.ensure_probe(h, g, interval);
    }

    fn restart_done(&mut self, h: usize, g: usize, gen: u64) {
        if !self.world[h].up || self.world[h].daemons[g].gen != gen {
            return;
        }
        let d = &mut self.world[h].daemons[g];
        if d.broken_for_good {
            d.model.exit();
            self.daemon_step(h, g, MpsEvent::RestartFailed { reason: "daemon exited with status 1".into() });
            return;
        }
        d.model.start(d.hang_for_good);
        d.stuck_client = false;
        self.daemon_step(h, g, MpsEvent::RestartSucceeded);
        // The agent probes a new daemon at once.
        let d = &mut self.world[h].daemons[g];
        d.probe_queued = false;
        self.ensure_probe(h, g, 0);
    }

    fn crash_daemon(&mut self, h: usize, g: usize, for_good: bool) {
        let d = &mut self.world[h].daemons[g];
        d.broken_for_good |= for_good;
        let starting = d.health().phase == Phase::Starting;
        d.model.exit();
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
        let n = self.world[h].daemons.len();
        (0..n).map(|i| (start + i) % n).find(|&g| self.world[h].has_mps_client(g))
    }

    fn clear_fault_if_idle(&mut self, h: usize, g: usize) {
        if !self.world[h].has_mps_client(g) {
            self.world[h].daemons[g].model.last_client_gone();
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
        let Some(h) = self.world.in_slot(f.slot).filter(|&h| self.world[h].up) else {
            self.log(format!("fault {} slot {}: no host up, skipped", f.kind.cause(), f.slot));
            return;
        };
        let label = self.world[h].label.clone();
        let gpus = self.world[h].daemons.len();
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
        if self.world[h].partitioned_until.is_none() || !matches!(f.kind, FaultKind::Partition { .. }) {
            self.world[h].fault = Some((self.now, f.kind.cause()));
        }
        if gpus == 0 && !matches!(f.kind, FaultKind::Partition { .. } | FaultKind::Vanish) {
            return;
        }
        // The replicas it stops from serving (what it kills), noted before it is applied.
        let struck = match f.kind {
            FaultKind::DaemonCrash { gpu, .. } => {
                Some((Some(self.busy_gpu(h, gpu_of(gpu)).unwrap_or(gpu_of(gpu))), true))
            }
            FaultKind::ServerFault { gpu, .. } => self.busy_gpu(h, gpu_of(gpu)).map(|g| (Some(g), true)),
            FaultKind::BadDriver => Some((None, true)),
            FaultKind::GpuXid { gpu } => Some((Some(gpu_of(gpu)), false)),
            FaultKind::Vanish => Some((None, false)),
            _ => None,
        };
        if let Some((gpu, mps_only)) = struck {
            self.strike(h, gpu, mps_only);
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
                let d = &mut self.world[h].daemons[g];
                d.model.hang();
                d.hang_for_good |= for_good;
                self.ensure_probe(h, g, 0);
            }
            FaultKind::ServerFault { gpu, stuck_client } => {
                // A server faults because of a client: the first GPU from `gpu` on that has one.
                let Some(g) = self.busy_gpu(h, gpu_of(gpu)) else {
                    self.log("no MPS client on the host: nothing to fault".into());
                    return;
                };
                let d = &mut self.world[h].daemons[g];
                if d.model.fault() {
                    d.stuck_client = stuck_client;
                    if !stuck_client {
                        self.at(self.now + CLIENT_EXIT_MS, Ev::ClientsExit { h, g });
                    }
                    self.clear_fault_if_idle(h, g);
                    self.ensure_probe(h, g, 0);
                }
            }
            FaultKind::GpuXid { gpu } => {
                let g = gpu_of(gpu);
                self.world[h].xid(g, self.now);
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
                if self.world[h].partitioned_until.is_none() {
                    let until = self.now + for_ms.max(1);
                    self.world[h].partitioned_until = Some(until);
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
        self.room_cache.clear();
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
        for h in 0..self.world.len() {
            if self.world[h].up {
                self.queue_fetch(h);
            }
        }
        let r = self.c().take_jobs();
        self.after_call(Ok(r));
    }

    // ---- tasks ------------------------------------------------------------------------------

    fn report(&mut self, h: usize, t: TaskId, r: TaskStateReport) {
        if !self.world[h].up {
            return;
        }
        if self.world[h].partitioned_until.is_some() {
            self.world[h].outbox.push((t, r));
            return;
        }
        let Some(id) = self.world[h].id().cloned() else { return };
        self.stats.reports += 1;
        let res = self.c().report_task(&id, &t.to_string(), r);
        if res.is_err() {
            self.stats.rejected_reports += 1;
        }
        self.after_call(Ok(Vec::new()));
    }

    fn fetch(&mut self, h: usize) {
        self.world[h].fetch_queued = false;
        if !self.world[h].up || self.world[h].partitioned_until.is_some() {
            return;
        }
        let Some(id) = self.world[h].id().cloned() else { return };
        let Ok((_, a)) = self.c().read().assignments(&id) else { return };
        let mut listed = BTreeSet::new();
        let mut tasks = a.tasks;
        tasks.sort_by_key(|t| (t.created_at_ms, t.id));
        for task in tasks {
            listed.insert(task.id);
            let local = self.world[h].tasks().get(&task.id).map(|l| l.stopping);
            if task.desired_status == TaskStatus::Stopped {
                match local {
                    // The deliberate bug of test builds: the stop the service scheduler asked
                    // for (a move, an extra copy) is lost, and the process goes on running.
                    Some(false)
                        if self.sabotaged(Sabotage::LoseSchedulerStops)
                            && task.stop_code == Some(StopCode::ServiceSchedulerInitiated) => {}
                    Some(false) => {
                        if let Some(l) = self.world[h].task_mut(&task.id) {
                            l.stopping = true;
                            l.stop_code = Some(task.stop_code.unwrap_or(StopCode::UserInitiated));
                        }
                        let d = self.world[h].rng.range(TASK_STOP_MS.0, TASK_STOP_MS.1);
                        self.at(self.now + d, Ev::Stopped { h, t: task.id });
                    }
                    Some(true) => {}
                    None if task.last_status != TaskStatus::Stopped
                        && !self.world[h].finished.contains(&task.id) =>
                    {
                        self.world[h].finished.insert(task.id);
                        let code = task.stop_code.unwrap_or(StopCode::UserInitiated);
                        self.report(h, task.id, stopped(Some(code), None));
                    }
                    None => {}
                }
            } else if local.is_none()
                && task.last_status < TaskStatus::Running
                && !self.world[h].finished.contains(&task.id)
            {
                self.start_task(h, &task);
            }
        }
        // What the server no longer lists has been stopped there (the host left the fleet).
        let gone: Vec<TaskId> =
            self.world[h].tasks().keys().filter(|t| !listed.contains(t)).copied().collect();
        for t in gone {
            self.remove_task(h, t, true);
        }
    }

    fn start_task(&mut self, h: usize, task: &Task) {
        if self.sabotaged(Sabotage::LoseServiceStarts)
            && !self.stats.faults.is_empty()
            && task.group.is_some()
        {
            return;
        }
        let demand = self.demands.get(&task.task_definition).copied().unwrap_or(FAMILIES[0].1);
        let gpus: Vec<usize> = task.gpu_ids.iter().filter_map(|u| self.world[h].gpu_index(u)).collect();
        self.world[h].finished.insert(task.id);
        let xid = gpus.iter().any(|&g| self.world[h].daemons[g].xid_since().is_some());
        if xid || gpus.is_empty() {
            self.report(
                h,
                task.id,
                stopped(Some(StopCode::TaskFailedToStart), Some("GPU unusable (Xid 79)")),
            );
            return;
        }
        // The deliberate bug of test builds: the agent skips its daemon check (fails open).
        let fail_open = self.sabotaged(Sabotage::FailOpen);
        if demand.mps {
            // The task's client connects to the daemon (and its server starts for the first).
            let connected = self.world[h].daemons[gpus[0]].model.connect();
            let answers = !matches!(connected, Err(Refused::NoDaemon | Refused::Hung));
            let faulted = connected == Err(Refused::Fault);
            if !answers && fail_open {
                self.checker.checks += 1;
                let label = self.world[h].label.clone();
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
        self.world[h].finished.remove(&task.id);
        self.world.start_task(h, task.id, LocalTask::starting(gpus, demand, task.group.clone()));
        self.mark(h);
        let d = self.world[h].rng.range(TASK_START_MS.0, TASK_START_MS.1);
        self.at(self.now + d, Ev::Started { h, t: task.id });
    }

    /// Whether this test build runs with the deliberate bug `s` ([`Config::sabotage`]).
    fn sabotaged(&self, s: Sabotage) -> bool {
        cfg!(any(test, feature = "broken-invariant")) && self.cfg.sabotage == Some(s)
    }

    fn started(&mut self, h: usize, t: TaskId) {
        let now = self.now;
        let up = self.world[h].up;
        let Some(l) = self.world[h].tasks().get(&t) else { return };
        if !up || l.running_since().is_some() || l.stopping {
            return;
        }
        let svc = l.service.clone();
        self.world.set_running(h, t, now);
        if let Some(s) = svc {
            self.mirror.world_changed(&s, t, &self.world);
            self.svc_change(&s, 1);
            self.replica_back(&s);
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
                pull: None,
            },
        );
    }

    /// The process is gone; `lost`: the work it had done is lost (it starts again elsewhere).
    fn remove_task(&mut self, h: usize, t: TaskId, lost: bool) {
        let Some(l) = self.world.remove_task(h, t) else { return };
        self.mark(h);
        self.world[h].finished.insert(t);
        if let Some(since) = l.running_since() {
            if lost {
                self.stats.work_lost_ms += u128::from(self.now.saturating_sub(since));
            }
            if let Some(s) = &l.service {
                self.mirror.world_changed(s, t, &self.world);
                self.svc_change(s, -1);
                self.replica_lost(s, l.stop_code == Some(StopCode::Preempted));
            }
        }
        for g in l.gpus {
            if self.world[h].daemons.get(g).is_some_and(|d| d.stuck_fault()) {
                self.clear_fault_if_idle(h, g);
            }
        }
    }

    /// Tasks on GPU `g` exit: MPS clients (`mps`) and, with `all`, whole-GPU ones too.
    fn kill_tasks(&mut self, h: usize, g: usize, mps: bool, all: bool, code: StopCode, reason: &str) {
        let victims: Vec<TaskId> = self.world[h]
            .tasks()
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
        pull: None,
    }
}
