//! Recovery bounds: how long each phase of a recovery may take under a pool's policy, per
//! kind of failure, and what one incident measured against them. The bounds are derived in
//! `mpsfleet_core::bounds`; this is their vocabulary, in the timing record's names
//! (`detectMs`, `decideMs`, `replaceMs`, `totalMs`, see [`crate::RecoveryTiming`]).

use serde::{Deserialize, Serialize};
use std::fmt;

/// What broke.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, utoipa::ToSchema,
)]
#[serde(rename_all = "kebab-case")]
pub enum FailureKind {
    /// An MPS control daemon exits (and, while the fault lasts, exits again after each local
    /// restart).
    DaemonExit,
    /// An MPS control daemon stops answering its probes.
    DaemonHang,
    /// The agent stops heartbeating while the machine may still run.
    AgentLost,
    /// A GPU check fails (a critical Xid or ECC event read through NVML).
    GpuCheckFail,
    /// The whole machine is gone: detected as the agent's silence.
    HostLost,
}

impl FailureKind {
    pub const ALL: [FailureKind; 5] = [
        FailureKind::DaemonExit,
        FailureKind::DaemonHang,
        FailureKind::AgentLost,
        FailureKind::GpuCheckFail,
        FailureKind::HostLost,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            FailureKind::DaemonExit => "daemon-exit",
            FailureKind::DaemonHang => "daemon-hang",
            FailureKind::AgentLost => "agent-lost",
            FailureKind::GpuCheckFail => "gpu-check-fail",
            FailureKind::HostLost => "host-lost",
        }
    }

    /// The kind an incident's trigger shows: its check, and for `MPS_DAEMON` whether the
    /// agent saw the daemon exit. An MPS failure that does not say so is judged as a hang,
    /// whose bounds are the wider ones. A silent agent is `agent-lost`: from the server, a
    /// lost machine looks the same until its provider says otherwise.
    pub fn of_trigger(check: &str, reason: &str) -> FailureKind {
        match check {
            "AGENT" => FailureKind::AgentLost,
            "GPU" => FailureKind::GpuCheckFail,
            _ if reason.contains("exited") => FailureKind::DaemonExit,
            _ => FailureKind::DaemonHang,
        }
    }
}

impl fmt::Display for FailureKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A phase of the timing record.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, utoipa::ToSchema,
)]
#[serde(rename_all = "camelCase")]
pub enum RecoveryPhase {
    /// First failed signal to the incident opened.
    Detect,
    /// Opened to the first action (DECIDED).
    Decide,
    /// Decided to the replacement host joined.
    Replace,
    /// First failed signal to every affected service task running (and ready) again.
    Total,
}

impl RecoveryPhase {
    pub const ALL: [RecoveryPhase; 4] =
        [RecoveryPhase::Detect, RecoveryPhase::Decide, RecoveryPhase::Replace, RecoveryPhase::Total];

    pub fn as_str(self) -> &'static str {
        match self {
            RecoveryPhase::Detect => "detect",
            RecoveryPhase::Decide => "decide",
            RecoveryPhase::Replace => "replace",
            RecoveryPhase::Total => "total",
        }
    }
}

impl fmt::Display for RecoveryPhase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The bounds of one failure kind in one pool, in milliseconds. `None`: not mpsfleet's to
/// bound (a self-managed pool's decision and what follows, a replacement without a
/// provider).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct KindBounds {
    pub kind: FailureKind,
    pub detect_ms: u64,
    /// Detected to the incident's event delivered to the webhook, every attempt included.
    pub notify_ms: u64,
    pub decide_ms: Option<u64>,
    pub replace_ms: Option<u64>,
    /// Total for services with resumption `restart`, given room on the pool's healthy hosts.
    pub total_ms: Option<u64>,
    /// Total for services with resumption `fenced`: they wait for the old host's
    /// termination, so only a pool with a provider bounds it.
    pub total_fenced_ms: Option<u64>,
    /// The total when the pool's healthy hosts have no room (a full pool): by preemption
    /// where the pool's policy lets recovery preempt (the victims' stop instead of a launch),
    /// else by a launched host; None when neither can make room.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub total_full_pool_ms: Option<u64>,
    /// First failed signal to a `restart` service's copies of the replicas on the failed
    /// daemon RUNNING on healthy ones (given room), under the pool's `restartCopies`: at the
    /// first exit, or once the failure is confirmed. For `daemon-exit` and `daemon-hang`; the
    /// copies run while local repair goes on, before any incident.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub copies_ms: Option<u64>,
}

/// How a full pool (no room on its healthy hosts) recovers, and what bounds it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct FullPoolBounds {
    /// The pool's `preemption` policy.
    pub preemption: crate::priority::Preemption,
    /// `preemption` (lower-priority tasks stop to make room), `launch` (a new host joins) or
    /// `none` (nothing makes room: the replicas wait).
    pub by: String,
    /// The longest a victim takes to stop, when recovery preempts: its service's
    /// deregistration delay plus its containers' stopTimeout (30 s when unset), over the
    /// pool's running tasks now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub victim_stop_ms: Option<u64>,
}

/// What the bounds are made of: the pool's settings, and the server's and agent's own
/// intervals, named as the formulas name them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct BoundInputs {
    pub mps_probe_interval_ms: u64,
    pub mps_probe_timeout_ms: u64,
    pub mps_failure_threshold: u32,
    pub local_daemon_restarts: u32,
    pub toleration_ms: u64,
    pub agent_heartbeat_grace_ms: u64,
    /// The provider's `launchTimeoutSeconds`, in ms; None without a provider.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub launch_timeout_ms: Option<u64>,
    #[serde(flatten)]
    pub intervals: Intervals,
}

/// The server's and the agents' own intervals that the bounds are built from (the server
/// passes its constants in, so the figures shown are the ones its loops run on).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Intervals {
    /// The agent's heartbeat interval (`mpsfleet agent --heartbeat-ms`, default): a changed
    /// check reaches the server within one.
    pub agent_heartbeat_ms: u64,
    /// The agent's backoff between local restarts: the n-th waits `(n - 1) ×` this.
    pub restart_backoff_ms: u64,
    /// A daemon's start, and a persistent fault seen again after it.
    pub daemon_start_ms: u64,
    /// The server's health evaluation interval.
    pub health_tick_ms: u64,
    /// How often the remediation controller passes over an unresolved incident.
    pub incident_pass_ms: u64,
    /// A replacement task's start to RUNNING and ready, allowed to the task.
    pub task_start_ms: u64,
    /// Every webhook attempt with its timeout and backoff.
    pub webhook_ms: u64,
}

/// A pool's recovery bounds: one row per failure kind, the inputs, and the formulas in words.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct RecoveryBounds {
    /// Whose the phases after detection are: `mpsfleet` or `operator`.
    pub owner: String,
    pub kinds: Vec<KindBounds>,
    pub inputs: BoundInputs,
    /// How each figure is derived from the inputs.
    pub formulas: Vec<String>,
    /// The pool's `maxResumeSeconds`, in ms, when it sets one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_resume_ms: Option<u64>,
    /// How a full pool recovers (`KindBounds::total_full_pool_ms`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub full_pool: Option<FullPoolBounds>,
    /// The pool's `restartCopies`, which `KindBounds::copies_ms` follows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restart_copies: Option<crate::policy::RestartCopies>,
}

impl RecoveryBounds {
    pub fn of(&self, kind: FailureKind) -> Option<&KindBounds> {
        self.kinds.iter().find(|k| k.kind == kind)
    }

    /// The longest total the bounds state, and for which kind (the first of equals): what
    /// `maxResumeSeconds` caps.
    pub fn longest_total(&self) -> Option<(FailureKind, u64)> {
        self.kinds
            .iter()
            .flat_map(|k| [k.total_ms, k.total_fenced_ms].into_iter().flatten().map(move |t| (k.kind, t)))
            .fold(None, |best: Option<(FailureKind, u64)>, (k, t)| match best {
                Some((_, b)) if b >= t => best,
                _ => Some((k, t)),
            })
    }
}

/// The bounds an incident is held to, fixed when it opens: its kind's row, with the total
/// of the resumption its host's services had then (`fenced` when any had).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct IncidentBounds {
    pub kind: FailureKind,
    pub detect_ms: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decide_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replace_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub total_ms: Option<u64>,
    /// Whether `totalMs` is the fenced one.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub fenced: bool,
    /// What a preemption adds to the total: the victims' stop (`FullPoolBounds`). An incident
    /// whose recovery preempted (a PREEMPTED step) is held to `totalMs` plus this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preempt_ms: Option<u64>,
}

impl IncidentBounds {
    pub fn of(k: &KindBounds, fenced: bool) -> Self {
        IncidentBounds {
            kind: k.kind,
            detect_ms: k.detect_ms,
            decide_ms: k.decide_ms,
            replace_ms: k.replace_ms,
            total_ms: if fenced { k.total_fenced_ms } else { k.total_ms },
            fenced,
            preempt_ms: None,
        }
    }

    pub fn bound(&self, phase: RecoveryPhase) -> Option<u64> {
        match phase {
            RecoveryPhase::Detect => Some(self.detect_ms),
            RecoveryPhase::Decide => self.decide_ms,
            RecoveryPhase::Replace => self.replace_ms,
            RecoveryPhase::Total => self.total_ms,
        }
    }
}

/// Why a phase ran past its bound, when the server can tell.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "kebab-case")]
pub enum BreachCause {
    /// The affected tasks waited for room: no healthy host could take them.
    NoCapacity,
    /// The provider's launch failed, was retried, or ran past `launchTimeoutSeconds`.
    ProviderSlow,
    /// The storm breaker or another safety limit held remediation back.
    BreakerOpen,
    /// The replacement tasks were placed but took longer than the allowance to run and be
    /// ready.
    TaskSlowToStart,
    /// The phase began before the server (re)started or took over: nobody was deciding
    /// meanwhile.
    ControlPlaneRestart,
    /// The failure came more slowly than the bound's kind assumes: a daemon that exited again
    /// only a while after each local restart, where the `daemon-exit` bound counts each
    /// restart killed at once. Detection waited on the failure, not on the server.
    SlowerFailure,
}

impl BreachCause {
    pub fn as_str(self) -> &'static str {
        match self {
            BreachCause::NoCapacity => "no-capacity",
            BreachCause::ProviderSlow => "provider-slow",
            BreachCause::BreakerOpen => "breaker-open",
            BreachCause::TaskSlowToStart => "task-slow-to-start",
            BreachCause::ControlPlaneRestart => "control-plane-restart",
            BreachCause::SlowerFailure => "slower-failure",
        }
    }
}

/// A phase seen past its bound.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct BoundBreach {
    pub phase: RecoveryPhase,
    /// When the server saw it (server clock).
    pub at_ms: u64,
    pub bound_ms: u64,
    /// How long the phase had lasted then (its length, when it had ended).
    pub measured_ms: u64,
    /// None: no cause the server can name (an unexplained breach).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cause: Option<BreachCause>,
}

impl BoundBreach {
    /// `total ran 41.2s, bound 38s (no-capacity)`.
    pub fn words(&self) -> String {
        let cause = self.cause.map(|c| format!(" ({})", c.as_str())).unwrap_or_default();
        format!(
            "{} ran {}, bound {}{cause}",
            self.phase,
            crate::time::secs(self.measured_ms),
            crate::time::secs(self.bound_ms)
        )
    }
}

/// Where one phase of an incident stands against its bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "kebab-case")]
pub enum PhaseVerdict {
    Within,
    Breached,
    /// The phase has not ended and is still within its bound.
    Running,
    /// The phase did not happen in this incident (no replacement asked for, no service task
    /// to resume, an operator's part).
    NotApplicable,
}

/// One phase of an incident's judgement: `incident describe` and `-o json` show these.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct PhaseJudgement {
    pub phase: RecoveryPhase,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bound_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub measured_ms: Option<u64>,
    pub verdict: PhaseVerdict,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cause: Option<BreachCause>,
}
