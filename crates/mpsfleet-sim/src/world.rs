//! The simulated world: hosts, the MPS daemon of each of their GPUs, and the task processes
//! they run, with the indexes the loop looks them up by.
//!
//! The loop handles millions of events, each about one host, a task or a record of the server
//! that names a host by its id: nothing here is found by walking the hosts. [`World`] owns the
//! hosts and keeps its indexes in step with them:
//!
//! - by server host id (set when a host registers), by hostname, and by fault slot (the host
//!   serving the slot now: an initial host, or its replacement once that is up);
//! - the task processes that run (started and not yet exited), to the host they run on.
//!
//! The fields an index is derived from (a host's id, name and slot; a task's start time) are
//! private and change only through [`World`]'s methods; [`World::audit`] rebuilds every index
//! from the records and names the first difference.

use crate::rng::Rng;
use mpsfleet_core::lifecycle::mps::{Check, DaemonHealth, MpsPolicy, Phase};
use mpsfleet_core::mps_model;
use mpsfleet_types::api::HostStatusReport;
use mpsfleet_types::{
    GpuUuid, HealthStatus, HostCheck, HostId, ServiceName, StopCode, TaskId, TaskStateReport,
};
use std::collections::{BTreeMap, BTreeSet};

/// A task definition the workload uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Demand {
    pub mps: bool,
    pub memory_mib: u64,
}

/// One GPU's MPS control daemon, as the world has it and as the agent's state machine sees it.
#[derive(Debug)]
pub(crate) struct Daemon {
    /// The daemon's process and its server, by core's rules (`mps_model`), which the agent's
    /// model mode runs too.
    pub model: mps_model::Daemon,
    pub hang_for_good: bool,
    pub broken_for_good: bool,
    /// A client of a server in FAULT is stuck: it does not exit, so the FAULT stays until
    /// the daemon is restarted.
    pub stuck_client: bool,
    /// Since when the GPU is off the bus; set through [`SimHost::xid`] (it is in the report).
    xid_since: Option<u64>,
    /// Set through [`SimHost::set_health`] (its check is in the report).
    health: DaemonHealth,
    /// Bumped on every (re)start and crash: results of older ones are dropped.
    pub gen: u64,
    /// The probe event that counts; older queued probes are dropped.
    pub probe_token: u64,
    pub probe_queued: bool,
}

impl Daemon {
    /// A daemon not yet started.
    pub fn new() -> Daemon {
        Daemon {
            model: mps_model::Daemon::down(),
            hang_for_good: false,
            broken_for_good: false,
            stuck_client: false,
            xid_since: None,
            health: DaemonHealth::new(0),
            gen: 0,
            probe_token: 0,
            probe_queued: false,
        }
    }

    /// Probing changes nothing: the daemon answers, the check is OK with no failures, and no
    /// earlier failure is still going on (one is over only once the daemon has answered the
    /// failure threshold's probes in a row: until then the agent goes on probing, and a new
    /// failure would count from the old one's first signal).
    pub fn steady(&self) -> bool {
        self.model.probe() == mps_model::Probe::Ok
            && self.health.phase == Phase::Running
            && self.health.check.status == HealthStatus::Ok
            && self.health.check.consecutive_failures == 0
            && self.health.check.failing_since_ms.is_none()
    }

    /// Its server is in FAULT, held there by a stuck client.
    pub fn stuck_fault(&self) -> bool {
        self.model.server() == mps_model::Server::Fault && self.stuck_client
    }

    pub fn health(&self) -> &DaemonHealth {
        &self.health
    }

    pub fn xid_since(&self) -> Option<u64> {
        self.xid_since
    }
}

/// A task process on a simulated host.
#[derive(Debug)]
pub(crate) struct LocalTask {
    pub gpus: Vec<usize>,
    pub demand: Demand,
    pub service: Option<ServiceName>,
    /// When it started running; set by [`World::set_running`] only (it is indexed).
    running_since: Option<u64>,
    pub stopping: bool,
    /// The stop code the server gave when it asked the task to stop; reported back with the
    /// exit, as the agent does.
    pub stop_code: Option<StopCode>,
}

impl LocalTask {
    /// A process that is starting.
    pub fn starting(gpus: Vec<usize>, demand: Demand, service: Option<ServiceName>) -> LocalTask {
        LocalTask { gpus, demand, service, running_since: None, stopping: false, stop_code: None }
    }

    pub fn running_since(&self) -> Option<u64> {
        self.running_since
    }

    /// An MPS client on GPU `g`.
    pub fn mps_client_of(&self, g: usize) -> bool {
        self.demand.mps && self.gpus.contains(&g)
    }
}

/// One simulated machine: its agent, its GPUs' daemons and its task processes.
#[derive(Debug)]
pub(crate) struct SimHost {
    /// The simulator's name for it (`gpu-3`, its replacement `gpu-3r`): what the report and
    /// the trace show.
    pub label: String,
    /// The hostname it registers under (indexed).
    name: String,
    /// The one-time registration token the provider launched the host with (a replacement).
    pub token: Option<String>,
    pub pool: usize,
    /// The fault slot it serves, or will serve once it is up (indexed while it serves it).
    slot: Option<u32>,
    /// The server's id for it, once registered (indexed).
    id: Option<HostId>,
    pub up: bool,
    pub partitioned_until: Option<u64>,
    pub gpu_uuids: Vec<GpuUuid>,
    pub daemons: Vec<Daemon>,
    /// Its last heartbeat (checks: `MPS_DAEMON` of each GPU, then `GPU` of each), sent again
    /// as it is until a daemon's check or an Xid changes them, or while a check carries an
    /// age (a failure's, a restart's), which moves with the clock: a heartbeat a second per
    /// host repeats the last one almost always, and the server takes it by reference.
    report: Option<HostStatusReport>,
    /// `report` without its checks (`checksUnchanged`), sent while the server holds them.
    repeat: HostStatusReport,
    /// The number of `report`'s checks (`checksRev`): one more each time it is built.
    checks_rev: u64,
    /// Whether the server answered that it holds `report`'s checks.
    held: bool,
    /// Whether a check of `report` carries an age (a failure's, a restart's), which grows
    /// with the clock: sent in full, it is built again with the ages of that moment.
    ages: bool,
    /// Its task processes, starting, running or stopping (the running ones are indexed).
    tasks: BTreeMap<TaskId, LocalTask>,
    /// Tasks this host started and finished: never started again.
    pub finished: BTreeSet<TaskId>,
    pub outbox: Vec<(TaskId, TaskStateReport)>,
    pub policy: MpsPolicy,
    pub rng: Rng,
    /// The last injected fault: when and what.
    pub fault: Option<(u64, &'static str)>,
    pub fetch_queued: bool,
    /// Delay of the first heartbeat after boot.
    pub phase_ms: u64,
    /// Terminated or vanished: never comes back.
    pub gone: bool,
}

impl SimHost {
    /// A host that has not booted: `gpus` GPUs named after its label, daemons not started.
    pub fn new(
        label: String,
        name: String,
        pool: usize,
        slot: Option<u32>,
        gpus: usize,
        seed: u64,
    ) -> SimHost {
        let gpu_uuids = (0..gpus)
            .map(|g| {
                GpuUuid::new(format!("GPU-{label}-{g}")).unwrap_or_else(|_| GpuUuid::new("GPU-x").unwrap())
            })
            .collect();
        SimHost {
            rng: Rng::fork(seed, &label),
            label,
            name,
            token: None,
            pool,
            slot,
            id: None,
            up: false,
            partitioned_until: None,
            gpu_uuids,
            daemons: (0..gpus).map(|_| Daemon::new()).collect(),
            report: None,
            repeat: HostStatusReport::default(),
            checks_rev: 0,
            held: false,
            ages: false,
            tasks: BTreeMap::new(),
            finished: BTreeSet::new(),
            outbox: Vec::new(),
            policy: MpsPolicy::default(),
            fault: None,
            fetch_queued: false,
            phase_ms: 0,
            gone: false,
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn id(&self) -> Option<&HostId> {
        self.id.as_ref()
    }

    pub fn slot(&self) -> Option<u32> {
        self.slot
    }

    pub fn tasks(&self) -> &BTreeMap<TaskId, LocalTask> {
        &self.tasks
    }

    /// A task's process, to mark it stopping (its start time changes only through the world).
    pub fn task_mut(&mut self, t: &TaskId) -> Option<&mut LocalTask> {
        self.tasks.get_mut(t)
    }

    /// The GPU of this host with this UUID.
    pub fn gpu_index(&self, uuid: &GpuUuid) -> Option<usize> {
        self.gpu_uuids.iter().position(|u| u == uuid)
    }

    /// GPU `g`'s daemon is in state `health` now.
    pub fn set_health(&mut self, g: usize, health: DaemonHealth) {
        let (old, new) = (&self.daemons[g].health.check, &health.check);
        // Everything of the check that its heartbeat carries.
        let reported = |c: &Check| (c.status, c.since_ms, c.failing_since_ms);
        if reported(old) != reported(new) || old.reason != new.reason || old.repairs_ms != new.repairs_ms {
            self.report = None;
        }
        self.daemons[g].health = health;
    }

    /// GPU `g` fell off the bus at `now` (if it had not before).
    pub fn xid(&mut self, g: usize, now: u64) {
        if self.daemons[g].xid_since.is_none() {
            self.daemons[g].xid_since = Some(now);
            self.report = None;
        }
    }

    /// Whether a check of its heartbeat carries an age, which changes with every report.
    fn reports_ages(&self) -> bool {
        self.daemons.iter().any(|d| {
            let c = &d.health.check;
            c.failing_since_ms.is_some() || !c.repairs_ms.is_empty() || d.xid_since.is_some()
        })
    }

    /// The checks its agent reports, built from the daemons' state.
    fn build_checks(&self, now: u64) -> Vec<HostCheck> {
        let mut checks = Vec::with_capacity(self.daemons.len() * 2);
        for (g, d) in self.daemons.iter().enumerate() {
            let c = &d.health.check;
            checks.push(HostCheck {
                name: mpsfleet_core::health::MPS_DAEMON.into(),
                gpu_id: Some(self.gpu_uuids[g].clone()),
                status: c.status,
                reason: c.reason.clone(),
                since_ms: c.since_ms,
                restarts: 0,
                first_failure_age_ms: c.failing_since_ms.map(|t| now.saturating_sub(t)),
                repair_ages_ms: c.repairs_ms.iter().map(|t| now.saturating_sub(*t)).collect(),
            });
        }
        for (g, d) in self.daemons.iter().enumerate() {
            let (status, reason, since) = match d.xid_since {
                Some(t) => (HealthStatus::Impaired, "Xid 79: GPU has fallen off the bus".to_string(), t),
                None => (HealthStatus::Ok, "no Xid errors".to_string(), 0),
            };
            checks.push(HostCheck {
                name: mpsfleet_core::health::GPU.into(),
                gpu_id: Some(self.gpu_uuids[g].clone()),
                status,
                reason,
                since_ms: since,
                restarts: 0,
                first_failure_age_ms: d.xid_since.map(|t| now.saturating_sub(t)),
                repair_ages_ms: Vec::new(),
            });
        }
        checks
    }

    /// Whether GPU `g` has an MPS client.
    pub fn has_mps_client(&self, g: usize) -> bool {
        self.tasks.values().any(|t| t.mps_client_of(g))
    }
}

/// The hosts, and the indexes over them (module docs).
#[derive(Debug, Default)]
pub(crate) struct World {
    hosts: Vec<SimHost>,
    by_id: BTreeMap<HostId, usize>,
    by_name: BTreeMap<String, usize>,
    /// The host serving each fault slot now.
    slots: BTreeMap<u32, usize>,
    /// Running task processes, to their host.
    running: BTreeMap<TaskId, usize>,
    /// The agents' heartbeat interval, which their heartbeats report.
    pub heartbeat_ms: u64,
}

impl std::ops::Index<usize> for World {
    type Output = SimHost;
    fn index(&self, h: usize) -> &SimHost {
        &self.hosts[h]
    }
}

impl std::ops::IndexMut<usize> for World {
    fn index_mut(&mut self, h: usize) -> &mut SimHost {
        &mut self.hosts[h]
    }
}

impl World {
    /// No hosts yet; agents that heartbeat every `heartbeat_ms`.
    pub fn new(heartbeat_ms: u64) -> World {
        World { heartbeat_ms, ..World::default() }
    }

    pub fn len(&self) -> usize {
        self.hosts.len()
    }

    /// Adds a host; its name is looked up from now on (a later host of the same name, a
    /// relaunch, takes the name over), and an initial host serves its slot at once.
    pub fn add(&mut self, host: SimHost) -> usize {
        let h = self.hosts.len();
        self.by_name.insert(host.name.clone(), h);
        if let Some(s) = host.slot {
            self.slots.insert(s, h);
        }
        self.hosts.push(host);
        h
    }

    /// The slot a host will serve once it is up (a replacement takes over its old host's).
    pub fn assign_slot(&mut self, h: usize, slot: Option<u32>) {
        self.hosts[h].slot = slot;
    }

    /// The host registered under `id`: indexed by it; the host serves its slot from now on.
    pub fn registered(&mut self, h: usize, id: HostId) {
        self.by_id.insert(id.clone(), h);
        self.hosts[h].id = Some(id);
        if let Some(s) = self.hosts[h].slot {
            self.slots.insert(s, h);
        }
    }

    pub fn by_id(&self, id: &HostId) -> Option<usize> {
        self.by_id.get(id).copied()
    }

    pub fn by_name(&self, name: &str) -> Option<usize> {
        self.by_name.get(name).copied()
    }

    /// The host serving fault slot `s`.
    pub fn in_slot(&self, s: u32) -> Option<usize> {
        self.slots.get(&s).copied()
    }

    /// A task process starts on host `h` (not yet running).
    pub fn start_task(&mut self, h: usize, t: TaskId, task: LocalTask) {
        if let Some(old) = self.hosts[h].tasks.insert(t, task) {
            if old.running_since.is_some() {
                self.running.remove(&t);
            }
        }
        if self.hosts[h].tasks[&t].running_since.is_some() {
            self.running.insert(t, h);
        }
    }

    /// The task process on host `h` runs from `now`. False when there is no such process or
    /// it already ran.
    pub fn set_running(&mut self, h: usize, t: TaskId, now: u64) -> bool {
        let Some(l) = self.hosts[h].tasks.get_mut(&t) else { return false };
        if l.running_since.is_some() {
            return false;
        }
        l.running_since = Some(now);
        self.running.insert(t, h);
        true
    }

    /// The task process on host `h` is gone.
    pub fn remove_task(&mut self, h: usize, t: TaskId) -> Option<LocalTask> {
        let l = self.hosts[h].tasks.remove(&t)?;
        if l.running_since.is_some() {
            self.running.remove(&t);
        }
        Some(l)
    }

    /// The host whose process of task `t` runs now.
    pub fn running_on(&self, t: &TaskId) -> Option<usize> {
        self.running.get(t).copied()
    }

    /// The heartbeat host `h`'s agent sends: one `MPS_DAEMON` and one `GPU` check per GPU, as
    /// the daemons' health and the Xids stand; onboarded once no daemon check is INITIALIZING.
    pub fn status_report(&mut self, h: usize, now: u64) -> &HostStatusReport {
        let host = &mut self.hosts[h];
        let changed = host.report.is_none();
        if changed || host.ages {
            let checks = host.build_checks(now);
            let gpus = host.gpu_uuids.len();
            let onboarded =
                checks[..gpus.min(checks.len())].iter().all(|c| c.status != HealthStatus::Initializing);
            if changed {
                // The same checks with older ages keep their number, as the agent's do.
                host.checks_rev += 1;
                host.held = false;
                host.ages = host.reports_ages();
            }
            let checks_rev = Some(host.checks_rev);
            host.repeat = HostStatusReport {
                onboarded,
                checks_rev,
                checks_unchanged: true,
                ..HostStatusReport::default()
            };
            let heartbeat_ms = Some(self.heartbeat_ms);
            host.report = Some(HostStatusReport {
                onboarded,
                checks,
                checks_rev,
                heartbeat_ms,
                ..HostStatusReport::default()
            });
        }
        let report = host.report.as_ref().expect("built above");
        debug_assert_eq!(report.checks, host.build_checks(now), "the heartbeat of {} is stale", host.label);
        debug_assert_eq!(host.ages, host.reports_ages(), "the heartbeat of {} is stale", host.label);
        report
    }

    /// The heartbeat a registered host's agent sends, with the id it reports under:
    /// [`World::status_report`], without its checks while the server holds them (as the
    /// agent's `ReportedChecks` sends it).
    pub fn heartbeat(&mut self, h: usize, now: u64) -> Option<(&HostId, &HostStatusReport)> {
        let host = &self.hosts[h];
        host.id.as_ref()?;
        if !host.held || host.report.is_none() {
            self.status_report(h, now);
        }
        let host = &self.hosts[h];
        let report = if host.held { &host.repeat } else { host.report.as_ref()? };
        Some((host.id.as_ref()?, report))
    }

    /// Takes the server's answer to host `h`'s heartbeat: the number of the checks it holds.
    /// True when the heartbeat left its checks out and the server does not hold them: the
    /// agent sends them again at once, in full.
    pub fn answered(&mut self, h: usize, held: Option<u64>) -> bool {
        let host = &mut self.hosts[h];
        let repeated = host.held;
        host.held = held == Some(host.checks_rev);
        repeated && !host.held
    }

    /// Rebuilds every index from the hosts and their tasks; the first difference, in words.
    pub fn audit(&self) -> Result<(), String> {
        let mut by_id = BTreeMap::new();
        let mut by_name = BTreeMap::new();
        let mut running = BTreeMap::new();
        for (h, host) in self.hosts.iter().enumerate() {
            if let Some(id) = &host.id {
                if by_id.insert(id.clone(), h).is_some() {
                    return Err(format!("host id {id} is held by two hosts"));
                }
            }
            // The latest host of a name is the one the provider answers with.
            by_name.insert(host.name.clone(), h);
            for (t, l) in &host.tasks {
                if l.running_since.is_some() && running.insert(*t, h).is_some() {
                    return Err(format!("task {t} runs on two hosts"));
                }
            }
        }
        if by_id != self.by_id {
            return Err(format!("ids: indexed {:?}, records {by_id:?}", self.by_id));
        }
        if by_name != self.by_name {
            return Err(format!("names: indexed {:?}, records {by_name:?}", self.by_name));
        }
        if running != self.running {
            return Err(format!("running tasks: indexed {:?}, records {running:?}", self.running));
        }
        for (s, &h) in &self.slots {
            if self.hosts.get(h).and_then(|x| x.slot) != Some(*s) {
                return Err(format!("slot {s} is indexed to host {h}, which does not serve it"));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MPS: Demand = Demand { mps: true, memory_mib: 10_240 };
    const WHOLE: Demand = Demand { mps: false, memory_mib: 0 };

    fn host(name: &str, slot: Option<u32>) -> SimHost {
        SimHost::new(name.to_string(), name.to_string(), 0, slot, 2, 7)
    }

    fn id(s: &str) -> HostId {
        HostId::new(s).unwrap()
    }

    #[track_caller]
    fn audited(w: &World) {
        if let Err(e) = w.audit() {
            panic!("the indexes drifted from the records: {e}");
        }
    }

    /// Hosts are found by server id, by name and by slot, and the lookups agree with the
    /// records, as hosts are added, register, and a replacement takes over a slot.
    #[test]
    fn hosts_are_found_by_id_name_and_slot() {
        let mut w = World::default();
        let a = w.add(host("gpu-0", Some(0)));
        let b = w.add(host("gpu-1", Some(1)));
        audited(&w);
        assert_eq!((w.len(), w.by_name("gpu-1"), w.by_name("gpu-9")), (2, Some(b), None));
        assert_eq!((w.in_slot(0), w.in_slot(1), w.in_slot(2)), (Some(a), Some(b), None));
        assert_eq!(w.by_id(&id("h-a")), None);

        w.registered(a, id("h-a"));
        w.registered(b, id("h-b"));
        audited(&w);
        assert_eq!((w.by_id(&id("h-a")), w.by_id(&id("h-b"))), (Some(a), Some(b)));
        assert_eq!(w[a].id(), Some(&id("h-a")));

        // A replacement of gpu-0 is launched for slot 0: the slot keeps pointing at the old
        // host until the replacement is up, then follows it.
        let r = w.add(SimHost::new("gpu-0r".into(), "gpu-rep-1".into(), 0, None, 2, 7));
        w.assign_slot(r, w[a].slot());
        audited(&w);
        assert_eq!(w.in_slot(0), Some(a));
        w.registered(r, id("h-r"));
        audited(&w);
        assert_eq!((w.in_slot(0), w.by_name("gpu-rep-1"), w.by_id(&id("h-r"))), (Some(r), Some(r), Some(r)));
        assert_eq!(w[r].label, "gpu-0r");
        // The old host is still found by its own id (its records still name it).
        assert_eq!(w.by_id(&id("h-a")), Some(a));
    }

    /// A launch under a name already used is found under that name from then on.
    #[test]
    fn a_name_launched_again_finds_the_newest_host() {
        let mut w = World::default();
        let old = w.add(host("gpu-x", None));
        w[old].gone = true;
        let new = w.add(host("gpu-x", None));
        audited(&w);
        assert_eq!(w.by_name("gpu-x"), Some(new));
    }

    /// The running-task index follows starts, runs and exits, on the host they happen on.
    #[test]
    fn running_tasks_are_indexed_to_their_host() {
        let mut w = World::default();
        let a = w.add(host("gpu-0", Some(0)));
        let b = w.add(host("gpu-1", Some(1)));
        let (t1, t2, t3) = (TaskId(1), TaskId(2), TaskId(3));
        w.start_task(a, t1, LocalTask::starting(vec![0], MPS, None));
        w.start_task(a, t2, LocalTask::starting(vec![1], WHOLE, None));
        w.start_task(b, t3, LocalTask::starting(vec![0], MPS, None));
        audited(&w);
        assert_eq!(w.running_on(&t1), None, "starting is not running");

        assert!(w.set_running(a, t1, 5_000));
        assert!(!w.set_running(a, t1, 6_000), "runs once");
        assert!(!w.set_running(b, t1, 6_000), "not a process of that host");
        assert!(w.set_running(b, t3, 7_000));
        audited(&w);
        assert_eq!((w.running_on(&t1), w.running_on(&t2), w.running_on(&t3)), (Some(a), None, Some(b)));
        assert_eq!(w[a].tasks()[&t1].running_since(), Some(5_000));

        // Marking one stopping leaves it running until it exits.
        if let Some(l) = w[a].task_mut(&t1) {
            l.stopping = true;
        }
        assert_eq!(w.running_on(&t1), Some(a));
        let gone = w.remove_task(a, t1).expect("it ran there");
        assert_eq!(gone.running_since(), Some(5_000));
        assert!(w.remove_task(a, t1).is_none());
        assert!(w.remove_task(a, t2).is_some());
        audited(&w);
        assert_eq!((w.running_on(&t1), w.running_on(&t3)), (None, Some(b)));
        assert!(w[a].tasks().is_empty());
    }

    /// GPUs are found by UUID on their own host, and MPS clients by GPU.
    #[test]
    fn gpus_and_their_clients() {
        let mut w = World::default();
        let a = w.add(host("gpu-0", Some(0)));
        let b = w.add(host("gpu-1", Some(1)));
        let u1 = w[a].gpu_uuids[1].clone();
        assert_eq!((w[a].gpu_index(&u1), w[b].gpu_index(&u1)), (Some(1), None));
        assert_eq!(w[b].gpu_index(&w[b].gpu_uuids[0].clone()), Some(0));
        assert_eq!(w[a].daemons.len(), 2);
        assert!(w[a].daemons.iter().all(|d| !d.model.answers() && !d.steady()));

        w.start_task(a, TaskId(1), LocalTask::starting(vec![1], MPS, None));
        w.start_task(a, TaskId(2), LocalTask::starting(vec![0], WHOLE, None));
        assert!(w[a].has_mps_client(1));
        assert!(!w[a].has_mps_client(0), "a whole-GPU task is no MPS client");
        assert!(!w[b].has_mps_client(1));
    }

    /// A daemon that local repair brought back is not steady (its probes go on) until it has
    /// answered the failure threshold's probes in a row: until then its failure is not over,
    /// and a probe left out would leave it running for hours (the seed sweep's seed 42, whose
    /// next failure was timed from this one).
    #[test]
    fn a_repaired_daemon_is_probed_until_its_failure_is_over() {
        use mpsfleet_core::lifecycle::mps::{step, Effect, Event};
        let policy = MpsPolicy::default();
        let mut d = Daemon::new();
        let go = |d: &mut Daemon, ev: Event, t: u64| {
            let (h, effects) = step(d.health.clone(), ev, t, &policy);
            d.health = h;
            if effects.contains(&Effect::Restart) {
                d.model.start(false);
                d.health = step(d.health.clone(), Event::RestartSucceeded, t, &policy).0;
            }
        };
        go(&mut d, Event::Tick, 0);
        for t in 1..=policy.failure_threshold as u64 {
            go(&mut d, Event::ProbeOk, t * 1_000);
        }
        assert!(d.steady(), "{:?}", d.health.check);
        d.model.exit();
        go(&mut d, Event::DaemonExited { reason: "killed".into() }, 10_000);
        go(&mut d, Event::ProbeOk, 10_100);
        assert_eq!(d.health.check.status, HealthStatus::Ok);
        assert_eq!(d.health.check.failing_since_ms, Some(10_000));
        assert!(!d.steady(), "answered once after the repair: the failure goes on");
        for t in 2..=policy.failure_threshold as u64 {
            assert!(!d.steady());
            go(&mut d, Event::ProbeOk, 10_000 + t * 1_000);
        }
        assert_eq!(d.health.check.failing_since_ms, None, "over");
        assert!(d.steady());
    }

    /// The heartbeat's checks follow the daemons' checks and the Xids, whether built afresh
    /// or repeated from the last heartbeat.
    #[test]
    fn the_heartbeat_reports_what_the_daemons_say() {
        let mut w = World::default();
        let a = w.add(host("gpu-0", Some(0)));
        let fresh = |h: &SimHost| h.build_checks(100);
        let r = w.status_report(a, 100).clone();
        assert_eq!(r.checks.len(), 4, "an MPS_DAEMON and a GPU check per GPU");
        assert_eq!(r.checks, fresh(&w[a]));
        assert_eq!(r.checks[0].name, mpsfleet_core::health::MPS_DAEMON);
        assert_eq!(r.checks[1].gpu_id.as_ref(), Some(&w[a].gpu_uuids[1]));
        assert!(r.checks[2..]
            .iter()
            .all(|c| c.name == mpsfleet_core::health::GPU && c.status == HealthStatus::Ok));

        // An Xid on GPU 1: its GPU check turns IMPAIRED at once, and stays so.
        w[a].xid(1, 42);
        w[a].xid(1, 99);
        let r = w.status_report(a, 100).clone();
        assert_eq!(r.checks, fresh(&w[a]));
        assert_eq!((r.checks[3].status, r.checks[3].since_ms), (HealthStatus::Impaired, 42));
        assert_eq!(w[a].daemons[1].xid_since(), Some(42));
        assert_eq!(r.checks[3].first_failure_age_ms, Some(58), "the failure's age at the report");
        let later = w.status_report(a, 200).clone();
        assert_eq!(later.checks[3].first_failure_age_ms, Some(158), "an age moves with the clock");

        // A daemon's check changes with its health; the same health again changes nothing.
        let mut started = DaemonHealth::new(1_000);
        started.check.status = HealthStatus::Ok;
        started.check.reason = "answers".into();
        w[a].set_health(0, started.clone());
        let r = w.status_report(a, 100).clone();
        assert_eq!(r.checks, fresh(&w[a]));
        assert_eq!((r.checks[0].status, r.checks[0].reason.as_str()), (HealthStatus::Ok, "answers"));
        w[a].set_health(0, started);
        assert_eq!(w.status_report(a, 100).clone().checks, fresh(&w[a]));
    }

    /// Heartbeats leave the checks out while the server holds their number; a change (not
    /// an age that grew) numbers them anew, and a server that asks gets them in full, with the
    /// ages of that moment.
    #[test]
    fn heartbeats_repeat_held_checks_by_number() {
        let mut w = World::default();
        let a = w.add(host("gpu-0", Some(0)));
        assert!(w.heartbeat(a, 100).is_none(), "not registered: no heartbeat");
        w.registered(a, id("h-a"));
        let sent = |w: &mut World, now| w.heartbeat(a, now).map(|(_, r)| r.clone()).unwrap();
        let r = sent(&mut w, 100);
        assert_eq!((r.checks.len(), r.checks_rev, r.checks_unchanged), (4, Some(1), false));
        assert!(!w.answered(a, Some(1)));
        let r = sent(&mut w, 1_100);
        assert_eq!((r.checks.len(), r.checks_rev, r.checks_unchanged), (0, Some(1), true));

        // An Xid: new checks, a new number; then only its age grows, and the number stays.
        w[a].xid(1, 1_500);
        let r = sent(&mut w, 2_100);
        assert_eq!((r.checks_rev, r.checks_unchanged), (Some(2), false));
        assert_eq!(r.checks[3].first_failure_age_ms, Some(600));
        assert!(!w.answered(a, Some(2)));
        assert!(sent(&mut w, 3_100).checks_unchanged);
        // A server that does not hold them asks: they go again, aged to now.
        assert!(w.answered(a, None));
        let r = sent(&mut w, 3_100);
        assert_eq!((r.checks_rev, r.checks_unchanged), (Some(2), false));
        assert_eq!(r.checks[3].first_failure_age_ms, Some(1_600));
        assert!(!w.answered(a, Some(2)));
    }

    /// The audit notices an index that no longer matches the records.
    #[test]
    fn the_audit_catches_a_drifted_index() {
        let mut w = World::default();
        let a = w.add(host("gpu-0", Some(0)));
        w.start_task(a, TaskId(1), LocalTask::starting(vec![0], MPS, None));
        w.set_running(a, TaskId(1), 1);
        audited(&w);
        // Behind the world's back: a running process removed from the host's records.
        w.hosts[a].tasks.remove(&TaskId(1));
        assert!(w.audit().unwrap_err().contains("running tasks"));
        w.running.clear();
        audited(&w);
        w.slots.insert(3, a);
        assert!(w.audit().unwrap_err().contains("slot 3"));
        w.slots.remove(&3);
        w.by_id.insert(id("h-z"), a);
        assert!(w.audit().unwrap_err().contains("ids"));
    }
}
