//! The `service-spread` invariant (docs/sim.md, "Invariants, checked after every step"): at
//! every resync after the warm-up, no service keeps more than ceil(replicas / hosts with
//! room) replicas on one host for longer than its pool's bound, counted from when capacity
//! came back.
//!
//! - **Replicas on a host**: the service's task processes there in the world, starting or
//!   running, that the agent was not asked to stop: what losing that host would take down.
//!   The replicas above the service's desired count (a move's new copy while the old one
//!   still runs) count where they run but not twice in the sum.
//! - **Hosts with room**, for the host judged: that host, and every host of the service's
//!   pool that could take one more of its tasks now: ACTIVE, healthy and uncordoned per the
//!   server, up and reachable in the world (not partitioned), with a GPU that fits the task
//!   (an idle one for a whole-GPU task; for an MPS task one whose daemon the server holds OK,
//!   with the memory and a client slot left). The replicas counted are those on these hosts.
//!   A host that can take no more cannot help spread the service, so neither it nor its
//!   replicas count, unless it is the host judged; a host is judged only when some other
//!   host has room (in a full pool nothing can move). With this, a host over the bound means a
//!   host with room holds at least two fewer replicas of the service: exactly what the
//!   server's rebalancer moves a replica for (`rebalance` in
//!   crates/mpsfleet-server/src/cluster/services.rs); a spread the rebalancer is done with
//!   never breaks it.
//! - **The bound**: the pool's largest `total` for a `restart` service over the failure
//!   kinds, as `pool explain` states it (`mpsfleet_core::bounds::derive`). A self-managed
//!   pool states no total (recovery is the operator's), but spreading is the server's in both
//!   modes: its bound is the total the same policy states for a managed pool.
//! - **The clock** starts at the first resync that sees the host over the bound while no
//!   incident of the pool is open, and not before the pool's last incident resolved. Crowding
//!   is measured against the room there is now, so a host joining (or healing, or coming back
//!   from a cordon) is when the crowding it leaves behind begins. While an incident of the
//!   pool is open, nothing is timed: the service's replicas on the bad host are being
//!   replaced, and the rebalancer waits (by design) until every replica is current and
//!   healthy. A resync comes every 5 s, so the clock may start up to that much late, as it
//!   does for `service-recovery`.
//! - **Exempt**: a `fenced` service without `deploymentConfiguration.rebalanceFenced`, whose
//!   replicas are never moved by design.

use super::{Sim, MPS_COMPUTE_PERCENT};
use crate::config::{fmt_time, WARMUP_MS};
use crate::invariants::{self, SpreadBound};
use crate::report::SpreadStats;
use crate::world::Demand;
use mpsfleet_server::cluster::HostRoom;
use mpsfleet_types::*;
use std::collections::BTreeMap;

/// What the check keeps between resyncs.
#[derive(Debug, Default)]
pub(super) struct Spread {
    /// Per pool: the bound, and the pool's compute bound (`computeOvercommitPercent`).
    pools: BTreeMap<String, (u64, Option<u32>)>,
    /// Per pool: when its last incident resolved.
    resolved_at: BTreeMap<String, u64>,
    /// A service over the bound on a host (by the world's index): since when it is timed.
    since: BTreeMap<(ServiceName, usize), u64>,
    /// Crowded hosts seen, and the longest any stayed crowded while timed.
    episodes: u64,
    longest_ms: u64,
}

impl Spread {
    /// The pool's bound (module docs), from its policy as `pool explain` derives it.
    pub fn add_pool(&mut self, pool: &Pool) {
        let managed = Pool { mode: OwnershipMode::Managed, ..pool.clone() };
        let bounds = mpsfleet_core::bounds::derive(&managed, &mpsfleet_server::cluster::bounds::intervals());
        let bound = bounds.kinds.iter().filter_map(|k| k.total_ms).max().unwrap_or(0);
        self.pools.insert(pool.name.to_string(), (bound, pool.compute_overcommit_percent));
    }

    /// The largest bound of any pool, for the report.
    pub fn bound_ms(&self) -> u64 {
        self.pools.values().map(|p| p.0).max().unwrap_or(0)
    }

    /// What the report shows of it.
    pub fn stats(&self) -> SpreadStats {
        SpreadStats { crowded: self.episodes, longest_ms: self.longest_ms, bound_ms: self.bound_ms() }
    }

    /// An incident of `pool` resolved now.
    pub fn resolved(&mut self, pool: &str, now: u64) {
        self.resolved_at.insert(pool.to_string(), now);
    }
}

/// Whether a host, as the server shows it, could take one more task of `demand` now.
fn takes_one_more(v: &HostRoom, demand: Demand, compute_bound: Option<u32>) -> bool {
    if v.status != HostStatus::Active || v.health_status != HealthStatus::Ok || v.cordoned {
        return false;
    }
    v.gpus.iter().any(|g| {
        if !demand.mps {
            return g.sharing_mode == SharingMode::Idle;
        }
        v.mps_available
            && matches!(g.sharing_mode, SharingMode::Idle | SharingMode::NvidiaMps)
            && g.remaining_memory_mib >= demand.memory_mib
            && g.client_count < g.max_clients
            && compute_bound.is_none_or(|b| g.compute_percent_sum + MPS_COMPUTE_PERCENT <= b)
            && g.daemon_ok
    })
}

/// One host over the bound (by the world's index): its replicas, and the figures of the bound.
struct Crowded {
    host: usize,
    replicas: u32,
    bound: SpreadBound,
    fewest: u32,
}

impl Sim {
    /// At every resync after the warm-up: no service over ceil(replicas / hosts with room)
    /// on one host for longer than its pool's bound since capacity came back (module docs).
    pub(super) fn check_spread(&mut self) {
        if self.now < WARMUP_MS || self.cluster.is_none() {
            return;
        }
        let now = self.now;
        let open: Vec<&str> = self
            .open_incidents
            .values()
            .filter_map(|i| self.incidents.get(i))
            .filter(|i| i.state != IncidentState::Resolved)
            .map(|i| i.pool.as_str())
            .collect();
        // Services whose pool has an open incident: not timed, and their crowding not ended.
        let mut paused: Vec<ServiceName> = Vec::new();
        let mut judged: BTreeMap<&ServiceName, BTreeMap<usize, u32>> = BTreeMap::new();
        for (name, w) in &self.svcs {
            if w.fenced && !w.rebalance_fenced {
                continue;
            }
            if open.contains(&w.pool.as_str()) {
                paused.push(name.clone());
            } else {
                judged.insert(name, BTreeMap::new());
            }
        }
        // The replicas each judged service keeps on each host: its processes there, starting
        // or running, that have not been asked to stop.
        for h in 0..self.world.len() {
            for l in self.world[h].tasks().values().filter(|l| !l.stopping) {
                if let Some(on) = l.service.as_ref().and_then(|s| judged.get_mut(s)) {
                    *on.entry(h).or_default() += 1;
                }
            }
        }
        let mut crowded: Vec<(ServiceName, Crowded)> = Vec::new();
        let mut views: BTreeMap<String, BTreeMap<HostId, HostRoom>> = BTreeMap::new();
        for (name, counts) in judged {
            let Some(w) = self.svcs.get(name) else { continue };
            let Some(most) = counts.values().copied().max().filter(|&m| m >= 2) else { continue };
            let pool_ix = self.pool_names.iter().position(|p| p.as_str() == w.pool);
            // The pool's hosts that may take work: registered, up and reachable.
            let reachable: Vec<usize> = (0..self.world.len())
                .filter(|&h| {
                    let host = &self.world[h];
                    Some(host.pool) == pool_ix
                        && host.up
                        && host.partitioned_until.is_none()
                        && host.id().is_some()
                })
                .collect();
            let count = |h: usize| counts.get(&h).copied().unwrap_or(0);
            // Over the bound needs a host with room holding two fewer than the most crowded:
            // without such a host, no view of the server is built.
            if reachable.iter().all(|&h| count(h) + 2 > most) {
                continue;
            }
            let compute_bound = self.spread.pools.get(&w.pool).and_then(|p| p.1);
            let views = views.entry(w.pool.clone()).or_insert_with(|| {
                let c = self.cluster.as_ref().expect("checked above");
                c.read().host_rooms(&w.pool).into_iter().map(|v| (v.id.clone(), v)).collect()
            });
            let room: Vec<usize> = reachable
                .into_iter()
                .filter(|&h| {
                    let view = self.world[h].id().and_then(|id| views.get(id));
                    view.is_some_and(|v| takes_one_more(v, w.demand, compute_bound))
                })
                .collect();
            let excess = counts.values().sum::<u32>().saturating_sub(w.desired);
            let on_room: u32 = room.iter().map(|&h| count(h)).sum();
            let fewest = room.iter().map(|&h| count(h)).min().unwrap_or(0);
            for (&h, &c) in &counts {
                // Spreading needs a host to move to: with no host with room but this one (a
                // full pool), nothing can be moved, and the excess taken from this host's
                // count alone may be running elsewhere.
                if room.iter().all(|&r| r == h) {
                    continue;
                }
                let bound =
                    invariants::spread_bound(on_room, room.len() as u32, excess, c, room.contains(&h));
                self.checker.checks += 1;
                if c > bound.most {
                    crowded.push((name.clone(), Crowded { host: h, replicas: c, bound, fewest }));
                }
            }
        }
        let keys: Vec<(ServiceName, usize)> = crowded.iter().map(|(s, c)| (s.clone(), c.host)).collect();
        let ended: Vec<((ServiceName, usize), u64)> = self
            .spread
            .since
            .iter()
            .filter(|(k, _)| !keys.contains(k) && !paused.contains(&k.0))
            .map(|(k, &t)| (k.clone(), t))
            .collect();
        for ((s, h), t) in ended {
            self.spread.since.remove(&(s.clone(), h));
            let label = self.world[h].label.clone();
            self.log(format!("service {s} spread again on {label} after {}", fmt_time(now - t)));
        }
        for (s, c) in crowded {
            let pool = self.svcs.get(&s).map(|w| w.pool.clone()).unwrap_or_default();
            let key = (s.clone(), c.host);
            let SpreadBound { replicas: counted, hosts, most } = c.bound;
            let label = self.world[c.host].label.clone();
            let since = match self.spread.since.get(&key) {
                Some(&t) => t,
                None => {
                    self.spread.episodes += 1;
                    self.log(format!(
                        "service {s} crowded on {label}: {} replicas, more than ceil({counted} / {hosts}) = {most}; the emptiest host with room holds {}",
                        c.replicas, c.fewest
                    ));
                    self.spread.since.insert(key, now);
                    now
                }
            };
            let start = since.max(self.spread.resolved_at.get(&pool).copied().unwrap_or(0));
            let (bound, _) = self.spread.pools.get(&pool).copied().unwrap_or((0, None));
            self.spread.longest_ms = self.spread.longest_ms.max(now - start);
            self.stats.spread = self.spread.stats();
            if now - start > bound {
                let detail = format!(
                    "service {s} keeps {} replicas on {label} for {} since capacity came back, more than ceil({counted} replicas / {hosts} hosts with room) = {most} (the emptiest host with room holds {}; bound {}, pool {pool}'s largest restart total)",
                    c.replicas,
                    fmt_time(now - start),
                    c.fewest,
                    fmt_time(bound)
                );
                self.fail("service-spread", detail);
                return;
            }
        }
    }
}
