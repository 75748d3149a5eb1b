//! The one way records are written ([`Writer`]): a change is committed to the store first,
//! then applied to [`State`] (its one writer, `State::apply`), then what it affects follows:
//! the storm breaker's counts dropped, a host's events published and the keys its change
//! asks for (its pool's capacity, daemons, placement and services), and the feed's ledger
//! told. A failed commit changes nothing in memory. Requests reach it through
//! `Cluster::write` and `Cluster::writing`, which put the call's riders
//! (its audit entry, its client token) on its first commit; the controllers in
//! `controllers/` hold a `Writer` in their context and never see `Cluster`.

use super::deleted::{Deleted, DeletedObject, Keeping, KEPT_PER_KIND};
use super::error::Error;
use super::kinds::{DELETED, HOST, INCIDENT, POOL};
use super::read::PoolCounts;
use super::read::Reader;
use super::state::{Change, State};
use super::work::Work;
use mpsfleet_core::changes::{self, TaskChange};
use mpsfleet_core::controller::WorkQueue;
use mpsfleet_core::lifecycle::host as host_lifecycle;
use mpsfleet_core::scheduler::{HostIx, Placement, Scheduler};
use mpsfleet_store::{Op, Precondition, Revision, Store};
use mpsfleet_types::{
    event, HealthStatus, Host, HostStatus, Incident, IncidentState, ObjectEvent, Pool, PoolName,
    SchedulingStrategy, ServiceName, StopCode, Task, TaskId, TaskStatus,
};
use std::collections::{BTreeMap, BTreeSet, VecDeque};

/// The most revisions of the change feed kept for watchers.
pub const FEED_MAX_REVISIONS: u64 = 100_000;
/// No change older than this stays in the feed.
pub const FEED_MAX_AGE_MS: u64 = 15 * 60 * 1000;
/// The most bytes of values the feed keeps.
pub const FEED_MAX_BYTES: u64 = 64 * 1024 * 1024;
/// When each revision of the feed was committed and how many bytes it wrote, oldest first.
/// Revisions from before this process loaded count as committed at the load, with no size.
#[derive(Debug, Default)]
pub(in crate::cluster) struct FeedLedger {
    entries: VecDeque<(Revision, u64, u64)>,
    bytes: u64,
    /// The store holds no change below this revision (compacted by this process).
    pub(super) compacted_before: Revision,
}

impl FeedLedger {
    pub(super) fn record(&mut self, rev: Revision, at_ms: u64, bytes: u64) {
        self.entries.push_back((rev, at_ms, bytes));
        self.bytes += bytes;
    }

    /// The first revision to keep at `now`, given the limits, for a store at `current`.
    fn keep_from(&self, current: Revision, now: u64) -> Revision {
        let mut from = current.saturating_sub(FEED_MAX_REVISIONS) + 1;
        let mut bytes = self.bytes;
        for &(rev, at_ms, b) in &self.entries {
            if now.saturating_sub(at_ms) <= FEED_MAX_AGE_MS && bytes <= FEED_MAX_BYTES {
                break;
            }
            bytes -= b;
            from = from.max(rev + 1);
        }
        from
    }

    fn drop_before(&mut self, rev: Revision) {
        while self.entries.front().is_some_and(|&(r, _, _)| r < rev) {
            if let Some((_, _, b)) = self.entries.pop_front() {
                self.bytes -= b;
            }
        }
    }
}

/// The bytes a batch writes, for the ledger.
pub(super) fn batch_bytes(ops: &[Op]) -> u64 {
    ops.iter()
        .map(|op| match op {
            Op::Put { kind, key, value, .. } => (kind.len() + key.len() + value.len()) as u64,
            Op::Delete { kind, key, .. } => (kind.len() + key.len()) as u64,
        })
        .sum()
}

/// Where new task ids come from: a base chosen at load (or set, for the simulator) and a
/// counter; an id already taken is skipped.
#[derive(Debug)]
pub(in crate::cluster) struct TaskIds {
    pub(in crate::cluster) base: u64,
    pub(in crate::cluster) counter: u64,
}

/// What writing a record takes: the store, the state, the feed's ledger, the metrics, the
/// event stream, the scheduler and the controllers' queue (a change asks for the keys it
/// affects), and what is dropped when a record it counts changes.
pub(in crate::cluster) struct Writer<'a> {
    pub(super) store: &'a dyn Store,
    pub(super) state: &'a mut State,
    pub(super) feed: &'a mut FeedLedger,
    pub(super) live: &'a crate::metrics::Live,
    pub(super) events: &'a crate::events::Events,
    pub(super) sched: &'a mut Scheduler,
    pub(super) queue: &'a mut WorkQueue<Work>,
    /// Set when a key that should run at once was asked for (`Cluster::take_wake`).
    pub(super) wake: &'a mut bool,
    /// When the health tick evaluates each host next (`dispatch::Controllers::health_due_ms`).
    pub(super) health_due_ms: &'a mut Vec<u64>,
    pub(super) breaker_counts: &'a mut BTreeMap<PoolName, PoolCounts>,
    pub(super) failed_daemon_hosts: &'a BTreeSet<HostIx>,
    /// New task ids (`write_tasks.rs`).
    pub(super) ids: &'a mut TaskIds,
    /// When this server loaded the store (`Reader::loaded_at_ms`).
    pub(super) loaded_at_ms: u64,
    /// Whether a `local` provider's agents run containers (placement's waiting reasons).
    pub(super) local_runs_images: bool,
    /// The ops the call being served adds to its first commit (its audit entry, its client
    /// token: `call.rs`), taken by that commit; empty for a controller.
    pub(super) riders: Vec<Op>,
    pub(super) now_ms: u64,
}

impl Writer<'_> {
    /// Asks for the service of a task, if it has one.
    pub(in crate::cluster) fn ask_for_group(&mut self, group: Option<&ServiceName>) {
        if let Some(g) = group {
            self.ask(Work::Service(g.clone()));
        }
    }

    /// Asks for placement in every pool that has waiting tasks (capacity came back).
    pub(in crate::cluster) fn ask_placement_everywhere(&mut self) {
        for p in self.state.tasks().pools_with_pending() {
            self.ask(Work::Placement(p));
        }
    }

    /// Asks for every unresolved incident (a heartbeat changed something, a provider call
    /// ended).
    pub(in crate::cluster) fn ask_incidents(&mut self) {
        let keys: Vec<Work> = self
            .state
            .incidents()
            .unresolved()
            .map(|i| Work::Incident(i.opened_at_ms, i.id.clone()))
            .collect();
        for k in keys {
            self.ask(k);
        }
    }

    /// The state, to read.
    pub(in crate::cluster) fn state(&self) -> &State {
        self.state
    }

    /// What the writer's state reads as (`read.rs`).
    pub(in crate::cluster) fn reader(&self) -> Reader<'_> {
        Reader {
            state: self.state,
            sched: self.sched,
            failed_daemon_hosts: self.failed_daemon_hosts,
            loaded_at_ms: self.loaded_at_ms,
            now_ms: self.now_ms,
        }
    }

    /// Asks for `work` at the next pass; an incident wakes the pass at once.
    pub(in crate::cluster) fn ask(&mut self, work: Work) {
        *self.wake |= matches!(work, Work::Incident(..));
        self.queue.enqueue_at(work, self.now_ms);
    }

    /// Commits `ops` and applies `changes` at its revision: the one call a controller makes
    /// to write.
    pub(in crate::cluster) fn write(
        &mut self,
        ops: &[Op],
        changes: impl IntoIterator<Item = Change>,
    ) -> Result<Revision, Error> {
        let rev = self.commit(ops)?;
        for c in changes {
            self.apply(rev, c);
        }
        Ok(rev)
    }

    /// One store commit (with the call's riders, the first time), its duration and outcome
    /// counted in the metrics, its size in the feed's ledger; nothing is applied yet.
    pub(super) fn commit(&mut self, ops: &[Op]) -> Result<Revision, Error> {
        let all: Vec<Op>;
        let batch = if self.riders.is_empty() {
            ops
        } else {
            all = ops.iter().chain(&self.riders).cloned().collect();
            &all
        };
        let watch = mpsfleet_core::clock::Stopwatch::start();
        let result = self.store.commit(batch);
        self.live.committed(watch.seconds(), result.is_ok());
        let rev = result?;
        self.riders.clear();
        if rev != self.state.revision() {
            self.feed.record(rev, self.now_ms, batch_bytes(batch));
        }
        self.state.committed(rev);
        Ok(rev)
    }

    /// Applies a committed change to the state, then what it affects: the storm breaker's
    /// counts dropped when the change is to what they count (a host or an incident); for a
    /// host, its events published and the keys its new record asks for.
    pub(super) fn apply(&mut self, version: Revision, change: Change) {
        if matches!(
            change,
            Change::NewHost(..) | Change::Host(..) | Change::Incident(_) | Change::IncidentRemoved(_)
        ) {
            self.breaker_counts.clear();
        }
        match change {
            Change::Host(ix, host) => self.apply_host(version, ix, host),
            Change::Incident(incident) => self.apply_incident(*incident, version),
            Change::Task(task, Some(p)) => {
                // What preemption weighs of a placed task follows its record: told to stop (or
                // leaving traffic to stop), protected, its priority. A placement starts as
                // none of these at its record's priority, so only a change is told (the submit
                // path tells nothing).
                let weighed = |t: &Task| {
                    let stopping = t.desired_status == TaskStatus::Stopped || t.draining.is_some();
                    (stopping, t.labels.as_ref().and_then(|l| l.protected_until_ms).unwrap_or(0), t.priority)
                };
                let now = weighed(&task);
                // What the scheduler holds: the previous record's, if it was placed there too;
                // else a fresh placement's.
                let before = (self.state.tasks().get(&task.id))
                    .filter(|e| e.placement.as_ref().is_some_and(|q| q.host == p.host))
                    .map_or((false, 0, task.priority), |e| weighed(&e.task));
                if before != now {
                    self.sched.set_tenant(p.host, task.id.0, now.0, now.1, now.2);
                }
                self.state.apply(version, Change::Task(task, Some(p)))
            }
            change => self.state.apply(version, change),
        }
    }

    /// Commits a host record, then applies it; a record equal to the stored one is not
    /// written again.
    pub(in crate::cluster) fn write_host(&mut self, ix: HostIx, mut host: Host) -> Result<(), Error> {
        let stored = &self.state.hosts()[ix as usize];
        if *stored.host() == host {
            return Ok(());
        }
        self.record_host_changes(ix, &mut host);
        let expect = Precondition::Version(self.state.hosts()[ix as usize].version());
        self.write(&[Op::put_json(HOST, host.id.as_str(), &host, expect)?], [Change::Host(ix, host)])?;
        Ok(())
    }

    /// Records in `host`'s events what changed from the stored record: lifecycle, health
    /// (with the checks that are not OK), cordon, credential.
    pub(in crate::cluster) fn record_host_changes(&self, ix: HostIx, host: &mut Host) {
        let e = &self.state.hosts()[ix as usize];
        let why: Vec<String> = e
            .health
            .checks
            .iter()
            .filter(|c| c.status != HealthStatus::Ok)
            .map(|c| match &c.gpu_id {
                Some(g) => format!("{} of {g}: {}", c.name, c.reason),
                None => format!("{}: {}", c.name, c.reason),
            })
            .collect();
        for ev in mpsfleet_core::changes::host_changes(e.host(), host, &why.join("; ")) {
            host.events.push(self.now_ms, ev);
        }
    }

    /// Applies a committed host record: its events published, placement eligibility, the
    /// pool's capacity asked for when the host left, its daemon services when it turned, and
    /// its waiting tasks and services when it opened up; its health evaluated at the next
    /// tick.
    fn apply_host(&mut self, rev: Revision, ix: HostIx, host: Host) {
        let old = self.state.hosts()[ix as usize].host();
        let now = self.now_ms;
        self.events.host((old.status, old.health_status), &host, now);
        let news = host.events.since(old.events.pushed());
        if !news.is_empty() {
            let subject = event::Subject { id: host.id.to_string(), pool: host.pool.clone() };
            let news: Vec<ObjectEvent> = news.iter().map(|e| e.event.clone()).collect();
            self.events.recorded(event::EventType::HostEvent, &subject, &news, now);
        }
        let schedulable = crate::cluster::can_place(&host);
        let (old_status, new_status) = (old.status, host.status);
        let pool = host.pool.clone();
        let left = host.status == HostStatus::Deregistered;
        self.state.apply(rev, Change::Host(ix, host));
        if left {
            // A pool without a provider answers this at once (`Cluster::ask_capacity`).
            self.ask(Work::Capacity(pool.clone()));
        }
        self.health_due_ms[ix as usize] = 0;
        let opened = schedulable && !self.sched.is_schedulable(ix);
        let turned = schedulable != self.sched.is_schedulable(ix) || old_status != new_status;
        self.sched.set_schedulable(ix, schedulable);
        if turned {
            self.ask_daemons(&pool);
        }
        if opened {
            self.capacity_opened(pool);
        }
    }

    /// Puts a committed task record, recording what changed in its events.
    pub(in crate::cluster) fn put_task(
        &mut self,
        task: Task,
        version: Revision,
        placement: Option<Placement>,
    ) {
        let old = self.state.tasks().get(&task.id).map(|e| &e.task);
        if task.host_id.is_some() && old.is_none_or(|o| o.host_id.is_none()) {
            self.live.placed(&task.pool, self.now_ms.saturating_sub(task.created_at_ms));
        }
        // A task placed as it is created keeps no `Placed` entry (its events show one from the
        // record); the event stream and its history are told all the same.
        let placed_at_once = old.is_none() && task.host_id.is_some();
        let news = changes::task_changes(old, &task);
        if placed_at_once && self.events.wanted() {
            self.events.task_changes(&task, &[TaskChange::Placed], self.now_ms);
        }
        let id = task.id;
        self.apply(version, Change::Task(task, placement));
        self.record_task(id, news);
    }

    /// Records changes in a task's events and publishes them in words.
    pub(in crate::cluster) fn record_task(&mut self, id: TaskId, news: Vec<TaskChange>) {
        if news.is_empty() {
            return;
        }
        self.publish_task(&id, &news);
        self.state.record_task(&id, self.now_ms, news);
    }

    /// Publishes changes of a task's events (`task.event`; in words when they are read).
    pub(in crate::cluster) fn publish_task(&self, id: &TaskId, news: &[TaskChange]) {
        if let Some(e) = self.state.tasks().get(id).filter(|_| self.events.wanted()) {
            self.events.task_changes(&e.task, news, self.now_ms);
        }
    }

    /// Commits an incident, then applies it; an incident equal to the stored one is not
    /// written again (nothing to say, nothing to store).
    pub(in crate::cluster) fn write_incident(&mut self, incident: Incident) -> Result<(), Error> {
        let expect = match self.state.incidents().get(&incident.id) {
            Some(v) if v.value == incident => return Ok(()),
            Some(v) => Precondition::Version(v.version),
            None => Precondition::Absent,
        };
        let op = Op::put_json(INCIDENT, incident.id.clone(), &incident, expect)?;
        self.write(&[op], [Change::Incident(Box::new(incident))]).map(|_| ())
    }

    /// Applies a committed incident: announces what changed, counts it in the metrics, and
    /// asks for what depends on it.
    fn apply_incident(&mut self, incident: Incident, rev: Revision) {
        let old = self.state.incidents().get(&incident.id).map(|v| &v.value);
        self.live.incident(old, &incident);
        self.events.incident(old.map(|o| (&o.state, o.timeline.pushed())), &incident, self.now_ms);
        // Whether the host's verdict opens an incident depends on its incidents.
        if let Some(ix) = self.sched.host(&incident.host_id) {
            self.health_due_ms[ix as usize] = 0;
        }
        let pool = incident.pool.clone();
        // A new incident gets its key; one already keyed asks for itself every
        // `INCIDENT_RESYNC_MS` while unresolved, and whoever changes it from outside its
        // reconcile (an operator, a heartbeat, a provider call) asks for it at once. Its own
        // reconcile's writes ask for nothing: it has just planned them.
        let new = old.is_none() && incident.state != IncidentState::Resolved;
        let key = Work::Incident(incident.opened_at_ms, incident.id.clone());
        self.state.apply(rev, Change::Incident(Box::new(incident)));
        if new {
            self.ask(key);
        }
        // A replacement asked for or ready changes what the pool's capacity counts (a pool
        // without a provider answers this at once).
        self.ask(Work::Capacity(pool));
    }

    /// The host leaves the fleet: DEREGISTERED, unschedulable, and what still ran there is
    /// recorded as stopped (the machine is gone).
    pub(in crate::cluster) fn deregister(&mut self, ix: HostIx, reason: &str) -> Result<(), Error> {
        let mut h = self.state.hosts()[ix as usize].host().clone();
        if h.status == HostStatus::Deregistered {
            return Ok(());
        }
        host_lifecycle::apply(&mut h, host_lifecycle::Event::Deregister)
            .map_err(|e| Error::Conflict(format!("host {}: {e}", h.id)))?;
        // Its GPUs and credential leave the indexes with the record (`State::apply`).
        self.write_host(ix, h)?;
        let r = self.reader();
        let stopped: Vec<Task> = (r.state.tasks().on_host(ix).iter())
            .filter_map(|id| r.state.tasks().get(id))
            .filter(|e| e.task.desired_status == TaskStatus::Stopped)
            .map(|e| r.forced_stop(&e.task, StopCode::HostReplaced, reason, true))
            .collect();
        self.write_tasks(stopped)
    }

    /// Asks for the pool's DAEMON services (a host turned: their task counts follow it).
    pub(in crate::cluster) fn ask_daemons(&mut self, pool: &PoolName) {
        let daemons: Vec<ServiceName> = (self.state.services().values())
            .filter(|v| v.value.pool == *pool && v.value.scheduling_strategy == SchedulingStrategy::Daemon)
            .map(|v| v.value.name.clone())
            .collect();
        for name in daemons {
            self.ask(Work::Service(name));
        }
    }

    /// Capacity came back in `pool` (a host or a GPU opened): its waiting tasks are placed,
    /// and its services may spread onto it at once.
    pub(in crate::cluster) fn capacity_opened(&mut self, pool: PoolName) {
        let services: Vec<ServiceName> = (self.state.services().values())
            .filter(|v| v.value.pool == pool)
            .map(|v| v.value.name.clone())
            .collect();
        for s in services {
            self.ask(Work::Service(s));
        }
        self.ask(Work::Placement(pool));
    }

    /// Records an entry in `pool`'s events, in one commit, then publishes it.
    pub(in crate::cluster) fn pool_event(
        &mut self,
        pool: &PoolName,
        reason: &str,
        message: String,
    ) -> Result<(), Error> {
        self.change_pool(pool, reason, message, |_| {})
    }

    /// Changes `pool`'s record with `change` and records an entry in its events, in one
    /// commit, then publishes the entry.
    pub(in crate::cluster) fn change_pool(
        &mut self,
        pool: &PoolName,
        reason: &str,
        message: String,
        change: impl FnOnce(&mut Pool),
    ) -> Result<(), Error> {
        let Some(current) = self.state.pools().get(pool).cloned() else { return Ok(()) };
        let mut p = current.value;
        change(&mut p);
        let entry = ObjectEvent::new(reason, message);
        p.events.push(self.now_ms, entry.clone());
        let put = Op::put_json(POOL, p.name.as_str(), &p, Precondition::Version(current.version))?;
        self.write(&[put], [Change::Pool(p)])?;
        self.publish_pool_event(pool, entry);
        Ok(())
    }

    /// Publishes an entry of `pool`'s events on the stream.
    pub(in crate::cluster) fn publish_pool_event(&self, pool: &PoolName, entry: ObjectEvent) {
        let subject = event::Subject { id: pool.to_string(), pool: pool.clone() };
        self.events.recorded(event::EventType::PoolEvent, &subject, &[entry], self.now_ms);
    }

    /// Compacts the store's change feed to what [`FEED_MAX_REVISIONS`], [`FEED_MAX_AGE_MS`] and
    /// [`FEED_MAX_BYTES`] keep.
    pub(in crate::cluster) fn compact_feed(&mut self) -> Result<(), Error> {
        let from = self.feed.keep_from(self.state.revision(), self.now_ms);
        if from > self.feed.compacted_before {
            self.store.compact(from)?;
            self.feed.compacted_before = from;
            self.feed.drop_before(from);
        }
        Ok(())
    }
}

/// Deleted pools and services kept (`deleted.rs`).
impl Writer<'_> {
    /// The ops that keep `object` as deleted now, to commit with its removal, and what they
    /// keep; the oldest of its kind beyond `deleted::KEPT_PER_KIND` go in the same ops. Apply with
    /// `Writer::kept_deleted` once committed.
    pub(in crate::cluster) fn keep_deleted(
        &self,
        object: DeletedObject,
    ) -> Result<(Vec<Op>, Keeping), Error> {
        let record = Deleted { deleted_at_ms: self.now_ms, object };
        let kind = format!("{}-", record.kind());
        let same: Vec<&String> = self.state.deleted().keys().filter(|k| k.starts_with(&kind)).collect();
        let over = (same.len() + 1).saturating_sub(KEPT_PER_KIND);
        let evicted: Vec<String> = same.into_iter().take(over).cloned().collect();
        let mut ops: Vec<Op> =
            evicted.iter().map(|k| Op::delete(DELETED, k.as_str(), Precondition::Any)).collect();
        ops.push(Op::put_json(DELETED, record.key(), &record, Precondition::Any)?);
        Ok((ops, Keeping { record, evicted }))
    }

    /// Applies what `Writer::keep_deleted`'s ops committed at `rev`.
    pub(in crate::cluster) fn kept_deleted(&mut self, rev: Revision, kept: Keeping) {
        for k in kept.evicted {
            self.apply(rev, Change::DeletedRemoved(k));
        }
        self.apply(rev, Change::Deleted(Box::new(kept.record)));
    }
}
