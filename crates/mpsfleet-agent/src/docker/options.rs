//! Volumes and Linux options of a container, mapped to Docker's create call as ECS's agent
//! maps them (shared/design/ecs-on-docker.md sections 1 and 2). Pure; pinned field by field by
//! the tests in `spec.rs`.

use super::names::{container_name, LABEL_HOST, LABEL_TASK};
use super::DockerLaunch;
use bollard::models::{DeviceMapping, HostConfig, ResourcesUlimits};
use mpsfleet_types::{NetworkMode, TaskDefinition, Volume};
use std::collections::HashMap;

const MIB: i64 = 1 << 20;

/// The label on every Docker volume the runtime creates for a task, next to the host and task
/// labels: the task's volume name.
pub const LABEL_VOLUME: &str = "io.mpsfleet.volume";

/// The task's pause container's name within the task: the holder of the namespaces
/// `pidMode: task` and `ipcMode: task` share (ECS's namespace pause container).
pub const NAMESPACE_HOLDER: &str = ".pause";

/// How a task's volume reaches Docker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VolumeSource {
    /// `host.sourcePath`: a bind mount of that host path.
    HostPath(String),
    /// A Docker volume the runtime creates for the task and removes with it: `host: {}`, no
    /// kind, or `dockerVolumeConfiguration` with scope `task`.
    Task {
        docker_name: String,
        driver: String,
        driver_opts: HashMap<String, String>,
        labels: HashMap<String, String>,
    },
    /// `dockerVolumeConfiguration` with scope `shared`: the Docker volume named as the volume,
    /// created when missing only with `autoprovision`, never removed.
    Shared {
        docker_name: String,
        autoprovision: bool,
        driver: String,
        driver_opts: HashMap<String, String>,
        labels: HashMap<String, String>,
    },
    /// A kind only AWS provides (EFS, FSx): nothing to mount (the server refuses such tasks).
    AwsOnly(String),
}

/// `mpsfleet-<host>-<task>-<volume>`, sanitised as container names are: deterministic, so a
/// restarted agent finds and removes it.
pub fn task_volume_name(host_id: &str, task_id: &str, volume: &str) -> String {
    container_name(host_id, task_id, volume)
}

/// How `volume` of the task reaches Docker.
pub fn volume_source(host_id: &str, task_id: &str, volume: &Volume) -> VolumeSource {
    if let Some(kind) = volume.aws_only.keys().next() {
        return VolumeSource::AwsOnly(kind.clone());
    }
    if let Some(path) = volume.host.as_ref().and_then(|h| h.source_path.clone()) {
        return VolumeSource::HostPath(path);
    }
    let cfg = volume.docker_volume_configuration.clone().unwrap_or_default();
    let driver = cfg.driver.unwrap_or_else(|| "local".to_string());
    let driver_opts: HashMap<String, String> = cfg.driver_opts.into_iter().collect();
    let mut labels: HashMap<String, String> = cfg.labels.into_iter().collect();
    if cfg.scope.as_deref() == Some("shared") {
        return VolumeSource::Shared {
            docker_name: volume.name.clone(),
            autoprovision: cfg.autoprovision.unwrap_or(false),
            driver,
            driver_opts,
            labels,
        };
    }
    labels.insert(LABEL_HOST.to_string(), host_id.to_string());
    labels.insert(LABEL_TASK.to_string(), task_id.to_string());
    labels.insert(LABEL_VOLUME.to_string(), volume.name.clone());
    VolumeSource::Task {
        docker_name: task_volume_name(host_id, task_id, &volume.name),
        driver,
        driver_opts,
        labels,
    }
}

/// The Docker volumes the container's mount points need, in mount order, without repeats.
pub fn volumes_needed(l: &DockerLaunch, host_id: &str) -> Vec<VolumeSource> {
    let task_id = l.task.id.to_string();
    let mut out: Vec<VolumeSource> = Vec::new();
    for m in &l.container.mount_points {
        let Some(v) = find(&l.definition, &m.source_volume) else { continue };
        let s = volume_source(host_id, &task_id, v);
        if matches!(s, VolumeSource::Task { .. } | VolumeSource::Shared { .. }) && !out.contains(&s) {
            out.push(s);
        }
    }
    out
}

fn find<'a>(d: &'a TaskDefinition, name: &str) -> Option<&'a Volume> {
    d.volumes.iter().find(|v| v.name == name)
}

/// Sets the container's volumes and Linux options on `hc`, and returns its `Hostname`.
///
/// - `mountPoints` → `Binds` `<source>:<containerPath>[:ro]`, the source being the host path,
///   the task's Docker volume or the shared volume's name; `volumesFrom` → `VolumesFrom`
///   `<that container's Docker name>[:ro]`.
/// - `linuxParameters`: capabilities → `CapAdd`/`CapDrop`; devices → `Devices` (container
///   path defaulting to the host path, permissions as cgroup letters, `rwm` by default);
///   `initProcessEnabled` → `Init` (true unless it is false: Docker's init forwards the stop
///   signal); `sharedMemorySize` MiB → `ShmSize` bytes; tmpfs → `Tmpfs` `path` →
///   `<mountOptions>,size=<size>m`; `maxSwap` with `memory` → `MemorySwap` = memory + maxSwap
///   (bytes; 0 means no swap), and then `swappiness` → `MemorySwappiness` (ECS's default 60).
/// - `ulimits` → `Ulimits`; `systemControls` → `Sysctls`; `privileged` → `Privileged`;
///   `readonlyRootFilesystem` → `ReadonlyRootfs`; `dnsServers` → `Dns`; `dnsSearchDomains` →
///   `DnsSearch`; `extraHosts` → `ExtraHosts` `host:ip`; `hostname` → `Hostname`. In `awsvpc`
///   the DNS, extra hosts and hostname belong to the task's namespace, not to a container
///   that joins it (Docker refuses them there): they are left out, as ECS leaves them out.
/// - `pidMode`/`ipcMode`: `host` → `host`, ipc `none` → `none`, `task` → `container:<the task's
///   pause container>` (it holds the namespaces all the task's containers share).
pub fn apply(l: &DockerLaunch, host_id: &str, hc: &mut HostConfig) -> Option<String> {
    let c = &l.container;
    let task_id = l.task.id.to_string();
    let mut binds: Vec<String> = hc.binds.take().unwrap_or_default();
    for m in &c.mount_points {
        let Some(v) = find(&l.definition, &m.source_volume) else { continue };
        let source = match volume_source(host_id, &task_id, v) {
            VolumeSource::HostPath(p) => p,
            VolumeSource::Task { docker_name, .. } | VolumeSource::Shared { docker_name, .. } => docker_name,
            VolumeSource::AwsOnly(_) => continue,
        };
        let ro = if m.read_only { ":ro" } else { "" };
        binds.push(format!("{source}:{}{ro}", m.container_path));
    }
    hc.binds = (!binds.is_empty()).then_some(binds);
    let from: Vec<String> = c
        .volumes_from
        .iter()
        .map(|f| {
            let ro = if f.read_only { ":ro" } else { "" };
            format!("{}{ro}", container_name(host_id, &task_id, &f.source_container))
        })
        .collect();
    hc.volumes_from = (!from.is_empty()).then_some(from);

    if let Some(lp) = &c.linux_parameters {
        if let Some(caps) = &lp.capabilities {
            hc.cap_add = (!caps.add.is_empty()).then(|| caps.add.clone());
            hc.cap_drop = (!caps.drop.is_empty()).then(|| caps.drop.clone());
        }
        if !lp.devices.is_empty() {
            hc.devices = Some(
                lp.devices
                    .iter()
                    .map(|d| DeviceMapping {
                        path_on_host: Some(d.host_path.clone()),
                        path_in_container: Some(
                            d.container_path.clone().unwrap_or_else(|| d.host_path.clone()),
                        ),
                        cgroup_permissions: Some(cgroup_permissions(&d.permissions)),
                    })
                    .collect(),
            );
        }
        if lp.init_process_enabled == Some(false) {
            hc.init = Some(false);
        }
        hc.shm_size = lp.shared_memory_size.map(mib_to_bytes);
        if !lp.tmpfs.is_empty() {
            let map = lp
                .tmpfs
                .iter()
                .map(|t| {
                    let mut opts = t.mount_options.clone();
                    opts.push(format!("size={}m", t.size));
                    (t.container_path.clone(), opts.join(","))
                })
                .collect();
            hc.tmpfs = Some(map);
        }
        if let (Some(swap), Some(memory)) = (lp.max_swap, hc.memory) {
            hc.memory_swap = Some(memory.saturating_add(mib_to_bytes(swap)));
            hc.memory_swappiness = Some(i64::from(lp.swappiness.unwrap_or(60)));
        }
    }
    if !c.ulimits.is_empty() {
        hc.ulimits = Some(
            c.ulimits
                .iter()
                .map(|u| ResourcesUlimits {
                    name: Some(u.name.clone()),
                    soft: Some(u.soft_limit),
                    hard: Some(u.hard_limit),
                })
                .collect(),
        );
    }
    if !c.system_controls.is_empty() {
        hc.sysctls = Some(c.system_controls.iter().map(|s| (s.namespace.clone(), s.value.clone())).collect());
    }
    hc.privileged = c.privileged;
    hc.readonly_rootfs = c.readonly_root_filesystem;
    let holder = || format!("container:{}", container_name(host_id, &task_id, NAMESPACE_HOLDER));
    hc.pid_mode = match l.definition.pid_mode.as_deref() {
        Some("host") => Some("host".into()),
        Some("task") => Some(holder()),
        _ => None,
    };
    hc.ipc_mode = match l.definition.ipc_mode.as_deref() {
        Some("host") => Some("host".into()),
        Some("none") => Some("none".into()),
        Some("task") => Some(holder()),
        _ => None,
    };
    if l.definition.network_mode == Some(NetworkMode::Awsvpc) {
        return None;
    }
    hc.dns = (!c.dns_servers.is_empty()).then(|| c.dns_servers.clone());
    hc.dns_search = (!c.dns_search_domains.is_empty()).then(|| c.dns_search_domains.clone());
    let extra: Vec<String> =
        c.extra_hosts.iter().map(|h| format!("{}:{}", h.hostname, h.ip_address)).collect();
    hc.extra_hosts = (!extra.is_empty()).then_some(extra);
    c.hostname.clone()
}

/// What the runtime does differently from these fields of the definition.
pub fn notes(l: &DockerLaunch) -> Vec<String> {
    let c = &l.container;
    let mut out = Vec::new();
    if let Some(lp) = &c.linux_parameters {
        if lp.max_swap.is_some() && c.memory.is_none() {
            out.push(
                "linuxParameters.maxSwap is not applied: Docker limits swap only with a memory limit \
                 (set memory)"
                    .to_string(),
            );
        }
        if lp.swappiness.is_some() && lp.max_swap.is_none() {
            out.push("linuxParameters.swappiness is not applied without maxSwap, as on ECS".to_string());
        }
    }
    let awsvpc = l.definition.network_mode == Some(NetworkMode::Awsvpc);
    if awsvpc {
        for (set, field) in [
            (!c.dns_servers.is_empty(), "dnsServers"),
            (!c.dns_search_domains.is_empty(), "dnsSearchDomains"),
            (!c.extra_hosts.is_empty(), "extraHosts"),
            (c.hostname.is_some(), "hostname"),
        ] {
            if set {
                out.push(format!(
                    "{field} is not applied in awsvpc: the task's namespace has its own, as on ECS"
                ));
            }
        }
    }
    out
}

fn cgroup_permissions(perms: &[String]) -> String {
    if perms.is_empty() {
        return "rwm".to_string();
    }
    let mut s = String::new();
    for (name, letter) in [("read", 'r'), ("write", 'w'), ("mknod", 'm')] {
        if perms.iter().any(|p| p == name) {
            s.push(letter);
        }
    }
    s
}

fn mib_to_bytes(mib: u64) -> i64 {
    i64::try_from(mib).unwrap_or(i64::MAX).saturating_mul(MIB)
}

/// Whether the task's containers share PID or IPC namespaces (`pidMode`/`ipcMode` `task`),
/// held by its pause container.
pub fn shares_namespaces(d: &TaskDefinition) -> bool {
    d.pid_mode.as_deref() == Some("task") || d.ipc_mode.as_deref() == Some("task")
}

/// The pause container's IPC namespace is made shareable when the task's containers share it.
pub fn pause_namespaces(d: &TaskDefinition, hc: &mut HostConfig) {
    if d.ipc_mode.as_deref() == Some("task") {
        hc.ipc_mode = Some("shareable".into());
    }
}
