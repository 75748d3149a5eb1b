//! Task definitions: the validated, ECS-shaped spec and the GPU demand derived from it.
//!
//! The JSON a user registers is parsed and checked by `mpsfleet_core::taskdef`; what comes out
//! is a [`TaskDefinition`], which serializes back in ECS's own field names so that
//! `taskdef describe` shows what ECS would.

use crate::ids::Family;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// One registered revision of a task definition family.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct TaskDefinition {
    pub family: Family,
    pub revision: u32,
    pub container_definitions: Vec<ContainerDefinition>,
    /// ECS `networkMode` as given; None means the default (`bridge` on a container host).
    /// Only container hosts honour it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network_mode: Option<NetworkMode>,
    /// Task-level CPU as ECS takes it: CPU units ("1024") or vCPUs ("1 vcpu"), kept as given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<String>,
    /// Task-level memory as ECS takes it: MiB ("2048") or GB ("2 GB"), kept as given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<String>,
    /// The volumes the containers' `mountPoints` name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volumes: Vec<Volume>,
    /// ECS `pidMode`: `host` or `task`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid_mode: Option<String>,
    /// ECS `ipcMode`: `host`, `task` or `none`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipc_mode: Option<String>,
    /// Registration time, milliseconds since the Unix epoch.
    #[serde(default)]
    pub registered_at_ms: u64,
    /// When it was deregistered (ECS's `INACTIVE`): tasks and services that run it go on, no
    /// new ones start from it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deregistered_at_ms: Option<u64>,
    /// Its tags (ECS's task definition tags).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tags: Vec<crate::tags::Tag>,
    /// ECS fields mpsfleet takes without acting on them (`taskRoleArn`,
    /// `requiresCompatibilities`, `placementConstraints`, ...), kept as they were registered so
    /// that a description shows them.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub kept_fields: std::collections::BTreeMap<String, serde_json::Value>,
}

/// ECS `networkMode`. `awsvpc` runs each task in a network namespace of its own on a Docker
/// network of the host, with an address of its own (docs/containers.md, "Networking").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum NetworkMode {
    Bridge,
    Host,
    None,
    Awsvpc,
}

impl NetworkMode {
    pub fn as_str(self) -> &'static str {
        match self {
            NetworkMode::Bridge => "bridge",
            NetworkMode::Host => "host",
            NetworkMode::None => "none",
            NetworkMode::Awsvpc => "awsvpc",
        }
    }
}

/// A transport protocol of a port mapping or binding.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Serialize,
    Deserialize,
    Default,
    utoipa::ToSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum Protocol {
    #[default]
    Tcp,
    Udp,
}

impl Protocol {
    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::Tcp => "tcp",
            Protocol::Udp => "udp",
        }
    }
}

/// ECS `portMappings[]`. `host_port` None (or 0 in the document) lets Docker choose in bridge
/// mode; in host mode it equals `container_port`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct PortMapping {
    pub container_port: u16,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_port: Option<u16>,
    #[serde(default)]
    pub protocol: Protocol,
    /// ECS's name of the mapping (Service Connect): the port's name in service discovery
    /// (`_<name>._tcp.<service>.<pool>.mpsfleet.`, docs/traffic.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ContainerDefinition {
    pub name: String,
    /// The image to run (`repository[:tag]` or `repository@digest`). Only container hosts run
    /// it; on a process host the command runs as a process and the image is reported unused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// CPU units (1024 = one vCPU): Docker CPU shares.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<u32>,
    /// Hard memory limit in MiB: the container is killed when it goes past it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<u64>,
    /// Soft memory limit in MiB.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_reservation: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub working_directory: Option<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub docker_labels: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub port_mappings: Vec<PortMapping>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub entry_point: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub command: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub environment: Vec<KeyValuePair>,
    pub essential: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// Seconds between SIGTERM and SIGKILL when the task is stopped (ECS default 30).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop_timeout: Option<u32>,
    /// Liveness, as in ECS.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health_check: Option<HealthCheck>,
    /// mpsfleet's own: must pass once before liveness and readiness start counting.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub startup_check: Option<HealthCheck>,
    /// mpsfleet's own: failing takes the task out of "ready" without stopping it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub readiness_check: Option<HealthCheck>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub resource_requirements: Vec<ResourceRequirement>,
    /// Containers of the task this one starts after, and on what condition.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub depends_on: Vec<ContainerDependency>,
    /// Seconds to wait for this container's dependencies before giving up (ECS `startTimeout`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_timeout: Option<u32>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mount_points: Vec<MountPoint>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volumes_from: Vec<VolumeFrom>,
    /// Environment variables whose values come from stored secrets (`valueFrom` names one).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub secrets: Vec<SecretRef>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub linux_parameters: Option<LinuxParameters>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ulimits: Vec<Ulimit>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub system_controls: Vec<SystemControl>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub privileged: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub readonly_root_filesystem: Option<bool>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dns_servers: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dns_search_domains: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub extra_hosts: Vec<ExtraHost>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hostname: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub log_configuration: Option<LogConfiguration>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repository_credentials: Option<RepositoryCredentials>,
}

/// ECS `dependsOn[]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ContainerDependency {
    pub container_name: String,
    pub condition: DependencyCondition,
}

/// When a dependency is met, as in ECS.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum DependencyCondition {
    /// The dependency has started.
    Start,
    /// The dependency has exited, with any code.
    Complete,
    /// The dependency has exited 0.
    Success,
    /// The dependency's health check passed.
    Healthy,
}

impl DependencyCondition {
    pub fn as_str(self) -> &'static str {
        match self {
            DependencyCondition::Start => "START",
            DependencyCondition::Complete => "COMPLETE",
            DependencyCondition::Success => "SUCCESS",
            DependencyCondition::Healthy => "HEALTHY",
        }
    }
}

/// ECS `volumes[]`: exactly one kind, or none (an empty Docker volume for the task).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Volume {
    pub name: String,
    /// A bind mount of a host path (`host.sourcePath`); with no path, a volume of the task.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<HostVolume>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub docker_volume_configuration: Option<DockerVolumeConfiguration>,
    /// Kinds that need AWS (`efsVolumeConfiguration`, `fsxWindowsFileServerVolumeConfiguration`),
    /// kept as given so that the definition describes as registered; a task needing one is
    /// refused. Flattened: they describe under their own ECS names.
    #[serde(default, flatten, skip_serializing_if = "BTreeMap::is_empty")]
    pub aws_only: BTreeMap<String, serde_json::Value>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct HostVolume {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_path: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct DockerVolumeConfiguration {
    /// `task` (removed with the task, the default) or `shared` (outlives it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub autoprovision: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub driver: Option<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub driver_opts: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
}

/// ECS `mountPoints[]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct MountPoint {
    pub source_volume: String,
    pub container_path: String,
    #[serde(default)]
    pub read_only: bool,
}

/// ECS `volumesFrom[]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct VolumeFrom {
    pub source_container: String,
    #[serde(default)]
    pub read_only: bool,
}

/// ECS `secrets[]` (and `logConfiguration.secretOptions[]`): `name` is what the container sees,
/// `value_from` the name of a stored secret (an ARN string is a valid name).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct SecretRef {
    pub name: String,
    pub value_from: String,
}

/// ECS `linuxParameters`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct LinuxParameters {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capabilities: Option<KernelCapabilities>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub devices: Vec<Device>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub init_process_enabled: Option<bool>,
    /// MiB of `/dev/shm`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shared_memory_size: Option<u64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tmpfs: Vec<Tmpfs>,
    /// MiB of swap; with `memory`, Docker's memory-swap is their sum.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_swap: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub swappiness: Option<u32>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct KernelCapabilities {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub add: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub drop: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Device {
    pub host_path: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container_path: Option<String>,
    /// `read`, `write`, `mknod`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub permissions: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Tmpfs {
    pub container_path: String,
    /// MiB.
    pub size: u64,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mount_options: Vec<String>,
}

/// ECS `ulimits[]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Ulimit {
    pub name: String,
    pub soft_limit: i64,
    pub hard_limit: i64,
}

/// ECS `systemControls[]`: a namespaced kernel parameter.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct SystemControl {
    pub namespace: String,
    pub value: String,
}

/// ECS `extraHosts[]`: a line of the container's `/etc/hosts`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ExtraHost {
    pub hostname: String,
    pub ip_address: String,
}

/// ECS `logConfiguration`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct LogConfiguration {
    pub log_driver: String,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub options: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub secret_options: Vec<SecretRef>,
}

/// ECS `repositoryCredentials`: the stored secret that holds the registry's credentials.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct RepositoryCredentials {
    pub credentials_parameter: String,
    /// The credentials themselves: filled in memory by the agent right before the pull, from
    /// the stored secret; never serialized.
    #[serde(skip)]
    pub resolved: Option<crate::secret::RegistryAuth>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct KeyValuePair {
    pub name: String,
    pub value: String,
}

/// ECS health check shape. `command[0]` is `CMD` or `CMD-SHELL` as in ECS, or one of
/// mpsfleet's probe kinds `HTTP-GET <url>` and `TCP-CONNECT <host:port>`.
/// Times are seconds; defaults are ECS's (30, 5, 3, 0).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct HealthCheck {
    pub command: Vec<String>,
    pub interval: u32,
    pub timeout: u32,
    pub retries: u32,
    pub start_period: u32,
}

/// The GPU entry of `resourceRequirements`, already checked: exactly one of the two forms.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(tag = "type")]
pub enum ResourceRequirement {
    #[serde(rename = "GPU")]
    Gpu(GpuRequirement),
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(untagged)]
pub enum GpuRequirement {
    /// `{"type":"GPU","sharingStrategy":{"nvidiaMps":{...}}}`
    Mps {
        #[serde(rename = "sharingStrategy")]
        sharing_strategy: SharingStrategy,
    },
    /// `{"type":"GPU","value":"2"}`: whole GPUs (ECS writes the count as a string).
    Whole { value: String },
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct SharingStrategy {
    pub nvidia_mps: NvidiaMps,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct NvidiaMps {
    /// Pinned device memory limit in MiB; what placement reserves.
    pub memory: u64,
    /// Active thread percentage cap, 1..=100; a limit, not a reservation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_compute_percent: Option<u8>,
}

/// What a whole task asks of the GPUs of one host, derived from its containers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(tag = "kind", rename_all = "camelCase")]
pub enum GpuDemand {
    /// No GPU: the task runs on any schedulable host of its pool.
    None,
    /// `count` whole GPUs of one host, each DEDICATED to this task.
    Whole { count: u32 },
    /// One GPU shared through MPS. `memory_mib` is the sum over the MPS containers, `clients`
    /// how many of them there are (each is one MPS client), `compute_percent` the sum of their
    /// maxComputePercent with an undeclared limit counted as 100.
    #[serde(rename_all = "camelCase")]
    Mps { memory_mib: u64, clients: u32, compute_percent: u32 },
}

impl TaskDefinition {
    pub fn reference(&self) -> crate::ids::TaskDefRef {
        crate::ids::TaskDefRef { family: self.family.clone(), revision: self.revision }
    }

    /// The task's GPU demand. Assumes a validated definition (all GPU containers use one form).
    pub fn gpu_demand(&self) -> GpuDemand {
        let mut demand = GpuDemand::None;
        for c in &self.container_definitions {
            for ResourceRequirement::Gpu(req) in &c.resource_requirements {
                demand = match (demand, req) {
                    (GpuDemand::None, GpuRequirement::Whole { value }) => {
                        GpuDemand::Whole { count: value.parse().unwrap_or(0) }
                    }
                    (GpuDemand::Whole { count }, GpuRequirement::Whole { value }) => {
                        GpuDemand::Whole { count: count + value.parse::<u32>().unwrap_or(0) }
                    }
                    (GpuDemand::None, GpuRequirement::Mps { sharing_strategy: s }) => GpuDemand::Mps {
                        memory_mib: s.nvidia_mps.memory,
                        clients: 1,
                        compute_percent: compute_of(&s.nvidia_mps),
                    },
                    (
                        GpuDemand::Mps { memory_mib, clients, compute_percent },
                        GpuRequirement::Mps { sharing_strategy: s },
                    ) => GpuDemand::Mps {
                        memory_mib: memory_mib + s.nvidia_mps.memory,
                        clients: clients + 1,
                        compute_percent: compute_percent + compute_of(&s.nvidia_mps),
                    },
                    // Mixed forms are refused at registration; keep the first form seen.
                    (d, _) => d,
                };
            }
        }
        demand
    }
}

fn compute_of(mps: &NvidiaMps) -> u32 {
    u32::from(mps.max_compute_percent.unwrap_or(100))
}

impl TaskDefinition {
    /// Whether the task can only run on a container host: some container has no command of its
    /// own (it runs the image's), or uses a field only a container runtime honours.
    pub fn needs_container_runtime(&self) -> bool {
        self.container_runtime_field().is_some()
    }

    /// The first field that makes the task need a container runtime, as its path in the task
    /// definition with what it asks (for the reason a task waits for a host that runs
    /// containers); None for a task a process host can run.
    pub fn container_runtime_field(&self) -> Option<String> {
        for (i, c) in self.container_definitions.iter().enumerate() {
            if let Some(f) = c.container_runtime_field() {
                return Some(format!("containerDefinitions[{i}].{f}"));
            }
        }
        if self.network_mode.is_some_and(|m| m != NetworkMode::Bridge) {
            return Some("networkMode (only a container runtime makes a task's network)".into());
        }
        if self.pid_mode.is_some() {
            return Some("pidMode (only a container runtime honours it)".into());
        }
        if self.ipc_mode.is_some() {
            return Some("ipcMode (only a container runtime honours it)".into());
        }
        None
    }

    /// The network mode a container host runs the task in: as given, `bridge` by default.
    pub fn effective_network_mode(&self) -> NetworkMode {
        self.network_mode.unwrap_or(NetworkMode::Bridge)
    }

    /// The host ports the task needs for itself, as ECS accounts them: every static `hostPort`
    /// in bridge mode, every port in host mode; none in awsvpc mode (its ports are on the
    /// task's own address). Sorted, without duplicates.
    pub fn static_host_ports(&self) -> Vec<(Protocol, u16)> {
        let mode = self.effective_network_mode();
        let mut ports: Vec<(Protocol, u16)> = self
            .container_definitions
            .iter()
            .flat_map(|c| &c.port_mappings)
            .filter_map(|m| match mode {
                NetworkMode::None | NetworkMode::Awsvpc => None,
                NetworkMode::Host => Some((m.protocol, m.host_port.unwrap_or(m.container_port))),
                NetworkMode::Bridge => m.host_port.filter(|&p| p != 0).map(|p| (m.protocol, p)),
            })
            .collect();
        ports.sort_unstable();
        ports.dedup();
        ports
    }
}

impl ContainerDefinition {
    /// No `command` or `entryPoint` (the image's own is run), or a field that only a container
    /// runtime honours.
    pub fn needs_container_runtime(&self) -> bool {
        self.container_runtime_field().is_some()
    }

    /// The first field of the container that only a container runtime honours, with why.
    fn container_runtime_field(&self) -> Option<&'static str> {
        let honoured = [
            (self.cpu.is_some(), "cpu (only a container runtime honours it)"),
            (self.memory.is_some(), "memory (only a container runtime honours it)"),
            (self.memory_reservation.is_some(), "memoryReservation (only a container runtime honours it)"),
            (self.working_directory.is_some(), "workingDirectory (only a container runtime honours it)"),
            (!self.docker_labels.is_empty(), "dockerLabels (only a container runtime honours them)"),
            (!self.port_mappings.is_empty(), "portMappings (only a container runtime maps ports)"),
            (
                self.uses_container_options(),
                "volumes or Linux options (only a container runtime honours them)",
            ),
        ];
        if self.command.is_empty() && self.entry_point.is_empty() {
            return Some("image (no command or entryPoint: the image's own command runs)");
        }
        honoured.into_iter().find(|(set, _)| *set).map(|(_, f)| f)
    }

    /// Volumes or Linux options only a container runtime honours.
    pub fn uses_container_options(&self) -> bool {
        !self.mount_points.is_empty()
            || !self.volumes_from.is_empty()
            || self.linux_parameters.is_some()
            || !self.ulimits.is_empty()
            || !self.system_controls.is_empty()
            || self.privileged.is_some()
            || self.readonly_root_filesystem.is_some()
            || !self.dns_servers.is_empty()
            || !self.dns_search_domains.is_empty()
            || !self.extra_hosts.is_empty()
            || self.hostname.is_some()
    }

    /// The container's GPU requirement, if it has one.
    pub fn gpu(&self) -> Option<&GpuRequirement> {
        self.resource_requirements.iter().map(|ResourceRequirement::Gpu(g)| g).next()
    }
}
