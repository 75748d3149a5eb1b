//! Preemption's choice: when a request fits nowhere, which lower-priority tenants to stop so
//! that it fits, and where. Pure, like the rest of the scheduler: the server stops the chosen
//! tasks and holds the room for the preemptor until they are gone.
//!
//! The rules (docs/pools.md "Priorities and preemption"):
//!
//! - a victim is at least [`PREEMPTION_GAP`] below the preemptor, not protected (scale-in
//!   protection), not shielded (a preempted service's replacement, for its backoff), and not a
//!   hold; a tenant already stopping costs nothing: its room is counted as coming free;
//! - the room is made on one GPU (MPS memory, clients, compute) or one host (whole GPUs, static
//!   host ports), as a placement would use it;
//! - among every GPU or host where a set exists, the cheapest set wins: the lowest highest
//!   priority, then the fewest tasks, then the newest (the latest-created oldest member), then
//!   placement order (host, then GPU, index);
//! - a set holds no member it could do without (each is needed for the fit).
//!
//! The cost is a scan of the pool's schedulable hosts and their tenants, with no allocation
//! per host that is turned down: at 10,000 hosts and 100,000 tenants it is a few
//! milliseconds (docs/benchmarks.md "Preemption").

use super::{GpuIx, Held, HostIx, Placement, Request, Scheduler, SharingMode};
use mpsfleet_types::priority::PREEMPTION_GAP;
use mpsfleet_types::GpuDemand;
use std::cmp::Reverse;

/// What a set of victims costs; lower is cheaper ([`Scheduler::preempt`]'s order).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct PreemptionCost {
    /// The highest priority among the victims (0: none).
    pub top_priority: u8,
    /// How many tasks stop.
    pub victims: u32,
    /// The creation time of the oldest victim, newest first.
    pub oldest: Reverse<u64>,
    pub host: HostIx,
    pub gpu: GpuIx,
}

/// Where a request fits once some tenants stop.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Preemption {
    pub placement: Placement,
    /// The tenants to stop (their ids), cheapest first.
    pub victims: Vec<u64>,
    /// Tenants already stopping whose room the placement counts on.
    pub awaits: Vec<u64>,
    pub cost: PreemptionCost,
}

/// One candidate: the host's tenants (by index) to stop and to wait for.
struct Choice {
    cost: PreemptionCost,
    gpus: Vec<GpuIx>,
    victims: Vec<usize>,
    awaits: Vec<usize>,
}

impl Scheduler {
    /// The cheapest way to make room for `req` by stopping tenants at least
    /// [`PREEMPTION_GAP`] below `req.tenant`'s priority, or None when no such set exists (or
    /// the request names no tenant). Changes nothing: the caller stops the victims and
    /// reserves the placement (a hold) until they are gone.
    pub fn preempt(&self, req: &Request, now_ms: u64) -> Option<Preemption> {
        let me = req.tenant?;
        let pool = self.pools.get(req.pool as usize)?;
        if req.needs.too_many_ports.is_some() {
            return None;
        }
        let mut best: Option<Choice> = None;
        let mut scratch = Scratch::default();
        for &key in &pool.cpu_hosts {
            let host = super::key_host(key);
            let bound = best.as_ref().map(|b| b.cost);
            if let Some(c) = self.choose_on(req, me.priority, host, now_ms, bound, &mut scratch) {
                let free = c.cost.victims == 0;
                best = Some(c);
                if free {
                    break;
                }
            }
        }
        let c = best?;
        let tenants = &self.hosts[c.cost.host as usize].tenants;
        Some(Preemption {
            placement: Placement { host: c.cost.host, gpus: c.gpus },
            victims: c.victims.iter().map(|&i| tenants[i].tenant.id).collect(),
            awaits: c.awaits.iter().map(|&i| tenants[i].tenant.id).collect(),
            cost: c.cost,
        })
    }

    /// The cheapest choice on one host, if it beats `bound`.
    fn choose_on(
        &self,
        req: &Request,
        priority: u8,
        host: HostIx,
        now: u64,
        bound: Option<PreemptionCost>,
        scratch: &mut Scratch,
    ) -> Option<Choice> {
        let h = &self.hosts[host as usize];
        if h.pool != req.pool || !h.schedulable || (req.needs.images && !h.runs_images) {
            return None;
        }
        let tenants = &h.tenants;
        let may_go = |t: &Held| {
            !t.tenant.hold
                && u16::from(t.tenant.priority) + u16::from(PREEMPTION_GAP) <= u16::from(priority)
                && t.protected_until_ms <= now
                && t.tenant.shield_until_ms <= now
        };
        // Every tenant holding one of the request's static ports must go (or be going).
        let mut victims: Vec<usize> = Vec::new();
        let mut awaits: Vec<usize> = Vec::new();
        for &k in req.needs.ports.keys() {
            let held = h.ports.iter().filter(|&&p| p == k).count();
            let mut known = 0;
            for (i, t) in tenants.iter().enumerate() {
                if !t.ports.keys().contains(&k) {
                    continue;
                }
                known += 1;
                if t.stopping {
                    push_once(&mut awaits, i);
                } else if may_go(t) {
                    push_once(&mut victims, i);
                } else {
                    return None;
                }
            }
            if known < held {
                return None;
            }
        }
        let (gpus, more) = match req.demand {
            GpuDemand::None => (Vec::new(), Vec::new()),
            GpuDemand::Whole { count } => self.empty_gpus(host, count, &may_go, &mut victims, &mut awaits)?,
            GpuDemand::Mps { memory_mib, clients, compute_percent } => {
                if !h.mps_available {
                    return None;
                }
                let need = Need { memory_mib, clients, compute_percent };
                self.room_on_gpu(req, host, need, &may_go, &victims, &mut awaits, bound, scratch)?
            }
        };
        for i in more {
            push_once(&mut victims, i);
        }
        let cost = cost_of(tenants, &victims, host, gpus.first().copied().unwrap_or(0));
        if bound.is_some_and(|b| cost >= b) {
            return None;
        }
        awaits.retain(|i| !victims.contains(i));
        victims.sort_by_key(|&i| order(&tenants[i]));
        Some(Choice { cost, gpus, victims, awaits })
    }

    /// `count` GPUs of `host` emptied: each idle, or held only by tenants that may go (or are
    /// going), the cheapest first. Returns the GPUs and the tenants to stop for them.
    fn empty_gpus(
        &self,
        host: HostIx,
        count: u32,
        may_go: &impl Fn(&Held) -> bool,
        victims: &mut [usize],
        awaits: &mut Vec<usize>,
    ) -> Option<(Vec<GpuIx>, Vec<usize>)> {
        let tenants = &self.hosts[host as usize].tenants;
        let first = self.hosts[host as usize].first_gpu;
        let mut options: Vec<(PreemptionCost, GpuIx, Vec<usize>, Vec<usize>)> = Vec::new();
        'gpu: for g in self.host_gpus(host) {
            let s = &self.gpus[g as usize];
            if s.max_clients == 0 && s.mode() == SharingMode::Idle {
                // A GPU that takes no work at all.
                continue;
            }
            let (mut go, mut wait) = (Vec::new(), Vec::new());
            let mut left = Usage::of(s);
            for (i, t) in tenants.iter().enumerate() {
                if t.gpus & (1 << (g - first)) == 0 {
                    continue;
                }
                if t.stopping {
                    wait.push(i);
                } else if victims.contains(&i) || may_go(t) {
                    go.push(i);
                } else {
                    continue 'gpu;
                }
                left.remove(t);
            }
            if !left.is_empty() {
                // Held by placements that name no tenant: nothing can free it.
                continue;
            }
            let cost = cost_of(tenants, &go, host, g);
            options.push((cost, g, go, wait));
        }
        if options.len() < count as usize {
            return None;
        }
        options.sort_by_key(|o| (o.0.top_priority, o.0.victims, o.0.oldest, o.1));
        let mut gpus = Vec::with_capacity(count as usize);
        let mut more = Vec::new();
        for (_, g, go, wait) in options.into_iter().take(count as usize) {
            gpus.push(g);
            go.into_iter().for_each(|i| push_once(&mut more, i));
            wait.into_iter().for_each(|i| push_once(awaits, i));
        }
        gpus.sort_unstable();
        Some((gpus, more))
    }

    /// The cheapest GPU of `host` where an MPS task of `need` fits once some tenants stop,
    /// counting the room of those going (`going`: already chosen for the ports; `awaits`:
    /// already stopping). Returns the GPU and the tenants to stop on it.
    #[allow(clippy::too_many_arguments)]
    fn room_on_gpu(
        &self,
        req: &Request,
        host: HostIx,
        need: Need,
        may_go: &impl Fn(&Held) -> bool,
        going: &[usize],
        awaits: &mut Vec<usize>,
        bound: Option<PreemptionCost>,
        scratch: &mut Scratch,
    ) -> Option<(Vec<GpuIx>, Vec<usize>)> {
        let tenants = &self.hosts[host as usize].tenants;
        let first = self.hosts[host as usize].first_gpu;
        let compute_bound = self.pools[req.pool as usize].config.compute_bound;
        let mut best: Option<(PreemptionCost, GpuIx, Vec<usize>, Vec<usize>)> = None;
        for g in self.host_gpus(host) {
            let s = &self.gpus[g as usize];
            if s.mps_closed || s.max_clients < need.clients || s.total_mib < need.memory_mib {
                continue;
            }
            if compute_bound.is_some_and(|b| need.compute_percent > b) {
                continue;
            }
            let mut used = Usage::of(s);
            let (wait, candidates) = (&mut scratch.wait, &mut scratch.candidates);
            wait.clear();
            candidates.clear();
            for (i, t) in tenants.iter().enumerate() {
                if t.gpus & (1 << (g - first)) == 0 {
                    continue;
                }
                if t.stopping {
                    wait.push(i);
                    used.remove(t);
                } else if going.contains(&i) {
                    used.remove(t);
                } else if may_go(t) {
                    candidates.push(i);
                }
            }
            let fits = |u: &Usage| u.fits(s, need, compute_bound);
            let chosen = if fits(&used) {
                Vec::new()
            } else {
                // Cheapest first, the highest priority any set here must reach is known without
                // building one: a GPU that cannot beat the best so far costs no more than this.
                candidates.sort_by_key(|&i| order(&tenants[i]));
                let Some(top) = lowest_top(tenants, candidates, used, &fits) else { continue };
                let floor = best.as_ref().map(|b| b.0).or(bound);
                if floor.is_some_and(|b| top > b.top_priority) {
                    continue;
                }
                match cheapest_set(tenants, candidates, used, &fits) {
                    Some(set) => set,
                    None => continue,
                }
            };
            let wait = wait.clone();
            let mut all: Vec<usize> = going.to_vec();
            chosen.iter().for_each(|&i| push_once(&mut all, i));
            let cost = cost_of(tenants, &all, host, g);
            if bound.is_some_and(|b| cost >= b) || best.as_ref().is_some_and(|b| cost >= b.0) {
                continue;
            }
            best = Some((cost, g, chosen, wait));
        }
        let (_, g, chosen, wait) = best?;
        wait.into_iter().for_each(|i| push_once(awaits, i));
        Some((vec![g], chosen))
    }
}

/// Buffers one decision reuses from GPU to GPU, so that a GPU turned down allocates nothing.
#[derive(Default)]
struct Scratch {
    candidates: Vec<usize>,
    wait: Vec<usize>,
}

/// The priority of the last tenant the cheapest-first order (`sorted`) takes before `fits`:
/// the lowest highest priority of any set that fits; None when none does.
fn lowest_top(
    tenants: &[Held],
    sorted: &[usize],
    start: Usage,
    fits: &impl Fn(&Usage) -> bool,
) -> Option<u8> {
    let mut used = start;
    for &i in sorted {
        used.remove(&tenants[i]);
        if fits(&used) {
            return Some(tenants[i].tenant.priority);
        }
    }
    None
}

/// What an MPS request asks of one GPU.
#[derive(Debug, Clone, Copy)]
struct Need {
    memory_mib: u64,
    clients: u32,
    compute_percent: u32,
}

/// What a GPU has in use, as tenants are taken away from it.
#[derive(Debug, Clone, Copy)]
struct Usage {
    memory_mib: u64,
    clients: u32,
    compute_percent: u32,
    dedicated: u32,
}

impl Usage {
    fn of(s: &super::GpuState) -> Usage {
        Usage {
            memory_mib: s.used_mib,
            clients: s.clients,
            compute_percent: s.compute_percent,
            dedicated: s.dedicated,
        }
    }

    fn remove(&mut self, t: &Held) {
        match t.demand {
            GpuDemand::Mps { memory_mib, clients, compute_percent } => {
                self.memory_mib = self.memory_mib.saturating_sub(memory_mib);
                self.clients = self.clients.saturating_sub(clients);
                self.compute_percent = self.compute_percent.saturating_sub(compute_percent);
            }
            GpuDemand::Whole { .. } => self.dedicated = self.dedicated.saturating_sub(1),
            GpuDemand::None => {}
        }
    }

    fn is_empty(&self) -> bool {
        self.memory_mib == 0 && self.clients == 0 && self.compute_percent == 0 && self.dedicated == 0
    }

    fn fits(&self, s: &super::GpuState, need: Need, compute_bound: Option<u32>) -> bool {
        self.dedicated == 0
            && s.total_mib.saturating_sub(self.memory_mib) >= need.memory_mib
            && self.clients + need.clients <= s.max_clients
            && compute_bound.is_none_or(|b| self.compute_percent + need.compute_percent <= b)
    }
}

/// The tenants among `candidates` whose stop makes `fits` true at the least cost, or None.
/// Two greedy passes, each pruned to a set with no member it can do without: cheapest first
/// (lowest priority, then newest), and, among the tenants no higher than that set's highest
/// priority, the largest first (fewest tasks). The cheaper of the two by
/// [`PreemptionCost`]'s order wins.
fn cheapest_set(
    tenants: &[Held],
    candidates: &[usize],
    start: Usage,
    fits: &impl Fn(&Usage) -> bool,
) -> Option<Vec<usize>> {
    let mut by_cost = candidates.to_vec();
    by_cost.sort_by_key(|&i| order(&tenants[i]));
    let first = greedy(tenants, &by_cost, start, fits)?;
    let top = first.iter().map(|&i| tenants[i].tenant.priority).max().unwrap_or(0);
    let mut by_size: Vec<usize> =
        candidates.iter().copied().filter(|&i| tenants[i].tenant.priority <= top).collect();
    by_size.sort_by_key(|&i| (Reverse(size(&tenants[i])), order(&tenants[i])));
    let second = greedy(tenants, &by_size, start, fits);
    Some(match second {
        Some(s) if key(tenants, &s) < key(tenants, &first) => s,
        _ => first,
    })
}

/// Takes tenants in `order` until `fits`, then drops, last taken first, every one the fit
/// does without.
fn greedy(
    tenants: &[Held],
    order: &[usize],
    start: Usage,
    fits: &impl Fn(&Usage) -> bool,
) -> Option<Vec<usize>> {
    let mut used = start;
    let mut taken = Vec::new();
    for &i in order {
        if fits(&used) {
            break;
        }
        used.remove(&tenants[i]);
        taken.push(i);
    }
    if !fits(&used) {
        return None;
    }
    let mut at = taken.len();
    while at > 0 {
        at -= 1;
        let without: Usage =
            taken.iter().enumerate().filter(|&(j, _)| j != at).fold(start, |mut u, (_, &i)| {
                u.remove(&tenants[i]);
                u
            });
        if fits(&without) {
            taken.remove(at);
        }
    }
    Some(taken)
}

fn size(t: &Held) -> (u64, u32) {
    match t.demand {
        GpuDemand::Mps { memory_mib, clients, .. } => (memory_mib, clients),
        GpuDemand::Whole { count } => (u64::MAX, count),
        GpuDemand::None => (0, 0),
    }
}

/// A tenant's place in the order victims are taken: lowest priority, then newest.
fn order(t: &Held) -> (u8, Reverse<u64>, u64) {
    (t.tenant.priority, Reverse(t.tenant.since_ms), t.tenant.id)
}

fn key(tenants: &[Held], set: &[usize]) -> (u8, usize, Reverse<u64>) {
    let top = set.iter().map(|&i| tenants[i].tenant.priority).max().unwrap_or(0);
    let oldest = set.iter().map(|&i| tenants[i].tenant.since_ms).min().unwrap_or(u64::MAX);
    (top, set.len(), Reverse(oldest))
}

fn cost_of(tenants: &[Held], set: &[usize], host: HostIx, gpu: GpuIx) -> PreemptionCost {
    let (top, n, oldest) = key(tenants, set);
    PreemptionCost { top_priority: top, victims: n as u32, oldest, host, gpu }
}

fn push_once(v: &mut Vec<usize>, i: usize) {
    if !v.contains(&i) {
        v.push(i);
    }
}
