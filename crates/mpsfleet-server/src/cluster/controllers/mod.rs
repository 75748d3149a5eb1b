//! The controllers, each a type of its own in a module of its own, reconciling one key at a
//! time over a small context ([`Ctx`]): a `Writer`, which holds the state to read, the one way
//! to write it, the scheduler's index and the queue to ask for other keys; and the time. What a
//! controller keeps between its runs is lent to its reconcile by the dispatch
//! (`cluster/dispatch.rs`). No module here names `Cluster`, and each imports only the bottom
//! layer of `cluster/` and its sibling controllers (`tests/architecture.rs` fails otherwise).
//! kube-runtime's `Controller` and its `Context` are the model.
//!
//! Here: host health, services (with DAEMON services' step), placement (with preemption),
//! remediation, capacity (with managed scaling), drills and retention.

pub mod capacity;
pub mod daemon;
pub mod drills;
pub mod health;
pub mod placement;
pub mod preemption;
pub mod remediation;
pub mod retention;
pub mod scaling;
pub mod services;

use super::write::Writer;

/// What a controller's reconcile reads and writes.
pub(in crate::cluster) struct Ctx<'a> {
    /// The state, the one way to change it, the scheduler's index and the queue to ask for
    /// other keys.
    pub(in crate::cluster) w: Writer<'a>,
    pub(in crate::cluster) now_ms: u64,
}
