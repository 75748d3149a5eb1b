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

use super::*;
use mpsfleet_core::scaling::{self, Input, Shape, Step as ScaleStep, Waiting};
use mpsfleet_types::drill::DrillStatus;
use mpsfleet_types::service::{ObjectEvent, SchedulingStrategy};

/// A burst of waiting tasks is acted on once none has come for this long...
pub const SETTLE_MS: u64 = 1_000;
/// ...or this long after its first task.
pub const SETTLE_MAX_MS: u64 = 10_000;

/// Launch times kept per pool, and launches followed at once (a bound on memory).
const LAUNCH_TIMES_KEPT: usize = 32;
const MAX_LAUNCHES_TRACKED: usize = 10_000;

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

impl Cluster {
    /// The scaling step of `pool` if its provider scales (module docs). Returns how long to
    /// wait while a burst of waiting tasks settles, or None once the step is taken (or there
    /// is none to take) and the capacity controller may go on.
    pub(super) fn scale(&mut self, pool: &PoolName) -> Result<Option<u64>, Error> {
        let Some(p) = self.state.pools().get(pool).map(|v| v.value.clone()) else { return Ok(None) };
        let Some(prov) = p.provider.as_ref() else { return Ok(None) };
        let (Some(policy), Some(hs)) = (prov.scaling().copied(), prov.host_shape) else { return Ok(None) };
        let shape = Shape {
            gpus: hs.gpus,
            gpu_memory_mib: hs.gpu_memory_mib,
            max_clients: hs.max_mps_clients,
            compute_bound: pools::pool_config(&p).compute_bound,
            cpu: hs.cpu,
            memory_mib: hs.memory_mib,
        };
        let now = self.now();
        let waiting = self.waiting_demand(pool);
        let mem = self.work.scaling.entry(pool.clone()).or_default();
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
        for (ix, e) in self.state.hosts().iter().enumerate() {
            let h = e.host();
            if h.pool != *pool || h.status == HostStatus::Deregistered {
                continue;
            }
            input.hosts += 1;
            if self.runs_work(ix as HostIx) {
                input.busy += 1;
            } else if h.status == HostStatus::Active {
                seen_empty.push(h.id.clone());
            } else {
                // Joining, draining: neither work to keep nor a host to remove yet.
                input.busy += 1;
            }
        }
        let mem = self.work.scaling.entry(pool.clone()).or_default();
        let empty_now: BTreeSet<&HostId> = seen_empty.iter().collect();
        mem.empty_since.retain(|id, _| empty_now.contains(id));
        for (i, id) in seen_empty.into_iter().enumerate() {
            let since = *mem.empty_since.entry(id.clone()).or_insert(now);
            input.empty_for_ms.push((i as u64, now - since));
            empty.push((i as u64, id));
        }
        input.since_last_step_ms = mem.last_step_ms.map(|t| now.saturating_sub(t));
        input.launching = self.hosts_to_come(pool);
        input.paused = self.state.incidents().unresolved().any(|i| &i.pool == pool)
            || self
                .state
                .drills()
                .values()
                .any(|d| &d.value.pool == pool && d.value.status != DrillStatus::Ended);

        let step = scaling::decide(&policy, &input);
        let (why, desired) = match &step {
            ScaleStep::Hold { why, .. } => (why.clone(), None),
            ScaleStep::Out { add, why, .. } => (why.clone(), Some(input.hosts + input.launching + add)),
            ScaleStep::In { remove, why, .. } => {
                let mut removed = 0;
                for (i, id) in &empty {
                    if remove.contains(i) && self.scale_in_host(pool, id, why)? {
                        removed += 1;
                    }
                }
                (why.clone(), Some((input.hosts + input.launching).saturating_sub(removed)))
            }
        };
        let mem = self.work.scaling.entry(pool.clone()).or_default();
        mem.last = Some((now, why.clone()));
        let have = u64::from(input.hosts + input.launching);
        mem.reservation_percent = u64::from(input.busy + input.packing.hosts) * 100 / have.max(1);
        if let ScaleStep::Out { .. } = step {
            mem.last_step_ms = Some(now);
        }
        if let Some(desired) = desired.filter(|d| *d != prov.desired_hosts) {
            let out = matches!(step, ScaleStep::Out { .. });
            self.set_desired_hosts(pool, desired, if out { "ScaledOut" } else { "ScaledIn" }, why)?;
            if out {
                // The waiting tasks' reasons say that hosts are coming (`placement::scaling_note`).
                self.ask(Work::Placement(pool.clone()));
            }
        }
        Ok(None)
    }

    /// The pool's waiting tasks as the packing sees them: GPU demand and static host ports.
    fn waiting_demand(&self, pool: &PoolName) -> Vec<Waiting> {
        let mut last: Option<(&TaskDefRef, Waiting)> = None;
        let mut out = Vec::new();
        for id in self.state.tasks().pending_in(pool) {
            let Some(e) =
                self.state.tasks().get(&id).filter(|e| e.task.desired_status != TaskStatus::Stopped)
            else {
                continue;
            };
            let td = &e.task.task_definition;
            let w = match &last {
                Some((d, w)) if *d == td => w.clone(),
                _ => {
                    let Some(def) = self.state.taskdefs().get(&(td.family.clone(), td.revision)) else {
                        continue;
                    };
                    let ports = (def.value.static_host_ports().iter())
                        .map(|(proto, port)| {
                            (u32::from(*proto == mpsfleet_types::taskdef::Protocol::Udp) << 16)
                                | u32::from(*port)
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
    fn runs_work(&self, ix: HostIx) -> bool {
        self.state.tasks().on_host(ix).iter().filter_map(|id| self.state.tasks().get(id)).any(|e| {
            e.task
                .group
                .as_ref()
                .and_then(|g| self.state.services().get(g))
                .is_none_or(|s| s.value.scheduling_strategy != SchedulingStrategy::Daemon)
        })
    }

    /// Removes one empty host: out of placement, checked empty, deregistered, terminated
    /// through the provider. False when it was not empty after all.
    fn scale_in_host(&mut self, pool: &PoolName, id: &HostId, why: &str) -> Result<bool, Error> {
        let ix = self.host_ix(id.as_str())?;
        self.sched.set_schedulable(ix, false);
        if self.runs_work(ix) {
            let open = can_place(self.state.hosts()[ix as usize].host());
            self.sched.set_schedulable(ix, open);
            return Ok(false);
        }
        let mut h = self.state.hosts()[ix as usize].host().clone();
        h.events.push(self.now(), ObjectEvent::new("ScaledIn", format!("removed by managed scaling: {why}")));
        let name = h.hostname.clone();
        self.write_host(ix, h)?;
        self.deregister(ix, "removed by managed scaling")?;
        self.work.pending_jobs.push(ProviderJob::Terminate {
            incident: String::new(),
            pool: pool.clone(),
            name,
        });
        Ok(true)
    }

    /// Writes the provider's new host count, with the pool event that says why.
    fn set_desired_hosts(
        &mut self,
        pool: &PoolName,
        desired: u32,
        reason: &str,
        why: String,
    ) -> Result<(), Error> {
        let Some(from) =
            self.state.pools().get(pool).and_then(|p| p.value.provider.as_ref()).map(|p| p.desired_hosts)
        else {
            return Ok(());
        };
        self.writing(|w| {
            w.change_pool(pool, reason, format!("{from} -> {desired} host(s): {why}"), |p| {
                if let Some(prov) = p.provider.as_mut() {
                    prov.desired_hosts = desired;
                }
            })
        })
    }

    /// A launch of host `name` into `pool` was asked for now (the first ask counts: a
    /// relaunch by name is the same machine).
    pub(super) fn launch_asked(&mut self, pool: &PoolName, name: &str) {
        let now = self.now();
        if self.work.launches_asked.len() < MAX_LAUNCHES_TRACKED {
            self.work.launches_asked.entry((pool.clone(), name.to_string())).or_insert(now);
        }
    }

    /// A host registered: its launch is no longer in flight, and if it was asked for, how
    /// long it took is kept (the latest [`LAUNCH_TIMES_KEPT`] per pool).
    pub(super) fn host_joined(&mut self, pool: &PoolName, name: &str) {
        if let Some(l) = self.work.capacity_launches.get_mut(pool) {
            l.remove(name);
        }
        let Some(asked) = self.work.launches_asked.remove(&(pool.clone(), name.to_string())) else { return };
        let took = self.now().saturating_sub(asked);
        let times = self.work.launch_times.entry(pool.clone()).or_default();
        if times.len() == LAUNCH_TIMES_KEPT {
            times.pop_front();
        }
        times.push_back(took);
    }

    /// The pool's measured launches, from the ask to the host joining, in words beside the
    /// provider's `launchTimeoutSeconds` (`pool explain`); None before the first.
    pub fn launch_times(&self, pool: &PoolName) -> Option<String> {
        let times = self.work.launch_times.get(pool).filter(|t| !t.is_empty())?;
        let mut sorted: Vec<u64> = times.iter().copied().collect();
        sorted.sort_unstable();
        let timeout = self.state.pools().get(pool).and_then(|p| p.value.provider.as_ref()).map(|p| {
            p.launch_timeout_seconds.unwrap_or(match p.kind {
                mpsfleet_types::policy::ProviderKind::Local => 60,
                _ => 600,
            })
        });
        Some(format!(
            "the latest {} launch(es) took {} to join (median), {} at most{}",
            sorted.len(),
            mpsfleet_types::time::secs(sorted[sorted.len() / 2]),
            mpsfleet_types::time::secs(sorted[sorted.len() - 1]),
            timeout.map(|t| format!(", against launchTimeoutSeconds {t}")).unwrap_or_default()
        ))
    }

    /// The last scaling decision of `pool` in words, and when (`pool explain`).
    pub fn last_scaling_decision(&self, pool: &PoolName) -> Option<(u64, String)> {
        self.work.scaling.get(pool).and_then(|m| m.last.clone())
    }
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
