//! The shortfall breakdown (docs/sim.md, "The shortfall, by cause"): per service, what the
//! world runs against the desired count, and why each missing replica is missing.
//!
//! The server's live service tasks are mirrored from the change feed in [`Mirror`], which also
//! keeps, per service, the live tasks the world does not run (`missing`): classifying a service
//! below its count walks those, not every task of the service, so a service held below its
//! count (a self-managed host held for the operator) costs what it lacks at every step, not
//! what it has.

use super::Sim;
use crate::config::WARMUP_MS;
use crate::report::Shortfall;
use crate::world::{Demand, World};
use mpsfleet_server::cluster::Cluster;
use mpsfleet_store::Revision;
use mpsfleet_types::*;
use std::collections::{BTreeMap, BTreeSet, VecDeque};

/// Per service, what the world really runs.
pub(super) struct SvcWorld {
    pub desired: u32,
    pub pool: String,
    pub demand: Demand,
    pub fenced: bool,
    /// `deploymentConfiguration.rebalanceFenced`: the server may move a fenced replica to
    /// spread the service.
    pub rebalance_fenced: bool,
    /// The service's priority (`Service::priority`).
    pub priority: u8,
    pub running: u32,
    pub last_ms: u64,
    /// Why the missing replicas are missing, as classified at the end of the last step that
    /// could change it; the shortfall accrues by these until the next classification.
    pub shortfall: Vec<(Shortfall, u32)>,
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
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct SrvTask {
    pub stop_requested: bool,
    pub host: Option<HostId>,
    pub last: TaskStatus,
}

/// One service's live tasks on the server.
#[derive(Debug, Default)]
struct SvcTasks {
    tasks: BTreeMap<TaskId, SrvTask>,
    /// Tasks not asked to stop: the replicas the service counts.
    current: u32,
    /// Tasks the server has RUNNING (its service's running count).
    running: u32,
    /// Tasks not asked to stop that the world does not run on their host.
    missing: BTreeSet<TaskId>,
}

/// The server's live service tasks by service, mirrored from the change feed, and the stop
/// times of failed ones (as the server's crash-loop hold-back counts them).
#[derive(Debug, Default)]
pub(super) struct Mirror {
    services: BTreeMap<ServiceName, SvcTasks>,
    failures: BTreeMap<ServiceName, VecDeque<u64>>,
}

/// Whether the world runs task `id` on the host the server placed it on.
fn runs(world: &World, id: &TaskId, t: &SrvTask) -> bool {
    let host = t.host.as_ref().and_then(|h| world.by_id(h));
    host.is_some_and(|h| world.running_on(id) == Some(h))
}

impl Mirror {
    /// A service task record from the change feed: kept while live, counted as a failure when
    /// it stops with a code the server counts against the service.
    pub fn record(&mut self, t: &Task, world: &World, now: u64) {
        let Some(s) = &t.group else { return };
        let svc = self.services.entry(s.clone()).or_default();
        let old = svc.tasks.remove(&t.id);
        if old.as_ref().is_some_and(|o| !o.stop_requested) {
            svc.current -= 1;
        }
        if old.as_ref().is_some_and(|o| o.last == TaskStatus::Running) {
            svc.running -= 1;
        }
        svc.missing.remove(&t.id);
        if t.last_status == TaskStatus::Stopped {
            let failed = !matches!(
                t.stop_code,
                Some(
                    StopCode::UserInitiated
                        | StopCode::ServiceSchedulerInitiated
                        | StopCode::HostReplaced
                        | StopCode::HostLost
                        | StopCode::Preempted
                )
            );
            if old.is_some() && failed {
                self.failures.entry(s.clone()).or_default().push_back(t.stopped_at_ms.unwrap_or(now));
            }
            return;
        }
        let rec = SrvTask {
            stop_requested: t.desired_status == TaskStatus::Stopped,
            host: t.host_id.clone(),
            last: t.last_status,
        };
        if rec.last == TaskStatus::Running {
            svc.running += 1;
        }
        if !rec.stop_requested {
            svc.current += 1;
            if !runs(world, &t.id, &rec) {
                svc.missing.insert(t.id);
            }
        }
        svc.tasks.insert(t.id, rec);
    }

    /// The world started or ended the process of task `t` of service `s`.
    pub fn world_changed(&mut self, s: &ServiceName, t: TaskId, world: &World) {
        let Some(svc) = self.services.get_mut(s) else { return };
        let Some(rec) = svc.tasks.get(&t) else { return };
        if rec.stop_requested || runs(world, &t, rec) {
            svc.missing.remove(&t);
        } else {
            svc.missing.insert(t);
        }
    }

    /// The service's tasks the server has RUNNING, as of the last change feed read.
    pub fn server_running(&self, s: &ServiceName) -> u32 {
        self.services.get(s).map_or(0, |svc| svc.running)
    }

    /// Forgets failures older than the crash-loop window.
    fn expire_failures(&mut self, now: u64) {
        let window = mpsfleet_server::cluster::SERVICE_RESTART_WINDOW_MS;
        for f in self.failures.values_mut() {
            while f.front().is_some_and(|&t| now.saturating_sub(t) > window) {
                f.pop_front();
            }
        }
    }

    /// Whether the service has failed often enough within the window to be held back.
    fn held_back(&self, s: &ServiceName) -> bool {
        let burst = mpsfleet_server::cluster::SERVICE_RESTART_BURST;
        self.failures.get(s).is_some_and(|f| f.len() >= burst)
    }

    /// Rebuilds the counts and the missing sets from the mirrored records and the world; the
    /// first difference, in words.
    pub fn audit(&self, world: &World) -> Result<(), String> {
        for (s, svc) in &self.services {
            let live = svc.tasks.iter().filter(|(_, t)| !t.stop_requested);
            let current = live.clone().count() as u32;
            let running = svc.tasks.values().filter(|t| t.last == TaskStatus::Running).count() as u32;
            if running != svc.running {
                return Err(format!("service {s}: {} counted running, {running} running", svc.running));
            }
            let missing: BTreeSet<TaskId> =
                live.filter(|(id, t)| !runs(world, id, t)).map(|(id, _)| *id).collect();
            if current != svc.current {
                return Err(format!("service {s}: {} counted, {current} live", svc.current));
            }
            if missing != svc.missing {
                return Err(format!("service {s}: missing indexed {:?}, records {missing:?}", svc.missing));
            }
        }
        Ok(())
    }
}

impl Sim {
    /// Accrues the service's missing replicas since the last change (by cause, as last
    /// classified), then applies `delta` to its running count.
    pub(super) fn svc_change(&mut self, s: &ServiceName, delta: i32) {
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

    /// A task record from the change feed.
    pub(super) fn mirror_task(&mut self, t: &Task) {
        let Some(s) = &t.group else { return };
        self.dirty_svcs.insert(s.clone());
        self.mirror.record(t, &self.world, self.now);
    }

    /// Classifies the missing replicas of the services marked since the last step; each
    /// service first accrues its shortfall so far by the classification it had.
    pub(super) fn classify_dirty(&mut self) {
        if self.now < WARMUP_MS {
            // Nothing is counted yet; classify everything once counting starts.
            self.all_dirty = true;
            self.dirty_svcs.clear();
            return;
        }
        if !self.all_dirty && self.dirty_svcs.is_empty() {
            return;
        }
        let names: Vec<ServiceName> = if std::mem::take(&mut self.all_dirty) {
            self.dirty_svcs.clear();
            self.svcs.keys().cloned().collect()
        } else {
            std::mem::take(&mut self.dirty_svcs).into_iter().collect()
        };
        self.mirror.expire_failures(self.now);
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
    fn classify(&mut self, s: &ServiceName, pools: &mut BTreeMap<String, PoolRoom>) -> Vec<(Shortfall, u32)> {
        let Some(w) = self.svcs.get(s) else { return Vec::new() };
        if w.running >= w.desired {
            return Vec::new();
        }
        let mut by_cause: BTreeMap<Shortfall, u32> = BTreeMap::new();
        let (pool, demand, fenced, desired) = (w.pool.clone(), w.demand, w.fenced, w.desired);
        let mut current = 0;
        let mut unplaced = 0;
        if let Some(svc) = self.mirror.services.get(s) {
            current = svc.current;
            for id in &svc.missing {
                let Some(t) = svc.tasks.get(id) else { continue };
                match self.task_shortfall(fenced, t) {
                    Some(cause) => *by_cause.entry(cause).or_default() += 1,
                    None => unplaced += 1,
                }
            }
        }
        if unplaced > 0 {
            let room = match pools.get(&pool) {
                Some(r) => r,
                None => {
                    let r = self.pool_room(&pool);
                    pools.entry(pool.clone()).or_insert(r)
                }
            };
            let fits = if demand.mps { room.mps } else { room.whole_gpu };
            let cause = match (fits, room.replacement_coming) {
                (true, _) => Shortfall::UnplacedWithRoom,
                (false, true) => Shortfall::ReplacementHost,
                (false, false) => Shortfall::NoCapacity,
            };
            *by_cause.entry(cause).or_default() += unplaced;
        }
        let not_created = desired.saturating_sub(current);
        if not_created > 0 {
            let cause =
                if self.mirror.held_back(s) { Shortfall::CrashLoopHoldBack } else { Shortfall::Other };
            *by_cause.entry(cause).or_default() += not_created;
        }
        by_cause.into_iter().collect()
    }

    /// The replicas of a `fenced` service that wait on a host with an open incident for that
    /// host's termination: by design they start again only once the old copy is fenced, and
    /// the incident's own bound for fenced services (its `total` phase, judged by the
    /// `recovery-bound` invariant) holds that wait, not the service bound.
    pub(super) fn awaiting_fence(&self, s: &ServiceName) -> u32 {
        let (Some(w), Some(svc)) = (self.svcs.get(s), self.mirror.services.get(s)) else { return 0 };
        if !w.fenced {
            return 0;
        }
        let waiting = svc.missing.iter().filter_map(|id| svc.tasks.get(id));
        waiting.filter(|t| self.task_shortfall(true, t) == Some(Shortfall::FencedTermination)).count() as u32
    }

    /// Why a live task of the service that the world does not run is not running; `None`
    /// for one not placed (its cause is the pool's room).
    fn task_shortfall(&self, fenced: bool, t: &SrvTask) -> Option<Shortfall> {
        let id = t.host.as_ref()?;
        if let Some(i) = self.open_incidents.get(id).and_then(|i| self.incidents.get(i)) {
            return Some(match i.state {
                IncidentState::Blocked { .. } => Shortfall::RemediationBlocked,
                _ if i.owner == IncidentOwner::Operator => Shortfall::OperatorHold,
                _ if fenced => Shortfall::FencedTermination,
                _ => Shortfall::OnBadHost,
            });
        }
        Some(match self.world.by_id(id).map(|h| &self.world[h]) {
            None => Shortfall::HostUnreachable,
            Some(h) if !h.up || h.partitioned_until.is_some() => Shortfall::HostUnreachable,
            Some(_) if t.last < TaskStatus::Running => Shortfall::Starting,
            Some(_) => Shortfall::Other,
        })
    }

    /// Whether the pool has room for another task (of either kind) now, and whether a
    /// replacement host is on its way.
    fn pool_room(&mut self, pool: &str) -> PoolRoom {
        let (mps, whole_gpu) = self.spare_capacity(pool);
        let replacement_coming =
            self.open_incidents.values().filter_map(|i| self.incidents.get(i)).any(|i| {
                i.pool.as_str() == pool
                    && i.has(Step::ReplacementRequested)
                    && !i.has(Step::TasksRunningAgain)
            });
        PoolRoom { mps, whole_gpu, replacement_coming }
    }

    /// [`spare_capacity`] of the cluster, remembered per pool until the cluster commits
    /// anything: it reads only committed state (hosts' status, health and cordon, and the
    /// placements on their GPUs), and building every host's view costs O(hosts).
    pub(super) fn spare_capacity(&mut self, pool: &str) -> (bool, bool) {
        let Some(c) = self.cluster.as_ref() else { return (false, false) };
        let rev = c.read().revision();
        if let Some(&(at, room)) = self.room_cache.get(pool) {
            if at == rev {
                return room;
            }
        }
        let biggest = super::families(self.cfg.scenario)
            .iter()
            .filter(|f| f.1.mps)
            .map(|f| f.1.memory_mib)
            .max()
            .unwrap_or(0);
        let room = spare_capacity(c, pool, biggest);
        self.room_cache.insert(pool.to_string(), (rev, room));
        room
    }
}

/// The cache of [`Sim::spare_capacity`]: per pool, the cluster revision and the answer.
pub(super) type RoomCache = BTreeMap<String, (Revision, (bool, bool))>;

/// Whether a pool has room now for one more MPS task of the largest shape (`biggest` MiB,
/// `.0`) and for a whole-GPU task (`.1`), on hosts that take new work.
pub(super) fn spare_capacity(c: &Cluster, pool: &str, biggest: u64) -> (bool, bool) {
    let mut out = (false, false);
    for h in c.read().host_rooms(pool) {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::world::{LocalTask, SimHost};

    const MPS: Demand = Demand { mps: true, memory_mib: 10_240 };

    fn svc() -> ServiceName {
        ServiceName::new("gpu-infer").unwrap()
    }

    /// A task record of the service as the change feed carries it.
    fn record(id: u64, host: Option<&str>, last: TaskStatus, desired: TaskStatus) -> Task {
        let mut t = Task::new(
            TaskId(id),
            TaskDefRef { family: Family::new("infer").unwrap(), revision: 1 },
            PoolName::new("gpu").unwrap(),
            Some(svc()),
            "service:gpu-infer".into(),
            0,
        );
        t.host_id = host.map(|h| HostId::new(h).unwrap());
        t.last_status = last;
        t.desired_status = desired;
        t
    }

    fn missing(m: &Mirror) -> Vec<u64> {
        m.services.get(&svc()).map_or(Vec::new(), |s| s.missing.iter().map(|t| t.0).collect())
    }

    #[track_caller]
    fn audited(m: &Mirror, w: &World) {
        if let Err(e) = w.audit().and_then(|()| m.audit(w)) {
            panic!("the missing-replica index drifted from the records: {e}");
        }
    }

    /// A live task of the service is missing until the world runs it on the host the server
    /// placed it on, and again once that process ends; a task asked to stop is no replica.
    /// The counts follow the records through every change from either side.
    #[test]
    fn missing_replicas_follow_the_records_and_the_world() {
        let mut w = World::default();
        let a = w.add(SimHost::new("gpu-0".into(), "gpu-0".into(), 0, Some(0), 2, 1));
        let b = w.add(SimHost::new("gpu-1".into(), "gpu-1".into(), 0, Some(1), 2, 1));
        w.registered(a, HostId::new("h-a").unwrap());
        w.registered(b, HostId::new("h-b").unwrap());
        let mut m = Mirror::default();
        let (run, stop) = (TaskStatus::Running, TaskStatus::Stopped);

        // Waiting for placement, then placed on gpu-0 and PENDING there: missing.
        m.record(&record(1, None, TaskStatus::Pending, run), &w, 0);
        m.record(&record(2, Some("h-a"), TaskStatus::Pending, run), &w, 0);
        audited(&m, &w);
        assert_eq!((missing(&m), m.services[&svc()].current), (vec![1, 2], 2));

        // The world starts task 2 on gpu-0 and it runs: no longer missing.
        w.start_task(a, TaskId(2), LocalTask::starting(vec![0], MPS, Some(svc())));
        m.world_changed(&svc(), TaskId(2), &w);
        assert_eq!(missing(&m), vec![1, 2], "starting is not running");
        w.set_running(a, TaskId(2), 10);
        m.world_changed(&svc(), TaskId(2), &w);
        m.record(&record(2, Some("h-a"), run, run), &w, 10);
        audited(&m, &w);
        assert_eq!((missing(&m), m.server_running(&svc())), (vec![1], 1));

        // A process of the same task id on another host is not the replica the server counts.
        m.record(&record(3, Some("h-b"), TaskStatus::Pending, run), &w, 11);
        w.start_task(a, TaskId(3), LocalTask::starting(vec![1], MPS, Some(svc())));
        w.set_running(a, TaskId(3), 12);
        m.world_changed(&svc(), TaskId(3), &w);
        audited(&m, &w);
        assert_eq!(missing(&m), vec![1, 3]);
        w.remove_task(a, TaskId(3));
        m.world_changed(&svc(), TaskId(3), &w);

        // Asked to stop: no replica any more (its replacement counts), missing or not.
        m.record(&record(3, Some("h-b"), TaskStatus::Pending, stop), &w, 13);
        audited(&m, &w);
        assert_eq!((missing(&m), m.services[&svc()].current), (vec![1], 2));

        // Task 2's process dies: missing again until the server hears of it; its STOPPED
        // record ends it, and counts as a failure of the service.
        w.remove_task(a, TaskId(2));
        m.world_changed(&svc(), TaskId(2), &w);
        assert_eq!(missing(&m), vec![1, 2]);
        let mut gone = record(2, Some("h-a"), stop, stop);
        gone.stop_code = Some(StopCode::EssentialContainerExited);
        gone.stopped_at_ms = Some(20);
        m.record(&gone, &w, 20);
        let mut scaled_in = record(3, Some("h-b"), stop, stop);
        scaled_in.stop_code = Some(StopCode::ServiceSchedulerInitiated);
        m.record(&scaled_in, &w, 21);
        audited(&m, &w);
        assert_eq!((missing(&m), m.services[&svc()].current, m.server_running(&svc())), (vec![1], 1, 0));
        assert_eq!(m.failures[&svc()], [20], "the crash counts, the stop that was asked for does not");
    }

    /// The audit notices a missing set that no longer matches the records.
    #[test]
    fn the_audit_catches_a_drifted_mirror() {
        let w = World::default();
        let mut m = Mirror::default();
        m.record(&record(1, None, TaskStatus::Pending, TaskStatus::Running), &w, 0);
        audited(&m, &w);
        m.services.get_mut(&svc()).unwrap().missing.clear();
        assert!(m.audit(&w).unwrap_err().contains("missing"));
        m.services.get_mut(&svc()).unwrap().missing.insert(TaskId(1));
        m.services.get_mut(&svc()).unwrap().running = 3;
        assert!(m.audit(&w).unwrap_err().contains("running"));
    }
}
