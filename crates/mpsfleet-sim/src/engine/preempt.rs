//! Preemption as the simulator sees it: each victim's record from the change feed, checked
//! against the preemption invariants (`crate::preemption`), and what preemption costs and
//! buys, per service, in the world:
//!
//! - a replica is *lost* when its process ends and leaves its service below its desired
//!   count (a move whose new copy already runs loses nothing), and *back* when a process of
//!   the service starts while it is below its count; losses are paired with returns first
//!   in, first out, per service;
//! - a high-priority service's (priority 70 and above) loss once faults start (the end of the
//!   warm-up, or a quarter into a shorter run), paired with its return, is one recovery time;
//! - a loss whose process was stopped as a preemption's victim counts, until its return (or
//!   the end of the run), as preempted work lost.

use super::Sim;
use crate::config::{faults_start_ms, fmt_time};
use crate::preemption::{self, Preemption};
use mpsfleet_types::bounds::{FailureKind, Intervals};
use mpsfleet_types::priority::priority_band;
use mpsfleet_types::{Pool, ServiceName, Task};
use std::collections::{BTreeMap, VecDeque};

/// Per service, its replicas lost and not yet back: (when, lost to a preemption).
pub(super) type Losses = BTreeMap<ServiceName, VecDeque<(u64, bool)>>;

impl Sim {
    /// A task record from the change feed: a preemption's victim, seen for the first time,
    /// is checked against the preemption invariants.
    pub(super) fn observe_preemption(&mut self, t: &Task) {
        let Some(reason) = preemption::victim_reason(t) else { return };
        if self.preemptions.seen(&t.id) {
            return;
        }
        self.checker.checks += 1;
        let Some(named) = preemption::parse_reason(reason) else {
            let why = format!("task {} was preempted, but its reason names no preemptor: {reason:?}", t.id);
            self.fail("preemption-gap", why);
            return;
        };
        let by = self.cluster.as_ref().and_then(|c| c.read().task(&named.preemptor.to_string()).ok());
        let (by_owner, by_priority) = match &by {
            Some(b) => (preemption::owner(b), b.priority),
            None => (format!("task {}", named.preemptor), named.preemptor_priority),
        };
        let p = Preemption {
            at_ms: self.now,
            victim: t.id,
            victim_owner: preemption::owner(t),
            victim_priority: t.priority,
            victim_placed_at_ms: t.placed_at_ms,
            preemptor: named.preemptor,
            preemptor_owner: by_owner,
            preemptor_priority: by_priority,
        };
        let label =
            t.host_id.as_ref().and_then(|id| self.world.by_id(id)).map(|h| self.world[h].label.clone());
        let placed = p.victim_placed_at_ms.map_or_else(|| "?".into(), fmt_time);
        self.log(format!(
            "preempted {} {} (priority {}, placed {placed}) on {} for {} {} (priority {})",
            p.victim_owner,
            p.victim,
            p.victim_priority,
            label.as_deref().unwrap_or("?"),
            p.preemptor_owner,
            p.preemptor,
            p.preemptor_priority
        ));
        let broken = self.preemptions.add(p);
        self.stats.preemption.preemptions = self.preemptions.all.len() as u64;
        if let Some((invariant, why)) = broken {
            self.fail(invariant, why);
        }
    }

    /// A process of service `s` ended (`preempted`: as a preemption's victim).
    pub(super) fn replica_lost(&mut self, s: &ServiceName, preempted: bool) {
        let Some(w) = self.svcs.get(s) else { return };
        if w.running < w.desired {
            self.losses.entry(s.clone()).or_default().push_back((self.now, preempted));
        }
    }

    /// A process of service `s` started.
    pub(super) fn replica_back(&mut self, s: &ServiceName) {
        let Some(w) = self.svcs.get(s) else { return };
        if w.running > w.desired {
            return;
        }
        let high = priority_band(w.priority) == "high";
        let Some((at, preempted)) = self.losses.get_mut(s).and_then(VecDeque::pop_front) else { return };
        let took = self.now - at;
        if high && at >= faults_start_ms(&self.cfg) {
            self.stats.preemption.high_recovery_ms.push(took);
        }
        if preempted {
            self.stats.preemption.victims_back += 1;
            self.stats.preemption.preempted_lost_ms += u128::from(took);
        }
    }

    /// At the end: the preemptions seen, and the losses not back yet (preempted work counted
    /// up to the end).
    pub(super) fn finish_preemption(&mut self) {
        let start = faults_start_ms(&self.cfg);
        let p = &mut self.stats.preemption;
        for (s, q) in &self.losses {
            let high = self.svcs.get(s).is_some_and(|w| priority_band(w.priority) == "high");
            for &(at, preempted) in q {
                if high && at >= start {
                    p.high_not_back += 1;
                }
                if preempted {
                    p.victims_not_back += 1;
                    p.preempted_lost_ms += u128::from(self.now.saturating_sub(at));
                }
            }
        }
        let pool = self.cluster.as_ref().and_then(|c| c.read().pool(super::MANAGED_POOL).ok());
        p.bound_ms = pool.map_or(0, |pool| full_pool_bound_ms(&pool, self.cfg.heartbeat_ms));
    }
}

/// The longest a victim takes to stop, as the server's bound takes it: its service's
/// `deregistrationDelaySeconds` (2 s, the default the simulated services keep) and its
/// containers' `stopTimeout` (30 s when unset, as here).
pub const VICTIM_STOP_MS: u64 =
    mpsfleet_types::service::DEFAULT_DEREGISTRATION_DELAY_S as u64 * 1000 + 30_000;

/// How long a replica lost with its MPS daemon may take to run again in a full pool whose
/// policy lets recovery preempt: the pool's `total (full pool, preemption)` bound for a daemon
/// exit, as the server states it (`mpsfleet_core::bounds::add_full_pool`), at the simulated
/// agents' heartbeat and with [`VICTIM_STOP_MS`]: detect + decide + the victims' stop + an
/// incident pass + a health tick + the task start allowance. With the default policy and 1 s
/// heartbeats: 6.5 + 0.5 + 32 + 0.25 + 0.25 + 30 = 69.5 s. 0 where the pool does not preempt.
pub fn full_pool_bound_ms(pool: &Pool, heartbeat_ms: u64) -> u64 {
    let iv = Intervals { agent_heartbeat_ms: heartbeat_ms, ..mpsfleet_server::cluster::bounds::intervals() };
    let mut b = mpsfleet_core::bounds::derive(pool, &iv);
    mpsfleet_core::bounds::add_full_pool(&mut b, pool, &iv, VICTIM_STOP_MS);
    if b.full_pool.as_ref().is_none_or(|f| f.by != "preemption") {
        return 0;
    }
    b.of(FailureKind::DaemonExit).and_then(|k| k.total_full_pool_ms).unwrap_or(0)
}
