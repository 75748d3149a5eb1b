//! Remediation decisions: what the server does next for one incident, kube-controller style.
//! [`plan`] looks at the incident and a [`WorldView`] and returns the actions still to take;
//! the server executes each one and then calls [`record`] to write it to the incident. Pure
//! and idempotent: the same incident and world give the same plan, and an action already done
//! (visible in the timeline or the world) is not planned again, so the server can crash at
//! any point and simply plan again.
//!
//! The sequence, after ECS's managed path:
//!
//! 1. DECIDED: at once in a managed pool (mpsfleet decides); in a self-managed pool only when
//!    an operator command (`host drain`, `host replace`) is recorded on the incident. Until
//!    then a self-managed incident stays OPEN with no action, and resolves by itself if the
//!    host recovers.
//! 2. Safety limits, for automatic remediation only (an operator command overrides them):
//!    - the storm breaker holds back incidents that have not started: when more than
//!      `max(1, ceil(total * stormBreakerPercent / 100))` hosts are unhealthy, only the
//!      incidents ranked below that number (earliest opened first) proceed. A held-back
//!      incident whose host recovers resolves without action;
//!    - `maxInFlight` and the rate limit hold back the replacement request (and so the
//!      termination), not the cordon, drain and task moves before it.
//! 3. CORDONED, DRAIN_STARTED (recorded without action if the host already is).
//! 4. REPLACEMENT_REQUESTED, REPLACEMENT_READY (replace only; a failed replacement blocks).
//! 5. TASKS_RESCHEDULED: service tasks with the `restart` boundary at once; `fenced` ones only
//!    once the old host is confirmed terminated (or has fenced itself). Standalone tasks have no
//!    service to move them: they are stopped with `HostReplaced` once the host is going (the
//!    replacement is ready, or at once for a drain).
//! 6. The old host is terminated once the replacement is ready and every task on it has
//!    stopped, except the unmoved `fenced` ones (termination fences them); when the agent is
//!    unreachable nothing can stop, and termination does not wait.
//! 7. OLD_HOST_TERMINATED, TASKS_RUNNING_AGAIN (every replacement RUNNING, nothing left to
//!    move), RESOLVED. A drain resolves once the tasks are moved and everything on the host has
//!    stopped; the host stays cordoned and DRAINING for the operator.
//!
//! What is and is not promised for services: a moved task is a new run started from its
//! beginning. `StartReplacements` marks the old copy stopped and starts the new one in one
//! step, so the service's count of tasks does not change and its own reconciler has nothing to
//! add; the old copy of a `restart` task may still run on an unreachable host (at-least-once),
//! a `fenced` task has a gap between termination and its replacement running (at-most-once).
//! A service's minimum healthy percent is not honoured beyond this: replicas on the bad host
//! are moved together, without waiting for some to be RUNNING before moving the others (a
//! service spreads its replicas across hosts, so one host holds few of them).

use mpsfleet_types::{
    AffectedTask, HostId, HostStatus, Incident, IncidentState, OperatorAction, OwnershipMode,
    RemediationPolicy, ResumptionBoundary, ServiceName, Step, StopCode, TaskId, TaskStatus,
};

use crate::health::fmt_ms;

/// The pool around the incident.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PoolView {
    pub total_hosts: u32,
    /// Hosts whose verdict is not healthy, this one included.
    pub unhealthy_hosts: u32,
    /// Replacements requested by the pool's other unresolved incidents, not yet ready or failed.
    pub replacements_in_flight: u32,
    /// When replacements were requested in the pool (older ones are ignored).
    pub recent_replacements_ms: Vec<u64>,
    /// This incident's 0-based rank among the pool's unresolved incidents, earliest opened
    /// first (ties by id).
    pub incident_rank: u32,
}

/// The incident's host as the server sees it now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostState {
    pub status: HostStatus,
    pub cordoned: bool,
    /// The health verdict is healthy again.
    pub healthy: bool,
    /// The agent heartbeats within its grace, so it can stop tasks.
    pub agent_reachable: bool,
}

/// Who owns a task, and so how it moves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TaskOwner {
    Service { name: ServiceName, boundary: ResumptionBoundary },
    Standalone,
}

/// A task placed on the incident's host (stopped ones included).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostTask {
    pub id: TaskId,
    pub owner: TaskOwner,
    pub last_status: TaskStatus,
    pub desired_status: TaskStatus,
}

/// The provider's replacement host for this incident.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReplacementState {
    NotRequested,
    Requested,
    Ready {
        host_id: Option<HostId>,
    },
    /// The server may set it back to `NotRequested` to retry (an operator `host replace`).
    Failed {
        reason: String,
    },
}

/// The old host's termination.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TerminationState {
    NotRequested,
    Requested,
    /// The provider confirmed it, or the agent has fenced itself.
    Confirmed,
}

/// Everything [`plan`] looks at besides the incident.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorldView {
    pub pool: PoolView,
    pub host: HostState,
    pub tasks: Vec<HostTask>,
    pub replacement: ReplacementState,
    pub termination: TerminationState,
    /// The last status of each replacement task named in the incident's affected tasks; one
    /// counts as RUNNING only once it is ready too (where it declares a readiness check), as
    /// the caller passes it: that is when the work has resumed.
    pub replacement_tasks: Vec<(TaskId, TaskStatus)>,
}

/// A service task to move.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MoveTask {
    pub task_id: TaskId,
    pub service: ServiceName,
}

/// One thing for the server to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Nothing to execute: append the step (DECIDED, REPLACEMENT_READY, TASKS_RUNNING_AGAIN,
    /// OLD_HOST_TERMINATED, or CORDONED / DRAIN_STARTED when the host already was).
    Record(Step),
    /// Set the host's `cordoned`: nothing new is placed there.
    Cordon,
    /// Set the host DRAINING.
    MarkDraining,
    /// Ask the pool's provider for a replacement host.
    RequestReplacement,
    /// For each task, in one commit: mark the old copy stopped (`HostReplaced`), start one new
    /// task of its service elsewhere, and note it with [`Incident::set_replacement`].
    StartReplacements {
        tasks: Vec<MoveTask>,
    },
    /// Stop these tasks with `stop_code`; they are not replaced.
    StopStandalone {
        task_ids: Vec<TaskId>,
        stop_code: StopCode,
    },
    /// Ask the provider to terminate the old host.
    TerminateOldHost,
    Resolve,
    /// A safety limit or a provider failure holds remediation back; `reason` says which.
    Block {
        reason: String,
    },
}

impl Action {
    /// The timeline step [`record`] appends; None for actions whose outcome is a later step
    /// (termination shows as OLD_HOST_TERMINATED once confirmed) or that the affected tasks
    /// show (standalone stops).
    pub fn step(&self) -> Option<Step> {
        match self {
            Action::Record(step) => Some(*step),
            Action::Cordon => Some(Step::Cordoned),
            Action::MarkDraining => Some(Step::DrainStarted),
            Action::RequestReplacement => Some(Step::ReplacementRequested),
            Action::StartReplacements { .. } => Some(Step::TasksRescheduled),
            Action::StopStandalone { .. } | Action::TerminateOldHost => None,
            Action::Resolve => Some(Step::Resolved),
            Action::Block { .. } => Some(Step::Blocked),
        }
    }

    /// Whether the server has something to execute (not just a timeline entry).
    pub fn is_effect(&self) -> bool {
        !matches!(self, Action::Record(_) | Action::Resolve | Action::Block { .. })
    }
}

/// An action and the timeline detail to record with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Planned {
    pub action: Action,
    pub detail: String,
}

/// What to do now, and when to look again.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    /// In order; execute and [`record`] each before the next.
    pub actions: Vec<Planned>,
    /// Plan again after this long even if nothing changes (a rate limit window ends). None:
    /// only a change in the world can change the plan (the server plans again on changes to
    /// the host, its tasks, the provider or the pool, and on its periodic resync).
    pub requeue_after_ms: Option<u64>,
    /// What the incident waits for, for people (`incident describe`); None when nothing.
    pub waiting_for: Option<String>,
}

/// An operator resolves the incident (`incident resolve`, or `host activate` of its repaired
/// host): the timeline's last step, by whom, and the state RESOLVED.
pub fn resolve(incident: &mut Incident, now_ms: u64, detail: impl Into<String>, by: &str) {
    incident.push(now_ms, Step::Resolved, detail, Some(by.to_string()));
    incident.state = IncidentState::Resolved;
    incident.resolved_at_ms = Some(now_ms);
}

/// Writes an executed action to the incident: its timeline step, the state, affected tasks.
pub fn record(incident: &mut Incident, planned: &Planned, now_ms: u64) {
    if let Some(step) = planned.action.step() {
        incident.push(now_ms, step, planned.detail.clone(), None);
    }
    match &planned.action {
        Action::Record(_) => {}
        Action::Resolve => {
            incident.state = IncidentState::Resolved;
            incident.resolved_at_ms = Some(now_ms);
        }
        Action::Block { reason } => incident.state = IncidentState::Blocked { reason: reason.clone() },
        Action::StartReplacements { tasks } => {
            incident.state = IncidentState::Remediating;
            for t in tasks {
                incident.mark_handled(t.task_id, Some(t.service.clone()));
            }
        }
        Action::StopStandalone { task_ids, .. } => {
            incident.state = IncidentState::Remediating;
            for &task_id in task_ids {
                incident.mark_handled(task_id, None);
            }
        }
        Action::Cordon | Action::MarkDraining | Action::RequestReplacement | Action::TerminateOldHost => {
            incident.state = IncidentState::Remediating;
        }
    }
}

/// What the incident is heading for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Intent {
    /// Self-managed, no operator command: report only.
    Report,
    Drain,
    Replace,
}

struct Planner<'a> {
    incident: &'a Incident,
    actions: Vec<Planned>,
    waits: Vec<String>,
}

impl Planner<'_> {
    /// The step is in the timeline or planned in this pass.
    fn has(&self, step: Step) -> bool {
        self.incident.has(step) || self.actions.iter().any(|p| p.action.step() == Some(step))
    }

    fn push(&mut self, action: Action, detail: impl Into<String>) {
        self.actions.push(Planned { action, detail: detail.into() });
    }

    fn wait(&mut self, what: impl Into<String>) {
        self.waits.push(what.into());
    }

    fn finish(self, requeue_after_ms: Option<u64>) -> Plan {
        let waiting_for = (!self.waits.is_empty()).then(|| self.waits.join("; "));
        Plan { actions: self.actions, requeue_after_ms, waiting_for }
    }
}

/// The next actions for `incident`: see the module documentation for the sequence.
pub fn plan(
    incident: &Incident,
    world: &WorldView,
    policy: &RemediationPolicy,
    mode: OwnershipMode,
    now_ms: u64,
) -> Plan {
    let mut p = Planner { incident, actions: Vec::new(), waits: Vec::new() };
    if incident.state == IncidentState::Resolved {
        return p.finish(None);
    }
    let intent = match (incident.operator_requested, mode) {
        (Some(OperatorAction::Replace), _) | (None, OwnershipMode::Managed) => Intent::Replace,
        (Some(OperatorAction::Drain), _) => Intent::Drain,
        (None, OwnershipMode::SelfManaged) => Intent::Report,
    };
    let automatic = incident.operator_requested.is_none();
    let started = incident.has(Step::Cordoned);

    if intent == Intent::Report || (automatic && !started) {
        if world.host.healthy {
            let detail = match intent {
                Intent::Report => "host recovered; no action was taken (self-managed pool)",
                Intent::Drain | Intent::Replace => "host recovered before remediation started",
            };
            p.push(Action::Resolve, detail);
            return p.finish(None);
        }
        if intent == Intent::Report {
            p.wait("the operator: self-managed pool (`host drain` or `host replace`)");
            return p.finish(None);
        }
    }

    if !p.has(Step::Decided) {
        let detail = match incident.operator_requested {
            Some(op) => format!("operator requested host {}", op.as_str()),
            None => {
                format!("mpsfleet replaces the host: {} IMPAIRED past the toleration", incident.trigger.check)
            }
        };
        p.push(Action::Record(Step::Decided), detail);
    }

    if automatic && !started {
        if let Some(reason) = storm_breaker(&world.pool, policy, now_ms) {
            p.wait("fewer unhealthy hosts in the pool (storm breaker)");
            block(&mut p, reason);
            return p.finish(None);
        }
    }

    if !p.has(Step::Cordoned) {
        if world.host.cordoned {
            p.push(Action::Record(Step::Cordoned), "host was already cordoned");
        } else {
            p.push(Action::Cordon, "no new tasks are placed on the host");
        }
    }
    if !p.has(Step::DrainStarted) {
        if matches!(world.host.status, HostStatus::Draining | HostStatus::Deregistered) {
            p.push(
                Action::Record(Step::DrainStarted),
                format!("host was already {}", world.host.status.as_str()),
            );
        } else {
            p.push(Action::MarkDraining, "host marked DRAINING");
        }
    }

    let mut blocked: Option<String> = None;
    let mut requeue_after_ms = None;
    if intent == Intent::Replace {
        match &world.replacement {
            ReplacementState::NotRequested => match replacement_limits(&world.pool, policy, now_ms) {
                Some((reason, requeue)) if automatic => {
                    p.wait("room under the replacement limits");
                    blocked = Some(reason);
                    requeue_after_ms = requeue;
                }
                _ => p.push(Action::RequestReplacement, "replacement host requested from the provider"),
            },
            ReplacementState::Requested => p.wait("the replacement host to be ready"),
            ReplacementState::Ready { host_id } => {
                if !p.has(Step::ReplacementReady) {
                    let detail = match host_id {
                        Some(h) => format!("replacement host {h} is ready"),
                        None => "replacement host is ready".to_string(),
                    };
                    p.push(Action::Record(Step::ReplacementReady), detail);
                }
            }
            ReplacementState::Failed { reason } => {
                p.wait("a retried replacement (`host replace`)");
                blocked = Some(format!("remediation blocked: replacement host failed: {reason}"));
            }
        }
    }

    let terminated = world.termination == TerminationState::Confirmed;
    if terminated && !p.has(Step::OldHostTerminated) {
        p.push(Action::Record(Step::OldHostTerminated), "old host terminated");
    }

    // Service tasks still to move, by id.
    let mut movable: Vec<(&HostTask, &ServiceName, ResumptionBoundary)> = world
        .tasks
        .iter()
        .filter(|t| t.desired_status != TaskStatus::Stopped && !incident.handled(t.id))
        .filter_map(|t| match &t.owner {
            TaskOwner::Service { name, boundary } => Some((t, name, *boundary)),
            TaskOwner::Standalone => None,
        })
        .collect();
    movable.sort_by_key(|(t, _, _)| t.id);
    let (now, fenced_waiting): (Vec<_>, Vec<_>) =
        movable.into_iter().partition(|&(_, _, b)| b == ResumptionBoundary::Restart || terminated);
    if !now.is_empty() {
        let restart = now.iter().filter(|(_, _, b)| *b == ResumptionBoundary::Restart).count();
        let ids: Vec<String> = now.iter().map(|(t, _, _)| t.id.to_string()).collect();
        let detail = format!(
            "replacing {} service task(s) elsewhere ({restart} restart, {} fenced): {}",
            now.len(),
            now.len() - restart,
            ids.join(", ")
        );
        let tasks = now.iter().map(|(t, s, _)| MoveTask { task_id: t.id, service: (*s).clone() }).collect();
        p.push(Action::StartReplacements { tasks }, detail);
    }
    if !fenced_waiting.is_empty() {
        p.wait(format!(
            "the old host to be terminated or fenced before moving {} fenced task(s)",
            fenced_waiting.len()
        ));
    }
    let fenced_ids: Vec<TaskId> = fenced_waiting.iter().map(|(t, _, _)| t.id).collect();

    let host_going = match intent {
        Intent::Replace => p.has(Step::ReplacementReady),
        Intent::Drain | Intent::Report => true,
    };
    let mut standalone: Vec<TaskId> = world
        .tasks
        .iter()
        .filter(|t| t.owner == TaskOwner::Standalone && t.desired_status != TaskStatus::Stopped)
        .filter(|t| !incident.handled(t.id))
        .map(|t| t.id)
        .collect();
    standalone.sort();
    if host_going && !standalone.is_empty() {
        let ids: Vec<String> = standalone.iter().map(TaskId::to_string).collect();
        let stop_code = match intent {
            Intent::Replace => StopCode::HostReplaced,
            Intent::Drain | Intent::Report => StopCode::HostDrained,
        };
        let detail =
            format!("stopping {} standalone task(s) ({}): {}", ids.len(), stop_code.as_str(), ids.join(", "));
        p.push(Action::StopStandalone { task_ids: standalone, stop_code }, detail);
    }

    // Tasks that must stop before the host goes: all but the unmoved fenced ones.
    let still_running = world
        .tasks
        .iter()
        .filter(|t| t.last_status != TaskStatus::Stopped && !fenced_ids.contains(&t.id))
        .count();
    let stopped_or_unreachable = still_running == 0 || !world.host.agent_reachable;
    if intent == Intent::Replace && p.has(Step::ReplacementReady) {
        match world.termination {
            TerminationState::NotRequested if stopped_or_unreachable => {
                p.push(Action::TerminateOldHost, "old host termination requested from the provider")
            }
            TerminationState::NotRequested => {
                p.wait(format!("{still_running} task(s) on the old host to stop before it is terminated"))
            }
            TerminationState::Requested => p.wait("the provider to confirm the old host terminated"),
            TerminationState::Confirmed => {}
        }
    }

    if !p.has(Step::TasksRunningAgain) {
        let moved: Vec<&AffectedTask> =
            incident.affected_tasks.iter().filter(|a| a.service.is_some() && !a.waiting).collect();
        let running = moved
            .iter()
            .filter(|a| {
                a.replacement.is_some_and(|r| world.replacement_tasks.contains(&(r, TaskStatus::Running)))
            })
            .count();
        let planned_moves = p.actions.iter().any(|a| matches!(a.action, Action::StartReplacements { .. }));
        if running == moved.len() && !planned_moves && fenced_ids.is_empty() {
            let detail = match moved.len() {
                0 => "no service tasks to move".to_string(),
                n => format!("{n} replacement task(s) RUNNING"),
            };
            p.push(Action::Record(Step::TasksRunningAgain), detail);
        } else if !moved.is_empty() && running < moved.len() {
            p.wait(format!(
                "{} of {} replacement task(s) to reach RUNNING",
                moved.len() - running,
                moved.len()
            ));
        }
    }

    let done = match intent {
        Intent::Replace => p.has(Step::OldHostTerminated),
        Intent::Drain | Intent::Report => {
            if !stopped_or_unreachable {
                p.wait(format!("{still_running} task(s) on the host to stop"));
            }
            standalone_done(&p, world) && stopped_or_unreachable
        }
    } && p.has(Step::TasksRunningAgain);
    if done && blocked.is_none() {
        match intent {
            Intent::Replace => {
                p.waits.clear();
                p.push(Action::Resolve, "host replaced");
            }
            // A drained host stays cordoned and DRAINING, and the incident open, until the
            // operator repairs it and runs `host activate` (which resolves it), resolves the
            // incident, or removes the machine.
            Intent::Drain | Intent::Report if terminated || world.host.status == HostStatus::Deregistered => {
                p.waits.clear();
                p.push(Action::Resolve, "host drained and removed from the fleet");
            }
            Intent::Drain | Intent::Report => {
                p.waits.clear();
                p.wait(
                    "the operator: the host is drained; repair it and run `host activate`, or \
                     `incident resolve` once the machine is removed",
                );
            }
        }
    }
    if let Some(reason) = blocked {
        block(&mut p, reason);
    }
    p.finish(requeue_after_ms)
}

/// Every standalone task was told to stop (before or in this pass).
fn standalone_done(p: &Planner<'_>, world: &WorldView) -> bool {
    let planned = |id: TaskId| {
        p.actions
            .iter()
            .any(|a| matches!(&a.action, Action::StopStandalone { task_ids, .. } if task_ids.contains(&id)))
    };
    world
        .tasks
        .iter()
        .filter(|t| t.owner == TaskOwner::Standalone && t.desired_status != TaskStatus::Stopped)
        .all(|t| p.incident.handled(t.id) || planned(t.id))
}

/// Plans a Block unless the incident already is blocked for the same reason and nothing else
/// happens in this pass (then it would only repeat itself).
fn block(p: &mut Planner<'_>, reason: String) {
    let same = p.incident.state == IncidentState::Blocked { reason: reason.clone() };
    if !same || p.actions.iter().any(|a| a.action.is_effect()) {
        p.push(Action::Block { reason: reason.clone() }, reason);
    }
}

/// How many unhealthy hosts of `total` the storm breaker lets remediation work on at once:
/// `max(1, ceil(total * stormBreakerPercent / 100))`; more unhealthy hosts than this trip it.
pub fn storm_breaker_allowed(total: u32, policy: &RemediationPolicy) -> u64 {
    (u64::from(total) * u64::from(policy.storm_breaker_percent)).div_ceil(100).max(1)
}

/// The storm breaker's refusal for an incident that has not started, if any. While it is
/// tripped, at most `allowed` hosts are replaced: the earliest incidents, and only while fewer
/// than `allowed` replacements were requested in the pool within the rate-limit window (so a
/// storm is not worked through one host after another).
fn storm_breaker(pool: &PoolView, policy: &RemediationPolicy, now_ms: u64) -> Option<String> {
    let percent = u64::from(policy.storm_breaker_percent);
    let total = u64::from(pool.total_hosts);
    let unhealthy = u64::from(pool.unhealthy_hosts);
    let allowed = storm_breaker_allowed(pool.total_hosts, policy);
    let window_start = now_ms.saturating_sub(policy.rate_limit.per_ms);
    let recent = pool.recent_replacements_ms.iter().filter(|&&t| t >= window_start).count() as u64;
    if unhealthy <= allowed || (u64::from(pool.incident_rank) < allowed && recent < allowed) {
        return None;
    }
    let share = (unhealthy * 100).div_ceil(total.max(1));
    Some(format!(
        "remediation blocked: {unhealthy} of {total} hosts ({share}%) unhealthy, above the {percent}% storm \
         breaker; the first {allowed} incident(s) proceed"
    ))
}

/// The in-flight and rate limits' refusal of a replacement request, with when the rate limit
/// frees a slot.
fn replacement_limits(
    pool: &PoolView,
    policy: &RemediationPolicy,
    now_ms: u64,
) -> Option<(String, Option<u64>)> {
    if pool.replacements_in_flight >= policy.max_in_flight {
        return Some((
            format!(
                "remediation blocked: {} replacement(s) already in flight in the pool, the most \
                 remediationPolicy.maxInFlight allows ({})",
                pool.replacements_in_flight, policy.max_in_flight
            ),
            None,
        ));
    }
    let per = policy.rate_limit.per_ms;
    let window: Vec<u64> =
        pool.recent_replacements_ms.iter().copied().filter(|&t| t <= now_ms && now_ms - t < per).collect();
    if window.len() as u64 >= u64::from(policy.rate_limit.max) {
        let frees_at = window.iter().min().map_or(now_ms, |&t| t + per);
        return Some((
            format!(
                "remediation blocked: {} replacement(s) in the last {}, at the rate limit of {} per {}",
                window.len(),
                fmt_ms(per),
                policy.rate_limit.max,
                fmt_ms(per)
            ),
            Some(frees_at.saturating_sub(now_ms)),
        ));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use mpsfleet_types::{IncidentOwner, PoolName, Trigger};

    // ---- a small server that executes plans ----

    fn restart(id: u64, service: &str) -> HostTask {
        let name = ServiceName::new(service).unwrap();
        let owner = TaskOwner::Service { name, boundary: ResumptionBoundary::Restart };
        HostTask {
            id: TaskId(id),
            owner,
            last_status: TaskStatus::Running,
            desired_status: TaskStatus::Running,
        }
    }

    fn fenced(id: u64, service: &str) -> HostTask {
        let name = ServiceName::new(service).unwrap();
        let owner = TaskOwner::Service { name, boundary: ResumptionBoundary::Fenced };
        HostTask {
            id: TaskId(id),
            owner,
            last_status: TaskStatus::Running,
            desired_status: TaskStatus::Running,
        }
    }

    fn standalone(id: u64) -> HostTask {
        let owner = TaskOwner::Standalone;
        HostTask {
            id: TaskId(id),
            owner,
            last_status: TaskStatus::Running,
            desired_status: TaskStatus::Running,
        }
    }

    /// What happens outside the planner before a plan.
    #[derive(Debug, Clone)]
    enum Ev {
        Nothing,
        ProviderReady,
        ProviderFails,
        /// The agent reports every task asked to stop as STOPPED.
        TasksStop,
        ReplacementsRunning,
        /// The provider confirms termination; the agent is gone with its host.
        TerminationConfirmed,
        HostRecovers,
        Operator(OperatorAction),
        /// The rate limit's window is empty again.
        RateWindowPasses,
    }

    struct Sim {
        incident: Incident,
        world: WorldView,
        mode: OwnershipMode,
        policy: RemediationPolicy,
        now: u64,
    }

    fn sim(mode: OwnershipMode, tasks: Vec<HostTask>) -> Sim {
        let trigger = Trigger {
            check: "MPS_DAEMON".into(),
            gpu_id: None,
            reason: "probe timed out after 3s".into(),
            evidence: "agent reported IMPAIRED".into(),
            first_failure_at_ms: Some(90_000),
            local_repairs_at_ms: Vec::new(),
            earlier_repairs_at_ms: Vec::new(),
        };
        let incident = Incident::open(
            "i-1".into(),
            HostId::new("h-old").unwrap(),
            PoolName::new("p").unwrap(),
            IncidentOwner::for_mode(mode),
            trigger,
            95_000,
            100_000,
        );
        let world = WorldView {
            pool: PoolView { total_hosts: 5, unhealthy_hosts: 1, ..PoolView::default() },
            host: HostState {
                status: HostStatus::Active,
                cordoned: false,
                healthy: false,
                agent_reachable: true,
            },
            tasks,
            replacement: ReplacementState::NotRequested,
            termination: TerminationState::NotRequested,
            replacement_tasks: Vec::new(),
        };
        Sim { incident, world, mode, policy: RemediationPolicy::default(), now: 100_000 }
    }

    impl Sim {
        fn event(&mut self, ev: &Ev) {
            let w = &mut self.world;
            match ev {
                Ev::Nothing => {}
                Ev::ProviderReady => {
                    w.replacement = ReplacementState::Ready { host_id: HostId::new("h-new").ok() }
                }
                Ev::ProviderFails => {
                    w.replacement = ReplacementState::Failed { reason: "launch exited 1".into() }
                }
                Ev::TasksStop => w
                    .tasks
                    .iter_mut()
                    .filter(|t| t.desired_status == TaskStatus::Stopped)
                    .for_each(|t| t.last_status = TaskStatus::Stopped),
                Ev::ReplacementsRunning => {
                    w.replacement_tasks.iter_mut().for_each(|r| r.1 = TaskStatus::Running)
                }
                Ev::TerminationConfirmed => {
                    w.termination = TerminationState::Confirmed;
                    w.host.agent_reachable = false;
                }
                Ev::HostRecovers => w.host.healthy = true,
                Ev::Operator(op) => self.incident.operator_requested = Some(*op),
                Ev::RateWindowPasses => w.pool.recent_replacements_ms.clear(),
            }
        }

        fn plan(&self) -> Plan {
            plan(&self.incident, &self.world, &self.policy, self.mode, self.now)
        }

        /// Executes one action the way the server would, then records it.
        fn execute(&mut self, p: &Planned) {
            let w = &mut self.world;
            match &p.action {
                Action::Cordon => w.host.cordoned = true,
                Action::MarkDraining => w.host.status = HostStatus::Draining,
                Action::RequestReplacement => w.replacement = ReplacementState::Requested,
                Action::StopStandalone { task_ids, .. } => {
                    w.tasks.iter_mut().filter(|t| task_ids.contains(&t.id)).for_each(|t| {
                        t.desired_status = TaskStatus::Stopped;
                    })
                }
                Action::TerminateOldHost => w.termination = TerminationState::Requested,
                Action::StartReplacements { .. }
                | Action::Record(_)
                | Action::Resolve
                | Action::Block { .. } => {}
            }
            record(&mut self.incident, p, self.now);
            if let Action::StartReplacements { tasks } = &p.action {
                for t in tasks {
                    let new = TaskId(t.task_id.0 + 100);
                    assert!(self.incident.set_replacement(t.task_id, new, None));
                    self.world.replacement_tasks.push((new, TaskStatus::Pending));
                    let old = self.world.tasks.iter_mut().find(|x| x.id == t.task_id).unwrap();
                    old.desired_status = TaskStatus::Stopped;
                }
            }
        }

        /// Plans, checks that a crash after any prefix of the plan re-plans exactly the rest
        /// and that planning again after all of it plans nothing, and returns the plan.
        fn step(&mut self) -> Plan {
            let plan = self.plan();
            assert_eq!(plan, self.plan(), "plan is not deterministic");
            for (i, p) in plan.actions.iter().enumerate() {
                self.execute(p);
                let rest = self.plan();
                assert_eq!(
                    rest.actions,
                    plan.actions[i + 1..],
                    "after a crash following {:?}, the re-plan differs",
                    p.action
                );
            }
            let again = self.plan();
            assert!(again.actions.is_empty(), "re-plan repeats itself: {:?}", again.actions);
            self.now += 1_000;
            plan
        }
    }

    fn render(a: &Action) -> String {
        let ids = |ids: &mut dyn Iterator<Item = TaskId>| {
            ids.map(|t| t.0.to_string()).collect::<Vec<_>>().join(",")
        };
        match a {
            Action::Record(step) => step.as_str().to_string(),
            Action::Cordon => "Cordon".into(),
            Action::MarkDraining => "MarkDraining".into(),
            Action::RequestReplacement => "RequestReplacement".into(),
            Action::StartReplacements { tasks } => {
                format!("Start[{}]", ids(&mut tasks.iter().map(|t| t.task_id)))
            }
            Action::StopStandalone { task_ids, stop_code } => {
                let code = match stop_code {
                    StopCode::HostReplaced => "",
                    StopCode::HostDrained => "drained:",
                    other => panic!("unexpected stop code {other:?}"),
                };
                format!("Stop[{code}{}]", ids(&mut task_ids.iter().copied()))
            }
            Action::TerminateOldHost => "Terminate".into(),
            Action::Resolve => "Resolve".into(),
            Action::Block { reason } => format!("Block: {reason}"),
        }
    }

    /// Runs `script`: before each plan its event happens, then the plan must render as the
    /// listed actions (a `Block: ` entry matches by prefix). Returns the simulation for more
    /// assertions.
    #[track_caller]
    fn check(name: &str, mut s: Sim, script: &[(Ev, &[&str])]) -> Sim {
        for (i, (ev, want)) in script.iter().enumerate() {
            s.event(ev);
            let plan = s.step();
            let got: Vec<String> = plan.actions.iter().map(|p| render(&p.action)).collect();
            let same = got.len() == want.len()
                && got
                    .iter()
                    .zip(want.iter())
                    .all(|(g, w)| g == w || (w.starts_with("Block: ") && g.starts_with(w)));
            assert!(
                same,
                "{name}: step {i} after {ev:?}:\n got  {got:?}\n want {want:?}\n waiting: {:?}",
                plan.waiting_for
            );
        }
        s
    }

    fn steps(i: &Incident) -> Vec<&'static str> {
        i.timeline.iter().map(|e| e.step.as_str()).collect()
    }

    // ---- managed ----

    #[test]
    fn managed_happy_path() {
        use Ev::*;
        let tasks = vec![restart(1, "web"), restart(2, "web"), fenced(3, "db"), standalone(4)];
        let s = check(
            "managed, mixed tasks",
            sim(OwnershipMode::Managed, tasks),
            &[
                (Nothing, &["DECIDED", "Cordon", "MarkDraining", "RequestReplacement", "Start[1,2]"]),
                (Nothing, &[]),
                (ReplacementsRunning, &[]), // fenced task 3 still to move
                (ProviderReady, &["REPLACEMENT_READY", "Stop[4]"]),
                (Nothing, &[]), // waiting for 1, 2 and 4 to stop
                (TasksStop, &["Terminate"]),
                (Nothing, &[]),
                (TerminationConfirmed, &["OLD_HOST_TERMINATED", "Start[3]"]),
                (Nothing, &[]),
                (ReplacementsRunning, &["TASKS_RUNNING_AGAIN", "Resolve"]),
                (Nothing, &[]),
            ],
        );
        let i = &s.incident;
        assert_eq!(
            steps(i),
            [
                "FIRST_FAILURE",
                "DETECTED",
                "DECIDED",
                "CORDONED",
                "DRAIN_STARTED",
                "REPLACEMENT_REQUESTED",
                "TASKS_RESCHEDULED",
                "REPLACEMENT_READY",
                "OLD_HOST_TERMINATED",
                "TASKS_RESCHEDULED",
                "TASKS_RUNNING_AGAIN",
                "RESOLVED"
            ]
        );
        assert_eq!(i.state, IncidentState::Resolved);
        assert_eq!(i.resolved_at_ms, Some(109_000));
        let affected: Vec<(u64, Option<&str>, Option<u64>)> = i
            .affected_tasks
            .iter()
            .map(|a| (a.task_id.0, a.service.as_ref().map(ServiceName::as_str), a.replacement.map(|r| r.0)))
            .collect();
        assert_eq!(
            affected,
            [
                (1, Some("web"), Some(101)),
                (2, Some("web"), Some(102)),
                (4, None, None),
                (3, Some("db"), Some(103))
            ]
        );
        let d = i.durations();
        assert_eq!((d.detect_ms, d.decide_ms, d.recover_ms), (Some(5_000), Some(5_000), Some(14_000)));
        assert!(s.plan().actions.is_empty(), "a resolved incident plans nothing");
    }

    #[test]
    fn boundaries() {
        use Ev::*;
        check(
            "restart moves at once, before any capacity is ready",
            sim(OwnershipMode::Managed, vec![restart(1, "web")]),
            &[
                (Nothing, &["DECIDED", "Cordon", "MarkDraining", "RequestReplacement", "Start[1]"]),
                (ReplacementsRunning, &["TASKS_RUNNING_AGAIN"]),
                (ProviderReady, &["REPLACEMENT_READY"]), // old copy of 1 not stopped yet
                (TasksStop, &["Terminate"]),
                (TerminationConfirmed, &["OLD_HOST_TERMINATED", "Resolve"]),
            ],
        );
        check(
            "fenced waits for termination",
            sim(OwnershipMode::Managed, vec![fenced(3, "db")]),
            &[
                (Nothing, &["DECIDED", "Cordon", "MarkDraining", "RequestReplacement"]),
                (ProviderReady, &["REPLACEMENT_READY", "Terminate"]), // termination fences task 3
                (Nothing, &[]),
                (TerminationConfirmed, &["OLD_HOST_TERMINATED", "Start[3]"]),
                (ReplacementsRunning, &["TASKS_RUNNING_AGAIN", "Resolve"]),
            ],
        );
        let mut s = sim(OwnershipMode::Managed, vec![standalone(4)]);
        s.world.host.agent_reachable = false;
        check(
            "an unreachable agent cannot stop tasks: termination does not wait",
            s,
            &[
                (
                    Nothing,
                    &["DECIDED", "Cordon", "MarkDraining", "RequestReplacement", "TASKS_RUNNING_AGAIN"],
                ),
                (ProviderReady, &["REPLACEMENT_READY", "Stop[4]", "Terminate"]),
                (TerminationConfirmed, &["OLD_HOST_TERMINATED", "Resolve"]),
            ],
        );
        let mut s = sim(OwnershipMode::Managed, vec![restart(1, "web")]);
        s.world.tasks.push(HostTask {
            last_status: TaskStatus::Stopped,
            desired_status: TaskStatus::Stopped,
            ..restart(2, "web")
        });
        check(
            "tasks already stopped are left to their service",
            s,
            &[(Nothing, &["DECIDED", "Cordon", "MarkDraining", "RequestReplacement", "Start[1]"])],
        );
        let mut s = sim(OwnershipMode::Managed, vec![]);
        s.world.host.cordoned = true;
        s.world.host.status = HostStatus::Draining;
        let s = check(
            "an already cordoned, draining host is recorded, not acted on",
            s,
            &[(
                Nothing,
                &["DECIDED", "CORDONED", "DRAIN_STARTED", "RequestReplacement", "TASKS_RUNNING_AGAIN"],
            )],
        );
        assert_eq!(s.incident.state, IncidentState::Remediating);
        check(
            "a host that recovers mid-remediation is still replaced",
            sim(OwnershipMode::Managed, vec![]),
            &[
                (
                    Nothing,
                    &["DECIDED", "Cordon", "MarkDraining", "RequestReplacement", "TASKS_RUNNING_AGAIN"],
                ),
                (HostRecovers, &[]),
                (ProviderReady, &["REPLACEMENT_READY", "Terminate"]),
            ],
        );
    }

    // ---- safety limits ----

    fn pool(s: &mut Sim, total: u32, unhealthy: u32, rank: u32) {
        s.world.pool.total_hosts = total;
        s.world.pool.unhealthy_hosts = unhealthy;
        s.world.pool.incident_rank = rank;
    }

    #[test]
    fn storm_breaker() {
        use Ev::*;
        let storm = "Block: remediation blocked: 3 of 5 hosts (60%) unhealthy, above the 20% storm breaker";
        let start: &[&str] = &["DECIDED", "Cordon", "MarkDraining", "RequestReplacement", "Start[1]"];
        for (total, unhealthy, rank, blocked) in [
            (5, 3, 0, None), // the first ranked proceeds
            (5, 3, 1, Some(storm)),
            (5, 3, 2, Some(storm)),
            (5, 1, 0, None),
            (1, 1, 0, None), // at least one host is always allowed
            (10, 2, 1, None),
            (10, 3, 1, None), // ceil(10 * 20%) = 2 proceed
            (
                10,
                3,
                2,
                Some(
                    "Block: remediation blocked: 3 of 10 hosts (30%) unhealthy, above the 20% storm breaker; \
                     the first 2 incident(s) proceed",
                ),
            ),
            (
                1000,
                201,
                200,
                Some("Block: remediation blocked: 201 of 1000 hosts (21%) unhealthy, above the 20% storm breaker"),
            ),
        ] {
            let mut s = sim(OwnershipMode::Managed, vec![restart(1, "web")]);
            pool(&mut s, total, unhealthy, rank);
            let name = format!("{unhealthy} of {total}, rank {rank}");
            let Some(storm) = blocked else {
                check(&name, s, &[(Nothing, start)]);
                continue;
            };
            let s = check(&name, s, &[(Nothing, &["DECIDED", storm]), (Nothing, &[])]);
            assert!(matches!(s.incident.state, IncidentState::Blocked { .. }), "{name}: not blocked");
            assert!(s.plan().waiting_for.unwrap().contains("storm breaker"));
        }

        let mut s = sim(OwnershipMode::Managed, vec![restart(1, "web")]);
        pool(&mut s, 5, 3, 1);
        let s = check("blocked, then the storm passes", s, &[(Nothing, &["DECIDED", storm]), (Nothing, &[])]);
        let mut s = s;
        pool(&mut s, 5, 1, 0);
        check("unblocked", s, &[(Nothing, &["Cordon", "MarkDraining", "RequestReplacement", "Start[1]"])]);

        let mut s = sim(OwnershipMode::Managed, vec![restart(1, "web")]);
        pool(&mut s, 5, 3, 2);
        let s = check(
            "blocked, then the host recovers: resolved without action",
            s,
            &[(Nothing, &["DECIDED", storm]), (HostRecovers, &["Resolve"])],
        );
        assert_eq!(steps(&s.incident), ["FIRST_FAILURE", "DETECTED", "DECIDED", "BLOCKED", "RESOLVED"]);

        let mut s = sim(OwnershipMode::Managed, vec![restart(1, "web")]);
        pool(&mut s, 5, 3, 2);
        check(
            "an operator's replace overrides the breaker",
            s,
            &[
                (Nothing, &["DECIDED", storm]),
                (
                    Operator(OperatorAction::Replace),
                    &["Cordon", "MarkDraining", "RequestReplacement", "Start[1]"],
                ),
            ],
        );

        let mut s = sim(OwnershipMode::Managed, vec![restart(1, "web")]);
        let s1 = check(
            "started",
            sim(OwnershipMode::Managed, vec![]),
            &[(Nothing, &["DECIDED", "Cordon", "MarkDraining", "RequestReplacement", "TASKS_RUNNING_AGAIN"])],
        );
        s.incident = s1.incident;
        s.world = s1.world;
        pool(&mut s, 5, 4, 0);
        check(
            "a storm after the start does not stop a started incident",
            s,
            &[(ProviderReady, &["REPLACEMENT_READY", "Terminate"])],
        );
    }

    #[test]
    fn replacement_limits_block_the_request_only() {
        use Ev::*;
        let started = ["DECIDED", "Cordon", "MarkDraining"];
        let rate =
            "Block: remediation blocked: 5 replacement(s) in the last 10m, at the rate limit of 5 per 10m";
        let mut s = sim(OwnershipMode::Managed, vec![restart(1, "web")]);
        s.now = 1_000_000;
        // 300_000 is out of the 10m window; the oldest inside it frees a slot at 1_050_000.
        s.world.pool.recent_replacements_ms = vec![300_000, 450_000, 500_000, 600_000, 700_000, 990_000];
        let want: Vec<&str> = started.iter().copied().chain(["Start[1]", rate]).collect();
        let plan = s.plan();
        assert_eq!(plan.requeue_after_ms, Some(50_000));
        let s = check(
            "rate limit",
            s,
            &[(Nothing, &want), (Nothing, &[]), (RateWindowPasses, &["RequestReplacement"])],
        );
        assert_eq!(s.incident.state, IncidentState::Remediating);
        assert_eq!(s.plan().requeue_after_ms, None);

        let inflight =
            "Block: remediation blocked: 2 replacement(s) already in flight in the pool, the most \
                        remediationPolicy.maxInFlight allows (2)";
        let mut s = sim(OwnershipMode::Managed, vec![]);
        s.world.pool.replacements_in_flight = 2;
        let want: Vec<&str> = started.iter().copied().chain(["TASKS_RUNNING_AGAIN", inflight]).collect();
        let mut s = check("max in flight", s, &[(Nothing, &want), (Nothing, &[])]);
        assert_eq!(s.plan().requeue_after_ms, None);
        s.world.pool.replacements_in_flight = 1;
        check("room again", s, &[(Nothing, &["RequestReplacement"])]);

        let mut s = sim(OwnershipMode::Managed, vec![]);
        s.world.pool.replacements_in_flight = 5;
        check(
            "an operator's replace is not limited",
            s,
            &[(
                Operator(OperatorAction::Replace),
                &["DECIDED", "Cordon", "MarkDraining", "RequestReplacement", "TASKS_RUNNING_AGAIN"],
            )],
        );

        check(
            "a failed replacement blocks",
            sim(OwnershipMode::Managed, vec![]),
            &[
                (
                    Nothing,
                    &["DECIDED", "Cordon", "MarkDraining", "RequestReplacement", "TASKS_RUNNING_AGAIN"],
                ),
                (ProviderFails, &["Block: remediation blocked: replacement host failed: launch exited 1"]),
                (Nothing, &[]),
            ],
        );
    }

    // ---- self-managed ----

    #[test]
    fn self_managed() {
        use Ev::*;
        let tasks = || vec![restart(1, "web"), standalone(4)];
        let s = check(
            "self-managed reports only",
            sim(OwnershipMode::SelfManaged, tasks()),
            &[(Nothing, &[]), (Nothing, &[])],
        );
        assert_eq!((s.incident.owner, &s.incident.state), (IncidentOwner::Operator, &IncidentState::Open));
        assert_eq!(steps(&s.incident), ["FIRST_FAILURE", "DETECTED"]);
        assert!(s.plan().waiting_for.unwrap().contains("host replace"));

        let s = check(
            "then the operator replaces the host",
            s,
            &[
                (
                    Operator(OperatorAction::Replace),
                    &["DECIDED", "Cordon", "MarkDraining", "RequestReplacement", "Start[1]"],
                ),
                (ProviderReady, &["REPLACEMENT_READY", "Stop[4]"]),
                (TasksStop, &["Terminate"]),
                (TerminationConfirmed, &["OLD_HOST_TERMINATED"]),
                (ReplacementsRunning, &["TASKS_RUNNING_AGAIN", "Resolve"]),
            ],
        );
        assert_eq!(s.incident.timeline[2].detail, "operator requested host replace");
        assert_eq!(s.incident.owner, IncidentOwner::Operator);

        let s = check(
            "drain: no replacement, no termination",
            sim(OwnershipMode::SelfManaged, tasks()),
            &[
                (Nothing, &[]),
                (
                    Operator(OperatorAction::Drain),
                    &["DECIDED", "Cordon", "MarkDraining", "Start[1]", "Stop[drained:4]"],
                ),
                (ReplacementsRunning, &["TASKS_RUNNING_AGAIN"]),
                (TasksStop, &[]),
            ],
        );
        // Drained, and open until the operator activates the repaired host or resolves it.
        assert_ne!(s.incident.state, IncidentState::Resolved);
        let plan = plan(&s.incident, &s.world, &RemediationPolicy::default(), OwnershipMode::SelfManaged, 0);
        assert!(plan.waiting_for.as_deref().is_some_and(|w| w.contains("host activate")), "{plan:?}");

        check(
            "drain keeps fenced tasks until the host is fenced",
            sim(OwnershipMode::Managed, vec![fenced(3, "db")]),
            &[
                (Operator(OperatorAction::Drain), &["DECIDED", "Cordon", "MarkDraining"]),
                (Nothing, &[]),
                (TerminationConfirmed, &["OLD_HOST_TERMINATED", "Start[3]"]),
                (ReplacementsRunning, &["TASKS_RUNNING_AGAIN", "Resolve"]),
            ],
        );

        let s = check(
            "self-managed host recovers by itself",
            sim(OwnershipMode::SelfManaged, tasks()),
            &[(Nothing, &[]), (HostRecovers, &["Resolve"])],
        );
        assert!(s.incident.timeline.last().unwrap().detail.contains("no action was taken"));
    }

    #[test]
    fn waiting_for_says_why() {
        let mut s = sim(OwnershipMode::Managed, vec![fenced(3, "db"), restart(1, "web")]);
        s.step();
        let w = s.plan().waiting_for.unwrap();
        assert!(w.contains("the replacement host to be ready"), "{w}");
        assert!(w.contains("before moving 1 fenced task(s)"), "{w}");
        assert!(w.contains("1 of 1 replacement task(s) to reach RUNNING"), "{w}");
    }

    #[test]
    fn a_storm_is_not_worked_through_one_host_after_another() {
        let policy = RemediationPolicy::default();
        let pool = |rank, recent: Vec<u64>| PoolView {
            total_hosts: 5,
            unhealthy_hosts: 3,
            replacements_in_flight: 0,
            recent_replacements_ms: recent,
            incident_rank: rank,
        };
        let now = 1_000_000;
        assert!(
            crate::remediation::storm_breaker(&pool(0, vec![]), &policy, now).is_none(),
            "the first may go"
        );
        assert!(
            crate::remediation::storm_breaker(&pool(0, vec![999_000]), &policy, now).is_some(),
            "one already replaced in the window"
        );
        assert!(
            crate::remediation::storm_breaker(&pool(0, vec![1]), &policy, now).is_none(),
            "a replacement outside the window"
        );
        assert!(
            crate::remediation::storm_breaker(&pool(1, vec![]), &policy, now).is_some(),
            "only the earliest"
        );
    }
}
