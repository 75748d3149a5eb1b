//! The keys the controllers reconcile ([`Work`]), one per object owned; the queue that runs
//! them and the dispatch to each controller are `dispatch.rs`.

use mpsfleet_types::{PoolName, ServiceName};

/// A key a controller reconciles.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Work {
    /// A service: its rollout's next step, its replicas, its deployments (`services.rs`).
    Service(ServiceName),
    /// A pool's waiting tasks, placed where they now fit (`controllers/placement.rs`).
    Placement(PoolName),
    /// An unresolved incident, by when it opened (a pass plans the earliest first) and id.
    Incident(u64, String),
    /// A pool with a capacity provider, kept at its desired host count.
    Capacity(PoolName),
    /// The change feed compacted and stopped tasks and resolved incidents past their
    /// retention removed (`retention.rs`).
    Retention,
    /// A drill that has not ended (`controllers/drills.rs`).
    Drill(String),
}
