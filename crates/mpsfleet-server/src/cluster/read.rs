//! What controllers and requests read beyond single records ([`Reader`]): where a task
//! stands as its service counts it, whether its MPS daemon failed, what a stop of it writes,
//! and (in `traffic.rs`) whether it takes traffic. Read-only over the state, the scheduler's
//! index and the time, so a request's view (`Cluster::read`) and a controller's
//! (`Writer::reader`) answer alike. The API's queries are `Reader`'s too, each beside its
//! room's operations (`hosts.rs`, `services.rs`, …).

use super::state::State;
use super::HostIx;
use mpsfleet_core::deployment::{Replica, ReplicaState};
use mpsfleet_core::health::Verdict;
use mpsfleet_core::lifecycle::task as task_lifecycle;
use mpsfleet_core::scheduler::Scheduler;
use mpsfleet_types::policy::ResumptionBoundary;
use mpsfleet_types::{
    Host, HostId, HostStatus, Incident, OperatorAction, PoolName, Service, StopCode, Task, TaskDefRef,
    TaskHealth, TaskId, TaskStatus,
};
use std::collections::BTreeSet;

/// A pool's hosts as the storm breaker counts them (`Reader::pool_counts`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(in crate::cluster) struct PoolCounts {
    pub total: u32,
    pub unhealthy: u32,
}

/// The state, the scheduler's index and the time, to read.
#[derive(Clone, Copy)]
pub struct Reader<'a> {
    pub(super) state: &'a State,
    pub(super) sched: &'a Scheduler,
    /// Hosts with a confirmed MPS daemon failure (`dispatch::Controllers::failed_daemon_hosts`):
    /// while there is none, no task is at risk and none is looked up.
    pub(super) failed_daemon_hosts: &'a BTreeSet<HostIx>,
    /// When this server loaded the store: what began before it was not seen.
    pub(super) loaded_at_ms: u64,
    pub(super) now_ms: u64,
}

impl Reader<'_> {
    /// Where a live task stands as its service's rollout counts it: healthy once RUNNING,
    /// ready, and passing its essential containers' health checks when it has any.
    pub(in crate::cluster) fn replica_state(&self, t: &Task) -> ReplicaState {
        replica_state_of(t, || self.health_checked(&t.task_definition))
    }

    /// Whether a definition's health counts: one of its essential containers has a check.
    pub(in crate::cluster) fn health_checked(&self, td: &TaskDefRef) -> bool {
        self.state.taskdefs().get(&(td.family.clone(), td.revision)).is_some_and(|d| {
            d.value.container_definitions.iter().any(|c| c.essential && c.health_check.is_some())
        })
    }

    /// Whether a definition's replicas take traffic: one of its containers maps a port.
    pub(in crate::cluster) fn publishes_ports(&self, td: &TaskDefRef) -> bool {
        self.state
            .taskdefs()
            .get(&(td.family.clone(), td.revision))
            .is_some_and(|d| d.value.container_definitions.iter().any(|c| !c.port_mappings.is_empty()))
    }

    /// The service's live tasks as replicas of its rollout. A `restart` service does not count
    /// a task whose GPU's MPS daemon has failed (confirmed, local repair still trying): its
    /// rollout starts a copy elsewhere at once, and once the daemon answers again the task
    /// counts again and the extra copies stop, the newest first. A `fenced` service counts it
    /// until its host's incident confirms it gone.
    ///
    /// A replica that takes traffic (its definition maps a port) counts as started only while
    /// it is in discovery: one that left it at a failure's first signal (its daemon failing,
    /// its host silent: `traffic.rs`) counts as starting, so a deployment neither completes
    /// on it nor stops an old replica for it.
    pub(in crate::cluster) fn replicas(&self, svc: &Service) -> Vec<Replica<TaskId>> {
        // A service's tasks share one or two definitions: each is looked up once in a row.
        let mut last: Option<(&TaskDefRef, bool, bool)> = None;
        let restart = svc.resumption == ResumptionBoundary::Restart;
        let forced_at = svc.deployments.first().and_then(|d| d.forced_at_ms);
        self.state
            .tasks()
            .of_service(&svc.name)
            .iter()
            .filter_map(|id| self.state.tasks().get(id))
            .filter(|e| !(restart && e.task.desired_status != TaskStatus::Stopped && self.at_risk(&e.task)))
            .map(|e| {
                let td = &e.task.task_definition;
                let (checked, publishes) = match last {
                    Some((d, checked, publishes)) if d == td => (checked, publishes),
                    _ => {
                        let (checked, publishes) = (self.health_checked(td), self.publishes_ports(td));
                        last = Some((td, checked, publishes));
                        (checked, publishes)
                    }
                };
                let mut state = replica_state_of(&e.task, || checked);
                if state == ReplicaState::Healthy && publishes && self.left_traffic_at_a_signal(&e.task) {
                    state = ReplicaState::Starting;
                }
                Replica {
                    id: e.task.id,
                    current: *td == svc.task_definition
                        && !svc.moving.contains(&e.task.id)
                        && forced_at.is_none_or(|at| e.task.created_at_ms >= at),
                    state,
                    seq: e.seq,
                }
            })
            .collect()
    }

    /// Whether the task runs on a GPU whose MPS daemon's failure is confirmed.
    pub(in crate::cluster) fn at_risk(&self, t: &Task) -> bool {
        if self.failed_daemon_hosts.is_empty() {
            return false;
        }
        let Some(ix) = t.host_id.as_ref().and_then(|h| self.sched.host(h)) else { return false };
        let failed = &self.state.hosts()[ix as usize].failed_daemons;
        !failed.is_empty() && t.gpu_ids.iter().any(|g| failed.contains(g))
    }

    /// The record of `task` told to stop now, with `code` and `reason` unless it has them.
    pub(in crate::cluster) fn stopped_record(&self, task: &Task, code: StopCode, reason: &str) -> Task {
        let mut t = task.clone();
        // A stop request applies in every state (a stopped task's changes nothing).
        if let Err(e) = task_lifecycle::apply(&mut t, task_lifecycle::Event::StopRequested) {
            tracing::error!(task.id = %t.id, "a stop request was refused: {e}");
        }
        if t.last_status == TaskStatus::Stopped {
            t.pending_reason = None;
            t.pending_code = None;
            t.unplaceable = false;
            t.stopped_at_ms.get_or_insert(self.now_ms);
        }
        t.stop_code.get_or_insert(code);
        t.stopped_reason.get_or_insert_with(|| reason.to_string());
        t
    }

    /// A stop that does not wait for an agent that will never answer (`host_gone`): recorded
    /// as STOPPED at once.
    pub(in crate::cluster) fn forced_stop(
        &self,
        task: &Task,
        code: StopCode,
        reason: &str,
        host_gone: bool,
    ) -> Task {
        let mut t = self.stopped_record(task, code, reason);
        if host_gone && t.last_status != TaskStatus::Stopped {
            super::force_stop(&mut t);
            t.stopped_at_ms = Some(self.now_ms);
        }
        t
    }

    /// The desired count of a DAEMON service of `pool` now: the pool's ACTIVE hosts (what a
    /// create answers with; every reconcile keeps it up to date).
    pub(in crate::cluster) fn active_hosts_of(&self, pool: &PoolName) -> u32 {
        let active = |h: &Host| h.pool == *pool && h.status == HostStatus::Active;
        self.state.hosts().iter().filter(|e| active(e.host())).count() as u32
    }

    /// The storm breaker's view of a pool: hosts that are ACTIVE or DRAINING, less the
    /// replacements of unresolved incidents (so that joining replacements do not dilute the
    /// share). A host is unhealthy while its health is not, and while an incident about it is
    /// unresolved: a host being drained still counts, so a correlated failure declared host by
    /// host cannot slip past the breaker one incident at a time.
    pub(in crate::cluster) fn pool_counts(&self, pool: &PoolName) -> PoolCounts {
        let open: Vec<&Incident> = self.state.incidents().unresolved().filter(|i| &i.pool == pool).collect();
        let replacements: BTreeSet<&HostId> =
            open.iter().filter_map(|i| i.replacement.as_ref().and_then(|r| r.host_id.as_ref())).collect();
        // A host an operator drained on purpose (maintenance) is not a failure the breaker
        // should count; one that is also unhealthy still counts through its verdict.
        let in_incident: BTreeSet<&HostId> = open
            .iter()
            .filter(|i| i.operator_requested != Some(OperatorAction::Drain))
            .map(|i| &i.host_id)
            .collect();
        let mut c = PoolCounts::default();
        for h in self.state.hosts() {
            if &h.host().pool != pool
                || !matches!(h.host().status, HostStatus::Active | HostStatus::Draining)
                || replacements.contains(&h.host().id)
            {
                continue;
            }
            c.total += 1;
            if !matches!(h.health.verdict, Verdict::Healthy) || in_incident.contains(&h.host().id) {
                c.unhealthy += 1;
            }
        }
        c
    }
}

/// A task's state as a replica; `checked` says whether its definition's health counts
/// (asked only for a running task).
pub(in crate::cluster) fn replica_state_of(t: &Task, checked: impl FnOnce() -> bool) -> ReplicaState {
    if t.desired_status == TaskStatus::Stopped || t.last_status == TaskStatus::Stopped || t.draining.is_some()
    {
        return ReplicaState::Stopping;
    }
    if t.host_id.is_none() {
        return ReplicaState::Waiting;
    }
    let healthy = match t.health_status {
        TaskHealth::Healthy => true,
        TaskHealth::Unknown => !checked(),
        TaskHealth::Unhealthy => false,
    };
    if t.last_status == TaskStatus::Running && t.ready && healthy {
        ReplicaState::Healthy
    } else {
        ReplicaState::Starting
    }
}

/// What the scheduler keeps of a pool: its strategy and compute overcommit.
pub(in crate::cluster) fn pool_config(p: &mpsfleet_types::Pool) -> mpsfleet_core::scheduler::PoolConfig {
    mpsfleet_core::scheduler::PoolConfig { strategy: p.strategy, compute_bound: p.compute_overcommit_percent }
}
