//! Tasks: one run of a task definition, with ECS's statuses and stop codes.

use crate::ids::{GpuUuid, HostId, PoolName, ServiceName, TaskDefRef, TaskId};
use crate::taskdef::Protocol;
use serde::{Deserialize, Serialize};

/// ECS's task statuses, used for both `lastStatus` and `desiredStatus`.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, utoipa::ToSchema,
)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum TaskStatus {
    Provisioning,
    Pending,
    Activating,
    Running,
    Deactivating,
    Stopping,
    Deprovisioning,
    Stopped,
}

impl TaskStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            TaskStatus::Provisioning => "PROVISIONING",
            TaskStatus::Pending => "PENDING",
            TaskStatus::Activating => "ACTIVATING",
            TaskStatus::Running => "RUNNING",
            TaskStatus::Deactivating => "DEACTIVATING",
            TaskStatus::Stopping => "STOPPING",
            TaskStatus::Deprovisioning => "DEPROVISIONING",
            TaskStatus::Stopped => "STOPPED",
        }
    }
}

/// A task's health as its liveness check sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum TaskHealth {
    Unknown,
    Healthy,
    Unhealthy,
}

impl TaskHealth {
    pub fn as_str(self) -> &'static str {
        match self {
            TaskHealth::Unknown => "UNKNOWN",
            TaskHealth::Healthy => "HEALTHY",
            TaskHealth::Unhealthy => "UNHEALTHY",
        }
    }
}

/// Machine-readable reason a task stopped (ECS's codes plus mpsfleet's own).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
pub enum StopCode {
    /// Stopped on request (`task stop`).
    UserInitiated,
    /// Stopped by a service (scale-in, update, delete, replacement).
    ServiceSchedulerInitiated,
    /// An essential container exited.
    EssentialContainerExited,
    /// The task could not be started (bad command, missing user, ...).
    TaskFailedToStart,
    /// The task asked for MPS and its GPU's daemon was not answering: not started unlimited.
    MpsDaemonUnavailable,
    /// The liveness check failed past its retries.
    Unhealthy,
    /// The host it ran on was replaced.
    HostReplaced,
    /// The host it ran on was drained by an operator (`host drain`).
    HostDrained,
    /// The host it ran on left the fleet and the task's fate is unknown.
    HostLost,
    /// A container's image could not be pulled (and no cached copy could be used).
    CannotPullContainerError,
    /// A container went past its memory limit and was killed.
    OutOfMemory,
    /// Stopped to make room for a task at least 10 priority above it (its reason names that
    /// task and both priorities).
    Preempted,
}

impl StopCode {
    pub fn as_str(self) -> &'static str {
        match self {
            StopCode::UserInitiated => "UserInitiated",
            StopCode::ServiceSchedulerInitiated => "ServiceSchedulerInitiated",
            StopCode::EssentialContainerExited => "EssentialContainerExited",
            StopCode::TaskFailedToStart => "TaskFailedToStart",
            StopCode::MpsDaemonUnavailable => "MpsDaemonUnavailable",
            StopCode::Unhealthy => "Unhealthy",
            StopCode::HostReplaced => "HostReplaced",
            StopCode::HostDrained => "HostDrained",
            StopCode::HostLost => "HostLost",
            StopCode::CannotPullContainerError => "CannotPullContainerError",
            StopCode::OutOfMemory => "OutOfMemory",
            StopCode::Preempted => "Preempted",
        }
    }
}

/// The stored and returned task record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Task {
    pub id: TaskId,
    pub task_definition: TaskDefRef,
    pub pool: PoolName,
    /// The service that owns the task, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<ServiceName>,
    pub last_status: TaskStatus,
    pub desired_status: TaskStatus,
    pub health_status: TaskHealth,
    /// The readiness check passes (true without a readiness check once RUNNING).
    #[serde(default)]
    pub ready: bool,
    #[serde(default)]
    pub host_id: Option<HostId>,
    #[serde(default)]
    pub gpu_ids: Vec<GpuUuid>,
    /// Why the task is waiting for placement; None once placed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pending_reason: Option<String>,
    /// The same reason as a stable code, for scripts and metrics; None once placed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pending_code: Option<PendingCode>,
    /// True while no host of the pool, and no host its provider launches, has what the task
    /// needs (a container runtime): nothing will place it until an operator adds such a host
    /// (`--wait` gives up at once). False once placed.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub unplaceable: bool,
    #[serde(default)]
    pub stop_code: Option<StopCode>,
    #[serde(default)]
    pub stopped_reason: Option<String>,
    /// Who asked for it: `run:<request>` or `service:<name>`.
    pub started_by: String,
    pub created_at_ms: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stopped_at_ms: Option<u64>,
    /// When it was placed on its host (None while it waits, and for records that predate it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub placed_at_ms: Option<u64>,
    /// When its host began pulling its first image and finished pulling its last, on the
    /// server's clock (ECS's `pullStartedAt`, `pullStoppedAt`); None when nothing was pulled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pull_started_at_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pull_stopped_at_ms: Option<u64>,
    /// What the agent reports of each container: its runtime id, network bindings, exit.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub containers: Vec<ContainerReport>,
    /// The task's network interface in `awsvpc` mode, as ECS's `attachments[]` shows an ENI:
    /// derived from its containers' `networkInterfaces` ([`Attachment::of_containers`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attachments: Vec<Attachment>,
    /// What its run and later calls attached to it (overrides, startedBy, group, tags).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub labels: Option<Box<crate::labels::TaskLabels>>,
    /// The deployment of its service that started it (`d-N`); the scheduler spreads each
    /// deployment's tasks over hosts and daemons by themselves, so that a rollout leaves the
    /// service as spread as placement allows once the older tasks stop. None for a task run
    /// on its own, or started before tasks recorded it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deployment: Option<String>,
    /// A planned stop on its way: the task left service discovery (weight 0) at `sinceMs` and
    /// is stopped, with `stopCode` and `reason`, at `untilMs` (its service's
    /// `deregistrationDelaySeconds` later), so that load balancers send it nothing new and
    /// the requests in flight finish first (docs/traffic.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub draining: Option<Draining>,
    /// 1 to 100 (50 by default): its run's or its service's `priority`. A task that finds no
    /// room may stop tasks at least 10 below it, where its pool's `preemption` allows.
    #[serde(default = "crate::priority::default_priority")]
    pub priority: u8,
    /// The host whose failure this replica replaces one lost on (a copy started for a replica
    /// on a failed MPS daemon, or the replacement of one stopped by its host's or daemon's
    /// failure): under the pool's `recovery` preemption, only such a task preempts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recovery_from: Option<HostId>,
    /// Whether `task exec` may run commands in it (ECS's `enableExecuteCommand`): the REST API
    /// and the CLI start tasks with it on unless told otherwise, the ECS API with it off.
    #[serde(default = "crate::task::exec_default")]
    pub enable_execute_command: bool,
}

/// `Task::enable_execute_command` of a task stored before the field existed, and of a task
/// the REST API runs without saying.
pub fn exec_default() -> bool {
    true
}

/// A task leaving traffic before it is stopped (`Task::draining`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Draining {
    pub since_ms: u64,
    pub until_ms: u64,
    pub stop_code: StopCode,
    pub reason: String,
}

/// One container of a task as its agent reports it (ECS's `containers[]`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ContainerReport {
    pub name: String,
    /// The image as the definition names it; None for a process.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// The image's digest or id as the runtime resolved it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_digest: Option<String>,
    /// The Docker container id, or the process id of a process.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub network_bindings: Vec<NetworkBinding>,
    /// What the runtime did differently from the definition, and why (an image not used by a
    /// process host, a GPU device request left out for an emulated GPU, ...).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
    /// The task's own address in `awsvpc` mode (ECS's `containers[].networkInterfaces`): every
    /// container of the task has the same one, its ports are reached there.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub network_interfaces: Vec<NetworkInterface>,
}

/// A container's network interface in `awsvpc` mode (ECS's `NetworkInterface`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct NetworkInterface {
    /// The task's attachment (`attachments[].id`).
    pub attachment_id: String,
    pub private_ipv4_address: String,
}

/// ECS's attachment type of a task's network interface, kept so that tools reading
/// `attachments[]` for the task's address find it.
pub const ATTACHMENT_TYPE_ENI: &str = "ElasticNetworkInterface";
/// The detail naming the interface's address in ECS's `attachments[].details`.
pub const DETAIL_PRIVATE_IPV4: &str = "privateIPv4Address";

/// One of a task's attachments (ECS's `Attachment`): in `awsvpc` mode, its network interface,
/// with `details` `[{"name": "privateIPv4Address", "value": "172.30.0.5"}]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Attachment {
    pub id: String,
    #[serde(rename = "type")]
    pub kind: String,
    /// `ATTACHED` while the task runs, `DELETED` once it has stopped.
    pub status: String,
    pub details: Vec<crate::taskdef::KeyValuePair>,
}

impl Attachment {
    /// One attachment per interface the containers report, in order of first appearance.
    pub fn of_containers(containers: &[ContainerReport], stopped: bool) -> Vec<Attachment> {
        let mut out: Vec<Attachment> = Vec::new();
        for ni in containers.iter().flat_map(|c| &c.network_interfaces) {
            if out.iter().any(|a| a.id == ni.attachment_id) {
                continue;
            }
            out.push(Attachment {
                id: ni.attachment_id.clone(),
                kind: ATTACHMENT_TYPE_ENI.to_string(),
                status: if stopped { "DELETED" } else { "ATTACHED" }.to_string(),
                details: vec![crate::taskdef::KeyValuePair {
                    name: DETAIL_PRIVATE_IPV4.to_string(),
                    value: ni.private_ipv4_address.clone(),
                }],
            });
        }
        out
    }

    /// The interface's address, from its details.
    pub fn private_ipv4_address(&self) -> Option<&str> {
        self.details.iter().find(|d| d.name == DETAIL_PRIVATE_IPV4).map(|d| d.value.as_str())
    }
}

/// Where a container port is reachable on the host (ECS's `networkBindings[]`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct NetworkBinding {
    pub bind_ip: String,
    pub container_port: u16,
    pub host_port: u16,
    pub protocol: Protocol,
}

impl NetworkBinding {
    /// `ADDRESS:PORT` as the kernel lists the socket (`ss -ltn`): an IPv6 address in brackets,
    /// `0.0.0.0` for an empty bind address (Docker's "every address").
    pub fn address(&self) -> String {
        match self.bind_ip.as_str() {
            "" => format!("0.0.0.0:{}", self.host_port),
            ip if ip.contains(':') => format!("[{ip}]:{}", self.host_port),
            ip => format!("{ip}:{}", self.host_port),
        }
    }

    /// Bound on every address of the host (`0.0.0.0`, `::` or empty): reachable from every
    /// network the host is on.
    pub fn on_every_address(&self) -> bool {
        self.bind_ip.parse::<std::net::IpAddr>().map_or(self.bind_ip.is_empty(), |ip| ip.is_unspecified())
    }
}

impl Task {
    /// A new task, waiting to be placed: `PENDING`, desired `RUNNING`, health unknown.
    pub fn new(
        id: TaskId,
        task_definition: TaskDefRef,
        pool: PoolName,
        group: Option<ServiceName>,
        started_by: String,
        created_at_ms: u64,
    ) -> Task {
        Task {
            id,
            task_definition,
            pool,
            group,
            last_status: TaskStatus::Pending,
            desired_status: TaskStatus::Running,
            health_status: TaskHealth::Unknown,
            ready: false,
            host_id: None,
            gpu_ids: Vec::new(),
            pending_reason: None,
            pending_code: None,
            unplaceable: false,
            stop_code: None,
            stopped_reason: None,
            started_by,
            created_at_ms,
            started_at_ms: None,
            stopped_at_ms: None,
            placed_at_ms: None,
            pull_started_at_ms: None,
            pull_stopped_at_ms: None,
            containers: Vec::new(),
            attachments: Vec::new(),
            labels: None,
            deployment: None,
            draining: None,
            priority: crate::priority::DEFAULT_PRIORITY,
            recovery_from: None,
            enable_execute_command: true,
        }
    }

    /// What its run changed of its definition's containers.
    pub fn overrides(&self) -> Option<&crate::labels::TaskOverride> {
        self.labels.as_ref().and_then(|l| l.overrides.as_ref())
    }

    pub fn tags(&self) -> &[crate::tags::Tag] {
        self.labels.as_ref().map_or(&[], |l| l.tags.as_slice())
    }

    /// Until when the task is protected from scale-in, if it still is at `now_ms`.
    pub fn protected_until(&self, now_ms: u64) -> Option<u64> {
        self.labels.as_ref().and_then(|l| l.protected_until_ms).filter(|&t| t > now_ms)
    }

    /// Whether the task holds GPU capacity: placed and not yet stopped.
    pub fn holds_capacity(&self) -> bool {
        self.host_id.is_some() && self.last_status != TaskStatus::Stopped
    }
}

/// Body of `POST /v1/tasks`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct RunTask {
    /// `family` (latest revision) or `family:revision`.
    pub task_definition: String,
    pub count: u32,
    pub pool: String,
    /// Makes the call idempotent, as ECS's `clientToken`: a retry with the same token and body
    /// gets the first call's tasks (as they are now) instead of new ones; the same token with
    /// another body is refused (409). 1 to 64 printable ASCII characters, kept 24 h.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_token: Option<String>,
    /// What the run changes of its definition's containers (ECS's `overrides`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub overrides: Option<crate::labels::TaskOverride>,
    /// The caller's own label for the run (ECS's `startedBy`, at most 128 characters).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_by: Option<String>,
    /// The run's group (ECS's `group`, at most 255 characters; default `family:<family>`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tags: Vec<crate::tags::Tag>,
    /// 1 to 100 (default: the task definition's `mpsfleet:priority` tag, else 50).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<u32>,
    /// Whether `task exec` may run commands in its tasks (ECS's `enableExecuteCommand`; true
    /// when not given here, false through the ECS API).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enable_execute_command: Option<bool>,
}

/// Body of `POST /v1/tasks/{id}/stop`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct StopTask {
    #[serde(default)]
    pub reason: Option<String>,
}

/// Body of `POST /v1/tasks/{id}/protection` (ECS's task scale-in protection).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ProtectTask {
    /// True protects the task; false ends its protection.
    pub protection_enabled: bool,
    /// For how long: 1 to 2880 minutes, default 120.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_in_minutes: Option<u32>,
}

/// What an agent reports about one of its tasks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct TaskStateReport {
    pub last_status: TaskStatus,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health_status: Option<TaskHealth>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop_code: Option<StopCode>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stopped_reason: Option<String>,
    /// The task's recent output, sent when it changed (at most every 30 s) and with the final
    /// STOPPED report; the server keeps the latest for `task logs` once the host is gone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<crate::logs::LogSnapshot>,
    /// The containers as they are now; sent when they changed (None keeps the last ones).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub containers: Option<Vec<ContainerReport>>,
    /// The task's image pulls, from the first pull's start to the last one's end, as of
    /// the moment the report is sent; the server places them on its clock at the report's
    /// arrival.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pull: Option<PullTiming>,
}

/// An image pull, timed on the agent's monotonic clock relative to a moment (a launch's
/// return, a report's sending): how long before it the pull began, and how long it took.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct PullTiming {
    pub began_ago_ms: u64,
    pub took_ms: u64,
}

/// Why a task waits for placement, as a stable code (its `pendingReason` says it in words).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, utoipa::ToSchema,
)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum PendingCode {
    /// No ACTIVE, uncordoned, healthy host in the pool.
    NoSchedulableHost,
    /// No schedulable host has MPS available.
    NoMpsHost,
    /// No GPU has the MPS memory the task declares free.
    InsufficientGpuMemory,
    /// No host has the idle GPUs the task needs.
    NotEnoughIdleGpus,
    /// The GPUs that would fit wait for their MPS daemon to answer again.
    MpsDaemonsNotAnswering,
    /// The client or compute limits leave no GPU.
    GpuLimits,
    /// The task runs images and no schedulable host runs containers.
    NoContainerHost,
    /// No host that runs containers has room.
    NoFittingContainerHost,
    /// The static host ports it needs are taken on every host that fits.
    HostPortsInUse,
    /// It needs more static host ports than one task may hold.
    TooManyHostPorts,
    /// No host has room now and managed scaling is launching hosts for it (its
    /// `pendingReason` says what room is missing).
    ScalingOut,
    /// It stopped lower-priority tasks to make room and waits for them to stop (its
    /// `pendingReason` names them and the host).
    Preempting,
}

impl PendingCode {
    pub const ALL: [PendingCode; 12] = [
        PendingCode::NoSchedulableHost,
        PendingCode::NoMpsHost,
        PendingCode::InsufficientGpuMemory,
        PendingCode::NotEnoughIdleGpus,
        PendingCode::MpsDaemonsNotAnswering,
        PendingCode::GpuLimits,
        PendingCode::NoContainerHost,
        PendingCode::NoFittingContainerHost,
        PendingCode::HostPortsInUse,
        PendingCode::TooManyHostPorts,
        PendingCode::ScalingOut,
        PendingCode::Preempting,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            PendingCode::NoSchedulableHost => "NO_SCHEDULABLE_HOST",
            PendingCode::NoMpsHost => "NO_MPS_HOST",
            PendingCode::InsufficientGpuMemory => "INSUFFICIENT_GPU_MEMORY",
            PendingCode::NotEnoughIdleGpus => "NOT_ENOUGH_IDLE_GPUS",
            PendingCode::MpsDaemonsNotAnswering => "MPS_DAEMONS_NOT_ANSWERING",
            PendingCode::GpuLimits => "GPU_LIMITS",
            PendingCode::NoContainerHost => "NO_CONTAINER_HOST",
            PendingCode::NoFittingContainerHost => "NO_FITTING_CONTAINER_HOST",
            PendingCode::HostPortsInUse => "HOST_PORTS_IN_USE",
            PendingCode::TooManyHostPorts => "TOO_MANY_HOST_PORTS",
            PendingCode::ScalingOut => "SCALING_OUT",
            PendingCode::Preempting => "PREEMPTING",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_binding_reads_as_the_kernel_lists_it() {
        let b = |ip: &str| NetworkBinding {
            bind_ip: ip.into(),
            container_port: 80,
            host_port: 32768,
            protocol: Protocol::Tcp,
        };
        let table = [
            ("0.0.0.0", "0.0.0.0:32768", true),
            ("", "0.0.0.0:32768", true),
            ("::", "[::]:32768", true),
            ("127.0.0.1", "127.0.0.1:32768", false),
            ("::1", "[::1]:32768", false),
            ("10.1.2.3", "10.1.2.3:32768", false),
        ];
        for (ip, address, every) in table {
            assert_eq!(b(ip).address(), address, "{ip:?}");
            assert_eq!(b(ip).on_every_address(), every, "{ip:?}");
        }
    }
}
