//! The `describe` views, as kubectl's describe shows an object: its fields as `Name:  value`
//! lines, then titled sections (containers, GPUs, checks, ...) and the object's events. Times
//! are UTC. Every value goes through [`output`]'s sanitizing.

use crate::output::{events_section, fields, opt, section, utc_time};
use mpsfleet_types::service::{CircuitBreaker, DeploymentStatus, DeploymentView, SchedulingStrategy};
use mpsfleet_types::taskdef::{GpuRequirement, ResourceRequirement};
use mpsfleet_types::{
    GpuDemand, HealthStatus, History, HostStatus, HostView, IncidentState, IncidentView, ObjectEvent,
    OwnershipMode, Pool, Preemption, ServiceView, Task, TaskDefinition, TaskGpuUse, TaskStatus,
};

/// A duration in the largest unit that keeps it whole: `500ms`, `2s`, `10m`, `1h`.
pub fn duration(ms: u64) -> String {
    match ms {
        0 => "0s".into(),
        ms if ms % 3_600_000 == 0 => format!("{}h", ms / 3_600_000),
        ms if ms % 60_000 == 0 => format!("{}m", ms / 60_000),
        ms if ms % 1000 == 0 => format!("{}s", ms / 1000),
        ms => format!("{ms}ms"),
    }
}

/// A task's GPUs, comma-separated; `-` for none.
pub fn gpus(t: &Task) -> String {
    if t.gpu_ids.is_empty() {
        "-".into()
    } else {
        t.gpu_ids.iter().map(|g| g.as_str()).collect::<Vec<_>>().join(",")
    }
}

fn joined<T: AsRef<str>>(items: &[T]) -> String {
    if items.is_empty() {
        "-".into()
    } else {
        items.iter().map(AsRef::as_ref).collect::<Vec<_>>().join(", ")
    }
}

/// What a container asks of the GPU, from its definition.
fn gpu_limits(def: Option<&TaskDefinition>, container: &str) -> String {
    let Some(c) = def.and_then(|d| d.container_definitions.iter().find(|c| c.name == container)) else {
        return "-".into();
    };
    let limits: Vec<String> = c
        .resource_requirements
        .iter()
        .map(|ResourceRequirement::Gpu(g)| match g {
            GpuRequirement::Whole { value } => format!("{value} whole GPU(s)"),
            GpuRequirement::Mps { sharing_strategy: s } => {
                let m = &s.nvidia_mps;
                match m.max_compute_percent {
                    Some(p) => format!("MPS {} MiB, {p}% compute", m.memory),
                    None => format!("MPS {} MiB", m.memory),
                }
            }
        })
        .collect();
    joined(&limits)
}

/// A task's use of a GPU next to what it declared: `512 MiB of 1024 MiB declared, SM 30%`.
fn use_in_words(u: &TaskGpuUse) -> String {
    let memory = match u.memory_limit_mib {
        Some(limit) => format!("{} MiB of {limit} MiB declared", u.memory_used_mib),
        None => format!("{} MiB", u.memory_used_mib),
    };
    match u.sm_percent {
        Some(p) => format!("{memory}, SM {p}%"),
        None => format!("{memory}, SM -"),
    }
}

/// `task describe`: what it runs and where, its state and times, its containers (exit codes,
/// bindings, GPU and MPS limits) and its events. `def` is the task's definition, when it
/// could be read.
pub fn task(
    t: &Task,
    def: Option<&TaskDefinition>,
    gpu_use: &[TaskGpuUse],
    events: &History<ObjectEvent>,
    trouble: Option<String>,
) -> String {
    let stopped = t.last_status == TaskStatus::Stopped;
    let health = if stopped {
        "-".to_string()
    } else {
        let ready = if t.ready { "ready" } else { "not ready" };
        format!("{}, {ready}", t.health_status.as_str())
    };
    let demand = match def.map(TaskDefinition::gpu_demand) {
        None => "-".to_string(),
        Some(GpuDemand::None) => "no GPU".into(),
        Some(GpuDemand::Whole { count }) => format!("{count} whole GPU(s), DEDICATED"),
        Some(GpuDemand::Mps { memory_mib, clients, compute_percent }) => format!(
            "one GPU shared through MPS: {memory_mib} MiB, {clients} client(s), {compute_percent}% compute"
        ),
    };
    let mut rows = vec![
        ("ID", t.id.to_string()),
        ("Task definition", t.task_definition.to_string()),
        ("Pool", t.pool.to_string()),
        ("Service", opt(&t.group)),
        ("Priority", t.priority.to_string()),
        ("Status", format!("{} (desired {})", t.last_status.as_str(), t.desired_status.as_str())),
        ("Health", health),
        ("Host", opt(&t.host_id)),
        (
            "Host health",
            trouble.unwrap_or_else(|| if t.host_id.is_some() && !stopped { "OK".into() } else { "-".into() }),
        ),
        ("GPUs", gpus(t)),
        ("GPU demand", demand),
        ("Started by", t.started_by.clone()),
        ("Exec", exec_in_words(t.enable_execute_command)),
        ("Created", utc_time(t.created_at_ms)),
        ("Started", t.started_at_ms.map_or("-".into(), utc_time)),
    ];
    if let Some(why) = &t.pending_reason {
        rows.push(("Waiting", why.clone()));
    }
    for u in gpu_use.iter().filter(|u| u.task_id == t.id) {
        rows.push(("GPU use", format!("{}: {}", u.gpu_id, use_in_words(u))));
    }
    if stopped || t.desired_status == TaskStatus::Stopped {
        rows.push(("Stopped", t.stopped_at_ms.map_or("-".into(), utc_time)));
        rows.push(("Stop code", t.stop_code.map_or("-".into(), |c| c.as_str().to_string())));
        rows.push(("Stopped reason", opt(&t.stopped_reason)));
    }
    let mut out = fields(&rows);
    for a in &t.attachments {
        let network = format!("{} {} ({})", a.private_ipv4_address().unwrap_or("-"), a.status, a.id);
        out.push_str(&fields(&[("Network", network)]));
    }
    let containers: Vec<Vec<String>> = t
        .containers
        .iter()
        .map(|c| {
            let bindings: Vec<String> = c
                .network_bindings
                .iter()
                .map(|b| format!("{}->{}/{}", b.address(), b.container_port, b.protocol.as_str()))
                .collect();
            vec![
                c.name.clone(),
                opt(&c.image),
                c.exit_code.map_or("-".into(), |x| x.to_string()),
                joined(&bindings),
                gpu_limits(def, &c.name),
                c.reason.clone().unwrap_or_else(|| "-".into()),
            ]
        })
        .collect();
    out.push_str(&section(
        "Containers",
        &["NAME", "IMAGE", "EXIT CODE", "BINDINGS", "GPU LIMITS", "REASON"],
        &containers,
    ));
    let details: Vec<Vec<String>> = t
        .containers
        .iter()
        .flat_map(|c| {
            let id = c.runtime_id.iter().map(move |v| vec![c.name.clone(), "id".into(), v.clone()]);
            let digest = c.image_digest.iter().map(move |v| vec![c.name.clone(), "digest".into(), v.clone()]);
            let notes = c.notes.iter().map(move |v| vec![c.name.clone(), "note".into(), v.clone()]);
            id.chain(digest).chain(notes)
        })
        .collect();
    if !details.is_empty() {
        out.push_str(&section("Container details", &["CONTAINER", "WHAT", "VALUE"], &details));
    }
    out.push_str(&events_section(events));
    out
}

/// What is wrong, if anything, with the host and the daemon a live task runs on, in words for
/// the describe views: its failing checks (those of the task's GPUs and the host-wide ones),
/// its lifecycle when it is not ACTIVE, and the unresolved incident about it, if any:
/// `IMPAIRED: MPS_DAEMON of GPU-a: daemon exited; incident inc-1 (OPEN, owner operator)`. For
/// a stopped task, only that its host left the fleet (DEREGISTERED).
pub fn host_trouble(t: &Task, hosts: &[HostView], incidents: &[IncidentView]) -> Option<String> {
    let h = hosts.iter().find(|h| Some(&h.id) == t.host_id.as_ref())?;
    if t.last_status == TaskStatus::Stopped {
        // Its host now, for a task that ran there: only a host gone from the fleet is news.
        return (h.status == HostStatus::Deregistered).then(|| format!("host {} DEREGISTERED", h.id));
    }
    let incident = incidents
        .iter()
        .map(|v| &v.incident)
        .find(|i| i.host_id == h.id && i.state != IncidentState::Resolved)
        .map(|i| format!("incident {} ({}, owner {})", i.id, i.state.as_str(), i.owner.as_str()));
    if h.health_status == HealthStatus::Ok && h.status == HostStatus::Active && incident.is_none() {
        return None;
    }
    let failing: Vec<String> = (h.checks.iter())
        .filter(|c| c.status != HealthStatus::Ok)
        .filter(|c| c.gpu_id.as_ref().is_none_or(|g| t.gpu_ids.contains(g)))
        .map(|c| match &c.gpu_id {
            Some(g) => format!("{} of {g}: {}", c.name, c.reason),
            None => format!("{}: {}", c.name, c.reason),
        })
        .collect();
    let mut words = vec![format!("host {} {}", h.id, h.health_status.as_str())];
    if h.status != HostStatus::Active {
        words[0].push_str(&format!(", {}", h.status.as_str()));
    }
    if !failing.is_empty() {
        words[0].push_str(&format!(": {}", failing.join("; ")));
    }
    words.extend(incident);
    Some(words.join("; "))
}

/// `host describe`: identity, lifecycle and health; its GPUs (sharing mode, MPS memory and
/// compute used, clients); its checks with reasons and local restarts; its tasks; its events
/// (local repairs among them).
pub fn host(h: &HostView, tasks: &[Task]) -> String {
    let health = if h.status == HostStatus::Deregistered {
        "- (left the fleet)".to_string()
    } else {
        h.health_status.as_str().to_string()
    };
    let runtime = match &h.runtime_version {
        Some(v) => format!("{} {v}", h.runtime.as_str()),
        None => h.runtime.as_str().into(),
    };
    let mut rows = vec![
        ("ID", h.id.to_string()),
        ("Hostname", h.hostname.clone()),
        ("Pool", h.pool.to_string()),
        ("Status", h.status.as_str().to_string()),
        ("Health", health),
        ("Cordoned", if h.cordoned { "yes: no new tasks".into() } else { "no".into() }),
        (
            "GPUs",
            format!(
                "{} ({}), MPS {}",
                h.gpus.len(),
                if h.emulated { "emulated" } else { "discovered through NVML" },
                if h.mps_available { "available" } else { "not available" }
            ),
        ),
        ("Runtime", runtime),
        ("Tasks", h.task_count.to_string()),
        ("Registered", utc_time(h.registered_at_ms)),
        ("Last heartbeat", h.last_heartbeat_ms.map_or("- (none since this server started)".into(), utc_time)),
    ];
    if let Some(at) = h.credential_revoked_at_ms {
        rows.push(("Credential revoked", utc_time(at)));
    }
    let mut out = fields(&rows);
    let gpu_rows: Vec<Vec<String>> = h
        .gpus
        .iter()
        .map(|g| {
            let used = g.total_memory_mib.saturating_sub(g.remaining_memory_mib);
            vec![
                g.index.to_string(),
                g.gpu_id.to_string(),
                g.model.clone(),
                g.sharing_mode.as_str().into(),
                format!("{used}/{} MiB", g.total_memory_mib),
                format!("{}%", g.compute_percent_sum),
                format!("{}/{}", g.client_count, g.max_clients),
            ]
        })
        .collect();
    out.push_str(&section(
        "GPUs",
        &["INDEX", "UUID", "MODEL", "SHARING", "MPS MEMORY", "COMPUTE", "CLIENTS"],
        &gpu_rows,
    ));
    // The checks of a host that left the fleet are history, not its state.
    let live_checks = if h.status == HostStatus::Deregistered { &[][..] } else { &h.checks[..] };
    let checks: Vec<Vec<String>> = live_checks
        .iter()
        .map(|c| {
            vec![
                c.name.clone(),
                opt(&c.gpu_id),
                c.status.as_str().into(),
                utc_time(c.since_ms),
                c.restarts.to_string(),
                c.reason.clone(),
            ]
        })
        .collect();
    out.push_str(&section(
        "Checks",
        &["CHECK", "GPU", "STATUS", "SINCE", "LOCAL RESTARTS", "REASON"],
        &checks,
    ));
    out.push_str(&placed_tasks("Tasks", tasks.iter(), false));
    let usage: Vec<Vec<String>> = h
        .gpu_use
        .iter()
        .map(|u| {
            vec![
                u.task_id.to_string(),
                u.gpu_id.to_string(),
                format!("{} MiB", u.memory_used_mib),
                u.memory_limit_mib.map_or("-".into(), |m| format!("{m} MiB")),
                u.sm_percent.map_or("-".into(), |p| format!("{p}%")),
            ]
        })
        .collect();
    if !usage.is_empty() {
        out.push_str(&section("GPU use", &["TASK", "GPU", "MEMORY USED", "DECLARED", "SM"], &usage));
    }
    out.push_str(&events_section(&h.events));
    out
}

/// `service describe`: the record in words, its deployments, where its replicas run (by
/// host and GPU), and its events.
pub fn service(
    v: &ServiceView,
    deployments: &[DeploymentView],
    tasks: &[Task],
    hosts: &[HostView],
    incidents: &[IncidentView],
) -> String {
    let s = &v.service;
    let d = &s.deployment_configuration;
    let cb = &d.deployment_circuit_breaker;
    let breaker = if cb.enable {
        let rollback = if cb.rollback { ", rolls back" } else { "" };
        format!("circuit breaker on ({} failed tasks){rollback}", CircuitBreaker::threshold(s.desired_count))
    } else {
        "circuit breaker off".to_string()
    };
    let mut out = fields(&[
        ("Name", s.name.to_string()),
        ("Pool", s.pool.to_string()),
        ("Task definition", s.task_definition.to_string()),
        ("Status", format!("{:?}", s.status).to_uppercase()),
        (
            "Scheduling",
            match s.scheduling_strategy {
                SchedulingStrategy::Replica => "REPLICA".to_string(),
                SchedulingStrategy::Daemon => "DAEMON (one task on each ACTIVE host of the pool)".to_string(),
            },
        ),
        (
            "Tasks",
            if v.health_checked {
                format!(
                    "{} desired, {} healthy, {} running, {} pending",
                    s.desired_count, v.healthy_count, v.running_count, v.pending_count
                )
            } else {
                format!(
                    "{} desired, {} running (no health check), {} pending",
                    s.desired_count, v.running_count, v.pending_count
                )
            },
        ),
        ("Priority", service_priority(s)),
        ("Exec", exec_in_words(s.enable_execute_command)),
        ("Resumption", s.resumption.as_str().to_string()),
        (
            "Deployment",
            format!(
                "at least {}% healthy, at most {}% in all, {breaker}",
                d.minimum_healthy_percent, d.maximum_percent
            ),
        ),
        (
            "Traffic",
            match s.deregistration_delay_seconds {
                0 => "a replica stopped by a deployment or a scale-in stops at once (deregistration delay 0)"
                    .to_string(),
                n => format!(
                    "a replica stopped by a deployment or a scale-in leaves service discovery {n} s before it is stopped"
                ),
            },
        ),
        ("Created", utc_time(s.created_at_ms)),
        ("Updated", utc_time(s.updated_at_ms)),
    ]);
    out.push_str(&section("Deployments", &DEPLOYMENT_HEADERS, &deployment_rows(deployments)));
    // Why tasks of a live deployment stopped, grouped by reason.
    let failures: Vec<Vec<String>> =
        (deployments.iter())
            .filter(|d| d.deployment.status != DeploymentStatus::Inactive)
            .flat_map(|d| {
                let id = &d.deployment.id;
                d.deployment.failures.iter().rev().map(move |g| {
                    vec![id.clone(), g.count.to_string(), utc_time(g.last_at_ms), g.reason.clone()]
                })
            })
            .collect();
    if !failures.is_empty() {
        out.push_str(&section("Failed tasks", &["DEPLOYMENT", "COUNT", "LAST", "STOP REASON"], &failures));
    }
    // Replicas whose host or daemon is impaired: counted healthy by their own checks, but the
    // work is at risk, and the incident says who acts.
    let troubled: Vec<Vec<String>> = (tasks.iter())
        .filter(|t| t.last_status != TaskStatus::Stopped)
        .filter_map(|t| Some(vec![t.id.to_string(), host_trouble(t, hosts, incidents)?]))
        .collect();
    if !troubled.is_empty() {
        out.push_str(&section("Replicas on impaired hosts", &["TASK", "HOST HEALTH"], &troubled));
    }
    // Replicas out of service discovery, waiting for their stop.
    let leaving: Vec<Vec<String>> = (tasks.iter())
        .filter(|t| t.desired_status != TaskStatus::Stopped)
        .filter_map(|t| {
            let d = t.draining.as_ref()?;
            Some(vec![t.id.to_string(), utc_time(d.since_ms), utc_time(d.until_ms), d.reason.clone()])
        })
        .collect();
    if !leaving.is_empty() {
        out.push_str(&section("Leaving traffic", &["TASK", "SINCE", "STOPPED AT", "WHY"], &leaving));
    }
    let live = tasks.iter().filter(|t| t.last_status != TaskStatus::Stopped);
    out.push_str(&placed_tasks("Replicas", live, true));
    // Each replica's place in the service's traffic, as service discovery publishes it.
    let traffic: Vec<Vec<String>> = (v.traffic.iter())
        .map(|r| vec![r.task_id.to_string(), traffic_word(r.state).to_string(), r.why.clone()])
        .collect();
    if !traffic.is_empty() {
        out.push_str(&section("Traffic by replica", &["TASK", "STATE", "WHY"], &traffic));
    }
    out.push_str(&events_section(&s.events));
    out
}

/// A service's priority, and when one of its replicas was last preempted.
fn service_priority(s: &mpsfleet_types::Service) -> String {
    match s.preempted_at_ms {
        Some(at) => format!("{}; a replica was last preempted at {}", s.priority, utc_time(at)),
        None => s.priority.to_string(),
    }
}

/// A replica's traffic state as `service describe` says it.
fn traffic_word(s: mpsfleet_types::discovery::TrafficState) -> &'static str {
    use mpsfleet_types::discovery::TrafficState as T;
    match s {
        T::Joining => "JOINING",
        T::In => "IN",
        T::Leaving => "LEAVING (weight 0)",
        T::Out => "OUT",
    }
}

/// A section of tasks where they run, sorted by where: (host,) GPUs, task, definition,
/// status, health.
fn placed_tasks<'a>(title: &str, tasks: impl Iterator<Item = &'a Task>, with_host: bool) -> String {
    let mut rows: Vec<Vec<String>> = tasks
        .map(|t| {
            let mut row = if with_host { vec![opt(&t.host_id)] } else { Vec::new() };
            row.extend([
                gpus(t),
                t.id.to_string(),
                t.task_definition.to_string(),
                t.last_status.as_str().into(),
                t.health_status.as_str().into(),
            ]);
            row
        })
        .collect();
    rows.sort();
    let headers = ["HOST", "GPUS", "TASK", "TASK DEFINITION", "LAST", "HEALTH"];
    section(title, &headers[usize::from(!with_host)..], &rows)
}

/// `pool describe`: the pool's policies in words.
pub fn pool(p: &Pool) -> String {
    let mode = match p.mode {
        OwnershipMode::Managed => "managed: mpsfleet detects a bad host, drains it, replaces it and moves its tasks",
        OwnershipMode::SelfManaged => {
            "self-managed: mpsfleet detects a bad host and reports it; the operator drains, replaces and moves"
        }
    };
    let strategy = match p.strategy {
        mpsfleet_types::PlacementStrategy::Binpack => {
            "binpack: the fullest GPU that still fits, keeping whole GPUs free"
        }
        mpsfleet_types::PlacementStrategy::Spread => "spread: the emptiest GPU that fits",
    };
    let compute = match p.compute_overcommit_percent {
        Some(c) => format!("the MPS clients of one GPU may declare at most {c}% compute in all"),
        None => "no bound on the compute the MPS clients of one GPU declare".into(),
    };
    let h = &p.health_policy;
    let health = format!(
        "an agent silent for {} is IMPAIRED; each MPS daemon is probed every {} (timeout {}) and is \
         IMPAIRED after {} failed probes in a row; the agent restarts a daemon locally up to {} times; \
         a host IMPAIRED for {} is declared bad and an incident opens",
        duration(h.agent_heartbeat_grace_ms),
        duration(h.mps_probe_interval_ms),
        duration(h.mps_probe_timeout_ms),
        h.mps_failure_threshold,
        h.local_daemon_restarts,
        duration(h.toleration_ms)
    );
    let r = &p.remediation_policy;
    let remediation = match p.mode {
        OwnershipMode::Managed => format!(
            "at most {} replacements at once and {} per {}; none while more than {}% of the pool is \
             unhealthy (storm breaker)",
            r.max_in_flight,
            r.rate_limit.max,
            duration(r.rate_limit.per_ms),
            r.storm_breaker_percent
        ),
        OwnershipMode::SelfManaged => "none automatic: the operator acts on each incident".into(),
    };
    let provider = match &p.provider {
        None => "none: hosts join with a join token".to_string(),
        Some(pr) => {
            let mut s = format!("{} keeps {} host(s)", pr.kind.as_str(), pr.desired_hosts);
            if let Some(name) = &pr.name {
                s.push_str(&format!(" (exec provider {name})"));
            }
            if let Some(shape) = &pr.host_shape {
                s.push_str(&format!(
                    "; each with {} GPU(s) of {} MiB and {} MPS clients",
                    shape.gpus, shape.gpu_memory_mib, shape.max_mps_clients
                ));
            }
            s
        }
    };
    let user = if p.allow_task_users {
        "process tasks run as the user their definition names"
    } else {
        "process tasks run as an unprivileged user of their own"
    };
    fields(&[
        ("Name", p.name.to_string()),
        ("Mode", mode.to_string()),
        ("Placement", strategy.to_string()),
        ("Compute", compute),
        ("Health", health),
        ("Remediation", remediation),
        ("Provider", provider),
        ("Task user", user.to_string()),
        ("Task policy allows", task_policy_cell(&p.task_policy)),
        ("Preemption", preemption_words(p.preemption)),
        (
            "Restart copies",
            match p.restart_copies {
                mpsfleet_types::policy::RestartCopies::FirstExit => {
                    "first-exit: a restart service's replicas on an MPS daemon that exits get copies elsewhere at once"
                }
                mpsfleet_types::policy::RestartCopies::Confirmed => {
                    "confirmed: a restart service's replicas get copies elsewhere once their daemon's failure is confirmed"
                }
            }
            .into(),
        ),
        (
            "Max resume",
            p.max_resume_seconds.map_or_else(
                || "no limit on the recovery bound".into(),
                |s| {
                    format!(
                        "{}: a policy bounding first failure to resumed past it is refused",
                        duration(u64::from(s) * 1000)
                    )
                },
            ),
        ),
        ("Created", utc_time(p.created_at_ms)),
    ]) + &events_section(&p.events)
}

/// A pool's preemption policy in words: who may stop lower-priority tasks to make room.
fn preemption_words(p: Preemption) -> String {
    let gap = mpsfleet_types::priority::PREEMPTION_GAP;
    match p {
        Preemption::Off => "off: a task that finds no room waits for capacity".into(),
        Preemption::Recovery => format!(
            "recovery: a service replica replacing one lost to a host's or MPS daemon's failure may stop \
             tasks at least {gap} priority below it to make room"
        ),
        Preemption::All => {
            format!("all: a task that finds no room may stop tasks at least {gap} priority below it")
        }
    }
}

/// The columns of a service's deployments, as `service deployments` and `service describe`
/// list them.
pub(crate) const DEPLOYMENT_HEADERS: [&str; 9] =
    ["ID", "STATUS", "TASK DEFINITION", "ROLLOUT", "DESIRED", "HEALTHY", "RUNNING", "PENDING", "FAILED"];

pub(crate) fn deployment_rows(list: &[DeploymentView]) -> Vec<Vec<String>> {
    list.iter()
        .map(|v| {
            let d = &v.deployment;
            vec![
                d.id.clone(),
                d.status.as_str().into(),
                d.task_definition.to_string(),
                d.rollout_state.as_str().into(),
                d.desired_count.to_string(),
                v.healthy_count.to_string(),
                v.running_count.to_string(),
                v.pending_count.to_string(),
                d.failed_tasks.to_string(),
            ]
        })
        .collect()
}

/// What a pool's task policy allows, e.g. `privileged,hostNetwork`, or `none`.
pub(crate) fn task_policy_cell(p: &mpsfleet_types::TaskPolicy) -> String {
    let allowed: Vec<&str> = [
        (p.allow_privileged, "privileged"),
        (p.allow_host_network, "hostNetwork"),
        (p.allow_host_namespaces, "hostNamespaces"),
        (p.allow_host_paths, "hostPaths"),
        (p.allow_capabilities, "capabilities"),
        (p.allow_devices, "devices"),
    ]
    .into_iter()
    .filter_map(|(on, name)| on.then_some(name))
    .collect();
    if allowed.is_empty() {
        "none".into()
    } else {
        allowed.join(",")
    }
}

/// Whether `task exec` may run commands in a task (its `enableExecuteCommand`).
fn exec_in_words(on: bool) -> String {
    if on {
        "allowed (enableExecuteCommand)".into()
    } else {
        "refused: started with enableExecuteCommand false".into()
    }
}

#[cfg(test)]
mod tests {
    use super::duration;

    #[test]
    fn bindings_show_the_address_as_bound() {
        let t: mpsfleet_types::Task = serde_json::from_value(serde_json::json!({
            "id": "t-0000000000000001", "taskDefinition": "web:1", "pool": "p",
            "lastStatus": "RUNNING", "desiredStatus": "RUNNING", "healthStatus": "HEALTHY",
            "startedBy": "run:x", "createdAtMs": 1, "containers": [{"name": "web", "networkBindings": [
                {"bindIp": "0.0.0.0", "containerPort": 8080, "hostPort": 32768, "protocol": "tcp"},
                {"bindIp": "::1", "containerPort": 53, "hostPort": 5353, "protocol": "udp"},
            ]}],
        }))
        .expect("task json");
        let out = super::task(&t, None, &[], &Default::default(), None);
        assert!(out.contains("0.0.0.0:32768->8080/tcp"), "{out}");
        assert!(out.contains("[::1]:5353->53/udp"), "{out}");
    }

    /// A task on an impaired host names the failing check of its own GPU (not another's) and
    /// the open incident; on a healthy host, nothing.
    #[test]
    fn a_tasks_impaired_host_and_its_incident_are_named() {
        use mpsfleet_types::*;
        let t: Task = serde_json::from_value(serde_json::json!({
            "id": "t-0000000000000001", "taskDefinition": "web:1", "pool": "p", "hostId": "h-1",
            "gpuIds": ["GPU-a"], "lastStatus": "RUNNING", "desiredStatus": "RUNNING",
            "healthStatus": "HEALTHY", "startedBy": "run:x", "createdAtMs": 1,
        }))
        .unwrap();
        let check = |gpu: &str, status, reason: &str| HostCheck {
            name: "MPS_DAEMON".into(),
            gpu_id: Some(GpuUuid::new(gpu).unwrap()),
            status,
            reason: reason.into(),
            since_ms: 1,
            restarts: 0,
            first_failure_age_ms: None,
            repair_ages_ms: Vec::new(),
        };
        let mut host: HostView = serde_json::from_value(serde_json::json!({
            "id": "h-1", "pool": "p", "hostname": "a", "status": "ACTIVE", "healthStatus": "OK",
            "cordoned": false, "emulated": true, "mpsAvailable": true, "gpus": [], "taskCount": 1,
            "registeredAtMs": 1, "lastHeartbeatMs": 2,
        }))
        .unwrap();
        assert_eq!(super::host_trouble(&t, std::slice::from_ref(&host), &[]), None);
        host.health_status = HealthStatus::Impaired;
        host.checks = vec![
            check("GPU-a", HealthStatus::Impaired, "daemon exited; local restarts exhausted"),
            check("GPU-b", HealthStatus::Impaired, "another GPU's"),
        ];
        let trigger = Trigger {
            check: "MPS_DAEMON".into(),
            gpu_id: None,
            reason: "daemon exited".into(),
            evidence: "e".into(),
            first_failure_at_ms: None,
            local_repairs_at_ms: Vec::new(),
            earlier_repairs_at_ms: Vec::new(),
        };
        let pool = PoolName::new("p").unwrap();
        let open =
            Incident::open("inc-1".into(), host.id.clone(), pool, IncidentOwner::Operator, trigger, 5, 5);
        let words = super::host_trouble(&t, &[host], &[IncidentView::of(open)]).unwrap();
        assert_eq!(
            words,
            "host h-1 IMPAIRED: MPS_DAEMON of GPU-a: daemon exited; local restarts exhausted; incident inc-1 \
             (OPEN, owner operator)"
        );
    }

    /// A stopped task whose host left the fleet says so; it never says its host is OK.
    #[test]
    fn a_stopped_tasks_host_is_not_said_to_be_ok() {
        use mpsfleet_types::*;
        let t: Task = serde_json::from_value(serde_json::json!({
            "id": "t-0000000000000001", "taskDefinition": "web:1", "pool": "p", "hostId": "h-1",
            "lastStatus": "STOPPED", "desiredStatus": "STOPPED", "healthStatus": "UNKNOWN",
            "startedBy": "run:x", "createdAtMs": 1,
        }))
        .unwrap();
        let mut host: HostView = serde_json::from_value(serde_json::json!({
            "id": "h-1", "pool": "p", "hostname": "a", "status": "DEREGISTERED", "healthStatus": "OK",
            "cordoned": false, "emulated": true, "mpsAvailable": true, "gpus": [], "taskCount": 0,
            "registeredAtMs": 1, "lastHeartbeatMs": 2,
        }))
        .unwrap();
        let trouble = super::host_trouble(&t, std::slice::from_ref(&host), &[]);
        assert_eq!(trouble.as_deref(), Some("host h-1 DEREGISTERED"));
        let out = super::task(&t, None, &[], &Default::default(), trouble);
        assert!(
            out.lines().any(|l| l.starts_with("Host health") && l.ends_with("host h-1 DEREGISTERED")),
            "{out}"
        );
        host.status = HostStatus::Active;
        let trouble = super::host_trouble(&t, &[host], &[]);
        let out = super::task(&t, None, &[], &Default::default(), trouble);
        let line = out.lines().find(|l| l.starts_with("Host health")).unwrap();
        assert!(line.ends_with('-') && !line.contains("OK"), "{out}");
    }

    /// Task and service describe name the priority; a pool's the preemption policy in words.
    #[test]
    fn priorities_and_the_preemption_policy_are_shown() {
        let t: mpsfleet_types::Task = serde_json::from_value(serde_json::json!({
            "id": "t-0000000000000001", "taskDefinition": "web:1", "pool": "p",
            "lastStatus": "STOPPED", "desiredStatus": "STOPPED", "healthStatus": "UNKNOWN",
            "startedBy": "run:x", "createdAtMs": 1, "priority": 20, "stopCode": "Preempted",
            "stoppedReason": "preempted: stopped to make room",
        }))
        .expect("task json");
        let out = super::task(&t, None, &[], &Default::default(), None);
        assert!(out.lines().any(|l| l.starts_with("Priority") && l.ends_with(" 20")), "{out}");
        assert!(out.lines().any(|l| l.starts_with("Stop code") && l.ends_with("Preempted")), "{out}");
        // A task stored before enableExecuteCommand existed reads as the REST default.
        assert!(
            out.lines().any(|l| l.starts_with("Exec") && l.ends_with("allowed (enableExecuteCommand)")),
            "{out}"
        );
        let off = mpsfleet_types::Task { enable_execute_command: false, ..t.clone() };
        let out = super::task(&off, None, &[], &Default::default(), None);
        assert!(out.lines().any(|l| l.starts_with("Exec") && l.contains("refused")), "{out}");
        let mut s: mpsfleet_types::Service = serde_json::from_value(serde_json::json!({
            "name": "api", "pool": "p", "taskDefinition": "web:1", "desiredCount": 1,
            "status": "ACTIVE", "createdAtMs": 1, "updatedAtMs": 1,
        }))
        .expect("service json");
        assert_eq!(super::service_priority(&s), "50");
        s.priority = 90;
        s.preempted_at_ms = Some(0);
        let words = super::service_priority(&s);
        assert!(words.starts_with("90; a replica was last preempted at 1970-01-01T00:00:00"), "{words}");
        use mpsfleet_types::Preemption;
        assert!(super::preemption_words(Preemption::Off).starts_with("off: "));
        assert!(super::preemption_words(Preemption::All).contains("at least 10 priority below"));
        assert!(super::preemption_words(Preemption::Recovery).starts_with("recovery: a service replica"));
    }

    #[test]
    fn durations_in_the_largest_whole_unit() {
        assert_eq!(duration(0), "0s");
        assert_eq!(duration(250), "250ms");
        assert_eq!(duration(2000), "2s");
        assert_eq!(duration(600_000), "10m");
        assert_eq!(duration(3_600_000), "1h");
        assert_eq!(duration(1500), "1500ms");
    }
}
