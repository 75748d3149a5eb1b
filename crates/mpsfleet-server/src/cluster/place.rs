//! Placement's rules, shared by every path that places a task (the placement controller,
//! RunTask, StartTask, a service's replicas, an incident's moves): what a task asks of the
//! scheduler ([`request_for`]), the placement a stored task holds ([`placement_of`]), a task's
//! record after the scheduler answered ([`apply_placement`]), and why a task waits. Pure
//! over the state and the scheduler's index: nothing here writes.

use super::error::Error;
use super::state::State;
use mpsfleet_core::scheduler::{Needs, Placement, Request, Scheduler, Tenant, Unplaced};
use mpsfleet_types::policy::ProviderKind;
use mpsfleet_types::priority::PREEMPTION_BACKOFF_MS;
use mpsfleet_types::{HostStatus, PendingCode, PoolName, Task};

/// What `task` asks of the scheduler: its pool, GPU demand, spread group, needs, and who it
/// is for preemption ([`tenant_of`]); `now_ms` stands for its placement time while it has none.
pub(in crate::cluster) fn request_for(
    state: &State,
    sched: &mut Scheduler,
    task: &Task,
    now_ms: u64,
) -> Result<Request, Error> {
    let pool = sched
        .pool(task.pool.as_str())
        .ok_or_else(|| Error::StoreCorrupt(format!("task {} names unknown pool {}", task.id, task.pool)))?;
    let (demand, needs) = state
        .taskdefs()
        .get(&(task.task_definition.family.clone(), task.task_definition.revision))
        .map(|v| {
            let td = &v.value;
            // More static host ports than one task may hold make a task that waits with that
            // reason (`Unplaced::TooManyHostPorts`), not a refused call.
            (td.gpu_demand(), Needs::new(td.needs_container_runtime(), &td.static_host_ports()))
        })
        .ok_or_else(|| {
            Error::StoreCorrupt(format!("task {} names unknown {}", task.id, task.task_definition))
        })?;
    // A service's tasks spread by deployment: a rollout's new tasks spread among themselves, as
    // they will be once the older ones stop.
    let group = task.group.as_ref().map(|g| match &task.deployment {
        Some(d) => sched.group(&format!("{g}/{d}")),
        None => sched.group(g.as_str()),
    });
    Ok(Request { pool, demand, group, needs, tenant: Some(tenant_of(state, task, now_ms)) })
}

/// `task` as preemption weighs it: its priority and age, and its shield: a service's replica
/// placed after one of the service's replicas was preempted is not preempted within
/// [`PREEMPTION_BACKOFF_MS`] of its placement.
pub(in crate::cluster) fn tenant_of(state: &State, task: &Task, now_ms: u64) -> Tenant {
    let placed = task.placed_at_ms.unwrap_or(now_ms);
    let preempted =
        task.group.as_ref().and_then(|g| state.services().get(g)).and_then(|s| s.value.preempted_at_ms);
    let shield_until_ms = match preempted {
        Some(at) if placed >= at => placed + PREEMPTION_BACKOFF_MS,
        _ => 0,
    };
    Tenant {
        id: task.id.0,
        priority: task.priority,
        since_ms: task.created_at_ms,
        shield_until_ms,
        hold: false,
    }
}

/// The priority of a new service or run: `given` (the request's `priority`), else an
/// `mpsfleet:priority` tag of the request, else of its task definition, else 50; out of range
/// is refused naming the field or tag.
pub(in crate::cluster) fn priority_for(
    given: Option<u32>,
    tags: &[mpsfleet_types::tags::Tag],
    td: &mpsfleet_types::TaskDefinition,
) -> Result<u8, Error> {
    use mpsfleet_types::priority::{check_priority, parse_priority_tag, DEFAULT_PRIORITY, PRIORITY_TAG};
    if let Some(p) = given {
        return check_priority("priority", p).map_err(|m| Error::invalid("priority", m));
    }
    let tag = |tags: &[mpsfleet_types::tags::Tag]| {
        tags.iter().find(|t| t.key == PRIORITY_TAG).map(|t| t.value.clone())
    };
    match tag(tags).or_else(|| tag(&td.tags)) {
        Some(v) => parse_priority_tag(&v).map_err(|m| Error::invalid("tags", m)),
        None => Ok(DEFAULT_PRIORITY),
    }
}

/// The stop timeout of a container that names none (the agent's, as ECS's agent).
const DEFAULT_STOP_TIMEOUT_MS: u64 = 30_000;

/// The longest a task of `pool` running now takes to stop once preempted: its service's
/// deregistration delay (it leaves discovery first) plus its containers' longest
/// `stopTimeout`; with no task running, a task with the defaults
/// (`DEFAULT_DEREGISTRATION_DELAY_S` and 30 s).
pub(in crate::cluster) fn victim_stop_ms(state: &State, pool: &PoolName) -> u64 {
    let default =
        u64::from(mpsfleet_types::service::DEFAULT_DEREGISTRATION_DELAY_S) * 1000 + DEFAULT_STOP_TIMEOUT_MS;
    let hosts = state.hosts().iter().enumerate().filter(|(_, e)| &e.host().pool == pool);
    let tasks =
        hosts.flat_map(|(ix, _)| state.tasks().on_host(ix as mpsfleet_core::scheduler::HostIx).iter());
    tasks
        .filter_map(|id| state.tasks().get(id))
        .map(|e| {
            let t = &e.task;
            let delay = (t.group.as_ref())
                .and_then(|g| state.services().get(g))
                .map_or(0, |s| u64::from(s.value.deregistration_delay_seconds) * 1000);
            let stop =
                (state.taskdefs().get(&(t.task_definition.family.clone(), t.task_definition.revision)))
                    .and_then(|td| td.value.container_definitions.iter().filter_map(|c| c.stop_timeout).max())
                    .map_or(DEFAULT_STOP_TIMEOUT_MS, |s| u64::from(s) * 1000);
            delay + stop
        })
        .max()
        .unwrap_or(default)
}

/// The scheduler placement a stored task holds (host and GPU uuids mapped to indices).
pub(in crate::cluster) fn placement_of(state: &State, sched: &Scheduler, task: &Task) -> Option<Placement> {
    let host = sched.host(task.host_id.as_ref()?)?;
    let inv = &state.hosts()[host as usize].host().gpus;
    let first = sched.host_gpus(host).start;
    let gpus = task
        .gpu_ids
        .iter()
        .filter_map(|u| inv.iter().position(|g| &g.uuid == u).map(|p| first + p as u32))
        .collect();
    Some(Placement { host, gpus })
}

/// `task`'s record after the scheduler answered `outcome`: its host and GPUs, or why it waits.
pub(in crate::cluster) fn apply_placement(
    state: &State,
    sched: &Scheduler,
    now_ms: u64,
    task: &mut Task,
    outcome: &Result<Placement, Unplaced>,
    local_runs_images: bool,
) {
    match outcome {
        Ok(p) => {
            let entry = &state.hosts()[p.host as usize];
            let first = sched.host_gpus(p.host).start;
            if task.host_id.as_ref() != Some(&entry.host().id) {
                task.placed_at_ms = Some(now_ms);
            }
            task.host_id = Some(entry.host().id.clone());
            task.gpu_ids =
                p.gpus.iter().map(|&g| entry.host().gpus[(g - first) as usize].uuid.clone()).collect();
            task.pending_reason = None;
            task.pending_code = None;
            task.unplaceable = false;
        }
        Err(unplaced) => {
            let (why, code, unplaceable) = waiting_reason(state, task, unplaced, local_runs_images);
            task.host_id = None;
            task.placed_at_ms = None;
            task.gpu_ids.clear();
            task.pending_reason = Some(why);
            task.pending_code = Some(code);
            task.unplaceable = unplaceable;
        }
    }
}

/// Why a task waits: its reason (naming the task definition's field that asks for what no host
/// offers), its code, and whether nothing will ever place it by itself.
pub(in crate::cluster) fn waiting_reason(
    state: &State,
    task: &Task,
    unplaced: &Unplaced,
    local_runs_images: bool,
) -> (String, PendingCode, bool) {
    let field = || {
        let key = (task.task_definition.family.clone(), task.task_definition.revision);
        let td = state.taskdefs().get(&key);
        td.and_then(|v| v.value.container_runtime_field()).unwrap_or_else(|| "its task definition".into())
    };
    match unplaced {
        Unplaced::NoContainerHost { pool } => {
            let mut why = format!(
                "no schedulable host in pool {pool} runs containers, which {} needs; start an agent with \
                 --runtime docker",
                field()
            );
            let never = !may_ever_run_containers(state, &task.pool, local_runs_images);
            if never {
                why +=
                    "; no host of the pool runs containers and its provider launches none: nothing places \
                        the task until such a host joins";
            }
            (why, unplaced.code(), never)
        }
        Unplaced::NoFittingContainerHost { pool } => (
            format!(
                "no host in pool {pool} that runs containers has room for the task, which {} needs; free \
                 capacity there or start an agent with --runtime docker",
                field()
            ),
            unplaced.code(),
            false,
        ),
        other => (other.to_string(), other.code(), false),
    }
}

/// Whether a host that runs containers is in the pool (in any state but DEREGISTERED: a
/// cordoned or impaired one may come back) or may come from its provider: any but a local one
/// whose agents do not run containers.
fn may_ever_run_containers(state: &State, pool: &PoolName, local_runs_images: bool) -> bool {
    let mut hosts = state.hosts().iter().map(|e| e.host());
    if hosts.any(|h| &h.pool == pool && h.status != HostStatus::Deregistered && h.runtime.runs_images()) {
        return true;
    }
    match state.pools().get(pool).and_then(|p| p.value.provider.as_ref()).map(|pr| pr.kind) {
        None => false,
        Some(ProviderKind::Local) => local_runs_images,
        Some(_) => true,
    }
}

/// What a waiting task's reason adds about managed scaling: hosts being launched (and the
/// code `SCALING_OUT`), or the pool at its `maxHosts`.
pub(in crate::cluster) fn scaling_note(state: &State, pool: &PoolName, launching: usize) -> (String, bool) {
    let none = (String::new(), false);
    let Some(p) = state.pools().get(pool) else { return none };
    let Some((prov, m)) = p.value.provider.as_ref().and_then(|prov| Some((prov, prov.scaling()?))) else {
        return none;
    };
    if launching > 0 {
        (format!("; managed scaling is launching {launching} host(s)"), true)
    } else if prov.desired_hosts >= m.max_hosts {
        (format!("; the pool is at its maxHosts ({})", m.max_hosts), false)
    } else {
        none
    }
}
