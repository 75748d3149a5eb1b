//! ECS's answer shapes, built from mpsfleet's records: a pool as a `Cluster`, a task
//! definition as a `TaskDefinition`, a task as a `Task` (its containers with their GPUs and
//! `gpuSharingStrategy`), a service as a `Service` with `deployments` and `events`, a host as a
//! `ContainerInstance` (its resources, and its GPUs as `gpuDevices`). Times are epoch seconds.
//! Fields ECS always answers with (empty lists, `launchType: EC2`) are answered here too.

use super::arn::Arns;
use crate::cluster::catalog::PoolContents;
use crate::cluster::AgentLink;
use mpsfleet_types::labels::Tag;
use mpsfleet_types::service::{Deployment, DeploymentView, ServiceView};
use mpsfleet_types::{
    GpuRequirement, HealthStatus, HostStatus, HostView, Pool, ResourceRequirement, Task, TaskDefinition,
    TaskStatus,
};
use serde::Serialize;
use serde_json::{json, Map, Value};

/// Epoch seconds, as ECS's timestamps are, of epoch milliseconds.
pub fn secs(ms: u64) -> f64 {
    ms as f64 / 1000.0
}

/// [`secs`] as JSON.
pub fn seconds(ms: u64) -> Value {
    json!(secs(ms))
}

pub fn tags(tags: &[Tag]) -> Value {
    json!(tags.iter().map(|t| json!({"key": t.key, "value": t.value})).collect::<Vec<_>>())
}

pub fn cluster(a: &Arns, pool: &Pool, n: &PoolContents, with_tags: bool) -> Value {
    let mut v = json!({
        "clusterArn": a.cluster(pool.name.as_str()),
        "clusterName": pool.name.as_str(),
        "status": "ACTIVE",
        "registeredContainerInstancesCount": n.hosts,
        "runningTasksCount": n.running,
        "pendingTasksCount": n.pending,
        "activeServicesCount": n.active_services,
        "statistics": [],
        "settings": [{"name": "containerInsights", "value": "disabled"}],
        "capacityProviders": [],
        "defaultCapacityProviderStrategy": [],
    });
    for (k, kept) in &pool.kept_fields {
        v[k.as_str()] = kept.clone();
    }
    if with_tags && !pool.tags.is_empty() {
        v["tags"] = tags(&pool.tags);
    }
    v
}

/// ECS's `containerDefinitions[]` entry: the definition as registered, with the lists ECS
/// always answers with.
fn container_definition(c: &mpsfleet_types::ContainerDefinition) -> Value {
    let mut v = serde_json::to_value(c).unwrap_or_else(|_| json!({"name": c.name}));
    if let Value::Object(m) = &mut v {
        for list in ["portMappings", "environment", "mountPoints", "volumesFrom"] {
            m.entry(list).or_insert_with(|| json!([]));
        }
        m.entry("cpu").or_insert_with(|| json!(0));
    }
    v
}

pub fn task_definition(a: &Arns, td: &TaskDefinition, with_tags: bool) -> Value {
    let mut m = Map::new();
    for (k, v) in &td.kept_fields {
        m.insert(k.clone(), v.clone());
    }
    m.insert("taskDefinitionArn".into(), json!(a.task_definition(td.family.as_str(), td.revision)));
    m.insert(
        "containerDefinitions".into(),
        json!(td.container_definitions.iter().map(container_definition).collect::<Vec<_>>()),
    );
    m.insert("family".into(), json!(td.family.as_str()));
    m.insert("networkMode".into(), json!(td.network_mode.map_or("bridge", |n| n.as_str())));
    m.insert("revision".into(), json!(td.revision));
    m.insert("volumes".into(), serde_json::to_value(&td.volumes).unwrap_or_else(|_| json!([])));
    m.insert("status".into(), json!(if td.deregistered_at_ms.is_some() { "INACTIVE" } else { "ACTIVE" }));
    m.entry("placementConstraints").or_insert_with(|| json!([]));
    // Every definition runs on the cluster's hosts; one that asked for FARGATE says so too.
    let fargate = td
        .kept_fields
        .get("requiresCompatibilities")
        .and_then(Value::as_array)
        .is_some_and(|l| l.iter().any(|c| c == "FARGATE"));
    m.insert("compatibilities".into(), if fargate { json!(["EC2", "FARGATE"]) } else { json!(["EC2"]) });
    for (k, v) in
        [("cpu", &td.cpu), ("memory", &td.memory), ("pidMode", &td.pid_mode), ("ipcMode", &td.ipc_mode)]
    {
        if let Some(v) = v {
            m.insert(k.into(), json!(v));
        }
    }
    if td.registered_at_ms > 0 {
        m.insert("registeredAt".into(), seconds(td.registered_at_ms));
    }
    if let Some(at) = td.deregistered_at_ms {
        m.insert("deregisteredAt".into(), seconds(at));
    }
    let mut v = Value::Object(m);
    if with_tags {
        v["tags"] = tags(&td.tags);
    }
    v
}

/// The `sharingStrategy` of a container's GPU requirement, if it shares its GPU through MPS.
fn sharing_strategy(c: &mpsfleet_types::ContainerDefinition) -> Option<&mpsfleet_types::SharingStrategy> {
    c.resource_requirements.iter().find_map(|r| match r {
        ResourceRequirement::Gpu(GpuRequirement::Mps { sharing_strategy }) => Some(sharing_strategy),
        ResourceRequirement::Gpu(GpuRequirement::Whole { .. }) => None,
    })
}

/// ECS's `Task`, serialized as it is built (RunTask and DescribeTasks answer many of them: no
/// intermediate JSON tree).
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct EcsTask<'a> {
    task_arn: String,
    cluster_arn: String,
    task_definition_arn: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    container_instance_arn: Option<String>,
    last_status: &'static str,
    desired_status: &'static str,
    health_status: &'static str,
    containers: Vec<EcsContainer<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    cpu: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    memory: Option<String>,
    created_at: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pull_started_at: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pull_stopped_at: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    started_at: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    stopped_at: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    stop_code: Option<mpsfleet_types::StopCode>,
    #[serde(skip_serializing_if = "Option::is_none")]
    stopped_reason: Option<&'a str>,
    started_by: &'a str,
    group: String,
    launch_type: &'static str,
    overrides: Overrides<'a>,
    attachments: &'a [mpsfleet_types::Attachment],
    attributes: Vec<Attribute<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    availability_zone: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    connectivity: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    connectivity_at: Option<f64>,
    enable_execute_command: bool,
    version: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    tags: Option<&'a [Tag]>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Overrides<'a> {
    container_overrides: &'a [mpsfleet_types::labels::ContainerOverride],
    inference_accelerator_overrides: [(); 0],
}

/// An ECS attribute (`{"name": …, "value": …}`).
#[derive(Serialize)]
pub struct Attribute<'a> {
    name: &'static str,
    value: std::borrow::Cow<'a, str>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct EcsContainer<'a> {
    container_arn: String,
    task_arn: String,
    name: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    image: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    image_digest: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    runtime_id: Option<&'a str>,
    last_status: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    exit_code: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<&'a str>,
    network_bindings: Vec<Binding<'a>>,
    network_interfaces: Vec<Interface<'a>>,
    health_status: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    cpu: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    memory: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    memory_reservation: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    gpu_ids: Option<Vec<&'a str>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    gpu_sharing_strategy: Option<&'a mpsfleet_types::SharingStrategy>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Binding<'a> {
    #[serde(rename = "bindIP")]
    bind_ip: &'a str,
    container_port: u16,
    host_port: u16,
    protocol: mpsfleet_types::Protocol,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Interface<'a> {
    attachment_id: &'a str,
    private_ipv4_address: &'a str,
}

/// A task as ECS's `Task`; `td` is what it runs (its definition with its overrides applied),
/// `host` how its host's agent stands (none while it waits for one).
pub fn task<'a>(
    a: &Arns,
    t: &'a Task,
    td: Option<&'a TaskDefinition>,
    host: Option<&AgentLink>,
    with_tags: bool,
) -> EcsTask<'a> {
    let labels = t.labels.as_deref();
    let id = t.id.to_string();
    let task_arn = a.task(t.pool.as_str(), &id);
    let defs = td.map(|d| d.container_definitions.as_slice()).unwrap_or_default();
    let containers = defs
        .iter()
        .map(|c| {
            let report = t.containers.iter().find(|r| r.name == c.name);
            let stopped = report.is_some_and(|r| r.exit_code.is_some());
            EcsContainer {
                container_arn: format!("{task_arn}/{}", c.name),
                task_arn: task_arn.clone(),
                name: &c.name,
                image: c.image.as_deref(),
                image_digest: report.and_then(|r| r.image_digest.as_deref()),
                runtime_id: report.and_then(|r| r.runtime_id.as_deref()),
                last_status: if stopped { TaskStatus::Stopped.as_str() } else { t.last_status.as_str() },
                exit_code: report.and_then(|r| r.exit_code),
                reason: report.and_then(|r| r.reason.as_deref()),
                network_bindings: report
                    .map(|r| {
                        r.network_bindings
                            .iter()
                            .map(|b| Binding {
                                bind_ip: &b.bind_ip,
                                container_port: b.container_port,
                                host_port: b.host_port,
                                protocol: b.protocol,
                            })
                            .collect()
                    })
                    .unwrap_or_default(),
                network_interfaces: report
                    .map(|r| {
                        r.network_interfaces
                            .iter()
                            .map(|n| Interface {
                                attachment_id: &n.attachment_id,
                                private_ipv4_address: &n.private_ipv4_address,
                            })
                            .collect()
                    })
                    .unwrap_or_default(),
                health_status: if c.health_check.is_some() { t.health_status.as_str() } else { "UNKNOWN" },
                cpu: c.cpu.map(|n| n.to_string()),
                memory: c.memory.map(|n| n.to_string()),
                memory_reservation: c.memory_reservation.map(|n| n.to_string()),
                gpu_ids: (!c.resource_requirements.is_empty())
                    .then(|| t.gpu_ids.iter().map(|g| g.as_str()).collect()),
                gpu_sharing_strategy: sharing_strategy(c),
            }
        })
        .collect();
    EcsTask {
        cluster_arn: a.cluster(t.pool.as_str()),
        task_definition_arn: a.task_definition(t.task_definition.family.as_str(), t.task_definition.revision),
        container_instance_arn: t.host_id.as_ref().map(|h| a.container_instance(t.pool.as_str(), h.as_str())),
        task_arn,
        // A replica leaving traffic before its stop is what ECS calls DEACTIVATING (deregistered
        // from its load balancer, not yet sent SIGTERM), already desired STOPPED.
        last_status: if t.draining.is_some() && t.last_status == TaskStatus::Running {
            "DEACTIVATING"
        } else {
            t.last_status.as_str()
        },
        desired_status: ecs_desired(t).as_str(),
        health_status: t.health_status.as_str(),
        containers,
        // As given when the definition sets them; else what its containers add up to, as ECS
        // answers for an EC2 task.
        cpu: td.map(|d| d.cpu.clone().unwrap_or_else(|| task_size(d).0.to_string())),
        memory: td.and_then(|d| d.memory.clone().or_else(|| nonzero(task_size(d).1))),
        created_at: secs(t.created_at_ms),
        pull_started_at: t.pull_started_at_ms.map(secs),
        pull_stopped_at: t.pull_stopped_at_ms.map(secs),
        started_at: t.started_at_ms.map(secs),
        stopped_at: t.stopped_at_ms.map(secs),
        stop_code: t.stop_code,
        stopped_reason: t.stopped_reason.as_deref(),
        started_by: labels.and_then(|l| l.started_by.as_deref()).unwrap_or(&t.started_by),
        group: labels.and_then(|l| l.group.clone()).unwrap_or_else(|| match &t.group {
            Some(s) => format!("service:{s}"),
            None => format!("family:{}", t.task_definition.family),
        }),
        launch_type: "EC2",
        overrides: Overrides {
            container_overrides: t.overrides().map(|o| o.container_overrides.as_slice()).unwrap_or_default(),
            inference_accelerator_overrides: [],
        },
        attachments: &t.attachments,
        attributes: host
            .filter(|h| !h.platform.cpu_architecture.is_empty())
            .map(|h| {
                vec![Attribute {
                    name: "ecs.cpu-architecture",
                    value: std::borrow::Cow::Owned(h.platform.cpu_architecture.clone()),
                }]
            })
            .unwrap_or_default(),
        availability_zone: host.map(|h| h.platform.availability_zone.clone()).filter(|z| !z.is_empty()),
        // Connected once on a host whose agent answers, since it was placed there; else since
        // the agent's last heartbeat.
        connectivity: host.map(|h| if h.connected { "CONNECTED" } else { "DISCONNECTED" }),
        connectivity_at: host
            .and_then(|h| if h.connected { t.placed_at_ms } else { h.last_heartbeat_ms })
            .map(secs),
        // No command runs inside a task from the API yet.
        enable_execute_command: t.enable_execute_command,
        version: 1,
        tags: with_tags.then_some(t.tags()),
    }
}

fn deployment(a: &Arns, pool: &str, service: &str, d: &DeploymentView) -> Value {
    let dep: &Deployment = &d.deployment;
    json!({
        "id": deployment_id(service, &dep.id),
        "status": dep.status.as_str(),
        "taskDefinition": a.task_definition(dep.task_definition.family.as_str(), dep.task_definition.revision),
        "desiredCount": dep.desired_count,
        "pendingCount": d.pending_count,
        "runningCount": d.running_count,
        "failedTasks": dep.failed_tasks,
        "createdAt": seconds(dep.created_at_ms),
        "updatedAt": seconds(dep.updated_at_ms),
        "launchType": "EC2",
        "rolloutState": dep.rollout_state.as_str(),
        "rolloutStateReason": rollout_reason(service, pool, dep),
    })
}

/// ECS's words for a rollout's state, with mpsfleet's reason where it has one (why a rollout
/// failed or was superseded).
fn rollout_reason(service: &str, pool: &str, d: &Deployment) -> String {
    let id = deployment_id(service, &d.id);
    let state = match d.rollout_state {
        mpsfleet_types::service::RolloutState::InProgress => "in progress.",
        mpsfleet_types::service::RolloutState::Completed => "completed.",
        mpsfleet_types::service::RolloutState::Failed => "failed.",
    };
    let why = &d.rollout_state_reason;
    if why.is_empty() || why == "service created" {
        format!("ECS deployment {id} in cluster {pool} {state}")
    } else {
        format!("ECS deployment {id} in cluster {pool} {state} {why}")
    }
}

/// ECS names deployments `ecs-svc/...`: mpsfleet's `d-3` of service `web` is `ecs-svc/web/d-3`.
pub fn deployment_id(service: &str, id: &str) -> String {
    format!("ecs-svc/{service}/{id}")
}

pub fn service(a: &Arns, s: &ServiceView, deployments: &[DeploymentView], with_tags: bool) -> Value {
    let svc = &s.service;
    let pool = svc.pool.as_str();
    let name = svc.name.as_str();
    let events: Vec<Value> = svc
        .events
        .since(0)
        .iter()
        .rev()
        .enumerate()
        .map(|(i, e)| {
            json!({
                "id": format!("{name}-{}", svc.events.pushed().saturating_sub(i as u64)),
                "createdAt": seconds(e.latest_ms()),
                "message": format!("(service {name}) {}: {}", e.event.reason, e.event.message),
            })
        })
        .collect();
    let c = &svc.deployment_configuration;
    let mut v = json!({
        "serviceArn": a.service(pool, name),
        "serviceName": name,
        "clusterArn": a.cluster(pool),
        "loadBalancers": [],
        "serviceRegistries": [],
        "status": svc.status,
        "desiredCount": svc.desired_count,
        "runningCount": s.running_count,
        "pendingCount": s.pending_count,
        "launchType": "EC2",
        "taskDefinition": a.task_definition(svc.task_definition.family.as_str(), svc.task_definition.revision),
        "deploymentConfiguration": {
            "minimumHealthyPercent": c.minimum_healthy_percent,
            "maximumPercent": c.maximum_percent,
            "deploymentCircuitBreaker": {
                "enable": c.deployment_circuit_breaker.enable,
                "rollback": c.deployment_circuit_breaker.rollback,
            },
        },
        "taskSets": [],
        "deployments": deployments.iter().filter(|d| d.deployment.status.as_str() != "INACTIVE").map(|d| deployment(a, pool, name, d)).collect::<Vec<_>>(),
        "events": events,
        "createdAt": seconds(svc.created_at_ms),
        "placementConstraints": [],
        "placementStrategy": [],
        "schedulingStrategy": svc.scheduling_strategy,
        "deploymentController": {"type": "ECS"},
        "propagateTags": "NONE",
        "enableECSManagedTags": false,
        "enableExecuteCommand": svc.enable_execute_command,
    });
    for (k, kept) in &svc.kept_fields {
        v[k.as_str()] = kept.clone();
    }
    if with_tags {
        v["tags"] = tags(&svc.tags);
    }
    v
}

/// ECS's container instance status of a host.
pub fn instance_status(s: HostStatus) -> &'static str {
    match s {
        HostStatus::Registering | HostStatus::Onboarding => "REGISTERING",
        HostStatus::Active => "ACTIVE",
        HostStatus::Draining => "DRAINING",
        HostStatus::Deregistered => "INACTIVE",
    }
}

fn integer(name: &str, value: u64) -> Value {
    json!({"name": name, "type": "INTEGER", "integerValue": value, "doubleValue": 0.0, "longValue": 0})
}

fn string_set(name: &str, values: &[String]) -> Value {
    json!({"name": name, "type": "STRINGSET", "stringSetValue": values, "doubleValue": 0.0, "longValue": 0, "integerValue": 0})
}

fn nonzero(n: u64) -> Option<String> {
    (n > 0).then(|| n.to_string())
}

/// A task's CPU units and memory (MiB) as ECS counts them for an EC2 task: the task-level
/// `cpu` and `memory` when its definition sets them, else the sums of its containers' `cpu`
/// and `memory` (or `memoryReservation`).
pub fn task_size(td: &TaskDefinition) -> (u64, u64) {
    let cpu = td.cpu.as_deref().and_then(|c| mpsfleet_core::task_size::task_cpu_units(c).ok());
    let containers_cpu: u64 = td.container_definitions.iter().map(|c| u64::from(c.cpu.unwrap_or(0))).sum();
    let memory = td.memory.as_deref().and_then(|m| mpsfleet_core::task_size::task_memory_mib(m).ok());
    let containers_memory: u64 =
        td.container_definitions.iter().map(|c| c.memory.or(c.memory_reservation).unwrap_or(0)).sum();
    (cpu.map_or(containers_cpu, u64::from), memory.unwrap_or(containers_memory))
}

/// What a host's live tasks reserve, as ECS counts an instance's remaining resources: each
/// task's [`task_size`], and the host ports its containers are bound to.
#[derive(Debug, Default)]
pub struct Reserved {
    pub cpu_units: u64,
    pub memory_mib: u64,
    pub tcp_ports: std::collections::BTreeSet<u16>,
    pub udp_ports: std::collections::BTreeSet<u16>,
}

impl Reserved {
    pub fn add(&mut self, t: &Task, td: Option<&TaskDefinition>) {
        if let Some(td) = td {
            let (cpu, memory) = task_size(td);
            self.cpu_units += cpu;
            self.memory_mib += memory;
        }
        for b in t.containers.iter().flat_map(|c| &c.network_bindings) {
            match b.protocol {
                mpsfleet_types::Protocol::Udp => self.udp_ports.insert(b.host_port),
                _ => self.tcp_ports.insert(b.host_port),
            };
        }
    }
}

/// A host as ECS's `ContainerInstance`. `used` is what its live tasks reserve; its GPUs are
/// used when a task holds them (whole or shared); `running`/`pending` count its tasks.
pub fn container_instance(
    a: &Arns,
    h: &HostView,
    running: usize,
    pending: usize,
    used: &Reserved,
    agent_connected: bool,
) -> Value {
    let all: Vec<String> = h.gpus.iter().map(|g| g.gpu_id.to_string()).collect();
    let idle: Vec<String> = h
        .gpus
        .iter()
        .filter(|g| g.sharing_mode == mpsfleet_types::SharingMode::Idle)
        .map(|g| g.gpu_id.to_string())
        .collect();
    let gpu_devices: Vec<Value> = h
        .gpus
        .iter()
        .map(|g| {
            json!({
                "gpuId": g.gpu_id.as_str(),
                "sharingMode": g.sharing_mode.as_str(),
                "totalMemoryInMiB": g.total_memory_mib,
                "remainingMemoryInMiB": g.remaining_memory_mib,
                "containerCount": g.client_count,
            })
        })
        .collect();
    let health = match h.health_status {
        HealthStatus::Ok => "OK",
        HealthStatus::Initializing => "INITIALIZING",
        HealthStatus::InsufficientData => "INSUFFICIENT_DATA",
        HealthStatus::Impaired => "IMPAIRED",
    };
    let p = &h.platform;
    let ports = |set: &std::collections::BTreeSet<u16>| set.iter().map(u16::to_string).collect::<Vec<_>>();
    let mut attributes = vec![
        json!({"name": "ecs.os-type", "value": "linux"}),
        json!({"name": "ecs.capability.mps", "value": if h.mps_available { "true" } else { "false" }}),
        json!({"name": "mpsfleet.runtime", "value": h.runtime.as_str()}),
    ];
    if !p.cpu_architecture.is_empty() {
        attributes.push(json!({"name": "ecs.cpu-architecture", "value": p.cpu_architecture}));
    }
    if !p.availability_zone.is_empty() {
        attributes.push(json!({"name": "ecs.availability-zone", "value": p.availability_zone}));
    }
    json!({
        "containerInstanceArn": a.container_instance(h.pool.as_str(), h.id.as_str()),
        "ec2InstanceId": h.hostname,
        "version": 1,
        "versionInfo": {"agentVersion": env!("CARGO_PKG_VERSION"), "dockerVersion": h.runtime_version},
        "registeredResources": [
            integer("CPU", p.cpu_units),
            integer("MEMORY", p.memory_mib),
            string_set("PORTS", &[]),
            string_set("PORTS_UDP", &[]),
            integer("GPU", all.len() as u64),
            string_set("GPU", &all),
        ],
        "remainingResources": [
            integer("CPU", p.cpu_units.saturating_sub(used.cpu_units)),
            integer("MEMORY", p.memory_mib.saturating_sub(used.memory_mib)),
            string_set("PORTS", &ports(&used.tcp_ports)),
            string_set("PORTS_UDP", &ports(&used.udp_ports)),
            integer("GPU", idle.len() as u64),
            string_set("GPU", &idle),
        ],
        "status": instance_status(h.status),
        "statusReason": if h.cordoned { "cordoned: no new tasks are placed here" } else { "" },
        "agentConnected": agent_connected,
        "runningTasksCount": running,
        "pendingTasksCount": pending,
        "attributes": attributes,
        "registeredAt": seconds(h.registered_at_ms),
        "attachments": [],
        "tags": [],
        "healthStatus": {
            "overallStatus": health,
            "details": h.checks.iter().map(|c| json!({
                "type": c.name,
                "status": c.status.as_str(),
                "lastUpdated": seconds(c.since_ms),
                "lastStatusChange": seconds(c.since_ms),
            })).collect::<Vec<_>>(),
        },
        "gpuDevices": gpu_devices,
    })
}

/// A task's desired status as ECS says it: STOPPED already while it drains before its stop
/// (mpsfleet's own record keeps it RUNNING, so its agent runs it on). What `DescribeTasks`
/// answers and `ListTasks` filters on.
pub(super) fn ecs_desired(t: &Task) -> TaskStatus {
    if t.draining.is_some() {
        TaskStatus::Stopped
    } else {
        t.desired_status
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mpsfleet_types::{PoolName, StopCode, TaskDefRef, TaskId};

    /// A replica draining before its stop reads as ECS's DEACTIVATING, desired STOPPED, in
    /// `DescribeTasks`, and `ListTasks` files it under STOPPED by the same rule; once it is not
    /// draining it reads as its own record.
    #[test]
    fn a_draining_replica_is_deactivating_and_desired_stopped() {
        let a = Arns { region: "us-east-2".into(), account: "123456789012".into() };
        let mut t = Task::new(
            TaskId(9),
            TaskDefRef::parse("web:1").unwrap(),
            PoolName::new("gpu").unwrap(),
            None,
            "x".into(),
            1,
        );
        t.last_status = TaskStatus::Running;
        let shown = serde_json::to_value(task(&a, &t, None, None, false)).unwrap();
        assert_eq!(
            (shown["lastStatus"].as_str(), shown["desiredStatus"].as_str()),
            (Some("RUNNING"), Some("RUNNING"))
        );
        assert_eq!(ecs_desired(&t), TaskStatus::Running);
        t.draining = Some(mpsfleet_types::Draining {
            since_ms: 1,
            until_ms: 2_001,
            stop_code: StopCode::UserInitiated,
            reason: "stopped by the user".into(),
        });
        let shown = serde_json::to_value(task(&a, &t, None, None, false)).unwrap();
        assert_eq!(
            (shown["lastStatus"].as_str(), shown["desiredStatus"].as_str()),
            (Some("DEACTIVATING"), Some("STOPPED"))
        );
        assert_eq!(ecs_desired(&t), TaskStatus::Stopped, "ListTasks files it where DescribeTasks says");
    }
}
