//! The capacity controller (`Work::Capacity`): a pool with a provider kept at its desired
//! host count. Hosts the provider runs (replacements included) count, so a replacement in
//! flight is not launched twice; a self-managed pool's bad host is not terminated
//! automatically, so this never replaces one there, it only starts the pool's hosts. A
//! scaling pool's desired count is managed scaling's output first (`controllers/scaling.rs`).
//! Asked for when the pool, its hosts, its incidents or a provider call change, and again every
//! [`CAPACITY_RESYNC_MS`]. Launches leave as `ProviderJob`s, each with a launch token of its
//! own that the cluster mints for the names this answers ([`Lent::to_launch`]).

use super::remediation::ProviderJob;
use super::scaling::{scale, Borrowed, ScalingMemory};
use super::Ctx;
use crate::cluster::error::Error;
use crate::cluster::write::Writer;
use mpsfleet_core::controller::Action;
use mpsfleet_types::{HostStatus, PoolName, Step};
use std::collections::{BTreeSet, HashMap};

/// How often a pool with a provider is checked against its host count when nothing asked.
pub const CAPACITY_RESYNC_MS: u64 = 1_000;

/// What a reconcile borrows beyond its context: whether the pool has a provider, the hosts
/// being launched to keep each pool at its size, when launches were asked for, managed
/// scaling's memory, where provider calls go; and, out, the hosts to launch.
pub(in crate::cluster) struct Lent<'a> {
    pub(in crate::cluster) has_provider: bool,
    pub(in crate::cluster) launches: &'a mut HashMap<PoolName, BTreeSet<String>>,
    pub(in crate::cluster) launches_asked: &'a mut HashMap<(PoolName, String), u64>,
    pub(in crate::cluster) scaling: &'a mut HashMap<PoolName, ScalingMemory>,
    pub(in crate::cluster) jobs: &'a mut Vec<ProviderJob>,
    /// Out: the names of hosts to launch into the pool.
    pub(in crate::cluster) to_launch: Vec<String>,
}

/// The capacity controller.
pub(in crate::cluster) struct Capacity;

impl Capacity {
    pub(in crate::cluster) fn reconcile(
        ctx: &mut Ctx<'_>,
        pool: &PoolName,
        l: &mut Lent<'_>,
    ) -> Result<Action, Error> {
        let w = &mut ctx.w;
        let Some(desired) =
            w.state.pools().get(pool).and_then(|p| p.value.provider.as_ref()).map(|prov| prov.desired_hosts)
        else {
            l.launches.remove(pool);
            return Ok(Action::AwaitChange);
        };
        if !l.has_provider {
            return Ok(Action::AwaitChange);
        }
        let to_come = hosts_to_come(w, l.launches, pool);
        let mut borrowed = Borrowed { memory: l.scaling, to_come, jobs: l.jobs };
        if let Some(wait) = scale(w, &mut borrowed, pool)? {
            return Ok(Action::RequeueAfter(wait));
        }
        let desired = (w.state.pools().get(pool))
            .and_then(|p| p.value.provider.as_ref())
            .map_or(desired, |prov| prov.desired_hosts);
        // Registered hosts (from the store, so this survives a restart), launches in flight
        // (until they register: `Cluster::host_joined`), and replacements requested by
        // incidents that have not joined yet.
        let live = (w.state.hosts().iter())
            .filter(|h| &h.host().pool == pool && h.host().status != HostStatus::Deregistered)
            .count();
        let mut missing =
            (desired as usize).saturating_sub(live + hosts_to_come(w, l.launches, pool) as usize);
        let mut k = 0;
        while missing > 0 {
            let name = format!("{pool}-{k}");
            k += 1;
            let taken = w.state.hosts().iter().any(|h| h.host().hostname == name)
                || l.launches.get(pool).is_some_and(|l| l.contains(&name));
            if taken {
                continue;
            }
            l.launches.entry(pool.clone()).or_default().insert(name.clone());
            super::remediation::launch_asked(l.launches_asked, pool, &name, w.now_ms);
            l.to_launch.push(name);
            missing -= 1;
        }
        Ok(Action::RequeueAfter(CAPACITY_RESYNC_MS))
    }
}

/// Hosts asked for and not joined yet: launches to keep the pool at its size, and
/// replacements its incidents requested.
pub(in crate::cluster) fn hosts_to_come(
    w: &Writer<'_>,
    launches: &HashMap<PoolName, BTreeSet<String>>,
    pool: &PoolName,
) -> u32 {
    let in_flight = launches.get(pool).map_or(0, |l| l.len());
    let replacing = (w.state.incidents().unresolved())
        .filter(|i| &i.pool == pool && i.has(Step::ReplacementRequested) && !i.has(Step::ReplacementReady))
        .count();
    (in_flight + replacing) as u32
}
