//! Managed scaling of a pool: how many hosts of the provider's shape its demand needs, and the
//! step to take now (ECS's capacity provider managed scaling, with mpsfleet's scale-in limits).
//!
//! - **Packing.** Waiting tasks are packed onto new hosts of the pool's host shape as the
//!   scheduler would place them: whole-GPU tasks first (largest first, each on one host with
//!   that many idle GPUs), then MPS tasks, largest memory first, each onto the fullest GPU that
//!   still holds its memory, clients and compute (best fit decreasing). Two tasks that bind the
//!   same static host port never share a host, as the scheduler places them. A task that fits
//!   no empty host of the shape is left out: it never scales the pool. Tasks without GPUs ride
//!   along on any host (the scheduler's own rule: they need no GPU). When the host shape gives
//!   CPU and memory, a task's `cpu` and `memory` count against them too (the machines to buy
//!   must hold them; the scheduler itself places by GPUs and ports).
//! - **Reservation.** ECS's `CapacityProviderReservation = M / N × 100`: M the hosts needed
//!   (those running work, plus the new ones the waiting tasks pack onto), N the hosts in the
//!   pool (with launches in flight). The target is `ceil(M × 100 / targetCapacity)`, within
//!   `minHosts..=maxHosts`.
//! - **Scale-out** takes the step to the target at once, at least `minimumScalingStepSize`
//!   and at most `maximumScalingStepSize`, never past `maxHosts`, and none while a previous
//!   step is within `instanceWarmupPeriod` with hosts still to join.
//! - **Scale-in** removes only empty hosts (no task but DAEMON services' tasks) that have been
//!   empty for `scaleInAfterSeconds`, at most `scaleInBudgetPercent` of the pool per step (at
//!   least one), never below `minHosts` nor below the target; never while an incident is open
//!   or a drill runs in the pool (the caller says so with `paused`).
//!
//! Pure: the server's capacity controller gathers the input (`cluster/scaling.rs`), the
//! `bench scaling` command times it.

use mpsfleet_types::scaling::ManagedScaling;
use mpsfleet_types::taskdef::GpuDemand;
use std::collections::BTreeMap;

/// The hosts a provider launches, as the packing sees them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    pub gpus: u32,
    pub gpu_memory_mib: u64,
    pub max_clients: u32,
    /// The pool's bound on the sum of compute percentages on one GPU (`None`: unbounded).
    pub compute_bound: Option<u32>,
    /// The host's CPU units and memory in MiB (`None`: any).
    pub cpu: Option<u32>,
    pub memory_mib: Option<u64>,
}

/// Whether one task of `demand` fits an empty host of `shape` (its GPUs; CPU and memory are
/// [`Waiting::fits`]'s).
pub fn fits(shape: &Shape, demand: &GpuDemand) -> bool {
    match *demand {
        GpuDemand::None => true,
        GpuDemand::Whole { count } => count <= shape.gpus,
        GpuDemand::Mps { memory_mib, clients, compute_percent } => {
            shape.gpus > 0
                && memory_mib <= shape.gpu_memory_mib
                && clients <= shape.max_clients
                && shape.compute_bound.is_none_or(|b| compute_percent <= b)
        }
    }
}

/// How `waiting` packs onto new hosts of `shape`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Packing {
    /// New hosts the tasks that fit need.
    pub hosts: u32,
    /// Tasks packed, and tasks left out because no empty host of the shape holds them.
    pub packed: usize,
    pub never_fit: usize,
    /// MiB of MPS memory packed.
    pub mps_memory_mib: u64,
}

/// One waiting task: its GPU demand and the static host ports it binds (as the scheduler
/// keys them: protocol and port); two tasks binding one port never share a host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Waiting {
    pub demand: GpuDemand,
    pub ports: Vec<u32>,
    /// The task's CPU units and memory in MiB (0: none declared).
    pub cpu: u32,
    pub memory_mib: u64,
}

impl From<GpuDemand> for Waiting {
    fn from(demand: GpuDemand) -> Self {
        Waiting { demand, ports: Vec::new(), cpu: 0, memory_mib: 0 }
    }
}

impl Waiting {
    /// Whether one such task fits an empty host of `shape`.
    pub fn fits(&self, shape: &Shape) -> bool {
        fits(shape, &self.demand)
            && shape.cpu.is_none_or(|c| self.cpu <= c)
            && shape.memory_mib.is_none_or(|m| self.memory_mib <= m)
    }
}

/// One GPU being filled: what is left of it, and its host.
#[derive(Clone, Copy)]
struct Bin {
    clients: u32,
    compute: u32,
    host: usize,
}

/// One new host: its GPUs not opened yet, the ports its tasks bind, its CPU and memory left.
struct HostBin {
    idle: u32,
    ports: Vec<u32>,
    cpu: u64,
    memory_mib: u64,
}

impl HostBin {
    /// Whether a task with these needs (its GPU aside) fits what is left of the host.
    fn takes(&self, t: &Need) -> bool {
        t.ports.iter().all(|p| !self.ports.contains(p))
            && self.cpu >= t.cpu
            && self.memory_mib >= t.memory_mib
    }

    fn hold(&mut self, t: &Need) {
        self.ports.extend_from_slice(t.ports);
        self.cpu -= t.cpu;
        self.memory_mib -= t.memory_mib;
    }
}

/// What a task needs of its host besides GPUs.
struct Need<'a> {
    ports: &'a [u32],
    cpu: u64,
    memory_mib: u64,
}

/// Packs `waiting` onto as few new hosts of `shape` as best fit decreasing finds (module docs).
pub fn pack(shape: &Shape, waiting: &[GpuDemand]) -> Packing {
    let tasks: Vec<Waiting> = waiting.iter().map(|d| Waiting::from(*d)).collect();
    pack_tasks(shape, &tasks)
}

/// [`pack`] with each task's static host ports, CPU and memory.
pub fn pack_tasks(shape: &Shape, waiting: &[Waiting]) -> Packing {
    let mut out = Packing::default();
    let mut whole: Vec<(u32, Need)> = Vec::new();
    let mut mps: Vec<(u64, u32, u32, Need)> = Vec::new();
    let mut cpu_only: Vec<Need> = Vec::new();
    for w in waiting {
        if !w.fits(shape) {
            out.never_fit += 1;
            continue;
        }
        let need = Need { ports: &w.ports, cpu: u64::from(w.cpu), memory_mib: w.memory_mib };
        match w.demand {
            GpuDemand::None => cpu_only.push(need),
            GpuDemand::Whole { count } => whole.push((count, need)),
            GpuDemand::Mps { memory_mib, clients, compute_percent } => {
                mps.push((memory_mib, clients, compute_percent, need))
            }
        }
    }
    let mut hosts: Vec<HostBin> = Vec::new();
    let new_host = |hosts: &mut Vec<HostBin>| {
        hosts.push(HostBin {
            idle: shape.gpus,
            ports: Vec::new(),
            cpu: shape.cpu.map_or(u64::MAX, u64::from),
            memory_mib: shape.memory_mib.unwrap_or(u64::MAX),
        });
        hosts.len() - 1
    };
    // Whole-GPU tasks: first fit decreasing over hosts by their idle GPUs.
    whole.sort_unstable_by_key(|w| std::cmp::Reverse(w.0));
    for (count, need) in whole {
        let h = match hosts.iter().position(|h| h.idle >= count && h.takes(&need)) {
            Some(h) => h,
            None => new_host(&mut hosts),
        };
        hosts[h].idle -= count;
        hosts[h].hold(&need);
        out.packed += 1;
    }
    // MPS tasks: best fit decreasing over opened GPUs, indexed by memory left; a GPU is opened
    // on the newest host with one idle (and room for the task), else on a new host.
    mps.sort_unstable_by(|a, b| b.0.cmp(&a.0).then(b.1.cmp(&a.1)).then(b.2.cmp(&a.2)));
    let budget = shape.compute_bound.unwrap_or(u32::MAX);
    let mut by_left: BTreeMap<(u64, u64), Bin> = BTreeMap::new();
    let mut next_id = 0u64;
    for (memory, clients, compute, need) in mps {
        let found = by_left
            .range((memory, 0)..)
            .find(|(_, b)| b.clients >= clients && b.compute >= compute && hosts[b.host].takes(&need))
            .map(|(k, b)| (*k, *b));
        let ((left, id), bin) = match found {
            Some(f) => f,
            None => {
                let h = match hosts.iter().rposition(|h| h.idle > 0 && h.takes(&need)) {
                    Some(h) => h,
                    None => new_host(&mut hosts),
                };
                hosts[h].idle -= 1;
                next_id += 1;
                (
                    (shape.gpu_memory_mib, next_id),
                    Bin { clients: shape.max_clients, compute: budget, host: h },
                )
            }
        };
        by_left.remove(&(left, id));
        let rest = Bin { clients: bin.clients - clients, compute: bin.compute - compute, host: bin.host };
        by_left.insert((left - memory, id), rest);
        hosts[bin.host].hold(&need);
        out.packed += 1;
        out.mps_memory_mib += memory;
    }
    // Tasks without GPUs go on any host with room (a new one when none has).
    for need in cpu_only {
        let h = match hosts.iter().position(|h| h.takes(&need)) {
            Some(h) => h,
            None => new_host(&mut hosts),
        };
        hosts[h].hold(&need);
        out.packed += 1;
    }
    out.hosts = hosts.len() as u32;
    out
}

/// What the controller knows of the pool now.
#[derive(Debug, Clone, Default)]
pub struct Input {
    /// Hosts in the pool (not deregistered), launches in flight, and hosts still to join
    /// from the last step.
    pub hosts: u32,
    pub launching: u32,
    /// Hosts with work (a task other than DAEMON services' tasks).
    pub busy: u32,
    /// Empty hosts (by the caller's ids) with how long each has been empty, in ms.
    pub empty_for_ms: Vec<(u64, u64)>,
    /// The waiting tasks' packing onto new hosts.
    pub packing: Packing,
    /// Since the last scale-out step, in ms (None: none yet).
    pub since_last_step_ms: Option<u64>,
    /// Scale-in is paused: an incident is open or a drill runs in the pool.
    pub paused: bool,
}

/// What to do now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Nothing: at the target, or waiting (the reason says for what).
    Hold { target: u32, why: String },
    /// Launch `add` hosts.
    Out { target: u32, add: u32, why: String },
    /// Remove these empty hosts (the caller's ids).
    In { target: u32, remove: Vec<u64>, why: String },
}

/// `ceil(M × 100 / target)`: the hosts that keep the reservation at the target.
pub fn target_hosts(needed: u32, target_capacity: u32) -> u32 {
    (u64::from(needed) * 100).div_ceil(u64::from(target_capacity.clamp(1, 100))) as u32
}

/// The step to take now (module docs).
pub fn decide(policy: &ManagedScaling, input: &Input) -> Step {
    let needed = input.busy + input.packing.hosts;
    let target = target_hosts(needed, policy.target_capacity).clamp(policy.min_hosts, policy.max_hosts);
    let have = input.hosts + input.launching;
    let demand = if input.packing.packed > 0 {
        format!(
            "{} host(s) for {} waiting task(s){}",
            input.packing.hosts,
            input.packing.packed,
            if input.packing.mps_memory_mib > 0 {
                format!(" of {} MiB of MPS memory", input.packing.mps_memory_mib)
            } else {
                String::new()
            }
        )
    } else {
        "no waiting task".to_string()
    };
    let reservation = if have == 0 { 0 } else { u64::from(needed) * 100 / u64::from(have) };
    let state = format!(
        "{demand}; {} busy of {have} host(s), reservation {reservation}% (target {}%)",
        input.busy, policy.target_capacity
    );
    if target > have {
        if input.launching > 0
            && input.since_last_step_ms.is_some_and(|t| t < u64::from(policy.instance_warmup_period) * 1000)
        {
            return Step::Hold {
                target,
                why: format!("{state}: {} launched host(s) still warming up", input.launching),
            };
        }
        let step = (target - have)
            .max(policy.minimum_scaling_step_size)
            .min(policy.maximum_scaling_step_size)
            .min(policy.max_hosts.saturating_sub(have));
        if step == 0 {
            return Step::Hold { target, why: format!("{state}: at maxHosts {}", policy.max_hosts) };
        }
        return Step::Out { target, add: step, why: format!("{state}: adding {step} host(s)") };
    }
    if have <= target || input.launching > 0 {
        return Step::Hold { target, why: state };
    }
    if input.paused {
        return Step::Hold {
            target,
            why: format!("{state}: scale-in paused by an open incident or a drill"),
        };
    }
    let quiet = u64::from(policy.scale_in_after_seconds) * 1000;
    let mut ready: Vec<(u64, u64)> =
        input.empty_for_ms.iter().copied().filter(|(_, t)| *t >= quiet).collect();
    // The longest empty first; ids break ties.
    ready.sort_by_key(|(id, t)| (std::cmp::Reverse(*t), *id));
    let budget = ((u64::from(input.hosts) * u64::from(policy.scale_in_budget_percent)) / 100).max(1) as usize;
    let n = ready.len().min(budget).min((have - target) as usize);
    if n == 0 {
        let waiting = input.empty_for_ms.len();
        return Step::Hold {
            target,
            why: format!(
                "{state}: {waiting} empty host(s), none empty for {} s yet",
                policy.scale_in_after_seconds
            ),
        };
    }
    let remove: Vec<u64> = ready[..n].iter().map(|(id, _)| *id).collect();
    Step::In {
        target,
        why: format!(
            "{state}: removing {n} host(s) empty for {} s or more (at most {budget} per step)",
            policy.scale_in_after_seconds
        ),
        remove,
    }
}

#[cfg(test)]
mod tests;
