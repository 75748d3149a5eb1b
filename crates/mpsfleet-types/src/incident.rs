//! Incidents: the record of one host turning bad and what followed, as a timeline of steps
//! with timestamps, the evidence that triggered it, its owner and the tasks it moved.

use crate::bounds::{BoundBreach, IncidentBounds, PhaseJudgement, PhaseVerdict, RecoveryPhase};
use crate::history::{Entry, History, HistoryEvent};
use crate::ids::{GpuUuid, HostId, PoolName, ServiceName, TaskId};
use crate::pool::OwnershipMode;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Who is responsible for acting on an incident.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum IncidentOwner {
    /// A managed pool: mpsfleet remediates.
    Mpsfleet,
    /// A self-managed pool: mpsfleet reports; the operator acts.
    Operator,
}

impl IncidentOwner {
    /// The owner a pool's ownership mode implies.
    pub fn for_mode(mode: OwnershipMode) -> Self {
        match mode {
            OwnershipMode::Managed => IncidentOwner::Mpsfleet,
            OwnershipMode::SelfManaged => IncidentOwner::Operator,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            IncidentOwner::Mpsfleet => "mpsfleet",
            IncidentOwner::Operator => "operator",
        }
    }
}

/// The check whose failure made the host bad, with its evidence.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Trigger {
    /// `AGENT`, `MPS_DAEMON` or `GPU`.
    pub check: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_id: Option<GpuUuid>,
    /// The check's reason when the host was declared bad, e.g. "probe timed out after 3s".
    pub reason: String,
    /// What was observed, with times: probe output, exit status, timeout, last heartbeat.
    pub evidence: String,
    /// The first failed signal of the failure, on the server's clock: the agent's first failed
    /// probe or the daemon's first exit (the agent reports how long ago it was, and the server
    /// places it at the report's arrival minus that), or for AGENT the last heartbeat. Never
    /// after DETECTED. None when unknown.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_failure_at_ms: Option<u64>,
    /// When the agent restarted what failed, locally, before the host was declared bad
    /// (server clock, placed like `firstFailureAtMs`), oldest first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub local_repairs_at_ms: Vec<u64>,
    /// Local restarts of an earlier failure of the same daemon within the agent's restart
    /// window (10 minutes) before this failure's first signal: they count against the same
    /// budget (`localDaemonRestarts` within 10 minutes), which is why this failure had fewer.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub earlier_repairs_at_ms: Vec<u64>,
}

/// Where an incident stands.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(tag = "status", rename_all = "SCREAMING_SNAKE_CASE")]
pub enum IncidentState {
    /// Detected; nothing done yet (in a self-managed pool: waiting for the operator).
    Open,
    /// Remediation actions are under way.
    Remediating,
    /// A safety limit (or a provider failure) holds remediation back.
    Blocked {
        reason: String,
    },
    Resolved,
}

impl IncidentState {
    pub fn as_str(&self) -> &'static str {
        match self {
            IncidentState::Open => "OPEN",
            IncidentState::Remediating => "REMEDIATING",
            IncidentState::Blocked { .. } => "BLOCKED",
            IncidentState::Resolved => "RESOLVED",
        }
    }
}

/// One step of the responsibility record.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, utoipa::ToSchema,
)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Step {
    /// The first failed signal of the failure (before DETECTED): see `Trigger::first_failure_at_ms`.
    FirstFailure,
    Detected,
    /// An operator took the incident (`incident acknowledge`); nothing else changes.
    Acknowledged,
    /// An operator command (`host drain`, `host replace`, `host activate`) was recorded.
    OperatorCommand,
    Decided,
    LocalRepairAttempt,
    Cordoned,
    DrainStarted,
    ReplacementRequested,
    /// A provider call (launch or terminate) failed and is tried again after a backoff.
    ProviderRetry,
    ReplacementReady,
    TasksRescheduled,
    TasksRunningAgain,
    OldHostTerminated,
    /// A replacement host that was requested will not be used (the incident ended first).
    ReplacementCancelled,
    /// The host is ACTIVE and healthy again (`host activate`).
    HostActivated,
    Resolved,
    Blocked,
    /// A phase of the recovery ran past the bound the incident is held to.
    BoundBreached,
    /// The host's service replicas left service discovery: when their host stopped answering
    /// or their MPS daemon failed (recorded as the incident opens, at the time it happened),
    /// or as an operator's drain takes them out before their stop.
    LeftTraffic,
    /// A lower-priority task was stopped to make room for a replica replacing one lost on
    /// the host ("preempted t-… on h-… to make room for t-…").
    Preempted,
}

impl Step {
    pub fn as_str(self) -> &'static str {
        match self {
            Step::FirstFailure => "FIRST_FAILURE",
            Step::Detected => "DETECTED",
            Step::Acknowledged => "ACKNOWLEDGED",
            Step::OperatorCommand => "OPERATOR_COMMAND",
            Step::Decided => "DECIDED",
            Step::LocalRepairAttempt => "LOCAL_REPAIR_ATTEMPT",
            Step::Cordoned => "CORDONED",
            Step::DrainStarted => "DRAIN_STARTED",
            Step::ReplacementRequested => "REPLACEMENT_REQUESTED",
            Step::ProviderRetry => "PROVIDER_RETRY",
            Step::ReplacementReady => "REPLACEMENT_READY",
            Step::TasksRescheduled => "TASKS_RESCHEDULED",
            Step::TasksRunningAgain => "TASKS_RUNNING_AGAIN",
            Step::OldHostTerminated => "OLD_HOST_TERMINATED",
            Step::ReplacementCancelled => "REPLACEMENT_CANCELLED",
            Step::HostActivated => "HOST_ACTIVATED",
            Step::Resolved => "RESOLVED",
            Step::Blocked => "BLOCKED",
            Step::BoundBreached => "RECOVERY_BOUND_BREACHED",
            Step::LeftTraffic => "LEFT_TRAFFIC",
            Step::Preempted => "PREEMPTED",
        }
    }
}

/// What one timeline entry says happened.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct TimelineEvent {
    pub step: Step,
    pub detail: String,
    /// Who did it, for operator commands: the identity of the token used (e.g. `admin`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub by: Option<String>,
}

impl HistoryEvent for TimelineEvent {}

/// One entry of an incident's timeline.
pub type TimelineEntry = Entry<TimelineEvent>;

/// The incident's bounded, coalescing timeline (see [`History`]).
pub type Timeline = History<TimelineEvent>;

/// The one-time registration token minted for an incident's replacement host, and the host
/// that registered with it. Only a host registering with that token becomes the replacement.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReplacementBinding {
    /// The name the provider is asked to launch the host under (for people and providers).
    pub name: String,
    /// SHA-256 of the token, hex; the token itself is only in the launch request.
    pub token_sha256: String,
    /// Digests of tokens minted earlier for the same replacement (a relaunch after a server
    /// restart mints a new one, while the machine launched before may still join with its
    /// own): still valid until one of them is used or they expire.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub earlier_token_sha256: Vec<String>,
    pub expires_at_ms: u64,
    /// The host that registered with the token; the token is spent once this is set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_id: Option<HostId>,
    /// The token was revoked before use (the incident ended without it).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub revoked: bool,
}

/// A task that was on the host when the incident moved or stopped it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct AffectedTask {
    pub task_id: TaskId,
    /// The service the task belongs to; None for a standalone task, which is stopped
    /// (`HostReplaced`) and not replaced.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service: Option<ServiceName>,
    /// The task started in its place, once the server has created it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replacement: Option<TaskId>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replacement_host: Option<HostId>,
    /// On the host, and not moved or stopped by the incident (e.g. a `fenced` task waiting for
    /// the old host's termination; on a resolved incident, a task that stopped on the host
    /// before it was moved).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub waiting: bool,
}

/// An operator command recorded on an incident (`host drain`, `host replace`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum OperatorAction {
    /// Cordon, drain and move the tasks; no replacement host, no termination.
    Drain,
    /// The full managed sequence, including a replacement host and termination.
    Replace,
}

impl OperatorAction {
    pub fn as_str(self) -> &'static str {
        match self {
            OperatorAction::Drain => "drain",
            OperatorAction::Replace => "replace",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Incident {
    pub id: String,
    pub host_id: HostId,
    pub pool: PoolName,
    pub owner: IncidentOwner,
    pub trigger: Trigger,
    pub state: IncidentState,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operator_requested: Option<OperatorAction>,
    /// Who acknowledged the incident, if anyone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub acknowledged_by: Option<String>,
    pub timeline: Timeline,
    /// When each step was first reached. The timeline is bounded and may elide entries; this
    /// is what the planner and the durations read.
    #[serde(default)]
    pub reached: BTreeMap<Step, u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replacement: Option<ReplacementBinding>,
    #[serde(default)]
    pub affected_tasks: Vec<AffectedTask>,
    pub opened_at_ms: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resolved_at_ms: Option<u64>,
    /// The recovery bounds it is held to, fixed when it opened (docs/pools.md "Recovery
    /// bounds"); None on records written before incidents had bounds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bounds: Option<IncidentBounds>,
    /// Phases seen past their bound, at most one entry per phase.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub breaches: Vec<BoundBreach>,
    /// The drill that caused it, if a drill did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drill: Option<String>,
    /// When the last of its moved tasks' replacements started RUNNING, where that was before
    /// TASKS_RUNNING_AGAIN was recorded (a `restart` service starts copies elsewhere as soon
    /// as a daemon's failure is confirmed, before the incident opens): the timing's resumed
    /// moment.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resumed_at_ms: Option<u64>,
}

/// Durations derived from an incident's timeline; None where a step has not happened (or,
/// for `detect_ms`, where the first failure time is unknown).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Durations {
    /// First failure evidence to DETECTED.
    pub detect_ms: Option<u64>,
    /// DETECTED to DECIDED.
    pub decide_ms: Option<u64>,
    /// DETECTED to TASKS_RUNNING_AGAIN, or to RESOLVED when no task was moved.
    pub recover_ms: Option<u64>,
}

/// An incident's timing from the user's side, the one record every figure of recovery reads:
/// the moments (server clock, milliseconds since the epoch) and the phases between them.
/// `None` where a moment has not come (yet), or a phase lacks one of its ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct RecoveryTiming {
    /// The first failed signal: when the user's work stopped (see `Trigger`).
    pub first_failure_at_ms: Option<u64>,
    /// The incident opened: the host was declared bad (its check IMPAIRED, the DETECTED step,
    /// for the pool's toleration).
    pub detected_at_ms: Option<u64>,
    /// The first action taken on it (DECIDED; in a self-managed pool, the operator's).
    pub decided_at_ms: Option<u64>,
    /// The replacement host joined, where a provider launched one (REPLACEMENT_READY).
    pub replacement_ready_at_ms: Option<u64>,
    /// Every affected service task runs again elsewhere, and is ready where it declares a
    /// readiness check (TASKS_RUNNING_AGAIN).
    pub resumed_at_ms: Option<u64>,
    /// First failure to detected.
    pub detect_ms: Option<u64>,
    /// Detected to decided.
    pub decide_ms: Option<u64>,
    /// Decided to replacement ready.
    pub replace_ms: Option<u64>,
    /// First failure to resumed: how long the work was down.
    pub total_ms: Option<u64>,
}

impl Incident {
    /// A new OPEN incident whose timeline starts with DETECTED at `detected_at_ms` (when the
    /// server first saw the trigger IMPAIRED).
    pub fn open(
        id: String,
        host_id: HostId,
        pool: PoolName,
        owner: IncidentOwner,
        trigger: Trigger,
        detected_at_ms: u64,
        opened_at_ms: u64,
    ) -> Self {
        let on = trigger.gpu_id.as_ref().map(|g| format!(" on {g}")).unwrap_or_default();
        let detail = format!("{} IMPAIRED{on}: {}", trigger.check, trigger.reason);
        // What came before the incident opened, in the order it happened: the first failed
        // signal (never after DETECTED), the local repairs, DETECTED.
        let mut before = Vec::new();
        if let Some(at) = trigger.first_failure_at_ms {
            let at = at.min(detected_at_ms);
            before.push((at, Step::FirstFailure, format!("first failed signal of {}{on}", trigger.check)));
        }
        // Each restart is numbered as the agent's budget counts it: within 10 minutes, an
        // earlier failure's restarts first.
        let earlier = trigger.earlier_repairs_at_ms.len();
        let repairs = trigger.local_repairs_at_ms.iter().filter(|&&at| at <= opened_at_ms);
        for (i, &at) in repairs.enumerate() {
            let before_this = match earlier {
                0 => String::new(),
                n => format!(", {n} of them by an earlier failure"),
            };
            let detail = format!(
                "the agent restarted {}{on} locally (restart {} within 10 minutes{before_this})",
                trigger.check,
                earlier + i + 1
            );
            before.push((at, Step::LocalRepairAttempt, detail));
        }
        before.push((detected_at_ms, Step::Detected, detail));
        before.sort_by_key(|b| (b.0, b.1 != Step::FirstFailure));
        let mut i = Self {
            id,
            host_id,
            pool,
            owner,
            trigger,
            state: IncidentState::Open,
            operator_requested: None,
            acknowledged_by: None,
            timeline: Timeline::new(),
            reached: BTreeMap::new(),
            replacement: None,
            affected_tasks: Vec::new(),
            opened_at_ms,
            resolved_at_ms: None,
            bounds: None,
            breaches: Vec::new(),
            drill: None,
            resumed_at_ms: None,
        };
        for (at, step, detail) in before {
            i.push(at, step, detail, None);
        }
        i
    }

    /// Records a step on the timeline (coalesced with the newest entry if it says the same).
    pub fn push(&mut self, at_ms: u64, step: Step, detail: impl Into<String>, by: Option<String>) {
        self.reached.entry(step).or_insert(at_ms);
        self.timeline.push(at_ms, TimelineEvent { step, detail: detail.into(), by });
    }

    /// Records what happened before the incident opened, in time order among the entries of
    /// its opening (first failure, local repairs, DETECTED): for a new incident only.
    pub fn record_before_open(&mut self, at_ms: u64, step: Step, detail: impl Into<String>) {
        let mut entries: Vec<(u64, TimelineEvent)> =
            self.timeline.iter().map(|e| (e.at_ms, e.event.clone())).collect();
        entries.push((at_ms, TimelineEvent { step, detail: detail.into(), by: None }));
        entries.sort_by_key(|e| e.0);
        self.timeline = Timeline::new();
        for (at, event) in entries {
            self.timeline.push(at, event);
        }
        self.reached.entry(step).or_insert(at_ms);
    }

    /// Fills `reached` from the timeline for records written before it existed.
    pub fn normalize(&mut self) {
        if self.reached.is_empty() {
            for e in self.timeline.iter() {
                self.reached.entry(e.step).or_insert(e.at_ms);
            }
        }
    }

    /// When `step` was first reached.
    pub fn first(&self, step: Step) -> Option<u64> {
        self.reached.get(&step).copied()
    }

    pub fn has(&self, step: Step) -> bool {
        self.reached.contains_key(&step)
    }

    /// Whether `digest` is one of this incident's replacement tokens.
    pub fn has_replacement_token(&self, digest: &str) -> bool {
        self.replacement
            .as_ref()
            .is_some_and(|b| b.token_sha256 == digest || b.earlier_token_sha256.iter().any(|d| d == digest))
    }

    /// Whether the host that registered with this incident's replacement token is `host`.
    pub fn is_replacement(&self, host: &HostId) -> bool {
        self.replacement.as_ref().and_then(|r| r.host_id.as_ref()) == Some(host)
    }

    pub fn affected(&self, task_id: TaskId) -> Option<&AffectedTask> {
        self.affected_tasks.iter().find(|a| a.task_id == task_id)
    }

    /// The task was moved or stopped by this incident (not merely listed as waiting).
    pub fn handled(&self, task_id: TaskId) -> bool {
        self.affected(task_id).is_some_and(|a| !a.waiting)
    }

    /// Lists a task that is on the host as affected (waiting), unless it already is.
    pub fn note_affected(&mut self, task_id: TaskId, service: Option<ServiceName>) {
        if self.affected(task_id).is_none() {
            self.affected_tasks.push(AffectedTask {
                task_id,
                service,
                replacement: None,
                replacement_host: None,
                waiting: true,
            });
        }
    }

    /// Marks a task moved or stopped, listing it if it was not.
    pub fn mark_handled(&mut self, task_id: TaskId, service: Option<ServiceName>) {
        match self.affected_tasks.iter_mut().find(|a| a.task_id == task_id) {
            Some(a) => a.waiting = false,
            None => self.affected_tasks.push(AffectedTask {
                task_id,
                service,
                replacement: None,
                replacement_host: None,
                waiting: false,
            }),
        }
    }

    /// Records the replacement the server started for a moved task (and, once placed, its
    /// host); false when the task is not one this incident moved.
    pub fn set_replacement(&mut self, task_id: TaskId, replacement: TaskId, host: Option<HostId>) -> bool {
        match self.affected_tasks.iter_mut().find(|a| a.task_id == task_id && a.service.is_some()) {
            Some(a) => {
                a.replacement = Some(replacement);
                a.replacement_host = host;
                true
            }
            None => false,
        }
    }

    /// The incident's timing: its moments and phases (see [`RecoveryTiming`]).
    pub fn timing(&self) -> RecoveryTiming {
        let at = |step| self.first(step);
        // Detected: the incident opened (the server saw the check IMPAIRED at DETECTED, and
        // declared the host bad once that lasted the pool's toleration).
        let detected = Some(self.opened_at_ms);
        // Placed on the server's clock and never after detection; the min guards old records.
        let first = self.trigger.first_failure_at_ms.map(|f| f.min(self.opened_at_ms));
        let resumed = at(Step::TasksRunningAgain).map(|r| self.resumed_at_ms.map_or(r, |t| t.min(r)));
        let (decided, ready) = (at(Step::Decided), at(Step::ReplacementReady));
        let between = |from: Option<u64>, to: Option<u64>| Some(to?.saturating_sub(from?));
        RecoveryTiming {
            first_failure_at_ms: first,
            detected_at_ms: detected,
            decided_at_ms: decided,
            replacement_ready_at_ms: ready,
            resumed_at_ms: resumed,
            detect_ms: between(first, detected),
            decide_ms: between(detected, decided),
            replace_ms: between(decided, ready),
            total_ms: between(first, resumed),
        }
    }

    /// Whether `phase` is part of this incident's recovery, as far as it has gone: detection
    /// always; the decision where mpsfleet decides or an operator did; the replacement once
    /// one was asked for; the total once a service task is affected.
    fn phase_applies(&self, phase: RecoveryPhase) -> bool {
        match phase {
            RecoveryPhase::Detect | RecoveryPhase::Decide => true,
            RecoveryPhase::Replace => self.has(Step::ReplacementRequested),
            RecoveryPhase::Total => {
                self.has(Step::TasksRunningAgain) || self.affected_tasks.iter().any(|a| a.service.is_some())
            }
        }
    }

    /// How long `phase` has lasted: its length once it ended, else, while the incident is
    /// unresolved, since it began until `now_ms`.
    pub fn phase_ms(&self, phase: RecoveryPhase, now_ms: u64) -> Option<u64> {
        let t = self.timing();
        let (start, ended) = match phase {
            RecoveryPhase::Detect => (t.first_failure_at_ms.or(t.detected_at_ms), t.detect_ms),
            RecoveryPhase::Decide => (t.detected_at_ms, t.decide_ms),
            RecoveryPhase::Replace => (t.decided_at_ms, t.replace_ms),
            RecoveryPhase::Total => (t.first_failure_at_ms.or(t.detected_at_ms), t.total_ms),
        };
        match (ended, &self.state) {
            (Some(ms), _) => Some(ms),
            (None, IncidentState::Resolved) => None,
            (None, _) => start.map(|s| now_ms.saturating_sub(s)),
        }
    }

    /// The phases that have run past their bound by `now_ms` and are not recorded as
    /// breached yet: `(phase, measured, bound)`.
    pub fn new_breaches(&self, now_ms: u64) -> Vec<(RecoveryPhase, u64, u64)> {
        let Some(b) = self.bounds else { return Vec::new() };
        RecoveryPhase::ALL
            .into_iter()
            .filter(|&p| self.phase_applies(p) && !self.breaches.iter().any(|x| x.phase == p))
            .filter_map(|p| {
                let (bound, measured) = (self.bound(&b, p)?, self.phase_ms(p, now_ms)?);
                (measured > bound).then_some((p, measured, bound))
            })
            .collect()
    }

    /// The bound of `phase`: the total of a recovery that preempted (a PREEMPTED step) has the
    /// victims' stop added (`IncidentBounds::preempt_ms`).
    fn bound(&self, b: &IncidentBounds, phase: RecoveryPhase) -> Option<u64> {
        let base = b.bound(phase)?;
        let preempted = self.reached.contains_key(&Step::Preempted);
        Some(match (phase, b.preempt_ms) {
            (RecoveryPhase::Total, Some(extra)) if preempted => base + extra,
            _ => base,
        })
    }

    /// Each phase against its bound: what `incident describe` shows. Empty without bounds.
    pub fn judgement(&self) -> Vec<PhaseJudgement> {
        let Some(b) = self.bounds else { return Vec::new() };
        let t = self.timing();
        RecoveryPhase::ALL
            .into_iter()
            .map(|phase| {
                let bound_ms = self.bound(&b, phase);
                let measured_ms = match phase {
                    RecoveryPhase::Detect => t.detect_ms,
                    RecoveryPhase::Decide => t.decide_ms,
                    RecoveryPhase::Replace => t.replace_ms,
                    RecoveryPhase::Total => t.total_ms,
                };
                let breach = self.breaches.iter().find(|x| x.phase == phase);
                let over = measured_ms.zip(bound_ms).is_some_and(|(m, b)| m > b);
                // A phase with a bound that has not ended is running, until the incident is
                // resolved without it (it did not happen).
                let verdict = if breach.is_some() || over {
                    PhaseVerdict::Breached
                } else if bound_ms.is_none() {
                    PhaseVerdict::NotApplicable
                } else if measured_ms.is_some() {
                    PhaseVerdict::Within
                } else if self.state == IncidentState::Resolved {
                    PhaseVerdict::NotApplicable
                } else {
                    PhaseVerdict::Running
                };
                PhaseJudgement { phase, bound_ms, measured_ms, verdict, cause: breach.and_then(|x| x.cause) }
            })
            .collect()
    }

    /// Time to detect, decide and recover, from the timeline.
    pub fn durations(&self) -> Durations {
        let at = |step| self.first(step);
        let detected = at(Step::Detected);
        let between = |from: Option<u64>, to: Option<u64>| Some(to?.saturating_sub(from?));
        Durations {
            detect_ms: between(self.trigger.first_failure_at_ms, detected),
            decide_ms: between(detected, at(Step::Decided)),
            recover_ms: between(detected, at(Step::TasksRunningAgain).or(at(Step::Resolved))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn incident(first_failure_at_ms: Option<u64>, steps: &[(u64, Step)]) -> Incident {
        let trigger = Trigger {
            check: "MPS_DAEMON".into(),
            gpu_id: Some(GpuUuid::new("GPU-0").unwrap()),
            reason: "probe timed out after 3s".into(),
            evidence: "agent reported IMPAIRED".into(),
            first_failure_at_ms,
            local_repairs_at_ms: Vec::new(),
            earlier_repairs_at_ms: Vec::new(),
        };
        let mut i = Incident::open(
            "i-1".into(),
            HostId::new("h-1").unwrap(),
            PoolName::new("p").unwrap(),
            IncidentOwner::Mpsfleet,
            trigger,
            1_000,
            5_000,
        );
        for &(at_ms, step) in steps {
            i.push(at_ms, step, "", None);
        }
        i
    }

    #[track_caller]
    fn check(
        first_failure: Option<u64>,
        steps: &[(u64, Step)],
        want: (Option<u64>, Option<u64>, Option<u64>),
    ) {
        let d = incident(first_failure, steps).durations();
        assert_eq!((d.detect_ms, d.decide_ms, d.recover_ms), want, "{steps:?}");
    }

    #[test]
    fn durations_table() {
        use Step::*;
        check(Some(400), &[], (Some(600), None, None));
        check(None, &[], (None, None, None));
        check(Some(2_000), &[], (Some(0), None, None)); // agent clock ahead of the server's
        check(Some(400), &[(5_000, Decided)], (Some(600), Some(4_000), None));
        check(Some(400), &[(5_000, Decided), (9_000, Resolved)], (Some(600), Some(4_000), Some(8_000)));
        check(
            Some(400),
            &[(5_000, Decided), (7_000, TasksRunningAgain), (9_000, Resolved)],
            (Some(600), Some(4_000), Some(6_000)),
        );
    }

    #[test]
    fn json_shape() {
        let mut i = incident(Some(400), &[]);
        i.state = IncidentState::Blocked { reason: "remediation blocked: x".into() };
        i.operator_requested = Some(OperatorAction::Replace);
        let v = serde_json::to_value(&i).unwrap();
        assert_eq!(v["owner"], json!("mpsfleet"));
        assert_eq!(v["state"], json!({"status": "BLOCKED", "reason": "remediation blocked: x"}));
        assert_eq!(v["operatorRequested"], json!("replace"));
        assert_eq!(v["trigger"]["gpuId"], json!("GPU-0"));
        assert_eq!(v["trigger"]["firstFailureAtMs"], json!(400));
        assert_eq!(
            v["timeline"],
            json!({"entries": [
                {"atMs": 400, "step": "FIRST_FAILURE", "detail": "first failed signal of MPS_DAEMON on GPU-0"},
                {"atMs": 1000, "step": "DETECTED", "detail": "MPS_DAEMON IMPAIRED on GPU-0: probe timed out after 3s"}
            ]})
        );
        assert_eq!(v["reached"], json!({"FIRST_FAILURE": 400, "DETECTED": 1000}));
        let back: Incident = serde_json::from_value(v).unwrap();
        assert_eq!(back, i);
        assert_eq!(serde_json::to_value(IncidentState::Open).unwrap(), json!({"status": "OPEN"}));
        assert_eq!(serde_json::to_value(IncidentOwner::Operator).unwrap(), json!("operator"));
        for step in [Step::LocalRepairAttempt, Step::TasksRunningAgain, Step::OldHostTerminated] {
            assert_eq!(serde_json::to_value(step).unwrap(), json!(step.as_str()));
        }
    }

    /// A recovery that preempted is held to its total plus the victims' stop; one that did not,
    /// to its total alone.
    #[test]
    fn a_preempting_recovery_is_judged_against_the_preemption_bound() {
        let bounds = IncidentBounds {
            kind: crate::bounds::FailureKind::DaemonExit,
            detect_ms: 1_000,
            decide_ms: Some(500),
            replace_ms: None,
            total_ms: Some(5_000),
            fenced: false,
            preempt_ms: Some(4_000),
        };
        let total = |steps: &[(u64, Step)]| {
            let mut i = incident(Some(400), steps);
            i.bounds = Some(bounds);
            let j = i.judgement().into_iter().find(|j| j.phase == RecoveryPhase::Total).unwrap();
            (j.bound_ms, j.verdict, i.new_breaches(20_000).iter().any(|b| b.0 == RecoveryPhase::Total))
        };
        // First failure at 400, running again at 8,400: 8 s.
        let plain = [(1_500, Step::Decided), (8_400, Step::TasksRunningAgain)];
        assert_eq!(total(&plain), (Some(5_000), PhaseVerdict::Breached, true));
        let preempted = [(1_500, Step::Decided), (2_000, Step::Preempted), (8_400, Step::TasksRunningAgain)];
        assert_eq!(total(&preempted), (Some(9_000), PhaseVerdict::Within, false));
    }

    /// The timing record: moments on the server's clock and the phases between them; local
    /// repairs take their place on the timeline before the incident opened.
    #[test]
    fn timing_runs_from_the_first_failure_to_resumed() {
        use Step::*;
        let mut i =
            incident(Some(400), &[(5_500, Decided), (7_000, ReplacementReady), (8_000, TasksRunningAgain)]);
        let t = i.timing();
        assert_eq!(
            (
                t.first_failure_at_ms,
                t.detected_at_ms,
                t.decided_at_ms,
                t.replacement_ready_at_ms,
                t.resumed_at_ms
            ),
            (Some(400), Some(5_000), Some(5_500), Some(7_000), Some(8_000))
        );
        assert_eq!(
            (t.detect_ms, t.decide_ms, t.replace_ms, t.total_ms),
            (Some(4_600), Some(500), Some(1_500), Some(7_600))
        );
        // A first failure placed after the incident opened (an old record) is held to it.
        i.trigger.first_failure_at_ms = Some(9_000);
        assert_eq!((i.timing().first_failure_at_ms, i.timing().detect_ms), (Some(5_000), Some(0)));

        let trigger =
            Trigger { local_repairs_at_ms: vec![600, 1_200, 9_999], ..incident(Some(400), &[]).trigger };
        let pool = PoolName::new("p").unwrap();
        let i = Incident::open(
            "i-2".into(),
            HostId::new("h-1").unwrap(),
            pool,
            IncidentOwner::Mpsfleet,
            trigger,
            1_000,
            5_000,
        );
        let steps: Vec<(u64, Step)> = i.timeline.iter().map(|e| (e.at_ms, e.step)).collect();
        assert_eq!(
            steps,
            [(400, FirstFailure), (600, LocalRepairAttempt), (1_000, Detected), (1_200, LocalRepairAttempt)]
        );
        assert_eq!(
            i.timeline[1].detail,
            "the agent restarted MPS_DAEMON on GPU-0 locally (restart 1 within 10 minutes)"
        );
        // An earlier failure's restart within the window counts first, and is named.
        let trigger = Trigger {
            local_repairs_at_ms: vec![600],
            earlier_repairs_at_ms: vec![100],
            ..incident(Some(400), &[]).trigger
        };
        let i = Incident::open(
            "i-3".into(),
            HostId::new("h-1").unwrap(),
            PoolName::new("p").unwrap(),
            IncidentOwner::Mpsfleet,
            trigger,
            1_000,
            5_000,
        );
        let repair = i.timeline.iter().find(|e| e.step == LocalRepairAttempt).unwrap();
        assert_eq!(
            repair.detail,
            "the agent restarted MPS_DAEMON on GPU-0 locally (restart 2 within 10 minutes, 1 of them by an earlier failure)"
        );
    }

    /// A record written before timelines were bounded (a plain array, no `reached`) reads, and
    /// `normalize` gives it the first time of each step.
    #[test]
    fn an_old_record_reads_and_normalizes() {
        let mut v = serde_json::to_value(incident(Some(400), &[(5_000, Step::Decided)])).unwrap();
        v["timeline"] = json!([
            {"atMs": 1000, "step": "DETECTED", "detail": "d"},
            {"atMs": 5000, "step": "DECIDED", "detail": "x"},
            {"atMs": 6000, "step": "BLOCKED", "detail": "b"},
            {"atMs": 7000, "step": "BLOCKED", "detail": "b"}
        ]);
        v.as_object_mut().unwrap().remove("reached");
        let mut i: Incident = serde_json::from_value(v).unwrap();
        assert!(!i.has(Step::Decided));
        i.normalize();
        assert_eq!(i.first(Step::Decided), Some(5_000));
        assert_eq!(i.first(Step::Blocked), Some(6_000));
        assert_eq!(i.timeline.len(), 3);
        assert_eq!(i.timeline[2].count, 2);
        assert_eq!(i.durations().decide_ms, Some(4_000));
    }

    #[test]
    fn set_replacement_only_for_moved_service_tasks() {
        let mut i = incident(None, &[]);
        let svc = Some(ServiceName::new("web").unwrap());
        i.affected_tasks.push(AffectedTask {
            task_id: TaskId(1),
            service: svc,
            replacement: None,
            replacement_host: None,
            waiting: false,
        });
        i.affected_tasks.push(AffectedTask {
            task_id: TaskId(2),
            service: None,
            replacement: None,
            replacement_host: None,
            waiting: false,
        });
        assert!(i.set_replacement(TaskId(1), TaskId(11), None));
        assert!(!i.set_replacement(TaskId(2), TaskId(12), None));
        assert!(!i.set_replacement(TaskId(3), TaskId(13), None));
        assert_eq!(i.affected(TaskId(1)).and_then(|a| a.replacement), Some(TaskId(11)));
    }
}

/// An incident as the API returns it: the record plus its derived durations.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct IncidentView {
    #[serde(flatten)]
    pub incident: Incident,
    pub durations: Durations,
    /// The moments and phases from the first failure to resumed.
    #[serde(default)]
    pub timing: RecoveryTiming,
    /// Each phase against the bound the incident is held to (empty for incidents from before
    /// bounds).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub judgement: Vec<PhaseJudgement>,
}

impl IncidentView {
    pub fn of(incident: Incident) -> Self {
        let durations = incident.durations();
        let timing = incident.timing();
        let judgement = incident.judgement();
        IncidentView { incident, durations, timing, judgement }
    }
}
