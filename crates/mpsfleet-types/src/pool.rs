//! Pools: named groups of hosts with one ownership mode and placement settings.

use crate::ids::PoolName;
use crate::policy::{HealthPolicy, Provider, RemediationPolicy};
use serde::{Deserialize, Serialize};

/// Who owns host recovery in a pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "kebab-case")]
pub enum OwnershipMode {
    /// mpsfleet detects, decides, drains, replaces and moves tasks.
    Managed,
    /// mpsfleet detects and reports; the operator acts.
    SelfManaged,
}

impl OwnershipMode {
    pub fn as_str(self) -> &'static str {
        match self {
            OwnershipMode::Managed => "managed",
            OwnershipMode::SelfManaged => "self-managed",
        }
    }
}

/// How the scheduler chooses among GPUs that fit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum PlacementStrategy {
    /// Fill the fullest GPU that still fits; keep whole GPUs free.
    #[default]
    Binpack,
    /// Use the emptiest GPU.
    Spread,
}

impl PlacementStrategy {
    pub fn as_str(self) -> &'static str {
        match self {
            PlacementStrategy::Binpack => "binpack",
            PlacementStrategy::Spread => "spread",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Pool {
    pub name: PoolName,
    pub mode: OwnershipMode,
    pub strategy: PlacementStrategy,
    /// Bound on the sum of maxComputePercent over the MPS clients of one GPU (an undeclared
    /// limit counts as 100). None: no bound.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compute_overcommit_percent: Option<u32>,
    /// How hosts are watched and when one is declared bad.
    #[serde(default)]
    pub health_policy: HealthPolicy,
    /// The safety limits on automatic replacement (managed pools).
    #[serde(default)]
    pub remediation_policy: RemediationPolicy,
    /// What launches and terminates hosts; managed pools only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider: Option<Provider>,
    /// Whether a process task runs as the `user` its definition names (root included). When
    /// false, the default, process tasks run as an unprivileged user of their own and a
    /// definition naming a `user` is refused on process hosts (docs/security.md).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub allow_task_users: bool,
    /// Which container options that reach past the container's own isolation the pool's
    /// tasks may use; all refused by default. Always shown.
    #[serde(default)]
    pub task_policy: TaskPolicy,
    /// The longest the operator accepts from a failure's first signal to its tasks running
    /// again: a policy whose derived bound is longer is refused (docs/pools.md "Recovery
    /// bounds"). None: no limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_resume_seconds: Option<u32>,
    /// Which placements may stop lower-priority tasks to make room when nothing fits:
    /// `off`, `recovery` (the default: only replicas replacing ones lost to a failure) or
    /// `all` (docs/pools.md "Priorities and preemption"). Always shown.
    #[serde(default)]
    pub preemption: crate::priority::Preemption,
    /// When its `restart` services start copies of the replicas on a failing MPS daemon:
    /// `first-exit` (the default) or `confirmed` (docs/pools.md "Restart copies"). Always
    /// shown.
    #[serde(default)]
    pub restart_copies: crate::policy::RestartCopies,
    /// What happened to the pool itself, newest last: its bounds changed, a recovery ran past
    /// them, drills. Bounded like every object's events.
    #[serde(default, skip_serializing_if = "crate::History::is_empty")]
    pub events: crate::History<crate::ObjectEvent>,
    pub created_at_ms: u64,
    /// Its tags (ECS's cluster tags).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tags: Vec<crate::tags::Tag>,
    /// ECS fields mpsfleet takes without acting on them, kept as given so that a description
    /// shows them (`settings`, `configuration`, `serviceConnectDefaults`).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub kept_fields: std::collections::BTreeMap<String, serde_json::Value>,
}

/// Body of `POST /v1/pools`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CreatePool {
    #[serde(default)]
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<OwnershipMode>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub strategy: Option<PlacementStrategy>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compute_overcommit_percent: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health_policy: Option<HealthPolicy>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remediation_policy: Option<RemediationPolicy>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider: Option<Provider>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_task_users: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task_policy: Option<TaskPolicy>,
    /// 1 to 86400; in an update, 0 removes the limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_resume_seconds: Option<u32>,
    /// `Pool::preemption`: `off`, `recovery` or `all`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preemption: Option<crate::priority::Preemption>,
    /// `Pool::restart_copies`: `first-exit` or `confirmed`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restart_copies: Option<crate::policy::RestartCopies>,
    /// Its tags (ECS's cluster tags).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tags: Vec<crate::tags::Tag>,
    /// ECS fields mpsfleet takes without acting on them, kept as given so that a description
    /// shows them (`settings`, `configuration`, `serviceConnectDefaults`).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub kept_fields: std::collections::BTreeMap<String, serde_json::Value>,
}

/// Body of `PATCH /v1/pools/{name}`: what is given replaces what the pool has; policies are
/// replaced whole (fields left out of a given policy take their defaults).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct UpdatePool {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub strategy: Option<PlacementStrategy>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compute_overcommit_percent: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health_policy: Option<HealthPolicy>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remediation_policy: Option<RemediationPolicy>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider: Option<Provider>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_task_users: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task_policy: Option<TaskPolicy>,
    /// 1 to 86400; in an update, 0 removes the limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_resume_seconds: Option<u32>,
    /// `Pool::preemption`: `off`, `recovery` or `all`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preemption: Option<crate::priority::Preemption>,
    /// `Pool::restart_copies`: `first-exit` or `confirmed`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restart_copies: Option<crate::policy::RestartCopies>,
}

/// A pool's task policy: what container options its tasks may use beyond a container's own
/// isolation. A task whose definition uses one the policy does not allow is refused at
/// `task run` and `service create`, with a reason naming the policy's field.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
pub struct TaskPolicy {
    /// `privileged: true`.
    pub allow_privileged: bool,
    /// `networkMode: host`.
    pub allow_host_network: bool,
    /// `pidMode: host` and `ipcMode: host`.
    pub allow_host_namespaces: bool,
    /// Volumes with `host.sourcePath` (bind mounts of host paths).
    pub allow_host_paths: bool,
    /// `linuxParameters.capabilities.add` and `systemControls`.
    pub allow_capabilities: bool,
    /// `linuxParameters.devices`.
    pub allow_devices: bool,
}

impl TaskPolicy {
    /// Everything allowed (what `mpsfleet up` gives its pool).
    pub fn permissive() -> Self {
        TaskPolicy {
            allow_privileged: true,
            allow_host_network: true,
            allow_host_namespaces: true,
            allow_host_paths: true,
            allow_capabilities: true,
            allow_devices: true,
        }
    }

    pub fn is_default(&self) -> bool {
        *self == TaskPolicy::default()
    }
}
