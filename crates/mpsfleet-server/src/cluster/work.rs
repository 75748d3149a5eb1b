//! The work the controllers are asked for, as keys on one [`WorkQueue`]
//! (`mpsfleet_core::controller`): a request or an agent's report commits its own change and
//! asks for the key it touched; [`Cluster::run_work`] (called by every health tick, in the
//! server and in the simulator alike) reconciles the keys that are due, one at a time, and a
//! key that fails backs off on its own while the others go on.
//!
//! Three controllers run on it: services (`Work::Service`, `services.rs`), placement
//! (`Work::Placement`, a pool's waiting tasks placed oldest first) and retention
//! (`Work::Retention`, one key: the change feed compacted and old records removed,
//! `retention.rs`, every [`RETENTION_INTERVAL_MS`] once [`Cluster::start_retention`] asked for
//! it; the simulator does not, so its reports keep every record). Requests for a queued key
//! merge, so a burst of reports about one service's tasks (a host's tasks starting, a drain)
//! reconciles the service once per pass, not once per report, and capacity freed by many
//! stops places a pool's waiting tasks once. A reconcile that waits for a time (a crash-loop
//! hold-back, a rebalance's settle time) asks for its key again at that time; every
//! [`SERVICE_RESYNC_MS`] the resync asks for every service, and every resync for every pool
//! with waiting tasks: the safety net for a change nothing asked for.
//!
//! A request that creates tasks still places them in its own commit (a pure decision, so
//! `task run` answers at once with what cannot be placed); capacity that frees or opens later
//! (a task stopped, a host onboarded or activated, a daemon answering again, a pool's
//! settings changed) asks for the pool's placement instead of placing inline.

use super::{Cluster, Error};
use mpsfleet_core::controller::{Action, WorkQueue};
use mpsfleet_types::{PoolName, ServiceName};

/// How often every service is reconciled whether or not anything asked for it.
pub const SERVICE_RESYNC_MS: u64 = 60_000;

/// How often retention runs once started (and how long it waits after a failure at most,
/// the queue's backoff aside).
pub const RETENTION_INTERVAL_MS: u64 = 5_000;

/// The controllers' queue and when the services' next resync is due.
#[derive(Debug, Default)]
pub(super) struct Controllers {
    pub(super) queue: WorkQueue<Work>,
    next_service_resync_ms: u64,
}

/// A key a controller reconciles.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Work {
    /// A service: its rollout's next step, its replicas, its deployments (`services.rs`).
    Service(ServiceName),
    /// A pool's waiting tasks, placed where they now fit (`Cluster::place_pending`).
    Placement(PoolName),
    /// The change feed compacted and stopped tasks and resolved incidents past their
    /// retention removed (`retention.rs`).
    Retention,
}

impl Cluster {
    /// Asks for `work` to run at the next pass.
    pub(super) fn ask(&mut self, work: Work) {
        let now = self.now();
        self.work.queue.enqueue_at(work, now);
    }

    /// Starts retention: it runs now, then every [`RETENTION_INTERVAL_MS`] (the server does this
    /// once it serves; the simulator does not).
    pub fn start_retention(&mut self) {
        self.ask(Work::Retention);
    }

    /// Asks for placement in every pool that has waiting tasks (capacity came back).
    pub(super) fn ask_placement_everywhere(&mut self) {
        for p in self.state.tasks().pools_with_pending() {
            self.ask(Work::Placement(p));
        }
    }

    /// Asks for the service of a task, if it has one.
    pub(super) fn ask_for_group(&mut self, group: Option<&ServiceName>) {
        if let Some(g) = group {
            self.ask(Work::Service(g.clone()));
        }
    }

    /// Reconciles every key that is due, each on its own: one that fails is logged and tried
    /// again after its backoff; the others go on.
    pub fn run_work(&mut self) {
        let now = self.now();
        for key in self.work.queue.take_due(now) {
            let result = match &key {
                Work::Service(name) => self.reconcile_service_once(name),
                Work::Placement(pool) => self.place_pending(pool).map(|()| Action::AwaitChange),
                Work::Retention => self
                    .compact_history()
                    .and_then(|()| self.prune())
                    .map(|()| Action::RequeueAfter(RETENTION_INTERVAL_MS)),
            };
            if let Err(e) = &result {
                tracing::warn!(work = ?key, error = %e, "reconcile failed; retrying after its backoff");
            }
            let now = self.now();
            self.work.queue.finish(key, &result, now);
        }
    }

    /// The periodic pass: asks for every service once its resync is due and for placement in
    /// every pool with waiting tasks, and reconciles what is due. Each service and pool on its
    /// own: one that fails is logged with its key and retried after its backoff; the others
    /// go on.
    pub fn resync(&mut self) -> Result<(), Error> {
        let now = self.now();
        if now >= self.work.next_service_resync_ms {
            self.work.next_service_resync_ms = now + SERVICE_RESYNC_MS;
            let names: Vec<ServiceName> = self.state.services().keys().cloned().collect();
            for n in names {
                self.work.queue.enqueue_at(Work::Service(n), now);
            }
        }
        self.ask_placement_everywhere();
        self.run_work();
        Ok(())
    }

    /// Keys waiting to be reconciled (for tests and the simulator's report).
    pub fn work_queued(&self) -> usize {
        self.work.queue.len()
    }
}
