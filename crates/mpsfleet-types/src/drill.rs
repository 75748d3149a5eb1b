//! Drills: a real fault injected through the agents of chosen hosts, handled by the pool's
//! owner exactly as a real failure, and the measured recovery reported against the pool's
//! bounds (docs/drills.md).

use crate::bounds::{BreachCause, KindBounds, PhaseJudgement, RecoveryPhase};
use crate::history::History;
use crate::ids::{GpuUuid, HostId, PoolName};
use crate::service::ObjectEvent;
use serde::{Deserialize, Serialize};

/// The fault a drill injects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "kebab-case")]
pub enum DrillFault {
    /// The agent kills its MPS daemon (SIGKILL); again after each local restart while the
    /// fault lasts.
    DaemonExit,
    /// The agent stops its MPS daemon (SIGSTOP), so that its probes time out; again after
    /// each local restart while the fault lasts.
    DaemonHang,
    /// The agent stops heartbeating for the drill's time.
    AgentStop,
    /// The agent reports its GPU check failed, as a host-fatal Xid would, through the seam it
    /// reads NVML's events by.
    GpuCheckFail,
}

impl DrillFault {
    pub const ALL: [DrillFault; 4] =
        [DrillFault::DaemonExit, DrillFault::DaemonHang, DrillFault::AgentStop, DrillFault::GpuCheckFail];

    pub fn as_str(self) -> &'static str {
        match self {
            DrillFault::DaemonExit => "daemon-exit",
            DrillFault::DaemonHang => "daemon-hang",
            DrillFault::AgentStop => "agent-stop",
            DrillFault::GpuCheckFail => "gpu-check-fail",
        }
    }

    pub fn parse(s: &str) -> Option<DrillFault> {
        DrillFault::ALL.into_iter().find(|f| f.as_str() == s)
    }

    /// The failure kind whose bounds the drill is measured against.
    pub fn kind(self) -> crate::bounds::FailureKind {
        use crate::bounds::FailureKind;
        match self {
            DrillFault::DaemonExit => FailureKind::DaemonExit,
            DrillFault::DaemonHang => FailureKind::DaemonHang,
            DrillFault::AgentStop => FailureKind::AgentLost,
            DrillFault::GpuCheckFail => FailureKind::GpuCheckFail,
        }
    }

    /// Whether the fault strikes one GPU's daemon or check (not the whole agent).
    pub fn per_gpu(self) -> bool {
        self != DrillFault::AgentStop
    }
}

/// Body of `POST /v1/drills`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CreateDrill {
    pub pool: String,
    /// `daemon-exit`, `daemon-hang`, `agent-stop` or `gpu-check-fail`.
    pub fault: String,
    /// How many hosts: a count (`2`) or a share of the pool's hosts (`25%`, rounded up).
    /// Default 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hosts: Option<String>,
    /// Name the targets and the expected timeline; inject nothing.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub dry_run: bool,
    /// Inject the fault once (a daemon killed once): measures local repair alone.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub once: bool,
}

/// What an agent is asked to inject, in its heartbeat's answer, while the drill lasts. An
/// agent started without `--allow-fault-injection` ignores it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct InjectedFault {
    /// The drill's id.
    pub drill: String,
    pub fault: DrillFault,
    /// The GPU whose daemon or check it strikes (per-GPU faults).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_id: Option<GpuUuid>,
    /// Strike again after each local restart, until the drill takes the fault back.
    pub persistent: bool,
    /// `agent-stop`: how long the agent stays silent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub for_ms: Option<u64>,
}

/// A host a drill strikes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct DrillTarget {
    pub host_id: HostId,
    pub hostname: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_id: Option<GpuUuid>,
}

/// Where a drill stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum DrillStatus {
    /// The fault is injected; the pool's owner is handling it.
    Running,
    /// The fault is taken back and what it broke is being restored.
    Restoring,
    /// Over, with a verdict.
    Ended,
}

impl DrillStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            DrillStatus::Running => "RUNNING",
            DrillStatus::Restoring => "RESTORING",
            DrillStatus::Ended => "ENDED",
        }
    }
}

/// How a drill came out.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(tag = "result", rename_all = "kebab-case")]
pub enum DrillVerdict {
    /// Every measured phase within its bound.
    WithinBounds,
    /// A phase past its bound, with the cause the server named (if any).
    Breached {
        phase: RecoveryPhase,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        cause: Option<BreachCause>,
    },
    /// Stopped by a safety condition or an operator, which `condition` names.
    Aborted { condition: String },
}

impl DrillVerdict {
    pub fn words(&self) -> String {
        match self {
            DrillVerdict::WithinBounds => "within bounds".into(),
            DrillVerdict::Breached { phase, cause } => match cause {
                Some(c) => format!("breached: {phase} ({})", c.as_str()),
                None => format!("breached: {phase} (cause unknown)"),
            },
            DrillVerdict::Aborted { condition } => format!("aborted: {condition}"),
        }
    }
}

/// One drill: what it struck, what was expected, what happened.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Drill {
    pub id: String,
    pub pool: PoolName,
    pub fault: DrillFault,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub once: bool,
    pub targets: Vec<DrillTarget>,
    pub status: DrillStatus,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verdict: Option<DrillVerdict>,
    /// The pool's bounds for the fault's kind when the drill started.
    pub bounds: KindBounds,
    /// Whose the phases after detection are: `mpsfleet` or `operator`.
    pub owner: String,
    /// The incidents the drill caused (each marked with the drill's id).
    #[serde(default)]
    pub incidents: Vec<String>,
    /// Each phase measured against its bound, from the drill's incident.
    #[serde(default)]
    pub phases: Vec<PhaseJudgement>,
    /// Self-managed pools: when the incident's notification went out (`incident.opened`
    /// published to the event stream and, where one is set, queued for the webhook).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub notified_at_ms: Option<u64>,
    pub started_at_ms: u64,
    /// When the drill gives up waiting for the owner: the fault is then taken back.
    pub deadline_ms: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended_at_ms: Option<u64>,
    /// Who started it.
    pub by: String,
    pub events: History<ObjectEvent>,
}

impl Drill {
    /// The faults the drill asks `host`'s agent to inject now.
    pub fn faults_for(&self, host: &HostId) -> Vec<InjectedFault> {
        if self.status != DrillStatus::Running {
            return Vec::new();
        }
        self.targets
            .iter()
            .filter(|t| &t.host_id == host)
            .map(|t| InjectedFault {
                drill: self.id.clone(),
                fault: self.fault,
                gpu_id: t.gpu_id.clone(),
                persistent: !self.once,
                for_ms: (self.fault == DrillFault::AgentStop).then(|| self.silence_ms()),
            })
            .collect()
    }

    /// How long an `agent-stop` keeps the agent silent: in a managed pool until the drill's
    /// deadline (the owner replaces the host meanwhile); where the drill only measures
    /// detection (a self-managed pool, `--once`), until the incident has surely opened and
    /// been notified, so that the host is back soon after the drill ends.
    pub fn silence_ms(&self) -> u64 {
        let whole = self.deadline_ms.saturating_sub(self.started_at_ms);
        if self.owner == "operator" || self.once {
            whole.min(self.bounds.detect_ms + self.bounds.notify_ms.min(5_000) + 5_000)
        } else {
            whole
        }
    }
}

/// What `drill run --dry-run` answers: the targets it would strike and the timeline the
/// pool's bounds promise, nothing injected.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct DrillPlan {
    pub pool: PoolName,
    pub fault: DrillFault,
    pub targets: Vec<DrillTarget>,
    pub owner: String,
    pub bounds: KindBounds,
    /// The expected timeline in words, each step with its latest time after the fault.
    pub expected: Vec<String>,
}

/// Body of `PUT /v1/drills/switch` and its answer: whether drills may run. Turning it off
/// aborts every running drill.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DrillSwitch {
    pub enabled: bool,
    /// Who set it, and when (answers only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub changed_by: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub changed_at_ms: Option<u64>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bounds::FailureKind;

    fn drill(owner: &str, once: bool) -> Drill {
        Drill {
            id: "drill-1".into(),
            pool: PoolName::new("p").unwrap(),
            fault: DrillFault::AgentStop,
            once,
            targets: vec![DrillTarget {
                host_id: HostId::new("h-1").unwrap(),
                hostname: "a".into(),
                gpu_id: None,
            }],
            status: DrillStatus::Running,
            verdict: None,
            bounds: KindBounds {
                kind: FailureKind::AgentLost,
                detect_ms: 12_500,
                notify_ms: 31_500,
                decide_ms: None,
                replace_ms: None,
                total_ms: None,
                total_fenced_ms: None,
                total_full_pool_ms: None,
                copies_ms: None,
            },
            owner: owner.into(),
            incidents: Vec::new(),
            phases: Vec::new(),
            notified_at_ms: None,
            started_at_ms: 1_000,
            deadline_ms: 105_000,
            ended_at_ms: None,
            by: "admin".into(),
            events: Default::default(),
        }
    }

    /// A silenced agent comes back soon after a drill that only measures detection, and
    /// stays away until the deadline where the owner replaces its host; the faults go out
    /// only while the drill runs, and only to its targets.
    #[test]
    fn agent_stop_silences_for_what_the_drill_measures() {
        let host = HostId::new("h-1").unwrap();
        assert_eq!(drill("operator", false).faults_for(&host)[0].for_ms, Some(12_500 + 5_000 + 5_000));
        assert_eq!(drill("mpsfleet", true).faults_for(&host)[0].for_ms, Some(22_500));
        assert_eq!(drill("mpsfleet", false).faults_for(&host)[0].for_ms, Some(104_000));
        assert!(drill("mpsfleet", false).faults_for(&HostId::new("h-2").unwrap()).is_empty());
        let mut ended = drill("mpsfleet", false);
        ended.status = DrillStatus::Restoring;
        assert!(ended.faults_for(&host).is_empty());
    }
}
