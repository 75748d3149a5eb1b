//! Services: keep N tasks of a task definition running in a pool.

use crate::ids::{PoolName, ServiceName, TaskDefRef};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ServiceStatus {
    Active,
    /// Deleted: tasks are being stopped; the record goes when none is left.
    Draining,
}

/// How a service decides its tasks (ECS's `schedulingStrategy`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum SchedulingStrategy {
    /// `desiredCount` tasks, placed wherever the scheduler chooses.
    #[default]
    Replica,
    /// One task on each ACTIVE host of the pool: its desired count follows the pool's hosts.
    Daemon,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Service {
    pub name: ServiceName,
    pub pool: PoolName,
    pub task_definition: TaskDefRef,
    /// The tasks to keep running; a DAEMON service's is its pool's ACTIVE hosts.
    pub desired_count: u32,
    #[serde(default)]
    pub scheduling_strategy: SchedulingStrategy,
    /// When tasks on a bad host are started elsewhere: at once, or after it is terminated.
    #[serde(default)]
    pub resumption: crate::policy::ResumptionBoundary,
    pub status: ServiceStatus,
    pub created_at_ms: u64,
    pub updated_at_ms: u64,
    /// How tasks roll over to a new definition (ECS's `deploymentConfiguration`).
    #[serde(default)]
    pub deployment_configuration: DeploymentConfiguration,
    /// How long a replica stopped by a plan (a deployment, a scale-in) stays out of service
    /// discovery before it gets SIGTERM, so that load balancers stop sending it requests and
    /// those in flight finish: named after the load balancer attribute it mirrors
    /// (`deregistration_delay.timeout_seconds`), 2 s by default, 0 to stop at once.
    #[serde(default = "default_deregistration_delay")]
    pub deregistration_delay_seconds: u32,
    /// The newest deployments, newest first: the PRIMARY one, ACTIVE ones whose tasks still
    /// run, and a few INACTIVE ones (at most [`DEPLOYMENTS_KEPT`]).
    #[serde(default)]
    pub deployments: Vec<Deployment>,
    /// The number the next deployment's id takes (`d-N`).
    #[serde(default)]
    pub next_deployment: u32,
    /// What the service did and why: deployment steps, replacements, tasks it could not place.
    #[serde(default)]
    pub events: crate::history::History<ObjectEvent>,
    /// Replicas being moved off a daemon (or host) they share with another replica: each is
    /// replaced as a deployment replaces an older task, within the same bounds.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub moving: Vec<crate::ids::TaskId>,
    /// Its tags (ECS's service tags).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tags: Vec<crate::tags::Tag>,
    /// ECS fields mpsfleet takes without acting on them, kept as given so that a description
    /// shows them (`loadBalancers`, `serviceRegistries`, `placementStrategy`, `placementConstraints`, `roleArn`; mpsfleet wires no load balancer).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub kept_fields: std::collections::BTreeMap<String, serde_json::Value>,
    /// 1 to 100 (50 by default): its tasks' priority (`Task::priority`).
    #[serde(default = "crate::priority::default_priority")]
    pub priority: u8,
    /// When one of its replicas was last preempted: replicas placed after it are not
    /// preempted within `PREEMPTION_BACKOFF_MS` of their placement.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preempted_at_ms: Option<u64>,
    /// Whether `task exec` may run commands in its tasks (ECS's `enableExecuteCommand`); a
    /// change applies to the tasks it starts from then on, as in ECS.
    #[serde(default = "crate::task::exec_default")]
    pub enable_execute_command: bool,
}

/// Deployments a service record keeps (the older INACTIVE ones are dropped).
pub const DEPLOYMENTS_KEPT: usize = 8;

/// The default of `Service::deregistration_delay_seconds`: enough for a load balancer that
/// asks every 200 ms and the requests it has in flight, not ELB's 300 s.
pub const DEFAULT_DEREGISTRATION_DELAY_S: u32 = 2;
/// The longest `deregistrationDelaySeconds` (ELB's bound).
pub const MAX_DEREGISTRATION_DELAY_S: u32 = 3600;

fn default_deregistration_delay() -> u32 {
    DEFAULT_DEREGISTRATION_DELAY_S
}

/// ECS's `deploymentConfiguration` of a service.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct DeploymentConfiguration {
    /// The fewest healthy tasks during a deployment, as a percentage of the desired count
    /// (rounded up); 0 to 100, default 100.
    #[serde(default = "hundred")]
    pub minimum_healthy_percent: u32,
    /// The most tasks (pending, running or stopping) during a deployment, as a percentage of
    /// the desired count (rounded down); 100 to 400, default 200.
    #[serde(default = "two_hundred")]
    pub maximum_percent: u32,
    #[serde(default)]
    pub deployment_circuit_breaker: CircuitBreaker,
    /// Lets the spreading of replicas move tasks of a `fenced` service (each stops before its
    /// copy starts); off by default, since a move stops a healthy replica.
    #[serde(default)]
    pub rebalance_fenced: bool,
}

fn hundred() -> u32 {
    100
}

fn two_hundred() -> u32 {
    200
}

impl DeploymentConfiguration {
    /// A DAEMON service's default, as ECS's: a host's task is stopped before its replacement
    /// starts there (`maximumPercent` 100), and any number of hosts may be between the two.
    pub fn daemon() -> Self {
        DeploymentConfiguration { minimum_healthy_percent: 0, maximum_percent: 100, ..Default::default() }
    }
}

impl Default for DeploymentConfiguration {
    fn default() -> Self {
        DeploymentConfiguration {
            minimum_healthy_percent: 100,
            maximum_percent: 200,
            deployment_circuit_breaker: CircuitBreaker::default(),
            rebalance_fenced: false,
        }
    }
}

/// ECS's deployment circuit breaker: a deployment whose new tasks keep failing stops, and
/// with `rollback` goes back to the last deployment that completed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct CircuitBreaker {
    #[serde(default)]
    pub enable: bool,
    #[serde(default)]
    pub rollback: bool,
}

impl CircuitBreaker {
    /// ECS's failure threshold: half the desired count, rounded up, at least 3 and at most 200.
    pub fn threshold(desired: u32) -> u32 {
        desired.div_ceil(2).clamp(3, 200)
    }
}

/// A deployment's place among the service's deployments, as in ECS.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum DeploymentStatus {
    /// The newest: the definition new tasks are started from.
    Primary,
    /// An older one whose tasks are still being replaced.
    Active,
    /// Done: none of its tasks is left.
    Inactive,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum RolloutState {
    InProgress,
    /// Every desired task runs the deployment's definition and is healthy; no older task is
    /// left.
    Completed,
    /// The circuit breaker tripped: no more tasks are started for it.
    Failed,
}

impl RolloutState {
    pub fn as_str(self) -> &'static str {
        match self {
            RolloutState::InProgress => "IN_PROGRESS",
            RolloutState::Completed => "COMPLETED",
            RolloutState::Failed => "FAILED",
        }
    }
}

impl DeploymentStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            DeploymentStatus::Primary => "PRIMARY",
            DeploymentStatus::Active => "ACTIVE",
            DeploymentStatus::Inactive => "INACTIVE",
        }
    }
}

/// One rollout of a service to a task definition.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Deployment {
    /// `d-N`, numbered per service.
    pub id: String,
    pub status: DeploymentStatus,
    pub task_definition: TaskDefRef,
    pub desired_count: u32,
    pub rollout_state: RolloutState,
    pub rollout_state_reason: String,
    /// Its tasks that stopped failing (exited, failed a check, could not start) while it was
    /// in progress: what the circuit breaker counts.
    #[serde(default)]
    pub failed_tasks: u32,
    pub created_at_ms: u64,
    pub updated_at_ms: u64,
    /// Why its tasks failed, grouped by stop reason, the latest group last: at most
    /// `Deployment::FAILURE_GROUPS` groups (an older group makes room for a new reason).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub failures: Vec<FailureGroup>,
    /// When a forced deployment (ECS's `forceNewDeployment`) started: the service's tasks
    /// made before it are replaced although they run the same definition.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forced_at_ms: Option<u64>,
}

impl Deployment {
    /// Failure groups a deployment keeps.
    pub const FAILURE_GROUPS: usize = 8;
    /// Characters of a stop reason a group keeps.
    pub const FAILURE_REASON_CHARS: usize = 512;

    /// Counts one failed task under its stop reason; returns the group's count.
    pub fn note_failure(&mut self, task: &str, reason: &str, at_ms: u64) -> u32 {
        let reason: String = reason.chars().take(Self::FAILURE_REASON_CHARS).collect();
        let group = match self.failures.iter().position(|g| g.reason == reason) {
            Some(i) => self.failures.remove(i),
            None => {
                if self.failures.len() >= Self::FAILURE_GROUPS {
                    self.failures.remove(0);
                }
                FailureGroup { reason, count: 0, last_task: String::new(), last_at_ms: 0 }
            }
        };
        let group = FailureGroup {
            count: group.count.saturating_add(1),
            last_task: task.to_string(),
            last_at_ms: at_ms,
            ..group
        };
        let count = group.count;
        self.failures.push(group);
        count
    }

    /// The failure groups in words, most frequent first: `3 stopped: CannotPullContainerError: …`.
    pub fn failures_words(&self) -> Vec<String> {
        let mut groups: Vec<&FailureGroup> = self.failures.iter().collect();
        groups.sort_by(|a, b| b.count.cmp(&a.count).then(b.last_at_ms.cmp(&a.last_at_ms)));
        groups.iter().map(|g| format!("{} stopped: {}", g.count, g.reason)).collect()
    }
}

/// Tasks of a deployment that stopped for one reason.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct FailureGroup {
    /// The tasks' stop reason (`CannotPullContainerError: …`), at most 512 characters.
    pub reason: String,
    pub count: u32,
    /// The latest task that stopped for it.
    pub last_task: String,
    pub last_at_ms: u64,
}

/// One event of an object's history, as kubectl's describe shows them: a stable reason and
/// a message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ObjectEvent {
    /// A stable CamelCase code (`DeploymentStarted`, `TaskStarted`, `Unplaceable`, ...).
    pub reason: String,
    pub message: String,
}

impl ObjectEvent {
    pub fn new(reason: &str, message: impl Into<String>) -> Self {
        ObjectEvent { reason: reason.to_string(), message: message.into() }
    }
}

impl crate::history::HistoryEvent for ObjectEvent {}

/// A deployment with the counts of its tasks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct DeploymentView {
    #[serde(flatten)]
    pub deployment: Deployment,
    pub running_count: u32,
    pub pending_count: u32,
    /// Running, ready and passing its health check (if it has one).
    pub healthy_count: u32,
    /// Whether the deployment's task definition has a container health check: without one,
    /// "healthy" only means running and ready, and is not said.
    #[serde(default)]
    pub health_checked: bool,
}

/// A service as the API returns it: the record plus counts derived from its tasks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ServiceView {
    #[serde(flatten)]
    pub service: Service,
    pub running_count: u32,
    pub pending_count: u32,
    /// Running, ready and passing its health check (if it has one).
    #[serde(default)]
    pub healthy_count: u32,
    /// Whether the service's task definition has a container health check: without one,
    /// "healthy" only means running and ready, and is not said.
    #[serde(default)]
    pub health_checked: bool,
    /// Each live replica's place in the service's traffic, in task order.
    #[serde(default)]
    pub traffic: Vec<crate::discovery::ReplicaTraffic>,
}

/// Body of `POST /v1/services`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct CreateService {
    pub name: String,
    pub pool: String,
    pub task_definition: String,
    /// 0 for a DAEMON service (its count follows its pool's ACTIVE hosts).
    #[serde(default)]
    pub desired_count: u32,
    /// REPLICA (the default) or DAEMON: one task on each ACTIVE host of the pool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheduling_strategy: Option<SchedulingStrategy>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resumption: Option<crate::policy::ResumptionBoundary>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deployment_configuration: Option<DeploymentConfiguration>,
    /// `Service::deregistration_delay_seconds`; 2 s when not given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deregistration_delay_seconds: Option<u32>,
    /// Makes the call idempotent (see `RunTask::client_token`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_token: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tags: Vec<crate::tags::Tag>,
    /// ECS fields mpsfleet takes without acting on them, kept as given so that a description
    /// shows them (see `Service::kept_fields`).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub kept_fields: std::collections::BTreeMap<String, serde_json::Value>,
    /// 1 to 100 (default: the task definition's `mpsfleet:priority` tag, else 50).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<u32>,
    /// `Service::enable_execute_command` (true when not given here, false through the ECS API).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enable_execute_command: Option<bool>,
}

/// Body of `PATCH /v1/services/{name}`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct UpdateService {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task_definition: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub desired_count: Option<u32>,
    /// Replaces the whole configuration; takes effect at the next deployment step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deployment_configuration: Option<DeploymentConfiguration>,
    /// `Service::deregistration_delay_seconds`, for the stops planned from now on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deregistration_delay_seconds: Option<u32>,
    /// Makes the call idempotent (see `RunTask::client_token`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_token: Option<String>,
    /// Starts a new deployment even when the definition is the same (ECS's
    /// `forceNewDeployment`): every task of the service is replaced.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub force_new_deployment: bool,
    /// 1 to 100: the service's priority, and its running tasks' at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<u32>,
    /// ECS fields mpsfleet takes without acting on them, kept as given so that a description
    /// shows them (replacing those given; see `Service::kept_fields`).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub kept_fields: std::collections::BTreeMap<String, serde_json::Value>,
    /// `Service::enable_execute_command`, for the tasks it starts from now on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enable_execute_command: Option<bool>,
}

/// Where one running replica of a service can be reached: `mpsfleet service endpoints NAME`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ServiceEndpoint {
    pub task_id: crate::ids::TaskId,
    pub host_id: crate::ids::HostId,
    pub container: String,
    /// `HOST:PORT` to connect to: the host's address with the binding's host port.
    pub address: String,
    pub host_port: u16,
    pub container_port: u16,
    pub protocol: crate::taskdef::Protocol,
    /// The task passes its readiness check (true without one).
    pub ready: bool,
    pub health_status: crate::task::TaskHealth,
}

#[cfg(test)]
mod failure_tests {
    use super::*;

    fn deployment() -> Deployment {
        Deployment {
            id: "d-1".into(),
            status: DeploymentStatus::Primary,
            task_definition: TaskDefRef::parse("web:1").unwrap(),
            desired_count: 3,
            rollout_state: RolloutState::InProgress,
            rollout_state_reason: String::new(),
            failed_tasks: 0,
            created_at_ms: 0,
            updated_at_ms: 0,
            failures: Vec::new(),
            forced_at_ms: None,
        }
    }

    #[test]
    fn failures_are_grouped_by_reason_and_bounded() {
        let mut d = deployment();
        assert_eq!(d.note_failure("t-1", "CannotPullContainerError: no such image", 1), 1);
        assert_eq!(d.note_failure("t-2", "exit 1", 2), 1);
        assert_eq!(d.note_failure("t-3", "CannotPullContainerError: no such image", 3), 2);
        assert_eq!(d.failures.len(), 2);
        assert_eq!(d.failures.last().map(|g| g.last_task.as_str()), Some("t-3"), "the latest group last");
        assert_eq!(
            d.failures_words(),
            ["2 stopped: CannotPullContainerError: no such image", "1 stopped: exit 1"]
        );
        // A flood of distinct reasons keeps the newest groups, each reason cut to its bound.
        for i in 0..100 {
            d.note_failure("t", &format!("{i}{}", "x".repeat(2000)), 10 + i);
        }
        assert_eq!(d.failures.len(), Deployment::FAILURE_GROUPS);
        assert!(d.failures.iter().all(|g| g.reason.chars().count() == Deployment::FAILURE_REASON_CHARS));
        assert!(d.failures.last().unwrap().reason.starts_with("99x"));
        // Stored records from before the groups load without them.
        let mut old = serde_json::to_value(deployment()).unwrap();
        old.as_object_mut().unwrap().remove("failures");
        assert_eq!(serde_json::from_value::<Deployment>(old).unwrap(), deployment());
    }
}
