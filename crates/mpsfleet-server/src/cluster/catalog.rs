//! What the ECS-compatible API needs beyond creating and running: deleting an empty pool
//! (ECS's `DeleteCluster`; a deleted pool stays discoverable as INACTIVE for an hour, as
//! ECS's deleted clusters do: `deleted.rs`), deregistering a task definition (`DeregisterTaskDefinition`: it
//! stays, marked, and starts nothing new), and tagging pools, task definitions, services and
//! tasks (`TagResource`, `UntagResource`). Each is one committed change of the object's record.
//! The operations are `Cluster`'s, in `workloads.rs` and `pools.rs`; what they share is here.

use super::*;

/// What a pool holds ([`Cluster::pool_contents`]).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct PoolContents {
    /// Hosts but deregistered ones.
    pub hosts: usize,
    /// Services, active or being deleted; and the active ones.
    pub services: usize,
    pub active_services: usize,
    /// Tasks running; waiting to (placed or not); on their way to STOPPED.
    pub running: usize,
    pub pending: usize,
    pub stopping: usize,
}

impl PoolContents {
    /// Tasks not stopped.
    pub fn live_tasks(&self) -> usize {
        self.running + self.pending + self.stopping
    }
}

/// What a tag change names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Tagged {
    Pool(String),
    TaskDef(String),
    Service(String),
    Task(String),
    CapacityProvider(String),
}

impl Tagged {
    /// What reading (`change`: changing) its tags touches, for a pool-scoped caller.
    pub fn touch(&self, change: bool) -> Touch {
        match self {
            Tagged::Pool(p) => Touch::Object(Kind::Pool, p.clone()),
            Tagged::Service(s) => Touch::Object(Kind::Service, s.clone()),
            Tagged::Task(t) => Touch::Object(Kind::Task, t.clone()),
            // Task definitions belong to no pool: every caller reads them, and changing one
            // reaches beyond one pool, as registering does.
            Tagged::TaskDef(_) | Tagged::CapacityProvider(_) if change => Touch::Cluster,
            Tagged::TaskDef(_) | Tagged::CapacityProvider(_) => Touch::NoPool,
        }
    }
}

pub(super) fn invalid((field, message): (String, String)) -> Error {
    Error::InvalidParameter { field, message }
}
