//! Hosts and their GPUs, as registered by an agent and shown by `host describe`.

use crate::ids::{GpuUuid, HostId, PoolName, TaskId};
use serde::{Deserialize, Serialize};

/// Host lifecycle: `REGISTERING -> ONBOARDING -> ACTIVE -> DRAINING -> DEREGISTERED`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum HostStatus {
    Registering,
    Onboarding,
    Active,
    Draining,
    Deregistered,
}

/// Health of a host or of one of its checks; severity order
/// `IMPAIRED > INSUFFICIENT_DATA > INITIALIZING > OK`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum HealthStatus {
    Ok,
    Initializing,
    InsufficientData,
    Impaired,
}

/// Per-GPU sharing mode, as ECS reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum SharingMode {
    Idle,
    NvidiaMps,
    Dedicated,
}

impl SharingMode {
    pub fn as_str(self) -> &'static str {
        match self {
            SharingMode::Idle => "IDLE",
            SharingMode::NvidiaMps => "NVIDIA_MPS",
            SharingMode::Dedicated => "DEDICATED",
        }
    }
}

impl HostStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            HostStatus::Registering => "REGISTERING",
            HostStatus::Onboarding => "ONBOARDING",
            HostStatus::Active => "ACTIVE",
            HostStatus::Draining => "DRAINING",
            HostStatus::Deregistered => "DEREGISTERED",
        }
    }
}

impl HealthStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            HealthStatus::Ok => "OK",
            HealthStatus::Initializing => "INITIALIZING",
            HealthStatus::InsufficientData => "INSUFFICIENT_DATA",
            HealthStatus::Impaired => "IMPAIRED",
        }
    }
}

/// How a host runs tasks: as processes, or as containers on Docker Engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum RuntimeKind {
    #[default]
    Process,
    Docker,
}

impl RuntimeKind {
    pub fn as_str(self) -> &'static str {
        match self {
            RuntimeKind::Process => "process",
            RuntimeKind::Docker => "docker",
        }
    }

    /// Whether the host runs images (and honours the fields only a container runtime can).
    pub fn runs_images(self) -> bool {
        self == RuntimeKind::Docker
    }
}

/// The default ceiling on MPS clients per GPU on Volta and newer.
pub const DEFAULT_MAX_MPS_CLIENTS: u32 = 48;

/// One GPU as the agent discovered it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct GpuInventory {
    pub uuid: GpuUuid,
    pub index: u32,
    pub model: String,
    pub memory_mib: u64,
    /// For example "9.0".
    #[serde(default)]
    pub compute_capability: String,
    /// MPS client contexts this GPU accepts; 48 on Volta and newer unless the host says so.
    #[serde(default = "default_max_clients")]
    pub max_mps_clients: u32,
}

fn default_max_clients() -> u32 {
    DEFAULT_MAX_MPS_CLIENTS
}

/// An NVIDIA H200's memory, as NVML reports it (the emulated GPU of `up`, the benchmarks and
/// the tests).
pub const H200_MEMORY_MIB: u64 = 143_771;

impl GpuInventory {
    /// An emulated H200 (compute capability 9.0, 48 MPS clients): the one fixture of the GPU
    /// the tests, benchmarks and simulations declare.
    pub fn emulated_h200(uuid: GpuUuid, index: u32) -> GpuInventory {
        GpuInventory {
            uuid,
            index,
            model: "H200".into(),
            memory_mib: H200_MEMORY_MIB,
            compute_capability: "9.0".into(),
            max_mps_clients: DEFAULT_MAX_MPS_CLIENTS,
        }
    }
}

/// What an agent sends when it registers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct HostRegistration {
    pub pool: PoolName,
    pub hostname: String,
    pub gpus: Vec<GpuInventory>,
    /// Whether `nvidia-cuda-mps-control` is there to share GPUs.
    pub mps_available: bool,
    /// True when the GPUs were declared rather than discovered through NVML.
    pub emulated: bool,
    /// How the host runs tasks; hosts that predate containers run processes.
    #[serde(default)]
    pub runtime: RuntimeKind,
    /// The runtime's version, e.g. Docker Engine's `20.10.24+dfsg1`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime_version: Option<String>,
    /// The Docker Engine's volume and log drivers (a Docker host's), for the tasks that name one.
    #[serde(default, skip_serializing_if = "RuntimePlugins::is_empty")]
    pub plugins: RuntimePlugins,
    /// Its CPU architecture, zone, cores and memory (agents that predate it send none).
    #[serde(default, skip_serializing_if = "HostPlatform::is_empty")]
    pub platform: HostPlatform,
}

/// What a host is, as ECS names it on a container instance (its attributes
/// `ecs.cpu-architecture` and `ecs.availability-zone`, its registered CPU and MEMORY) and on
/// the tasks it runs (`availabilityZone`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct HostPlatform {
    /// ECS's name of the CPU architecture: `x86_64` or `arm64`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub cpu_architecture: String,
    /// The zone the agent was started in (`--availability-zone`; `local` unless told).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub availability_zone: String,
    /// CPU units, 1,024 a core, as ECS registers an instance's CPU.
    #[serde(default, skip_serializing_if = "is_zero_u64")]
    pub cpu_units: u64,
    /// Memory in MiB, as ECS registers an instance's MEMORY.
    #[serde(default, skip_serializing_if = "is_zero_u64")]
    pub memory_mib: u64,
}

impl HostPlatform {
    /// The longest architecture and zone names a host may report.
    pub const MAX_NAME_BYTES: usize = 64;

    pub fn is_empty(&self) -> bool {
        *self == HostPlatform::default()
    }

    /// Whether `name` may be an architecture or a zone: 1 to [`Self::MAX_NAME_BYTES`]
    /// lowercase letters, digits, '-' and '_'.
    pub fn valid_name(name: &str) -> bool {
        (1..=Self::MAX_NAME_BYTES).contains(&name.len())
            && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
    }
}

/// The stored host record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Host {
    pub id: HostId,
    pub pool: PoolName,
    pub hostname: String,
    pub status: HostStatus,
    pub health_status: HealthStatus,
    pub cordoned: bool,
    pub emulated: bool,
    pub mps_available: bool,
    pub gpus: Vec<GpuInventory>,
    #[serde(default)]
    pub runtime: RuntimeKind,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime_version: Option<String>,
    /// The Docker Engine's volume and log drivers (a Docker host's), for the tasks that name one.
    #[serde(default, skip_serializing_if = "RuntimePlugins::is_empty")]
    pub plugins: RuntimePlugins,
    /// Its architecture, zone, cores and memory as it registered them.
    #[serde(default, skip_serializing_if = "HostPlatform::is_empty")]
    pub platform: HostPlatform,
    /// Registration order; keeps placement deterministic across restarts.
    pub seq: u64,
    pub registered_at_ms: u64,
    /// SHA-256 of the host's credential, hex.
    pub credential_sha256: String,
    /// When `host revoke-credential` ended the credential: it is then refused, and the host
    /// goes the way of one that stops reporting.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credential_revoked_at_ms: Option<u64>,
    /// What older servers stored: the bearer they presented to the agent's own endpoint.
    /// Read, never written again: the server now derives that token from its key and stores
    /// nothing of it.
    #[serde(default, rename = "agentToken", skip_serializing)]
    pub legacy_agent_token: String,
    /// What happened to the host: registered, onboarded, health changes, local daemon
    /// restarts, cordoned, drained, replaced. Durable, bounded ([`History`]).
    ///
    /// [`History`]: crate::history::History
    #[serde(default, skip_serializing_if = "crate::history::History::is_empty")]
    pub events: crate::history::History<crate::service::ObjectEvent>,
    /// How many times an operator asked the agent to re-arm its exhausted local repair
    /// (`host recheck`); the agent acts when the count its heartbeat answer carries goes up.
    #[serde(default, skip_serializing_if = "is_zero_u64")]
    pub rechecks: u64,
}

fn is_zero_u64(n: &u64) -> bool {
    *n == 0
}

/// One health check of a host as its agent reports it, e.g. the MPS daemon of one GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct HostCheck {
    /// `MPS_DAEMON`, `GPU`, `CONTAINER_RUNTIME` or `AGENT`.
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_id: Option<GpuUuid>,
    pub status: HealthStatus,
    pub reason: String,
    /// When the status last changed, milliseconds since the epoch.
    pub since_ms: u64,
    /// Times the agent restarted what the check watches (an MPS daemon) since the agent
    /// started; the server records each new one in the host's events.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub restarts: u32,
    /// How long before this report the first failed signal of the failure going on now was
    /// seen (a failed probe, the daemon's exit), on the agent's clock; the server places it on
    /// its own as the report's arrival minus this, so clock skew never enters. None when
    /// nothing is failing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_failure_age_ms: Option<u64>,
    /// How long before this report each local restart of that failure was made, oldest first
    /// (at most [`MAX_REPAIR_AGES`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub repair_ages_ms: Vec<u64>,
}

impl HostCheck {
    /// A failure going on that local repair has restarted the daemon for: it exited (or
    /// failed to start), which an `MPS_DAEMON` check reports while still OK, before the
    /// failure threshold.
    pub fn restarted_for_failure(&self) -> bool {
        self.first_failure_age_ms.is_some() && !self.repair_ages_ms.is_empty()
    }
}

/// The most local restarts one check may report the ages of.
pub const MAX_REPAIR_AGES: usize = 16;

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// A GPU as `host describe` shows it: inventory plus what is placed on it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct GpuView {
    pub gpu_id: GpuUuid,
    pub index: u32,
    pub model: String,
    pub sharing_mode: SharingMode,
    pub total_memory_mib: u64,
    pub remaining_memory_mib: u64,
    pub client_count: u32,
    pub max_clients: u32,
    pub compute_percent_sum: u32,
}

/// A host as the API returns it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct HostView {
    pub id: HostId,
    pub pool: PoolName,
    pub hostname: String,
    pub status: HostStatus,
    pub health_status: HealthStatus,
    pub cordoned: bool,
    pub emulated: bool,
    pub mps_available: bool,
    #[serde(default)]
    pub runtime: RuntimeKind,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime_version: Option<String>,
    /// The Docker Engine's volume and log drivers (a Docker host's), for the tasks that name one.
    #[serde(default, skip_serializing_if = "RuntimePlugins::is_empty")]
    pub plugins: RuntimePlugins,
    #[serde(default, skip_serializing_if = "HostPlatform::is_empty")]
    pub platform: HostPlatform,
    pub gpus: Vec<GpuView>,
    /// What each task uses of its GPU, as the agent last reported (kept in memory).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpu_use: Vec<TaskGpuUse>,
    pub task_count: u32,
    pub registered_at_ms: u64,
    /// Last heartbeat seen by this server process, milliseconds since the epoch.
    pub last_heartbeat_ms: Option<u64>,
    /// The agent's latest checks (kept in memory; empty until the agent reports).
    #[serde(default)]
    pub checks: Vec<HostCheck>,
    /// Where the agent serves task logs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logs_url: Option<String>,
    /// `sha256:<hex>` of the certificate the agent's logs endpoint serves (pinned by the server).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logs_cert_sha256: Option<String>,
    /// When the host's credential was revoked (`host revoke-credential`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credential_revoked_at_ms: Option<u64>,
    /// The host's events, oldest first (`GET /v1/hosts/{id}` only; lists leave them out).
    #[serde(default, skip_serializing_if = "crate::history::History::is_empty")]
    pub events: crate::history::History<crate::service::ObjectEvent>,
}

/// The drivers a Docker host's engine has, as its `/info` lists them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct RuntimePlugins {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volume: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub log: Vec<String>,
}

impl RuntimePlugins {
    pub fn is_empty(&self) -> bool {
        self.volume.is_empty() && self.log.is_empty()
    }
}

/// The most [`TaskGpuUse`] entries one status report carries.
pub const MAX_GPU_USE_REPORTS: usize = 1024;

/// What one task uses of one GPU, as its host's agent measured it: NVML's figures for the
/// processes on the GPU (MPS clients included), matched to the task's processes; on emulated
/// GPUs, a declared source's.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct TaskGpuUse {
    pub task_id: TaskId,
    pub gpu_id: GpuUuid,
    /// GPU memory its processes hold there.
    #[serde(rename = "memoryUsedMiB")]
    pub memory_used_mib: u64,
    /// The MPS memory it declared there (the limit it runs under); None for a task that
    /// does not share the GPU.
    #[serde(rename = "memoryLimitMiB", default, skip_serializing_if = "Option::is_none")]
    pub memory_limit_mib: Option<u64>,
    /// Its processes' SM utilisation, percent of the GPU; None without a sample.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sm_percent: Option<u32>,
}
