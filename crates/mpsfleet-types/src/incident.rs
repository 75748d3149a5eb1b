//! Incidents: the record of one host turning bad and what followed, as a timeline of steps
//! with timestamps, the evidence that triggered it, its owner and the tasks it moved.

use crate::ids::{GpuUuid, HostId, PoolName, ServiceName, TaskId};
use crate::pool::OwnershipMode;
use serde::{Deserialize, Serialize};

/// Who is responsible for acting on an incident.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
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
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
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
    /// The earliest failure evidence: when the agent's check turned IMPAIRED (the agent's
    /// clock) or, for AGENT, the last heartbeat. None when unknown.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_failure_at_ms: Option<u64>,
}

/// Where an incident stands.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
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
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Step {
    Detected,
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
    Resolved,
    Blocked,
}

impl Step {
    pub fn as_str(self) -> &'static str {
        match self {
            Step::Detected => "DETECTED",
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
            Step::Resolved => "RESOLVED",
            Step::Blocked => "BLOCKED",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TimelineEntry {
    pub at_ms: u64,
    pub step: Step,
    pub detail: String,
}

/// A task that was on the host when the incident moved or stopped it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
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
}

/// An operator command recorded on an incident (`host drain`, `host replace`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
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

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
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
    pub timeline: Vec<TimelineEntry>,
    #[serde(default)]
    pub affected_tasks: Vec<AffectedTask>,
    pub opened_at_ms: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resolved_at_ms: Option<u64>,
}

/// Durations derived from an incident's timeline; None where a step has not happened (or,
/// for `detect_ms`, where the first failure time is unknown).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Durations {
    /// First failure evidence to DETECTED.
    pub detect_ms: Option<u64>,
    /// DETECTED to DECIDED.
    pub decide_ms: Option<u64>,
    /// DETECTED to TASKS_RUNNING_AGAIN, or to RESOLVED when no task was moved.
    pub recover_ms: Option<u64>,
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
        let detail = match &trigger.gpu_id {
            Some(gpu) => format!("{} IMPAIRED on {gpu}: {}", trigger.check, trigger.reason),
            None => format!("{} IMPAIRED: {}", trigger.check, trigger.reason),
        };
        Self {
            id,
            host_id,
            pool,
            owner,
            trigger,
            state: IncidentState::Open,
            operator_requested: None,
            timeline: vec![TimelineEntry { at_ms: detected_at_ms, step: Step::Detected, detail }],
            affected_tasks: Vec::new(),
            opened_at_ms,
            resolved_at_ms: None,
        }
    }

    /// The first timeline entry of `step`.
    pub fn first(&self, step: Step) -> Option<&TimelineEntry> {
        self.timeline.iter().find(|e| e.step == step)
    }

    pub fn has(&self, step: Step) -> bool {
        self.first(step).is_some()
    }

    pub fn affected(&self, task_id: TaskId) -> Option<&AffectedTask> {
        self.affected_tasks.iter().find(|a| a.task_id == task_id)
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

    /// Time to detect, decide and recover, from the timeline.
    pub fn durations(&self) -> Durations {
        let at = |step| self.first(step).map(|e| e.at_ms);
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
        i.timeline.extend(steps.iter().map(|&(at_ms, step)| TimelineEntry {
            at_ms,
            step,
            detail: String::new(),
        }));
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
            json!([{"atMs": 1000, "step": "DETECTED", "detail": "MPS_DAEMON IMPAIRED on GPU-0: probe timed out after 3s"}])
        );
        let back: Incident = serde_json::from_value(v).unwrap();
        assert_eq!(back, i);
        assert_eq!(serde_json::to_value(IncidentState::Open).unwrap(), json!({"status": "OPEN"}));
        assert_eq!(serde_json::to_value(IncidentOwner::Operator).unwrap(), json!("operator"));
        for step in [Step::LocalRepairAttempt, Step::TasksRunningAgain, Step::OldHostTerminated] {
            assert_eq!(serde_json::to_value(step).unwrap(), json!(step.as_str()));
        }
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
        });
        i.affected_tasks.push(AffectedTask {
            task_id: TaskId(2),
            service: None,
            replacement: None,
            replacement_host: None,
        });
        assert!(i.set_replacement(TaskId(1), TaskId(11), None));
        assert!(!i.set_replacement(TaskId(2), TaskId(12), None));
        assert!(!i.set_replacement(TaskId(3), TaskId(13), None));
        assert_eq!(i.affected(TaskId(1)).and_then(|a| a.replacement), Some(TaskId(11)));
    }
}

/// An incident as the API returns it: the record plus its derived durations.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct IncidentView {
    #[serde(flatten)]
    pub incident: Incident,
    pub durations: Durations,
}

impl IncidentView {
    pub fn of(incident: Incident) -> Self {
        let durations = incident.durations();
        IncidentView { incident, durations }
    }
}
