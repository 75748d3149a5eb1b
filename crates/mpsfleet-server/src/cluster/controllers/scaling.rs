//! Managed scaling: a pool whose provider has `managedScaling` ENABLED gets its
//! `desiredHosts` from here, on the capacity controller's key (`Work::Capacity`, before it
//! launches what is missing). The decision is pure (`mpsfleet_core::scaling`); this file
//! gathers its input, waits for a burst of waiting tasks to settle, and carries out a step:
//!
//! - **Demand settles first.** A change in the pool's waiting tasks is acted on once none has
//!   come for [`SETTLE_MS`], or [`SETTLE_MAX_MS`] after the first, so a burst gives one sized
//!   step, not many small ones. A task that waits in such a pool asks for the key at once.
//! - **Scale-out** writes the new `desiredHosts` (with a `ScaledOut` pool event saying why);
//!   the capacity controller launches the hosts.
//! - **Scale-in** takes each chosen host out of placement and checks it is still empty in the
//!   same step (no placement can come between: the cluster has one writer), deregisters it
//!   (`ScaledIn` in its events and the pool's) and asks the provider to terminate it. A host
//!   counts as empty when nothing but DAEMON services' tasks runs there, from when the
//!   controller first saw it so (kept in memory: a restarted server starts the quiet time
//!   again, which only delays a scale-in).
//!
//! Repair is apart: incident replacements are launched by remediation and counted as hosts to
//! come, never scaled in, and scale-in waits while an incident is open or a drill runs.

use super::remediation::ProviderJob;
use crate::cluster::error::Error;
use crate::cluster::read::pool_config;
use crate::cluster::work::Work;
use crate::cluster::write::Writer;
use mpsfleet_core::lifecycle::host::can_place;
use mpsfleet_core::scaling::{self, Input, Shape, Step as ScaleStep, Waiting};
use mpsfleet_core::scheduler::HostIx;
use mpsfleet_types::drill::DrillStatus;
use mpsfleet_types::service::{ObjectEvent, SchedulingStrategy};
use mpsfleet_types::*;
use std::collections::{BTreeSet, HashMap};

/// A burst of waiting tasks is acted on once none has come for this long...
pub const SETTLE_MS: u64 = 1_000;
/// ...or this long after its first task.
pub const SETTLE_MAX_MS: u64 = 10_000;

/// What the scaling controller keeps between runs, per pool (in memory only).
#[derive(Debug, Default)]
pub(crate) struct ScalingMemory {
    /// The waiting tasks last seen, and since when (the burst's first, its latest change).
    waiting: usize,
    first_waiting_ms: Option<u64>,
    changed_ms: u64,
    /// When the last scale-out step was taken.
    last_step_ms: Option<u64>,
    /// Since when each empty host of the pool has been seen empty.
    empty_since: HashMap<HostId, u64>,
    /// The last decision in words, and when: shown by `pool explain`.
    pub(crate) last: Option<(u64, String)>,
    /// The last reservation computed: hosts needed per 100 hosts in the pool (`/metrics`).
    pub(crate) reservation_percent: u64,
}

/// What the scaling step borrows of the capacity controller's: its memory of each pool, the
/// hosts asked for and not joined yet, and where the terminations of removed hosts go.
pub(in crate::cluster) struct Borrowed<'a> {
    pub(in crate::cluster) memory: &'a mut HashMap<PoolName, ScalingMemory>,
    pub(in crate::cluster) to_come: u32,
    pub(in crate::cluster) jobs: &'a mut Vec<ProviderJob>,
}

/// The scaling step of `pool` if its provider scales (module docs). Returns how long to
/// wait while a burst of waiting tasks settles, or None once the step is taken (or there
/// is none to take) and the capacity controller may go on.
pub(in crate::cluster) fn scale(
    w: &mut Writer<'_>,
    l: &mut Borrowed<'_>,
    pool: &PoolName,
) -> Result<Option<u64>, Error> {
    let Some(p) = w.state.pools().get(pool).map(|v| v.value.clone()) else { return Ok(None) };
    let Some(prov) = p.provider.as_ref() else { return Ok(None) };
    let (Some(policy), Some(hs)) = (prov.scaling().copied(), prov.host_shape) else { return Ok(None) };
    let shape = Shape {
        gpus: hs.gpus,
        gpu_memory_mib: hs.gpu_memory_mib,
        max_clients: hs.max_mps_clients,
        compute_bound: pool_config(&p).compute_bound,
        cpu: hs.cpu,
        memory_mib: hs.memory_mib,
    };
    let now = w.now_ms;
    let waiting = waiting_demand(w, pool);
    let mem = l.memory.entry(pool.clone()).or_default();
    if waiting.len() != mem.waiting {
        mem.waiting = waiting.len();
        mem.changed_ms = now;
        mem.first_waiting_ms = if waiting.is_empty() { None } else { mem.first_waiting_ms.or(Some(now)) };
    }
    if let Some(first) = mem.first_waiting_ms {
        let due = (mem.changed_ms + SETTLE_MS).min(first + SETTLE_MAX_MS);
        if now < due {
            return Ok(Some(due - now));
        }
    }

    // The pool's hosts: busy ones, and how long each empty ACTIVE one has been empty.
    let mut input = Input { packing: scaling::pack_tasks(&shape, &waiting), ..Default::default() };
    let mut empty: Vec<(u64, HostId)> = Vec::new();
    let mut seen_empty = Vec::new();
    for (ix, e) in w.state.hosts().iter().enumerate() {
        let h = e.host();
        if h.pool != *pool || h.status == HostStatus::Deregistered {
            continue;
        }
        input.hosts += 1;
        if runs_work(w, ix as HostIx) {
            input.busy += 1;
        } else if h.status == HostStatus::Active {
            seen_empty.push(h.id.clone());
        } else {
            // Joining, draining: neither work to keep nor a host to remove yet.
            input.busy += 1;
        }
    }
    let mem = l.memory.entry(pool.clone()).or_default();
    let empty_now: BTreeSet<&HostId> = seen_empty.iter().collect();
    mem.empty_since.retain(|id, _| empty_now.contains(id));
    for (i, id) in seen_empty.into_iter().enumerate() {
        let since = *mem.empty_since.entry(id.clone()).or_insert(now);
        input.empty_for_ms.push((i as u64, now - since));
        empty.push((i as u64, id));
    }
    input.since_last_step_ms = mem.last_step_ms.map(|t| now.saturating_sub(t));
    input.launching = l.to_come;
    input.paused = w.state.incidents().unresolved().any(|i| &i.pool == pool)
        || w.state.drills().values().any(|d| &d.value.pool == pool && d.value.status != DrillStatus::Ended);

    let step = scaling::decide(&policy, &input);
    let (why, desired) = match &step {
        ScaleStep::Hold { why, .. } => (why.clone(), None),
        ScaleStep::Out { add, why, .. } => (why.clone(), Some(input.hosts + input.launching + add)),
        ScaleStep::In { remove, why, .. } => {
            let mut removed = 0;
            for (i, id) in &empty {
                if remove.contains(i) && scale_in_host(w, l, pool, id, why)? {
                    removed += 1;
                }
            }
            (why.clone(), Some((input.hosts + input.launching).saturating_sub(removed)))
        }
    };
    let mem = l.memory.entry(pool.clone()).or_default();
    mem.last = Some((now, why.clone()));
    let have = u64::from(input.hosts + input.launching);
    mem.reservation_percent = u64::from(input.busy + input.packing.hosts) * 100 / have.max(1);
    if let ScaleStep::Out { .. } = step {
        mem.last_step_ms = Some(now);
    }
    if let Some(desired) = desired.filter(|d| *d != prov.desired_hosts) {
        let out = matches!(step, ScaleStep::Out { .. });
        set_desired_hosts(w, pool, desired, if out { "ScaledOut" } else { "ScaledIn" }, why)?;
        if out {
            // The waiting tasks' reasons say that hosts are coming (`placement::scaling_note`).
            w.ask(Work::Placement(pool.clone()));
        }
    }
    Ok(None)
}

/// The pool's waiting tasks as the packing sees them: GPU demand and static host ports.
fn waiting_demand(w: &Writer<'_>, pool: &PoolName) -> Vec<Waiting> {
    let mut last: Option<(&TaskDefRef, Waiting)> = None;
    let mut out = Vec::new();
    for id in w.state.tasks().pending_in(pool) {
        // A preemptor holds the room its victims free: it asks for no host. Its victims' services'
        // replacements wait like any task and are counted.
        let Some(e) = w.state.tasks().get(&id).filter(|e| {
            e.task.desired_status != TaskStatus::Stopped
                && e.task.pending_code != Some(mpsfleet_types::PendingCode::Preempting)
        }) else {
            continue;
        };
        let td = &e.task.task_definition;
        let w = match &last {
            Some((d, w)) if *d == td => w.clone(),
            _ => {
                let Some(def) = w.state.taskdefs().get(&(td.family.clone(), td.revision)) else {
                    continue;
                };
                let ports = (def.value.static_host_ports().iter())
                    .map(|(proto, port)| {
                        (u32::from(*proto == mpsfleet_types::taskdef::Protocol::Udp) << 16) | u32::from(*port)
                    })
                    .collect();
                let (cpu, memory_mib) = task_size(&def.value);
                Waiting { demand: def.value.gpu_demand(), ports, cpu, memory_mib }
            }
        };
        last = Some((td, w.clone()));
        out.push(w);
    }
    out
}

/// Whether a host runs (or holds) a task that is not a DAEMON service's.
fn runs_work(w: &Writer<'_>, ix: HostIx) -> bool {
    w.state.tasks().on_host(ix).iter().filter_map(|id| w.state.tasks().get(id)).any(|e| {
        e.task
            .group
            .as_ref()
            .and_then(|g| w.state.services().get(g))
            .is_none_or(|s| s.value.scheduling_strategy != SchedulingStrategy::Daemon)
    })
}

/// Removes one empty host: out of placement, checked empty, deregistered, terminated
/// through the provider. False when it was not empty after all.
fn scale_in_host(
    w: &mut Writer<'_>,
    l: &mut Borrowed<'_>,
    pool: &PoolName,
    id: &HostId,
    why: &str,
) -> Result<bool, Error> {
    let ix = w.sched.host(id).ok_or_else(|| Error::not_found("host", id.as_str()))?;
    w.sched.set_schedulable(ix, false);
    if runs_work(w, ix) {
        let open = can_place(w.state.hosts()[ix as usize].host());
        w.sched.set_schedulable(ix, open);
        return Ok(false);
    }
    let mut h = w.state.hosts()[ix as usize].host().clone();
    h.events.push(w.now_ms, ObjectEvent::new("ScaledIn", format!("removed by managed scaling: {why}")));
    let name = h.hostname.clone();
    w.write_host(ix, h)?;
    w.deregister(ix, "removed by managed scaling")?;
    l.jobs.push(ProviderJob::Terminate { incident: String::new(), pool: pool.clone(), name });
    Ok(true)
}

/// Writes the provider's new host count, with the pool event that says why.
fn set_desired_hosts(
    w: &mut Writer<'_>,
    pool: &PoolName,
    desired: u32,
    reason: &str,
    why: String,
) -> Result<(), Error> {
    let Some(from) =
        w.state.pools().get(pool).and_then(|p| p.value.provider.as_ref()).map(|p| p.desired_hosts)
    else {
        return Ok(());
    };
    w.change_pool(pool, reason, format!("{from} -> {desired} host(s): {why}"), |p| {
        if let Some(prov) = p.provider.as_mut() {
            prov.desired_hosts = desired;
        }
    })
}

/// A task's CPU units and memory in MiB as a host must hold them: the task-level `cpu` and
/// `memory` when given, else the sum of its containers' (`memory`, or `memoryReservation`).
fn task_size(td: &TaskDefinition) -> (u32, u64) {
    use mpsfleet_core::task_size::{task_cpu_units, task_memory_mib};
    let containers = &td.container_definitions;
    let cpu = td
        .cpu
        .as_deref()
        .and_then(|c| task_cpu_units(c).ok())
        .unwrap_or_else(|| containers.iter().map(|c| c.cpu.unwrap_or(0)).fold(0u32, u32::saturating_add));
    let memory = td.memory.as_deref().and_then(|m| task_memory_mib(m).ok()).unwrap_or_else(|| {
        containers
            .iter()
            .map(|c| c.memory.or(c.memory_reservation).unwrap_or(0))
            .fold(0u64, u64::saturating_add)
    });
    (cpu, memory)
}
