//! The task writes every path shares ([`Writer`]): new tasks created, placed and committed
//! as one batch (a request's RunTask, a service's replicas, an incident's moves), a task
//! started on a given host, and new versions of existing tasks written, each applied with
//! what it affects: capacity given back when a task stops, its service and pool asked for,
//! a scaling pool asked when a task waits.

use super::error::Error;
use super::kinds::TASK;
use super::place;
use super::state::Change;
use super::work::Work;
use super::write::Writer;
use mpsfleet_core::scheduler::{HostIx, Placement, Request};
use mpsfleet_store::{Op, Precondition, Revision};
use mpsfleet_types::labels::TaskLabels;
use mpsfleet_types::{PoolName, ServiceName, StopCode, Task, TaskDefRef, TaskId, TaskStatus};
use std::collections::BTreeSet;

/// What new tasks are made of.
pub(in crate::cluster) struct NewTasks {
    pub(in crate::cluster) task_definition: TaskDefRef,
    pub(in crate::cluster) pool: PoolName,
    pub(in crate::cluster) group: Option<ServiceName>,
    pub(in crate::cluster) started_by: String,
    /// What a task run gave of ECS's `overrides`, `startedBy`, `group` and `tags`.
    pub(in crate::cluster) labels: Option<Box<TaskLabels>>,
    /// The service's deployment that starts them (its PRIMARY one).
    pub(in crate::cluster) deployment: Option<String>,
    /// Their priority (the run's or the service's).
    pub(in crate::cluster) priority: u8,
    /// The host whose failure they replace replicas lost on (`Task::recovery_from`).
    pub(in crate::cluster) recovery_from: Option<mpsfleet_types::HostId>,
    /// Whether `task exec` may run commands in them (`Task::enable_execute_command`).
    pub(in crate::cluster) enable_execute_command: bool,
}

/// Tasks created and placed in memory, not yet committed.
#[derive(Default)]
pub(in crate::cluster) struct Batch {
    pub(in crate::cluster) ops: Vec<Op>,
    pub(in crate::cluster) created: Vec<(Task, Option<Placement>, Request)>,
}

impl Writer<'_> {
    /// Ids count up from a random base chosen at load, skipping any already taken: consecutive
    /// ids keep a batch's store rows together at one end of the store's key index, where
    /// scattered ids would rewrite a page per task.
    pub(in crate::cluster) fn next_task_id(&mut self) -> TaskId {
        loop {
            self.ids.counter += 1;
            let id = TaskId(self.ids.base.wrapping_add(self.ids.counter));
            if self.state.tasks().get(&id).is_none() {
                return id;
            }
        }
    }

    /// Puts a committed new task; `record`: in its events (not for a task loaded from the
    /// store, whose past this server did not see).
    pub(in crate::cluster) fn insert_task(
        &mut self,
        task: Task,
        version: Revision,
        placement: Option<Placement>,
        record: bool,
    ) {
        if placement.is_none() && task.last_status == TaskStatus::Pending {
            self.ask_scaling(&task.pool.clone());
            // A task that may preempt does not wait for capacity to change: placement looks
            // for room it can make now.
            if self.may_preempt(&task) {
                self.ask(Work::Placement(task.pool.clone()));
            }
        }
        if let Some(p) = placement.as_ref().filter(|_| task.last_status != TaskStatus::Stopped) {
            let e = self.state.host_mut(p.host);
            e.epoch = e.epoch.max(version);
        }
        if record {
            self.put_task(task, version, placement);
        } else {
            self.apply(version, Change::Task(task, placement));
        }
    }

    /// Creates `count` tasks into `batch`, placing what fits now; the rest wait with a reason.
    /// Nothing is committed here: see [`Cluster::start_tasks`].
    pub(in crate::cluster) fn create_tasks(
        &mut self,
        spec: &NewTasks,
        count: u32,
        batch: &mut Batch,
    ) -> Result<(), Error> {
        let now = self.now_ms;
        // Every task of the spec makes the same request.
        let mut same: Option<Request> = None;
        batch.ops.reserve(count as usize);
        batch.created.reserve(count as usize);
        for _ in 0..count {
            let id = self.next_task_id();
            let mut task = Task::new(
                id,
                spec.task_definition.clone(),
                spec.pool.clone(),
                spec.group.clone(),
                spec.started_by.clone(),
                now,
            );
            task.labels = spec.labels.clone();
            task.deployment = spec.deployment.clone();
            task.priority = spec.priority;
            task.recovery_from = spec.recovery_from.clone();
            task.enable_execute_command = spec.enable_execute_command;
            let req = match same {
                // The same request but for its tenant: each task is its own to preemption.
                Some(r) => Request { tenant: Some(place::tenant_of(self.state, &task, now)), ..r },
                None => *same.insert(place::request_for(self.state, self.sched, &task, self.now_ms)?),
            };
            let outcome = self.sched.place(&req);
            place::apply_placement(
                self.state,
                self.sched,
                self.now_ms,
                &mut task,
                &outcome,
                self.local_runs_images,
            );
            batch.ops.push(Op::put_json(TASK, task.id.to_string(), &task, Precondition::Absent)?);
            batch.created.push((task, outcome.ok(), req));
        }
        Ok(())
    }

    /// Commits waiting tasks placed (`ops`: their records), then applies each on its host; a
    /// failed commit gives back what they reserved and applies nothing.
    pub(in crate::cluster) fn write_placed(
        &mut self,
        ops: &[Op],
        placed: Vec<(Task, Placement, Request)>,
    ) -> Result<(), Error> {
        let rev = match self.commit(ops) {
            Ok(rev) => rev,
            Err(e) => {
                for (_, p, req) in placed.iter().rev() {
                    self.sched.release(req, p);
                }
                return Err(e);
            }
        };
        for (task, p, _) in placed {
            self.state.host_mut(p.host).epoch = rev;
            self.put_task(task, rev, Some(p));
        }
        Ok(())
    }

    /// Gives back the capacity an uncommitted batch took.
    pub(in crate::cluster) fn rollback(&mut self, batch: &Batch) {
        for (_, placement, req) in batch.created.iter().rev() {
            if let Some(p) = placement {
                self.sched.release(req, p);
            }
        }
    }

    /// Commits `ops` with a batch's new tasks, then applies `changes`; on failure the batch's
    /// capacity is given back and nothing is applied. The tasks are the caller's to insert
    /// (`insert_task`), after what it applies at the revision.
    pub(in crate::cluster) fn write_batch(
        &mut self,
        ops: &[Op],
        changes: impl IntoIterator<Item = Change>,
        batch: &Batch,
    ) -> Result<Revision, Error> {
        let all: Vec<Op>;
        let ops = if batch.ops.is_empty() {
            ops
        } else {
            all = ops.iter().chain(&batch.ops).cloned().collect();
            &all
        };
        self.write(ops, changes).inspect_err(|_| self.rollback(batch))
    }

    /// Creates and commits new tasks as one atomic batch; on any failure nothing stays.
    pub(in crate::cluster) fn start_tasks(&mut self, spec: NewTasks, count: u32) -> Result<Vec<Task>, Error> {
        let mut batch = Batch::default();
        if let Err(e) = self.create_tasks(&spec, count, &mut batch) {
            self.rollback(&batch);
            return Err(e);
        }
        let rev = self.write_batch(&[], [], &batch)?;
        let mut out = Vec::with_capacity(batch.created.len());
        for (task, placement, _) in batch.created {
            out.push(task.clone());
            self.insert_task(task, rev, placement, true);
        }
        Ok(out)
    }

    /// Places a new task on host `ix` only and commits it, or says why it does not fit there
    /// (nothing is written then).
    pub(in crate::cluster) fn start_one_on(
        &mut self,
        mut task: Task,
        ix: HostIx,
    ) -> Result<Result<Task, mpsfleet_core::scheduler::Unplaced>, Error> {
        let request = place::request_for(self.state, self.sched, &task, self.now_ms)?;
        let outcome = self.sched.place_on(&request, ix);
        let placement = match outcome {
            Ok(p) => p,
            Err(why) => return Ok(Err(why)),
        };
        place::apply_placement(
            self.state,
            self.sched,
            self.now_ms,
            &mut task,
            &Ok(placement.clone()),
            self.local_runs_images,
        );
        let committed = Op::put_json(TASK, task.id.to_string(), &task, Precondition::Absent)
            .map_err(Error::from)
            .and_then(|op| self.commit(&[op]));
        let rev = match committed {
            Ok(rev) => rev,
            Err(e) => {
                self.sched.release(&request, &placement);
                return Err(e);
            }
        };
        self.insert_task(task.clone(), rev, Some(placement), true);
        Ok(Ok(task))
    }

    /// Commits new versions of existing tasks and applies them: capacity released for those
    /// that stopped, epochs moved for the hosts whose agents must act.
    pub(in crate::cluster) fn write_tasks(&mut self, tasks: Vec<Task>) -> Result<(), Error> {
        if tasks.is_empty() {
            return Ok(());
        }
        let mut ops = Vec::with_capacity(tasks.len());
        for t in &tasks {
            let version = self.state.tasks().get(&t.id).map_or(0, |e| e.version);
            ops.push(Op::put_json(TASK, t.id.to_string(), t, Precondition::Version(version))?);
        }
        let rev = self.commit(&ops)?;
        let mut freed = BTreeSet::new();
        for t in tasks {
            let pool = t.pool.clone();
            let group = t.group.clone();
            if self.apply_task_update(t, rev)? {
                freed.insert(pool);
                // Its service may have waited for it (a rebalance waits for every stop).
                if let Some(g) = group {
                    self.ask(Work::Service(g));
                }
            }
        }
        for pool in freed {
            self.ask(Work::Placement(pool));
        }
        Ok(())
    }

    /// Applies a committed new version of an existing task; true when it just stopped (its
    /// capacity is free again).
    pub(in crate::cluster) fn apply_task_update(&mut self, t: Task, rev: Revision) -> Result<bool, Error> {
        let id = t.id;
        let Some(old) = self.state.tasks().get(&id) else { return Ok(false) };
        let stopped_now = t.last_status == TaskStatus::Stopped && old.task.last_status != TaskStatus::Stopped;
        let mut placement = old.placement.clone();
        // A task that just stopped gives its capacity back.
        let freed = if stopped_now { placement.take().map(|p| (p, old.task.clone())) } else { None };
        if let Some((p, old_task)) = freed {
            let req = place::request_for(self.state, self.sched, &old_task, self.now_ms)?;
            self.sched.release(&req, &p);
        }
        if let Some(h) = t.host_id.as_ref().and_then(|h| self.sched.host(h)) {
            self.state.host_mut(h).epoch = rev;
        }
        if stopped_now {
            self.events.task_stopped(&t, self.now_ms);
            self.note_if_lost(&t);
        }
        self.put_task(t, rev, placement);
        Ok(stopped_now)
    }

    /// A service replica that stopped for its host's or MPS daemon's failure (lost, replaced,
    /// its daemon not answering, drained by an incident) is remembered, so that its
    /// replacement is started as recovery (`Task::recovery_from`).
    fn note_if_lost(&mut self, t: &Task) {
        let (Some(g), Some(host)) = (&t.group, &t.host_id) else { return };
        let lost = match t.stop_code {
            Some(StopCode::HostLost | StopCode::HostReplaced | StopCode::MpsDaemonUnavailable) => true,
            Some(StopCode::HostDrained) => self.state.incidents().unresolved().any(|i| &i.host_id == host),
            // Any other exit on a daemon that is failing (its first signal seen, or its failure
            // confirmed): the daemon took it down.
            Some(StopCode::EssentialContainerExited | StopCode::Unhealthy) => {
                let r = self.reader();
                r.at_risk(t) || r.daemon_failing_since(t).is_some()
            }
            _ => false,
        };
        if lost {
            self.state.note_lost_replica(g, host.clone(), self.now_ms);
        } else if let (Some(StopCode::EssentialContainerExited | StopCode::Unhealthy), Some(gpu), Some(ix)) =
            (t.stop_code, t.gpu_ids.first(), self.sched.host(host))
        {
            self.state.note_exit(ix, gpu.clone(), g.clone(), self.now_ms);
        }
    }

    /// Whether `task` may preempt under its pool's `preemption` policy, and has a priority
    /// anything could be below by the gap.
    pub(in crate::cluster) fn may_preempt(&self, task: &Task) -> bool {
        use mpsfleet_types::priority::{MIN_PRIORITY, PREEMPTION_GAP};
        task.priority >= MIN_PRIORITY + PREEMPTION_GAP
            && (self.state.pools().get(&task.pool))
                .is_some_and(|p| p.value.preemption.allows(task.recovery_from.is_some()))
    }

    /// A task waits in `pool`: a scaling pool looks at its demand now.
    pub(in crate::cluster) fn ask_scaling(&mut self, pool: &PoolName) {
        let scales = (self.state.pools().get(pool))
            .and_then(|p| p.value.provider.as_ref())
            .is_some_and(|prov| prov.scaling().is_some());
        if scales {
            self.ask(Work::Capacity(pool.clone()));
        }
    }
}
