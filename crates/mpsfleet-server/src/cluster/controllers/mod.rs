//! The controllers, each a type of its own in a module of its own, reconciling one key at a
//! time over a small context ([`Ctx`]): the state to read, the one way to write it
//! (`Writer`), the scheduler and the time (the work queue joins it with the first controller
//! here that asks for other keys). No module
//! here names `Cluster` (`tests/architecture.rs` fails if one does): what a controller needs
//! is in its context or its arguments, and the dispatch in `cluster/work.rs` builds both.
//! kube-runtime's `Controller` and its `Context` are the model.
//!
//! Moved here so far: retention, drills, placement, services, remediation, capacity and
//! managed scaling. Host health still run as `Cluster` methods, dispatched from the same queue.

pub mod capacity;
pub mod daemon;
pub mod drills;
pub mod placement;
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
